"""The looped (depth-recurrent) decoder: embedding -> prelude -> shared block x r -> coda -> head.

Everything in one file, in the order data flows (Schwethelm, Rueckert & Kaissis 2026, arXiv 2604.21106, Sec. 3 and
App. C; the facts are collected in ``docs/paper.md`` Sec. 1):

- ``RMSNorm`` (learnable weight, eps 1e-6) and ``Block``: pre-norm, causal attention with RoPE (base 10,000,
  half-split rotation) then QK-norm (weightless RMSNorm on q, k), ``scaled_dot_product_attention(is_causal=True)``,
  squared-ReLU MLP of width 4 d, no biases.
- ``LoopedLM``: ``wte`` -> ``norm_emb`` -> ``prelude`` -> e; r recurrences of the shared ``recur`` block, each
  followed by ``norm_recur``; ``coda`` -> ``norm_final`` -> ``lm_head`` -> tanh soft-cap (computed in >= fp32).
  Injection of the prelude output e into recurrence i (state h, h <- norm_recur(block(u)) after each one):

  ============= ============================== ==========
  mode          block input u                  h before 1
  ============= ============================== ==========
  linear        u = W_inject [e || h]          h = e
  additive      u = h + e                      h = 0
  passthrough   u = h                          h = e
  hyperconnect  u = alpha_i . lanes (K lanes)  lanes = (e, ..., e)
  ============= ============================== ==========

  Hyperconnections (paper App. G.2, Eq. 7): lanes <- M_i lanes + beta_i (x) s_i with s_i = norm_recur(block(u_i));
  the coda sees the lane sum.
- Truncated BPTT (App. G.1): the first ``r - bptt_k`` recurrences run under ``torch.no_grad()`` (no graph is
  built), so only the last ``bptt_k`` recurrences carry gradient; the prelude still gets gradient through e.

Parameter names (the trainer relies on them): ``wte``, ``lm_head``, ``prelude.<i>.*``, ``recur.<i>.*``,
``coda.<i>.*``, ``inject.weight`` ([d, 2d]), ``hc.alpha`` ([r, K]), ``hc.M`` ([r, K, K]), ``hc.beta`` ([r, K]),
``norm_emb.weight``, ``norm_recur.weight``, ``norm_final.weight``. Inside a block: ``n1`` / ``n2`` (norms),
``attn.c_q`` / ``c_k`` / ``c_v`` / ``c_proj``, ``mlp.c_fc`` / ``c_proj``. Q, K and V stay separate matrices (as in
the paper, so Muon orthogonalises each [d, d] matrix) but run as one fused matmul.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from loopscale.model.config import LoopedConfig

__all__ = [
    "RMSNorm",
    "Block",
    "check_token_ids",
    "HyperConnections",
    "LoopedLM",
    "LMLoss",
    "maybe_compile",
    "compile_fallback",
    "cpu_compiler",
]


class RMSNorm(nn.Module):
    """RMSNorm with a learnable weight (init 1): ``x / rms(x) * weight`` over the last dim of size ``dim``."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # weight cast to the activation dtype: under bf16 autocast (where rms_norm is not autocast) this keeps the
        # fused kernel; a no-op otherwise
        return F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), self.eps)


