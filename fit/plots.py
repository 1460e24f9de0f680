"""Fit figures (matplotlib, Agg backend, imported lazily): data + fitted curves per r, residuals, phi histogram."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _n_axis(frame: pd.DataFrame) -> np.ndarray:
    if "N" in frame.columns:
        return frame["N"].to_numpy(float)
    if "N_unique" in frame.columns:
        return frame["N_unique"].to_numpy(float)
    return (frame["N_once"] + frame["N_rec"]).to_numpy(float)


def plot_fit_curves(fit: Any, frame: pd.DataFrame, path: str | Path) -> Path:
    """Loss (nats) vs unique params N, one panel per r; points = runs, lines = the fitted law along each budget's
    IsoFLOP curve (D = C/F(N) with F fitted from the runs) or, without ``C``, at each run's D. Writes a PNG."""
    from loopscale.fit.derived import flops_model_from_table

    plt = _plt()
    rs = np.unique(frame["r"]) if "r" in frame.columns else np.array([1])
    fig, axes = plt.subplots(1, len(rs), figsize=(4 * len(rs), 3.6), squeeze=False, sharey=True)
    N = _n_axis(frame)
    law = fit.law_object()
    F, frac = flops_model_from_table(frame) if "C" in frame.columns else (None, {})
    for ax, r in zip(axes[0], rs, strict=True):
        m = frame["r"].to_numpy() == r if "r" in frame.columns else np.ones(len(frame), bool)
        groups = frame.loc[m, "C"].to_numpy(float) if "C" in frame.columns else np.zeros(int(m.sum()))
        for gi, C in enumerate(np.unique(groups)):
            gm = groups == C
            col = plt.cm.viridis(gi / max(len(np.unique(groups)) - 1, 1))
            ax.scatter(N[m][gm], frame.loc[m, "loss"].to_numpy(float)[gm], s=14, color=col)
            if F is not None:
                ns = np.geomspace(N[m][gm].min() / 1.5, N[m][gm].max() * 1.5, 60)
                cols = {"D": C / F(ns, float(r)), "N": ns}
                if law.name == "joint":
                    f = frac.get(float(r), 1.0)
                    cols.update({"N_once": f * ns, "N_rec": (1 - f) * ns, "r": np.full(ns.size, float(r))})
                ax.plot(ns, law.predict(fit.params, cols), color=col, lw=1, label=f"C={C:.2g}")
        ax.set_xscale("log")
        ax.set_title(f"r = {r:g}")
        ax.set_xlabel("unique non-embedding params N")
    axes[0][0].set_ylabel("val loss (nats/token)")
    if F is not None:
        axes[0][-1].legend(fontsize=6)
    fig.suptitle(f"{fit.law} law fit, R² = {fit.r2:.4f}")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_residuals(fit: Any, frame: pd.DataFrame, path: str | Path) -> Path:
    """Residual (actual − predicted, nats) vs predicted loss, coloured by r. Writes a PNG."""
    plt = _plt()
    pred = fit.predict(frame)
    res = frame["loss"].to_numpy(float) - pred
    fig, ax = plt.subplots(figsize=(5, 3.6))
    rs = frame["r"].to_numpy(float) if "r" in frame.columns else np.ones(len(frame))
    for r in np.unique(rs):
        m = rs == r
        ax.scatter(pred[m], res[m], s=12, label=f"r={r:g}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("predicted loss (nats/token)")
    ax.set_ylabel("residual (nats)")
    ax.set_title(f"RMSE {fit.rmse:.4f}, max |res| {fit.max_abs_residual:.4f}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_phi_bootstrap(boot: Any, path: str | Path, point_phi: float | None = None) -> Path:
    """Histogram of bootstrap phi draws with the percentile CI and the point estimate. Writes a PNG."""
    plt = _plt()
    draws = boot.draws
    phi = draws.loc[draws["ok"], "phi"].to_numpy(float) if "phi" in draws.columns else np.array([])
    fig, ax = plt.subplots(figsize=(5, 3.6))
    if phi.size:
        ax.hist(phi, bins=min(40, max(5, phi.size // 5)), color="0.6")
        lo, hi = boot.ci.get("phi", (np.nan, np.nan))
        ax.axvline(lo, color="C1", ls="--", label=f"{boot.level:.0%} CI [{lo:.3f}, {hi:.3f}]")
        ax.axvline(hi, color="C1", ls="--")
    if point_phi is not None:
        ax.axvline(point_phi, color="C0", label=f"point φ = {point_phi:.3f}")
    ax.set_xlabel("φ")
    ax.set_ylabel("resamples")
    ax.set_title(f"bootstrap φ (B = {boot.B}, blocks: {boot.block_by or 'iid'})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
