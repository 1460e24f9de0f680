"""Optimizers and learning-rate schedules of the single-run trainer.

* ``"adamw"`` (default for the CPU presets): one ``torch.optim.AdamW``, every group at the peak ``lr``,
  betas (0.9, 0.95), eps 1e-8; weight decay only on the 2-D block matrices.
* ``"muon"`` (plain Muon; the paper uses its hyperball form, ``"muonh"`` below): ``torch.optim.Muon`` (Nesterov momentum 0.95,
  5 Newton-Schulz steps) on every 2-D matrix of the blocks and ``W_inject``, ``lr`` is the Muon LR; AdamW
  (betas (0.8, 0.95), eps 1e-10, no weight decay) on embedding, unembedding, norms and hyperconnection scalars
  at the paper's LR ratios to the Muon base 0.014 (embedding 0.3, unembedding 0.004, norm 0.005, hc 0.01; see
  ``docs/paper.md`` Sec. 3) times the muP width factor (d / 640) ** -0.5. So ``lr = 0`` freezes
  every parameter, and LR tuning moves one number.
* ``"muonh"`` (the paper's actual optimizer, "MuonH" = Muon on the hyperball; the authors' released code and
  arXiv 2603.28743): like ``"muon"`` (same groups and AdamW ratios), but each matrix W lives on the Frobenius
  sphere of its initial norm: the orthogonalised Nesterov update O is rescaled to ``||O||_F = ||W_0||_F``,
  ``W <- W - lr O``, then W is projected back to ``||W||_F = ||W_0||_F`` (:class:`MuonH`). No weight decay (a
  first-order no-op on the sphere; a ``weight_decay`` above 0 is refused). Plain Muon lets matrix norms grow
  without bound; on the sphere the relative step size stays ``lr`` for the whole run.
* Orthogonalisation (``orthogonalization``, both Muon forms): ``"newton_schulz"`` (default; torch's 5 quintic
  steps with fixed coefficients) or ``"polar_express"`` (the paper's: Polar Express, arXiv 2505.16932, 5 steps
  with per-step coefficients, :func:`loopscale.model.muon.polar_express_batched`).
* ``batched_muon=True`` (default) uses :class:`loopscale.model.muon.BatchedMuon`, the same update as
  ``torch.optim.Muon`` (tested to 1e-5) with Newton-Schulz batched over same-shaped matrices, and over the member
  dimension of an ensemble (matrices [k, m, n]); ``False`` uses ``torch.optim.Muon`` itself (2-D matrices only).
  With ``"muonh"`` the batched form is :class:`loopscale.model.muon.BatchedMuonH` (equal to :class:`MuonH` per
  matrix, tested), and ``False`` uses :class:`MuonH`.
* Zero norms: torch 2.13's Muon normalises the update by ``max(||G||_F, eps)`` before Newton-Schulz
  (``torch/optim/_muon.py``), so a zero gradient (e.g. a zero-initialised projection) gives a zero update, not
  NaN. :func:`build_optimizers` relies on that and ``test_norm_preserving_optimizer_zero_norm`` checks it.

Schedules (``lr_multiplier``): ``linear`` = the paper's (no warmup, linear decay from 1 toward ``final_lr_frac``,
which it reaches one step after the last: lrm(it) = p + f (1 - p), p = (N - it) / N, so the last step, it = N - 1,
trains at f + (1 - f) / N); ``cosine`` = linear warmup then cosine to
``final_lr_frac``; ``wsd`` = warmup, constant, then linear decay over the last ``decay_frac`` of the steps toward ``final_lr_frac``,
reached one step after the last, as ``linear``.
"""

from __future__ import annotations

import math

import torch

from loopscale.model.muon import (
    ORTHOGONALIZATIONS,
    POLAR_EXPRESS_COEFFICIENTS,
    POLAR_EXPRESS_SAFETY,
    BatchedMuon,
    BatchedMuonH,
)

SCHEDULES = ("linear", "cosine", "wsd")
OPTIMIZERS = ("adamw", "muon", "muonh")

MUON_BASE_LR = 0.014
"""Paper's Muon base LR; the AdamW groups keep the paper's ratios to it in ``muon`` mode."""

PAPER_ADAMW_LR = {"embedding": 0.3, "unembedding": 0.004, "norm": 0.005, "hc": 0.01}
"""Paper AdamW base LRs (at d = 640) for the non-matrix groups in ``muon`` mode."""


