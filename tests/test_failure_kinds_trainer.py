"""Failure kinds (README "Reliability" table) that live in the trainer (cases 2, 3, 4), one test per kind."""

from __future__ import annotations

import pickle
import re
import time

import numpy as np
import pytest
import torch

from loopscale.model.config import preset_config
from loopscale.model.train import (
    CheckpointError,
    RunConfig,
    accumulate_gradients,
    latest_checkpoint,
    load_checkpoint,
    train_run,
)


def tiny(r: int = 2, **kw):
    return preset_config("cpu", r=r, d_model=32, seq_len=32, **kw)


@pytest.fixture
def base(trainer_corpus_dir, trainer_cache_dir):
    # 12 steps of B = 256 tokens = 4 micro-batches of 64 tokens (2 windows of 32)
    return dict(
        model=tiny(),
        corpus=str(trainer_corpus_dir),
        cache_dir=str(trainer_cache_dir),
        batch_tokens=256,
        micro_batch_tokens=64,
        tokens=12 * 256,
        eval_tokens=256,
        lr=1e-2,
    )


@pytest.fixture
def one_thread():
    """Direct model tests run single-threaded (as train_run does by default); the caller's setting is restored."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


class _Marker:
    """An arbitrary object whose unpickling would run code (touch a file)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def test_rng_state_breaks_safe_loading(base, tmp_path):
    """Case 2: checkpoints hold RNG state as tensors/plain types and load with weights_only=True (no allow-list);
    a checkpoint containing an arbitrary pickled object is refused with a clear error, its code never runs."""
    ck = tmp_path / "ck"
    train_run(
        RunConfig(**{**base, "tokens": 2 * 256, "checkpoint_dir": str(ck), "checkpoint_every_steps": 1})
    )
    path = latest_checkpoint(ck)
    assert path.name == "ckpt-00000002.pt"
    state = torch.load(path, weights_only=True)  # plain safe loading works, nothing allow-listed
    assert isinstance(state["rng"]["torch"], torch.Tensor)
    assert (
        isinstance(state["rng"]["numpy"]["keys"], torch.Tensor)
        and state["rng"]["numpy"]["keys"].numel() == 624
    )
    assert isinstance(state["rng"]["python"]["state"], torch.Tensor)
    # the failure replayed: numpy's RNG tuple (an ndarray inside) is not weights_only-loadable
    raw = tmp_path / "np_state.pt"
    torch.save({"rng": np.random.get_state()}, raw)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(raw, weights_only=True)
    # a checkpoint with an arbitrary object in the run's folder is refused by train_run
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "code_ran"
    torch.save(
        {"format": "loopscale-ckpt-v1", "step": 1, "payload": _Marker(marker)}, evil / "ckpt-00000001.pt"
    )
    with pytest.raises(CheckpointError, match=r"refused by torch.load\(weights_only=True\)"):
        train_run(RunConfig(**{**base, "checkpoint_dir": str(evil), "checkpoint_every_steps": 1}))
    assert not marker.exists()


def test_resume_replays_data_under_grad_accum(base, tmp_path):
    """Case 3: 4 micro-batches x 12 steps, checkpoint at 6, killed at 8, resumed: the 48 micro-batches consumed
    equal the uninterrupted run's (no repeats, no gaps), tokens = D, and the final loss is equal (1e-6)."""
    full = train_run(RunConfig(**base))
    assert full.micro_batch_ids == list(range(48)) and full.D == 12 * 256

    class Killed(Exception):
        pass

    def kill_at_8(ev):
        if ev["step"] == 8:
            raise Killed

    ck = str(tmp_path / "ck")
    run = {**base, "checkpoint_dir": ck, "checkpoint_every_steps": 6, "eval_every_steps": 1}
    with pytest.raises(Killed):
        train_run(RunConfig(**run), callback=kill_at_8)
    assert latest_checkpoint(ck).name == "ckpt-00000006.pt"
    before = load_checkpoint(latest_checkpoint(ck))["wall_s"]  # the first attempt's time up to its checkpoint
    t0 = time.perf_counter()
    res = train_run(RunConfig(**run))
    this = time.perf_counter() - t0
    assert res.resumed_from_step == 6
    assert before > 0 and before < res.wall_s <= before + this  # wall time over both attempts, not only the last
    assert res.micro_batch_ids == full.micro_batch_ids
    assert len(set(res.micro_batch_ids)) == 48
    assert res.data_digest == full.data_digest  # the same windows, in the same order
    assert res.D == 12 * 256 == res.steps * res.batch_tokens
    assert res.final_val_loss == pytest.approx(full.final_val_loss, abs=1e-6)
    # a different run must not pick the checkpoint up
    with pytest.raises(CheckpointError, match="different run"):
        train_run(RunConfig(**{**run, "lr": 2e-2}))


