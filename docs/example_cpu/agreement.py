"""How often should a second run of the same design land inside the first run's 95 % intervals?

Two runs with disjoint seeds are two independent draws of the same estimator. If each run's interval is calibrated
(covers the truth 95 % of the time) and the two estimates have the same spread s, their difference has spread
s * sqrt(2) while the interval's half-width is 1.96 s, so the second estimate falls inside the first interval with
probability P(|Z| < 1.96 / sqrt(2)) = 0.83 per quantity — whatever the number of seeds: more seeds shrink the
interval and the run-to-run difference alike. Over several quantities the chance that every one agrees is lower.

This script measures that rate on real runs instead of assuming it: it pools the seeds of the k runs given (each
cell's seeds of all runs), draws from every cell's pool two disjoint sets of 1/k of it at random — the design's
seed counts, so each draw is exactly what one more run with other seeds would be —, computes each half's worth in unique layers and phi per r with the
product's own ladder bootstrap (``loopscale.fit.ladder.ladder_table``), and counts how often the second half's
estimate lies inside the first half's interval: per quantity, and for all looped models at once.

Usage (from the repository root)::

    python docs/example_cpu/agreement.py docs/example_cpu/half_seeds/{a,b,c,d} [--runs-per-draw 2] [--splits 200] [--json]

Each argument is a run folder with ``runs.parquet``; the runs must share no (cell, seed) pair, and every cell's
pool must split into k equal parts (k runs of one design give that). Prints a Markdown table, or one JSON object
with ``--json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from loopscale.fit.ladder import ladder_table

CELL = ["d_model", "D", "r", "layers_unique"]


def pooled_runs(folders: list[Path]) -> pd.DataFrame:
    """The ``ok`` runs of every folder, one row per (cell, seed), with ``loss`` and ``layers_unique``."""
    frames = []
    for f in folders:
        df = pd.read_parquet(f / "runs.parquet")
        df = df[df["status"] == "ok"]
        frames.append(
            df.assign(
                loss=df["final_val_loss"], layers_unique=df["n_prelude"] + df["n_recur_block"] + df["n_coda"]
            )
        )
    runs = pd.concat(frames, ignore_index=True)
    dup = runs.duplicated(CELL + ["seed"])
    if dup.any():
        raise SystemExit(
            f"the runs share {int(dup.sum())} (cell, seed) pairs: pool runs with disjoint seeds only"
        )
    return runs


def split(runs: pd.DataFrame, k: int, rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two disjoint random sets of 1/k of each cell's pooled seeds: two runs of the design with other seeds."""
    a, b = [], []
    for _, g in runs.groupby(CELL, sort=True):
        if len(g) % k:
            raise SystemExit(f"a cell has {len(g)} seeds pooled from {k} runs; expected a multiple of {k}")
        n = len(g) // k
        idx = rng.permutation(len(g))
        a.append(g.iloc[idx[:n]])
        b.append(g.iloc[idx[n : 2 * n]])
    return pd.concat(a), pd.concat(b)


def agreement(runs: pd.DataFrame, k: int, n_splits: int, seed: int = 0, n_boot: int = 1000) -> dict:
    """Rates (over ``n_splits`` random draws) at which the second draw's estimate lies in the first's 95 % CI;
    ``runs`` pools the seeds of ``k`` runs of one design."""
    rng = np.random.default_rng(seed)
    per_q: dict[str, list[bool]] = {}
    all_worth = []
    for i in range(n_splits):
        first, second = split(runs, k, rng)
        ta = ladder_table(first, n_boot=n_boot, seed=2 * i).set_index("r")
        tb = ladder_table(second, n_boot=n_boot, seed=2 * i + 1).set_index("r")
        ok = []
        for r in ta.index:
            for name, col, lo, hi in (("worth in unique layers", "worth_layers", "worth_lo", "worth_hi"),
                                      ("phi_r", "phi_r", "phi_lo", "phi_hi")):  # fmt: skip
                hit = bool(ta.at[r, lo] <= tb.at[r, col] <= ta.at[r, hi])
                per_q.setdefault(f"{name}, r={r}", []).append(hit)
                if col == "worth_layers":
                    ok.append(hit)
        all_worth.append(all(ok))
    rates = {k: float(np.mean(v)) for k, v in per_q.items()}
    return {
        "splits": n_splits,
        "pooled_runs": k,  # each draw holds 1/k of every cell's pooled seeds
        "seeds_per_cell": {f"r={c[2]}, layers={c[3]:g}": int(len(g)) // k for c, g in runs.groupby(CELL)},
        "rate_per_quantity": rates,
        "rate_all_worth": float(np.mean(all_worth)),
        "calibrated_rate_per_quantity": 0.834,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders with runs.parquet (disjoint seeds)")
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument(
        "--runs-per-draw", type=int, default=1,
        help="each draw has the seeds of this many runs (2: the design with twice the seeds per cell)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    k = len(args.runs) // args.runs_per_draw
    if k < 2 or len(args.runs) % args.runs_per_draw:
        raise SystemExit(f"{len(args.runs)} runs cannot give two draws of {args.runs_per_draw} runs' seeds each")
    out = agreement(pooled_runs(args.runs), k, args.splits, args.seed)
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{out['splits']} random pairs of disjoint seed sets, each 1/{out['pooled_runs']} of the pooled seeds\n"
    )
    print("| quantity | second run inside the first's 95 % CI |")
    print("|---|---|")
    for k, v in out["rate_per_quantity"].items():
        print(f"| {k} | {v:.2f} |")
    print(f"| every looped model's worth at once | {out['rate_all_worth']:.2f} |")


if __name__ == "__main__":
    main()
