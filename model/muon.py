"""Batched Muon: ``torch.optim.Muon``'s update with Newton-Schulz run over all same-shaped matrices at once.

At the CPU preset's widths (d = 16-48) ``torch.optim.Muon`` spends most of its time in per-matrix overhead: it runs
5 Newton-Schulz iterations (3 small matmuls each) matrix by matrix. :class:`BatchedMuon` does the same arithmetic,
per matrix, but groups the matrices by shape (a [m, n] matrix with m > n is transposed first, as Muon does, so
[4d, d] and [d, 4d] share a group) and runs each group as batched matmuls (``torch.baddbmm``). Parameters may carry
leading dimensions (``[..., m, n]``, e.g. the member dimension of :class:`loopscale.model.ensemble.EnsembleLM`):
every trailing [m, n] slice is a separate matrix, normalised and orthogonalised on its own, never across slices.

Per matrix the update is exactly torch 2.13's (``torch/optim/_muon.py``, after Keller Jordan's Muon):

* momentum buffer B <- mu B + (1 - mu) G (``lerp``), Nesterov update U = G + mu (B - G) (``G.lerp(B, mu)``);
* X = bf16(U) (transposed when m > n), X <- X / max(||X||_F, eps), then ``ns_steps`` times
  A = X X^T, B' = b A + c A A, X <- a X + B' X with (a, b, c) = (3.4445, -4.7750, 2.0315), all in bf16;
* W <- W (1 - lr lambda) - lr sqrt(max(1, m / n)) X (the "original" LR adjustment).

State (``"momentum_buffer"`` per parameter) and hyperparameters are the same as ``torch.optim.Muon``'s, so a
checkpointed optimizer state loads into either.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

__all__ = ["BatchedMuon", "BatchedMuonH", "newton_schulz_batched"]

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""Quintic Newton-Schulz coefficients (a, b, c) of torch 2.13's Muon (``torch/optim/_muon.py``)."""


def newton_schulz_batched(
    x: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> torch.Tensor:
    """Approximate orthogonalisation of every matrix in ``x`` [N, m, n] with m <= n (bf16 in, bf16 out).

    Each x[i] is divided by max(||x[i]||_F, eps), then ``ns_steps`` quintic iterations
    X <- a X + (b A + c A^2) X with A = X X^T (torch 2.13 ``_zeropower_via_newtonschulz``, batched).

    Raises:
        ValueError: x is not 3-D, m > n, or ns_steps >= 100.
    """
    if x.dim() != 3 or x.size(1) > x.size(2):
        raise ValueError(f"x must be [N, m, n] with m <= n, got {tuple(x.shape)}")
    if ns_steps >= 100:
        raise ValueError("ns_steps must be < 100")
    a, b, c = ns_coefficients
    norm = torch.linalg.vector_norm(x, dim=(1, 2), keepdim=True)  # [N, 1, 1]
    x = x / norm.clamp(min=eps)
    for _ in range(ns_steps):
        gram = torch.bmm(x, x.mT)  # [N, m, m]
        upd = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, upd, x, beta=a)
    return x


