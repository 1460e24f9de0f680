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


@pytest.mark.parametrize("orthogonalization", ["newton_schulz", "polar_express"])
def test_batched_muonh_equals_muonh_per_slice(orthogonalization, monkeypatch):
    """BatchedMuonH on stacked [k, m, n] parameters (and mixed shapes) == MuonH on each [m, n] slice over 3 steps,
    to the bf16 rounding of Newton-Schulz (both orthogonalise in bf16, batched vs one matrix at a time): the
    difference is < 2 % of the distance travelled, and each slice keeps its own norm (gradient scales 1e-3..1e3)."""
    from loopscale.model import muon
    from loopscale.model.muon import BatchedMuonH

    if orthogonalization == "polar_express":
        # its first coefficients (8.2, -22.5, 15.9) amplify bf16 rounding (batched baddbmm vs one matrix's ops) to
        # ~7 % of a step after 3 steps; in fp32 the two forms must agree as Newton-Schulz's do in bf16
        monkeypatch.setattr(muon, "NS_DTYPE", torch.float32)
    g = torch.Generator().manual_seed(7)
    shapes = [(3, 8, 16), (3, 16, 8), (3, 8, 8)]
    stacked = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    singles = [[torch.nn.Parameter(p.detach()[i].clone()) for i in range(s[0])] for p, s in zip(stacked, shapes, strict=True)]
    start = [p.detach().clone() for p in stacked]
    ob = BatchedMuonH(stacked, lr=0.05, orthogonalization=orthogonalization)
    os_ = [MuonH(ps, lr=0.05, orthogonalization=orthogonalization) for ps in singles]
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


