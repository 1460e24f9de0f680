"""Fit figures (matplotlib, Agg backend, imported lazily): data + fitted curves per r, residuals, phi histogram.

Also the axis helpers the other figures share: :func:`log_ticks` (few, readable ticks on a log axis) and
:func:`data_ylim` (a y-range set by the data, so that an extrapolated law curve cannot squash the points)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _tick_label(v: float) -> str:
    """``m×10^k`` in mathtext (``10^k`` when m = 1), the style of matplotlib's own log labels."""
    k = math.floor(math.log10(v) + 1e-9)
    m = round(v / 10.0**k, 6)
    if m == 1:
        return f"$10^{{{k}}}$"
    return f"${m:g}{{\\times}}10^{{{k}}}$"


def log_ticks(axis: Any, lo: float | None = None, hi: float | None = None, max_ticks: int = 5) -> list[float]:
    """Put at most ``max_ticks`` labelled major ticks on the log-scaled ``axis`` (``ax.xaxis`` or ``ax.yaxis``)
    over [lo, hi] (default: its current view limits) and unlabel the minor ticks, so that labels cannot overlap.

    The ticks are the first of these sets with 2 to ``max_ticks`` values in range: 1-2-5 per decade, 1-3 per
    decade, every decade, every 2nd, 3rd ... decade. A range narrower than a 1-2-5 step gets 1 ... 9 per decade,
    thinned to ``max_ticks``. Returns the tick values."""
    import matplotlib.ticker as mticker

    if lo is None or hi is None:
        vlo, vhi = sorted(axis.get_view_interval())
        lo, hi = (vlo if lo is None else lo), (vhi if hi is None else hi)
    lo, hi = sorted((float(lo), float(hi)))
    if not (lo > 0 and math.isfinite(hi)):
        return []
    k0, k1 = math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1
    eps = 1e-9 * (hi - lo)

    def within(subs: tuple[float, ...], step: int = 1) -> list[float]:
        vals = [m * 10.0**k for k in range(k0, k1 + 1) if k % step == 0 for m in subs]
        return [v for v in vals if lo - eps <= v <= hi + eps]

    ticks: list[float] = []
    for subs, step in [((1, 2, 5), 1), ((1, 3), 1)] + [((1,), s) for s in range(1, k1 - k0 + 2)]:
        t = within(subs, step)
        if 2 <= len(t) <= max_ticks:
            ticks = t
            break
        if len(t) < 2 and subs == (1, 2, 5):  # a narrow range: every integer mantissa, thinned
            t = within(tuple(range(1, 10)))
            ticks = t[:: max(1, math.ceil(len(t) / max_ticks))]
            break
    axis.set_major_locator(mticker.FixedLocator(ticks))
    axis.set_major_formatter(mticker.FixedFormatter([_tick_label(v) for v in ticks]))
    axis.set_minor_formatter(mticker.NullFormatter())
    return ticks


def data_ylim(
    ax: Any, y: Any, curves: Any = None, margin: float = 0.1, reach: float = 0.0
) -> tuple[float, float]:
    """Set ``ax``'s y-range from the data ``y`` (finite values), padded by ``margin`` × their span (at least 2 %
    of their size); fitted ``curves`` (values) widen it by at most ``reach`` × the span on either side, and are
    clipped by the axes beyond. Returns the limits."""
    v = np.asarray(y, float).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return ax.get_ylim()
    lo, hi = float(v.min()), float(v.max())
    span = max(hi - lo, 0.02 * max(abs(lo), abs(hi), 1e-12))
    if curves is not None and reach > 0:
        c = np.asarray(curves, float).ravel()
        c = c[np.isfinite(c)]
        if c.size:
            lo = max(min(lo, float(c.min())), lo - reach * span)
            hi = min(max(hi, float(c.max())), hi + reach * span)
            span = hi - lo
    lim = (lo - margin * span, hi + margin * span)
    ax.set_ylim(*lim)
    return lim


def _n_axis(frame: pd.DataFrame) -> np.ndarray:
    if "N" in frame.columns:
        return frame["N"].to_numpy(float)
    if "N_unique" in frame.columns:
        return frame["N_unique"].to_numpy(float)
    return (frame["N_once"] + frame["N_rec"]).to_numpy(float)


def _curve_groups(frame: pd.DataFrame) -> tuple[str | None, str]:
    """How :func:`fit_curves_figure` draws the law: ``("C", ...)`` along each FLOP budget's IsoFLOP curve (column
    ``C``, else the iso-FLOP ``budget`` column, which holds C in FLOPs), ``("D", ...)`` at each token budget when the
    table has neither but at most :data:`MAX_D_CURVES` distinct D per r, else ``(None, why)``: points only."""
    from loopscale.fit.derived import FLOP_BUDGETS_MAX, rounded_budgets

    rs = frame["r"] if "r" in frame.columns else pd.Series(1, index=frame.index)
    per_r = frame.groupby(rs)["C"].agg(lambda c: np.unique(rounded_budgets(c)).size) if "C" in frame.columns else None
    if per_r is not None and per_r.max() <= FLOP_BUDGETS_MAX:
        return "C", ""  # a few FLOP budgets: an iso-FLOP grid (a C per run, C = 6 N D of a table, is not one)
    if "budget" in frame.columns and pd.to_numeric(frame["budget"], errors="coerce").notna().all():
        return "budget", ""
    if frame.groupby(rs)["D"].nunique().max() <= MAX_D_CURVES:
        return "D", ""
    c = f"C takes more than {FLOP_BUDGETS_MAX} budgets per r" if per_r is not None else "no C column"
    budget = "a budget column not all numbers" if "budget" in frame.columns else "no budget column"
    return None, f"points only: {c}, {budget}, and more than {MAX_D_CURVES} distinct D per r"


