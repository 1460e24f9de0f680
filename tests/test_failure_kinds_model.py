"""Failure kind 1 of the README -- hyperconnection mixing silently dropped (lucidrains/hyper-connections #8).

At the identity init (M_i = I, beta_i = 1) a forgotten mixing step is invisible, so these tests move away from it and
compare against an independent reference of the recurrence (paper App. G.2, Eq. 7):
lanes <- M_i lanes + beta_i (x) block(alpha_i . lanes), the coda sees the lane sum.

The failure kind's description numbers iterations from 1 (beta_1, M_2); the module's tensors are 0-based, so beta_1 is ``hc.beta[0]``
and M_2 is ``hc.M[1]``. (M_3 would be a no-op test: after the last iteration a lane permutation leaves the lane
sum unchanged.)
"""

from __future__ import annotations

import pytest
import torch

from loopscale.model.config import LoopedConfig
from loopscale.model.looped import LoopedLM

CFG = LoopedConfig(
    vocab_size=64, seq_len=16, d_model=32, head_dim=16, n_prelude=1, n_recur_block=1, n_coda=1, r=3,
    injection="hyperconnect", hc_lanes=2,
)  # fmt: skip


def _model() -> LoopedLM:
    m = LoopedLM(CFG, seed=1234).double()
    # The paper's lm_head init (std 1e-3) makes logits ~1e-2 at init, which would hide any difference below 1e-3;
    # a unit-scale head makes the mixing visible in the logits without changing the recurrence under test.
    with torch.no_grad():
        m.lm_head.weight.copy_(
            torch.randn(m.lm_head.weight.shape, generator=torch.Generator().manual_seed(7))
        )
    return m


def _idx() -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (2, CFG.seq_len), generator=torch.Generator().manual_seed(3))


def _reference_logits(m: LoopedLM, idx: torch.Tensor) -> torch.Tensor:
    """Independent reference of the HC recurrence: K lanes as a Python list, explicit sums, no einsum."""
    T = idx.shape[1]
    cos, sin = m.rope_cos[:T], m.rope_sin[:T]
    x = m.norm_emb(m.wte(idx))
    for blk in m.prelude:
        x = blk(x, cos, sin)
    K = CFG.hc_lanes
    lanes = [x.clone() for _ in range(K)]  # lanes start as copies of the prelude output e
    for i in range(CFG.r):
        alpha, M, beta = m.hc.alpha[i], m.hc.M[i], m.hc.beta[i]
        u = sum(alpha[k] * lanes[k] for k in range(K))
        for blk in m.recur:
            u = blk(u, cos, sin)
        s = m.norm_recur(u)
        lanes = [sum(M[j, k] * lanes[k] for k in range(K)) + beta[j] * s for j in range(K)]
    x = sum(lanes)  # the coda sees the lane sum
    for blk in m.coda:
        x = blk(x, cos, sin)
    z = m.lm_head(m.norm_final(x))
    c = CFG.logit_softcap
    return c * torch.tanh(z / c)


def test_hyperconnection_mixing_not_silently_dropped_every_scalar_gets_gradient():
    """(a) At the cyclic init every element of every alpha_i, M_i, beta_i gets a non-zero gradient."""
    m = _model()
    idx = _idx()
    loss = torch.nn.functional.cross_entropy(m(idx).flatten(0, 1), idx.roll(-1, 1).flatten())
    loss.backward()
    for name in ("alpha", "M", "beta"):
        g = getattr(m.hc, name).grad
        assert g is not None, f"hc.{name} got no gradient"
        assert torch.isfinite(g).all()
        assert (g.abs() > 1e-12).all(), f"hc.{name} has zero-gradient entries: {g}"


def test_hyperconnection_mixing_not_silently_dropped_swap_matches_reference():
    """(b) beta_1 = (1, 0), M_2 = swap: logits equal the reference to 1e-10 and differ from M_2 = I by > 1e-3."""
    m = _model()
    idx = _idx()
    with torch.no_grad():
        m.hc.beta[0] = torch.tensor([1.0, 0.0], dtype=torch.float64)
        y_identity = m(idx)
        m.hc.M[1] = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
        y_swap = m(idx)
        ref = _reference_logits(m, idx)
    assert y_swap.dtype == torch.float64
    assert (y_swap - ref).abs().max().item() < 1e-10
    assert (y_swap - y_identity).abs().max().item() > 1e-3


@pytest.mark.parametrize("seed", [0, 1])
def test_hyperconnection_mixing_not_silently_dropped_random_params_match_reference(seed):
    """Any alpha, M, beta (random, far from init) give the reference's logits to 1e-10."""
    m = _model()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (m.hc.alpha, m.hc.M, m.hc.beta):
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
        y = m(_idx())
        ref = _reference_logits(m, _idx())
        m.hc.reset_parameters()
        y_init = m(_idx())
    assert (y - ref).abs().max().item() < 1e-10
    assert (y - y_init).abs().max().item() > 1e-3