def lr_multiplier(
    step: int,
    total_steps: int,
    schedule: str,
    warmup_frac: float,
    final_lr_frac: float,
    decay_frac: float = 0.2,
) -> float:
    """LR multiplier in [0, 1] for optimizer step ``step`` (0-based) of ``total_steps``.

    Raises:
        ValueError: unknown schedule (valid: 'linear', 'cosine', 'wsd'), total_steps < 1, step outside
            [0, total_steps), or a fraction outside its range (as ``TrainConfig`` checks them: warmup_frac in
            [0, 1), final_lr_frac in [0, 1], decay_frac in (0, 1]).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if not 0 <= step < total_steps:
        raise ValueError(f"step must be in [0, total_steps) = [0, {total_steps}), got {step}")
    for name, value, ok, rng in (
        ("warmup_frac", warmup_frac, 0 <= warmup_frac < 1, "[0, 1)"),
        ("final_lr_frac", final_lr_frac, 0 <= final_lr_frac <= 1, "[0, 1]"),
        ("decay_frac", decay_frac, 0 < decay_frac <= 1, "(0, 1]"),
    ):
        if not ok:
            raise ValueError(f"{name} must be in {rng}, got {value!r}")
    n, f = total_steps, final_lr_frac
    w = int(round(warmup_frac * n))
    if step < w:
        return (step + 1) / w
    if schedule == "linear":
        p = (n - step) / (n - w)
        return p + f * (1 - p)
    if schedule == "cosine":
        t = (step - w) / max(1, n - w - 1)
        return f + (1 - f) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    n_decay = max(1, int(round(decay_frac * n)))
    start = n - n_decay
    if step < start:
        return 1.0
    p = (n - step) / n_decay
    return p + f * (1 - p)


def _adamw(param_groups: list[dict], **kwargs) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with its fused kernel (one kernel for all parameters) where torch has one for the
    parameters' device and dtype, else its default implementation; the two agree to float rounding.

    On CPU the default is a Python loop over parameters, which at the CPU preset's widths costs more than the
    arithmetic: one step of the d = 32 model's 85 parameters took 2.1 ms with it and 0.42 ms fused (CPU time, one
    thread); its 25 non-matrix parameters in Muon mode 0.58 -> 0.15 ms.
    """
    params = [p for g in param_groups for p in g["params"]]
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(param_groups, fused=fused or None, **kwargs)


