"""What a looped model is worth in unique layers: place it on a ladder of plain (r = 1) models of the same width.

At fixed width d and token budget D, plain models with L = 2, 3, 4, 6, 10 unique layers ("the unique-depth
ladder") trace loss against depth. Locally the loss is linear in log L (equivalently in log N, since
N_unique = L (12 d^2 + 2 d) + 3 d for a plain model of the ``cpu`` / ``paper`` families; paper Sec. 3.1 accounting):

    loss(L) = a + b log L,   b < 0 when depth helps.

A looped model with loss l is then worth L* = exp((l - a) / b) unique layers, and its effective parameter count
N* = L* n_b + 3 d lets the joint law's exponent be read off per r (paper Eq. 3 with the D-term equal at fixed D):

    N_once + r^phi N_rec = N*   =>   phi_r = log((N* - N_once) / N_rec) / log r     (N* > N_once).

A single phi exists only if phi_r agrees across r; :func:`ladder_table` gives each r its own value so the
identification rule can test that.

Uncertainty: the ladder and the looped model are each averaged over their seeds; a percentile bootstrap that
resamples seeds within every run of the cell (the ladder rungs and the looped model independently) gives the
95 % interval of L* and phi_r. That interval is seed noise only: the line's shape is an assumption. Where the
rungs curve in log L (a power law in N, as the joint law's N-term at fixed D, is convex there), the line reads
a model between the rungs as worth more layers than the curve through them; with losses made from the joint law
(alpha 0.2-0.5, phi 0.5) at the ``cpu`` preset's shapes, by up to 0.37 layers and 0.06 in phi_r. Each row
therefore also gives the worth read off a power law through the rungs, ``loss = e + k N^-c``
(:func:`fit_power_ladder`, exact under the joint law), and the largest misfit of the line to a rung in
standard errors of that rung's seed mean; the two readings' difference is a systematic uncertainty the interval
does not include.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["LadderFit", "fit_ladder", "fit_power_ladder", "worth_in_layers", "phi_from_worth", "ladder_table"]


@dataclass(frozen=True)
class LadderFit:
    """Least-squares line ``loss = a + b log L`` through the ladder rungs (L unique layers, loss in nats/token).

    ``r2`` is the coefficient of determination over the rungs; ``layers`` the rung depths used.
    """

    a: float
    b: float
    r2: float
    layers: tuple[float, ...]

    def loss(self, layers: float | np.ndarray) -> float | np.ndarray:
        """Ladder loss (nats/token) at ``layers`` unique layers."""
        return self.a + self.b * np.log(layers)

    def layers_for(self, loss: float | np.ndarray) -> float | np.ndarray:
        """Unique layers L* whose ladder loss equals ``loss`` (inverse of :meth:`loss`)."""
        return np.exp((np.asarray(loss, dtype=np.float64) - self.a) / self.b)


def fit_ladder(layers, loss) -> LadderFit:
    """Fit ``loss = a + b log L`` to ladder rungs.

    Args:
        layers: unique layers per rung, shape (k,), k >= 2 distinct values, all > 0.
        loss: mean validation loss per rung (nats/token), shape (k,).
    Raises:
        ValueError: fewer than 2 distinct depths, non-positive depths, non-finite losses, or a ladder whose loss
            does not fall with depth (b >= 0: depth does not help, so no model can be placed on it).
    """
    x = np.log(np.asarray(layers, dtype=np.float64))
    y = np.asarray(loss, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"layers and loss must be 1-D of equal length, got {x.shape} and {y.shape}")
    if not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)):
        raise ValueError("ladder layers must be > 0 and losses finite")
    if len(np.unique(x)) < 2:
        raise ValueError(f"a ladder needs at least 2 distinct depths, got {sorted(set(np.exp(x).round(6)))}")
    b, a = np.polyfit(x, y, 1)
    if not b < 0:
        raise ValueError(
            f"the ladder's loss does not fall with depth (slope {b:.4g} nats per log-layer): at this width and "
            "budget deeper plain models are no better, so a looped model cannot be placed on the ladder; "
            "train longer (more tokens) or use a wider model"
        )
    resid = y - (a + b * x)
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss if ss > 0 else 1.0
    return LadderFit(a=float(a), b=float(b), r2=r2, layers=tuple(float(v) for v in np.exp(x)))


def fit_power_ladder(n_unique, loss) -> tuple[float, float, float] | None:
    """Fit ``loss = e + k N^-c`` (nats/token; N unique parameters) through ladder rungs: the joint law's N-term at
    fixed D (paper Eq. 3 with r = 1), so a plain model's loss between the rungs is read off the curve the law
    predicts rather than off a line in log L.

    Args:
        n_unique: unique parameters per rung, shape (k,), k >= 3 distinct values, all > 0.
        loss: mean validation loss per rung (nats/token), shape (k,).
    Returns:
        ``(e, k, c)`` with ``0 <= e < min(loss)``, ``k > 0``, ``0 < c <= 3``; None with fewer than 3 rungs, a loss that
        does not fall with N, or no converged fit.
    """
    import warnings

    from scipy.optimize import OptimizeWarning, curve_fit

    n = np.asarray(n_unique, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    if np.unique(n).size < 3 or not np.all(np.isfinite(y)) or not np.all(n > 0):
        return None
    n0 = float(np.exp(np.mean(np.log(n))))  # scale N: k is the loss above e at the rungs' geometric mean

    def f(x, e, k, c):
        return e + k * (x / n0) ** -c

    lo = float(y.min())
    best = None
    e0 = max(lo - 0.5 * float(y.max() - y.min()) - 0.05, 0.0)
    for c0 in (0.1, 0.3, 1.0):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)  # no covariance is used: only the point
                p, _ = curve_fit(f, n, y, p0=(e0, max(float(y.mean()) - e0, 1e-6), c0),
                                 bounds=([0.0, 1e-12, 1e-3], [lo, np.inf, 3.0]), maxfev=5000)  # fmt: skip
        except (RuntimeError, ValueError):  # this start did not converge: the others may
            continue
        sse = float(((f(n, *p) - y) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, p)
    if best is None:
        return None
    e, k, c = (float(v) for v in best[1])
    return e, k * n0**c, c


def _power_worth(fit: tuple[float, float, float] | None, loss: float, d: int) -> float:
    """Unique layers of the plain model whose loss on the power-law ladder ``fit`` is ``loss``; NaN when there is no
    fit or ``loss`` is at or below its floor e."""
    if fit is None or not loss > fit[0]:
        return float("nan")
    e, k, c = fit
    return _plain_layers((k / (loss - e)) ** (1.0 / c), d)


def worth_in_layers(ladder: LadderFit, loss: float) -> float:
    """Unique layers a model with validation loss ``loss`` (nats/token) is worth on ``ladder``."""
    return float(ladder.layers_for(loss))


def phi_from_worth(N_star: float, N_once: float, N_rec: float, r: int) -> float:
    """phi_r solving ``N_once + r^phi N_rec = N_star`` (paper Eq. 3 at equal D); NaN when N_star <= N_once or r = 1.

    Args:
        N_star: effective unique parameters the looped model is worth (from its worth in layers).
        N_once, N_rec: the looped model's once-used and recurrent parameters (paper Sec. 3.1).
        r: recurrences (>= 2 for a defined phi).
    """
    if r <= 1 or not N_star > N_once or not N_rec > 0:
        return float("nan")
    return float(np.log((N_star - N_once) / N_rec) / np.log(r))


def _quantiles(x: np.ndarray, alpha: float) -> tuple[float, float]:
    """The ``alpha`` and ``1 - alpha`` quantiles of ``x`` (finite values and -inf; NaN for an empty ``x``): a bound
    that falls among or next to the -inf values is -inf (``np.quantile`` would give NaN there)."""
    if not x.size:
        return float("nan"), float("nan")
    floor = np.finfo(np.float64).min
    q = np.quantile(np.where(np.isneginf(x), floor, x), [alpha, 1 - alpha])
    return tuple(float(-np.inf) if v <= floor / 2 else float(v) for v in q)


def _n_plain(layers: float, d: int) -> float:
    """Unique non-embedding parameters of a plain r = 1 model with ``layers`` layers of width d (paper Table 6
    convention: blocks 12 d^2 + 2 d each plus 3 d model-level norm weights)."""
    return layers * (12 * d * d + 2 * d) + 3 * d


def _plain_layers(n_unique: float, d: int) -> float:
    """Layers of the plain width-d model with ``n_unique`` unique parameters: the inverse of :func:`_n_plain`."""
    return float((n_unique - _n_plain(0, d)) / (_n_plain(1, d) - _n_plain(0, d)))


def ladder_table(
    runs: Any,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Worth in unique layers (and phi_r) of every looped model, per (d_model, D) cell, with bootstrap intervals.

    Args:
        runs: one row per finished run with columns ``d_model``, ``D`` (tokens), ``r``, ``layers_unique``
            (prelude + shared block + coda layers), ``N_once``, ``N_rec``, ``loss`` (nats/token) and ``seed``: a
            DataFrame, or anything :func:`loopscale.fit.io.read_table` reads (a ``runs.parquet`` path, a run
            folder). As in ``runs.parquet``, ``final_val_loss`` stands for ``loss`` when there is no ``loss``, and
            ``layers_unique`` is ``n_prelude + n_recur_block + n_coda`` when there is no ``layers_unique``.
            Rows with r = 1 form the ladder of their cell; rows with r > 1 are placed on it. A ``status`` column,
            if present, keeps only ``"ok"`` rows.
        n_boot: bootstrap draws (seeds resampled with replacement within every run of a cell).
        level: interval level.
        seed: RNG seed of the bootstrap.
    Returns:
        One row per (d_model, D, r > 1) with ``layers_unique``, ``worth_layers`` and its ``worth_lo`` /
        ``worth_hi``, ``worth_outside_ladder`` (the worth, its interval or its power-law reading reaches outside the
        ladder's depths: extrapolated), ``phi_r`` with ``phi_lo`` / ``phi_hi`` (-inf where the model, or a share of
        the draws beyond the interval's tail, is worth no more than its once-used parameters, N* <= N_once; the
        flags ``phi_r_minus_inf``, ``phi_lo_minus_inf``, ``phi_hi_minus_inf`` keep that through JSON, which has
        no -inf), ``phi_defined_frac`` (share of draws with a finite phi_r), ``worth_power`` (the worth read off
        :func:`fit_power_ladder` through the same rungs; NaN with fewer than 3 rungs), ``ladder_misfit_se`` (the
        line's largest miss of a rung mean, in its standard errors), ``n_seeds``, ``seed_sd`` (nats/token, the
        looped model's seed spread), ``ladder_r2`` and ``ladder_layers``.
    Raises:
        ValueError: a table :func:`~loopscale.fit.io.read_table` cannot read, missing columns (named, with what
            may stand for them), a null ``d_model``, ``D`` or ``layers_unique`` on an ok run (it belongs to no
            cell), a NaN, inf or non-positive loss on an ok run, a cell with looped runs but fewer than 2 ladder
            depths, ``n_boot`` not a whole number >= 1, ``level`` outside (0, 1), ``seed`` not a whole number >= 0.
    """
    from loopscale.fit.fitter import check_fit_args
    from loopscale.fit.io import no_null_cells, read_table, with_layers_unique

    check_fit_args(seed=seed, B=n_boot, level=level, B_name="n_boot")
    runs = with_layers_unique(read_table(runs))
    given = list(runs.columns)
    if "loss" not in runs.columns and "final_val_loss" in runs.columns:
        runs = runs.assign(loss=runs["final_val_loss"])
    need = {"d_model", "D", "r", "layers_unique", "N_once", "N_rec", "loss", "seed"}
    missing = sorted(need - set(runs.columns))
    if missing:
        alt = {"loss": "loss (or final_val_loss)", "layers_unique": "layers_unique (or n_prelude, n_recur_block "
               "and n_coda)"}  # fmt: skip
        raise ValueError(f"ladder_table needs columns {sorted(need)}; missing {', '.join(alt.get(c, c) for c in missing)}; "
                         f"table has {given}")  # fmt: skip
    df = runs
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    no_null_cells(df, ("d_model", "D", "layers_unique"), "ladder_table")
    loss = pd.to_numeric(df["loss"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(loss) | (loss <= 0)
    if bad.any():  # a run left out silently would shrink its cell's seed count and narrow its interval
        first = df.iloc[int(np.argmax(bad))]
        name = "loss" if "loss" in given else "final_val_loss"
        where = f"run_id {first['run_id']!r}" if "run_id" in df.columns else f"row {df.index[int(np.argmax(bad))]!r}"
        raise ValueError(
            f"column {name!r} has {int(bad.sum())} value(s) that are not a finite loss > 0 (nats/token) on runs "
            f"with status 'ok' (first at {where}: {first['loss']!r}); give those runs another status or drop them"
        )
    rng = np.random.default_rng(seed)
    alpha = (1 - level) / 2
    rows = []
    for (d, D), cell in df.groupby(["d_model", "D"], sort=True):
        plain = cell[cell["r"] == 1]
        looped = cell[cell["r"] > 1]
        if looped.empty:
            continue
        rungs = {L: g["loss"].to_numpy(float) for L, g in plain.groupby("layers_unique")}
        if len(rungs) < 2:
            raise ValueError(
                f"cell d_model={d}, D={D}: {len(rungs)} ladder depth(s) of r = 1; add at least 2 (e.g. ladder: [3, 6])"
            )
        depths = np.array(sorted(rungs), dtype=float)
        lad = fit_ladder(depths, [rungs[L].mean() for L in depths])
        power = fit_power_ladder([_n_plain(L, int(d)) for L in depths], [rungs[L].mean() for L in depths])
        # the line's largest miss of a rung, in standard errors of that rung's seed mean (NaN with one seed a rung)
        with np.errstate(invalid="ignore", divide="ignore"):
            misfit = max((abs(rungs[L].mean() - float(lad.loss(L))) / (rungs[L].std(ddof=1) / np.sqrt(rungs[L].size))
                          if rungs[L].size > 1 else float("nan")) for L in depths)  # fmt: skip
        # bootstrap: resample seeds within every rung once per draw (shared by all r of this cell)
        boot_lad = []
        for _ in range(n_boot):
            means = [rng.choice(rungs[L], size=len(rungs[L]), replace=True).mean() for L in depths]
            b, a = np.polyfit(np.log(depths), means, 1)
            boot_lad.append((a, b))
        boot_lad = np.asarray(boot_lad)
        for (r, L), g in looped.groupby(["r", "layers_unique"], sort=True):
            losses = g["loss"].to_numpy(float)
            n_once, n_rec = float(g["N_once"].iloc[0]), float(g["N_rec"].iloc[0])
            worth = worth_in_layers(lad, losses.mean())
            bm = np.array([rng.choice(losses, size=len(losses), replace=True).mean() for _ in range(n_boot)])
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                bw = np.where(boot_lad[:, 1] < 0, np.exp((bm - boot_lad[:, 0]) / boot_lad[:, 1]), np.nan)
            bphi = np.array([phi_from_worth(_n_plain(w, int(d)), n_once, n_rec, int(r)) for w in bw])
            ok_w = bw[np.isfinite(bw)]
            # a draw placed below its own once-used parameters (N* <= N_once) has phi_r = -inf, not no value: it
            # stays in the quantiles (dropped, the interval described only the draws above N_once)
            below = np.isfinite(bw) & ~np.isfinite(bphi)
            ok_p = np.concatenate([bphi[np.isfinite(bphi)], np.full(int(below.sum()), -np.inf)])
            p_lo, p_hi = _quantiles(ok_p, alpha)
            w_lo, w_hi = _quantiles(ok_w, alpha)
            w_pow = _power_worth(power, float(losses.mean()), int(d))
            point_phi = phi_from_worth(_n_plain(worth, int(d)), n_once, n_rec, int(r))
            rows.append(
                dict(
                    d_model=int(d),
                    D=float(D),
                    r=int(r),
                    layers_unique=float(L),
                    worth_layers=worth,
                    worth_lo=w_lo,
                    worth_hi=w_hi,
                    phi_r=point_phi,
                    phi_lo=p_lo,
                    phi_hi=p_hi,
                    phi_defined_frac=float(np.isfinite(bphi).sum() / n_boot),
                    phi_r_minus_inf=bool(not np.isfinite(point_phi) and np.isfinite(worth)),
                    phi_lo_minus_inf=bool(p_lo == -np.inf),
                    phi_hi_minus_inf=bool(p_hi == -np.inf),
                    worth_outside_ladder=bool(any(v < depths[0] or v > depths[-1] for v in (worth, w_lo, w_hi, w_pow)
                                                  if np.isfinite(v))),
                    n_seeds=int(len(losses)),
                    seed_sd=float(losses.std(ddof=1)) if len(losses) > 1 else float("nan"),
                    worth_power=w_pow,
                    ladder_misfit_se=float(misfit),
                    ladder_r2=lad.r2,
                    ladder_layers=",".join(f"{v:g}" for v in lad.layers),
                )
            )
    return pd.DataFrame(rows)