def rope_tables(seq_len: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE cos/sin tables, each [seq_len, head_dim // 2] float64 (angle t * base^(-2j / head_dim)).

    Kept in float64 so a float64 model is exact; ``forward`` casts them to the activation dtype.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)  # [T, hd/2]
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the last dim of x [..., T, n, hd] by cos/sin [T, 1, hd/2] (half-split RoPE)."""
    h = x.size(-1) // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


_SMALL_INT_DTYPES = (torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32)


def check_token_ids(idx: torch.Tensor, vocab_size: int) -> None:
    """Refuse token ids outside [0, vocab_size) in ``idx`` (an integer tensor of any shape), where that is cheap.

    Checked only for a CPU tensor in eager code (not while ``torch.compile`` traces the caller): there the check is
    one ``aminmax`` over the ids: measured 5.7 us for a 16 x 128 batch, about 0.01 % of a 44 ms forward +
    backward step of the cpu preset at d = 16, r = 4 (one thread; the step-time difference with and without the
    check, 300 steps each, was within the +-2 ms run-to-run noise). On a GPU it would force a device sync every step, so CUDA ids are not checked here; an
    out-of-range id there ends in the embedding's device-side assert. The trainers check their data once instead:
    ``train_run`` / ``train_ensemble`` refuse a corpus whose largest id is >= the model's vocab_size before
    training (``loopscale.model.train._prepare``).

    Raises:
        ValueError: an id < 0 or >= vocab_size; the message gives the ids' range, how many are out of range and
            vocab_size.
    """
    if idx.device.type != "cpu" or idx.numel() == 0 or torch.compiler.is_compiling():
        return
    lo, hi = (int(v) for v in torch.aminmax(idx))
    if lo < 0 or hi >= vocab_size:
        bad = int(((idx < 0) | (idx >= vocab_size)).sum())
        raise ValueError(
            f"idx holds token ids in [{lo}, {hi}], but vocab_size={vocab_size} allows only 0 <= id < {vocab_size} "
            f"({bad} of {idx.numel()} ids out of range); raise vocab_size in the config or fix the tokenizer"
        )


class Attention(nn.Module):
    """Causal multi-head self-attention with RoPE then QK-norm; x [B, T, d] -> [B, T, d]."""

    def __init__(self, d_model: int, head_dim: int, eps: float):
        super().__init__()
        self.head_dim = head_dim
        self.n_heads = d_model // head_dim
        self.eps = eps
        self.c_q = nn.Linear(d_model, d_model, bias=False)
        self.c_k = nn.Linear(d_model, d_model, bias=False)
        self.c_v = nn.Linear(d_model, d_model, bias=False)
        self.c_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        H, hd = self.n_heads, self.head_dim
        w_qkv = torch.cat((self.c_q.weight, self.c_k.weight, self.c_v.weight), dim=0)  # [3d, d]
        qkv = F.linear(x, w_qkv).view(B, T, 3, H, hd)  # [B, T, 3, H, hd]
        qk = apply_rope(qkv[:, :, :2], cos.to(qkv.dtype), sin.to(qkv.dtype))  # [B, T, 2, H, hd]
        qk = F.rms_norm(qk, (hd,), eps=self.eps)  # QK-norm (no weight), after RoPE as in the paper's code
        q = qk[:, :, 0].transpose(1, 2)  # [B, H, T, hd]
        k = qk[:, :, 1].transpose(1, 2)  # [B, H, T, hd]
        v = qkv[:, :, 2].transpose(1, 2)  # [B, H, T, hd]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, hd]
        y = y.transpose(1, 2).reshape(B, T, d)  # [B, T, d]
        return self.c_proj(y)


class MLP(nn.Module):
    """Squared-ReLU MLP: x [B, T, d] -> c_proj(relu(c_fc x)^2) [B, T, d], hidden width mlp_ratio * d."""

    def __init__(self, d_model: int, mlp_ratio: int):
        super().__init__()
        self.c_fc = nn.Linear(d_model, mlp_ratio * d_model, bias=False)
        self.c_proj = nn.Linear(mlp_ratio * d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    """Pre-norm transformer block: x + Attn(n1(x)), then + MLP(n2(.)); [B, T, d] -> [B, T, d]."""

    def __init__(self, cfg: LoopedConfig):
        super().__init__()
        self.n1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg.d_model, cfg.head_dim, cfg.norm_eps)
        self.n2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg.d_model, cfg.mlp_ratio)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x), cos, sin)
        return x + self.mlp(self.n2(x))


class HyperConnections(nn.Module):
    """Per-iteration lane mixing for K hyperconnection lanes over r recurrences (paper App. G.2, Eq. 7).

    Parameters: ``alpha`` [r, K] (lanes -> block input), ``M`` [r, K, K] (lane mixing), ``beta`` [r, K]
    (block output -> lanes). Cyclic init: alpha_i = e_{i mod K}, M_i = I, beta_i = 1 (0-based iteration i).
    """

    def __init__(self, r: int, lanes: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(r, lanes))
        self.M = nn.Parameter(torch.zeros(r, lanes, lanes))
        self.beta = nn.Parameter(torch.zeros(r, lanes))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Cyclic init: alpha_i = e_{i mod K}, M_i = I, beta_i = 1."""
        r, K = self.alpha.shape
        self.alpha.zero_()
        self.alpha[torch.arange(r), torch.arange(r) % K] = 1.0
        self.M.copy_(torch.eye(K, dtype=self.M.dtype).expand(r, K, K))
        self.beta.fill_(1.0)

    def combine(self, lanes: torch.Tensor, i: int) -> torch.Tensor:
        """Block input u = sum_k alpha_i[k] lanes[k]: lanes [K, B, T, d] -> [B, T, d]."""
        return torch.einsum("k,kbtd->btd", self.alpha[i].to(lanes.dtype), lanes)

    def step(self, lanes: torch.Tensor, s: torch.Tensor, i: int) -> torch.Tensor:
        """lanes <- M_i lanes + beta_i (x) s: lanes [K, B, T, d], s [B, T, d] -> [K, B, T, d]."""
        mixed = torch.einsum("jk,kbtd->jbtd", self.M[i].to(lanes.dtype), lanes)  # [K, B, T, d]
        return mixed + self.beta[i].to(lanes.dtype)[:, None, None, None] * s.unsqueeze(0)  # [K, B, T, d]


class LoopedLM(nn.Module):
    """Looped decoder LM: prelude -> shared block x r -> coda (paper Sec. 3, App. C).

    ``forward(idx)`` maps token ids idx [B, T] (int64, T <= cfg.seq_len) to soft-capped logits [B, T, V] in
    float32 (float64 if the model is float64). Initialised in ``__init__`` with :meth:`init_weights` (``seed``).

    Hyperconnections at init (alpha_i = e_{i mod K}, M_i = I, beta_i = 1, lanes start as K copies of e): every lane
    accumulates every block output, lane_k(i) = e + s_0 + ... + s_{i-1} for all k, so the block input is
    u_i = e + sum_{j<i} s_j (a residual stream across iterations: h_0 = e, h_{i+1} = h_i + s_i, u_i = h_i) and the
    coda sees the lane sum K (e + sum_{j<r} s_j), where s_j = norm_recur(block(u_j)).

    Raises:
        ValueError: ``cfg`` is not a LoopedConfig, or ``idx`` has the wrong shape / dtype / length or (CPU, eager)
            ids outside [0, vocab_size) (see :meth:`forward`).
    """

    def __init__(self, cfg: LoopedConfig, seed: int | None = 0):
        super().__init__()
        if not isinstance(cfg, LoopedConfig):
            raise ValueError(
                f"cfg must be a LoopedConfig (see loopscale.model.preset_config), got {type(cfg)!r}"
            )
        self.cfg = cfg
        d = cfg.d_model
        with torch.random.fork_rng(devices=[]):  # torch's default layer init must not consume the global RNG
            self._build(cfg, d)
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_base)  # [T, hd/2] float64
        self.register_buffer("rope_cos", cos[:, None, None, :], persistent=False)  # [T, 1, 1, hd/2]
        self.register_buffer("rope_sin", sin[:, None, None, :], persistent=False)  # [T, 1, 1, hd/2]
        if seed is not None:
            self.init_weights(seed)

    def _build(self, cfg: LoopedConfig, d: int) -> None:
        """Create the submodules (names are a contract with the trainer, see the module docstring)."""
        self.wte = nn.Embedding(cfg.vocab_size, d)
        self.norm_emb = RMSNorm(d, cfg.norm_eps)
        self.prelude = nn.ModuleList(Block(cfg) for _ in range(cfg.n_prelude))
        self.recur = nn.ModuleList(Block(cfg) for _ in range(cfg.n_recur_block))
        self.coda = nn.ModuleList(Block(cfg) for _ in range(cfg.n_coda))
        self.inject = nn.Linear(2 * d, d, bias=False) if cfg.injection == "linear" else None
        self.hc = HyperConnections(cfg.r, cfg.hc_lanes) if cfg.injection == "hyperconnect" else None
        self.norm_recur = RMSNorm(d, cfg.norm_eps)
        self.norm_final = RMSNorm(d, cfg.norm_eps)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)

    # --- initialisation ------------------------------------------------------------------------------------

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Paper init (App. C.1): wte ~ N(0, 1); lm_head ~ N(0, 1e-3); block q, k, v, attn-proj and MLP-in
        ~ U(+-sqrt(3/d)); MLP-out ~ U(+-sqrt(3/(mlp_ratio d))); RMSNorm weights 1; W_inject = [I | 0];
        hyperconnections cyclic. Draws from a private CPU generator seeded with ``seed`` (the global RNG is
        untouched), so the same seed gives the same weights on any device (values drawn in float32, then cast to
        the parameters' dtype).
        """
        g = torch.Generator().manual_seed(int(seed))
        d = self.cfg.d_model

        def fill(p: torch.Tensor, values: torch.Tensor) -> None:
            p.copy_(values.to(device=p.device, dtype=p.dtype))

        fill(self.wte.weight, torch.randn(self.wte.weight.shape, generator=g))
        fill(self.lm_head.weight, torch.randn(self.lm_head.weight.shape, generator=g) * 1e-3)
        a = math.sqrt(3.0 / d)
        a_out = math.sqrt(3.0 / (self.cfg.mlp_ratio * d))
        for blk in (*self.prelude, *self.recur, *self.coda):
            for lin, bound in (
                (blk.attn.c_q, a),
                (blk.attn.c_k, a),
                (blk.attn.c_v, a),
                (blk.attn.c_proj, a),
                (blk.mlp.c_fc, a),
                (blk.mlp.c_proj, a_out),
            ):
                fill(lin.weight, torch.empty(lin.weight.shape).uniform_(-bound, bound, generator=g))
        for m in self.modules():
            if isinstance(m, RMSNorm):
                m.weight.fill_(1.0)
        if self.inject is not None:
            self.inject.weight.zero_()
            self.inject.weight[:, :d].copy_(torch.eye(d))
        if self.hc is not None:
            self.hc.reset_parameters()

    # --- forward, in data-flow order -------------------------------------------------------------------------

    def _inject(self, e_in: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Block input u [B, T, d] from the injected prelude term e_in and the state h (both [B, T, d]).

        ``e_in`` is W_e e for linear injection (precomputed once per forward, see :meth:`forward`) and e otherwise.
        """
        mode = self.cfg.injection
        if mode == "linear":
            d = self.cfg.d_model
            return e_in + F.linear(h, self.inject.weight[:, d:])  # W [e || h] = W_e e + W_h h
        if mode == "additive":
            return h + e_in
        return h  # passthrough

    def _recur_once(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One recurrence: the shared block then norm_recur; [B, T, d] -> [B, T, d]."""
        for blk in self.recur:
            u = blk(u, cos, sin)
        return self.norm_recur(u)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] (soft-capped, float32 or wider) for token ids idx [B, T].

        ``idx`` must be int64 (``torch.long``, what the trainer's data pipeline feeds and what the cross-entropy
        targets of :class:`LMLoss` need); int32 is refused. Ids must lie in [0, cfg.vocab_size): checked here for a
        CPU ``idx`` run eagerly (:func:`check_token_ids`), not for CUDA tensors nor inside ``torch.compile``.

        Raises:
            ValueError: idx is not a 2-D int64 tensor, T exceeds cfg.seq_len (the RoPE table length), or (CPU,
                eager) an id lies outside [0, cfg.vocab_size).
        """
        if idx.dim() != 2 or idx.dtype != torch.int64:
            raise ValueError(
                f"idx must be an int64 (torch.long) tensor of shape [B, T], got {tuple(idx.shape)} {idx.dtype}"
                + ("; convert it with idx.long()" if idx.dtype in _SMALL_INT_DTYPES else "")
            )
        B, T = idx.shape
        cfg = self.cfg
        if T > cfg.seq_len:
            raise ValueError(
                f"sequence length T={T} exceeds seq_len={cfg.seq_len}; raise seq_len in the config"
            )
        check_token_ids(idx, cfg.vocab_size)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]  # [T, 1, 1, hd/2]

        x = self.norm_emb(self.wte(idx))  # [B, T, d]
        for blk in self.prelude:
            x = blk(x, cos, sin)
        e = x  # prelude output, injected into every recurrence

        r, n_detached = cfg.r, cfg.r - cfg.bptt_k
        if self.hc is not None:  # bptt_k == r is enforced by the config
            lanes = e.unsqueeze(0).expand(cfg.hc_lanes, *e.shape)  # [K, B, T, d], K copies of e
            for i in range(r):
                s = self._recur_once(self.hc.combine(lanes, i), cos, sin)  # [B, T, d]
                lanes = self.hc.step(lanes, s, i)  # [K, B, T, d]
            h = lanes.sum(dim=0)  # [B, T, d]: the coda sees the lane sum
        else:
            h = torch.zeros_like(e) if cfg.injection == "additive" else e
            # linear injection u = W [e || h] = W_e e + W_h h: W_e e is the same in every recurrence, so it is
            # computed once (the FLOP accounting keeps the paper's 2 d^2 per recurrence; the executed cost is lower)
            e_in = (
                F.linear(e, self.inject.weight[:, : cfg.d_model]) if self.inject is not None else e
            )  # [B, T, d]
            if n_detached > 0:
                with torch.no_grad():  # truncated BPTT: no graph for the first r - bptt_k recurrences
                    for _ in range(n_detached):
                        h = self._recur_once(self._inject(e_in, h), cos, sin)
                h = h.detach()
            for _ in range(n_detached, r):
                h = self._recur_once(self._inject(e_in, h), cos, sin)

        x = h
        for blk in self.coda:
            x = blk(x, cos, sin)
        logits = self.lm_head(self.norm_final(x))  # [B, T, V]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        c = cfg.logit_softcap
        return c * torch.tanh(logits / c) if c > 0 else logits

    # --- bookkeeping ---------------------------------------------------------------------------------------

    def param_groups(self) -> dict[str, list[tuple[str, nn.Parameter]]]:
        """Parameters by optimizer role (paper Sec. 3: Muon for matrices, AdamW for the rest).

        Keys: ``"matrix"`` (2-D weights of prelude/recur/coda blocks and ``inject.weight``), ``"embedding"``
        (``wte``), ``"unembedding"`` (``lm_head``), ``"norm"`` (every RMSNorm weight), ``"hc"`` (hyperconnection
        alpha / M / beta). Every parameter lands in exactly one group, as (name, parameter) pairs.
        """
        groups: dict[str, list[tuple[str, nn.Parameter]]] = {
            k: [] for k in ("matrix", "embedding", "unembedding", "norm", "hc")
        }
        for name, p in self.named_parameters():
            if name.startswith("wte."):
                groups["embedding"].append((name, p))
            elif name.startswith("lm_head."):
                groups["unembedding"].append((name, p))
            elif name.startswith("hc."):
                groups["hc"].append((name, p))
            elif p.dim() == 1:
                groups["norm"].append((name, p))
            else:
                groups["matrix"].append((name, p))
        return groups

    def param_counts(self) -> dict[str, int]:
        """Structural counts by parameter name: ``N_once`` (prelude.*, coda.*, norm_emb/norm_recur/norm_final),
        ``N_rec`` (recur.*, inject.*, hc.*), ``N_embedding`` (wte, lm_head), ``N_unique`` and ``N_total``."""
        out = {"N_once": 0, "N_rec": 0, "N_embedding": 0}
        for name, p in self.named_parameters():
            head = name.split(".")[0]
            if head in ("wte", "lm_head"):
                out["N_embedding"] += p.numel()
            elif head in ("recur", "inject", "hc"):
                out["N_rec"] += p.numel()
            elif head in ("prelude", "coda", "norm_emb", "norm_recur", "norm_final"):
                out["N_once"] += p.numel()
            else:  # pragma: no cover - guards against a parameter added without an accounting rule
                raise ValueError(f"parameter {name!r} has no accounting rule (N_once / N_rec / N_embedding)")
        out["N_unique"] = out["N_once"] + out["N_rec"]
        out["N_total"] = out["N_unique"] + out["N_embedding"]
        assert out["N_total"] == sum(p.numel() for p in self.parameters())
        return out


class LMLoss(nn.Module):
    """The language-model loss of ``model`` as one module: ``forward(windows, reduction)`` runs the model on
    windows[:, :-1] and returns the cross-entropy of its logits against windows[:, 1:].

    Compiling this module (:func:`maybe_compile`) rather than the model alone puts the head, the soft-cap, the
    log-softmax and the NLL into one graph, so the [B, T, V] float32 logits and their log-softmax need not be
    written out and read back: measured with ``benchmarks/bench_gpu.py`` on an H200 (paper preset, s = 10, bf16,
    65,536 tokens per step; ``docs/gpu_h200/``), MFU 0.397 -> 0.429 at r = 1 and 0.424 -> 0.460 at r = 4, peak
    memory 64 -> 40 GiB and 61 -> 37 GiB.

    Args:
        model: a :class:`LoopedLM` (or any module mapping ids [B, T] to logits [B, T, V] of float32 or wider).

    ``forward(windows, reduction="mean")``: windows [B, T + 1] int64 token ids -> scalar loss in nats/token
    ('mean' over the B T targets) or nats ('sum'); float32 (float64 for a float64 model).

    Raises:
        ValueError: ``windows`` not 2-D, or shorter than 2 tokens (no target to predict: the mean would be NaN).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, windows: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if windows.dim() != 2 or windows.shape[1] < 2:
            raise ValueError(
                f"LMLoss takes windows [B, T + 1] of at least 2 tokens (inputs and their next-token targets), "
                f"got shape {tuple(windows.shape)}"
            )
        logits = self.model(windows[:, :-1])  # [B, T, V], float32 or wider
        return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten(), reduction=reduction)


def cpu_compiler() -> str | None:
    """The C++ compiler torch.compile's CPU backend (Inductor) would use, or None when it finds none.

    Inductor turns the graph into C++ and builds it with ``$CXX`` / ``g++`` / ``clang++``; without one, the first
    compiled step fails.
    """
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # noqa: BLE001 - no compiler (InvalidCxxCompiler) or an Inductor without this helper
        return None


def compile_fallback(enabled: bool, device: str | torch.device = "cpu") -> str | None:
    """Why ``maybe_compile(model, enabled, device)`` would run eager although asked to compile, or None.

    The one reason: a CPU device without a C++ compiler (:func:`cpu_compiler`). Trainers record it in the run's
    warnings.
    """
    if enabled and torch.device(device).type == "cpu" and cpu_compiler() is None:
        return (
            "compile: no C++ compiler found for torch.compile on CPU (set $CXX or install g++/clang++); "
            "trained eager"
        )
    return None


def maybe_compile(
    model: nn.Module, enabled: bool, device: str | torch.device = "cpu", **compile_kwargs
) -> nn.Module:
    """``torch.compile(model, **compile_kwargs)`` when ``enabled``, else ``model`` unchanged.

    On CPU, Inductor fuses the many small elementwise operations of a narrow model (norms, rotary, soft-cap) into
    C++ loops; it needs a C++ compiler, and without one (:func:`compile_fallback`) the model runs eager with a
    ``UserWarning`` instead of failing at its first step. The compiled wrapper shares parameters with ``model``;
    state-dict keys of ``model`` itself are unchanged.
    """
    if not enabled:
        return model
    reason = compile_fallback(enabled, device)
    if reason is not None:
        import warnings

        warnings.warn(reason, UserWarning, stacklevel=2)
        return model
    return torch.compile(model, **compile_kwargs)
