"""How well does the joint law describe a fixed-D run's cell means, with one phi and with one phi per r?

Usage (from the repository root)::

    python docs/example_cpu/law_check.py docs/example_cpu [docs/example_cpu/second_seeds ...]

For each run folder: the cell means (``loopscale.fit.io.cell_means`` over the seeds of each cell), R^2 of the
joint-law fit the report shows (``fit/analysis.json``: one phi, fitted to the cell means with the product's Huber
fitter), its residual per cell, and R^2 of the same law with phi free per r (``L = E_D + A (N_once + r^phi_r
N_rec)^-alpha``, one D so the D-term is part of ``E_D``; least squares on log loss with scipy, the r = 1 cells
fixing E_D, A and alpha). If the per-r form fits the means and the one-phi form does not, the misfit is the
one-phi assumption, the same failure the per-r consistency test reports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from loopscale.fit.io import cell_means
from loopscale.fit.laws import make_law

KEYS = ("d_model", "r", "layers_unique", "D")


def means(run: Path) -> pd.DataFrame:
    df = pd.read_parquet(run / "runs.parquet")
    df = df[df["status"] == "ok"].assign(loss=lambda x: x["final_val_loss"])
    df = df.assign(layers_unique=df["n_prelude"] + df["n_recur_block"] + df["n_coda"])
    return cell_means(df, KEYS)


def r2(y: np.ndarray, pred: np.ndarray) -> float:
    return float(1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))


def per_r_phi_fit(m: pd.DataFrame) -> tuple[float, dict[int, float]]:
    """R^2 of L = E_D + A (N_once + r^phi_r N_rec)^-alpha with one phi_r per r > 1 (least squares on log L)."""
    rs = sorted(int(r) for r in m["r"].unique() if r > 1)
    y = m["loss"].to_numpy()

    def pred(x: np.ndarray) -> np.ndarray:
        e, a, al = np.exp(x[0]), np.exp(x[1]), x[2]
        phi = np.zeros(len(m))
        for i, r in enumerate(rs):
            phi[m["r"].to_numpy() == r] = x[3 + i]
        n = m["N_once"].to_numpy() + m["r"].to_numpy() ** phi * m["N_rec"].to_numpy()
        return e + a * n ** (-al)

    best = None
    for al0 in (0.05, 0.2, 0.5):
        for e0 in (0.5, 1.5):
            x0 = np.array([np.log(e0), np.log(2.0), al0] + [0.0] * len(rs))
            f = least_squares(lambda x: np.log(pred(x)) - np.log(y), x0, bounds=(
                [-3, -3, 0.0] + [-3] * len(rs), [np.log(y.min()), 10, 2.5] + [3] * len(rs)))  # fmt: skip
            if best is None or f.cost < best.cost:
                best = f
    return r2(y, pred(best.x)), {r: float(best.x[3 + i]) for i, r in enumerate(rs)}


def check(run: Path) -> dict:
    m = means(run)
    v = json.loads((run / "fit" / "analysis.json").read_text(encoding="utf-8"))["variants"]["baseline"]
    j = v["joint"]
    cols = {c: m[c].to_numpy(dtype=float) for c in ("D", "N_once", "N_rec", "r")}
    pred = make_law("joint").predict(j["params"], cols)
    res = m["loss"].to_numpy() - pred
    r2_per_r, phis = per_r_phi_fit(m)
    return {
        "run": str(run),
        "cells": int(len(m)),
        "runs": int(m["n_seeds"].sum()),
        "r2_one_phi": float(j["r2"]),
        "r2_one_phi_recomputed": r2(m["loss"].to_numpy(), pred),
        "residual_by_cell": [
            {"r": int(a), "layers_unique": int(b), "residual": float(c)}
            for a, b, c in zip(m["r"], m["layers_unique"], res, strict=True)
        ],
        "r2_phi_per_r": r2_per_r,
        "phi_per_r": phis,
    }


if __name__ == "__main__":
    print(json.dumps([check(Path(a)) for a in sys.argv[1:]], indent=1))
