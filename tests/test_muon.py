"""BatchedMuon (loopscale.model.muon) against torch.optim.Muon, matrix by matrix."""

from __future__ import annotations

import io

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
    x = torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    coeffs = (3.4445, -4.7750, 2.0315)
    o = newton_schulz_batched(x, coeffs, 5, 1e-7).float()
    sv = torch.linalg.svdvals(o)  # Muon's quintic leaves singular values roughly in (0.5, 1.5)
    assert sv.min() > 0.6 and sv.max() < 1.25
    # the same 5 quintic steps in float64 (X / ||X||_F, then X <- aX + (bA + cA^2)X with A = XX^T)
    y = x.double() / x.double().norm(dim=(-2, -1), keepdim=True).add(1e-7)
    a, b, c = coeffs
    for _ in range(5):
        A = y @ y.mT
        y = a * y + (b * A + c * A @ A) @ y
    ref = torch.linalg.svdvals(y.float())
    assert torch.allclose(sv, ref, atol=0.08)  # bf16 iterations against float64
    one = torch.linalg.svdvals(newton_schulz_batched(x, coeffs, 1, 1e-7).float())
    assert one.min() < 0.6  # one step is not orthogonal enough: the bound above can fail


def test_bad_input():
    with pytest.raises(ValueError, match="shape"):
        BatchedMuon([torch.nn.Parameter(torch.ones(4))])
    with pytest.raises(ValueError, match="m <= n"):
        newton_schulz_batched(torch.ones(2, 8, 4), (1.0, 0.0, 0.0), 1, 1e-7)


def _slices(p: torch.Tensor) -> list[torch.Tensor]:
    return list(p.detach().reshape(-1, *p.shape[-2:]).unbind(0))


def test_mixed_ranks_in_one_shape_group_and_changing_grad_subset():
    """Matrices [16, 32], [k, 32, 16] and [2, 2, 16, 32] share a shape group (stacked momentum buffers): every slice
    still gets torch.optim.Muon's update of that slice, over steps, also when one parameter has no gradient."""
    g = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in [(16, 32), (3, 32, 16), (2, 2, 16, 32)]]
    singles = [torch.nn.Parameter(s.clone()) for p in params for s in _slices(p)]
    new = BatchedMuon(params, lr=0.03, weight_decay=0.1)
    ref = torch.optim.Muon(singles, lr=0.03, weight_decay=0.1)
    for step in range(4):
        skip = 1 if step == 2 else None  # step 3: parameter 1 has no gradient (a new shape-group plan)
        for i, p in enumerate(params):
            p.grad = None if i == skip else torch.randn(p.shape, generator=g)
        slice_grads = [x for p in params for x in (_slices(p.grad) if p.grad is not None else [None] * len(_slices(p)))]
        for s, grad in zip(singles, slice_grads, strict=True):
            s.grad = None if grad is None else grad.clone()
        new.step()
        ref.step()
        got = [x for p in params for x in _slices(p)]
        for a, b in zip(got, singles, strict=True):
            torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-5)
    bufs = [x for p in params for x in _slices(new.state[p]["momentum_buffer"])]
    for a, b in zip(bufs, singles, strict=True):
        torch.testing.assert_close(a, ref.state[b]["momentum_buffer"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("target", ["batched", "torch"])
def test_state_dict_round_trip_continues_identically(target):
    """A BatchedMuon checkpoint loads into a new BatchedMuon (or torch.optim.Muon) and the next steps equal the
    uninterrupted optimizer's: the momentum buffers (views of stacked tensors inside BatchedMuon) are saved with
    their values and re-stacked after loading."""
    shapes = [(16, 16), (64, 16), (16, 64), (16, 16)]
    a_p, b_p = _pair(shapes)
    kw = dict(lr=0.02, weight_decay=0.1)
    a = BatchedMuon(a_p, **kw)
    g = torch.Generator().manual_seed(4)
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(4)]
    for t in range(2):
        for p, gr in zip(a_p, grads[t], strict=True):
            p.grad = gr.clone()
        a.step()
    with torch.no_grad():
        for p, q in zip(b_p, a_p, strict=True):
            p.copy_(q)
    b = (BatchedMuon if target == "batched" else torch.optim.Muon)(b_p, **kw)
    ckpt = io.BytesIO()  # through torch.save / torch.load, as the trainer's checkpoints (load_state_dict alone
    torch.save(a.state_dict(), ckpt)  # would share a's buffer tensors with b)
    ckpt.seek(0)
    b.load_state_dict(torch.load(ckpt))
    for t in range(2, 4):
        for ps in (a_p, b_p):
            for p, gr in zip(ps, grads[t], strict=True):
                p.grad = gr.clone()
        a.step()
        b.step()
    for p, q in zip(a_p, b_p, strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-5)
        torch.testing.assert_close(b.state[q]["momentum_buffer"], a.state[p]["momentum_buffer"], rtol=0, atol=1e-6)
