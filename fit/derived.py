"""Quantities derived from a fitted law: equivalence, compute-optimal frontier, IsoFLOP parabolas (approximate).

- :func:`equivalence`: ``N_eff = N_once + r^phi N_rec`` (paper Eq. 3) and its ratio to a reference unique-parameter count
  (paper App. F.4: ``(4 + 4^0.46 * 4)/20 ~ 0.58``).
- :func:`compute_optimal_frontier`: for each ``r`` and budget ``C`` (training FLOPs), minimise the fitted ``L(N, D=C/F(N))``
  over ``N`` (paper §4.4: per-architecture frontier), ``F`` = training FLOPs per token.
- :func:`isoflop_parabolas`: Chinchilla Approach 2, a parabola in ``log N`` per (budget, r) cell. Its vertex is biased
  even on noise-free data (Open-Athena/scaling-law-analysis; measured here: +5.8 % at +/-16x, +1.4 % at +/-4x,
  ``test_isoflop_parabola_bias_is_labelled_and_law_frontier_is_exact``),
  so every row is labelled ``approximate`` and it is never substituted for the law's frontier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

APPROX_LABEL = (
    "approximate: parabola in log N per cell (Chinchilla Approach 2); biased, not the law's frontier"
)


def equivalence(
    N_once: Any, N_rec: Any, r: Any, phi: float, N_reference: Any | None = None
) -> dict[str, Any]:
    """Effective parameters of a looped configuration (paper Eq. 3, App. F.4).

    Args:
        N_once: parameters applied once (prelude + coda), scalar or array.
        N_rec: parameters of the recurrent block (+ injection), same shape.
        r: recurrences (>= 1). phi: recurrence-equivalence exponent.
        N_reference: optional unique-parameter count to compare with (e.g. the r = 1 model at the same width).
    Returns:
        dict with ``N_eff`` (= the unique-parameter count of the non-looped model it performs like), ``N_unique``
        (= N_once + N_rec), ``r_phi``, ``ratio_to_unique`` (N_eff / N_unique) and, when given, ``ratio_to_reference``.
    Raises:
        ValueError: a value that is not numeric (a string, a bool) or not finite (NaN, inf), negative parameter
            counts or N_once + N_rec = 0, ``N_reference <= 0``, ``r < 1``, a ``phi`` that is not one number, or arrays whose shapes do not
            broadcast together.
    """
    arrays = {}
    for name, v in (("N_once", N_once), ("N_rec", N_rec), ("r", r), ("phi", phi), ("N_reference", N_reference)):
        if v is None:
            continue
        raw = np.asarray(v)
        if raw.dtype.kind not in "iuf":  # '4' and True were read as 4 and 1
            raise ValueError(f"{name}={v!r} must be a number or an array of numbers")
        arrays[name] = raw.astype(np.float64)
        if not np.all(np.isfinite(arrays[name])):
            raise ValueError(f"{name}={v!r} must be finite (no NaN or inf)")
    try:  # arrays of other lengths: named, not numpy's "operands could not be broadcast"
        np.broadcast_shapes(*(a.shape for k, a in arrays.items() if k != "phi"))
    except ValueError:
        raise ValueError("N_once, N_rec, r and N_reference must be numbers or arrays of one shape; got shapes "
                         + ", ".join(f"{k} {a.shape}" for k, a in arrays.items() if k != "phi")) from None
    n_once, n_rec, rr = arrays["N_once"], arrays["N_rec"], arrays["r"]
    if np.any(n_once < 0) or np.any(n_rec < 0):
        raise ValueError("N_once and N_rec must be >= 0 (parameters)")
    if np.any(n_once + n_rec <= 0):  # ratio_to_unique would be 0/0
        raise ValueError("N_once + N_rec must be > 0 (a model has parameters)")
    if np.any(rr < 1):
        raise ValueError("r must be >= 1 (recurrences), e.g. r=4")
    if "N_reference" in arrays and np.any(arrays["N_reference"] <= 0):
        raise ValueError(f"N_reference={N_reference!r} must be > 0 (parameters)")
    if arrays["phi"].ndim:
        raise ValueError(f"phi={phi!r} must be one number, e.g. phi=0.459")
    phi = float(arrays["phi"])
    r_phi = rr**phi
    neff = n_once + r_phi * n_rec
    out: dict[str, Any] = {
        "N_eff": _scalar(neff),
        "N_unique": _scalar(n_once + n_rec),
        "r_phi": _scalar(r_phi),
        "ratio_to_unique": _scalar(neff / (n_once + n_rec)),
    }
    if N_reference is not None:
        out["ratio_to_reference"] = _scalar(neff / arrays["N_reference"])
    return out


def _scalar(x: np.ndarray) -> Any:
    return float(x) if np.ndim(x) == 0 else x


def iso_depth_once_fraction(r: float) -> float:
    """``N_once / N_unique`` for the paper's iso-depth design (§1: N(r) = (48 + 192/r + 2) d^2 for r > 1), 1.0 at r = 1
    (for r = 1 the split does not matter since r^phi = 1)."""
    if r <= 1:
        return 1.0
    return 48.0 / (48.0 + 192.0 / r + 2.0)


def flops_model_from_table(
    table: pd.DataFrame,
) -> tuple[Callable[[np.ndarray, float], np.ndarray], dict[float, float]]:
    """Per-r models of training FLOPs per token ``F(N)`` and the once-fraction ``N_once/N_unique`` from a run table.

    ``F = C / D`` per row (needs columns ``C`` and ``D``; otherwise ``F = 6 N``, the Kaplan/Chinchilla rule); ``log F`` is
    fitted linearly in ``log N`` per ``r`` (>= 2 distinct N); with one N at an r, ``F = (F_0 / N_0) N``, its measured
    FLOPs per parameter (``6 N`` would leave out the r passes of a looped block: a quarter to a twentieth of the
    FLOPs of the cpu preset's looped models); with no ``C``, ``6 N``. ``N`` is ``N`` or ``N_unique`` or
    ``N_once + N_rec``. Returns ``(F(N, r), {r: once_fraction})``.
    """
    df = table
    if "N" in df.columns:
        n = df["N"].to_numpy(float)
    elif "N_unique" in df.columns:
        n = df["N_unique"].to_numpy(float)
    else:
        n = (df["N_once"] + df["N_rec"]).to_numpy(float)
    rv = df["r"].to_numpy(float) if "r" in df.columns else np.ones(len(df))
    coefs: dict[float, tuple[float, float]] = {}
    frac: dict[float, float] = {}
    for r in np.unique(rv):
        m = rv == r
        if "N_once" in df.columns:
            frac[float(r)] = float(np.median(df["N_once"].to_numpy(float)[m] / n[m])) if r > 1 else 1.0
        else:
            frac[float(r)] = iso_depth_once_fraction(r)
        if "C" in df.columns and "D" in df.columns:
            F = df["C"].to_numpy(float)[m] / df["D"].to_numpy(float)[m]
            if np.unique(n[m]).size >= 2:
                coefs[float(r)] = tuple(np.polyfit(np.log(n[m]), np.log(F), 1))
            else:  # one model size: F proportional to N through its measured FLOPs per token
                coefs[float(r)] = (1.0, float(np.log(np.median(F / n[m]))))

    def F(N: np.ndarray, r: float) -> np.ndarray:
        c = coefs.get(float(r))
        N = np.asarray(N, dtype=np.float64)
        return 6.0 * N if c is None else np.exp(c[0] * np.log(N) + c[1])

    return F, frac


FLOP_BUDGETS_MAX = 8
"""Most distinct FLOP budgets per table that count as an iso-FLOP design (:func:`frontier_budgets`; the fit curves
draw that many IsoFLOP curves per r); more distinct C is a C per run (e.g. C = 6 N D of an outside table)."""


def rounded_budgets(C) -> np.ndarray:
    """``C`` (FLOPs) to 3 significant digits: the runs of one iso-FLOP budget train whole steps, so their C differ
    in the last digits (float array, same order)."""
    return np.array([float(f"{x:.3g}") for x in np.asarray(C, dtype=float).ravel()])


def spanning_budgets(C, n: int = 4) -> np.ndarray:
    """``n`` log-spaced compute budgets (FLOPs) from the smallest to the largest finite C of ``C``: where the frontier
    is taken for a token-budget grid or a table with a C per run."""
    c = np.asarray(C, dtype=float)
    c = c[np.isfinite(c)]
    return np.geomspace(c.min(), c.max(), n)


def frontier_budgets(C) -> np.ndarray:
    """The compute budgets (FLOPs) at which a table's frontier is taken: its distinct budgets (:func:`rounded_budgets`)
    when there are at most :data:`FLOP_BUDGETS_MAX` (an iso-FLOP design), else :func:`spanning_budgets`."""
    budgets = np.unique(rounded_budgets(C))
    return budgets if budgets.size <= FLOP_BUDGETS_MAX else spanning_budgets(C)


SEARCH_LOG_N = (float(np.log(1e3)), float(np.log(1e15)))
"""The range of log N (unique parameters) the compute-optimal frontier is searched over."""


def frontier_arrays(
    params: dict[str, float],
    budgets: np.ndarray,
    r: float,
    flops: Callable[[np.ndarray, float], np.ndarray],
    once_fraction: float = 1.0,
    log_n_range: tuple[float, float] = SEARCH_LOG_N,
    n_grid: int = 2001,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimise ``L(N) = E + A (g N)^-alpha + B (C/F(N))^-beta`` over ``log N`` for each budget ``C``; ``g = f_once +
    r^phi (1 - f_once)`` (``g = 1`` for the Chinchilla law). Dense grid, then a bounded Brent refinement in the
    bracketing grid cell. Returns ``(N_star, D_star, L_star)``, each of shape ``(len(budgets),)``."""
    from scipy.optimize import minimize_scalar

    phi = params.get("phi", 0.0)
    g = once_fraction + r**phi * (1.0 - once_fraction)
    budgets = np.atleast_1d(np.asarray(budgets, dtype=np.float64))
    xs = np.linspace(*log_n_range, n_grid)

    def loss(x, C):
        N = np.exp(x)
        D = C / flops(N, r)
        return params["E"] + params["A"] * (g * N) ** -params["alpha"] + params["B"] * D ** -params["beta"]

    ns, ds, ls = [], [], []
    for C in budgets:
        vals = loss(xs, C)
        i = int(np.argmin(vals))
        lo_x, hi_x = xs[max(i - 1, 0)], xs[min(i + 1, n_grid - 1)]
        res = minimize_scalar(
            lambda x, C=C: float(loss(np.array([x]), C)[0]),
            bounds=(lo_x, hi_x),
            method="bounded",
            options={"xatol": 1e-10},
        )
        x = res.x if res.fun <= vals[i] else xs[i]
        N = float(np.exp(x))
        ns.append(N)
        ds.append(float(C / flops(np.array([N]), r)[0]))
        ls.append(float(loss(np.array([x]), C)[0]))
    return np.asarray(ns), np.asarray(ds), np.asarray(ls)


def compute_optimal_frontier(
    fit: Any,
    flops: Any,
    budgets: Any,
    r_values: Any | None = None,
    once_fraction: dict[float, float] | None = None,
) -> pd.DataFrame:
    """Compute-optimal ``N*``, ``D*``, ``L*`` per ``r`` and budget from a fitted law (paper §4.4, Fig. 3).

    Args:
        fit: a :class:`~loopscale.fit.fitter.FitResult` (or :func:`~loopscale.fit.table_fit.fit_table`'s TableFit:
            its point fit) or a public params dict (``E, A, alpha, B, beta[, phi]``).
            Without ``phi`` (a Chinchilla law, e.g. the per-r fit of one r's runs) the law's N is the unique
            parameter count at every r, so ``N_eff_star`` = ``N_star``: evaluate such a law at the r it was fitted
            to (at another r it says that looping adds no effective parameters, as phi = 0 would).
        flops: training FLOPs per token, either a callable ``F(N, r) -> FLOPs/token`` or a run table (DataFrame with
            ``C``, ``D`` and ``N``/``N_unique``/``N_once``+``N_rec``, optional ``r``) from which ``F = C/D`` is fitted
            per r (see :func:`flops_model_from_table`).
        budgets: training-FLOP budgets ``C``, scalar or sequence.
        r_values: recurrences to evaluate, whole numbers >= 1 (default: those in the table, or ``[1]``); with a
            table that has ``C``, only r the table holds (its FLOPs per token are fitted from its runs).
        once_fraction: ``{r: N_once/N_unique}``; default from the table, else the paper's iso-depth design.
    Returns:
        DataFrame with columns ``r``, ``C``, ``N_star`` (unique parameters), ``N_eff_star``, ``D_star`` (tokens),
        ``L_star`` (nats/token), ``method`` = ``"law"``, ``at_search_edge`` (N* on an end of the search range
        1e3 .. 1e15 parameters: the law has no optimum inside it at that budget, and N* is the range's end, not
        a result).
    Warns:
        UserWarning: ``fit`` is a FitResult whose runs have only one or two token budgets D
            (:func:`loopscale.fit.analysis.frontier_unidentified`): B and beta are not identified, and the frontier
            follows the fitter's split of the D-term (the report says "Not computed" there). A params dict is
            taken as given.
    Raises:
        ValueError: non-positive budgets; a params dict without ``E, A, alpha, B, beta``; an r that is not a whole
            number >= 1; with a table that has ``C``, an r it holds no runs of (``6 N`` FLOPs per token would
            leave out the r passes of a looped block, and the frontier then called more looping cheaper). A table
            without ``C`` takes ``F = 6 N`` at every r (:func:`flops_model_from_table`).
    """
    from loopscale.fit.table_fit import TableFit

    if isinstance(fit, TableFit):  # fit_table's result: its point fit
        fit = fit.fit
    params = fit.params if hasattr(fit, "params") else dict(fit)
    if missing := [k for k in ("E", "A", "alpha", "B", "beta") if k not in params]:
        raise ValueError(f"fit is missing {missing}: give a FitResult or a dict of E, A, alpha, B, beta (and phi "
                         f"for the joint law); got keys {sorted(params)}")  # fmt: skip
    budgets = np.atleast_1d(np.asarray(budgets, dtype=np.float64))
    if np.any(~np.isfinite(budgets)) or np.any(budgets <= 0):
        raise ValueError("budgets must be finite and > 0 (training FLOPs), e.g. [1e18, 1e19]")
    if isinstance(getattr(fit, "data", None), pd.DataFrame):
        from loopscale.fit.analysis import frontier_unidentified

        if why := frontier_unidentified(fit.data):  # the report says "Not computed" of such a fit
            import warnings

            warnings.warn(f"compute_optimal_frontier: the fit's runs have {why}; N*, D* and L* follow the "
                          "fitter's arbitrary split of the D-term", UserWarning, stacklevel=2)
    asked = None if r_values is None else [float(v) for v in np.atleast_1d(r_values)]
    if asked is not None and any(not (np.isfinite(v) and v >= 1 and v == round(v)) for v in asked):
        raise ValueError(f"r_values={r_values!r} must be whole numbers >= 1 (recurrences), e.g. [1, 2, 4, 8]")
    if callable(flops):
        F = flops
        frac = dict(once_fraction or {})
        rs = [1.0] if asked is None else asked
    else:
        F, frac_t = flops_model_from_table(flops)
        frac = {**frac_t, **(once_fraction or {})}
        rs = sorted(frac_t) if asked is None else asked
        if "C" in flops.columns and (absent := [v for v in rs if v not in frac_t]):
            raise ValueError(
                f"r_values {[int(v) for v in absent]} have no runs in the table (its r: {[int(v) for v in sorted(frac_t)]}"
                "): their FLOPs per token cannot be fitted from it, and 6 N would leave out the r passes of the looped "
                "block; give r_values among the table's r, or flops as a callable F(N, r) (FLOPs per token)"
            )
    rows = []
    for r in rs:
        f = frac.get(r, iso_depth_once_fraction(r)) if "phi" in params else 1.0
        N, D, L = frontier_arrays(params, budgets, r, F, f)
        g = f + r ** params.get("phi", 0.0) * (1 - f)
        for C, n, d, loss in zip(budgets, N, D, L, strict=True):
            edge = any(abs(np.log(n) - b) < 1e-6 for b in SEARCH_LOG_N)
            rows.append(
                {
                    "r": r,
                    "C": float(C),
                    "N_star": n,
                    "N_eff_star": n * g,
                    "D_star": d,
                    "L_star": loss,
                    "method": "law",
                    "at_search_edge": bool(edge),
                }
            )
    return pd.DataFrame(rows)


def isoflop_parabolas(
    table: Any, by: tuple[str, ...] | None = None, loss_col: str | None = None
) -> pd.DataFrame:
    """IsoFLOP analysis (Chinchilla Approach 2): per cell, fit ``L = c0 + c1 x + c2 x^2`` with ``x = log N``.

    Args:
        table: DataFrame (or anything :func:`loopscale.fit.io.read_table` reads) with a loss column (``loss`` or
            ``final_val_loss``), ``N``/``N_unique``/``N_once``+``N_rec``, and the cell columns.
        by: cell columns; default ``("budget", "r")`` / ``("C", "r")`` (``r`` only if present).
        loss_col: loss column name (default ``loss``, else ``final_val_loss``).
    Returns:
        DataFrame, one row per cell: the cell keys, ``n_points`` (runs), ``n_sizes`` (distinct N), ``N_min`` /
        ``N_max`` (the sizes trained, unique params), ``N_vertex`` (unique params), ``L_vertex`` (nats/token),
        ``curvature`` (c2), ``approximate`` = True, ``method`` = :data:`APPROX_LABEL` and ``note``: None where the
        vertex is given, else why it is not (``N_vertex`` and ``L_vertex`` NaN): fewer than 3 sizes, no minimum
        (c2 <= 0), or a minimum outside ``[N_min, N_max]`` -- the loss falls (or rises) across every size trained,
        and the parabola's vertex there is an extrapolation (measured: 5.6 parameters for sizes of 1.3e4-2.8e5,
        with a loss below every run's). The vertex is biased even inside the range (see module docstring): use
        :func:`compute_optimal_frontier` for N*. No rows (the same columns) for a token-budget grid, whose
        ``budget`` is null (rows with a null cell key are left out): there give ``by=("D", "r")``.
    Raises:
        ValueError: missing columns; an ok row whose loss or N is not a positive finite number (NaN, 0, negative,
            text).
    """
    from loopscale.fit.io import breaking, read_table

    df = read_table(table)
    loss_col = loss_col or ("loss" if "loss" in df.columns else "final_val_loss")
    if loss_col not in df.columns:
        raise ValueError(f"no loss column ('loss' or 'final_val_loss'); table has {list(df.columns)}")
    if by is None:
        bcol = "budget" if "budget" in df.columns else "C"
        by = (bcol, "r") if "r" in df.columns else (bcol,)
    miss = [c for c in by if c not in df.columns]
    if miss:
        raise ValueError(f"isoflop cell column(s) {miss} do not exist; table has {list(df.columns)}")
    if "status" in df.columns:
        df = df[df["status"].astype("string").fillna("") == "ok"]
    if "N" in df.columns:
        N = df["N"].to_numpy(float)
    elif "N_unique" in df.columns:
        N = df["N_unique"].to_numpy(float)
    elif "N_once" in df.columns:
        N = (df["N_once"] + df["N_rec"]).to_numpy(float)
    else:
        raise ValueError(f"need N, N_unique or N_once+N_rec; table has {list(df.columns)}")
    loss = pd.to_numeric(df[loss_col], errors="coerce").to_numpy(float)
    # one bad value made its cell's parabola read as a design problem ("the loss rises across every size")
    for what, rule, vals, raw in ((loss_col, "loss", loss, df[loss_col].to_numpy()), ("N", "N", N, N)):
        if (bad := breaking(rule, vals)).any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{int(bad.sum())} ok row(s) have a {what} that is not a positive finite number (first: "
                             f"{raw[i]!r}, at row {i} of the ok rows); fix or drop them")  # fmt: skip
    df = df.assign(_N=N, _x=np.log(N), _L=loss)
    rows = []
    for key, cell in df.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        x = cell["_x"].to_numpy()
        n_sizes, n_lo, n_hi = int(np.unique(x).size), float(cell["_N"].min()), float(cell["_N"].max())
        nv = lv = c2 = float("nan")
        if n_sizes < 3:
            note = f"{n_sizes} size{'s' * (n_sizes != 1)}: a parabola in log N needs 3"
        else:
            c2, c1, c0 = (float(c) for c in np.polyfit(x, cell["_L"].to_numpy(), 2))
            if c2 <= 0:
                note = "no minimum: the losses do not curve upward in log N (curvature <= 0)"
            else:
                xv = -c1 / (2 * c2)
                nv, lv, note = float(np.exp(xv)), float(c0 + c1 * xv + c2 * xv * xv), None
                if not x.min() <= xv <= x.max():  # an extrapolation, however far: withheld, said with its value
                    falls = "falls" if xv > x.max() else "rises"
                    note = (f"the loss {falls} across every size trained ({n_lo:.3g} to {n_hi:.3g}): the "
                            f"parabola's minimum, N = {nv:.3g}, lies outside them; train "
                            f"{'larger' if xv > x.max() else 'smaller'} sizes at this budget")  # fmt: skip
                    nv = lv = float("nan")
        row = dict(zip(by, key, strict=True))
        row.update(
            {
                "n_points": len(cell),
                "n_sizes": n_sizes,
                "N_min": n_lo,
                "N_max": n_hi,
                "N_vertex": nv,
                "L_vertex": lv,
                "curvature": c2,
                "approximate": True,
                "method": APPROX_LABEL,
                "note": note,
            }
        )
        rows.append(row)
    cols = [*by, "n_points", "n_sizes", "N_min", "N_max", "N_vertex", "L_vertex", "curvature", "approximate",
            "method", "note"]  # fmt: skip
    out = pd.DataFrame(rows, columns=cols)
    out["note"] = pd.Series([r["note"] for r in rows], index=out.index, dtype=object)  # None, not NaN, where given
    return out