def test_accumulation_equals_full_batch_gradient(one_thread):
    """Case 3b: 4 x B/4 accumulation gives the gradient of 1 x B (the loss is the token mean over the batch)."""
    from loopscale.model.looped import LMLoss, LoopedLM

    cfg = tiny(r=2)
    torch.manual_seed(0)
    windows = torch.randint(0, 256, (8, 33))
    grads = []
    for n_micro in (1, 4):
        model = LoopedLM(cfg, seed=3).double()
        loss = accumulate_gradients(LMLoss(model), windows, n_micro)
        grads.append((loss, [p.grad.clone() for p in model.parameters()]))
    (l1, g1), (l4, g4) = grads
    assert l1 == pytest.approx(l4, rel=1e-12)
    for a, b in zip(g1, g4, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert any(float(g.abs().max()) > 0 for g in g1)


def test_norm_preserving_optimizer_zero_norm(base, caplog, one_thread):
    """Case 4: Muon with a zero-initialised projection: an LR-0 step leaves every parameter bit-identical and
    finite; a normal step keeps all finite; the trainer logs which parameters each optimizer got."""
    from loopscale.model.looped import LMLoss, LoopedLM
    from loopscale.model.optim import build_optimizers

    cfg = tiny(r=2)
    model = LoopedLM(cfg, seed=0)
    with torch.no_grad():
        model.recur[0].attn.c_proj.weight.zero_()  # zero-initialised projection
        model.recur[0].mlp.c_fc.weight.zero_()  # -> its MLP output and c_proj's gradient are exactly zero
    windows = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
    for lr, check_identical in ((0.0, True), (0.02, False)):
        opts, assign = build_optimizers(model, "muon", lr)
        assert "recur.0.mlp.c_proj.weight" in assign["muon"] and "wte.weight" in assign["adamw"]
        assert not set(assign["muon"]) & set(assign["adamw"])
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        accumulate_gradients(LMLoss(model), windows, 1)
        assert float(model.recur[0].mlp.c_proj.weight.grad.abs().max()) == 0.0  # the zero-norm case is hit
        for o in opts:
            o.step()
            o.zero_grad()
        for n, p in model.named_parameters():
            assert torch.isfinite(p).all(), n
            if check_identical:
                assert torch.equal(p, before[n]), n
        if not check_identical:
            assert not torch.equal(model.prelude[0].attn.c_q.weight, before["prelude.0.attn.c_q.weight"])
    # through the trainer: the assignment is logged and recorded
    with caplog.at_level("INFO", logger="loopscale.train"):
        res = train_run(RunConfig(**{**base, "optimizer": "muon", "tokens": 256, "micro_batch_tokens": None}))
    assert res.status == "ok" and np.isfinite(res.final_val_loss)
    assert "optimizer assignment: muon=" in caplog.text
    assert "inject.weight" in res.optimizer_assignment["muon"]
    assert {"wte.weight", "lm_head.weight", "norm_final.weight"} <= set(res.optimizer_assignment["adamw"])


def test_a_checkpoint_dir_that_is_a_file_is_refused_before_training(base, tmp_path):
    """A file given as checkpoint_dir ended in FileExistsError at the first checkpoint write, after training; it is
    refused before any compute, and the file is left as it was."""
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(ValueError, match="checkpoint_dir .*notes.txt' is a file, not a folder"):
        train_run(RunConfig(**{**base, "checkpoint_dir": str(f), "checkpoint_every_steps": 1}))
    assert f.read_text() == "mine"
    # a folder below that file cannot be made: it trained its first steps, then failed at the first checkpoint (a
    # NotADirectoryError traceback); refused before the corpus is read, naming the folder
    import loopscale.model.data as data

    def no_corpus(*a, **k):
        raise AssertionError("the corpus was read")

    mp = pytest.MonkeyPatch()
    mp.setattr(data, "load_tokens", no_corpus)
    try:
        with pytest.raises(ValueError, match=r"checkpoint_dir .*notes.txt/sub' cannot be created \(Not a directory"):
            train_run(RunConfig(**{**base, "checkpoint_dir": str(f / "sub"), "checkpoint_every_steps": 1}))
    finally:
        mp.undo()
    assert f.read_text() == "mine"


def test_a_cache_dir_that_cannot_be_made_is_refused_before_the_corpus_is_read(base, monkeypatch):
    """`--cache-dir /proc/x` (a folder its parent cannot hold) ended in a bare "[Errno 2] No such file or directory"
    from the first token-cache write; it is refused naming cache_dir, before the corpus is read."""
    import loopscale.model.data as data

    def no_corpus(*a, **k):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr(data, "load_tokens", no_corpus)
    with pytest.raises(ValueError, match=r"cache_dir '/proc/loopscale-x' cannot be created \("):  # ENOENT, or EACCES
        train_run(RunConfig(**{**base, "cache_dir": "/proc/loopscale-x"}))


def test_a_model_too_large_for_memory_is_refused_before_it_is_built(base, monkeypatch, tmp_path):
    """d_model = 100000 asked torch for 40 GB and ended in the allocator's traceback. The weights, gradients and one
    optimizer state (12 bytes per parameter) are checked against the device's memory first; an ensemble counts
    every member."""
    import loopscale.model.train as train_mod
    from loopscale.model.accounting import n_total
    from loopscale.model.ensemble import train_ensemble

    big = RunConfig(**{**base, "model": preset_config("cpu", r=1, d_model=100_000, seq_len=32)})
    with pytest.raises(ValueError, match=r"does not fit in memory: 1,200,053,500,000 parameters .* GiB.*use a "
                                         r"smaller d_model \(or width_scale\)$"):  # fmt: skip
        train_run(big)
    # a model made large by its hyperconnection lanes (r (K^2 + 2K) weights) is told to lower K: it was told to use
    # a smaller d_model, for a d = 16 model
    lanes = preset_config("cpu", r=2, d_model=16, seq_len=32, injection="hyperconnect", hc_lanes=100_000)
    with pytest.raises(ValueError, match=r"\(d_model=16\) .*; 20,000,400,000 of them are the hyperconnection weights "
                                         r"of hc_lanes=100000 \(r \(K\^2 \+ 2K\) parameters\): use fewer lanes"):  # fmt: skip
        train_run(RunConfig(**{**base, "model": lanes}))
    # refused after its folders were checked: the checkpoint folder it would write is not left behind, empty (it was
    # made by that check)
    ck = tmp_path / "never_made" / "ckpt"
    with pytest.raises(ValueError, match="does not fit in memory"):
        train_run(RunConfig(**{**base, "model": big.model, "checkpoint_dir": str(ck), "checkpoint_every_steps": 1}))
    assert not ck.parent.exists()
    # the bound itself, on a small model and a made-up memory size: a model just under it trains, k members do not
    need = 12 * n_total(base["model"])
    monkeypatch.setattr(train_mod, "device_memory_bytes", lambda device: need)
    assert train_run(RunConfig(**base)).status == "ok"
    with pytest.raises(ValueError, match="2 models of"):
        train_ensemble(RunConfig(**base), [0, 1])


@pytest.mark.parametrize("content", [b"", b"hello, not a checkpoint\n", b"PK\x03\x04 cut short"])
def test_an_unreadable_newest_checkpoint_is_moved_aside_with_its_reason(base, tmp_path, content):
    """A checkpoint file of plain text was refused as "not tensors" and stopped the run; an empty one was moved
    aside with no reason given. Both are unreadable files (torch.save writes a zip archive): moved aside with the
    reason, and the run resumes from the older checkpoint."""
    ck = tmp_path / "ck"
    run = {**base, "checkpoint_dir": str(ck), "checkpoint_every_steps": 6}
    full = train_run(RunConfig(**run))
    (ck / "ckpt-00000099.pt").write_bytes(content)
    why = "it is empty (0 bytes)" if not content else f"it is not a torch.save archive ({len(content)} bytes"
    with pytest.warns(UserWarning, match=re.escape(f"cannot be read: {why}")):
        again = train_run(RunConfig(**run))
    assert again.resumed_from_step == 12 and again.final_val_loss == full.final_val_loss
    assert (ck / "ckpt-00000099.pt.unreadable").read_bytes() == content


def test_train_refuses_a_checkpoint_dir_that_is_a_file_in_one_line(tmp_path):
    """`train --checkpoint-dir FILE` printed the two-line "training r=1 d=16 ..." header before its error; the
    command's folders are now checked with the other pre-checks, so the refusal is its one line."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    f = tmp_path / "notes.txt"
    f.write_text("mine")
    res = CliRunner().invoke(app, ["train", "--d-model", "16", "--tokens", "512", "--batch-tokens", "256",
                                   "--seq-len", "32", "--checkpoint-dir", str(f), "--checkpoint-every-steps", "1"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "training r=" not in res.output and f.read_text() == "mine"
    assert [ln for ln in res.output.splitlines() if ln.strip()][0].startswith("error: --checkpoint-dir ")
    # the pre-check makes no folder: a run refused next (here for its corpus) leaves nothing behind
    res = CliRunner().invoke(app, ["train", "--d-model", "16", "--tokens", "512", "--batch-tokens", "256",
                                   "--corpus", str(tmp_path / "nope.txt"), "--checkpoint-dir", str(tmp_path / "ck/a"),
                                   "--checkpoint-every-steps", "1", "--cache-dir", str(tmp_path / "cache/x")])  # fmt: skip
    assert res.exit_code == 2 and "does not exist" in res.output, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    res = CliRunner().invoke(app, ["train", "--d-model", "16", "--tokens", "512", "--batch-tokens", "256",
                                   "--checkpoint-dir", str(f / "sub"), "--checkpoint-every-steps", "1"])  # fmt: skip
    assert res.exit_code == 2 and f"cannot be created: {str(f)!r} is a file" in res.output, res.output
    # without --checkpoint-every-steps nothing is written there: not refused (as the run itself never touches it)
    from loopscale.model.config import preset_config
    from loopscale.model.train import RunConfig, check_run_folders

    quiet = RunConfig(model=preset_config("cpu", r=1, d_model=16), tokens=4096, checkpoint_dir=str(f / "sub"))
    check_run_folders(quiet, create=False)