class BatchedMuon(torch.optim.Muon):
    """Muon (momentum + Newton-Schulz orthogonalisation) over parameters of shape [..., m, n], batched by shape.

    Same arguments and defaults as ``torch.optim.Muon`` (lr 1e-3, weight_decay 0.1, momentum 0.95, Nesterov,
    5 NS steps, eps 1e-7, ``adjust_lr_fn`` None/'original' or 'match_rms_adamw'); see the module docstring for
    the update. One step gives the same parameters as ``torch.optim.Muon`` applied to each [m, n] slice
    separately (tested to 1e-5). A subclass of ``torch.optim.Muon`` (same state and hyperparameters, so
    ``isinstance`` checks and checkpoints carry over) that only replaces ``step`` and accepts [..., m, n]
    parameters (``torch.optim.Muon.__init__`` would refuse those, so ``Optimizer.__init__`` is called directly).

    Raises:
        ValueError: a parameter with fewer than 2 dimensions, a negative lr / momentum / weight_decay, or an
            unknown ``adjust_lr_fn``.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
    ) -> None:
        if not lr >= 0 or not momentum >= 0 or not weight_decay >= 0:
            raise ValueError(
                f"lr, momentum and weight_decay must be >= 0, got {lr}, {momentum}, {weight_decay}"
            )
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(
                f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}"
            )
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_coefficients=tuple(ns_coefficients),
            eps=eps,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
        )
        torch.optim.Optimizer.__init__(self, params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() < 2:
                    raise ValueError(
                        f"BatchedMuon needs parameters of shape [..., m, n], got {tuple(p.shape)}"
                    )

    @staticmethod
    def _lr_ratio(adjust_lr_fn: str | None, m: int, n: int) -> float:
        """LR factor of one [m, n] matrix (torch 2.13 ``_adjust_lr``)."""
        if adjust_lr_fn in (None, "original"):
            return math.sqrt(max(1.0, m / n))
        return 0.2 * math.sqrt(max(m, n))

    @torch.no_grad()
    def step(self, closure=None):
        """One Muon step for every parameter with a gradient (grouped by matrix shape)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            bufs = []
            for p in params:
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                bufs.append(st["momentum_buffer"])
            mu = group["momentum"]
            torch._foreach_lerp_(bufs, grads, 1 - mu)
            updates = torch._foreach_lerp(grads, bufs, mu) if group["nesterov"] else bufs
            # group by the (m <= n) matrix shape after Muon's transpose of tall matrices
            by_shape: dict[tuple[int, int, torch.dtype, torch.device], list[int]] = defaultdict(list)
            for i, p in enumerate(params):
                m, n = p.shape[-2:]
                by_shape[(min(m, n), max(m, n), p.dtype, p.device)].append(i)
            for (m_, n_, dtype, _), idx in by_shape.items():
                mats = []
                for i in idx:
                    u = updates[i].reshape(-1, *updates[i].shape[-2:])  # [M_i, m, n]
                    mats.append(u.mT if u.size(1) > u.size(2) else u)
                x = torch.cat(mats, 0).bfloat16()  # [sum M_i, m_, n_]
                x = newton_schulz_batched(x, group["ns_coefficients"], group["ns_steps"], group["eps"])
                x = x.to(dtype)  # exact (bf16 -> fp32); one conversion for the group instead of one per parameter
                ps = [params[i] for i in idx]
                outs = [
                    (o.mT if p.size(-2) > p.size(-1) else o).reshape(p.shape)
                    for p, o in zip(ps, x.split([p.numel() // (m_ * n_) for p in ps]), strict=True)
                ]
                self._apply_group(ps, outs, group)
        return loss

    def _apply_group(self, ps: list[torch.Tensor], os: list[torch.Tensor], group: dict) -> None:
        """W <- W (1 - lr lambda) - lr ratio O for parameters ``ps`` of one shape group and their orthogonalised
        updates ``os`` (same shapes): ``torch._foreach_*`` calls per LR ratio (a [m, n] and a transposed [n, m]
        matrix share a group but not their ratio) instead of two ops per matrix; the same arithmetic per
        matrix as ``torch.optim.Muon``."""
        lr, wd = group["lr"], group["weight_decay"]
        by_ratio: dict[float, list[int]] = defaultdict(list)
        for j, p in enumerate(ps):
            by_ratio[self._lr_ratio(group["adjust_lr_fn"], p.size(-2), p.size(-1))].append(j)
        if wd:
            torch._foreach_mul_(ps, 1 - lr * wd)
        for ratio, js in by_ratio.items():
            torch._foreach_add_([ps[j] for j in js], [os[j] for j in js], alpha=-lr * ratio)


class BatchedMuonH(BatchedMuon):
    """MuonH (Muon on the hyperball, the paper's optimizer; see :class:`loopscale.model.optim.MuonH`) batched like
    :class:`BatchedMuon`: every trailing [m, n] slice W keeps the Frobenius norm it had at its first step.

    Per slice: O (orthogonalised Nesterov update) is rescaled to ``||O||_F = ||W_0||_F``, ``W <- W - lr O``, then
    ``W <- W ||W_0||_F / ||W||_F``. No weight decay and no LR adjustment (``lr`` is the relative step). Equal to
    ``MuonH`` applied to each slice separately (tested).

    Raises:
        ValueError: as :class:`BatchedMuon`; a slice with zero norm at its first step.
    """

    def __init__(self, params, lr: float = 0.014, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5) -> None:
        super().__init__(params, lr=lr, weight_decay=0.0, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps)

    def _apply_group(self, ps: list[torch.Tensor], os: list[torch.Tensor], group: dict) -> None:
        for p, o in zip(ps, os, strict=True):
            self._apply(p, o, group)

    def _apply(self, p: torch.Tensor, o: torch.Tensor, group: dict) -> None:
        st = self.state[p]
        if "p_norm" not in st:
            st["p_norm"] = torch.linalg.vector_norm(p, dim=(-2, -1), keepdim=True)  # [..., 1, 1]
            if not bool((st["p_norm"] > 0).all()):
                raise ValueError(
                    f"MuonH needs matrices with non-zero norm at their first step (shape {tuple(p.shape)})"
                )
        p_norm = st["p_norm"]
        o = o.to(p.dtype)
        o_norm = torch.linalg.vector_norm(o, dim=(-2, -1), keepdim=True)
        scale = torch.where(o_norm > 0, p_norm / o_norm.clamp_min(1e-30), torch.zeros_like(o_norm))
        p.sub_(group["lr"] * scale * o)
        p.mul_(p_norm / torch.linalg.vector_norm(p, dim=(-2, -1), keepdim=True).clamp_min(1e-12))
