"""How many optimizer steps before a validation loss ranks LRs as the end of the run does: prints one JSON object.

ASHA (``loopscale tune-lr``) first compares an LR study's trials at its first rung, ``tune.grace_milestones`` x the
steps per milestone, and stops the worse half (``tune.reduction_factor`` 2). This trains one run per LR of a
log grid over the default tune range (``train_run``, the ``--preset``'s model, optimizer, schedule and batch, the
embedded corpus) with a validation point at every step, and reports per step k: the Spearman rank correlation of
the LRs' validation losses at step k with their losses at the end, where the LR best at the end ranks at step k,
and whether a first rung at step k would stop it (ASHA at reduction factor 2 with every trial at the rung: a loss
above their median).

Usage::

    python benchmarks/lr_rank_by_step.py [--preset cpu|smoke] [--d-model 16] [--r 1 4] [--steps 128] [--lrs 1e-4 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import time


def _spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=["cpu", "smoke"], default="cpu", help="sweep preset whose model and training "
                    "settings the runs take (cpu: MuonH, batch 1024 of seq_len 128; smoke: AdamW, batch 256 of 32)")
    ap.add_argument("--d-model", type=int, default=16)
    ap.add_argument("--r", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--steps", type=int, default=128, help="optimizer steps of each run (the trial's budget)")
    ap.add_argument("--batch-tokens", type=int, default=None, help="default: the preset's")
    ap.add_argument("--eval-tokens", type=int, default=8192)
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1])
    ap.add_argument("--num-threads", type=int, default=1)
    args = ap.parse_args()
    for name in ("steps", "eval_tokens", "num_threads", "d_model"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.batch_tokens is not None and args.batch_tokens < 1:
        ap.error(f"--batch-tokens must be >= 1, got {args.batch_tokens}")
    if len(set(args.lrs)) < 3 or min(args.lrs) <= 0 or not all(math.isfinite(x) for x in args.lrs):
        ap.error(f"--lrs needs three distinct finite LRs > 0 or more (a rank correlation of fewer says nothing), "
                 f"got {args.lrs}")
    args.lrs = sorted(set(args.lrs))

    import numpy as np
    import torch

    from loopscale.model.config import preset_config
    from loopscale.model.train import RunConfig, train_run
    from loopscale.sweep.presets import preset_spec

    torch.set_num_threads(args.num_threads)
    cpu = preset_spec(args.preset).cells()[0].run  # the preset's model, optimizer, schedule and data settings
    args.batch_tokens = args.batch_tokens or cpu.batch_tokens
    out: dict = {"preset": args.preset, "d_model": args.d_model, "steps": args.steps, "batch_tokens": args.batch_tokens,
                 "eval_tokens": args.eval_tokens, "optimizer": cpu.optimizer, "schedule": cpu.schedule,
                 "lrs": args.lrs, "by_r": {}}  # fmt: skip
    t0 = time.perf_counter()
    for r in args.r:
        curves, finals, status = {}, {}, {}
        for lr in args.lrs:
            model = preset_config("cpu", r=r, d_model=args.d_model, seq_len=cpu.model.seq_len,
                                  effective_depth=cpu.model.effective_depth, vocab_size=cpu.model.vocab_size)
            run = RunConfig(model=model, corpus=cpu.corpus,
                            tokenizer=cpu.tokenizer, optimizer=cpu.optimizer, schedule=cpu.schedule,
                            warmup_frac=cpu.warmup_frac, lr=lr, tokens=args.steps * args.batch_tokens,
                            batch_tokens=args.batch_tokens, eval_tokens=args.eval_tokens, eval_every_steps=1,
                            num_threads=args.num_threads, seed=0)  # fmt: skip
            res = train_run(run)
            status[lr] = res.status
            curves[lr] = {int(p["step"]): float(p["val_loss"]) for p in res.curve if p.get("val_loss") is not None}
            finals[lr] = res.final_val_loss if res.final_val_loss is not None else math.inf
        ok = [lr for lr in args.lrs if math.isfinite(finals[lr])]
        if len(ok) < 3:  # no ranking to compare: said in the JSON, not a traceback on min() of nothing
            out["by_r"][str(r)] = {"status": {f"{lr:g}": status[lr] for lr in args.lrs},
                                   "error": f"{len(ok)} of {len(args.lrs)} LRs finished with a loss: too few to rank"}
            continue
        best = min(ok, key=lambda lr: finals[lr])
        rows = []
        for k in sorted({k for lr in ok for k in curves[lr]}):
            if not all(k in curves[lr] for lr in ok):
                continue
            at_k = [curves[lr][k] for lr in ok]
            order = sorted(ok, key=lambda lr: curves[lr][k])
            rank = order.index(best) + 1
            # ASHA's rule (reduction factor 2, all trials at the rung): stopped when worse than the median there
            cutoff = float(np.nanpercentile(at_k, 50))
            rows.append({"step": k, "spearman_with_end": round(_spearman(at_k, [finals[lr] for lr in ok]), 4),
                         "best_at_step": order[0], "end_best_rank": rank,
                         "end_best_stopped_by_first_rung": curves[best][k] > cutoff})  # fmt: skip
        # the first step from which a first rung never stops the end's best LR (None: it does at the last step)
        safe = None
        for row in reversed(rows):
            if row["end_best_stopped_by_first_rung"]:
                break
            safe = row["step"]
        out["by_r"][str(r)] = {"final_val_loss": {f"{lr:g}": finals[lr] for lr in args.lrs},
                               "status": {f"{lr:g}": status[lr] for lr in args.lrs}, "end_best_lr": best,
                               "first_safe_rung_step": safe, "by_step": rows}  # fmt: skip
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