def build_optimizers(
    model: torch.nn.Module,
    optimizer: str,
    lr: float,
    weight_decay: float = 0.0,
    *,
    batched_muon: bool = True,
    orthogonalization: str = "newton_schulz",
    matrix_lr_factor: float = 1.0,
) -> tuple[list[torch.optim.Optimizer], dict[str, list[str]]]:
    """Optimizers for ``model`` (a ``LoopedLM`` or ``EnsembleLM``: uses its ``param_groups()``) and which
    parameters each got. Muon takes the ``"matrix"`` group's matrices ([m, n], or [k, m, n] in an ensemble).
    ``orthogonalization`` (``"newton_schulz"`` | ``"polar_express"``, see :data:`loopscale.model.muon.
    ORTHOGONALIZATIONS`) is how ``muon`` / ``muonh`` orthogonalise their update; ``adamw`` ignores it.
    ``matrix_lr_factor`` multiplies the Muon / MuonH matrix LR only (the AdamW groups keep their ratios to ``lr``):
    the paper's data transfer (D / D_ref)^-0.32 of the Muon LR (``docs/paper.md`` Sec. 3).

    Every param group carries ``"name"`` (role) and ``"base_lr"`` (peak LR); the trainer sets
    ``group["lr"] = group["base_lr"] * lr_multiplier(...)`` before each step.

    Returns:
        (optimizers, assignment) where assignment maps ``"muon"`` / ``"adamw"`` to parameter names.

    Raises:
        ValueError: unknown optimizer (valid: 'adamw', 'muon', 'muonh') or orthogonalization, lr < 0 or
            weight_decay < 0; weight_decay > 0 with ``muonh`` (it has none: the sphere keeps every norm); an
            ensemble (``EnsembleLM``) with ``batched_muon=False``; ``muon`` with ``batched_muon=False`` and
            Polar Express (``torch.optim.Muon`` has only Newton-Schulz); ``matrix_lr_factor`` not finite and
            > 0, or other than 1 with ``adamw``.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if orthogonalization not in ORTHOGONALIZATIONS:
        raise ValueError(f"orthogonalization must be one of {ORTHOGONALIZATIONS}, got {orthogonalization!r}")
    if not lr >= 0 or not weight_decay >= 0:
        raise ValueError(f"lr and weight_decay must be >= 0, got lr={lr}, weight_decay={weight_decay}")
    if not (math.isfinite(matrix_lr_factor) and matrix_lr_factor > 0):
        raise ValueError(f"matrix_lr_factor must be a finite number > 0, got {matrix_lr_factor}")
    if optimizer == "adamw" and matrix_lr_factor != 1:
        raise ValueError("matrix_lr_factor scales the Muon matrix LR; 'adamw' takes only 1 (scale lr instead)")
    if optimizer == "muonh" and weight_decay > 0:
        raise ValueError(
            f"weight_decay={weight_decay} with optimizer 'muonh': MuonH has no weight decay (every matrix stays on "
            "the sphere of its initial norm, where decay is a first-order no-op); use weight_decay 0, or 'muon' "
            "or 'adamw' for decay"
        )
    groups = model.param_groups()
    assignment: dict[str, list[str]] = {"muon": [], "adamw": []}
    if optimizer == "adamw":
        pg = []
        for role, items in groups.items():
            if items:
                pg.append(
                    {
                        "params": [p for _, p in items],
                        "name": role,
                        "base_lr": lr,
                        "lr": lr,
                        "weight_decay": weight_decay if role == "matrix" else 0.0,
                    }
                )
                assignment["adamw"] += [n for n, _ in items]
        return [_adamw(pg, lr=lr, betas=(0.9, 0.95), eps=1e-8)], assignment

    d = model.cfg.d_model
    mup = (d / 640) ** -0.5
    mat_ndim = 2 + getattr(model, "member_dims", 0)  # an ensemble's parameters carry a leading member dim
    matrices = [(n, p) for n, p in groups["matrix"] if p.ndim == mat_ndim]
    rest = {role: list(items) for role, items in groups.items() if role != "matrix"}
    rest["norm"] = rest.get("norm", []) + [(n, p) for n, p in groups["matrix"] if p.ndim != mat_ndim]
    opts: list[torch.optim.Optimizer] = []
    if matrices and optimizer == "muonh":
        if not batched_muon and mat_ndim != 2:
            raise ValueError("an ensemble's stacked matrices need batched_muon=True")
        muonh_cls = BatchedMuonH if batched_muon else MuonH
        m_lr = lr * matrix_lr_factor
        opts.append(
            muonh_cls(
                [{"params": [p for _, p in matrices], "name": "matrix", "base_lr": m_lr, "lr": m_lr}],
                lr=m_lr,
                orthogonalization=orthogonalization,
            )
        )
        assignment["muon"] = [n for n, _ in matrices]
    elif matrices:
        if not batched_muon and mat_ndim != 2:
            raise ValueError("an ensemble's stacked matrices need batched_muon=True")
        if not batched_muon and orthogonalization != "newton_schulz":
            raise ValueError("torch.optim.Muon (batched_muon=False) has Newton-Schulz only; use batched_muon=True")
        muon_kwargs = {"orthogonalization": orthogonalization} if batched_muon else {}
        muon_cls = BatchedMuon if batched_muon else torch.optim.Muon
        m_lr = lr * matrix_lr_factor
        opts.append(
            muon_cls(
                [{"params": [p for _, p in matrices], "name": "matrix", "base_lr": m_lr, "lr": m_lr}],
                lr=m_lr,
                weight_decay=weight_decay,
                momentum=0.95,
                nesterov=True,
                ns_steps=5,
                **muon_kwargs,
            )
        )
        assignment["muon"] = [n for n, _ in matrices]
    pg = []
    for role, items in rest.items():
        if items:
            g_lr = lr * PAPER_ADAMW_LR[role] / MUON_BASE_LR * mup
            pg.append(
                {
                    "params": [p for _, p in items],
                    "name": role,
                    "base_lr": g_lr,
                    "lr": g_lr,
                    "weight_decay": 0.0,
                }
            )
            assignment["adamw"] += [n for n, _ in items]
    if pg:
        opts.append(_adamw(pg, lr=lr, betas=(0.8, 0.95), eps=1e-10))
    return opts, assignment


def _polar_express(g: torch.Tensor, steps: int) -> torch.Tensor:
    """Polar Express orthogonalisation of one matrix ``g`` [A, B] (arXiv 2505.16932, Algorithm 1; returned in
    :data:`loopscale.model.muon.NS_DTYPE`, bf16, shape [A, B]): X = bf16(g), transposed when A > B, X <- X / (1.02 ||X||_F + 1e-6), then ``steps``
    quintic steps with the coefficients of :data:`loopscale.model.muon.POLAR_EXPRESS_COEFFICIENTS`."""
    from loopscale.model import muon

    x = g.to(muon.NS_DTYPE)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.mT
    x = x / (x.norm() * POLAR_EXPRESS_SAFETY + 1e-6)
    for a, b, c in POLAR_EXPRESS_COEFFICIENTS[:steps]:
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


class MuonH(torch.optim.Optimizer):
    """Muon on the hyperball ("MuonH"): the paper's matrix optimizer (Sec. 3 and the authors' code).

    Per 2-D parameter W [A, B] with gradient G: Nesterov momentum (``buf <- lerp(buf, G, 1 - momentum)``,
    ``U = lerp(G, buf, momentum)``), orthogonalisation of U (``orthogonalization="newton_schulz"``: ``ns_steps``
    quintic iterations with the coefficients of ``torch.optim.Muon``; ``"polar_express"``, the paper's: Polar
    Express, arXiv 2505.16932, at most 5 steps), rescaling to ``||O||_F = ||W_0||_F`` (the norm of W at its first
    step, cached), ``W <- W - lr O`` and projection back to ``||W||_F = ||W_0||_F``. ``lr`` is therefore the
    relative Frobenius step per optimizer step.

    Raises:
        ValueError: lr < 0, momentum outside [0, 1), ns_steps < 1 (or > 5 with Polar Express), an unknown
            ``orthogonalization``, or a parameter that is not 2-D (at step) /
            has zero norm at its first step (the sphere would be a point; the paper initialises every matrix
            with a non-zero norm for this reason).
    """

    def __init__(self, params, lr: float = MUON_BASE_LR, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, orthogonalization: str = "newton_schulz"):
        if not lr >= 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if int(ns_steps) < 1:
            raise ValueError(f"ns_steps must be >= 1, got {ns_steps}")
        if orthogonalization not in ORTHOGONALIZATIONS:
            raise ValueError(f"orthogonalization must be one of {ORTHOGONALIZATIONS}, got {orthogonalization!r}")
        if orthogonalization == "polar_express" and int(ns_steps) > len(POLAR_EXPRESS_COEFFICIENTS):
            raise ValueError(f"Polar Express runs 1 to {len(POLAR_EXPRESS_COEFFICIENTS)} steps, got ns_steps={ns_steps}")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=int(ns_steps),
                                      orthogonalization=orthogonalization))

    @torch.no_grad()
    def step(self, closure=None):
        """One MuonH step for every parameter with a gradient; returns ``closure()`` if given."""
        from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, EPS, _zeropower_via_newtonschulz

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mom = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.ndim != 2:
                    raise ValueError(f"MuonH takes 2-D matrices only, got a parameter of shape {tuple(p.shape)}")
                st = self.state[p]
                if not st:
                    st["momentum_buffer"] = torch.zeros_like(p)
                    st["p_norm"] = p.norm()
                    if not float(st["p_norm"]) > 0:
                        raise ValueError(
                            f"MuonH needs a matrix with non-zero norm at its first step (shape {tuple(p.shape)})"
                        )
                buf = st["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mom)
                u = p.grad.lerp(buf, mom) if group["nesterov"] else buf
                if group.get("orthogonalization", "newton_schulz") == "polar_express":
                    o = _polar_express(u, group["ns_steps"])
                else:
                    o = _zeropower_via_newtonschulz(u, (DEFAULT_A, DEFAULT_B, DEFAULT_C), group["ns_steps"], EPS)
                o_norm = o.norm()
                if float(o_norm) > 0:  # a zero gradient gives a zero update, not NaN
                    p.sub_(o, alpha=float(lr * st["p_norm"] / o_norm))
                    p.mul_(st["p_norm"] / p.norm().clamp_min(1e-12))
        return loss


__all__ = ["MUON_BASE_LR", "MuonH", "OPTIMIZERS", "PAPER_ADAMW_LR", "SCHEDULES", "build_optimizers", "lr_multiplier"]
