"""The looped decoder module: exact parameter counts, equivalence to a plain GPT at r = 1, causality, determinism,
truncated-BPTT gradients, the hyperconnection init path and config validation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from loopscale.model.accounting import n_embedding, n_once, n_rec, n_unique
from loopscale.model.config import LoopedConfig, iso_depth, preset_config, valid_r
from loopscale.model.looped import LoopedLM, maybe_compile

TINY = dict(vocab_size=64, seq_len=16, head_dim=16)


def tiny(r: int, injection: str | None = None, d: int = 32, **kw) -> LoopedConfig:
    """Iso-depth 6 = 1 + 4 + 1 tiny config (r in {1, 2, 4})."""
    return iso_depth(d, r, effective_depth=6, n_prelude=1, n_coda=1, injection=injection, **TINY, **kw)


def idx_batch(cfg: LoopedConfig, B: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (B, cfg.seq_len), generator=torch.Generator().manual_seed(seed))


def loss_of(m: LoopedLM, idx: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(m(idx).flatten(0, 1), idx.roll(-1, 1).flatten())


# --- parameter accounting of the instantiated module ---------------------------------------------------------

CASES = [(r, inj) for r in valid_r(10, 1, 1) for inj in ("linear", "additive", "passthrough", "hyperconnect")]
CASES = [(1, "passthrough")] + [c for c in CASES if c[0] > 1]


@pytest.mark.parametrize("r,injection", CASES)
def test_module_param_count_equals_formula(r, injection):
    """Module numel = N_unique + N_embedding, and N_once / N_rec split by parameter name equal the formulas."""
    cfg = preset_config("cpu", r=r, d_model=48, injection=injection, hc_lanes=3 if r == 4 else 2)
    m = LoopedLM(cfg, seed=None)
    counts = m.param_counts()
    assert counts["N_once"] == n_once(cfg)
    assert counts["N_rec"] == n_rec(cfg)
    assert counts["N_embedding"] == n_embedding(cfg)
    assert sum(
        p.numel() for p in m.parameters()
    ) - m.wte.weight.numel() - m.lm_head.weight.numel() == n_unique(cfg)
    groups = m.param_groups()
    names = [n for g in groups.values() for n, _ in g]
    assert sorted(names) == sorted(n for n, _ in m.named_parameters())  # each parameter in exactly one group
    assert all(p.dim() == 2 for _, p in groups["matrix"]) and all(p.dim() == 1 for _, p in groups["norm"])
    assert [n for n, _ in groups["embedding"]] == ["wte.weight"]
    assert [n for n, _ in groups["unembedding"]] == ["lm_head.weight"]
    assert len(groups["norm"]) == 2 * (cfg.n_prelude + cfg.n_recur_block + cfg.n_coda) + 3  # 2 per block + 3
    assert sorted(n for n, _ in groups["hc"]) == (
        ["hc.M", "hc.alpha", "hc.beta"] if injection == "hyperconnect" else []
    )
    assert ("inject.weight" in dict(groups["matrix"])) == (injection == "linear")
    if injection == "linear":
        assert tuple(m.inject.weight.shape) == (cfg.d_model, 2 * cfg.d_model)


def test_r3_module_count():
    """A non-power-of-two r (3 layers x 3) also counts exactly."""
    cfg = iso_depth(32, 3, effective_depth=11, n_prelude=1, n_coda=1, injection="hyperconnect", **TINY)
    counts = LoopedLM(cfg, seed=None).param_counts()
    assert (counts["N_once"], counts["N_rec"]) == (n_once(cfg), n_rec(cfg))


# --- r = 1 is a plain pre-norm GPT -------------------------------------------------------------------------


def _rms(x, w, eps=1e-6):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _plain_gpt_logits(sd: dict, cfg: LoopedConfig, idx: torch.Tensor) -> torch.Tensor:
    """A plain pre-norm GPT from a state dict: explicit masked-softmax attention, RoPE, QK-norm, relu^2 MLP."""
    B, T = idx.shape
    d, hd = cfg.d_model, cfg.head_dim
    H = d // hd
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = cfg.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = (pos * freq).to(sd["wte.weight"].dtype)  # [T, hd/2]
    cos, sin = ang.cos(), ang.sin()

    def rope(t):  # t [B, H, T, hd]
        a, b = t[..., : hd // 2], t[..., hd // 2 :]
        return torch.cat([a * cos + b * sin, b * cos - a * sin], -1)

    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = _rms(sd["wte.weight"][idx], sd["norm_emb.weight"])
    for i in range(cfg.n_recur_block):
        pre = f"recur.{i}."

        def p(n, pre=pre):
            return sd[pre + n]

        h = _rms(x, p("n1.weight"))
        q, k, v = (
            (h @ p(f"attn.c_{c}.weight").T).view(B, T, H, hd).transpose(1, 2) for c in "qkv"
        )  # [B, H, T, hd]
        q, k = _rms(rope(q), 1.0), _rms(rope(k), 1.0)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        x = x + y @ p("attn.c_proj.weight").T
        h = _rms(x, p("n2.weight"))
        x = x + torch.relu(h @ p("mlp.c_fc.weight").T).square() @ p("mlp.c_proj.weight").T
    x = _rms(_rms(x, sd["norm_recur.weight"]), sd["norm_final.weight"])
    z = x @ sd["lm_head.weight"].T
    return cfg.logit_softcap * torch.tanh(z / cfg.logit_softcap)


def test_r1_passthrough_equals_plain_gpt():
    """r = 1 (passthrough) is numerically the plain GPT built from the same weights (float64, 1e-10)."""
    cfg = tiny(1)
    m = LoopedLM(cfg, seed=5).double()
    with torch.no_grad():  # move off init (norm weights 1, tiny head) so every weight matters
        for p in m.parameters():
            p.add_(
                0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype)
            )
    idx = idx_batch(cfg)
    sd = {k: v for k, v in m.state_dict().items()}
    ref = _plain_gpt_logits(sd, cfg, idx)
    out = m(idx)
    assert out.shape == (2, cfg.seq_len, cfg.vocab_size) and out.dtype == torch.float64
    assert (out - ref).abs().max().item() < 1e-10
    assert ref.abs().max().item() > 1e-2  # the comparison is not between two near-zero tensors


# --- causality, determinism, dtypes --------------------------------------------------------------------------


@pytest.mark.parametrize("r,injection", [(1, None), (4, "linear"), (2, "additive"), (4, "hyperconnect")])
def test_causality(r, injection):
    """Changing token t never changes logits at positions < t."""
    cfg = tiny(r, injection)
    m = LoopedLM(cfg, seed=1).double()
    idx = idx_batch(cfg, B=1)
    base = m(idx)
    t = 9
    idx2 = idx.clone()
    idx2[0, t:] = (idx2[0, t:] + 1) % cfg.vocab_size
    out = m(idx2)
    assert torch.equal(out[0, :t], base[0, :t])
    assert (out[0, t:] - base[0, t:]).abs().max().item() > 0


def test_seed_determinism():
    """Same seed: bitwise-equal weights and logits; another seed: different; the global RNG is untouched."""
    cfg = tiny(2, "linear")
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a, b, c = LoopedLM(cfg, seed=11), LoopedLM(cfg, seed=11), LoopedLM(cfg, seed=12)
    assert torch.equal(torch.get_rng_state(), state)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), na
    idx = idx_batch(cfg)
    assert torch.equal(a(idx), b(idx))
    assert not torch.equal(a.recur[0].attn.c_q.weight, c.recur[0].attn.c_q.weight)


def test_paper_init_statistics():
    """App. C.1 init: wte std 1, lm_head std 1e-3, block matrices U(+-sqrt(3/d)), W_inject = [I | 0], norms 1."""
    cfg = preset_config("cpu", r=2, d_model=128)
    m = LoopedLM(cfg, seed=0)
    d = cfg.d_model
    assert m.wte.weight.std().item() == pytest.approx(1.0, rel=0.02)
    assert m.lm_head.weight.std().item() == pytest.approx(1e-3, rel=0.05)
    w = m.recur[0].attn.c_q.weight
    assert w.abs().max().item() <= math.sqrt(3 / d) and w.std().item() == pytest.approx(d**-0.5, rel=0.03)
    assert m.recur[0].mlp.c_proj.weight.abs().max().item() <= math.sqrt(3 / (4 * d))
    assert torch.equal(m.inject.weight, torch.cat([torch.eye(d), torch.zeros(d, d)], 1))
    assert torch.equal(m.norm_recur.weight, torch.ones(d))


def test_logits_softcapped_float32_and_input_checks():
    """Logits are float32, bounded by the soft-cap; bad idx raises ValueError naming the problem."""
    cfg = tiny(2, "linear", logit_softcap=0.5)
    m = LoopedLM(cfg, seed=0)
    with torch.no_grad():
        m.lm_head.weight.mul_(1e4)
    out = m(idx_batch(cfg))
    assert out.dtype == torch.float32 and out.abs().max().item() <= 0.5 and out.abs().max().item() > 0.4
    with pytest.raises(ValueError, match="seq_len"):
        m(torch.zeros(1, cfg.seq_len + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="idx"):
        m(torch.zeros(cfg.seq_len, dtype=torch.long))
    with pytest.raises(ValueError, match="LoopedConfig"):
        LoopedLM({"d_model": 32})


@pytest.mark.parametrize(
    "bad,lo,hi,n_bad",
    [(300, 300, 300, 16), (-1, -1, -1, 16), ("mixed", -3, 64, 2)],
)
def test_out_of_range_token_ids_raise_value_error_naming_vocab_size(bad, lo, hi, n_bad):
    """Ids >= vocab_size or < 0 raised the embedding's bare IndexError ('index out of range in self'); now a
    ValueError gives the ids' range, how many are out of range and vocab_size (64 here)."""
    cfg = tiny(2, "linear")
    m = LoopedLM(cfg, seed=0)
    if bad == "mixed":
        idx = torch.arange(cfg.seq_len).view(1, -1)
        idx[0, 3], idx[0, 7] = -3, cfg.vocab_size  # one below, one at the limit
    else:
        idx = torch.full((1, cfg.seq_len), bad)
    msg = rf"ids in \[{lo}, {hi}\], but vocab_size=64 allows only 0 <= id < 64 \({n_bad} of 16 ids out of range\)"
    with pytest.raises(ValueError, match=msg):
        m(idx)
    edge = torch.tensor([[0, cfg.vocab_size - 1]])  # both ends of the range are fine
    assert m(edge).shape == (1, 2, cfg.vocab_size)


