"""Optimizers and learning-rate schedules of the single-run trainer.

* ``"adamw"`` (default for the CPU presets): one ``torch.optim.AdamW``, every group at the peak ``lr``,
  betas (0.9, 0.95), eps 1e-8; weight decay only on the 2-D block matrices.
* ``"muon"`` (paper Sec. 3, "MuonH" approximated by plain Muon): ``torch.optim.Muon`` (Nesterov momentum 0.95,
  5 Newton-Schulz steps) on every 2-D matrix of the blocks and ``W_inject``, ``lr`` is the Muon LR; AdamW
  (betas (0.8, 0.95), eps 1e-10, no weight decay) on embedding, unembedding, norms and hyperconnection scalars
  at the paper's LR ratios to the Muon base 0.014 (embedding 0.3, unembedding 0.004, norm 0.005, hc 0.01; see
  ``docs/paper.md`` Sec. 3) times the muP width factor (d / 640) ** -0.5. So ``lr = 0`` freezes
  every parameter, and LR tuning moves one number.
* Zero norms: torch 2.13's Muon normalises the update by ``max(||G||_F, eps)`` before Newton-Schulz
  (``torch/optim/_muon.py``), so a zero gradient (e.g. a zero-initialised projection) gives a zero update, not
  NaN. :func:`build_optimizers` relies on that and ``test_norm_preserving_optimizer_zero_norm`` checks it.

Schedules (``lr_multiplier``): ``linear`` = the paper's (no warmup, linear decay from 1 to ``final_lr_frac`` at
the last step: lrm(it) = p + f (1 - p), p = (N - it) / N); ``cosine`` = linear warmup then cosine to
``final_lr_frac``; ``wsd`` = warmup, constant, then linear decay to ``final_lr_frac`` over the last ``decay_frac``.
"""

from __future__ import annotations

import math

import torch

SCHEDULES = ("linear", "cosine", "wsd")
OPTIMIZERS = ("adamw", "muon")

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
        ValueError: unknown schedule (valid: 'linear', 'cosine', 'wsd') or total_steps < 1.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
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


def build_optimizers(
    model: torch.nn.Module, optimizer: str, lr: float, weight_decay: float = 0.0
) -> tuple[list[torch.optim.Optimizer], dict[str, list[str]]]:
    """Optimizers for ``model`` (a ``LoopedLM``: uses its ``param_groups()``) and which parameters each got.

    Every param group carries ``"name"`` (role) and ``"base_lr"`` (peak LR); the trainer sets
    ``group["lr"] = group["base_lr"] * lr_multiplier(...)`` before each step.

    Returns:
        (optimizers, assignment) where assignment maps ``"muon"`` / ``"adamw"`` to parameter names.

    Raises:
        ValueError: unknown optimizer (valid: 'adamw', 'muon'), lr < 0 or weight_decay < 0.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if not lr >= 0 or not weight_decay >= 0:
        raise ValueError(f"lr and weight_decay must be >= 0, got lr={lr}, weight_decay={weight_decay}")
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
        return [torch.optim.AdamW(pg, lr=lr, betas=(0.9, 0.95), eps=1e-8)], assignment

    d = model.cfg.d_model
    mup = (d / 640) ** -0.5
    matrices = [(n, p) for n, p in groups["matrix"] if p.ndim == 2]
    rest = {role: list(items) for role, items in groups.items() if role != "matrix"}
    rest["norm"] = rest.get("norm", []) + [(n, p) for n, p in groups["matrix"] if p.ndim != 2]
    opts: list[torch.optim.Optimizer] = []
    if matrices:
        opts.append(
            torch.optim.Muon(
                [{"params": [p for _, p in matrices], "name": "matrix", "base_lr": lr, "lr": lr}],
                lr=lr,
                weight_decay=weight_decay,
                momentum=0.95,
                nesterov=True,
                ns_steps=5,
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
        opts.append(torch.optim.AdamW(pg, lr=lr, betas=(0.8, 0.95), eps=1e-10))
    return opts, assignment


__all__ = ["MUON_BASE_LR", "OPTIMIZERS", "PAPER_ADAMW_LR", "SCHEDULES", "build_optimizers", "lr_multiplier"]
