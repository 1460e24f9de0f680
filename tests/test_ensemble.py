"""Seed ensembles (loopscale.model.ensemble): each member equals the single run with its seed."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from loopscale.model.config import preset_config
from loopscale.model.ensemble import EnsembleLM, train_ensemble
from loopscale.model.looped import LoopedLM
from loopscale.model.train import RunConfig, train_run


def _cfg(tmp_path, **kw):
    base = dict(
        model=preset_config("cpu", r=2, d_model=16),
        tokens=6 * 512,
        batch_tokens=512,
        eval_tokens=1024,
        eval_every_steps=2,
        lr=0.02,
        cache_dir=str(tmp_path / "cache"),
    )
    base.update(kw)
    return RunConfig(**base)


def _assert_member_equals_single(ens, single):
    assert ens.status == single.status and ens.diverged_step == single.diverged_step
    assert (ens.seed, ens.data_seed) == (single.seed, single.data_seed)
    assert ens.data_digest == single.data_digest and ens.micro_batch_ids == single.micro_batch_ids
    assert [c["step"] for c in ens.curve] == [c["step"] for c in single.curve]
    for a, b in zip(ens.curve, single.curve, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert (a["val_loss"] is None) == (b["val_loss"] is None)
        if b["val_loss"] is not None:
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)
        assert a["lr"] == b["lr"]
    if single.final_val_loss is None:
        assert ens.final_val_loss is None
    else:
        assert ens.final_val_loss == pytest.approx(single.final_val_loss, rel=1e-4)
    assert (ens.D, ens.steps, ens.C, ens.optimizer_assignment) == (
        single.D,
        single.steps,
        single.C,
        single.optimizer_assignment,
    )


@pytest.mark.parametrize("optimizer", ["adamw", "muon", "muonh"])
def test_members_equal_single_runs(tmp_path, optimizer):
    cfg = _cfg(tmp_path, optimizer=optimizer, weight_decay=0.1 if optimizer == "adamw" else 0.0)
    events = []
    ens = train_ensemble(cfg, [0, 3, 7], callback=events.append)
    assert [r.seed for r in ens] == [0, 3, 7]
    for res in ens:
        _assert_member_equals_single(res, train_run(dataclasses.replace(cfg, seed=res.seed)))
    # members really differ (different init): the test would catch members that are copies of one run
    assert len({round(r.final_val_loss, 6) for r in ens}) == 3
    finals = [e for e in events if e["final"]]
    assert [(e["member"], e["seed"], e["status"]) for e in finals] == [
        (0, 0, "ok"),
        (1, 3, "ok"),
        (2, 7, "ok"),
    ]
    assert sum(not e["final"] for e in events) == 3 * 2  # evaluations after steps 2 and 4, per member


def test_muon_members_follow_single_runs_over_many_steps_with_fp32_newton_schulz(tmp_path, monkeypatch):
    """Over 128 Muon steps the members stay within fp32 rounding of their single runs once Newton-Schulz runs in
    fp32 (loopscale.model.muon.NS_DTYPE). In bf16, the default as in torch's Muon, the same runs drift apart by
    1.7e-3 relative (measured here): bf16 rounding turns the batched ops' ~1e-7 differences into different updates.
    Every op of the ensemble's fp32 path is checked over a run 20x longer than the other tests'."""
    import loopscale.model.muon as muon

    monkeypatch.setattr(muon, "NS_DTYPE", torch.float32)
    model = preset_config("cpu", r=2, d_model=16, seq_len=32)
    cfg = _cfg(tmp_path, model=model, optimizer="muon", tokens=128 * 256, batch_tokens=256, eval_every_steps=None)
    ens = train_ensemble(cfg, [0, 1, 2, 3])
    for res in ens:
        single = train_run(dataclasses.replace(cfg, seed=res.seed))
        assert len(res.curve) == len(single.curve) >= 100
        for a, b in zip(res.curve, single.curve, strict=True):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5), a["step"]
        assert res.final_val_loss == pytest.approx(single.final_val_loss, rel=1e-5)


def test_per_member_data_seeds_clip_microbatches_hyperconnect(tmp_path):
    model = preset_config("cpu", r=2, d_model=16, injection="hyperconnect")
    cfg = _cfg(tmp_path, model=model, optimizer="muon", grad_clip=0.5, micro_batch_tokens=256)
    ens = train_ensemble(cfg, [1, 2], data_seeds=[5, 6])
    for res, ds in zip(ens, [5, 6], strict=True):
        _assert_member_equals_single(res, train_run(dataclasses.replace(cfg, seed=res.seed, data_seed=ds)))
    assert ens[0].data_digest != ens[1].data_digest


def test_member_divergence_matches_single_runs(tmp_path):
    """At init the seeds' first losses differ in the 4th decimal; a threshold between them makes some members
    diverge at step 1 while another trains on, exactly as their single runs do."""
    cfg = _cfg(tmp_path, tokens=3 * 512, eval_every_steps=None)
    first = [
        train_run(dataclasses.replace(cfg, seed=s, tokens=512)).curve[0]["train_loss"] for s in (0, 1, 2)
    ]
    lo, hi = sorted(first)[:2]
    cfg = dataclasses.replace(cfg, diverge_loss=(lo + hi) / 2)
    ens = train_ensemble(cfg, [0, 1, 2])
    assert sorted(r.status for r in ens) == ["diverged", "diverged", "ok"]
    for res in ens:
        _assert_member_equals_single(res, train_run(dataclasses.replace(cfg, seed=res.seed)))


@pytest.mark.parametrize(
    "kw",
    [dict(r=1), dict(r=2, injection="additive", bptt_k=1), dict(r=4, injection="linear", bptt_k=2)],
)
def test_forward_equals_looped_lm_per_member(kw):
    cfg = preset_config("cpu", d_model=32, **kw)
    ens = EnsembleLM(cfg, [4, 9]).double()
    idx = torch.randint(0, 256, (2, 3, 20))
    out = ens(idx)  # [k, B, T, V]
    assert out.shape == (2, 3, 20, 256)
    for i, s in enumerate([4, 9]):
        single = LoopedLM(cfg, seed=s).double()
        assert all(torch.equal(ens.member_state_dict(i)[n].double(), p) for n, p in single.named_parameters())
        torch.testing.assert_close(out[i], single(idx[i]), rtol=1e-10, atol=1e-10)
    shared = ens(idx[0])  # a [B, T] batch feeds every member
    torch.testing.assert_close(shared[1], LoopedLM(cfg, seed=9).double()(idx[0]), rtol=1e-10, atol=1e-10)


def test_ensemble_refuses_out_of_range_ids_and_int32():
    """The members' embeddings are one [k V, d] table indexed by id + i V, so an id >= V for member 0 silently read
    member 1's rows (and -1 for member 1 member 0's last row); now both raise ValueError as LoopedLM does, and
    int32 ids are refused as the message always said."""
    cfg = preset_config("cpu", r=2, d_model=16, seq_len=8)
    ens = EnsembleLM(cfg, [0, 1])
    ok = torch.randint(0, 256, (2, 1, 8))
    assert ens(ok).shape == (2, 1, 8, 256)
    over = ok.clone()
    over[0, 0, 0] = 256 + 5
    with pytest.raises(ValueError, match=r"ids in \[\d+, 261\], but vocab_size=256 .*\(1 of 16 ids out of range\)"):
        ens(over)
    under = ok.clone()
    under[1, 0, 2] = -1
    with pytest.raises(ValueError, match=r"ids in \[-1, \d+\], but vocab_size=256"):
        ens(under)
    with pytest.raises(ValueError, match=r"int64 \(torch.long\).*torch.int32"):
        ens(ok.int())


class _Stop(Exception):
    pass


def test_checkpoint_resume_equals_uninterrupted(tmp_path):
    cfg = _cfg(tmp_path, optimizer="muon", checkpoint_every_steps=2, checkpoint_dir=str(tmp_path / "a"))
    full = train_ensemble(dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "a")), [0, 1])
    ck = dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "b"))
    paths = []

    def stop_after_4(ev):
        if ev["checkpoint_path"]:
            paths.append((ev["member"], ev["step"]))
        if ev["step"] == 4 and ev["checkpoint_path"] and ev["member"] == 1:
            raise _Stop  # the process is "killed" after the step-4 checkpoint was written

    with pytest.raises(_Stop):
        train_ensemble(ck, [0, 1], callback=stop_after_4)
    assert paths == [(0, 2), (1, 2), (0, 4), (1, 4)]
    from loopscale.model.train import latest_checkpoint, load_checkpoint

    before = load_checkpoint(latest_checkpoint(tmp_path / "b"))["wall_s"]
    t0 = time.perf_counter()
    events = []
    resumed = train_ensemble(ck, [0, 1], callback=events.append)
    this = time.perf_counter() - t0
    per_step = events[0]["tokens"] // events[0]["step"]
    assert {ev["start_tokens"] for ev in events} == {4 * per_step}  # the resumed attempt began at step 4's tokens
    assert all(before > 0 and before < r.wall_s <= before + this for r in resumed)  # both attempts' time
    assert all(r.time_split["total"] <= this < r.wall_s for r in resumed)  # time_split: this attempt's alone
    last = load_checkpoint(latest_checkpoint(tmp_path / "b"))["wall_s"]
    rerun = train_ensemble(ck, [0, 1])  # finished: nothing trained, the run's time is the finished one's
    assert [r.resumed_from_step for r in rerun] == [6, 6] and [r.wall_s for r in rerun] == [last, last]
    assert [r.final_val_loss for r in rerun] == [r.final_val_loss for r in resumed]
    for a, b in zip(resumed, full, strict=True):
        assert a.resumed_from_step == 4 and b.resumed_from_step is None
        _assert_member_equals_single(a, b)
    from loopscale.model.train import CheckpointError

    with pytest.raises(CheckpointError, match="seeds"):  # another ensemble's checkpoints
        train_ensemble(ck, [0, 2])
    train_run(dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "c")))
    # a single run's checkpoints: said as such (it named 'data_seed, data_seeds, seed, seeds', the kinds' own keys)
    with pytest.raises(CheckpointError, match=r"different run \(it was written by a single run \(seed 0\), and this "
                       r"is a seed ensemble \(seeds \[0, 1\]\)\); use another"):  # fmt: skip
        train_ensemble(dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "c")), [0, 1])
    with pytest.raises(CheckpointError, match=r"it was written by a seed ensemble \(seeds \[0, 1\]\), and this is a "
                       r"single run \(seed 0\); it differs also in \['lr'\]"):  # and the other way, with another LR
        train_run(dataclasses.replace(ck, lr=ck.lr * 2))


def test_bad_input(tmp_path):
    cfg = _cfg(tmp_path)
    with pytest.raises(ValueError, match="distinct"):
        train_ensemble(cfg, [1, 1])
    with pytest.raises(ValueError, match="data_seeds"):
        train_ensemble(cfg, [1, 2], data_seeds=[0])
    # as train_run, before any training compute (it used to fail with a TypeError at the first checkpoint step)
    with pytest.raises(ValueError, match="checkpoint_every_steps needs checkpoint_dir"):
        train_ensemble(dataclasses.replace(cfg, checkpoint_every_steps=2), [1, 2])
    ens = EnsembleLM(cfg.model, [0, 1])
    with pytest.raises(ValueError, match="idx"):
        ens(torch.zeros(3, 2, 8, dtype=torch.int64))  # 3 batches for 2 members


def test_compiled_ensemble_equals_eager_members(tmp_path):
    """torch.compile (Inductor's C++ backend on CPU) trains the same members as eager: fused kernels reorder fp32
    sums, so per-step losses agree to 1e-4 relative, not bit for bit."""
    from loopscale.model.looped import cpu_compiler

    if cpu_compiler() is None:
        pytest.skip("no C++ compiler for torch.compile on CPU")
    cfg = _cfg(tmp_path, model=preset_config("cpu", r=2, d_model=16, effective_depth=4), optimizer="muonh")
    eager = train_ensemble(cfg, [0, 1])
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = train_ensemble(dataclasses.replace(cfg, compile=True), [0, 1])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it really ran compiled graphs
    for a, b in zip(compiled, eager, strict=True):
        assert not any("trained eager" in w for w in a.warnings)  # compiled, no fallback
        assert a.compiled is True and b.compiled is False  # what runs.parquet's `compiled` records
        # its throughput counts the compiling first step and says so, as a single run's does (it said nothing)
        assert any(w.startswith("tokens_per_s (") and "torch.compile's compilation" in w for w in a.warnings)
        assert not any("torch.compile" in w for w in b.warnings)
        _assert_member_equals_single(a, b)


def test_compiled_single_run_equals_eager(tmp_path):
    """train_run compiles its loss module (model, head, soft-cap and cross-entropy in one graph): the per-step
    losses and validation losses equal eager training to 1e-4 relative."""
    from loopscale.model.looped import cpu_compiler

    if cpu_compiler() is None:
        pytest.skip("no C++ compiler for torch.compile on CPU")
    cfg = _cfg(tmp_path, model=preset_config("cpu", r=2, d_model=16, effective_depth=4), optimizer="muonh")
    eager = train_run(cfg)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = train_run(dataclasses.replace(cfg, compile=True))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert not any("trained eager" in w for w in compiled.warnings)  # compiled, no fallback
    assert compiled.compiled is True and eager.compiled is False
    # its throughput counts the compiling first step, and says so with the rate after it
    assert any(w.startswith("tokens_per_s (") and "torch.compile's compilation" in w for w in compiled.warnings)
    _assert_member_equals_single(compiled, eager)


def test_compile_without_cpu_compiler_trains_eager_and_says_so(tmp_path, monkeypatch):
    import loopscale.model.looped as looped

    monkeypatch.setattr(looped, "cpu_compiler", lambda: None)
    cfg = _cfg(tmp_path, compile=True, tokens=2 * 512)
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler"):
        (res,) = train_ensemble(cfg, [0])
    assert res.status == "ok" and any("trained eager" in w for w in res.warnings)
    assert res.compiled is False  # asked for, fallen back: recorded as eager
    assert res.final_val_loss == pytest.approx(
        train_run(dataclasses.replace(cfg, compile=False)).final_val_loss, rel=1e-6
    )


@pytest.mark.parametrize(
    "seeds, message",
    [([], "non-empty list"), ([0, 1.5], r"integers >= 0, got \[0, 1.5\]"), ([True, 2], "integers >= 0"),
     ([0, -1], "integers >= 0"), ([2, 2], "distinct"), (["0"], "integers >= 0")],
)  # fmt: skip
def test_bad_seeds_are_refused_before_any_compute(tmp_path, seeds, message, monkeypatch):
    import loopscale.model.ensemble as ens_mod

    monkeypatch.setattr(ens_mod, "EnsembleLM", None)  # building the model would fail: nothing may get that far
    with pytest.raises(ValueError, match=message):
        train_ensemble(_cfg(tmp_path), seeds)


def test_numpy_integer_seeds_are_integers(tmp_path):
    """Seeds from numpy (np.arange) are integers: accepted, and the members carry plain ints (the message said
    'must be integers >= 0, got [np.int64(0), ...]')."""
    import numpy as np

    cfg = _cfg(tmp_path, tokens=512, eval_every_steps=None)
    ens = train_ensemble(cfg, np.arange(2), data_seeds=np.array([3, 4]))
    assert [(r.seed, r.data_seed) for r in ens] == [(0, 3), (1, 4)]
    assert all(type(r.seed) is int and type(r.data_seed) is int for r in ens)


@pytest.mark.parametrize("trainer", ["single", "ensemble"])
def test_a_run_resumed_after_its_last_step_keeps_its_throughput(tmp_path, trainer):
    """A run whose trial is restarted after its last checkpoint (a driver stopped just after the run ended)
    trains no step in the new attempt; its tokens/s and MFU were 0.0 and NaN in runs.parquet (this attempt's
    steps only) and skewed the report's median. They now count every attempt's training steps, saved in the
    checkpoint: the resumed result equals the first attempt's."""
    cfg = _cfg(tmp_path, checkpoint_every_steps=2, checkpoint_dir=str(tmp_path / "ck"))

    events: list[dict] = []

    def train():
        events.clear()
        if trainer == "single":
            return [train_run(cfg, callback=events.append)]
        return train_ensemble(cfg, [0, 1], callback=events.append)

    t0 = time.perf_counter()
    first = train()
    took = time.perf_counter() - t0
    assert {ev["start_tokens"] for ev in events} == {0}
    # attempt_s: the time since this attempt's first step, growing over the run and within the whole call
    spans = [ev["attempt_s"] for ev in events]
    assert spans == sorted(spans) and 0 < spans[0] and spans[-1] < took
    per_step = events[0]["tokens"] // events[0]["step"]
    again = train()
    assert events and {ev["start_tokens"] for ev in events} == {6 * per_step}  # where this attempt began
    for a, b in zip(first, again, strict=True):
        assert b.resumed_from_step == 6 and a.resumed_from_step is None
        assert a.tokens_per_s > 0 and b.tokens_per_s == pytest.approx(a.tokens_per_s, rel=1e-9)
        assert (a.mfu is None) == (b.mfu is None)
        if a.mfu is not None:
            assert b.mfu == pytest.approx(a.mfu, rel=1e-9)
