"""benchmarks/: bench_train.py refuses a member count below 1, names a failed child run, trains with the
optimizer asked for and has a quick mode; bench_sweep.py prints only its JSON on stdout; check_gpu_trainer.py's
checks pass on a CPU, where runs repeat bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_train_refuses_ensemble_below_one():
    for args in (["--one", "--ensemble", "0"], ["--ensemble", "-2"]):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, (args, proc.stderr)
        assert "--ensemble must be >= 1" in proc.stderr and proc.stdout == "", (args, proc.stdout)


def test_bench_train_names_a_failed_child_run():
    """A child run that refuses its config ends the benchmark with exit 1 and the child's reason, not a bare
    CalledProcessError, and prints no JSON."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), "--ensemble", "2", "--d-model", "16",
         "--batch-tokens", "100", "--tokens", "1024"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "a child run failed" in proc.stderr and "--batch-tokens 100" in proc.stderr
    assert "batch_tokens must be a positive multiple of model.seq_len=128, got 100" in proc.stderr
    assert proc.stdout == ""


def test_bench_train_single_run_trains_with_the_optimizer_asked_for():
    """``--r`` (the throughput mode's per-run child) trains with ``--optimizer`` and says which; before, it trained
    AdamW whatever was asked. An optimizer the trainer does not know is refused by the option parser."""
    out = {}
    for opt in ("adamw", "muon"):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), "--r", "1", "--d-model", "16",
             "--tokens", "1024", "--batch-tokens", "512", "--eval-tokens", "512", "--optimizer", opt],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[opt] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out[opt]["optimizer"] == opt
    assert out["adamw"]["final_val_loss"] != out["muon"]["final_val_loss"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), "--r", "1", "--optimizer", "sgd"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "--optimizer" in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("keep", [False, True])
