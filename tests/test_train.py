"""The single-run trainer: horizon, validation, divergence, threads, callback, CLI."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from loopscale.model.accounting import flops_per_token
from loopscale.model.config import preset_config
from loopscale.model.train import RunConfig, train_run


def tiny(r: int = 2, **kw):
    return preset_config("cpu", r=r, d_model=32, seq_len=32, **kw)


@pytest.fixture
def base(trainer_corpus_dir, trainer_cache_dir):
    return dict(
        model=tiny(),
        corpus=str(trainer_corpus_dir),
        cache_dir=str(trainer_cache_dir),
        batch_tokens=128,
        tokens=4 * 128,
        eval_tokens=256,
        lr=1e-2,
    )


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(tokens=0), "tokens must be a positive integer"),
        (dict(tokens=-5), "tokens must be a positive integer"),
        (dict(tokens=None), "exactly one of tokens"),
        (dict(target_flops=1e9), "exactly one of tokens"),
        (dict(tokens=10), "is at most half a batch"),
        (dict(batch_tokens=100), "batch_tokens must be a positive multiple of model.seq_len=32"),
        (dict(micro_batch_tokens=96), "micro_batch_tokens"),
        (dict(optimizer="sgd"), "optimizer must be one of"),
        (dict(schedule="step"), "schedule must be one of"),
        (dict(lr=float("nan")), "lr must be"),
        (dict(num_threads=0), "num_threads"),
        (dict(tokenizer="bpe:512"), "model.vocab_size=256 is smaller"),
        (dict(device="tpu"), "device must be one of"),
    ],
)
def test_runconfig_validation(base, change, field):
    """Bad RunConfig fields raise ValueError naming the field before any compute."""
    with pytest.raises(ValueError, match=field):
        RunConfig(**{**base, **change})


def test_checkpointing_without_a_folder_fails_before_training(base):
    """checkpoint_every_steps without checkpoint_dir is refused by train_run before any compute (a sweep cell
    carries the cadence; its trial adds the folder)."""
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        train_run(RunConfig(**{**base, "checkpoint_every_steps": 2}))


def test_checkpoint_dir_missing_message_says_how_to_fix_and_each_fix_works(base, tmp_path):
    """``train_run(cell.run)`` for a smoke-preset sweep cell failed with only 'checkpoint_every_steps needs
    checkpoint_dir'; the message now names the cadence and the ways out (a folder; None for no checkpoints, 0
    being refused; a sweep cell's ``run_config(checkpoint_dir=...)``), and each way out it names works."""
    import dataclasses

    from loopscale.sweep.presets import preset_spec

    cell = preset_spec("smoke").cells()[0]
    every = cell.run.checkpoint_every_steps
    assert every and cell.run.checkpoint_dir is None  # the smoke preset's cells carry a cadence, not a folder
    with pytest.raises(ValueError) as ei:
        train_run(cell.run)
    msg = str(ei.value)
    assert msg.startswith("checkpoint_every_steps needs checkpoint_dir")
    assert f"checkpoint_every_steps={every} but checkpoint_dir=None" in msg
    assert "Give checkpoint_dir='<folder>'" in msg
    assert "set checkpoint_every_steps=None for no checkpoints (0 is not accepted)" in msg
    assert "cell.run_config(checkpoint_dir='<folder>') rather than cell.run" in msg
    assert cell.run_config(checkpoint_dir=str(tmp_path)).checkpoint_dir == str(tmp_path)

    cfg = RunConfig(**{**base, "checkpoint_every_steps": 2})
    with pytest.raises(ValueError, match="None or a positive integer"):  # 0 is not an off switch
        dataclasses.replace(cfg, checkpoint_every_steps=0)
    ck = tmp_path / "ck"
    assert train_run(dataclasses.replace(cfg, checkpoint_dir=str(ck))).status == "ok"
    assert sorted(p.name for p in ck.glob("ckpt-*.pt"))  # the folder way: checkpoints written
    assert train_run(dataclasses.replace(cfg, checkpoint_every_steps=None)).status == "ok"


def test_target_flops_to_tokens(base):
    """target_flops C -> D = round(C / (F B)) B (paper Sec. 2) and the result's C = F D."""
    m = tiny(r=4)
    F = flops_per_token(m)
    C = 3.4 * F * 128
    res = train_run(RunConfig(**{**base, "model": m, "tokens": None, "target_flops": C}))
    assert res.D == round(C / (F * 128)) * 128 == 3 * 128
    assert res.C == F * res.D and res.flops_per_token == F and res.steps == 3
    assert res.N_once > 0 and res.N_rec > 0 and res.N_unique == res.N_once + res.N_rec


