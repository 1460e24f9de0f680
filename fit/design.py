"""Design from measurements: predict, before training, how precisely a grid will measure phi and how long it runs.

A candidate design is a table of planned runs (one row per run: ``N_once``, ``N_rec``, ``r``, ``D`` tokens, ``C``
training FLOPs; seeds are separate rows). With a law taken as truth (usually the joint law fitted to a pilot or a
previous ``runs.parquet``) and the run-to-run noise measured between seeds, :func:`simulate_phi` draws the losses
the design would produce — ``L_i = L_law(run_i) * exp(sigma * eps_i)``, eps ~ N(0, 1) independently per run — and
refits the joint law (paper Eq. 3) with the product's own fitter (:func:`loopscale.fit.fitter.fit_law`) on each
draw. The spread of the refitted phi is the design's expected precision: its central 95 % range, halved, predicts
the half-width of the bootstrap interval a real run of the design would report. :func:`wall_time_s` turns the
design's FLOPs into minutes with a FLOP rate measured on the same machine (:func:`flop_rate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.fitter import fit_data
from loopscale.fit.io import prepare
from loopscale.fit.laws import PHI_BOUNDS, make_law

__all__ = ["DesignPrediction", "simulate_phi", "seed_noise", "flop_rate", "wall_time_s", "RUN_KEYS"]

RUN_KEYS = ("variant", "d_model", "r", "layers_unique", "N_once", "N_rec", "D")
"""Columns that, when present, identify a cell: runs that share them and differ only in ``seed`` are replicates."""


@dataclass(frozen=True)
class DesignPrediction:
    """What a design is expected to measure.

    Attributes:
        n_runs: runs in the design. n_sim: simulated replicates refitted (``n_ok`` finished).
        phi_half_width: half the central 95 % range of the refitted phi (predicted CI half-width).
        phi_sd: standard deviation of the refitted phi. phi_bias: mean refitted phi minus the truth.
        on_bound_frac: share of refits with phi on the search-box edge (a design that cannot identify phi has a
            large share). r_phi_half_width: the same half-width for r^phi, per r > 1.
    """

    n_runs: int
    n_sim: int
    n_ok: int
    phi_true: float
    phi_half_width: float
    phi_sd: float
    phi_bias: float
    on_bound_frac: float
    r_phi_half_width: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**self.__dict__, "r_phi_half_width": {str(k): v for k, v in self.r_phi_half_width.items()}}


def simulate_phi(
    design: pd.DataFrame,
    truth: dict[str, float],
    noise_rel: float,
    *,
    n_sim: int = 40,
    starts: int = 30,
    seed: int = 0,
    level: float = 0.95,
) -> DesignPrediction:
    """Simulate ``design`` under ``truth`` with relative noise ``noise_rel`` and refit phi ``n_sim`` times.

    Args:
        design: planned runs, columns ``N_once``, ``N_rec``, ``r``, ``D`` (one row per run, seeds as rows).
        truth: joint-law parameters ``E, A, alpha, B, beta, phi`` (loss in nats/token).
        noise_rel: standard deviation of log-loss between seeds (e.g. 0.01 for 1 %).
        n_sim: simulated replicates. starts: starts per refit. level: interval level of the prediction.
    Raises:
        ValueError: missing columns or parameters, noise_rel < 0, n_sim < 2.
    """
    need = {"N_once", "N_rec", "r", "D"}
    if need - set(design.columns):
        raise ValueError(f"design needs columns {sorted(need)}; missing {sorted(need - set(design.columns))}")
    missing = {"E", "A", "alpha", "B", "beta", "phi"} - set(truth)
    if missing:
        raise ValueError(f"truth needs the joint-law parameters; missing {sorted(missing)}")
    if not noise_rel >= 0:
        raise ValueError(f"noise_rel must be >= 0 (relative SD of the loss between seeds), got {noise_rel}")
    if n_sim < 2:
        raise ValueError(f"n_sim must be >= 2, got {n_sim}")
    cols = {c: design[c].to_numpy(dtype=float) for c in ("N_once", "N_rec", "r", "D")}
    mean = make_law("joint").predict(truth, cols)
    rng = np.random.default_rng(seed)
    rs = sorted(int(r) for r in np.unique(cols["r"]) if r > 1)
    phis, on_bound = [], 0
    base = pd.DataFrame({**cols, "status": "ok"})
    law = make_law("joint")
    warm = law.from_public(truth)  # the truth is one start; the others are the fitter's usual sub-fit/random ones
    for _ in range(n_sim):
        sim = base.assign(loss=mean * np.exp(noise_rel * rng.standard_normal(mean.shape)))
        try:
            f = fit_data(law, prepare(sim, law), starts=starts, seed=int(rng.integers(1 << 31)), grid=False,
                         warm=warm, n_polish=1)
        except (RuntimeError, ValueError):
            continue
        phis.append(f.params["phi"])
        on_bound += int("phi" in f.on_bound or not PHI_BOUNDS[0] < f.params["phi"] < PHI_BOUNDS[1])
    phis_a = np.asarray(phis)
    a = (1 - level) / 2

    def half(x: np.ndarray) -> float:
        return float((np.quantile(x, 1 - a) - np.quantile(x, a)) / 2) if x.size >= 2 else float("nan")

    return DesignPrediction(
        n_runs=len(design),
        n_sim=n_sim,
        n_ok=len(phis),
        phi_true=float(truth["phi"]),
        phi_half_width=half(phis_a),
        phi_sd=float(phis_a.std(ddof=1)) if phis_a.size >= 2 else float("nan"),
        phi_bias=float(phis_a.mean() - truth["phi"]) if phis_a.size else float("nan"),
        on_bound_frac=on_bound / max(1, len(phis)),
        r_phi_half_width={r: half(float(r) ** phis_a) for r in rs},
    )


def seed_noise(runs: pd.DataFrame) -> tuple[float, int]:
    """Pooled relative run-to-run noise: SD of log-loss between seeds of the same cell, and the cells used.

    Cells are the rows sharing every :data:`RUN_KEYS` column present; only cells with >= 2 ok runs count.
    Returns ``(sigma, n_cells)``; ``(nan, 0)`` when no cell has two seeds.
    """
    df = runs
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    loss_col = "loss" if "loss" in df.columns else "final_val_loss"
    keys = [k for k in RUN_KEYS if k in df.columns]
    ss, dof, cells = 0.0, 0, 0
    for _, g in df.groupby(keys, dropna=False):
        x = np.log(g[loss_col].to_numpy(dtype=float))
        x = x[np.isfinite(x)]
        if x.size >= 2:
            ss += float(((x - x.mean()) ** 2).sum())
            dof += x.size - 1
            cells += 1
    return (float(np.sqrt(ss / dof)) if dof else float("nan")), cells


def flop_rate(runs: pd.DataFrame) -> float:
    """Median training FLOP/s per run (``C / wall_s`` over ok runs): the machine's rate for one run slot.

    Raises:
        ValueError: no ok run with ``C`` and ``wall_s``.
    """
    df = runs
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    if not {"C", "wall_s"} <= set(df.columns) or df.empty:
        raise ValueError("flop_rate needs ok runs with columns C (FLOPs) and wall_s (seconds)")
    rate = (df["C"].astype(float) / df["wall_s"].astype(float)).replace([np.inf, -np.inf], np.nan).dropna()
    if rate.empty:
        raise ValueError("no run has a finite C / wall_s")
    return float(rate.median())


def wall_time_s(design: pd.DataFrame, rate: float, slots: int, overhead_s: float = 5.0) -> float:
    """Predicted wall time (s) of ``design``: its runs' FLOPs at ``rate`` FLOP/s per slot, ``slots`` runs at once.

    Longest-first packing onto ``slots`` (the grid's scheduler runs whatever is free), plus ``overhead_s`` per run.

    Raises:
        ValueError: missing ``C`` column, rate <= 0, slots < 1.
    """
    if "C" not in design.columns:
        raise ValueError("design needs a C column (training FLOPs per run)")
    if not rate > 0 or slots < 1:
        raise ValueError(f"rate must be > 0 and slots >= 1, got rate={rate}, slots={slots}")
    t = np.sort(design["C"].to_numpy(dtype=float) / rate + overhead_s)[::-1]
    load = np.zeros(int(slots))
    for x in t:
        load[np.argmin(load)] += x
    return float(load.max())
