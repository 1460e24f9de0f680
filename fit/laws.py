"""Scaling-law objects: parameter names, search box, prediction and the log-sum-exp (LSE) form.

Every law here has the Chinchilla shape (Hoffmann et al. 2022, Eq. 2) in which only the "model size" term differs:

    L = E + A * N_x^(-alpha) + B * D^(-beta)          (nats/token)

and is fitted in the LSE parameterisation of the paper (Schwethelm et al., arXiv 2604.21106, §4.2, Eq. 4):

    log L_hat = LSE(a - alpha * u, b - beta * log D, e),   a = log A, b = log B, e = log E, u = log N_x.

A law therefore only has to say how ``u = log N_x`` (and its derivative with respect to any extra parameters such as
``phi``) is computed from the data columns; the fitter (``loopscale.fit.fitter``) does the rest. To add a law, subclass
:class:`Law` and implement :meth:`Law.log_n`.

Internal parameter vector order (the fitter's ``theta``): ``(a, b, e, alpha, beta, *extra)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Paper's start/search box (§4.2, App. F): a, b in [-5, 35], alpha, beta in [0, 2.5], e in [-3, 2], phi in [-3, 3].
BASE_BOUNDS: dict[str, tuple[float, float]] = {
    "a": (-5.0, 35.0),
    "b": (-5.0, 35.0),
    "e": (-3.0, 2.0),
    "alpha": (0.0, 2.5),
    "beta": (0.0, 2.5),
}
PHI_BOUNDS: tuple[float, float] = (-3.0, 3.0)
BASE_NAMES: tuple[str, ...] = ("a", "b", "e", "alpha", "beta")


PUBLIC_BOUNDS: dict[str, tuple[float, float]] = {
    "E": BASE_BOUNDS["e"],
    "A": BASE_BOUNDS["a"],
    "B": BASE_BOUNDS["b"],
    "alpha": BASE_BOUNDS["alpha"],
    "beta": BASE_BOUNDS["beta"],
    "phi": PHI_BOUNDS,
}
"""The search box by public parameter name, in the fitted space: log E, log A, log B (their box is on the logs),
alpha, beta and phi as they are."""


def public_bounds(name: str) -> tuple[float, float] | None:
    """The box of public parameter ``name`` in the fitted space (:data:`PUBLIC_BOUNDS`; ``phi_<r>`` of the per-r law
    has phi's), None for another name."""
    if str(name).startswith("phi_"):
        return PHI_BOUNDS
    return PUBLIC_BOUNDS.get(name)


BOUND_RTOL = 1e-3
"""A fitted parameter, or an end of its bootstrap interval, within this fraction of its box's width from an edge
counts as on the box's edge (:func:`interval_ends_on_box`, :func:`loopscale.fit.fitter.on_bound_names`,
:func:`loopscale.fit.identify.identify`): for phi in [-3, 3] within 0.006, for alpha in [0, 2.5] within 0.0025, for
log A in [-5, 35] within 0.04. A parameter the data leave free can stop short of the edge it runs to (a phi_r of
2.9998 against 3 was seen), so the tolerance is wider than a rounding error."""


def interval_ends_on_box(ci: dict, rtol: float = BOUND_RTOL) -> dict[str, list[str]]:
    """The ends of bootstrap intervals that lie on the search box's edge (:func:`public_bounds`): ``{public name: ["lower"] / ["upper"] / both}``, in ``ci``'s order. ``ci`` maps
    public names (E, A, alpha, B, beta, phi, ...) to ``(lower, upper)`` in public units (A, B, E linear: compared
    in log space, as fitted); an end within ``rtol`` of the box's span from an edge counts. Such an end is a
    percentile of refits of which at least 2.5 % ran to the edge: the box sets it, not the data."""
    out: dict[str, list[str]] = {}
    for name, ends in (ci or {}).items():
        box = public_bounds(name)
        if box is None or ends is None or len(ends) != 2 or any(e is None for e in ends):
            continue
        lo, hi = (float(e) for e in ends)
        if name in ("E", "A", "B"):
            if lo <= 0 or hi <= 0:
                continue
            lo, hi = np.log(lo), np.log(hi)
        tol = rtol * (box[1] - box[0])
        hit = [side for side, v, edge in (("lower", lo, box[0]), ("upper", hi, box[1])) if abs(v - edge) <= tol]
        if hit:
            out[name] = hit
    return out


@dataclass(frozen=True)
class Law:
    """A Chinchilla-shaped law ``L = E + A*N_x^-alpha + B*D^-beta``; subclasses define ``N_x`` via :meth:`log_n`.

    Attributes:
        name: short identifier used in JSON output (``"chinchilla"`` or ``"joint"``).
        extra_names: names of parameters beyond ``(a, b, e, alpha, beta)`` that are fitted (e.g. ``("phi",)``).
        extra_bounds: ``(lo, hi)`` per extra parameter, same order as ``extra_names``.
        fixed: parameters held fixed (e.g. ``{"phi": 0.0}`` for the restricted joint law); reported in ``params``.
        columns: data columns the law needs besides ``loss`` and ``D``.
    """

    name: str
    extra_names: tuple[str, ...] = ()
    extra_bounds: tuple[tuple[float, float], ...] = ()
    fixed: dict[str, float] = field(default_factory=dict)
    columns: tuple[str, ...] = ("N",)

    @property
    def names(self) -> tuple[str, ...]:
        """Internal (log-space) parameter names in ``theta`` order: ``(a, b, e, alpha, beta, *extra)``."""
        return BASE_NAMES + self.extra_names

    @property
    def n_params(self) -> int:
        """Number of fitted parameters (5 for Chinchilla, 6 for the joint law with phi free, 5 with phi fixed)."""
        return len(self.names)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Box ``(lo, hi)``, each of shape ``(n_params,)``, in ``theta`` order (paper §4.2 box)."""
        lo = [BASE_BOUNDS[k][0] for k in BASE_NAMES] + [b[0] for b in self.extra_bounds]
        hi = [BASE_BOUNDS[k][1] for k in BASE_NAMES] + [b[1] for b in self.extra_bounds]
        return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)

    def log_n(self, extra: np.ndarray, data: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
        """``u = log N_x`` for a batch of parameter rows.

        Args:
            extra: shape ``(S, len(extra_names))`` extra parameters per row (may have 0 columns).
            data: column arrays of shape ``(n,)`` (float64).
        Returns:
            ``(u, du)``: ``u`` of shape ``(S, n)`` or ``(1, n)`` (broadcastable), and ``du`` of shape
            ``(S, n, len(extra_names))`` with ``d u / d extra``, or ``None`` when there are no extra parameters.
        """
        raise NotImplementedError

    def to_public(self, theta: np.ndarray) -> dict[str, float]:
        """Map one ``theta`` row (log-space) to the public dict ``E, A, alpha, B, beta[, phi]`` (linear A, B, E)."""
        t = dict(zip(self.names, np.asarray(theta, dtype=np.float64).tolist(), strict=True))
        out = {
            "E": float(np.exp(t["e"])),
            "A": float(np.exp(t["a"])),
            "alpha": float(t["alpha"]),
            "B": float(np.exp(t["b"])),
            "beta": float(t["beta"]),
        }
        for k in self.extra_names:
            out[k] = float(t[k])
        for k, v in self.fixed.items():
            out[k] = float(v)
        return out

    def from_public(self, params: dict[str, float]) -> np.ndarray:
        """Inverse of :meth:`to_public`: public dict -> ``theta`` row of shape ``(n_params,)``."""
        t = {
            "a": np.log(params["A"]),
            "b": np.log(params["B"]),
            "e": np.log(params["E"]),
            "alpha": params["alpha"],
            "beta": params["beta"],
        }
        for k in self.extra_names:
            t[k] = params[k]
        return np.asarray([t[k] for k in self.names], dtype=np.float64)

    def predict(self, params: dict[str, float], data: dict[str, np.ndarray]) -> np.ndarray:
        """Predicted loss in nats/token, shape ``(n,)``, for public ``params`` on column arrays ``data``."""
        theta = self.from_public(params)[None, :]
        u, _ = self.log_n(theta[:, 5:], data)
        logd = np.log(np.asarray(data["D"], dtype=np.float64))
        return (
            params["E"]
            + params["A"] * np.exp(-params["alpha"] * u[0])
            + params["B"] * np.exp(-params["beta"] * logd)
        )


@dataclass(frozen=True)
class ChinchillaLaw(Law):
    """Per-architecture Chinchilla law ``L = E + A*N^-alpha + B*D^-beta`` (paper §4.2; Hoffmann et al. 2022 Eq. 2).

    ``N``: unique non-embedding parameters; ``D``: training tokens; ``L``: validation loss in nats/token.
    """

    name: str = "chinchilla"
    columns: tuple[str, ...] = ("N",)

    def log_n(self, extra, data):
        return np.log(data["N"])[None, :], None


@dataclass(frozen=True)
class JointLaw(Law):
    """Joint looped law (paper Eq. 3): ``L = E + A*(N_once + r^phi * N_rec)^-alpha + B*D^-beta``.

    ``N_eff = N_once + r^phi * N_rec`` is the effective parameter count; ``phi`` is free in ``[-3, 3]`` (paper box)
    unless fixed (restricted fits phi = 0 / phi = 1, paper Table 2). ``d N_eff / d phi = r^phi * log(r) * N_rec``.
    """

    name: str = "joint"
    columns: tuple[str, ...] = ("N_once", "N_rec", "r")

    def log_n(self, extra, data):
        logr = np.log(data["r"])
        n_once, n_rec = data["N_once"], data["N_rec"]
        if not self.extra_names:
            phi = self.fixed["phi"]
            return np.log(n_once + np.exp(phi * logr) * n_rec)[None, :], None
        phi = extra[:, :1]  # (S, 1)
        rp = np.exp(phi * logr[None, :]) * n_rec[None, :]  # (S, n): r^phi * N_rec
        neff = n_once[None, :] + rp
        u = np.log(neff)
        du = (rp * logr[None, :] / neff)[:, :, None]  # (S, n, 1)
        return u, du


@dataclass(frozen=True)
class JointPerRLaw(Law):
    """The joint law with one phi per recurrence: ``L = E + A*(N_once + r^phi_r * N_rec)^-alpha + B*D^-beta``.

    Paper Eq. 3 with its single phi relaxed to ``phi_<r>`` for each r in ``rs`` (r = 1 rows need none: 1^phi = 1).
    It is the alternative the identification rule weighs the one-phi law against: where it fits the runs and the
    one-phi law does not, the r^phi form is what fails. ``d N_eff / d phi_r = r^phi_r * log(r) * N_rec`` on rows of
    that r, 0 elsewhere.
    """

    name: str = "joint_per_r"
    columns: tuple[str, ...] = ("N_once", "N_rec", "r")
    rs: tuple[int, ...] = ()

    def log_n(self, extra, data):
        r = data["r"]
        logr = np.log(r)
        member = np.stack([r == v for v in self.rs], axis=1).astype(np.float64)  # (n, k): row i has r = rs[j]
        phi = extra @ member.T  # (S, n): each row's own phi_r (0 where r is not in rs, e.g. r = 1)
        rp = np.exp(phi * logr[None, :]) * data["N_rec"][None, :]
        neff = data["N_once"][None, :] + rp
        du = (rp * logr[None, :] / neff)[:, :, None] * member[None, :, :]  # (S, n, k)
        return np.log(neff), du


def check_per_r_anchor(rs, why: str = "") -> None:
    """Refuse a ``joint_per_r`` fit of a table whose r values ``rs`` (those of its ok rows) lack r = 1: the r = 1 runs
    pin A and alpha, and without them each phi_<r> trades off with A: exactly where N_once / N_rec is one ratio on
    all the rows of that r, nearly so in an iso-depth grid whose widths change that ratio only through the embeddings
    (fits of one quality give very different phi: two seeds gave phi_2 = 3.0 and -0.55 at one objective). ``why`` is added to the r list in the message (e.g. that a
    filter kept only those).

    Raises:
        ValueError: no r = 1 in ``rs``.
    """
    rs = [int(v) for v in np.unique(np.asarray(rs, dtype=float))]
    if 1 not in rs:
        raise ValueError(f"law 'joint_per_r' fits each phi_<r> against the r = 1 runs, which the table lacks (r = {rs}"
                         f"{why}): without them every phi_<r> trades off with A (exactly where N_once / N_rec is one "
                         "ratio), and fits of one quality give very different phi; add the r = 1 runs, or fit one phi for every r with law 'joint'")  # fmt: skip


def make_law(law: str = "joint", phi: float | None = None, rs: tuple[int, ...] | None = None) -> Law:
    """Build a law by name.

    Args:
        law: ``"joint"`` (paper Eq. 3), ``"joint_per_r"`` (Eq. 3 with one phi per r, :class:`JointPerRLaw`) or
            ``"chinchilla"`` (per-architecture law).
        phi: fix phi to this value (joint law only); ``None`` fits it in ``[-3, 3]``.
        rs: the recurrences r > 1 that get their own phi (``law="joint_per_r"`` only), e.g. ``(2, 4, 8)``.
    Raises:
        ValueError: unknown law name, phi outside ``[-3, 3]``, phi given for the Chinchilla or per-r law, or
            ``rs`` missing, empty or holding an r < 2 for the per-r law.
    """
    if law == "joint_per_r":
        if phi is not None:
            raise ValueError("law='joint_per_r' fits one phi per r; phi cannot be fixed")
        if not rs or any(int(v) != v or v < 2 for v in rs) or len(set(rs)) != len(rs):
            raise ValueError(f"law='joint_per_r' needs rs: distinct integers r >= 2, got {rs!r}")
        rs = tuple(sorted(int(v) for v in rs))
        return JointPerRLaw(extra_names=tuple(f"phi_{v}" for v in rs), extra_bounds=(PHI_BOUNDS,) * len(rs), rs=rs)
    if rs is not None and law != "joint_per_r":  # said, as phi for the wrong law is: it would be dropped unseen
        raise ValueError(f"rs={rs!r} applies to law='joint_per_r' only (one phi per r); law={law!r} takes no rs")
    if law == "chinchilla":
        if phi is not None:
            raise ValueError(
                "phi applies to the joint law only; fit the joint law with phi fixed (--law joint --phi 0.5; "
                "law='joint', phi=0.5 in Python), or drop phi"
            )
        return ChinchillaLaw()
    if law == "joint":
        if phi is None:
            return JointLaw(extra_names=("phi",), extra_bounds=(PHI_BOUNDS,))
        if isinstance(phi, bool | str):  # True read as phi = 1 and '0' as 0; starts=True and B=True are refused too
            raise ValueError(f"phi={phi!r} is not a number; fix phi to a number in the paper's box [-3, 3], e.g. "
                             "phi=0.0 or phi=1.0")  # fmt: skip
        phi = float(phi)
        if not np.isfinite(phi):
            raise ValueError(f"phi={phi} is not a finite number; fix phi to a value in the paper's box [-3, 3], e.g. "
                             "phi=0.0 or phi=1.0")  # fmt: skip
        if not PHI_BOUNDS[0] <= phi <= PHI_BOUNDS[1]:
            raise ValueError(f"phi={phi} is outside the paper's box [-3, 3]; pass e.g. phi=0.0 or phi=1.0")
        return JointLaw(fixed={"phi": phi})
    raise ValueError(f"law={law!r} is unknown; valid: 'joint', 'joint_per_r' or 'chinchilla'")