def test_run_result_and_validation(base):
    """A run reports a finite val loss below the uniform ln 256, its curve, bits/byte, epochs and timing split."""
    res = train_run(RunConfig(**{**base, "tokens": 6 * 128, "eval_every_steps": 2}))
    assert res.status == "ok" and res.D == 768
    assert 0 < res.final_val_loss < math.log(256)
    assert res.final_val_bpb == pytest.approx(res.final_val_loss / math.log(2), rel=0.05)
    evals = [c for c in res.curve if c["val_loss"] is not None]
    assert [c["step"] for c in evals] == [2, 4, 6] and evals[-1]["val_loss"] == res.final_val_loss
    assert res.best_val_loss == min(c["val_loss"] for c in evals)
    assert res.eval_tokens == 256 and 0 < res.epochs < 1
    assert set(res.time_split) >= {"data", "forward_backward", "optimizer", "eval"}
    assert res.tokens_per_s > 0 and 0 < res.mfu < 1
    # MFU is the model's training FLOP/s over the recorded peak, exactly
    assert res.mfu == pytest.approx(res.flops_per_token * res.tokens_per_s / res.peak_flops, rel=1e-12)
    d = res.to_dict()
    json.dumps(d)
    assert d["versions"]["torch"] == torch.__version__
    from importlib.metadata import version

    from loopscale.model.train import loopscale_version

    # the runs record which loopscale trained them (with the commit of a git checkout: the version stays 0.1.0)
    assert d["versions"]["loopscale"] == loopscale_version() and loopscale_version().startswith(version("loopscale"))


def test_train_run_uses_the_tested_accumulation(base, monkeypatch):
    """train_run trains every step through accumulate_gradients (the function tested for "accumulation equals
    the full batch"), with the step's whole batch split into its micro-batches."""
    import loopscale.model.train as tr

    calls = []
    real = tr.accumulate_gradients

    def spy(loss_fn, windows, n_micro, autocast=None):
        calls.append((tuple(windows.shape), n_micro))
        return real(loss_fn, windows, n_micro, autocast)

    monkeypatch.setattr(tr, "accumulate_gradients", spy)
    train_run(RunConfig(**{**base, "micro_batch_tokens": 64}))
    assert calls == [((4, 33), 2)] * 4  # 4 steps of 128 tokens = 4 windows of T + 1 = 33, 2 micro-batches


