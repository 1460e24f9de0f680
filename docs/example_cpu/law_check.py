"""How well does the joint law describe a fixed-D run's cell means, with one phi and with one phi per r?

Usage (from the repository root)::

    python docs/example_cpu/law_check.py docs/example_cpu [docs/example_cpu/second_seeds ...]

For each run folder: the cell means (``loopscale.fit.io.cell_means`` over the seeds of each cell), R^2 of the
joint-law fit the report shows (``fit/analysis.json``: one phi, fitted to the cell means with the product's Huber
fitter), its residual per cell, and R^2 of the same law with phi free per r (``L = E_D + A (N_once + r^phi_r
N_rec)^-alpha``, one D so the D-term is part of ``E_D``; the product's ``joint_per_r`` law and fitter, which
``loopscale run`` reports next to the one-phi fit). If the per-r form fits the means and the one-phi form does not, the misfit is the
one-phi assumption, the same failure the per-r consistency test reports.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from loopscale.fit.fitter import fit_law
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
    """R^2 of L = E_D + A (N_once + r^phi_r N_rec)^-alpha with one phi_r per r > 1: the product's ``joint_per_r``
    law, fitted with the same Huber fitter as the one-phi law (the report shows the same numbers for new runs)."""
    f = fit_law(m, law="joint_per_r", starts=60)
    return float(f.r2), {int(k[4:]): float(v) for k, v in f.params.items() if k.startswith("phi_")}


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="run folders (each with runs.parquet and fit/analysis.json)")
    print(json.dumps([check(Path(a)) for a in ap.parse_args().folders], indent=1))
