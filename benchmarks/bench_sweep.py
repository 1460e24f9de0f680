"""Sweep overhead: wall time of a 16-trial grid on 2 CPUs against the ideal (sum of standalone times / 2).

Prints one JSON object: trials, tokens per trial, the standalone time of every trial (1 thread, in this process,
one after another), ideal_s = sum / cpus, sweep_wall_s (run_sweep on an already started Ray), ratio =
sweep_wall_s / ideal_s (target <= 1.10), ray_start_s (embedded Ray start-up), the 1-minute load
average before and after (timings on a shared machine are noisy; compare runs with similar load), and sweep_folder:
the sweep's run folder, kept with ``--out DIR`` (null without it: the sweep then runs in a temporary folder, removed
at the end, although Tune's lines on stderr name it; a line on stderr says so). Ray's session files go to a
temporary folder removed at the end. Under ``--quick`` (a check of the harness) ``meets_target`` is null.

    python benchmarks/bench_sweep.py [--tokens 160000] [--cpus 2] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tokens",
        type=int,
        default=160000,
        help="tokens per trial (8-12 s each on one quiet core, measured)",
    )
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the embedded Ray (trials run one per CPU)")
    ap.add_argument(
        "--quick", action="store_true", help="8192 tokens per trial (a fast check of the harness)"
    )
    ap.add_argument(
        "--out",
        metavar="DIR",
        help="write the sweep folder to DIR (new or empty: runs completed there would not be trained again) and "
        "keep it; without it the sweep runs in a temporary folder removed at the end",
    )
    args = ap.parse_args()
    for name, v in (("--tokens", args.tokens), ("--cpus", args.cpus)):
        if v < 1:
            ap.error(f"{name} must be >= 1, got {v}")
    if args.out and os.path.exists(args.out) and (not os.path.isdir(args.out) or os.listdir(args.out)):
        ap.error(f"--out {args.out} must be a new or empty folder (a sweep skips the runs completed there)")
    tokens = 8192 if args.quick else args.tokens

    from loopscale.cluster.connect import ray_session
    from loopscale.model.train import train_run
    from loopscale.sweep.commands import run_sweep, stdout_to_stderr
    from loopscale.sweep.presets import PRESETS
    from loopscale.sweep.spec import parse_spec

    d = copy.deepcopy(PRESETS["smoke"])
    d.update(name="bench", tokens=[tokens, tokens + 256], sizes=[16, 32])
    d["training"].update(checkpoint_every_steps=None)
    spec = parse_spec(d)
    cells = spec.cells()
    load0 = os.getloadavg()[0]
    # warm the token cache and the peak-FLOP/s measurement once, outside the timings
    train_run(cells[0].run_config(tokens=256, checkpoint_every_steps=None))
    standalone = []
    for c in cells:
        t0 = time.perf_counter()
        train_run(c.run_config(checkpoint_every_steps=None))
        standalone.append(time.perf_counter() - t0)
    ideal = sum(standalone) / args.cpus
    # Tune's experiment table and the lines Ray forwards from the trials go to stderr: stdout is the JSON alone
    with contextlib.ExitStack() as stack:
        folder = args.out or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_sweep_"))
        # short and under /tmp: Ray's socket paths must stay within the 107-byte limit of AF_UNIX
        ray_tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="lsray_bench_", dir="/tmp",
                                                                  ignore_cleanup_errors=True))  # fmt: skip
        with stdout_to_stderr():
            t0 = time.perf_counter()
            with ray_session(num_cpus=args.cpus, temp_dir=ray_tmp):
                ray_start = time.perf_counter() - t0
                t1 = time.perf_counter()
                run_sweep(spec, folder, quiet=True)
                wall = time.perf_counter() - t1
    if not args.out:  # Tune's "View detailed results here: ..." named it
        print(f"bench_sweep: the sweep folder {folder} named in Tune's lines above was temporary and has been "
              "removed; --out DIR keeps it", file=sys.stderr)
    out = {
        "trials": len(cells),
        "tokens_per_trial": [c.run.tokens for c in cells],
        "cpus": args.cpus,
        "standalone_s": [round(x, 3) for x in standalone],
        "sum_standalone_s": round(sum(standalone), 3),
        "ideal_s": round(ideal, 3),
        "sweep_wall_s": round(wall, 3),
        "ratio": round(wall / ideal, 4),
        "target_ratio": 1.10,
        "meets_target": None if args.quick else wall / ideal <= 1.10,
        "ray_start_s": round(ray_start, 3),
        "load_avg_1min_before": load0,
        "load_avg_1min_after": os.getloadavg()[0],
        "sweep_folder": os.path.abspath(args.out) if args.out else None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