def test_micro_batching_matches_one_batch(base):
    """The same run with 4 micro-batches per step and with none: the same windows are consumed and the losses
    agree up to float rounding."""
    one = train_run(RunConfig(**base))
    four = train_run(RunConfig(**{**base, "micro_batch_tokens": 32}))
    assert one.micro_batch_ids == list(range(4)) and four.micro_batch_ids == list(range(16))
    assert [c["step"] for c in one.curve] == [c["step"] for c in four.curve]
    for a, b in zip(one.curve, four.curve, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
    assert four.final_val_loss == pytest.approx(one.final_val_loss, rel=1e-4)
    assert four.final_val_loss != pytest.approx(math.log(256), rel=1e-2)  # it trained


def test_last_step_is_an_ordinary_step(base, tmp_path):
    """One curve point per step (log interval 1 here); the last one carries the final validation loss; the final
    event comes once, with the checkpoint written at the last step."""
    events = []
    run = {**base, "checkpoint_dir": str(tmp_path / "ck"), "checkpoint_every_steps": 3}
    res = train_run(RunConfig(**run), callback=events.append)
    assert [c["step"] for c in res.curve] == [1, 2, 3, 4]
    assert res.curve[-1]["val_loss"] == res.final_val_loss == res.best_val_loss
    finals = [e for e in events if e["final"]]
    assert len(finals) == 1 and finals[0]["step"] == 4 and finals[0]["status"] == "ok"
    assert finals[0]["checkpoint_path"].endswith("ckpt-00000004.pt")
    assert [e["step"] for e in events] == [3, 4]
    # resuming a finished run trains nothing and measures the same loss
    again = train_run(RunConfig(**run))
    assert again.resumed_from_step == 4 and again.final_val_loss == res.final_val_loss
    assert [c["step"] for c in again.curve] == [1, 2, 3, 4]
    # its time is the finished run's up to its last checkpoint (which follows the final evaluation), not that plus
    # this re-measurement (each rerun added its start-up and evaluation); time_split is this process's alone
    from loopscale.model.train import latest_checkpoint, load_checkpoint

    assert again.wall_s == load_checkpoint(latest_checkpoint(tmp_path / "ck"))["wall_s"] <= res.wall_s
    assert again.time_split["forward_backward"] == 0 and 0 < again.time_split["eval"] < again.time_split["total"]
    assert res.time_split["total"] == res.wall_s


def test_same_seed_same_loss_and_same_data_across_r(base):
    """Same seeds -> bitwise identical loss; r = 1 and r = 4 consume identical micro-batches (same data stream)."""
    a = train_run(RunConfig(**{**base, "model": tiny(r=1)}))
    b = train_run(RunConfig(**{**base, "model": tiny(r=1)}))
    c = train_run(RunConfig(**{**base, "model": tiny(r=4)}))
    d = train_run(RunConfig(**{**base, "model": tiny(r=4), "data_seed": 1}))
    assert a.final_val_loss == b.final_val_loss
    assert a.data_digest == c.data_digest and a.micro_batch_ids == c.micro_batch_ids
    assert d.data_digest != c.data_digest


def test_divergence_is_a_status(base):
    """An absurd LR ends the run with status 'diverged' and its step; no exception, measurements kept."""
    events = []
    res = train_run(RunConfig(**{**base, "lr": 1e5, "tokens": 8 * 128}), callback=events.append)
    assert res.status == "diverged" and 1 <= res.diverged_step < 8
    assert res.final_val_loss is None
    last = res.curve[-1]
    assert last["step"] == res.diverged_step and not (last["train_loss"] <= 20.0)
    assert events[-1]["final"] and events[-1]["status"] == "diverged"
    low = train_run(RunConfig(**{**base, "diverge_loss": 1.0}))  # threshold below the init loss
    assert low.status == "diverged" and low.diverged_step == 1


def test_threads_honoured(base):
    """num_threads sets torch's threads for the run and is recorded; the caller's setting is restored."""
    before = torch.get_num_threads()
    res = train_run(RunConfig(**{**base, "num_threads": 2, "tokens": 128}))
    assert res.num_threads == 2
    assert torch.get_num_threads() == before


def test_callback_exceptions_propagate(base):
    """The callback sees every eval with the contract keys; an exception it raises stops the run (Tune)."""
    seen = []

    class Stop(Exception):
        pass

    def cb(ev):
        seen.append(ev)
        if ev["step"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train_run(RunConfig(**{**base, "eval_every_steps": 1}), callback=cb)
    assert [e["step"] for e in seen] == [1, 2]
    assert set(seen[0]) >= {"step", "tokens", "train_loss", "val_loss", "lr", "checkpoint_path", "final"}
    assert seen[0]["tokens"] == 128 and seen[0]["final"] is False


def test_schedules():
    """linear (paper): 1 at step 0, p + 0.1 (1 - p) after; cosine and wsd end at final_lr_frac."""
    from loopscale.model.optim import lr_multiplier

    n = 100
    assert lr_multiplier(0, n, "linear", 0, 0.1) == 1.0
    assert lr_multiplier(50, n, "linear", 0, 0.1) == pytest.approx(0.5 + 0.1 * 0.5)
    assert lr_multiplier(4, n, "cosine", 0.1, 0.1) == pytest.approx(0.5)
    assert lr_multiplier(n - 1, n, "cosine", 0.1, 0.1) == pytest.approx(0.1)
    # the cosine's shape between warmup (10 steps) and the end: t = (step - 10) / 89
    for step in (30, 55, 80):
        t = (step - 10) / 89
        want = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))
        assert lr_multiplier(step, n, "cosine", 0.1, 0.1) == pytest.approx(want, rel=1e-12)
    # linear and wsd train their last step one step short of final_lr_frac
    assert lr_multiplier(n - 1, n, "linear", 0, 0.1) == pytest.approx(0.1 + 0.9 / n)
    assert lr_multiplier(n - 1, n, "wsd", 0.0, 0.1, decay_frac=0.2) == pytest.approx(0.1 + 0.9 / 20)
    assert lr_multiplier(70, n, "wsd", 0.0, 0.1, decay_frac=0.2) == 1.0
    assert lr_multiplier(90, n, "wsd", 0.0, 0.1, decay_frac=0.2) == pytest.approx(0.5 + 0.05)


