"""Synthetic tables with known truth, for recovery tests and benchmarks.

``paper_design`` reads the paper's 116-run iso-depth design (:data:`PAPER_DESIGN_CSV`, Table 6: 6 budgets x 29
(budget, width) cells x r in {1, 2, 4, 8}); ``synth_joint`` draws losses from the joint law (paper Eq. 3)
plus Gaussian noise in nats. The paper's published joint coefficients (project page "corrected fit") are
:data:`PAPER_JOINT`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

#: Joint-law coefficients of the paper (project page, "corrected fit"; phi 95% CI [0.41, 0.53], Table 2).
PAPER_JOINT = {"A": 28.027, "alpha": 0.19924, "B": 915.82, "beta": 0.36863, "E": 1.56773, "phi": 0.459}


PAPER_DESIGN_CSV = Path(__file__).resolve().parent / "paper_design_116.csv"
"""The paper's 116-run iso-depth design as published (Schwethelm, Rückert & Kaissis, arXiv 2604.21106, CC BY 4.0):
per (budget C, width scale s, r) Table 6's unique parameters (millions) and r = 1 training tokens (billions), with
``N_once = 48 d^2`` and ``N_rec = (192/r + 2) d^2`` from the paper's formulas (r = 1: 48 d^2 and 192 d^2; their sum
matches Table 6 within 0.15 M). The paper publishes no per-run losses (``val_loss_nats``: NOT_PUBLISHED); the grid
itself is in the authors' ``shells/scaling_laws/scaling_laws.sh`` (github.com/kschwethelm/looped-lm-scaling)."""


def paper_design(csv_path: str | Path | None = None) -> pd.DataFrame:
    """The paper's 116-run design as a fit table (no losses yet): ``csv_path`` in the layout of
    :data:`PAPER_DESIGN_CSV`, which is read when it is None.

    Columns: ``budget`` (= C, training FLOPs), ``C``, ``s``, ``d_model``, ``r``, ``N_once``, ``N_rec``, ``N_unique``
    (parameters, paper formulas), ``D`` (tokens; Table 6's r=1 column, used for every r).
    Raises:
        ValueError: the file does not exist.
    """
    p = Path(csv_path) if csv_path is not None else PAPER_DESIGN_CSV
    if not p.exists():
        raise ValueError(f"design file {str(p)!r} does not exist (give a CSV in the layout of {PAPER_DESIGN_CSV})")
    raw = pd.read_csv(p)
    out = pd.DataFrame(
        {
            "budget": raw["budget_flops"].astype(float),
            "C": raw["budget_flops"].astype(float),
            "s": raw["s"].astype(int),
            "d_model": raw["d_model"].astype(int),
            "r": raw["r"].astype(int),
            "N_once": raw["N_once_formula"].astype(float),
            "N_rec": raw["N_rec_formula"].astype(float),
            "D": raw["D_tokens_B_table6_r1"].astype(float) * 1e9,
        }
    )
    out["N_unique"] = out["N_once"] + out["N_rec"]
    return out


#: Paper grid (§2): widths s per budget C (training FLOPs); d_model = 64 s; r in {1, 2, 4, 8}.
PAPER_GRID = {
    4.64e17: (6, 8, 10, 12),
    1.00e18: (6, 8, 10, 12, 14),
    2.15e18: (8, 10, 12, 14, 16),
    4.64e18: (10, 12, 14, 16, 18, 20),
    1.00e19: (12, 16, 18, 20, 24),
    2.15e19: (18, 24, 28, 34),
}


def paper_design_from_formulas() -> pd.DataFrame:
    """The 116-run design rebuilt from the paper's formulas (no anchor file needed): ``N_once = 48 d^2``,
    ``N_rec = (192/r + 2) d^2`` (r > 1; r = 1: 192 d^2), ``D = C / F`` with ``F = 6 (N_once + r N_rec) + 12 d T l_eff``
    (T = 2048, l_eff = 20; attention FLOPs, paper §2), unembedding omitted. Same columns as :func:`paper_design`."""
    rows = []
    for C, widths in PAPER_GRID.items():
        for s in widths:
            d = 64 * s
            for r in (1, 2, 4, 8):
                n_once = 48.0 * d * d
                n_rec = 192.0 * d * d if r == 1 else (192.0 / r + 2.0) * d * d
                F = 6.0 * (n_once + r * n_rec) + 12.0 * d * 2048 * 20
                rows.append(
                    {
                        "budget": C,
                        "C": C,
                        "s": s,
                        "d_model": d,
                        "r": r,
                        "N_once": n_once,
                        "N_rec": n_rec,
                        "D": C / F,
                    }
                )
    out = pd.DataFrame(rows)
    out["N_unique"] = out["N_once"] + out["N_rec"]
    return out


def joint_loss(design: pd.DataFrame, params: dict[str, float]) -> np.ndarray:
    """Noise-free joint-law loss (nats/token), shape ``(n,)``: ``E + A (N_once + r^phi N_rec)^-alpha + B D^-beta``."""
    neff = design["N_once"].to_numpy(float) + design["r"].to_numpy(float) ** params["phi"] * design[
        "N_rec"
    ].to_numpy(float)
    return (
        params["E"]
        + params["A"] * neff ** -params["alpha"]
        + params["B"] * design["D"].to_numpy(float) ** -params["beta"]
    )


def synth_joint(
    design: pd.DataFrame, params: dict[str, float] | None = None, noise: float = 0.010, seed: int = 0
) -> pd.DataFrame:
    """Copy of ``design`` with a ``loss`` column from the joint law plus N(0, ``noise``^2) nats noise (seeded)."""
    params = PAPER_JOINT if params is None else params
    out = design.copy()
    rng = np.random.default_rng(seed)
    out["loss"] = joint_loss(design, params) + noise * rng.standard_normal(len(design))
    return out
