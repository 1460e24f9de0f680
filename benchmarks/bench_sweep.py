"""Sweep overhead: wall time of a 16-trial grid on 2 CPUs against the ideal (sum of standalone times / 2).

Prints one JSON object: trials, tokens per trial, the standalone time of every trial (1 thread, in this process,
one after another), ideal_s = sum / cpus, sweep_wall_s (run_sweep on an already started Ray), ratio =
sweep_wall_s / ideal_s (target <= 1.10), ray_start_s (embedded Ray start-up), and the 1-minute load
average before and after (timings on a shared machine are noisy; compare runs with similar load).

    python benchmarks/bench_sweep.py [--tokens 65536] [--cpus 2] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--tokens",
        type=int,
        default=160000,
        help="tokens per trial (8-12 s each on one quiet core, measured)",
    )
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument(
        "--quick", action="store_true", help="8192 tokens per trial (a fast check of the harness)"
    )
    args = ap.parse_args()
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
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp, stdout_to_stderr():
        t0 = time.perf_counter()
        with ray_session(num_cpus=args.cpus, temp_dir="/tmp/lsray_bench"):
            ray_start = time.perf_counter() - t0
            t1 = time.perf_counter()
            run_sweep(spec, tmp, quiet=True)
            wall = time.perf_counter() - t1
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
        "meets_target": wall / ideal <= 1.10,
        "ray_start_s": round(ray_start, 3),
        "load_avg_1min_before": load0,
        "load_avg_1min_after": os.getloadavg()[0],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
