"""Identification of phi before a headline: the profile of the objective in phi, phi per r, and the rule that decides
whether a report may say "phi = x [lo, hi]".

The joint law (paper Eq. 3) ``L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta`` has one phi for every r. A grid
can fail to identify it in three ways, each of which this module detects:

``ON_BOUND``
    a fitted parameter, or an end of phi's bootstrap interval, sits on the edge of the search box (paper Sec. 4.2
    box; phi in [-3, 3]): the optimum is not interior, so the interval is the box's, not the data's. When every run
    has the same D (a fixed-D design) the D-term B D^-beta is a constant folded into E: E, B and beta are then not
    checked, and ``E_D = E + B D^-beta`` is the identified offset (checked against the lower edge of E's box: an
    offset at the floor means the N-term's curvature, alpha, is not identified either). With two D the D-term is
    pinned at those two only, fewer values than its three parameters: E, B and beta are not checked either, and
    the smaller of the two offsets is.
``FLAT_PROFILE``
    the profile objective (every other parameter refitted at each fixed phi) rises by less than one run's worth,
    ``2 / n`` of its minimum (n runs), at phi_hat - 1 or at phi_hat + 1 (or the profile's end, if nearer): the
    data cannot tell phi apart from values a whole unit away on that side, so any interval is an artefact of the
    resampling, not a property of the data.
``PER_R_DISAGREE``
    phi fitted from each r against the r = 1 runs alone (phi_r) has intervals with no common point: the r^phi form
    does not describe all r at once at this scale, and a single phi would average incompatible values.
``NO_INTERVAL``
    the bootstrap ran but gave phi no interval (every resample was degenerate: e.g. one D and one seed per cell,
    resampled by D): a point estimate with nothing to weigh it is not a result. (Without a bootstrap asked for, the
    headline only says there is no interval.)

Otherwise the headline is "phi = x [lo, hi]"; when the interval's half-width exceeds the precision target
(``target_half_width``, 0.15 by default) the headline says so (identified but imprecise): the rule decides whether
phi is identified, not whether it is precise enough for a purpose. A check that could not be made (no profile; phi per r without
intervals; no r = 1 runs or fewer than two r > 1 with enough runs to fit phi_r) is named at the end of the headline
("not checked: ...").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.bootstrapping import FEW_RESAMPLES, bootstrap_phase
from loopscale.fit.fitter import FitResult, fit_fixed_phis, fit_law
from loopscale.fit.io import cell_means, prepare
from loopscale.fit.laws import BOUND_RTOL, PHI_BOUNDS, PUBLIC_BOUNDS, make_law

__all__ = ["Cause", "Identification", "stored_headline", "phi_profile", "per_r_phi", "per_r_fittable", "identify", "fixed_D",
           "d_term_unidentified"]


class Cause(StrEnum):
    """Why phi is not identified (see the module docstring)."""

    ON_BOUND = "on_bound"
    FLAT_PROFILE = "flat_profile"
    PER_R_DISAGREE = "per_r_disagree"
    NO_INTERVAL = "no_interval"


@dataclass(frozen=True)
class Identification:
    """Outcome of the identification rule.

    Attributes:
        identified: True when no cause applies.
        causes: the causes that apply, each with a one-line reason (``reasons[cause]``).
        headline: the sentence a report or CLI prints ("phi = x [lo, hi] ..." or "phi not identified by this grid:
            ...").
        phi, ci: point estimate and its interval (``None`` when unavailable).
        half_width: (hi - lo) / 2 of ``ci``; ``precise`` is ``half_width <= target_half_width``, and False when
            the interval rests on fewer than :data:`loopscale.fit.bootstrapping.FEW_RESAMPLES` refitted resamples
            (``details["few_resamples"]``: their number; the headline then says the verdict is not to be trusted).
        fixed_D: every run had the same D (the D-term is a constant); ``E_D`` is then E + B D^-beta.
    """

    identified: bool
    causes: tuple[Cause, ...]
    reasons: dict[str, str]
    headline: str
    phi: float | None
    ci: tuple[float, float] | None
    half_width: float | None
    precise: bool
    fixed_D: bool
    E_D: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (causes as their string values)."""
        return {
            "identified": self.identified,
            "causes": [c.value for c in self.causes],
            "reasons": dict(self.reasons),
            "headline": self.headline,
            "phi": self.phi,
            "ci": list(self.ci) if self.ci is not None else None,
            "half_width": self.half_width,
            "precise": self.precise,
            "fixed_D": self.fixed_D,
            "E_D": self.E_D,
            **self.details,
        }


def d_term_unidentified(frame: pd.DataFrame | dict | None) -> np.ndarray | None:
    """The distinct D (tokens) of ``frame``'s runs (a DataFrame, or a mapping such as ``FitData.cols``) when there
    are only one or two, else None (also without a frame or a ``D`` column). The law's D-term enters only as ``E + B D^-beta`` at the runs' D: one D pins one value of it
    and two D two values, fewer than its three parameters, so a one-parameter family (or more) of (E, B, beta)
    fits as well and none of them is identified; from three D on the three are (the report and the rule then
    check them)."""
    if frame is None or "D" not in frame:
        return None
    d = np.unique(np.asarray(frame["D"], dtype=float))
    return d if 1 <= d.size <= 2 else None


def fixed_D(table: Any) -> bool:
    """True when every ok run of ``table`` has the same D (tokens): the D-term is a constant."""
    data = prepare(table, make_law("joint"))
    return bool(np.unique(data.cols["D"]).size == 1)


#: Ray tasks the profile's fits are split into inside a Ray session (each task fits its phi values in one batch)
PROFILE_TASKS = 4


def _profile_chunk(shared: dict, phis: list[float]) -> list[tuple[float, float]]:
    """(objective, R^2) of the joint law refitted at each fixed phi of ``phis`` (points of :func:`phi_profile`), in
    one batch (:func:`loopscale.fit.fitter.fit_fixed_phis`: the same values as one ``fit_law(phi=...)`` each)."""
    data = prepare(shared["table"], make_law("joint", 0.0))
    fits = fit_fixed_phis(data, phis, starts=shared["starts"], seed=shared["seed"], delta=shared["delta"])
    return [(float(f.objective), float(f.r2)) for f in fits]


def phi_profile(
    table: Any,
    grid: np.ndarray | None = None,
    *,
    starts: int = 60,
    seed: int = 0,
    delta: float = 1e-3,
    address: str | None = None,
) -> pd.DataFrame:
    """Profile of the joint-law objective in phi: at each fixed phi every other parameter is refitted.

    Args:
        table: runs (as :func:`loopscale.fit.fitter.fit_law`).
        grid: phi values (default -1.5 ... 2.5 in steps of 0.1, inside the paper's box [-3, 3]).
        starts: starts per restricted fit.
        address: a Ray cluster for the fits; with it, or inside a running Ray session, the grid is split into
            ``PROFILE_TASKS`` parallel Ray tasks (same values as serially); otherwise it is fitted in this process.
            Either way the fits of a task advance together (:func:`loopscale.fit.fitter.fit_fixed_phis`).
    Returns:
        DataFrame with ``phi``, ``objective`` (Huber sum, paper Eq. 4), ``r2`` and ``rel_rise`` (objective / its
        minimum over the grid - 1), sorted by phi.
    Raises:
        ValueError: bad table, an empty or non-finite grid, or a grid value outside [-3, 3].
    """
    grid = np.round(np.arange(-1.5, 2.5001, 0.1), 10) if grid is None else np.asarray(grid, dtype=float)
    if grid.ndim != 1 or grid.size == 0 or not np.isfinite(grid).all():
        raise ValueError(f"phi grid must be a non-empty 1-D list of finite values, got {grid.tolist()}")
    if grid.min() < PHI_BOUNDS[0] or grid.max() > PHI_BOUNDS[1]:
        raise ValueError(f"phi grid must lie inside {list(PHI_BOUNDS)}, got [{grid.min()}, {grid.max()}]")
    from loopscale.fit.bootstrapping import map_tasks, ray_running

    shared = {"table": _frame(table), "starts": starts, "seed": seed, "delta": delta}
    n_tasks = min(PROFILE_TASKS, grid.size) if ray_running(address) else 1
    chunks = [[float(phi) for phi in part] for part in np.array_split(grid, n_tasks)]
    vals = [v for part in map_tasks(_profile_chunk, shared, chunks, address) for v in part]
    rows = [dict(phi=float(phi), objective=o, r2=r2) for phi, (o, r2) in zip(grid, vals, strict=True)]
    out = pd.DataFrame(rows).sort_values("phi").reset_index(drop=True)
    out["rel_rise"] = out["objective"] / out["objective"].min() - 1.0
    return out


FLAT_PHI_NATS = 1e-4
"""A per-r fit whose losses move by less than this (nats/token) when phi_r moves by +-0.5 does not pin phi_r down:
its bootstrap refits, warm-started there, leave phi_r where it is and gave zero-width intervals."""


def _per_r_row(shared: dict, r: int) -> dict:
    """One row of :func:`per_r_phi`: phi_r fitted to the r = 1 runs plus those of ``r``, with its interval,
    ``boot_planned``: its bootstrap resamples (0 when phi_r is flat here and none is drawn) and ``boot_ok``: those
    refitted ok (``per_r_phi`` reports them, drops ``boot_planned`` and keeps ``boot_ok`` as ``n_boot``)."""
    from loopscale.fit.bootstrapping import _own_results, bootstrap

    df, starts, B, seed, stratify_by = (shared[k] for k in ("df", "starts", "B", "seed", "stratify_by"))
    sub = df[df["r"].isin([1, r])]
    # cell means when there are at least as many cells as the law's parameters, else the runs themselves
    law = make_law("joint")
    cm = cell_means(sub, stratify_by) if stratify_by else None
    means = cm is not None and len(cm) >= law.n_params
    pts = cm if means else sub
    f = fit_law(pts, law="joint", starts=starts, seed=seed)
    lo = hi = float("nan")
    n_ok, no_interval = 0, None
    cols = {c: pts[c].to_numpy(float) for c in ("N_once", "N_rec", "r", "D")}
    moved = float(np.max(np.abs(law.predict({**f.params, "phi": f.params["phi"] + 0.5}, cols)
                                - law.predict({**f.params, "phi": f.params["phi"] - 0.5}, cols))))  # fmt: skip
    if moved < FLAT_PHI_NATS:  # the N-term phi_r acts through is flat here: refits keep phi_r at its warm start
        no_interval = (f"phi_r = {f.params['phi']:.3g} +- 0.5 moves the fitted losses by at most {moved:.2g} nats "
                       f"(alpha = {f.params['alpha']:.3g}, A = {f.params['A']:.3g}: the N-term it acts through is "
                       "flat in this fit), so phi_r is not pinned down")  # fmt: skip
        B = 0
    if B > 0:
        how = {"stratify_by": stratify_by, "cell_means": True} if means else {"block_by": shared["block_by"]}
        with _own_results(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a missing interval is kept in the row, said by the report
            bs = bootstrap(sub, law="joint", B=B, seed=seed, workers=shared["workers"], point=f,
                           address=shared["address"], starts=max(20, starts // 5), **how)  # fmt: skip
        if bs.no_interval_reason:  # in the words of this check (it blocks as it does, not as a CLI flag says)
            why = bs.no_interval_reason.split("; a blocking that works")[0]
            no_interval = why.replace(f"--block-by {shared['block_by']}: ", "runs resampled one by one: ", 1)
        lo, hi = bs.ci.get("phi", (float("nan"), float("nan")))
        lo = float("nan") if lo is None else float(lo)
        hi = float("nan") if hi is None else float(hi)
        n_ok = int(B - bs.n_failed)
    return dict(r=r, phi=float(f.params["phi"]), lo=lo, hi=hi, n=int(f.n), on_bound=",".join(f.on_bound),
                no_interval=no_interval, boot_ok=n_ok, boot_planned=B)  # fmt: skip


@bootstrap_phase("per_r")
def per_r_phi(
    table: Any,
    *,
    starts: int = 150,
    B: int = 0,
    block_by: Any = "iid",
    seed: int = 0,
    workers: int | None = 1,
    stratify_by: tuple[str, ...] | None = None,
    address: str | None = None,
) -> pd.DataFrame:
    """phi_r: the joint law fitted to the r = 1 runs plus the runs of one r, for every r > 1.

    Args:
        table: runs (as :func:`loopscale.fit.fitter.fit_law`, with an ``r`` column).
        starts: starts per fit. B: bootstrap resamples for each phi_r interval (0: no interval).
        block_by: bootstrap blocking (default iid over runs: seeds and ladder rungs are the replicates).
        workers: bootstrap workers (1: serial, no Ray). address: a Ray cluster. With it, or inside a running Ray
            session, every r is one Ray task (its bootstrap serial inside the task); the values equal the serial
            ones.
        stratify_by: the columns of a cell when seeds are replicates: each phi_r is fitted to cell means and its
            bootstrap draws seeds within cells (:func:`loopscale.fit.io.cell_means`; ``block_by`` is ignored) —
            when the r = 1 cells plus r's cells are at least the law's 6 parameters, else to the runs.
    Returns:
        DataFrame with ``r``, ``phi``, ``lo``, ``hi`` (NaN without bootstrap), ``n`` points fitted (runs, or cells
        with ``stratify_by``), ``on_bound``, ``no_interval`` (why a bootstrap gave no interval, else None).
    Raises:
        ValueError: no r = 1 runs, or no r > 1 runs.
    """
    from loopscale.fit.bootstrapping import _notify, _notify_result, map_tasks, ray_running

    df = _frame(table)
    rs = sorted(int(v) for v in df["r"].unique())
    if 1 not in rs or len(rs) < 2:
        raise ValueError(f"per-r phi needs r = 1 runs and at least one r > 1; the table has r = {rs}")
    short = sorted(set(rs[1:]) - set(per_r_fittable(df)))
    if short:
        k = make_law("joint").n_params
        raise ValueError(
            f"per-r phi at r = {short}: the runs of each with the r = 1 runs are fewer than the joint law's {k} "
            "parameters; add seeds, widths or token budgets"
        )
    # one task per r when Ray runs (each bootstraps serially inside it); else one r after the other here
    par = ray_running(address)
    shared = dict(df=df, starts=starts, B=B, block_by=block_by, seed=seed, stratify_by=stratify_by,
                  workers=1 if par else workers, address=None if par else address)  # fmt: skip
    # the tasks' refits, for the driver's progress listeners (the console's bootstrap line): announced before the
    # tasks run, so the display shows this phase (0 of n, its clock running) rather than the last call's full bar
    n = B * (len(rs) - 1) if par and B > 0 else 0
    if n:
        _notify(0, n)
    rows = map_tasks(_per_r_row, shared, rs[1:], address)
    if n:
        _notify(n, n)
    for row in rows:  # each row keeps its own count: an interval from few refits is read as such (the report)
        row["n_boot"] = row.pop("boot_ok")
    ok = sum(row["n_boot"] for row in rows)
    planned = sum(row.pop("boot_planned") for row in rows)  # less the r whose phi_r is flat: no resample drawn
    if planned > 0:  # all r together: run here or as tasks (whose listeners are not the driver's)
        _notify_result(planned, ok, "per_r")
    return pd.DataFrame(rows)


def per_r_fittable(table: Any) -> list[int]:
    """The r > 1 of ``table`` (its ok runs) whose phi_r :func:`per_r_phi` can fit: those whose runs, with the r = 1
    runs, are at least the joint law's parameters (two cells of two seeds each are 4 runs for 6 parameters). Empty
    without r = 1 runs."""
    r = _frame(table)["r"].astype(int)
    n1, k = int((r == 1).sum()), make_law("joint").n_params
    if not n1:
        return []
    return [int(x) for x in sorted(r[r > 1].unique()) if n1 + int((r == x).sum()) >= k]


def _frame(table: Any) -> pd.DataFrame:
    """The ok rows of ``table`` as a DataFrame (via the fitter's own validation)."""
    return prepare(table, make_law("joint")).frame


PER_R_OVERLAP_TOL = 1e-6
"""Intervals of phi_r whose ends miss one another by at most this much (in phi) share a common value: the fitter
places phi to about 1e-8, so noise-free losses on the paper's design gave zero-width intervals at 0.459 that
differed by 1e-14 and were called disagreeing."""


def per_r_disagree(per_r: pd.DataFrame) -> str | None:
    """The identification rule's per-r test (module docstring): the sentence saying that the intervals of phi fitted
    per r (``per_r``: :func:`per_r_phi`'s table, every row with ``lo`` and ``hi``) have no common value, or None
    when they have one (the largest ``lo`` at most :data:`PER_R_OVERLAP_TOL` above the smallest ``hi``)."""
    if float(per_r["lo"].max()) <= float(per_r["hi"].min()) + PER_R_OVERLAP_TOL:
        return None
    parts = ", ".join(f"r={int(x.r)}: {x.phi:.2f} [{x.lo:.2f}, {x.hi:.2f}]" for x in per_r.itertuples())
    return f"phi fitted per r has no common value ({parts})"


RULE_PER_R_B, RULE_PER_R_STARTS = 40, 60
"""At most this many bootstrap resamples (and starts per fit) for the intervals of phi per r in the rule's inputs
(:func:`rule_inputs`), which ``loopscale run``, ``loopscale fit --identify`` and ``loopscale design`` apply."""


def rule_inputs(
    frame: pd.DataFrame,
    *,
    starts: int,
    B: int,
    seed: int = 0,
    strata: tuple[str, ...] | None = None,
    address: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The profile and the per-r phi that :func:`identify` weighs, with the effort ``loopscale run`` spends: the
    profile with max(10, min(starts, 30)) starts per restricted fit (on cell means over ``strata`` when given), phi
    per r (only when ``frame`` has r = 1 and at least two other r) with max(10, min(starts,
    :data:`RULE_PER_R_STARTS`)) starts and min(B, :data:`RULE_PER_R_B`) bootstrap resamples for its intervals, over the r of :func:`per_r_fittable` (at least two of them). Returns
    ``(profile, per_r or None)``."""
    profile = phi_profile(cell_means(frame, strata) if strata else frame, starts=max(10, min(starts, 30)),
                          seed=seed, address=address)  # fmt: skip
    return profile, rule_per_r(frame, starts=starts, B=B, seed=seed, strata=strata, address=address)


def rule_per_r(
    frame: pd.DataFrame,
    *,
    starts: int,
    B: int,
    seed: int = 0,
    strata: tuple[str, ...] | None = None,
    address: str | None = None,
) -> pd.DataFrame | None:
    """phi per r as the rule weighs it (:func:`per_r_phi`): over the r of :func:`per_r_fittable` (r whose runs are
    too few for the law beside r = 1's are left out, not an error), with max(10, min(starts,
    :data:`RULE_PER_R_STARTS`)) starts and min(B, :data:`RULE_PER_R_B`) resamples; None with fewer than two such
    r. ``loopscale run``, ``fit --identify`` (through :func:`rule_inputs`) and ``design`` all call it."""
    fittable = per_r_fittable(frame)
    if len(fittable) < 2:
        return None
    return per_r_phi(frame[frame["r"].isin([1, *fittable])], starts=max(10, min(starts, RULE_PER_R_STARTS)),
                     B=min(B, RULE_PER_R_B), seed=seed, stratify_by=strata, address=address)  # fmt: skip


def stored_headline(ident: dict) -> str | None:
    """The headline of an identification read back from ``analysis.json`` (:meth:`Identification.to_dict`), in
    today's words: one written before the precision target was named so read "> the 0.15 asked" (a target the user
    had not set). None when there is none."""
    import re

    h = ident.get("headline")
    if not isinstance(h, str):
        return None
    return re.sub(r"> the ([0-9.]+) asked: identified but imprecise", r"> \1, the precision target: identified but "
                  "imprecise", h)


def phi_interval_on_bound(lo: float, hi: float, rtol: float = BOUND_RTOL) -> bool:
    """Whether the interval [lo, hi] of a phi (the joint fit's, or a phi_r's) has an end on phi's search box
    (:data:`loopscale.fit.laws.PHI_BOUNDS`), within ``rtol`` of the box's width: the box, not the data, then sets it."""
    tol = rtol * (PHI_BOUNDS[1] - PHI_BOUNDS[0])
    return lo <= PHI_BOUNDS[0] + tol or hi >= PHI_BOUNDS[1] - tol


def identify(
    point: FitResult,
    ci: tuple[float | None, float | None] | None,
    profile: pd.DataFrame | None,
    per_r: pd.DataFrame | None,
    *,
    target_half_width: float = 0.15,
    bound_rtol: float = BOUND_RTOL,
    no_interval: str | None = None,
    n_resamples: int | None = None,
) -> Identification:
    """Apply the identification rule (module docstring) to a joint fit with phi free.

    Args:
        point: the joint-law point fit (phi free), e.g. from :func:`loopscale.fit.fitter.fit_law`.
        ci: phi's bootstrap interval (lo, hi), or None when there is none.
        profile: :func:`phi_profile` output (None: the flat-profile test is skipped and said so in ``details``).
        per_r: :func:`per_r_phi` output with intervals (None or one r: the per-r test is skipped).
        target_half_width: precision asked of phi (the headline says when the interval is wider).
        bound_rtol: a parameter within this fraction of the box width from an edge counts as on the bound.
        no_interval: why the bootstrap that was run gave no interval (``BootstrapResult.no_interval_reason``): the
            cause ``NO_INTERVAL``; None when it gave one or none was run.
        n_resamples: the refitted resamples behind ``ci`` (``B - n_failed``); below
            :data:`~loopscale.fit.bootstrapping.FEW_RESAMPLES` the interval's ends (and the per-r intervals, drawn as
            many times) move from one bootstrap seed to the next: the checks are made all the same, but the
            headline says the verdict rests on that few and ``precise`` is False. None: not known (not said).
    Raises:
        ValueError: ``point`` is not a joint fit with phi free.
    """
    if point.law != "joint" or point.phi_fixed or "phi" not in point.params:
        raise ValueError("identify needs the joint-law fit with phi free (law='joint', phi=None)")
    n = int(point.n)
    frame = point.data
    few_d = d_term_unidentified(frame)
    is_fixed_D = few_d is not None and few_d.size == 1
    causes: list[Cause] = []
    reasons: dict[str, str] = {}
    details: dict[str, Any] = {"n": n, "checks_skipped": []}
    p = point.params

    # 1. parameters (and phi's interval) on the box edge
    box = PUBLIC_BOUNDS
    on_edge = []
    for k, (lo, hi) in box.items():
        if few_d is not None and k in ("E", "B", "beta"):  # not identified by one or two D: not checked
            continue
        v = float(np.log(p[k])) if k in ("E", "A", "B") else float(p[k])
        tol = bound_rtol * (hi - lo)
        if v <= lo + tol or v >= hi - tol:
            on_edge.append(k)
    if few_d is not None:  # an identified offset at the floor of E's box: the N-term's curvature is not identified
        lo_e, hi_e = box["E"]
        offsets = {float(d): float(p["E"] + p["B"] * float(d) ** (-p["beta"])) for d in few_d}
        if few_d.size == 2:
            details["D_offsets"] = {f"{d:.6g}": o for d, o in offsets.items()}
        if np.log(min(offsets.values())) <= lo_e + bound_rtol * (hi_e - lo_e):
            on_edge.append("E_D (= E + B D^-beta, the offset of a fixed-D design)" if is_fixed_D else
                           f"E + B D^-beta at D = {max(offsets):.6g} (the smaller offset of a two-D design)")  # fmt: skip
    phi_ci = None
    if ci is not None and ci[0] is not None and ci[1] is not None and np.isfinite(ci[0]) and np.isfinite(ci[1]):
        phi_ci = (float(ci[0]), float(ci[1]))
        if phi_interval_on_bound(*phi_ci, rtol=bound_rtol):
            on_edge.append("phi interval")
    if on_edge:
        causes.append(Cause.ON_BOUND)
        reasons[Cause.ON_BOUND.value] = f"on the search-box edge: {', '.join(on_edge)}"

    # 2. flat profile
    phi_hat = float(p["phi"])
    if profile is not None and len(profile) >= 3:
        prof = profile.sort_values("phi")
        obj_min = min(float(prof["objective"].min()), float(point.objective))
        thr = 2.0 / max(n, 1)
        rises, at = [], []
        for target in (phi_hat - 1.0, phi_hat + 1.0):
            t = float(np.clip(target, prof["phi"].min(), prof["phi"].max()))
            at.append((t, target))
            rises.append(float(np.interp(t, prof["phi"], prof["objective"])) / obj_min - 1.0)
        details["profile_rise_at_pm1"] = rises
        details["profile_threshold"] = thr
        if min(rises) < thr:
            i = 0 if rises[0] <= rises[1] else 1
            (t, target), side = at[i], ("phi_hat - 1", "phi_hat + 1")[i]
            lo_p, hi_p = float(prof["phi"].min()), float(prof["phi"].max())
            if t == target:
                where = f"phi = {t:.2f} ({side})"
            elif lo_p <= phi_hat <= hi_p:  # the end lies on the side of phi_hat it stands for (or at phi_hat)
                where = f"phi = {t:.2f}, the profile's end ({side} = {target:.2f} lies outside it)"
            else:  # phi_hat itself is outside the profile's range: its nearest end is on the other side
                where = (f"phi = {t:.2f}, the profile's end nearest phi_hat = {phi_hat:.2f}, which lies outside the "
                         f"profile's range [{lo_p:.2f}, {hi_p:.2f}]")  # fmt: skip
            causes.append(Cause.FLAT_PROFILE)
            digits = next((k for k in range(2, 7) if f"{100 * min(rises):.{k}g}" != f"{100 * thr:.{k}g}"), 7)
            reasons[Cause.FLAT_PROFILE.value] = (  # enough digits to tell the two apart (6.2 % vs 6.2 % read oddly)
                f"flat profile: the objective rises by only {100 * min(rises):.{digits}g} % at {where} "
                f"(one run's worth is {100 * thr:.{digits}g} %)"
            )
    else:
        details["checks_skipped"].append("flat_profile (no profile)")

    # 3. per-r phi consistency
    if per_r is not None and len(per_r) >= 2 and per_r[["lo", "hi"]].notna().all().all():
        details["per_r"] = per_r[[c for c in ("r", "phi", "lo", "hi", "n_boot") if c in per_r.columns]].to_dict("records")
        if why := per_r_disagree(per_r):
            causes.append(Cause.PER_R_DISAGREE)
            reasons[Cause.PER_R_DISAGREE.value] = why
    elif per_r is not None and len(per_r) >= 2:
        details["checks_skipped"].append("per_r (phi per r came without intervals)")
        details["per_r"] = per_r[[c for c in ("r", "phi", "lo", "hi", "n_boot") if c in per_r.columns]].to_dict("records")
        if "no_interval" in per_r.columns:
            details["per_r_no_interval"] = {str(int(x.r)): x.no_interval for x in per_r.itertuples()
                                            if isinstance(x.no_interval, str)}  # fmt: skip
    else:
        details["checks_skipped"].append(
            f"per_r (needs r = 1 runs and at least two r > 1, each with at least {make_law('joint').n_params} runs "
            "together with the r = 1 runs)"
        )

    if no_interval and phi_ci is None:
        causes.append(Cause.NO_INTERVAL)
        reasons[Cause.NO_INTERVAL.value] = f"no interval: the bootstrap gave none ({no_interval})"

    half = None if phi_ci is None else (phi_ci[1] - phi_ci[0]) / 2
    few = n_resamples is not None and phi_ci is not None and 0 < int(n_resamples) < FEW_RESAMPLES
    precise = half is not None and half <= target_half_width and not few
    E_D = float(p["E"] + p["B"] * float(np.unique(frame["D"])[0]) ** (-p["beta"])) if is_fixed_D else None
    if causes:
        headline = "phi not identified by this grid: " + "; ".join(reasons[c.value] for c in causes)
    elif phi_ci is None:
        headline = f"phi = {phi_hat:.3f} (no interval: the bootstrap gave none)"
    else:
        headline = f"phi = {phi_hat:.3f}, 95 % CI [{phi_ci[0]:.3f}, {phi_ci[1]:.3f}]"
        if half > target_half_width:
            headline += (f" (half-width {half:.2f} > {target_half_width:g}, the precision target: identified but "
                         "imprecise)")  # fmt: skip
    if not causes and details["checks_skipped"]:
        headline += "; not checked: " + ", ".join(details["checks_skipped"])
    if few:
        details["few_resamples"] = int(n_resamples)
        headline += (f" (a verdict from {int(n_resamples)} refitted resample(s), fewer than the {FEW_RESAMPLES} it "
                     "needs: the interval's ends move with the bootstrap seed; a larger --bootstrap gives more)")
    return Identification(
        identified=not causes,
        causes=tuple(causes),
        reasons=reasons,
        headline=headline,
        phi=phi_hat,
        ci=phi_ci,
        half_width=half,
        precise=bool(precise),
        fixed_D=is_fixed_D,
        E_D=E_D,
        details=details,
    )
