"""An independent check of the looped forward AND backward: a deliberately naive re-implementation of the paper's
looped decoder (arXiv 2604.21106, Sec. 3 and App. C) written from the equations, compared with ``LoopedLM``
logit-for-logit and gradient-for-gradient in float64.

The reference shares nothing with ``model/looped.py``: per-head Python loops, an explicit causal softmax, RoPE as
explicit 2-D rotations of (x_j, x_{j + hd/2}) pairs, RMSNorm from its definition, the injection W [e || h] as a
concatenation (the module splits it into W_e e + W_h h and precomputes W_e e), and truncated BPTT by detaching the
state after the first r - bptt_k recurrences (the module runs them under no_grad).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from loopscale.model.config import LoopedConfig, iso_depth
from loopscale.model.looped import LoopedLM


def rmsnorm(x: torch.Tensor, w, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * w over the last dim."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope_pairs(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate pairs (x_j, x_{j+hd/2}) at position t by angle t * base^(-2j/hd); x [T, hd] of one head."""
    T, hd = x.shape
    out = torch.empty_like(x)
    for j in range(hd // 2):
        theta = torch.tensor([t * base ** (-2.0 * j / hd) for t in range(T)], dtype=x.dtype)
        a, b = x[:, j], x[:, j + hd // 2]
        out[:, j] = a * torch.cos(theta) + b * torch.sin(theta)
        out[:, j + hd // 2] = b * torch.cos(theta) - a * torch.sin(theta)
    return out


def block(x: torch.Tensor, p: dict, pre: str, cfg: LoopedConfig) -> torch.Tensor:
    """One pre-norm block for one sequence x [T, d]: per-head attention (RoPE, QK-norm, causal softmax), relu^2 MLP."""
    T, d = x.shape
    hd = cfg.head_dim
    h = rmsnorm(x, p[pre + "n1.weight"], cfg.norm_eps)
    q, k, v = (h @ p[pre + f"attn.c_{c}.weight"].T for c in "qkv")  # [T, d] each
    heads = []
    for i in range(d // hd):
        sl = slice(i * hd, (i + 1) * hd)
        qi = rmsnorm(rope_pairs(q[:, sl], cfg.rope_base), 1.0, cfg.norm_eps)
        ki = rmsnorm(rope_pairs(k[:, sl], cfg.rope_base), 1.0, cfg.norm_eps)
        scores = qi @ ki.T / math.sqrt(hd)  # [T, T]
        causal = torch.tensor([[s <= t for s in range(T)] for t in range(T)])
        scores = torch.where(causal, scores, torch.tensor(float("-inf"), dtype=x.dtype))
        att = torch.exp(scores - scores.max(-1, keepdim=True).values)
        heads.append((att / att.sum(-1, keepdim=True)) @ v[:, sl])
    x = x + torch.cat(heads, dim=-1) @ p[pre + "attn.c_proj.weight"].T
    h = rmsnorm(x, p[pre + "n2.weight"], cfg.norm_eps)
    return x + torch.clamp(h @ p[pre + "mlp.c_fc.weight"].T, min=0) ** 2 @ p[pre + "mlp.c_proj.weight"].T


def reference_logits(p: dict, cfg: LoopedConfig, idx: torch.Tensor) -> torch.Tensor:
    """Soft-capped logits [B, T, V] of the looped decoder from a parameter dict, one sequence at a time."""
    eps, d = cfg.norm_eps, cfg.d_model
    outs = []
    for seq in idx:
        x = rmsnorm(p["wte.weight"][seq], p["norm_emb.weight"], eps)
        for i in range(cfg.n_prelude):
            x = block(x, p, f"prelude.{i}.", cfg)
        e = x
        h = torch.zeros_like(e) if cfg.injection == "additive" else e
        for it in range(cfg.r):
            if it == cfg.r - cfg.bptt_k > 0:
                h = h.detach()  # truncated BPTT: no gradient through the earlier recurrences
            if cfg.injection == "linear":
                u = torch.cat([e, h], dim=-1) @ p["inject.weight"].T  # W [e || h], W [d, 2d]
            elif cfg.injection == "additive":
                u = h + e
            else:
                u = h
            for j in range(cfg.n_recur_block):
                u = block(u, p, f"recur.{j}.", cfg)
            h = rmsnorm(u, p["norm_recur.weight"], eps)
        x = h
        for i in range(cfg.n_coda):
            x = block(x, p, f"coda.{i}.", cfg)
        z = rmsnorm(x, p["norm_final.weight"], eps) @ p["lm_head.weight"].T
        outs.append(cfg.logit_softcap * torch.tanh(z / cfg.logit_softcap))
    assert d == cfg.d_model
    return torch.stack(outs)


CASES = [
    (1, "passthrough", None),
    (2, "linear", None),
    (4, "linear", None),
    (4, "additive", None),
    (4, "passthrough", None),
    (4, "linear", 2),  # truncated BPTT: gradient through the last 2 of 4 recurrences only
]


@pytest.mark.parametrize("r,injection,bptt_k", CASES)
def test_looped_forward_and_backward_match_naive_reference(r, injection, bptt_k):
    """LoopedLM == naive reference: logits to 1e-10 and every parameter's gradient to 1e-9 (float64), on weights
    moved off their init (so W_h != 0 and every norm weight matters) — the loop really feeds its state back."""
    cfg = iso_depth(
        16, r, effective_depth=6, n_prelude=1, n_coda=1, injection=injection, bptt_k=bptt_k,
        vocab_size=32, seq_len=8, head_dim=8,
    )
    m = LoopedLM(cfg, seed=3).double()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    tgt = idx.roll(-1, 1)

    ref_p = {n: t.detach().clone().requires_grad_(True) for n, t in m.named_parameters()}
    ref = reference_logits(ref_p, cfg, idx)
    out = m(idx)
    assert (out - ref).abs().max().item() < 1e-10
    assert ref.abs().max().item() > 1e-2

    F.cross_entropy(ref.flatten(0, 1), tgt.flatten()).backward()
    F.cross_entropy(out.flatten(0, 1), tgt.flatten()).backward()
    worst = 0.0
    for n, p in m.named_parameters():
        assert p.grad is not None and ref_p[n].grad is not None, n
        scale = max(1.0, ref_p[n].grad.abs().max().item())
        worst = max(worst, (p.grad - ref_p[n].grad).abs().max().item() / scale)
    assert worst < 1e-9
    # the recurrent block really receives gradient (through every recurrence with full BPTT)
    assert m.recur[0].attn.c_q.weight.grad.abs().max().item() > 1e-6


def test_reference_detects_a_wrong_recurrence_count():
    """The reference is sharp enough to fail: a model looping r = 2 differs from the reference at r = 4."""
    cfg4 = iso_depth(16, 4, effective_depth=6, n_prelude=1, n_coda=1, vocab_size=32, seq_len=8, head_dim=8)
    m = LoopedLM(cfg4, seed=3).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    idx = torch.randint(0, 32, (1, 8), generator=torch.Generator().manual_seed(2))
    p = {n: t.detach() for n, t in m.named_parameters()}
    wrong = LoopedConfig(**{**cfg4.to_dict(), "r": 2, "bptt_k": None})
    assert (reference_logits(p, wrong, idx) - m(idx)).abs().max().item() > 1e-3