def test_bench_sweep_prints_only_its_json_on_stdout(monkeypatch, capfd, tmp_path, keep):
    """Tune's experiment table (printed by the driver) and the lines Ray forwards from trials (written to fd 1)
    go to stderr: stdout is the one JSON object the docstring promises, so ``bench_sweep.py | jq`` works.
    Training and Ray are stubbed: what is checked is where the sweep's own output goes.

    The sweep folder that Tune's lines name: with ``--out DIR`` it is DIR, kept, and the JSON's sweep_folder; without,
    a temporary folder that is gone at the end, which a line on stderr says (sweep_folder null)."""
    import contextlib
    import importlib.util
    import os

    import loopscale.cluster.connect as connect
    import loopscale.model.train as train
    import loopscale.sweep.commands as commands

    @contextlib.contextmanager
    def fake_ray_session(**kw):
        os.write(1, b"(grid_trainable pid=1) a line Ray forwards\n")
        yield

    folders = []

    def fake_sweep(spec, out, **kw):
        print("| Configuration for experiment grid_bench_001 |")
        print(f"View detailed results here: {out}/grid_bench_001", file=sys.stderr)
        Path(out).mkdir(parents=True, exist_ok=True)  # as run_sweep makes it
        (Path(out) / "runs.parquet").write_text("stub")
        folders.append(Path(out))

    monkeypatch.setattr(connect, "ray_session", fake_ray_session)
    monkeypatch.setattr(commands, "run_sweep", fake_sweep)
    monkeypatch.setattr(train, "train_run", lambda cfg: None)
    keep_dir = tmp_path / "sweep"
    monkeypatch.setattr(sys, "argv", ["bench_sweep.py", "--quick", *(["--out", str(keep_dir)] if keep else [])])
    spec = importlib.util.spec_from_file_location("bench_sweep", ROOT / "benchmarks" / "bench_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main()
    out, err = capfd.readouterr()
    res = json.loads(out)
    assert res["trials"] == 16, out
    assert "Configuration for experiment" in err and "a line Ray forwards" in err
    note = "was temporary and has been removed; --out DIR keeps it"
    [folder] = folders
    if keep:
        assert folder == keep_dir and (keep_dir / "runs.parquet").read_text() == "stub"
        assert res["sweep_folder"] == str(keep_dir) and note not in err
    else:
        assert not folder.exists() and res["sweep_folder"] is None
        assert f"the sweep folder {folder} named in Tune's lines above {note}" in err


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        ("bench_fit.py", ["--quick", "--resamples", "0"], "--resamples must be >= 1, got 0"),  # --quick replaced it
        ("bench_model.py", ["--steps", "0"], "--steps must be >= 1, got 0"),  # fell back to the default
        ("bench_model.py", ["--rs", "3"], "--widths 128 --rs 3: r=3 must divide the looped depth"),  # traceback
        ("bench_gpu.py", ["--preset", "foo"], "--preset foo --r 1: preset must be one of"),  # traceback
        ("bench_gpu.py", ["--device", "cpu", "--steps", "0"], "--steps must be >= 1, got 0"),  # IndexError
        ("check_gpu_trainer.py", ["--r", "3"], "--preset cpu --r 3 --d-model 128: r=3 must divide the looped depth"),
        ("check_gpu_trainer.py", ["--batch-tokens", "1000"], "--batch-tokens 1000 must be a multiple of the sequence"),
        ("bench_sweep.py", ["--out", str(ROOT / "benchmarks")],  # its completed runs would not be trained again
         f"--out {ROOT / 'benchmarks'} must be a new or empty folder"),
        ("bench_sweep.py", ["--cpus", "0"], "--cpus must be >= 1, got 0"),
        # options a mode ignored: it trained on the CPU in fp32 and printed no device
        ("bench_train.py", ["--ensemble", "4", "--device", "cuda"], "--device / --precision apply to the throughput"),
        ("bench_train.py", ["--profile", "--precision", "bf16"], "--device / --precision apply to the throughput"),
        ("bench_train.py", ["--quality", "--optimizer", "muon"], "--quality trains the embedded corpus with AdamW"),
        ("lr_rank_by_step.py", ["--lrs", "0.01", "0.01", "0.1"], "--lrs needs three distinct finite LRs > 0 or more"),
        ("lr_rank_by_step.py", ["--steps", "0"], "--steps must be >= 1, got 0"),
    ],
)
def test_benchmarks_refuse_bad_options_before_any_work(script, args, says):
    """A bad option is one argparse error line and exit 2 before anything is built or timed; before, some ended in
    a traceback, and others were silently replaced by a default."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, (script, args, proc.stderr[-2000:])
    assert f"error: {says}" in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr


def test_bench_train_quick_is_a_short_run_of_each_mode():
    """``--quick`` (the other benchmarks had one; this one trained 100,000 tokens per run at three widths):
    the throughput mode trains its smallest width at r = 1 and 4 on 8192 tokens each, and given options win."""
    script = str(ROOT / "benchmarks" / "bench_train.py")
    proc = subprocess.run([sys.executable, script, "--quick"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads(proc.stdout)["runs"]
    assert [(x["d_model"], x["r"], x["D"]) for x in runs] == [(32, 1, 8192), (32, 4, 8192)]
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--r", "2", "--d-model", "16", "--tokens", "4096", "--batch-tokens", "1024"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    one = json.loads(proc.stdout)
    assert (one["d_model"], one["r"], one["D"], one["steps"]) == (16, 2, 4096, 4)


def test_check_gpu_trainer_passes_on_a_cpu():
    """The GPU trainer check run on a CPU (its smoke mode, orthogonalising in fp32, as bf16 rounding of the update
    would flip now and then between batched and single ops): ensemble members equal their single runs to float
    rounding, the repeat is bit for bit, and the run stopped at its half-way checkpoint resumes there, consumes the
    same micro-batches and ends at the uninterrupted run's loss. A check that could not fail would print the same
    whatever the trainer did: here each figure is one the trainer produces."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "check_gpu_trainer.py"), "--device", "cpu", "--precision", "fp32",
         "--no-compile", "--d-model", "16", "--steps", "8", "--batch-tokens", "256", "--seeds", "2",
         "--optimizers", "muonh", "--eval-tokens", "2048", "--ns-fp32"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    (ens,) = out["ensemble_vs_single"]
    assert ens["optimizer"] == "muonh" and ens["status"] == ["ok", "ok"]
    assert max(ens["final_val_loss_rel_diff"]) < 1e-6 and max(ens["max_step_train_loss_rel_diff"]) < 1e-6
    assert ens["repeat_final_val_loss_rel_diff"] == 0.0 and ens["seed_spread_rel_std"] > 1e-4
    res = out["resume"]
    assert res["stopped_after_step"] == res["resumed_from_step"] == 4 and res["same_data_digest"]
    assert res["repeat_rel_diff"] == 0.0 and res["resumed_rel_diff"] == 0.0
    assert out["pass_ensemble_equals_single"] and out["pass_resume"]


def test_lr_rank_by_step_ranks_the_lrs_at_every_step():
    """benchmarks/lr_rank_by_step.py on three LRs over 4 smoke-preset steps: a row per step whose rank of the end's
    best LR agrees with the final losses it prints, and at the last step a correlation of 1 with them."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lr_rank_by_step.py"), "--preset", "smoke",
                           "--r", "1", "--steps", "4", "--lrs", "1e-4", "1e-2", "3e-3", "--eval-tokens", "256"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["lrs"] == [1e-4, 3e-3, 1e-2] and out["batch_tokens"] == 256 and out["optimizer"] == "adamw"
    r1 = out["by_r"]["1"]
    finals = {float(k): v for k, v in r1["final_val_loss"].items()}
    assert r1["end_best_lr"] == min(finals, key=finals.get)
    rows = r1["by_step"]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert rows[-1]["end_best_rank"] == 1 and rows[-1]["spearman_with_end"] == 1.0
    assert all(1 <= row["end_best_rank"] <= 3 and row["end_best_stopped_by_first_rung"] == (row["end_best_rank"] == 3)
               for row in rows)  # of 3, the one above the median is stopped  # fmt: skip