def _polar_express_reference(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Polar Express for one matrix, written here from the paper's Algorithm 1 (arXiv 2505.16932) in fp64: a tall
    matrix is iterated as X <- a X + X (b A + c A^2) with A = X^T X, a wide one as X <- a X + (b A + c A^2) X with
    A = X X^T (the same map), after X <- X / (1.02 ||X||_F + 1e-6)."""
    from loopscale.model.muon import POLAR_EXPRESS_COEFFICIENTS

    x = g.double()
    x = x / (x.norm() * 1.02 + 1e-6)
    for a, b, c in POLAR_EXPRESS_COEFFICIENTS[:steps]:
        if x.size(0) > x.size(1):
            A = x.T @ x
            x = a * x + x @ (b * A + c * A @ A)
        else:
            A = x @ x.T
            x = a * x + (b * A + c * A @ A) @ x
    return x


@pytest.mark.parametrize("shape", [(16, 64), (64, 16), (24, 24)])
def test_polar_express_matches_the_papers_algorithm_and_orthogonalises_better_than_newton_schulz(shape):
    """The batched Polar Express (fp32 here; bf16 in the optimizers) equals the paper's algorithm to float rounding,
    for wide, tall and square matrices (a tall one is transposed and back), and its singular values end nearer 1
    than 5 Newton-Schulz steps': on Gaussian matrices [0.86, 1.14] against a smallest one near 0.68."""
    from loopscale.model.muon import NS_COEFFICIENTS, newton_schulz_batched, polar_express_batched
    from loopscale.model.optim import _polar_express

    g = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    ref = _polar_express_reference(g)
    tall = shape[0] > shape[1]
    x = (g.mT if tall else g)[None]
    batched = polar_express_batched(x, 5)[0]
    batched = batched.mT if tall else batched
    assert (batched.double() - ref).abs().max() < 1e-4
    one = _polar_express(g, 5).double()  # MuonH's per-matrix form, in bf16: 5-6 % off the fp64 algorithm
    assert (one - ref).norm() < 0.08 * ref.norm()
    one_bf16_cos = (one * ref).sum() / (one.norm() * ref.norm())
    assert one_bf16_cos > 0.997
    s_pe = torch.linalg.svdvals(ref)
    s_ns = torch.linalg.svdvals(newton_schulz_batched(x, NS_COEFFICIENTS, 5, 1e-7)[0])
    assert s_pe.max() < 1.15 and s_ns.min() < s_pe.min()
    if shape[0] != shape[1]:  # a square Gaussian matrix has a singular value near 0, which 5 steps cannot lift
        assert s_ns.min() < 0.8 < 0.85 < s_pe.min()
    with pytest.raises(ValueError, match="1 to 5 steps"):
        polar_express_batched(x, 6)


def test_polar_express_is_what_muonh_steps_with_and_a_zero_gradient_stays_no_update():
    """With orthogonalization='polar_express' one MuonH step moves W along -PE(G) (the first step's Nesterov
    update is G itself scaled), not along Newton-Schulz's direction; a zero gradient is still no update."""
    w = _w((8, 16), 0)
    w0 = w.detach().clone()
    grad = torch.randn(8, 16, generator=torch.Generator().manual_seed(9), dtype=w.dtype)
    w.grad = grad.clone()
    MuonH([w], lr=1e-3, momentum=0.0, orthogonalization="polar_express").step()
    step = (w0 - w.detach()).double()

    def cos(a, b):
        return float((a * b).sum() / (a.norm() * b.norm()))

    from loopscale.model.muon import NS_COEFFICIENTS, newton_schulz_batched

    ns_dir = newton_schulz_batched(grad.float()[None], NS_COEFFICIENTS, 5, 1e-7)[0].double()
    ref = _polar_express_reference(grad)
    assert cos(step, ref) > 0.99 and cos(step, ref) > cos(step, ns_dir) + 0.005
    z = _w((8, 16), 1)
    z0 = z.detach().clone()
    z.grad = torch.zeros_like(z)
    MuonH([z], lr=0.1, orthogonalization="polar_express").step()
    assert torch.equal(z.detach(), z0)
    with pytest.raises(ValueError, match="orthogonalization must be one of"):
        MuonH([w], orthogonalization="polar")


def test_muonh_refuses_weight_decay_and_adamw_refuses_an_orthogonalization():
    """MuonH has no weight decay: a run asking for one was recorded with it and trained without it; it is now
    refused by build_optimizers and by RunConfig (so by a spec, before any compute). AdamW orthogonalises nothing,
    so a Polar Express AdamW run would be recorded as something it is not."""
    from loopscale.model.config import iso_depth
    from loopscale.model.looped import LoopedLM
    from loopscale.model.train import RunConfig

    cfg = iso_depth(16, 2, effective_depth=4, n_prelude=1, n_coda=1, vocab_size=32, seq_len=8, head_dim=8)
    m = LoopedLM(cfg)
    with pytest.raises(ValueError, match="MuonH has no weight decay"):
        build_optimizers(m, "muonh", 0.02, weight_decay=0.1)
    assert build_optimizers(m, "muon", 0.02, weight_decay=0.1)[0][0].param_groups[0]["weight_decay"] == 0.1
    with pytest.raises(ValueError, match="MuonH has no weight decay"):
        RunConfig(model=cfg, tokens=64, batch_tokens=16, optimizer="muonh", weight_decay=0.1)
    with pytest.raises(ValueError, match="needs optimizer 'muon' or 'muonh'"):
        RunConfig(model=cfg, tokens=64, batch_tokens=16, optimizer="adamw", orthogonalization="polar_express")
    with pytest.raises(ValueError, match="Newton-Schulz only"):
        build_optimizers(m, "muon", 0.02, batched_muon=False, orthogonalization="polar_express")
    opts, _ = build_optimizers(m, "muon", 0.02, orthogonalization="polar_express")
    assert opts[0].param_groups[0]["orthogonalization"] == "polar_express"


def test_orthogonalization_enters_the_run_definition_only_away_from_its_default():
    """Runs recorded before the field existed trained with Newton-Schulz: their run ids and checkpoint keys must
    stay what they were (the default is left out of the definition), while a Polar Express run is another run."""
    from loopscale.model.config import iso_depth
    from loopscale.model.train import RunConfig, run_definition

    cfg = iso_depth(16, 2, effective_depth=4, n_prelude=1, n_coda=1, vocab_size=256, seq_len=8, head_dim=8)
    ns = RunConfig(model=cfg, tokens=64, batch_tokens=16, optimizer="muonh")
    pe = RunConfig(model=cfg, tokens=64, batch_tokens=16, optimizer="muonh", orthogonalization="polar_express")
    assert "orthogonalization" not in run_definition(ns)
    assert run_definition(pe)["orthogonalization"] == "polar_express"
    assert {k: v for k, v in run_definition(pe).items() if k != "orthogonalization"} == run_definition(ns)


def test_a_checkpointed_muon_state_without_the_orthogonalization_key_still_steps():
    """Optimizer states written before param groups carried ``orthogonalization`` load and step as Newton-Schulz
    (load_state_dict takes the saved group hyperparameters, which lack the key)."""
    import copy

    from loopscale.model.muon import BatchedMuon, BatchedMuonH

    for cls in (BatchedMuon, BatchedMuonH):
        w = torch.nn.Parameter(_w((8, 16), 4).float().detach())
        opt = cls([w], lr=0.01)
        w.grad = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
        opt.step()
        sd = opt.state_dict()
        old_sd = copy.deepcopy(sd)
        for grp in old_sd["param_groups"]:
            del grp["orthogonalization"]
        start = w.detach().clone()
        grad = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
        results = {}
        for name, state, method in (("old", old_sd, "polar_express"), ("ns", sd, "newton_schulz"),
                                    ("pe", sd, "polar_express")):  # fmt: skip
            q = torch.nn.Parameter(start.clone())
            o = cls([q], lr=0.01, orthogonalization=method)
            o.load_state_dict(copy.deepcopy(state))
            if name == "pe":  # the saved group says newton_schulz: switch it, as a new run's group would say
                o.param_groups[0]["orthogonalization"] = "polar_express"
            q.grad = grad.clone()
            o.step()
            results[name] = q.detach()
        assert torch.equal(results["old"], results["ns"])  # the old state stepped as Newton-Schulz
        assert not torch.equal(results["old"], results["pe"])


def test_matrix_lr_factor_scales_the_muon_groups_only():
    """The paper's data transfer moves the Muon LR alone; the AdamW groups (embedding, head, norms) keep their
    ratios to ``lr``. AdamW itself takes no factor."""
    from loopscale.model.config import iso_depth
    from loopscale.model.looped import LoopedLM

    m = LoopedLM(iso_depth(16, 2, effective_depth=4, n_prelude=1, n_coda=1, vocab_size=32, seq_len=8, head_dim=8))
    for name in ("muon", "muonh"):
        plain, _ = build_optimizers(m, name, 0.02)
        moved, _ = build_optimizers(m, name, 0.02, matrix_lr_factor=0.5)
        assert moved[0].param_groups[0]["base_lr"] == pytest.approx(0.01)
        assert plain[0].param_groups[0]["base_lr"] == pytest.approx(0.02)
        assert [g["base_lr"] for g in moved[1].param_groups] == [g["base_lr"] for g in plain[1].param_groups]
    with pytest.raises(ValueError, match="'adamw' takes only 1"):
        build_optimizers(m, "adamw", 0.02, matrix_lr_factor=0.5)
    with pytest.raises(ValueError, match="matrix_lr_factor must be a finite number > 0"):
        build_optimizers(m, "muon", 0.02, matrix_lr_factor=0.0)


def test_batched_muonh_updates_plain_tall_and_wide_matrices_of_one_group_and_resumes_exactly(monkeypatch):
    """The stacked MuonH update (one shape group's parameters stacked, rescaled and copied back at once) on 2-D
    matrices, a tall one sharing the group of two wide ones: equal to MuonH on each matrix (fp32 orthogonalisation,
    so only float rounding may differ), every norm kept; and an optimizer rebuilt from ``state_dict`` mid-training
    (the norms it keeps come from the state, not from the weights it is given) steps exactly as the one it
    replaced."""
    import copy

    from loopscale.model import muon
    from loopscale.model.muon import BatchedMuonH

    monkeypatch.setattr(muon, "NS_DTYPE", torch.float32)
    g = torch.Generator().manual_seed(11)
    shapes = [(8, 16), (16, 8), (8, 16), (12, 12)]
    batched = [torch.nn.Parameter(torch.randn(*s, generator=g) * (i + 1)) for i, s in enumerate(shapes)]
    single = [torch.nn.Parameter(p.detach().clone()) for p in batched]
    start_norms = [p.detach().norm() for p in batched]
    ob = BatchedMuonH(batched, lr=0.05, orthogonalization="polar_express")
    os_ = [MuonH([p], lr=0.05, orthogonalization="polar_express") for p in single]
    grads = [[torch.randn(*s, generator=g) * 10.0 ** (i - 1) for i, s in enumerate(shapes)] for _ in range(4)]
    for step in grads[:2]:
        for p, q, gr in zip(batched, single, step, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        ob.step()
        for o in os_:
            o.step()
    for p, q, n0 in zip(batched, single, start_norms, strict=True):
        assert (p.detach() - q.detach()).norm() < 1e-5 * n0
        assert abs(p.detach().norm() - n0) < 1e-5 * n0
    # resume: new parameters holding the weights, a new optimizer loading the state, the same next gradients
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in batched]
    orr = BatchedMuonH(resumed, lr=0.05, orthogonalization="polar_express")
    orr.load_state_dict(copy.deepcopy(ob.state_dict()))
    for step in grads[2:]:
        for p, q, gr in zip(batched, resumed, step, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        ob.step()
        orr.step()
    for p, q, n0 in zip(batched, resumed, start_norms, strict=True):
        assert torch.equal(p.detach(), q.detach())
        assert abs(q.detach().norm() - n0) < 1e-5 * n0
