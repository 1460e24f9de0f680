"""BatchedMuon (loopscale.model.muon) against torch.optim.Muon, matrix by matrix."""

from __future__ import annotations

import pytest
import torch

from loopscale.model.muon import BatchedMuon, newton_schulz_batched


def _pair(shapes, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    a = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    return a, b


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_batched_muon_equals_torch_muon_over_steps(nesterov, weight_decay):
    shapes = [(16, 16), (64, 16), (16, 64), (16, 16), (32, 64), (48, 48)]
    ref_p, new_p = _pair(shapes)
    kw = dict(lr=0.02, weight_decay=weight_decay, momentum=0.95, nesterov=nesterov)
    ref, new = torch.optim.Muon(ref_p, **kw), BatchedMuon(new_p, **kw)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):  # several steps: the momentum buffers must agree too
        for a, b in zip(ref_p, new_p, strict=True):
            grad = torch.randn(a.shape, generator=g)
            a.grad, b.grad = grad.clone(), grad.clone()
        ref.step()
        new.step()
        for a, b in zip(ref_p, new_p, strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
            torch.testing.assert_close(
                new.state[b]["momentum_buffer"], ref.state[a]["momentum_buffer"], rtol=0, atol=1e-6
            )
    # the step moved the parameters by a Muon-sized amount (the test can fail: not an identity update)
    assert max((a - b0).abs().max().item() for a, b0 in zip(ref_p, _pair(shapes)[0], strict=True)) > 1e-3


def test_batched_muon_member_dim_is_per_matrix():
    """A [k, m, n] parameter is k independent matrices: each slice gets torch.optim.Muon's update of that slice."""
    k = 3
    g = torch.Generator().manual_seed(2)
    stacked = torch.nn.Parameter(torch.randn(k, 32, 16, generator=g))
    singles = [torch.nn.Parameter(stacked.detach()[i].clone()) for i in range(k)]
    grad = torch.randn(k, 32, 16, generator=g) * torch.tensor([1.0, 100.0, 1e-3])[:, None, None]
    stacked.grad = grad.clone()
    for i, p in enumerate(singles):
        p.grad = grad[i].clone()
    BatchedMuon([stacked], lr=0.05, weight_decay=0.0).step()
    torch.optim.Muon(singles, lr=0.05, weight_decay=0.0).step()
    for i in range(k):
        torch.testing.assert_close(stacked.detach()[i], singles[i].detach(), rtol=0, atol=1e-5)


def test_zero_gradient_gives_zero_update():
    p = torch.nn.Parameter(torch.ones(8, 8))
    p.grad = torch.zeros(8, 8)
    BatchedMuon([p], lr=0.1, weight_decay=0.0).step()
    assert torch.equal(p.detach(), torch.ones(8, 8))


def test_newton_schulz_orthogonalises():
    x = torch.randn(4, 16, 64).bfloat16()
    o = newton_schulz_batched(x, (3.4445, -4.7750, 2.0315), 5, 1e-7).float()
    sv = torch.linalg.svdvals(o)  # Muon's quintic leaves singular values roughly in (0.5, 1.5)
    assert sv.min() > 0.3 and sv.max() < 1.6


def test_bad_input():
    with pytest.raises(ValueError, match="shape"):
        BatchedMuon([torch.nn.Parameter(torch.ones(4))])
    with pytest.raises(ValueError, match="m <= n"):
        newton_schulz_batched(torch.ones(2, 8, 4), (1.0, 0.0, 0.0), 1, 1e-7)
