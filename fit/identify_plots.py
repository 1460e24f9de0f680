"""Figures of the identification checks (matplotlib, Agg backend, imported lazily): the profile of the objective in
phi, phi and r^phi per r, and the unique-depth ladder with the looped models placed on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["plot_phi_profile", "phi_profile_figure", "profile_linthresh", "plot_per_r", "plot_ladder"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def profile_linthresh(n: int) -> float:
    """Linear range (%) of the profile figure's symlog axis: 1 %, or the power of ten below the one-run threshold
    2 / n when that is smaller, so the threshold line always lies on the logarithmic part."""
    return float(min(1.0, 10.0 ** np.floor(np.log10(100 * 2.0 / max(n, 1)))))


def phi_profile_figure(profile: pd.DataFrame, phi_hat: float, ci: tuple[float, float] | None, n: int) -> Any:
    """The figure of :func:`plot_phi_profile` (a matplotlib Figure; the caller saves and closes it)."""
    import matplotlib.ticker as mticker

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    # >= 0 by construction (objective / its minimum over the grid - 1); clip rounding below 0
    rise = 100 * np.clip(profile["rel_rise"].to_numpy(float), 0.0, None)
    ax.plot(profile["phi"], rise, "o-", color="C0", ms=3, label="profile")
    ax.axvline(phi_hat, color="C3", lw=1.5, label=f"phi = {phi_hat:.3f}")
    if ci is not None:
        ax.axvspan(ci[0], ci[1], color="C3", alpha=0.15, label="95 % bootstrap interval")
    thr = 100 * 2.0 / max(n, 1)
    ax.axhline(thr, color="0.4", ls=":", label="one run's worth (2/n)")
    lin = profile_linthresh(n)
    ax.set_yscale("symlog", linthresh=lin, linscale=0.5)
    top = max(float(np.nanmax(rise)) if rise.size else 0.0, thr)
    ax.set_ylim(0.0, top * 1.5 if top > 0 else 10 * lin)
    # ticks: 0, then powers of ten (1-2-5 over few decades) from the linear threshold up; no negative side
    # (the rise is never below 0)
    ks = range(int(round(np.log10(lin))), int(np.ceil(np.log10(max(top * 1.5, lin)))) + 1)
    subs = (1, 2, 5) if len(ks) <= 3 else (1,)  # 1-2-5 when there are few decades to label
    ticks = [m * 10.0**k for k in ks for m in subs if m * 10.0**k <= top * 1.5]
    ax.yaxis.set_major_locator(mticker.FixedLocator([0.0] + ticks))
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: "0" if v == 0 else f"{v:g}"))
    ax.yaxis.set_minor_locator(mticker.NullLocator())
    ax.set_xlabel("phi (held fixed; every other parameter refitted)")
    ax.set_ylabel(f"objective above its minimum (%)\nlog scale, linear below {lin:g} %", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_phi_profile(profile: pd.DataFrame, phi_hat: float, ci: tuple[float, float] | None, n: int,
                     path: str | Path) -> Path:
    """Objective (Huber sum, paper Eq. 4) relative to its minimum against fixed phi, with the point estimate, its
    interval and the flat-profile threshold 2 / n (``loopscale.fit.identify``). The y-axis starts at 0 and is
    logarithmic above a small linear range (:func:`profile_linthresh`, stated on the axis). Writes a PNG and
    returns its path."""
    plt = _plt()
    fig = phi_profile_figure(profile, phi_hat, ci, n)
    p = Path(path)
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def _intervals(ax, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, color: str) -> None:
    """Vertical interval bars with caps at ``x`` from ``lo`` to ``hi``, where both ends are finite
    (an interval need not contain its point estimate: a percentile bootstrap interval can lie beside it)."""
    ok = np.isfinite(lo) & np.isfinite(hi)
    if ok.any():
        mid, half = (lo[ok] + hi[ok]) / 2, (hi[ok] - lo[ok]) / 2
        ax.errorbar(x[ok], mid, yerr=half, fmt="none", ecolor=color, capsize=4)


def plot_per_r(per_r: pd.DataFrame, phi_hat: float, ci: tuple[float, float] | None, path: str | Path) -> Path:
    """phi fitted from each r against the r = 1 runs (points with intervals, where the row has one) next to the
    joint phi (band), and r^phi per r (right panel). Writes a PNG and returns its path."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    r = per_r["r"].to_numpy(int)
    y, lo, hi = (per_r[c].to_numpy(float) for c in ("phi", "lo", "hi"))
    a1.plot(r, y, "o", color="C0", label="phi_r (r = 1 runs + this r)")
    _intervals(a1, r.astype(float), lo, hi, "C0")
    a1.axhline(phi_hat, color="C3", lw=1.5, label=f"joint phi = {phi_hat:.3f}")
    if ci is not None:
        a1.axhspan(ci[0], ci[1], color="C3", alpha=0.15)
    a1.set_xscale("log", base=2)
    a1.set_xticks(r, [str(v) for v in r])
    a1.set_xlabel("r")
    a1.set_ylabel("phi")
    a1.legend(fontsize=8)
    rp = r.astype(float) ** y
    a2.plot(r, rp, "o", color="C0", label="r^phi_r")
    _intervals(a2, r.astype(float), r.astype(float) ** lo, r.astype(float) ** hi, "C0")
    rr = np.geomspace(1, max(r.max(), 2), 50)
    a2.plot(rr, rr**phi_hat, color="C3", label="r^phi (joint)")
    a2.plot(rr, rr, color="0.5", ls=":", label="r (worth r blocks)")
    a2.plot(rr, np.ones_like(rr), color="0.5", ls="--", label="1 (worth one block)")
    a2.set_xscale("log", base=2)
    a2.set_xticks(r, [str(v) for v in r])
    a2.set_xlabel("r")
    a2.set_ylabel("blocks a looped block is worth (r^phi)")
    a2.legend(fontsize=8)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def plot_ladder(runs: pd.DataFrame, worth: pd.DataFrame, path: str | Path) -> Path:
    """Loss against unique layers per (d_model, D) cell: the r = 1 ladder (mean over seeds, with its log-linear fit)
    and the looped models at their worth in layers (horizontal bars: 95 % interval). ``runs`` as
    :func:`loopscale.fit.ladder.ladder_table` takes, ``worth`` its output. Writes a PNG and returns its path."""
    from loopscale.fit.ladder import fit_ladder

    plt = _plt()
    cells = sorted({(int(d), float(D)) for d, D in zip(worth["d_model"], worth["D"], strict=True)})
    fig, axes = plt.subplots(1, max(1, len(cells)), figsize=(4.5 * max(1, len(cells)), 3.8), squeeze=False)
    for ax, (d, D) in zip(axes[0], cells, strict=False):
        cell = runs[(runs["d_model"] == d) & (runs["D"] == D)]
        lad = cell[cell["r"] == 1].groupby("layers_unique")["loss"].agg(["mean", "std"]).reset_index()
        ax.errorbar(lad["layers_unique"], lad["mean"], yerr=lad["std"].fillna(0), fmt="o", color="0.3",
                    capsize=3, label="r = 1 ladder")
        f = fit_ladder(lad["layers_unique"], lad["mean"])
        xs = np.geomspace(min(f.layers) * 0.8, max(f.layers) * 1.2, 50)
        ax.plot(xs, f.loss(xs), color="0.5", ls="--")
        w = worth[(worth["d_model"] == d) & (worth["D"] == D)]
        for i, row in enumerate(w.itertuples()):
            y = float(f.loss(row.worth_layers))
            ax.errorbar(row.worth_layers, y, xerr=[[row.worth_layers - row.worth_lo], [row.worth_hi - row.worth_layers]],
                        fmt="s", color=f"C{i}", capsize=3,
                        label=f"r={row.r} ({row.layers_unique:g} unique): {row.worth_layers:.2f} layers")
        ax.set_xscale("log")
        ax.set_xticks(list(f.layers), [f"{v:g}" for v in f.layers])
        ax.minorticks_off()
        ax.set_xlabel("unique layers")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title(f"d = {d}, D = {D:.3g} tokens", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p
