"""MuonH (Muon on the hyperball, the paper's matrix optimizer): norm preservation, step size, direction, zero grads."""

from __future__ import annotations

import pytest
import torch

from loopscale.model.optim import MuonH, build_optimizers


def _w(shape, seed):
    return torch.nn.Parameter(torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))


@pytest.mark.parametrize("shape", [(8, 8), (8, 16), (24, 8)])
def test_muonh_keeps_frobenius_norm_and_steps_lr_relative(shape):
    w = _w(shape, 0)
    w0 = w.detach().clone()
    opt = MuonH([w], lr=0.01, momentum=0.0)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        w.grad = torch.randn(*shape, generator=g, dtype=w.dtype)
        before = w.detach().clone()
        opt.step()
        # on the sphere of the initial norm after every step
        assert abs(w.norm().item() - w0.norm().item()) < 1e-9 * w0.norm().item()
        # the step is ~lr relative (projection shortens it by O(lr^2))
        rel = (w.detach() - before).norm().item() / w0.norm().item()
        assert 0.0095 < rel < 0.0101
    # the update is orthogonalised: singular values of the first-step update are nearly equal (NS quintic: 0.7-1.2)
    w2 = _w(shape, 0)
    opt2 = MuonH([w2], lr=1e-4, momentum=0.0)
    w2.grad = torch.randn(*shape, generator=torch.Generator().manual_seed(5), dtype=w2.dtype)
    start = w2.detach().clone()
    opt2.step()
    s = torch.linalg.svdvals(start - w2.detach())
    assert s.max() / s.min() < 2.0


def test_muonh_zero_gradient_is_no_update_and_zero_norm_matrix_refused():
    w = _w((4, 4), 2)
    w0 = w.detach().clone()
    opt = MuonH([w], lr=0.1)
    w.grad = torch.zeros_like(w)
    opt.step()
    assert torch.equal(w.detach(), w0)
    z = torch.nn.Parameter(torch.zeros(4, 4))
    z.grad = torch.ones(4, 4)
    with pytest.raises(ValueError, match="non-zero norm"):
        MuonH([z], lr=0.1).step()


def test_build_optimizers_muonh_groups_like_muon():
    from loopscale.model.config import iso_depth
    from loopscale.model.looped import LoopedLM

    m = LoopedLM(iso_depth(16, 2, effective_depth=4, n_prelude=1, n_coda=1, vocab_size=32, seq_len=8, head_dim=8))
    opts_h, a_h = build_optimizers(m, "muonh", 0.02)
    opts_m, a_m = build_optimizers(m, "muon", 0.02)
    assert a_h == a_m and "inject.weight" in a_h["muon"]
    from loopscale.model.muon import BatchedMuonH

    assert isinstance(opts_h[0], BatchedMuonH) and isinstance(opts_m[0], torch.optim.Muon)
    assert isinstance(build_optimizers(m, "muonh", 0.02, batched_muon=False)[0][0], MuonH)
    assert [g["base_lr"] for g in opts_h[1].param_groups] == [g["base_lr"] for g in opts_m[1].param_groups]


def test_batched_muonh_equals_muonh_per_slice():
    """BatchedMuonH on stacked [k, m, n] parameters (and mixed shapes) == MuonH on each [m, n] slice over 3 steps,
    to the bf16 rounding of Newton-Schulz (both orthogonalise in bf16, batched vs one matrix at a time): the
    difference is < 2 % of the distance travelled, and each slice keeps its own norm (gradient scales 1e-3..1e3)."""
    from loopscale.model.muon import BatchedMuonH

    g = torch.Generator().manual_seed(7)
    shapes = [(3, 8, 16), (3, 16, 8), (3, 8, 8)]
    stacked = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    singles = [[torch.nn.Parameter(p.detach()[i].clone()) for i in range(s[0])] for p, s in zip(stacked, shapes, strict=True)]
    start = [p.detach().clone() for p in stacked]
    ob = BatchedMuonH(stacked, lr=0.05)
    os_ = [MuonH(ps, lr=0.05) for ps in singles]
    for _ in range(3):
        for p, ps in zip(stacked, singles, strict=True):
            gr = torch.randn(p.shape, generator=g) * torch.tensor([1.0, 1e3, 1e-3])[:, None, None]
            p.grad = gr.clone()
            for i, q in enumerate(ps):
                q.grad = gr[i].clone()
        ob.step()
        for o in os_:
            o.step()
    for p, ps, p0 in zip(stacked, singles, start, strict=True):
        for i, q in enumerate(ps):
            travelled = (q.detach() - p0[i]).norm()
            assert travelled > 0.05 * p0[i].norm()
            assert (p.detach()[i] - q.detach()).norm() < 0.02 * travelled
            assert abs(p.detach()[i].norm() - p0[i].norm()) < 1e-4 * p0[i].norm()