def test_idx_dtype_rule_and_message_agree():
    """The message said 'must be an int64' but int32 was accepted; now int64 is the one dtype (what the trainer
    feeds and what LMLoss's cross-entropy targets need) and int32 is refused with a hint."""
    cfg = tiny(2, "linear")
    m = LoopedLM(cfg, seed=0)
    idx = idx_batch(cfg)
    with pytest.raises(ValueError, match=r"idx must be an int64 \(torch.long\).*torch.int32; convert it with"):
        m(idx.int())
    with pytest.raises(ValueError, match=r"int64.*torch.float32"):
        m(idx.float())
    assert m(idx).shape == (2, cfg.seq_len, cfg.vocab_size)


def test_bf16_autocast_cpu_close_to_fp32():
    """Under bf16 autocast the logits stay float32 and close to the fp32 ones (GPU path uses the same code)."""
    cfg = tiny(2, "linear")
    m = LoopedLM(cfg, seed=0)
    with torch.no_grad():
        m.lm_head.weight.mul_(100)
    idx = idx_batch(cfg)
    ref = m(idx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(idx)
    assert out.dtype == torch.float32
    assert (out - ref).abs().max().item() < 0.05 * ref.abs().max().item()
    assert maybe_compile(m, False) is m


def test_lm_loss_is_the_cross_entropy_of_the_next_token():
    """LMLoss(model)(windows) is the CE of model(windows[:, :-1]) against windows[:, 1:], mean and sum; its
    gradient reaches the model's parameters (it holds the model, not a copy)."""
    from loopscale.model.looped import LMLoss

    cfg = tiny(2, "linear")
    m = LoopedLM(cfg, seed=0).double()
    w = torch.randint(0, cfg.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
    logits = m(w[:, :-1])
    ref = -logits.log_softmax(-1).gather(-1, w[:, 1:, None]).squeeze(-1)  # [3, 8] nats
    loss = LMLoss(m)
    assert loss(w).item() == pytest.approx(ref.mean().item(), rel=1e-12)
    assert loss(w, "sum").item() == pytest.approx(ref.sum().item(), rel=1e-12)
    loss(w).backward()
    assert float(m.wte.weight.grad.abs().sum()) > 0
    assert [n for n, _ in loss.named_parameters()] == [f"model.{n}" for n, _ in m.named_parameters()]


# --- truncated BPTT --------------------------------------------------------------------------------------------


def _grads(m: LoopedLM) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def _last_iteration_only_grads(m: LoopedLM, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Reference: run r - 1 recurrences, detach the state, backprop through the last recurrence only."""
    m.zero_grad(set_to_none=True)
    T = idx.shape[1]
    cos, sin = m.rope_cos[:T], m.rope_sin[:T]
    e = m.norm_emb(m.wte(idx))
    for blk in m.prelude:
        e = blk(e, cos, sin)
    h = e
    for i in range(m.cfg.r):
        u = m.inject(torch.cat([e, h], -1))
        for blk in m.recur:
            u = blk(u, cos, sin)
        h = m.norm_recur(u)
        if i < m.cfg.r - 1:
            h = h.detach()
    for blk in m.coda:
        h = blk(h, cos, sin)
    z = m.lm_head(m.norm_final(h))
    z = m.cfg.logit_softcap * torch.tanh(z / m.cfg.logit_softcap)
    F.cross_entropy(z.flatten(0, 1), idx.roll(-1, 1).flatten()).backward()
    return _grads(m)


def test_bptt_k1_gradient_is_last_iteration_only():
    """bptt_k = 1: every gradient (shared block, injection, prelude via e) equals the last-iteration-only
    reference; the forward equals full BPTT's, and full BPTT's block gradient differs."""
    cfg = tiny(4, "linear", bptt_k=1)
    m = LoopedLM(cfg, seed=3).double()
    with torch.no_grad():  # non-trivial injection so that h matters
        m.inject.weight.add_(0.2 * torch.randn(m.inject.weight.shape, dtype=torch.float64))
    idx = idx_batch(cfg)
    loss = loss_of(m, idx)
    loss.backward()
    got = _grads(m)
    ref = _last_iteration_only_grads(m, idx)
    assert sorted(got) == sorted(ref)
    for n in ref:
        assert torch.allclose(got[n], ref[n], rtol=1e-9, atol=1e-12), n
    full = LoopedLM(cfg.replace(bptt_k=4), seed=None).double()
    full.load_state_dict(m.state_dict())
    full_loss = loss_of(full, idx)
    assert full_loss.item() == pytest.approx(loss.item(), abs=1e-12)
    full_loss.backward()
    g_full = full.recur[0].mlp.c_fc.weight.grad
    assert (g_full - got["recur.0.mlp.c_fc.weight"]).abs().max().item() > 1e-3 * g_full.abs().max().item()


def test_truncated_recurrences_build_no_graph():
    """The first r - bptt_k recurrences run without autograd: fewer saved tensors than full BPTT."""
    cfg = preset_config("cpu", r=8, d_model=32, bptt_k=2, seq_len=16)
    m = LoopedLM(cfg, seed=0)
    idx = torch.zeros(1, 16, dtype=torch.long)

    def n_saved(model):
        count = 0

        def pack(t):
            nonlocal count
            count += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(idx)
        return count

    full = LoopedLM(cfg.replace(bptt_k=8), seed=0)
    per_iter = (n_saved(full) - n_saved(m)) / 6
    assert per_iter > 10  # every detached iteration saves nothing (a block saves dozens of tensors)
    assert n_saved(m) < n_saved(full) * 0.5


# --- hyperconnections at init --------------------------------------------------------------------------------


@pytest.mark.parametrize("K", [2, 3])
def test_hyperconnect_init_is_cumulative_residual_path(K):
    """At init (alpha_i = e_{i mod K}, M = I, beta = 1, lanes = K copies of e) u_i = e + sum_{j<i} s_j and the coda
    sees K (e + sum_j s_j): the reference runs that single-stream recurrence (float64, 1e-10)."""
    cfg = tiny(4, "hyperconnect", hc_lanes=K)
    m = LoopedLM(cfg, seed=2).double()
    with torch.no_grad():
        m.lm_head.weight.normal_()
    idx = idx_batch(cfg)
    T = idx.shape[1]
    cos, sin = m.rope_cos[:T], m.rope_sin[:T]
    with torch.no_grad():
        h = m.norm_emb(m.wte(idx))
        for blk in m.prelude:
            h = blk(h, cos, sin)
        for _ in range(cfg.r):
            u = h
            for blk in m.recur:
                u = blk(u, cos, sin)
            h = h + m.norm_recur(u)
        x = K * h
        for blk in m.coda:
            x = blk(x, cos, sin)
        ref = 15.0 * torch.tanh(m.lm_head(m.norm_final(x)) / 15.0)
        out = m(idx)
    assert (out - ref).abs().max().item() < 1e-10
    assert ref.abs().max().item() > 0.1


# --- config validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(r=0), "r"),
        (dict(r=4, n_recur_block=2, bptt_k=0), "bptt_k"),
        (dict(r=4, n_recur_block=2, bptt_k=5), "bptt_k"),
        (dict(r=4, n_recur_block=2, injection="hyperconnect", bptt_k=2), "bptt_k"),
        (dict(r=4, n_recur_block=2, injection="hyperconnect", hc_lanes=1), "hc_lanes"),
        (dict(d_model=40, head_dim=16), "d_model"),
        (dict(r=1, injection="linear"), "injection"),
        (dict(r=2, injection="gated"), "injection"),
        (dict(d_model=0), "d_model"),
        (dict(vocab_size=-1), "vocab_size"),
        (dict(seq_len=0), "seq_len"),
        (dict(n_recur_block=0), "n_recur_block"),
        (dict(n_prelude=-1), "n_prelude"),
        (dict(head_dim=0), "head_dim"),
    ],
)
def test_config_validation_names_field(kwargs, field):
    """Each invalid combination raises ValueError whose message starts with the offending field."""
    with pytest.raises(ValueError) as ei:
        LoopedConfig(**kwargs)
    assert str(ei.value).startswith(field), str(ei.value)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "field,value",
    [
        ("rope_base", 0.0),
        ("rope_base", -1.0),
        ("rope_base", NAN),
        ("rope_base", INF),
        ("rope_base", "10000"),
        ("norm_eps", NAN),
        ("norm_eps", INF),
        ("norm_eps", 0.0),
        ("logit_softcap", NAN),
        ("logit_softcap", INF),
        ("logit_softcap", -INF),
        ("logit_softcap", -1.0),
        ("logit_softcap", None),
        ("norm_eps", True),
    ],
)
def test_config_float_fields_refuse_values_that_make_logits_nan(field, value):
    """rope_base = 0 / -1, norm_eps = NaN and logit_softcap = inf made every logit NaN, and logit_softcap = NaN
    silently turned the cap off (``c > 0`` is False for NaN): each now raises ValueError naming the field and the
    value; the message says what is allowed."""
    with pytest.raises(ValueError, match=rf"^{field} must be a finite number > 0") as ei:
        tiny(2, "linear", **{field: value})
    assert repr(value) in str(ei.value)


def test_config_float_fields_valid_edges_give_finite_logits():
    """The allowed edges still build and run: logit_softcap = 0 is 'no cap' (logits beyond any cap), a tiny
    norm_eps and a small rope_base give finite logits."""
    cfg = tiny(2, "linear", logit_softcap=0, norm_eps=1e-12, rope_base=0.5)
    m = LoopedLM(cfg, seed=0)
    with torch.no_grad():
        m.lm_head.weight.mul_(1e5)
        out = m(idx_batch(cfg))
    assert torch.isfinite(out).all() and out.abs().max().item() > 15.0


@pytest.mark.parametrize("s", [1.5, 0.5, 2.0, True, 0, -1, float("nan")])
def test_preset_config_bad_width_scale_names_width_scale(s):
    """width_scale=1.5 failed as 'd_model must be a positive integer, got 96.0' (a field the caller never set);
    now the message names width_scale and its valid values, and says which d_model to pass when 64 s is whole."""
    with pytest.raises(ValueError, match=r"^width_scale must be a positive integer s \(d_model = 64 s: 1, 2, 3") as ei:
        preset_config("cpu", r=2, width_scale=s)
    assert repr(s) in str(ei.value)
    if s == 1.5:
        assert "pass d_model=96 instead" in str(ei.value)


def test_preset_config_integer_width_scale_still_works():
    """An integer width scale (Python or numpy) gives d = 64 s as a Python int."""
    import numpy as np

    assert preset_config("cpu", r=2, width_scale=2).d_model == 128
    cfg = preset_config("cpu", r=2, width_scale=np.int64(3))
    assert cfg.d_model == 192 and type(cfg.d_model) is int


@pytest.mark.parametrize(
    "override,close",
    [("n_layer", None), ("softcap", "logit_softcap"), ("seq_length", "seq_len"), ("n_recur_block", None)],
)
def test_preset_config_unknown_override_is_a_value_error_listing_valid_names(override, close):
    """An unknown override raised a raw dataclass TypeError ('unexpected keyword argument') although the docstring
    promises ValueError; now a ValueError names it, suggests the closest valid name and lists them all."""
    with pytest.raises(ValueError, match=rf"^unknown preset_config override '{override}'") as ei:
        preset_config("cpu", r=2, d_model=32, **{override: 4})
    msg = str(ei.value)
    assert ("did you mean" in msg) == (close is not None)
    if close:
        assert f"did you mean '{close}'?" in msg
    assert "valid overrides: bptt_k, effective_depth, hc_lanes, head_dim, injection, logit_softcap" in msg
    assert "n_recur_block," not in msg  # not an override: it follows from r
    # every listed name is accepted
    from loopscale.model.config import preset_override_names

    assert preset_config("cpu", r=2, d_model=32, seq_len=64, logit_softcap=5.0, bptt_k=1).seq_len == 64
    assert "n_recur_block" not in preset_override_names() and "effective_depth" in preset_override_names()



def test_replace_r_carries_the_defaults_that_follow_r():
    """cfg.replace(r=4) of a full-BPTT r = 2 config kept bptt_k = 2 (silently truncated BPTT, 1.64e6 instead of
    2.32e6 FLOPs/token at d = 32); an r = 1 config replaced to r = 2 kept injection 'passthrough', and an r = 2
    config replaced to r = 1 raised."""
    from loopscale.model import flops_per_token, preset_config

    c2 = preset_config("cpu", r=2, d_model=32)
    c4 = c2.replace(r=4)
    assert (c4.bptt_k, c4.injection) == (4, "linear")
    same = preset_config("cpu", r=4, d_model=32).replace(n_recur_block=c2.n_recur_block)
    assert c4 == same and flops_per_token(c4) == flops_per_token(same) == 2_317_056
    c1 = c2.replace(r=1)
    assert (c1.bptt_k, c1.injection) == (1, "passthrough")
    up = preset_config("cpu", r=1, d_model=16).replace(r=2)
    assert (up.bptt_k, up.injection) == (2, "linear")
    # a chosen truncation or injection is kept
    t = preset_config("cpu", r=4, d_model=16, bptt_k=2, injection="additive").replace(r=8)
    assert (t.bptt_k, t.injection) == (2, "additive")
    assert c2.replace(r=4, bptt_k=1).bptt_k == 1
    # the layer counts stay, so the depth follows r (as the docstring says); iso_depth gives the iso-depth partner
    from loopscale.model.config import iso_depth

    plain = preset_config("cpu", r=1, d_model=16)
    assert (plain.effective_depth, plain.replace(r=4).effective_depth) == (10, 40)
    partner = iso_depth(16, 4, effective_depth=plain.effective_depth, n_prelude=1, n_coda=1)
    assert partner == preset_config("cpu", r=4, d_model=16) and partner.effective_depth == 10


def test_numpy_integers_are_taken_as_integers():
    """Values read from a DataFrame are np.int64: LoopedConfig(d_model=np.int64(64)) said 'must be a positive
    integer, got np.int64(64)', and so did preset_config's r, RunConfig's tokens and train_flops' D."""
    import numpy as np

    from loopscale.model import LoopedConfig, RunConfig, preset_config, tokens_for_flops, train_flops

    cfg = LoopedConfig(d_model=np.int64(64), r=np.int32(2))
    assert cfg == LoopedConfig(d_model=64, r=2) and type(cfg.d_model) is int
    p = preset_config("cpu", r=np.int64(4), d_model=np.int64(16))
    assert p == preset_config("cpu", r=4, d_model=16)
    rc = RunConfig(model=p, tokens=np.int64(8192))
    assert type(rc.tokens) is int and rc.tokens == 8192
    assert RunConfig(model=p, tokens=8192, compile=np.True_).compile is True  # a NumPy bool is a bool
    assert train_flops(p, np.int64(1000)) == train_flops(p, 1000)
    assert tokens_for_flops(p, np.float32(1e12), np.int64(1024)) == tokens_for_flops(p, 1e12, 1024)
    with pytest.raises(ValueError, match="d_model must be a positive integer, got True"):
        LoopedConfig(d_model=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"compile": "no"}, r"compile must be True or False, got 'no'"),
        ({"diverge_loss": True}, r"diverge_loss must be a number, got True"),
        ({"grad_clip": True}, r"grad_clip must be None or a number > 0, got True"),
        ({"warmup_frac": "x"}, r"warmup_frac must be a number, got 'x'"),
    ],
)
def test_run_config_refuses_a_wrong_type(kwargs, message):
    """compile='no' was accepted (a truthy string: the run would compile); diverge_loss=True and grad_clip=True
    were accepted; warmup_frac='x' raised a TypeError."""
    from loopscale.model import RunConfig, preset_config

    with pytest.raises(ValueError, match=message):
        RunConfig(model=preset_config("cpu", r=1, d_model=16), tokens=8192, **kwargs)


def test_valid_r_and_iso_depth_refuse_bad_depths():
    from loopscale.model import iso_depth, valid_r

    assert valid_r(10, 1, 1) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="effective_depth must be a non-negative integer, got -5"):
        valid_r(-5, 1, 1)
    with pytest.raises(ValueError, match="effective_depth must exceed n_prelude \\+ n_coda"):
        valid_r(2, 1, 1)
    with pytest.raises(ValueError, match="effective_depth must be a non-negative integer, got 10.0"):
        iso_depth(16, 2, effective_depth=10.0, n_prelude=1, n_coda=1)


def test_a_plain_model_takes_any_depth_whatever_the_presets_prelude_and_coda():
    """`loopscale model info --r 1 --effective-depth 2` said effective_depth must exceed n_prelude + n_coda (the
    preset's 1 + 1), though a plain model has neither and the cpu preset's ladder trains a 2-layer one."""
    cfg = preset_config("cpu", r=1, d_model=16, effective_depth=2)
    assert (cfg.n_prelude, cfg.n_recur_block, cfg.n_coda, cfg.effective_depth) == (0, 2, 0, 2)
    assert iso_depth(16, 1, effective_depth=1, n_prelude=1, n_coda=1).effective_depth == 1
    with pytest.raises(ValueError, match="effective_depth must be >= 1"):
        iso_depth(16, 1, effective_depth=0, n_prelude=0, n_coda=0)
    with pytest.raises(ValueError, match="effective_depth must exceed n_prelude \\+ n_coda"):
        preset_config("cpu", r=2, d_model=16, effective_depth=2)


def test_a_width_scale_that_head_dim_does_not_divide_suggests_a_width_scale():
    """`--preset paper --width-scale 1` (d = 64, head_dim 128) suggested "(try d_model=128)", a flag the user had not
    used: the message now gives the width scale that fits (and its d_model)."""
    with pytest.raises(ValueError, match=r"width_scale=1 gives d_model=64, head_dim=128 \(try width_scale=2, "
                                         r"d_model=128, or a smaller head_dim\)"):  # fmt: skip
        preset_config("paper", r=1, width_scale=1)
    with pytest.raises(ValueError, match=r"try width_scale=4, d_model=256"):
        preset_config("paper", r=1, width_scale=3, head_dim=256)
    with pytest.raises(ValueError, match=r"\(try d_model=128\)"):  # given as d_model: said as d_model
        preset_config("paper", r=1, d_model=64)
    assert preset_config("paper", r=4, width_scale=2).d_model == 128