def test_train_cli_json(trainer_corpus_dir, trainer_cache_dir):
    """`loopscale train ... --json` prints the contract keys; bad flags exit 2 with the field named."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app  # the console script, with its error presenter

    common = [
        "train",
        "--d-model",
        "32",
        "--r",
        "2",
        "--seq-len",
        "32",
        "--batch-tokens",
        "128",
        "--eval-tokens",
        "128",
    ]
    common += ["--corpus", str(trainer_corpus_dir), "--cache-dir", str(trainer_cache_dir)]
    out = CliRunner().invoke(app, [*common, "--tokens", "256", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout.strip().splitlines()[-1])
    for k in (
        "status",
        "final_val_loss",
        "D",
        "C",
        "N_once",
        "N_rec",
        "flops_per_token",
        "tokens_per_s",
        "mfu",
        "wall_s",
    ):
        assert k in d
    assert d["status"] == "ok" and d["D"] == 256 and d["C"] == d["flops_per_token"] * 256
    bad = CliRunner().invoke(app, [*common, "--tokens", "0", "--json"])
    assert bad.exit_code == 2 and "tokens must be a positive integer" in bad.output
    # --seeds: the seeds as one seed ensemble, one JSON object per member, each its single run's result
    ens = CliRunner().invoke(app, [*common, "--tokens", "256", "--seeds", "0,5", "--json"])
    assert ens.exit_code == 0, ens.output
    members = json.loads(ens.stdout.strip().splitlines()[-1])
    assert [m["seed"] for m in members] == [0, 5] and all(set(m) == set(d) for m in members)
    assert members[0]["final_val_loss"] == pytest.approx(d["final_val_loss"], rel=1e-4)
    one = CliRunner().invoke(app, [*common, "--tokens", "256", "--seed", "5", "--json"])
    assert members[1]["final_val_loss"] == pytest.approx(json.loads(one.stdout.strip().splitlines()[-1])["final_val_loss"], rel=1e-4)
    assert members[0]["final_val_loss"] != members[1]["final_val_loss"]
    text = CliRunner().invoke(app, [*common, "--tokens", "256", "--seeds", "2"])
    assert text.exit_code == 0 and "seed    0: ok, final_val_loss " in text.output and "seed    1: ok" in text.output
    # an ensemble says the run's warnings as a single run does (they were only in its --json output)
    text = CliRunner().invoke(app, [*common, "--tokens", "300", "--seeds", "2"])
    assert text.exit_code == 0 and "warning: tokens=300 rounded to D=256 (whole steps of batch_tokens=128)" in text.output
    assert text.output.count("warning: tokens=300 rounded") == 1  # once, not once per member
    for seeds, msg in (("0,0", "distinct integers"), ("0", "a count must be in [1, 100000]"), ("a,b", "give a count k"),
                       ("0", "one run with seed s: --seed s"), ("99999999999999999999", "a count must be in [1, 100000]"),
                       ("0,99999999999999999999", "distinct integers in [0, 4294967295]")):  # fmt: skip
        bad = CliRunner().invoke(app, [*common, "--tokens", "256", "--seeds", seeds])
        assert bad.exit_code == 2 and msg in " ".join(bad.output.split()), bad.output
        assert "training" not in bad.output  # refused before anything starts
    bad = CliRunner().invoke(app, [*common, "--tokens", "256", "--seed", str(2**64)])  # overflowed inside torch
    assert bad.exit_code == 2 and "seed must be an integer in [0, 4294967295]" in bad.output, bad.output
    bad = CliRunner().invoke(app, [*common, "--tokens", "256", "--seeds", "2", "--seed", "1"])
    assert bad.exit_code == 2 and "not both" in bad.output


def test_stream_shorter_than_window_fails_before_training(tmp_path, trainer_cache_dir):
    """A corpus whose training stream is shorter than seq_len + 1 fails with a clear ValueError, before training."""
    (tmp_path / "short.txt").write_text("a short document of a few words")
    cfg = RunConfig(
        model=tiny(),
        corpus=str(tmp_path / "short.txt"),
        tokens=128,
        batch_tokens=128,
        cache_dir=str(trainer_cache_dir),
    )
    with pytest.raises(ValueError, match=r"the training token stream \(.*\) is shorter than one window: seq_len=32 needs at least seq_len \+ 1 = 33 tokens"):
        train_run(cfg)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train_run(RunConfig(model=tiny(), corpus=str(tmp_path / "missing.txt"), tokens=128, batch_tokens=128))


@pytest.mark.slow
def test_embedded_corpus_learns_and_larger_D_is_better(trainer_cache_dir):
    """Smallest CPU preset (d = 32) at r = 2 on the embedded corpus: 192k byte tokens end well below the byte-unigram
    entropy and below a 48k-token run (the trainer's quality bar, scaled down; the 2 M-token check is
    ``benchmarks/bench_train.py --quality``: 1.94 vs 3.19 nats/byte measured)."""
    from loopscale.model.data import load_tokens, unigram_entropy

    h = unigram_entropy(load_tokens("embedded", cache_dir=trainer_cache_dir).val, 256)
    losses = []
    for D in (48_000, 192_000):
        cfg = RunConfig(
            model=preset_config("cpu", r=2, d_model=32),
            tokens=D,
            batch_tokens=1024,
            lr=1e-2,
            eval_tokens=8192,
            cache_dir=str(trainer_cache_dir),
        )
        losses.append(train_run(cfg).final_val_loss)
    assert losses[1] < losses[0] - 0.2
    assert losses[1] < h - 0.3


def test_epochs_beyond_the_corpus_warn(tmp_path, trainer_cache_dir):
    """D above the training tokens trains on (data repeats), reports epochs > 1 and warns."""
    (tmp_path / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 60)
    cfg = RunConfig(
        model=tiny(),
        corpus=str(tmp_path / "a.txt"),
        tokens=24 * 128,
        batch_tokens=128,
        eval_tokens=64,
        cache_dir=str(trainer_cache_dir),
    )
    with pytest.warns(UserWarning, match="exceeds"):
        res = train_run(cfg)
    assert res.status == "ok" and res.epochs > 1 and "exceeds" in res.warnings[0]
    assert len(res.micro_batch_ids) == 24


def test_bf16_autocast_runs(base):
    """precision='bf16' (autocast; meant for GPU, also runs on CPU) trains to a loss close to fp32's."""
    fp32 = train_run(RunConfig(**base))
    bf16 = train_run(RunConfig(**{**base, "precision": "bf16"}))
    assert bf16.status == "ok" and math.isfinite(bf16.final_val_loss)
    assert bf16.final_val_loss != fp32.final_val_loss
    assert bf16.final_val_loss == pytest.approx(fp32.final_val_loss, abs=0.1)


