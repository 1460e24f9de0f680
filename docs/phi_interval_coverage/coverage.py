"""Does the 95 % interval loopscale reports for phi cover the true phi 95 % of the time?

Each replicate draws a synthetic grid from the joint law (paper Eq. 3) with known coefficients (the paper's
published joint fit, ``loopscale.fit.synthetic.PAPER_JOINT``: phi = 0.459) on the paper's 116-cell iso-depth design
(``loopscale.fit.synthetic.paper_design()``: Table 6's design, shipped as ``fit/paper_design_116.csv``) plus Gaussian
noise, and fits it exactly as loopscale does (``loopscale.fit.fit_table``):

* ``--protocol seeds`` (``loopscale run``'s fit of a grid of several D): ``--seeds`` runs per cell, every run a
  point, B bootstrap resamples of whole (budget, r) blocks (``fit_table`` fits seeds as cell means only where every
  run has one D);
* ``--protocol blocks`` (the paper's, ``loopscale fit --per-run``): one run per cell, every run a point, B
  resamples of whole (budget, r) blocks.

It writes ``coverage_<protocol>.json`` into ``--out`` (default: beside this file, where the committed results are;
give another folder for a scaled-down try) with every replicate's estimate and interval and the coverage with its
Clopper-Pearson 95 % interval, and prints the summary as one JSON line; ``--plot`` draws ``coverage.png`` from the
JSON files in ``--out``.

    .venv/bin/python docs/phi_interval_coverage/coverage.py --protocol seeds --replicates 40
    .venv/bin/python docs/phi_interval_coverage/coverage.py --protocol blocks --replicates 80
    .venv/bin/python docs/phi_interval_coverage/coverage.py --plot
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval for k successes of n."""
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def plot(where: Path = HERE) -> Path:
    """``where/coverage.png``: every replicate's phi and 95 % interval, sorted by phi, one panel per protocol whose
    ``coverage_<protocol>.json`` is in ``where``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(f.read_text()) for f in sorted(where.glob("coverage_*.json"))]
    if not runs:
        raise SystemExit(f"coverage.py: no coverage_*.json in {where} to plot")
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4.2), squeeze=False)
    for ax, res in zip(axes[0], runs, strict=True):
        rows = sorted(res["rows"], key=lambda r: r["phi"])
        for i, r in enumerate(rows):
            c = "tab:blue" if r["covered"] else "tab:red"
            ax.plot([i, i], [r["lo"], r["hi"]], color=c, lw=1.6)
            ax.plot(i, r["phi"], "o", color=c, ms=3)
        ax.axhline(res["true_phi"], color="k", ls="--", lw=1, label=f"true phi = {res['true_phi']}")
        lo, hi = res["coverage_ci95"]
        ax.set_title(f"{res['protocol']}: {res['covered']}/{res['replicates']} cover "
                     f"({res['coverage']:.0%}; 95 % CI {lo:.0%}-{hi:.0%})", fontsize=10)  # fmt: skip
        ax.set_xlabel("replicate (sorted by phi)")
        ax.set_ylabel("phi and its 95 % bootstrap interval")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out = where / "coverage.png"
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", choices=("seeds", "blocks"), default="seeds")
    ap.add_argument("--replicates", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3, help="runs per cell (protocol seeds)")
    ap.add_argument("--noise", type=float, default=0.010, help="SD of a run's loss about the law (nats/token)")
    ap.add_argument("--B", type=int, default=200, help="bootstrap resamples (loopscale run: 200)")
    ap.add_argument("--starts", type=int, default=100, help="starts per fit (loopscale run: 500)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", action="store_true", help="only draw coverage.png from the coverage_*.json in --out")
    ap.add_argument("--out", type=Path, default=HERE,
                    help="folder of the JSON results and the figure (default: beside this script, the committed ones)")
    a = ap.parse_args()
    if a.plot:
        print(plot(a.out))
        return

    from loopscale.cluster.connect import ray_session
    from loopscale.fit.synthetic import PAPER_DESIGN_CSV, PAPER_JOINT, joint_loss, paper_design
    from loopscale.fit.table_fit import fit_table

    design = paper_design()
    per_cell = a.seeds if a.protocol == "seeds" else 1
    runs = pd.concat([design.assign(seed=k) for k in range(per_cell)], ignore_index=True)
    mean = joint_loss(runs, PAPER_JOINT)  # nats/token
    truth = float(PAPER_JOINT["phi"])
    rng = np.random.default_rng(a.seed)
    rows, t0 = [], time.time()
    with ray_session(None, num_cpus=a.workers), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(a.replicates):
            sim = runs.assign(loss=mean + a.noise * rng.standard_normal(len(runs)), status="ok")
            tf = fit_table(sim, law="joint", per_run=a.protocol == "blocks", bootstrap=a.B, starts=a.starts,
                           seed=i, workers=a.workers)  # fmt: skip
            lo, hi = (float(x) for x in tf.boot.ci["phi"])
            phi = float(tf.fit.params["phi"])
            rows.append({"replicate": i, "phi": round(phi, 5), "lo": round(lo, 5), "hi": round(hi, 5),
                         "covered": bool(lo <= truth <= hi), "n_failed": int(tf.boot.n_failed)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    k, n = sum(r["covered"] for r in rows), len(rows)
    cov_lo, cov_hi = clopper_pearson(k, n)
    phis = np.array([r["phi"] for r in rows])
    out = {
        "protocol": a.protocol,
        "design": PAPER_DESIGN_CSV.name,
        "cells": int(len(design)),
        "runs_per_replicate": int(len(runs)),
        "noise_nats": a.noise,
        "true_phi": truth,
        "B": a.B,
        "starts": a.starts,
        "replicates": n,
        "covered": k,
        "coverage": round(k / n, 4),
        "coverage_ci95": [round(cov_lo, 4), round(cov_hi, 4)],
        "missed_below": sum(r["hi"] < truth for r in rows),  # the interval lies below the truth
        "missed_above": sum(r["lo"] > truth for r in rows),
        "phi_mean": round(float(phis.mean()), 4),
        "phi_sd": round(float(phis.std(ddof=1)), 4),
        "median_half_width": round(float(np.median([(r["hi"] - r["lo"]) / 2 for r in rows])), 4),
        "wall_s": round(time.time() - t0, 1),
        "rows": rows,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"coverage_{a.protocol}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))


if __name__ == "__main__":
    main()
