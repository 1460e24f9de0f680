"""The fitting objective and a vectorised multi-start minimiser.

Objective (paper §4.2, Eq. 4, after Hoffmann et al. 2022 and Besiroglu et al. 2024), float64, **sum** over runs:

    F(theta) = sum_i w_i * Huber_delta( LSE(a - alpha*u_i, b - beta*log D_i, e) - log L_i ),   delta = 1e-3,

with ``u_i = log N_x`` from the law (``log N`` or ``log(N_once + r^phi N_rec)``) and optional non-negative integer weights
``w_i`` (bootstrap multiplicities; a weight of k equals the row appearing k times). The gradient is analytic, including
``d/d phi``.

Minimiser (``minimize_multistart``): many starts advance *together* through a batched projected L-BFGS (box
constraints, Armijo backtracking on the projected path, per-row convergence), then the best few distinct end points are
polished with scipy's L-BFGS-B (analytic gradient, tight tolerances, 10,000 iterations cap as the paper). Starts are
uniform in the paper's box (seeded), plus a coarse grid, plus "variable projection" sub-fits (for fixed exponents the law
is linear in ``E, A, B``; a weighted least-squares solve over an exponent grid gives near-optimal starts), plus any warm
starts the caller passes (bootstrap refits pass the point estimate). Internally the objective is divided by ``delta``
so that tolerances are meaningful for the ~1e-3-sized sums typical here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from loopscale.fit.io import VALUE_RULES, FitData, breaking, prepare, read_table
from loopscale.fit.laws import BOUND_RTOL, Law, check_per_r_anchor, make_law


# ----------------------------------------------------------------------------------------------------------------------
# objective
# ----------------------------------------------------------------------------------------------------------------------
class Objective:
    """Batched Huber-LSE objective for one law and one data set.

    Args:
        law: the law.
        cols: column arrays of shape ``(n,)`` (must hold ``loss``, ``D`` and the law's columns).
        delta: Huber threshold on log-loss residuals (paper: 1e-3).
        weights: optional ``(R, n)`` array of per-row-set weights (bootstrap multiplicities); row set ``k`` of
            ``weights`` is selected by ``wid`` in :meth:`__call__`. ``None`` means all ones.
        losses: optional ``(R, n)`` array of per-row-set losses (nats/token) replacing ``cols["loss"]``, selected by
            ``wid`` like ``weights`` (bootstrap of cell means: every resample has its own cell means).
        u_sets: optional ``(R, n)`` array of per-row-set ``u = log N_x`` replacing the law's, selected by ``wid``: one
            batch of fits of laws that differ only in a fixed parameter (the restricted joint law at several fixed
            phi, :func:`fit_fixed_phis`). Needs a law without fitted extra parameters and no ``weights``/``losses``.
    Raises:
        ValueError: ``delta`` not a finite number > 0; ``u_sets`` with a law that fits extra parameters, or with
            ``weights`` or ``losses``.
    Call returns the objective **divided by delta** (shape ``(S,)``) and its gradient (``(S, P)``).
    """

    def __init__(
        self,
        law: Law,
        cols: dict[str, np.ndarray],
        delta: float = 1e-3,
        weights: np.ndarray | None = None,
        losses: np.ndarray | None = None,
        u_sets: np.ndarray | None = None,
    ):
        if not (delta > 0 and np.isfinite(delta)):
            raise ValueError(f"delta={delta} must be a finite number > 0 (paper: 1e-3)")
        self.law, self.cols, self.delta = law, cols, float(delta)
        self.logL = np.log(cols["loss"])
        self.logD = np.log(cols["D"])
        self.n = self.logL.shape[0]
        self.weights = None if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1, self.n)
        self.loss_sets = None if losses is None else np.asarray(losses, dtype=np.float64).reshape(-1, self.n)
        self.logL_sets = None if losses is None else np.log(self.loss_sets)
        self.u_sets = None
        if u_sets is not None:
            if law.extra_names or weights is not None or losses is not None:
                raise ValueError("u_sets needs a law without fitted extra parameters and no weights or losses")
            self.u_sets = np.asarray(u_sets, dtype=np.float64).reshape(-1, self.n)
        # a law without fitted extra parameters has one u = log N_x for every theta: computed once (u_sets, when
        # given, takes its place)
        fixed_u = not law.extra_names and self.u_sets is None
        self.u_const = law.log_n(np.zeros((1, 0)), cols)[0] if fixed_u else None

    def __call__(self, theta: np.ndarray, wid: np.ndarray | None = None, grad: bool = True):
        # Every array operation below is the one of the formula in the class docstring, in the same order, so the
        # values do not depend on this layout; the operations write into their own temporaries where they can (at
        # a bootstrap's batch sizes, allocating the (S, n) arrays cost as much as the arithmetic).
        theta = np.atleast_2d(theta)
        a, b, e, al, be = (theta[:, k : k + 1] for k in range(5))
        if self.u_sets is not None:
            u, du = self.u_sets[np.zeros(theta.shape[0], dtype=int) if wid is None else wid], None
        elif self.u_const is not None:
            u, du = self.u_const, None
        else:
            u, du = self.law.log_n(theta[:, 5:], self.cols)
        t1 = np.multiply(al, u)
        np.subtract(a, t1, out=t1)  # a - alpha*u
        t2 = np.multiply(be, self.logD[None, :])
        np.subtract(b, t2, out=t2)  # b - beta*log D
        m = np.maximum(t1, t2)
        np.maximum(m, e, out=m)
        e1 = np.exp(np.subtract(t1, m, out=t1), out=t1)
        e2 = np.exp(np.subtract(t2, m, out=t2), out=t2)
        e3 = np.subtract(e, m)
        np.exp(e3, out=e3)
        s = np.add(e1, e2)
        s += e3
        if self.logL_sets is None:
            logL = self.logL[None, :]
        else:
            logL = self.logL_sets[np.zeros(theta.shape[0], dtype=int) if wid is None else wid]
        res = np.log(s)
        np.add(m, res, out=res)
        res -= logL  # log L_hat - log L
        d = self.delta
        ar = np.abs(res)
        h = np.subtract(ar, 0.5 * d)
        h *= d  # linear branch d*(|res| - d/2)
        quad = np.multiply(0.5, res)
        quad *= res  # quadratic branch res^2/2
        np.copyto(h, quad, where=ar <= d)
        h /= d
        w = None
        if self.weights is not None:
            w = self.weights[np.zeros(theta.shape[0], dtype=int) if wid is None else wid]
            h *= w
        f = np.add.reduce(h, 1)
        if not grad:
            return f, None
        gr = np.clip(res, -d, d, out=res)
        gr /= d
        if w is not None:
            gr *= w
        p1 = np.multiply(gr, e1, out=e1)
        p1 /= s
        p2 = np.multiply(gr, e2, out=e2)
        p2 /= s
        p3 = np.multiply(gr, e3, out=e3)
        p3 /= s
        g = np.empty_like(theta)
        g[:, 0] = np.add.reduce(p1, 1)
        g[:, 1] = np.add.reduce(p2, 1)
        g[:, 2] = np.add.reduce(p3, 1)
        g[:, 3] = -np.add.reduce(p1 * u, 1)
        g[:, 4] = -np.add.reduce(p2 * self.logD[None, :], 1)
        if du is not None:
            for k in range(du.shape[2]):
                g[:, 5 + k] = -np.add.reduce(p1 * al * du[:, :, k], 1)
        return f, g


# ----------------------------------------------------------------------------------------------------------------------
# batched projected L-BFGS
# ----------------------------------------------------------------------------------------------------------------------
def batched_lbfgs(
    fun,
    x0: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    wid: np.ndarray | None = None,
    *,
    m: int = 10,
    max_iter: int = 2000,
    ftol: float = 1e-13,
    pgtol: float = 1e-9,
    stall: int = 50,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimise ``fun`` from ``S`` starts at once with a box-projected L-BFGS (vectorised over starts).

    Args:
        fun: ``fun(x (k,P), wid (k,)) -> (f (k,), g (k,P))``.
        x0: starts, shape ``(S, P)`` (clipped into the box).
        lo, hi: box, shape ``(P,)``.
        wid: per-start weight-row id passed through to ``fun`` (shape ``(S,)``) or ``None``.
        m: L-BFGS memory. max_iter: iteration cap per start. ftol: relative decrease stop. pgtol: projected-gradient stop.
            stall: stop a row after this many iterations without a 1e-10 relative improvement.
    Returns:
        ``(x, f, n_iter)``: end points ``(S, P)``, objective values ``(S,)``, iterations used ``(S,)``.
    Rows are independent: each row's trajectory depends only on its own start and weight row, so results do not depend
    on which other rows share the batch.
    """
    x = np.clip(np.array(x0, dtype=np.float64), lo, hi)
    S, P = x.shape
    wid = np.zeros(S, dtype=int) if wid is None else np.asarray(wid)
    f, g = fun(x, wid)
    f = np.where(np.isfinite(f), f, np.inf)
    # the last m (s, y) pairs of every row in a ring: slot head[i] holds row i's oldest pair, so its pairs from oldest
    # to newest are slots head[i], head[i] + 1, ... (mod m); a row's new pair replaces its oldest
    Sb = np.zeros((S, m, P))
    Yb = np.zeros((S, m, P))
    rho = np.zeros((S, m))
    head = np.zeros(S, dtype=int)
    ring = np.arange(m)
    n_iter = np.zeros(S, dtype=int)
    active = np.isfinite(f)
    span = hi - lo
    ref_f = f.copy()  # objective at the last "significant" improvement (relative 1e-10), for the stall stop
    ref_it = np.zeros(S, dtype=int)
    for _ in range(max_iter):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        xa, fa, ga = x[idx], f[idx], g[idx]
        pg = xa - np.clip(xa - ga, lo, hi)
        conv = np.abs(pg).max(axis=1) < pgtol
        binding = ((xa <= lo + 1e-12 * span) & (ga > 0)) | ((xa >= hi - 1e-12 * span) & (ga < 0))
        q = np.where(binding, 0.0, ga)
        # two-loop recursion over the pairs ordered oldest to newest (newest at index m-1)
        order = (head[idx, None] + ring) % m
        Sa, Ya, ra = Sb[idx[:, None], order], Yb[idx[:, None], order], rho[idx[:, None], order]
        alph = np.zeros((idx.size, m))
        qq = q.copy()
        for j in range(m - 1, -1, -1):
            alph[:, j] = ra[:, j] * np.add.reduce(Sa[:, j] * qq, 1)
            qq -= alph[:, j : j + 1] * Ya[:, j]
        yy = np.add.reduce(Ya[:, -1] * Ya[:, -1], 1)
        has = ra[:, -1] > 0
        gamma = np.where(has, 1.0 / np.where(has, ra[:, -1] * yy, 1.0), 0.0)
        # no history yet: a first step that moves the largest component by at most 1% of the box
        qmax = np.abs(q / span).max(axis=1)
        gamma = np.where(has, gamma, 1e-2 / np.maximum(qmax, 1e-300) * np.min(span) / np.max(span))
        r = gamma[:, None] * qq
        for j in range(m):
            bj = ra[:, j] * np.add.reduce(Ya[:, j] * r, 1)
            r += Sa[:, j] * (alph[:, j] - bj)[:, None]
        dvec = np.where(binding, 0.0, -r)
        gd = np.add.reduce(ga * dvec, 1)
        reset = ~(gd < 0)
        if (
            reset.any()
        ):  # not a descent direction: fall back to scaled steepest descent and forget the history
            sc = 1e-2 / np.maximum(qmax[reset], 1e-300) * np.min(span) / np.max(span)
            dvec[reset] = -q[reset] * sc[:, None]
            rho[idx[reset]] = 0.0  # (every slot: a forgotten history has no pairs)
        # projected backtracking (Armijo on the projected step)
        t = np.ones(idx.size)
        xn = np.clip(xa + dvec, lo, hi)
        fn, gn = fun(xn, wid[idx])
        ok = np.isfinite(fn) & (fn <= fa + 1e-4 * np.add.reduce(ga * (xn - xa), 1))
        pend = np.flatnonzero(~ok)
        for _ls in range(40):
            if pend.size == 0:
                break
            t[pend] *= 0.5
            xt = np.clip(xa[pend] + t[pend, None] * dvec[pend], lo, hi)
            ft, gt = fun(xt, wid[idx[pend]])
            okp = np.isfinite(ft) & (ft <= fa[pend] + 1e-4 * np.add.reduce(ga[pend] * (xt - xa[pend]), 1))
            xn[pend], fn[pend], gn[pend] = xt, ft, gt
            pend = pend[~okp]
        failed = np.zeros(idx.size, dtype=bool)
        failed[pend] = True
        keep = ~failed
        s = xn - xa
        y = gn - ga
        sy = np.add.reduce(s * y, 1)
        upd = keep & (sy > 1e-12 * np.sqrt(np.add.reduce(s * s, 1) * np.add.reduce(y * y, 1)) + 1e-300)
        iu = idx[upd]
        if iu.size:
            slot = head[iu]
            Sb[iu, slot] = s[upd]
            Yb[iu, slot] = y[upd]
            rho[iu, slot] = 1.0 / sy[upd]
            head[iu] = (slot + 1) % m
        small = keep & ((fa - fn) <= ftol * np.maximum(np.abs(fa), 1e-12))
        ik = idx[keep]
        x[ik], f[ik], g[ik] = xn[keep], fn[keep], gn[keep]
        n_iter[idx] += 1
        sig = f[idx] < ref_f[idx] - 1e-10 * np.maximum(np.abs(ref_f[idx]), 1e-12)
        ref_f[idx[sig]], ref_it[idx[sig]] = f[idx[sig]], n_iter[idx[sig]]
        stalled = n_iter[idx] - ref_it[idx] >= stall
        done = conv | failed | small | stalled
        active[idx[done]] = False
    return x, f, n_iter


#: only end points within this factor of the best batched objective are polished (the rest cannot realistically win)
POLISH_WITHIN = 1.05
#: batched L-BFGS iterations of a point fit's starts (the stragglers are left to the polish)
MULTISTART_MAX_ITER = 250


# ----------------------------------------------------------------------------------------------------------------------
# starts
# ----------------------------------------------------------------------------------------------------------------------
def random_starts(law: Law, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` starts uniform in the paper's box (§4.2), shape ``(k, P)``."""
    lo, hi = law.bounds()
    return lo + (hi - lo) * rng.random((k, lo.size))


def grid_starts(law: Law) -> np.ndarray:
    """Coarse grid over the box (Epoch-style), shape ``(G, P)``: alpha, beta in {0.2, 0.5, 1.0}, e in {0, 1},
    a, b in {5, 15, 25}, phi (each phi_<r> of the per-r law) in {0, 0.5, 1}."""
    axes = {
        "a": [5.0, 15.0, 25.0],
        "b": [5.0, 15.0, 25.0],
        "e": [0.0, 1.0],
        "alpha": [0.2, 0.5, 1.0],
        "beta": [0.2, 0.5, 1.0],
    }
    mesh = np.meshgrid(*[axes.get(k, [0.0, 0.5, 1.0]) for k in law.names], indexing="ij")  # phi (or phi_<r>)
    return np.stack([mm.ravel() for mm in mesh], axis=1)


def subfit_starts(
    law: Law,
    obj: Objective,
    k: int,
    wid: int | None = None,
    n_alpha: int = 12,
    phis: tuple[float, ...] = (-0.5, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5),
) -> np.ndarray:
    """Variable-projection starts: for each (alpha, beta[, phi]) on a grid, ``L ~ E + A x + B y`` is linear in
    ``(E, A, B)``; solve the 1/L-weighted least squares, clip into the box, rank by the true objective, return the
    best ``k`` rows (shape ``(k, P)``)."""
    if k <= 0:
        return np.empty((0, law.n_params))
    lo, hi = law.bounds()
    ex = np.linspace(0.05, 1.5, n_alpha)
    ph = phis if law.extra_names else (0.0,)
    AL, BE, PH = (v.ravel() for v in np.meshgrid(ex, ex, np.asarray(ph), indexing="ij"))
    G = AL.size
    n_extra = len(law.extra_names)  # every phi (one, or one per r) starts at the same grid value
    u, _ = law.log_n(np.repeat(PH[:, None], n_extra, axis=1), obj.cols)
    u = np.broadcast_to(u, (G, obj.n))
    X = np.exp(-AL[:, None] * u)  # (G, n)
    Y = np.exp(-BE[:, None] * obj.logD[None, :])
    L = obj.cols["loss"] if obj.loss_sets is None else obj.loss_sets[0 if wid is None else wid]
    w = 1.0 / L**2
    if obj.weights is not None:
        w = w * obj.weights[0 if wid is None else wid]
    Z = np.stack([np.ones_like(X), X, Y], axis=2)  # (G, n, 3)
    Zw = Z * w[None, :, None]
    M = np.matmul(Zw.transpose(0, 2, 1), Z) + 1e-18 * np.eye(3)  # (G, 3, 3) weighted normal equations
    v = np.matmul(Zw.transpose(0, 2, 1), L[:, None])[:, :, 0]
    try:
        coef = np.linalg.solve(M, v[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        coef = np.linalg.lstsq(M[0], v[0], rcond=None)[0][None, :].repeat(G, 0)
    coef = np.where(np.isfinite(coef), coef, 1e-12)
    Ec = np.clip(coef[:, 0], np.exp(lo[2]), np.exp(hi[2]))
    Ac = np.maximum(coef[:, 1], 1e-12)
    Bc = np.maximum(coef[:, 2], 1e-12)
    theta = np.stack([np.log(Ac), np.log(Bc), np.log(Ec), AL, BE] + [PH] * n_extra, axis=1)
    theta = np.clip(theta, lo, hi)
    wids = None if obj.weights is None and obj.logL_sets is None else np.full(G, 0 if wid is None else wid)
    f, _ = obj(theta, wids, grad=False)
    order = np.argsort(np.where(np.isfinite(f), f, np.inf), kind="stable")
    return theta[order[:k]]


def build_starts(
    law: Law,
    obj: Objective,
    starts: int,
    rng: np.random.Generator,
    *,
    warm: np.ndarray | None = None,
    wid: int | None = None,
    grid: bool = True,
    n_alpha: int = 12,
) -> np.ndarray:
    """Assemble the start rows of a multi-start fit: the warm starts first, then up to ``max(2, starts // 20)``
    sub-fit starts (:func:`subfit_starts`, whose exponent grid is ``n_alpha`` x ``n_alpha`` [x phi]), then (if
    ``grid``) up to ``starts // 5`` points of :func:`grid_starts` (a seeded subsample when it holds more), the rest
    uniform random. Returns shape ``(max(starts, n_warm), P)``: every warm row is kept, even beyond ``starts``."""
    rows = []
    if warm is not None:
        rows.append(np.atleast_2d(warm))
    n_have = sum(r.shape[0] for r in rows)
    k_sub = min(max(2, starts // 20), max(starts - n_have, 0))
    rows.append(subfit_starts(law, obj, k_sub, wid=wid, n_alpha=n_alpha))
    n_have = sum(r.shape[0] for r in rows)
    if grid and starts - n_have > 0:
        gs = grid_starts(law)
        k_grid = min(starts // 5, gs.shape[0], starts - n_have)
        if k_grid > 0:
            sel = (
                np.sort(rng.choice(gs.shape[0], size=k_grid, replace=False))
                if k_grid < gs.shape[0]
                else slice(None)
            )
            rows.append(gs[sel])
    n_have = sum(r.shape[0] for r in rows)
    rows.append(random_starts(law, max(starts - n_have, 0), rng))
    return np.concatenate(rows, axis=0)


def polish(obj: Objective, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray, wid: int | None = None):
    """Refine one point with scipy L-BFGS-B (analytic gradient, ftol 1e-15, gtol 1e-10, maxiter 10,000 as the paper).
    Returns ``(x, f)``."""
    from scipy.optimize import minimize

    wids = None if wid is None else np.array([wid])

    def fg(x):
        f, g = obj(x[None, :], wids)
        return float(f[0]), g[0]

    r = minimize(
        fg,
        np.clip(x0, lo, hi),
        jac=True,
        method="L-BFGS-B",
        bounds=list(zip(lo, hi, strict=True)),
        options={"maxiter": 10000, "ftol": 1e-15, "gtol": 1e-10, "maxcor": 20},
    )
    return np.asarray(r.x, dtype=np.float64), float(r.fun)


def minimize_multistart(
    law: Law,
    obj: Objective,
    x0: np.ndarray,
    *,
    wid: int | None = None,
    n_polish: int = 3,
    at_best_tol: float = 1e-9,
    max_iter: int | None = None,
) -> dict[str, Any]:
    """Run the batched minimiser from all rows of ``x0`` (at most ``max_iter`` batched iterations, default
    ``MULTISTART_MAX_ITER``: the stragglers are left to the polish), polish the best ``n_polish`` distinct end points
    with scipy L-BFGS-B (:func:`best_of_batch`).

    Returns a dict with ``theta`` (best, ``(P,)``), ``objective`` (unscaled Huber sum), ``n_starts_at_best`` (starts whose
    batched end objective is within ``at_best_tol`` (unscaled) of the best), ``x_end``/``f_end`` (all batched end
    points, ``f`` unscaled).
    """
    lo, hi = law.bounds()
    wids = None if wid is None else np.full(x0.shape[0], wid)
    x, f, _ = batched_lbfgs(obj, x0, lo, hi, wids, max_iter=MULTISTART_MAX_ITER if max_iter is None else max_iter)
    return best_of_batch(law, obj, x, f, wid=wid, n_polish=n_polish, at_best_tol=at_best_tol)


def best_of_batch(
    law: Law,
    obj: Objective,
    x: np.ndarray,
    f: np.ndarray,
    *,
    wid: int | None = None,
    n_polish: int = 3,
    at_best_tol: float = 1e-9,
) -> dict[str, Any]:
    """The second phase of :func:`minimize_multistart`: from the batched end points ``x`` ``(S, P)`` with objectives
    ``f`` ``(S,)`` (divided by delta), polish the best ``n_polish`` distinct ones (within ``POLISH_WITHIN`` of the
    best) with scipy L-BFGS-B and keep the best. Returns the dict :func:`minimize_multistart` documents."""
    lo, hi = law.bounds()
    order = np.argsort(np.where(np.isfinite(f), f, np.inf), kind="stable")
    cand: list[np.ndarray] = []
    for i in order:
        if not np.isfinite(f[i]):
            break
        if cand and f[i] > POLISH_WITHIN * f[order[0]]:
            break
        if all(np.max(np.abs(x[i] - c) / (hi - lo)) > 1e-4 for c in cand):
            cand.append(x[i])
        if len(cand) >= n_polish:
            break
    best_x, best_f = (x[order[0]], f[order[0]]) if np.isfinite(f[order[0]]) else (None, np.inf)
    for c in cand:
        px, pf = polish(obj, c, lo, hi, wid)
        if pf < best_f:
            best_x, best_f = px, pf
    d = obj.delta
    n_at = int(np.sum(f * d <= best_f * d + at_best_tol))
    return {
        "theta": best_x,
        "objective": float(best_f * d),
        "n_starts_at_best": max(n_at, 1),
        "x_end": x,
        "f_end": f * d,
    }


# ----------------------------------------------------------------------------------------------------------------------
# point fit
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FitResult:
    """A fitted law ``L = E + A*N_x^-alpha + B*D^-beta`` (joint: ``N_x = N_once + r^phi N_rec``, paper Eq. 3).

    Attributes:
        law: ``"joint"`` or ``"chinchilla"``.
        params: ``E`` (nats/token), ``A``, ``alpha``, ``B``, ``beta`` and, for the joint law, ``phi`` (fitted or fixed).
        objective: Huber-sum at the optimum (paper Eq. 4; Table 1's "Huber" column).
        r2: R^2 on raw nats. rmse, max_abs_residual: of residuals actual - predicted (nats).
        residuals_by_r: ``{str(r): {"n", "mean", "max_abs", "rmse"}}`` (paper Table 7; keyed by ``"2"``, not ``2``,
            as fit.json holds it), when the table has ``r``.
        n: runs used. n_params: fitted parameters. on_bound: fitted parameters within :data:`loopscale.fit.laws.BOUND_RTOL` of the box's width from its edge.
        n_starts_at_best: starts whose end objective is within 1e-9 of the best.
        n_excluded: rows dropped (``status != "ok"``, or a newer row of the same ``run_id``).
        excluded_by_status: ``{status: count}`` of the rows dropped for their status.
        excluded_duplicates: the ``run_id`` of each row dropped for a newer row of the same run.
        data: the kept rows (DataFrame) the fit used; not part of ``to_dict``.
        phi_fixed: True when phi was held fixed (restricted fit).
        delta: Huber threshold used. starts: number of starts. theta: log-space optimum ``(a, b, e, alpha, beta[, phi])``.
    """

    law: str
    params: dict[str, float]
    objective: float
    r2: float
    rmse: float
    max_abs_residual: float
    residuals_by_r: dict[str, dict[str, float]]
    n: int
    n_params: int
    on_bound: list[str]
    n_starts_at_best: int
    n_excluded: int = 0
    excluded_by_status: dict[str, int] = field(default_factory=dict)
    excluded_duplicates: list[str] = field(default_factory=list)
    phi_fixed: bool = False
    delta: float = 1e-3
    starts: int = 0
    theta: tuple[float, ...] = ()
    data: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field except ``data`` (the kept rows, a DataFrame)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "data"}
        out["theta"] = list(self.theta)
        out["params"] = dict(self.params)
        return out

    def law_object(self) -> Law:
        """The :class:`~loopscale.fit.laws.Law` this result was fitted with."""
        if self.law == "joint_per_r":
            return make_law(self.law, rs=tuple(int(k[4:]) for k in self.params if k.startswith("phi_")))
        return make_law(self.law, self.params["phi"] if self.phi_fixed else None)

    def predict(self, table: Any) -> np.ndarray:
        """Predicted loss (nats/token), shape ``(n,)``, for the rows of ``table`` (same columns as the fit: ``D``
        in tokens and ``N`` (or ``N_unique``) for the Chinchilla law, ``N_once``, ``N_rec`` and ``r`` for the joint
        laws).

        For the Chinchilla law ``N`` may also be given as ``N_unique`` or as ``N_once`` + ``N_rec``, as the fit reads
        it.

        Raises:
            ValueError: a column the law needs is missing (named, with the table's columns), not numeric, or holds
                a value the law is not defined at (infinite, or one :data:`loopscale.fit.io.VALUE_RULES` refuses as
                the fit does: D or N not > 0, N_once or N_rec < 0, r not a whole number >= 1; named with its row). A
                NaN (a failed run's row of a runs table) gives NaN for that row.
        """
        import pandas as pd

        df = read_table(table) if not isinstance(table, dict) else pd.DataFrame(table)
        if self.law == "chinchilla" and "N" not in df.columns and "N_unique" in df.columns:
            df = df.rename(columns={"N_unique": "N"})
        if self.law == "chinchilla" and "N" not in df.columns and {"N_once", "N_rec"} <= set(df.columns):
            df = df.assign(N=pd.to_numeric(df["N_once"], errors="coerce") + pd.to_numeric(df["N_rec"], errors="coerce"))
        law = self.law_object()
        need = ("D", *law.columns)
        missing = [c for c in need if c not in df.columns]
        if missing:
            alt = {"N": "N (or N_unique, or N_once + N_rec)"} if self.law == "chinchilla" else {}
            raise ValueError(
                f"predict with the {self.law!r} law needs columns {[alt.get(c, c) for c in need]}; missing "
                f"{[alt.get(c, c) for c in missing]}; table has {list(df.columns)}"
            )
        try:
            cols = {c: pd.to_numeric(df[c]).to_numpy(dtype=np.float64, na_value=np.nan) for c in need}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"predict: the columns {list(need)} must be numeric: {exc}") from exc
        for c, v in cols.items():  # a log of a negative came back NaN with numpy's RuntimeWarning, without a word
            if not (bad := breaking(c, v, nan_ok=True)).any():  # NaN (a failed run's row): NaN out
                continue
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"predict: column {c!r} holds {float(v[i])!r} at row {i} ({int(bad.sum())} such row(s)); the "
                             f"law needs finite values, {VALUE_RULES[c][0]} (NaN: a NaN prediction)")
        return law.predict(self.params, cols)


def goodness(law: Law, params: dict[str, float], data: FitData) -> dict[str, Any]:
    """R^2 on raw nats, RMSE, max |residual| and per-r residual stats (paper Table 7). Residual = actual - predicted."""
    L = data.cols["loss"]
    pred = law.predict(params, data.cols)
    res = L - pred
    ss_tot = float(np.sum((L - L.mean()) ** 2))
    r2 = 1.0 - float(np.sum(res**2)) / ss_tot if ss_tot > 0 else float("nan")
    by_r: dict[str, dict[str, float]] = {}
    if "r" in data.cols:
        for rv in np.unique(data.cols["r"]):
            rr = res[data.cols["r"] == rv]
            key = str(int(rv)) if float(rv).is_integer() else str(float(rv))
            by_r[key] = {
                "n": int(rr.size),
                "mean": float(rr.mean()),
                "max_abs": float(np.abs(rr).max()),
                "rmse": float(np.sqrt(np.mean(rr**2))),
            }
    return {
        "r2": r2,
        "rmse": float(np.sqrt(np.mean(res**2))),
        "max_abs_residual": float(np.abs(res).max()),
        "residuals_by_r": by_r,
    }


def on_bound_names(law: Law, theta: np.ndarray, rtol: float = BOUND_RTOL) -> list[str]:
    """Fitted parameters (internal names mapped to public: a->A, b->B, e->E) within ``rtol`` of the box's width
    from its edge (:data:`BOUND_RTOL`)."""
    lo, hi = law.bounds()
    span = hi - lo
    pub = {"a": "A", "b": "B", "e": "E"}
    hit = (theta - lo <= rtol * span) | (hi - theta <= rtol * span)
    return [pub.get(n, n) for n, h in zip(law.names, hit, strict=True) if h]


def check_fit_args(
    *,
    starts: Any = 1,
    seed: Any = 0,
    delta: Any = 1e-3,
    B: Any = None,
    level: Any = None,
    workers: Any = None,
    B_name: str = "B",
    B_zero: str | None = None,
) -> None:
    """Refuse bad fit / bootstrap arguments before any fit is spent: ``starts`` a whole number >= 1, ``seed`` a
    whole number >= 0, ``delta`` a finite number > 0, and when given ``B`` (named ``B_name`` in the message) a whole
    number >= 1 (>= 0 when ``B_zero`` says what 0 resamples mean), ``level`` a number in (0, 1) and ``workers`` a
    whole number >= 1. NumPy integers count as whole numbers; bools do not.

    Raises:
        ValueError: the first bad argument, named, with its value and rule.
    """

    def whole(v) -> bool:
        return isinstance(v, int | np.integer) and not isinstance(v, bool)

    def real(v) -> bool:
        return isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)

    if not whole(starts) or starts < 1:
        raise ValueError(f"starts={starts!r} must be a whole number >= 1 (paper: 500)")
    if not whole(seed) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a whole number >= 0 (the RNG seed of the starts and resamples)")
    if not real(delta) or not (delta > 0 and np.isfinite(delta)):
        raise ValueError(f"delta={delta!r} must be a finite number > 0 (the Huber threshold; paper: 1e-3)")
    least = 0 if B_zero else 1
    if B is not None and (not whole(B) or B < least):
        zero = f"0: {B_zero}; " if B_zero else ""
        raise ValueError(f"{B_name}={B!r} must be a whole number >= {least} of resamples ({zero}paper: 200)")
    if level is not None and (not real(level) or not 0 < level < 1):
        raise ValueError(f"level={level!r} must be a number in (0, 1), e.g. 0.95")
    if workers is not None and (not whole(workers) or workers < 1):
        raise ValueError(f"workers={workers!r} must be a whole number >= 1 (CPUs for the bootstrap refits), e.g. 2")


def fit_data(
    law: Law,
    data: FitData,
    *,
    starts: int = 500,
    seed: int = 0,
    delta: float = 1e-3,
    grid: bool = True,
    warm: np.ndarray | None = None,
    n_polish: int = 3,
) -> FitResult:
    """Fit ``law`` to validated ``data`` (see :func:`fit_law`).

    Raises:
        ValueError: ``starts`` not a whole number >= 1, ``seed`` not one >= 0, ``delta`` not a finite number > 0
            (:func:`check_fit_args`)."""
    check_fit_args(starts=starts, seed=seed, delta=delta)
    obj = Objective(law, data.cols, delta)
    rng = np.random.default_rng(seed)
    x0 = build_starts(law, obj, starts, rng, warm=warm, grid=grid)
    out = minimize_multistart(law, obj, x0, n_polish=n_polish)
    return _fit_result(law, data, out, n_starts=int(x0.shape[0]), delta=delta)


def fit_fixed_phis(
    data: FitData,
    phis: Any,
    *,
    starts: int = 500,
    seed: int = 0,
    delta: float = 1e-3,
    grid: bool = True,
    n_polish: int = 3,
) -> list[FitResult]:
    """The restricted joint law (paper Eq. 3 with phi held fixed) fitted at each of ``phis``, in one batch.

    Equal to ``[fit_data(make_law("joint", phi), data, starts=..., seed=...) for phi in phis]`` (same starts, and
    every start row follows its own trajectory in the batched L-BFGS; only the per-call overhead is shared): the
    batched phase advances the starts of every phi together, then each phi's best end points are polished as in
    :func:`fit_data`. Used for the profile of the objective in phi (``loopscale.fit.identify.phi_profile``: its 41 fits
    of 16 runs took 2.1 s this way against 8.8 s one by one).

    Args:
        data: validated runs for the joint law (:func:`loopscale.fit.io.prepare` with a joint law).
        phis: fixed phi values (a 1-D sequence), each inside the paper's box [-3, 3].
        starts, seed, delta, grid, n_polish: as :func:`fit_data`, per phi.
    Returns:
        One :class:`FitResult` per phi, in the order of ``phis``.
    Raises:
        ValueError: ``starts`` < 1, a bad ``delta``, or a phi outside [-3, 3] or not finite.
    """
    if starts < 1:
        raise ValueError(f"starts={starts} must be >= 1 (paper: 500)")
    laws = [make_law("joint", float(phi)) for phi in np.atleast_1d(np.asarray(phis, dtype=np.float64))]
    if not laws:
        return []
    u_sets = np.concatenate([lw.log_n(np.empty((1, 0)), data.cols)[0] for lw in laws])  # (K, n)
    batch = Objective(laws[0], data.cols, delta, u_sets=u_sets)
    sets = []
    for lw in laws:  # each phi polished on its own objective, as fit_data
        ob = Objective(lw, data.cols, delta)
        sets.append((lw, ob, None, data, build_starts(lw, ob, starts, np.random.default_rng(seed), grid=grid)))
    results = _fit_batch(batch, sets, n_polish=n_polish, delta=delta)
    if any(r is None for r in results):
        raise RuntimeError("every start gave a non-finite objective; check the table's loss/N/D values")
    return results


def fit_many(
    law: Law,
    datas: list[FitData],
    seeds: list[int],
    *,
    starts: int = 500,
    delta: float = 1e-3,
    grid: bool = True,
    warm: np.ndarray | None = None,
    n_polish: int = 3,
) -> list[FitResult | None]:
    """``law`` fitted to several data sets that differ only in their losses (simulated draws of one design), in one
    batch.

    Equal to ``[fit_data(law, data, starts=starts, seed=seed, ...) for data, seed in zip(datas, seeds)]`` (each
    set's own starts from its own seed, every start row on its own trajectory in the batched L-BFGS, each set's end
    points polished as :func:`fit_data` does), with ``None`` where :func:`fit_data` raises ``RuntimeError`` (every
    start non-finite). Used by ``loopscale design``, whose simulated draws refit one design many times.

    Args:
        law: the law. datas: validated data sets (:func:`loopscale.fit.io.prepare`) with the same rows: equal ``D``
            and law columns, losses (nats/token) of their own. seeds: one start seed per data set.
        starts, delta, grid, warm, n_polish: as :func:`fit_data`, per data set.
    Returns:
        One :class:`FitResult` (or ``None``) per data set, in order.
    Raises:
        ValueError: ``starts`` < 1, as many seeds as data sets not given, or data sets whose columns other than
            ``loss`` differ.
    """
    if starts < 1:
        raise ValueError(f"starts={starts} must be >= 1 (paper: 500)")
    if len(seeds) != len(datas):
        raise ValueError(f"fit_many needs one seed per data set: {len(datas)} data sets, {len(seeds)} seeds")
    if not datas:
        return []
    cols = datas[0].cols
    for d in datas[1:]:
        if d.n != datas[0].n or any(not np.array_equal(d.cols[c], cols[c]) for c in ("D", *law.columns)):
            raise ValueError("fit_many: the data sets must differ only in their losses (same runs, D and law columns)")
    obj = Objective(law, cols, delta, losses=np.stack([d.cols["loss"] for d in datas]))
    sets = [(law, obj, j, d, build_starts(law, obj, starts, np.random.default_rng(s), warm=warm, wid=j, grid=grid))
            for j, (d, s) in enumerate(zip(datas, seeds, strict=True))]  # fmt: skip
    return _fit_batch(obj, sets, n_polish=n_polish, delta=delta)


def _fit_batch(
    batch: Objective, sets: list[tuple[Law, Objective, int | None, FitData, np.ndarray]], *, n_polish: int, delta: float
) -> list[FitResult | None]:
    """Fit several sets in one batch: ``sets`` holds ``(law, objective, wid, data, starts)`` per set; the starts of
    set ``j`` advance together in ``batch`` (called with ``wid = j`` on their rows), then each set's end points are
    polished on its own objective and ``wid`` (:func:`best_of_batch`). ``None`` for a set whose every start gave a
    non-finite objective."""
    wid = np.concatenate([np.full(x0.shape[0], j) for j, (*_, x0) in enumerate(sets)])
    lo, hi = sets[0][0].bounds()
    x, f, _ = batched_lbfgs(batch, np.concatenate([x0 for *_, x0 in sets]), lo, hi, wid, max_iter=MULTISTART_MAX_ITER)
    results: list[FitResult | None] = []
    for j, (law, obj, pw, data, x0) in enumerate(sets):
        rows = wid == j
        out = best_of_batch(law, obj, x[rows], f[rows], wid=pw, n_polish=n_polish)
        results.append(None if out["theta"] is None else _fit_result(law, data, out, n_starts=int(x0.shape[0]), delta=delta))
    return results


def _fit_result(law: Law, data: FitData, out: dict[str, Any], *, n_starts: int, delta: float) -> FitResult:
    """The :class:`FitResult` of a :func:`minimize_multistart` outcome ``out`` for ``law`` on ``data``."""
    if out["theta"] is None:
        raise RuntimeError("every start gave a non-finite objective; check the table's loss/N/D values")
    params = law.to_public(out["theta"])
    gd = goodness(law, params, data)
    return FitResult(
        law=law.name,
        params=params,
        objective=out["objective"],
        r2=gd["r2"],
        rmse=gd["rmse"],
        max_abs_residual=gd["max_abs_residual"],
        residuals_by_r=gd["residuals_by_r"],
        n=data.n,
        n_params=law.n_params,
        on_bound=on_bound_names(law, out["theta"]),
        n_starts_at_best=out["n_starts_at_best"],
        n_excluded=data.n_excluded,
        excluded_by_status=dict(data.excluded_by_status),
        excluded_duplicates=list(data.duplicate_run_ids),
        phi_fixed=bool(law.fixed),
        delta=float(delta),
        starts=n_starts,
        theta=tuple(float(v) for v in out["theta"]),
        data=data.frame,
    )


def fit_law(
    table: Any,
    law: str = "joint",
    phi: float | None = None,
    starts: int = 500,
    seed: int = 0,
    delta: float = 1e-3,
    grid: bool = True,
) -> FitResult:
    """Fit a scaling law to a table of runs, every row a point (paper §4.2 protocol). For the fit of ``loopscale
    fit`` (one variant, cell means of seed replicates, bootstrap and identification as ``loopscale run``) use
    :func:`loopscale.fit.table_fit.fit_table`.

    Args:
        table: path (Parquet/CSV), DataFrame or pyarrow Table with ``loss`` (or ``final_val_loss``, nats/token),
            ``D`` (tokens) and ``N`` (or ``N_unique``) for ``law="chinchilla"``, or ``N_once``, ``N_rec``, ``r`` for
            ``law="joint"``. Rows with ``status != "ok"`` are excluded and counted.
        law: ``"joint"`` (paper Eq. 3), ``"joint_per_r"`` (one phi per r > 1 of the table) or ``"chinchilla"``.
        phi: fix phi (restricted joint fit, e.g. 0 or 1); ``None`` fits it.
        starts: number of starts (paper: 500 uniform in the box; here the count also includes a few sub-fit and grid
            starts, see :func:`build_starts`).
        seed: RNG seed for the starts. delta: Huber threshold (paper 1e-3). grid: include coarse-grid starts.
    Returns:
        :class:`FitResult`.
    Raises:
        ValueError: bad table (see :func:`loopscale.fit.io.prepare`), unknown law, bad ``phi``/``starts``/``seed``/``delta``,
            looped runs of several variants (pooled into one law), a Chinchilla fit of one point
            (:func:`loopscale.fit.table_fit.check_per_run_table`).
    Warns:
        PerRunFitWarning: seed replicates that ``loopscale fit`` fits as cell means; a Chinchilla table with one N
            or one D.
    """
    check_fit_args(starts=starts, seed=seed, delta=delta)
    if law == "joint_per_r":  # one phi for each r > 1 the table holds (the table read once, validated twice)
        table = read_table(table)
        rs = np.unique(prepare(table, make_law("joint", 0.5)).cols["r"])  # phi fixed: no r check yet
        if not (rs > 1).any():
            raise ValueError(
                f"law='joint_per_r' fits one phi per looped r > 1; the table holds only r={[int(v) for v in rs]}; "
                "use law='chinchilla'"
            )
        check_per_r_anchor(rs)
        lw = make_law(law, rs=tuple(int(v) for v in rs[rs > 1]))
    else:
        lw = make_law(law, phi)
    data = prepare(table, lw)
    from loopscale.fit.table_fit import check_per_run_table

    check_per_run_table(data, lw, "fit_law")
    return fit_data(lw, data, starts=starts, seed=seed, delta=delta, grid=grid)