def test_peak_flops_keeps_the_highest_rate_on_record(tmp_path, monkeypatch):
    """A stale low rate in the cache (measured while the core was shared) is replaced by a new measurement; a
    higher rate on record is kept (a loaded measurement must not make MFU read high)."""
    import json as _json

    import torch

    from loopscale.model import train as tr

    monkeypatch.setattr(tr, "_PEAK_CACHE", {})
    path = tmp_path / "peak_flops.json"
    rate, how = tr.peak_flops(torch.device("cpu"), 1, tmp_path)
    key = next(iter(_json.loads(path.read_text())))
    assert rate > 1e8 and how == "measured fp32 matmul"
    path.write_text(_json.dumps({key: 1.0}))  # stale, far too low
    monkeypatch.setattr(tr, "_PEAK_CACHE", {})
    rate2, _ = tr.peak_flops(torch.device("cpu"), 1, tmp_path)
    assert rate2 > 1e8 and _json.loads(path.read_text())[key] == rate2
    path.write_text(_json.dumps({key: 1e15}))  # a higher rate on record wins
    monkeypatch.setattr(tr, "_PEAK_CACHE", {})
    assert tr.peak_flops(torch.device("cpu"), 1, tmp_path) == (1e15, "measured fp32 matmul (highest on record)")


@pytest.mark.parametrize(
    "name,precision,peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H200 NVL", "bf16", 835e12),
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA L40", "bf16", 181e12),  # matched the L4 entry (121e12) by substring
        ("NVIDIA L40S", "bf16", 362e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA A10G", "bf16", None),  # matched A10 (125e12), another card
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA H100 80GB HBM3", "fp32", None),  # was measured against the bf16 peak
    ],
)
def test_gpu_peak_is_the_cards_own_dense_bf16_peak(monkeypatch, name, precision, peak):
    """The MFU denominator on a GPU: the card's own dense bf16 peak, found by name; none for an fp32 run or a card
    the table does not know (substring matching gave an L40 the L4's peak and an H100 PCIe the SXM's)."""
    import torch

    from loopscale.model.train import peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    got, src = peak_flops(torch.device("cuda"), 1, precision=precision)
    assert got == peak, src


def test_bits_per_byte_divides_by_the_bytes_a_token_holds(base):
    """With bytes as tokens bits/byte is loss / ln 2 whichever way bytes per token enters; a BPE run, a few bytes
    per token, tells dividing by it from multiplying."""
    from loopscale.model.data import load_tokens

    cfg = RunConfig(**{**base, "tokenizer": "bpe:320", "model": tiny().replace(vocab_size=320)})
    res = train_run(cfg)
    bpt = load_tokens(base["corpus"], "bpe:320", cache_dir=base["cache_dir"]).bytes_per_token_val
    assert bpt > 1.3
    assert res.final_val_bpb == pytest.approx(res.final_val_loss / math.log(2) / bpt, rel=1e-12)


def test_an_iso_flop_run_says_when_whole_steps_miss_its_budget(base):
    """--target-flops trained C = F·D up to a batch away from the budget without a word, where a rounded --tokens
    warns. The figures here are worked out from the accounting."""
    model = base["model"]
    F = flops_per_token(model)
    C = 5.5 * F * 128  # 5.5 steps of 128 tokens: round() trains 6 (round half to even), 9.1 % over
    res = train_run(RunConfig(**{**base, "tokens": None, "target_flops": C}))
    assert res.D == 6 * 128
    want = f"target_flops={C:.4g} trains C = F·D = {F * 768:.4g} FLOPs (+9.1%): D=768 is whole steps of batch_tokens=128"
    assert want in res.warnings
    exact = train_run(RunConfig(**{**base, "tokens": None, "target_flops": 4.0 * F * 128}))
    assert not [w for w in exact.warnings if w.startswith("target_flops=")]