MAX_D_CURVES = 8
"""Most token budgets per r that :func:`fit_curves_figure` draws as curves at fixed D (a table without C, or with a
C per run: more than :data:`loopscale.fit.derived.FLOP_BUDGETS_MAX` distinct C per r)."""


def fit_curves_figure(fit: Any, frame: pd.DataFrame) -> Any:
    """The figure of :func:`plot_fit_curves` (a matplotlib Figure; the caller saves and closes it).

    The y-range is the data's (padded), widened by the curves by at most half the data's span, so that a law
    extrapolated to the ends of the N range cannot squash the points; the N axis has at most 5 labelled ticks per
    panel (:func:`log_ticks`)."""
    from loopscale.fit.derived import flops_model_from_table

    plt = _plt()
    rs = np.unique(frame["r"]) if "r" in frame.columns else np.array([1])
    fig, axes = plt.subplots(1, len(rs), figsize=(4 * len(rs), 3.6), squeeze=False, sharey=True)
    N = _n_axis(frame)
    law = fit.law_object()
    by, why = _curve_groups(frame)
    F, frac = (None, {})
    if by in ("C", "budget"):  # F(N) per r from C / D; a budget column stands in for C
        F, frac = flops_model_from_table(frame if by == "C" else frame.assign(C=frame["budget"].astype(float)))
    elif by == "D":
        _, frac = flops_model_from_table(frame)
    curve_y: list[np.ndarray] = []
    for ax, r in zip(axes[0], rs, strict=True):
        m = frame["r"].to_numpy() == r if "r" in frame.columns else np.ones(len(frame), bool)
        groups = frame.loc[m, by].to_numpy(float) if by else np.zeros(int(m.sum()))
        if by == "C":  # one budget's runs, whose whole steps differ in the last digits, are one curve
            from loopscale.fit.derived import rounded_budgets

            groups = rounded_budgets(groups)
        for gi, g in enumerate(np.unique(groups)):
            gm = groups == g
            col = plt.cm.viridis(gi / max(len(np.unique(groups)) - 1, 1))
            ax.scatter(N[m][gm], frame.loc[m, "loss"].to_numpy(float)[gm], s=14, color=col)
            if by:
                ns = np.geomspace(N[m][gm].min() / 1.5, N[m][gm].max() * 1.5, 60)
                cols = {"D": np.full(ns.size, g) if by == "D" else g / F(ns, float(r)), "N": ns}
                if "r" in law.columns:  # the joint law, one phi or one per r
                    f = frac.get(float(r), 1.0)
                    cols.update({"N_once": f * ns, "N_rec": (1 - f) * ns, "r": np.full(ns.size, float(r))})
                pred = np.asarray(law.predict(fit.params, cols), float)
                curve_y.append(pred)
                ax.plot(ns, pred, color=col, lw=1, label=f"{'D' if by == 'D' else 'C'}={g:.2g}")
        ax.set_xscale("log")
        log_ticks(ax.xaxis)
        ax.set_title(f"r = {r:g}")
        ax.set_xlabel("unique non-embedding params N")
        if by:  # each panel its own: C differs between r on a token-budget grid or a ladder
            ax.legend(fontsize=6)
    data_ylim(axes[0][0], frame["loss"], np.concatenate(curve_y) if curve_y else None, reach=0.5)
    axes[0][0].set_ylabel("val loss (nats/token)")
    title = f"{fit.law} law fit, R² = {fit.r2:.4f}" + (f" ({why})" if why else "")
    fig.suptitle(textwrap.fill(title, width=45 * len(rs)))  # about 45 characters fit a 4-inch panel
    fig.tight_layout()
    return fig


def plot_fit_curves(fit: Any, frame: pd.DataFrame, path: str | Path) -> Path:
    """Loss (nats) vs unique params N, one panel per r; points = runs, lines = the fitted law along each budget's
    IsoFLOP curve (D = C/F(N) with F fitted from the runs' C / D; a ``budget`` column stands in for a missing ``C``);
    a table with neither: at each token budget D (at most :data:`MAX_D_CURVES` per r), else points only, said in
    the title. Writes a PNG (figure: :func:`fit_curves_figure`)."""
    plt = _plt()
    fig = fit_curves_figure(fit, frame)
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
    strata = (getattr(boot, "extra", None) or {}).get("stratify_by")  # seeds resampled within cells: not iid blocks
    ax.set_title(f"bootstrap φ (B = {boot.B}, " + ("seeds within cells)" if strata else
                                                   f"blocks: {boot.block_by or 'iid'})"))  # fmt: skip
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
