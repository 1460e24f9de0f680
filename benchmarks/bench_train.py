"""Benchmark of the single-run trainer (issue 3): prints one JSON object.

Default mode: a full training run of the CPU preset (d in {32, 64, 128}) at r in {1, 4} (each in a fresh subprocess so peak RSS is
per run): tokens/s, MFU, peak RSS and the time split into data, forward/backward, optimizer and eval, with
data loading as a share of step time (target <= 5 %).

``--quality``: the embedded-corpus check of issue 3: the smallest CPU preset (d = 32) at r = 2 trained for
``--quality-tokens`` (default 0.5 M and 2 M byte tokens); reports the validation loss next to the byte-unigram
entropy of the validation text (pass: at least 0.5 nats/byte below it at 2 M, and lower loss at the larger D).

Usage::

    python benchmarks/bench_train.py [--d-model 32 64 128] [--tokens 100000] [--num-threads 1]
    python benchmarks/bench_train.py --quality
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def one_run(args) -> dict:
    from loopscale.model.config import preset_config
    from loopscale.model.train import RunConfig, train_run

    m = preset_config("cpu", r=args.r, d_model=args.d_model[0])
    cfg = RunConfig(
        model=m,
        corpus=args.corpus,
        tokens=args.tokens,
        batch_tokens=args.batch_tokens,
        lr=args.lr,
        eval_tokens=args.eval_tokens,
        num_threads=args.num_threads,
        device=args.device,
        precision=args.precision,
        cache_dir=args.cache_dir,
    )
    res = train_run(cfg)
    ts = res.time_split
    step = ts["data"] + ts["forward_backward"] + ts["optimizer"]
    return {
        "r": args.r,
        "d_model": args.d_model[0],
        "status": res.status,
        "D": res.D,
        "steps": res.steps,
        "final_val_loss": res.final_val_loss,
        "tokens_per_s": res.tokens_per_s,
        "mfu": res.mfu,
        "peak_flops": res.peak_flops,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "wall_s": res.wall_s,
        "time_split_s": {k: round(v, 4) for k, v in ts.items()},
        "data_share_of_step": ts["data"] / step if step else None,
        "eval_share_of_wall": ts["eval"] / res.wall_s,
        "eval_tokens": res.eval_tokens,
        "num_threads": res.num_threads,
    }


def quality(args) -> dict:
    from loopscale.model.config import preset_config
    from loopscale.model.data import load_tokens, unigram_entropy
    from loopscale.model.train import RunConfig, train_run

    td = load_tokens("embedded", "byte", cache_dir=args.cache_dir)
    h = unigram_entropy(td.val, 256)
    runs = []
    for D in args.quality_tokens:
        cfg = RunConfig(
            model=preset_config("cpu", r=2, d_model=32),
            tokens=D,
            batch_tokens=args.batch_tokens,
            lr=args.lr,
            eval_tokens=args.eval_tokens,
            num_threads=args.num_threads,
            cache_dir=args.cache_dir,
        )
        res = train_run(cfg)
        runs.append(
            {
                "D": res.D,
                "final_val_loss": res.final_val_loss,
                "below_unigram": h - res.final_val_loss if res.final_val_loss else None,
                "tokens_per_s": res.tokens_per_s,
                "wall_s": res.wall_s,
            }
        )
    losses = [r["final_val_loss"] for r in runs]
    return {
        "mode": "quality",
        "unigram_entropy_val": h,
        "runs": runs,
        "pass_0p5_below_unigram_at_largest_D": runs[-1]["below_unigram"] is not None
        and runs[-1]["below_unigram"] >= 0.5,
        "pass_larger_D_lower_loss": all(
            a is not None and b is not None and b < a for a, b in zip(losses, losses[1:], strict=False)
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, nargs="+", default=[32, 64, 128], help="widths of the cpu preset")
    p.add_argument("--r", type=int, default=None, help="one r only (used for the per-run subprocess)")
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--eval-tokens", type=int, default=32768)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--corpus", default="embedded")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--quality", action="store_true")
    p.add_argument("--quality-tokens", type=int, nargs="+", default=[500_000, 2_000_000])
    args = p.parse_args()
    if args.quality:
        out = quality(args)
    elif args.r is not None:
        out = one_run(args)
    else:
        runs = []
        passthrough = []
        skip = False
        for a in sys.argv[1:]:  # forward every flag except --d-model's values and --quality
            if a == "--d-model":
                skip = True
                continue
            if skip and not a.startswith("--"):
                continue
            skip = False
            if a != "--quality":
                passthrough.append(a)
        for d in args.d_model:
            for r in (1, 4):
                cmd = [sys.executable, __file__, "--r", str(r), "--d-model", str(d), *passthrough]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        out = {
            "mode": "throughput",
            "note": "timings are noisy when other processes share the CPU",
            "runs": runs,
            "data_share_max": max(r["data_share_of_step"] for r in runs),
            "pass_data_le_5pct": all(r["data_share_of_step"] <= 0.05 for r in runs),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