def test_more_threads_than_cpus_is_said(base, monkeypatch):
    """--num-threads 64 on a 2-core machine trained 92x slower than with 2, without a word."""
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    res = train_run(RunConfig(**{**base, "num_threads": 3}))
    assert ("num_threads=3 is more than the 2 CPU(s) this process may use: the threads contend for them and "
            "training slows (set num_threads <= 2)") in res.warnings  # fmt: skip
    ok = train_run(RunConfig(**{**base, "num_threads": 2}))
    assert not [w for w in ok.warnings if w.startswith("num_threads=")]


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--corpus", "{tmp}/missing.txt"], "error: corpus file '{tmp}/missing.txt' does not exist"),
        (["--corpus", "{tmp}/short.txt"], "error: the training token stream (11 tokens) is shorter than one window"),
        (["--text-column", "body"], "error: text_column 'body' names the column of a Parquet corpus"),
        (["--tokenizer", "pretokenized"], "error: tokenizer 'pretokenized' needs a .bin/.npy token file"),
    ],
)
def test_train_refuses_a_corpus_before_its_training_line(tmp_path, flags, said):
    """A missing corpus (or one too short, or a flag that does not fit it) printed 'training r=... on ...' and then
    the error: two lines, the first saying training started. The error is now the one line."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    (tmp_path / "short.txt").write_text("hello world")
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    res = CliRunner().invoke(app, ["train", "--d-model", "16", "--tokens", "1024", "--batch-tokens", "256",
                                   "--cache-dir", str(tmp_path / "c"), *flags])  # fmt: skip
    assert res.exit_code == 2, res.output
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(said.replace("{tmp}", str(tmp_path))), res.stderr


def test_train_refuses_a_checkpoint_of_another_run_before_its_training_line(tmp_path):
    """A --checkpoint-dir holding another run's checkpoint printed 'training r=... on ...' (after reading the corpus)
    and then the refusal. It is now the one line, naming what differs; a single run's checkpoint is refused for an
    ensemble (and another ensemble's for other seeds), and the same run and the same ensemble still resume."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    def train(*flags):
        return CliRunner().invoke(app, ["train", "--tokens", "1024", "--batch-tokens", "256", "--seq-len", "32",
                                        "--eval-tokens", "256", "--checkpoint-every-steps", "2",
                                        "--cache-dir", str(tmp_path / "c"), *flags])  # fmt: skip

    one, ens = str(tmp_path / "one"), str(tmp_path / "ens")
    assert train("--d-model", "16", "--checkpoint-dir", one).exit_code == 0
    assert train("--d-model", "16", "--checkpoint-dir", ens, "--seeds", "2").exit_code == 0
    # the fields said as the command's flags (a field without one, n_recur_block, as the key: it follows from r)
    for flags, differs in [
        (["--d-model", "32", "--checkpoint-dir", one], "--d-model"),  # it said ['model'], then ['model.d_model']
        (["--d-model", "16", "--r", "4", "--checkpoint-dir", one],  # r = 4 at iso-depth: its own layout and BPTT
         "--bptt-k, --injection, --n-coda, --n-prelude, model.n_recur_block, --r"),
        (["--d-model", "16", "--lr", "0.002", "--checkpoint-dir", one], "--lr"),
        (["--d-model", "16", "--checkpoint-dir", ens, "--seeds", "0,2"], "--seeds"),
        # another kind: it named the kinds' own seed keys, 'data_seed, data_seeds, seed, seeds'
        (["--d-model", "16", "--checkpoint-dir", one, "--seeds", "2"],
         "it was written by a single run (seed 0), and this is a seed ensemble (seeds [0, 1])"),
        (["--d-model", "32", "--checkpoint-dir", ens], "it was written by a seed ensemble (seeds [0, 1]), and this is "
                                                       "a single run (seed 0); it differs also in --d-model"),
    ]:
        res = train(*flags)
        assert res.exit_code == 2, res.output
        detail = differs if differs.startswith("it was") else f"differs in {differs}"
        assert res.stderr.strip().splitlines() == [
            f"error: checkpoint '{flags[flags.index('--checkpoint-dir') + 1]}/ckpt-00000004.pt' belongs to a "
            f"different run ({detail}); use another --checkpoint-dir or delete it"
        ], res.stderr
    again = train("--d-model", "16", "--checkpoint-dir", one, "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["resumed_from_step"] == 4
    again = train("--d-model", "16", "--checkpoint-dir", ens, "--seeds", "2", "--json")
    assert again.exit_code == 0 and [o["resumed_from_step"] for o in json.loads(again.stdout)] == [4, 4]


def test_a_model_that_collapsed_to_one_prediction_is_said(base):
    """LR 50 at d = 16 trained to a model whose logits are equal at every position, whatever the input: a constant
    next-token distribution (loss 5.28 nats/token, against 3.14 at LR 0.3), with status ok and no word. The run now
    says so; a learning run (and an untrained one: lr = 0 has its own note) does not, nor does the check fire on a
    model whose logits vary by more than the threshold. An ensemble member says it as its single run does."""
    from loopscale.model.ensemble import train_ensemble
    from loopscale.model.train import COLLAPSE_SPREAD, collapse_note

    cfg = {**base, "model": base["model"].replace(d_model=16), "tokens": 16384, "batch_tokens": 512}
    hot = train_run(RunConfig(**{**cfg, "lr": 50.0}))
    said = [w for w in hot.warnings if w.startswith("the model collapsed")]
    assert hot.final_val_loss < math.log(256)  # below the uniform prediction's loss: only the collapse tells
    assert hot.status == "did_not_learn" and said == [
        f"the model collapsed: it predicts the same next-token distribution at every position whatever its input "
        f"(logits equal within 0.0001), so its final loss {hot.final_val_loss:.4f} nats/token measures no learning "
        "(status did_not_learn: fits leave it out); lr=50 is likely too high"
    ]
    for lr in (0.01, 0.0):
        res = train_run(RunConfig(**{**cfg, "lr": lr}))
        assert res.status == "ok" and not [w for w in res.warnings if "collapsed" in w or "did not learn" in w]
    flat = torch.zeros(1, 8, 5)
    assert collapse_note(flat, 5.0, 1.0) is not None
    flat[0, 3, 2] = 2 * COLLAPSE_SPREAD  # one logit of one position differs: not constant
    assert collapse_note(flat, 5.0, 1.0) is None
    members = train_ensemble(RunConfig(**{**cfg, "lr": 50.0}), [0, 1])
    assert [w for w in members[0].warnings if "collapsed" in w] == said  # member 0 is the single run above
    assert members[0].status == "did_not_learn"


def test_a_run_whose_final_loss_is_not_below_ln_v_did_not_learn(base):
    """The smoke grid at LR 30 ended runs at 8.6-11.3 nats/token, above ln 256 = 5.55 (the loss of a uniform
    prediction) and under the divergence threshold: status ok, fitted (R^2 0.50), said nowhere. Such a run now has
    status did_not_learn, keeps its loss, and says why; a run at the uniform loss exactly is one too."""
    from loopscale.model.train import not_learned_note

    ln_v = math.log(256)
    assert not_learned_note(ln_v - 1e-9, 256, 0.01) is None
    assert not_learned_note(ln_v, 256, 0.01) == (
        f"the run did not learn: its final validation loss {ln_v:.4f} nats/token is not below ln V = {ln_v:.4f}, the "
        "loss of a uniform prediction over the vocabulary (status did_not_learn: fits leave it out); lr=0.01 is "
        "likely too high, or the run too short"
    )
    assert not_learned_note(8.63, 256, 30.0).startswith("the run did not learn: its final validation loss 8.6300")
    assert not_learned_note(float("nan"), 256, 1.0) is not None  # NaN is not below ln V


def test_a_vocabulary_well_above_the_tokenizers_ids_is_said(base):
    """`--vocab-size 1000` with byte tokens trained a model whose 744 extra rows are never an input or a target (the
    head still computed their logits) without a word. A few rows of padding (the paper's 32064 for BPE 32000) and a
    pretokenized corpus (whose size is not known) give no note."""
    from loopscale.model.train import unused_vocab_note

    res = train_run(RunConfig(**{**base, "model": base["model"].replace(vocab_size=1000)}))
    assert ("vocab_size=1000 is 744 rows more than the byte tokenizer's 256 ids: those rows of the embedding and "
            "output head are never an input or a target, yet the head computes their logits (F and C count them); "
            "set vocab_size to 256 (`loopscale train --vocab-size 256`, a spec's model.vocab_size; the paper preset's "
            "own is 32064, for its 32000-token BPE)") in res.warnings  # fmt: skip
    assert not [w for w in train_run(RunConfig(**base)).warnings if w.startswith("vocab_size=")]
    assert unused_vocab_note(320, "byte") is None and unused_vocab_note(321, "byte") is not None  # 64 rows
    assert unused_vocab_note(32064, "bpe:32000") is None and unused_vocab_note(35201, "bpe:32000") is not None
    assert unused_vocab_note(70000, "pretokenized") is None


def test_a_token_files_vocabulary_well_above_its_largest_id_is_said(base, tmp_path):
    """A token file whose largest id is 199 trained with vocab_size 1000 computed 800 logits per token that are
    never a target, without a word (a text corpus's tokenizer got the note). The file's largest id is known once it
    is read: a vocabulary more than twice its ids is named; one up to twice them is not (a shard of a larger
    tokenizer's text may lack its rarest ids)."""
    import numpy as np

    from loopscale.model.train import unused_vocab_note

    ids = (np.arange(20_000) * 7919 % 200).astype(np.uint16)
    np.save(tmp_path / "t.npy", ids)
    cfg = {**base, "corpus": str(tmp_path / "t.npy"), "tokenizer": "pretokenized"}
    res = train_run(RunConfig(**{**cfg, "model": base["model"].replace(vocab_size=1000)}))
    assert ("vocab_size=1000 is 800 rows more than the token file needs (its largest id is 199): those rows of the "
            "embedding and output head are never an input or a target, yet the head computes their logits (F and C "
            "count them); set vocab_size to the vocabulary of the tokenizer that wrote the file (at least 200: "
            "`loopscale train --vocab-size`, a spec's model.vocab_size)") in res.warnings  # fmt: skip
    kept = train_run(RunConfig(**{**cfg, "model": base["model"].replace(vocab_size=400)}))
    assert not [w for w in kept.warnings if w.startswith("vocab_size=")]
    assert unused_vocab_note(400, "pretokenized", 200) is None and unused_vocab_note(401, "pretokenized", 200)
    assert unused_vocab_note(74, "pretokenized", 10) is None and unused_vocab_note(75, "pretokenized", 10)


def test_a_spec_whose_vocabulary_is_well_above_its_tokenizers_is_warned_before_any_run(tmp_path):
    """A spec of the paper's model (V = 32064) on byte tokens: every run warned that 31,808 rows are never used
    (and counted in F and C), while the dry run said nothing and the warning told to leave vocab_size out, which
    gives the preset's 32064. The spec's corpus check now gives the note (the dry run's corpus_warning)."""
    import copy

    from loopscale.sweep.presets import PRESETS
    from loopscale.sweep.spec import parse_spec

    d = copy.deepcopy(PRESETS["smoke"])
    d["model"] = {"preset": "paper", "size_unit": "width_scale", "seq_len": 32}
    d.update(sizes=[2, 4], tokenizer="byte")
    corpus_notes, _ = parse_spec(d)._data_notes()
    assert [n for n in corpus_notes if n.startswith("vocab_size=32064 is 31808 rows more than the byte tokenizer's")]
    d["model"]["vocab_size"] = 256
    assert not [n for n in parse_spec(d)._data_notes()[0] if n.startswith("vocab_size=")]


def test_token_budgets_round_to_whole_steps_half_to_even_and_half_a_batch_trains_none(base):
    """`--tokens 1024` at 2,048 tokens a step was refused as "less than half a batch" though it is exactly half;
    ties go to the even step count (Python's round, as the authors' code): 5,120 -> 4,096, 7,168 -> 8,192."""
    from loopscale.model.train import resolve_tokens

    cfg = {**base, "batch_tokens": 2048}
    assert [resolve_tokens(RunConfig(**{**cfg, "tokens": t})) for t in (1025, 3072, 5120, 7168)] == [
        2048, 4096, 4096, 8192]  # fmt: skip
    # in whole numbers: a float division gave D = 99999999999999991611392 for --tokens 1e23 (written out)
    huge = 10**23 + 3
    assert resolve_tokens(RunConfig(**{**cfg, "tokens": huge})) == (huge // 2048) * 2048
    with pytest.raises(ValueError, match=r"tokens=1024 is at most half a batch \(batch_tokens=2048\), so it rounds"):
        RunConfig(**{**cfg, "tokens": 1024})


def test_an_ensemble_checkpoint_of_the_same_seeds_in_another_order_says_the_order_counts():
    """After `train --seeds 3`, `--seeds 2,1,0` was refused as differing in --seeds without a word on why: the
    members are stacked in their order, so the order is part of the run. The refusal says so."""
    from loopscale.model.train import CheckpointError, check_run_key

    saved = {"lr": 0.01, "seeds": [0, 1, 2], "data_seeds": [0, 0, 0]}
    with pytest.raises(CheckpointError, match=re.escape("differs in ['seeds']; it holds these seeds in another "
                                                        "order, [0, 1, 2], which is part of the run: give them so")):
        check_run_key("ck", saved, {**saved, "seeds": [2, 1, 0]})
    with pytest.raises(CheckpointError) as e:
        check_run_key("ck", saved, {**saved, "seeds": [0, 1, 3]})
    assert "another order" not in str(e.value)
