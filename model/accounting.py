"""Exact parameter and FLOP accounting of a looped decoder, as pure functions of its config.

Nothing here builds a module, so every function is instant even for a 1B-parameter config; the test suite checks
that :class:`loopscale.model.looped.LoopedLM` instantiates with exactly these counts.

Conventions (Schwethelm, Rueckert & Kaissis 2026, arXiv 2604.21106; the facts are collected in ``docs/paper.md`` Sec. 2):

- One transformer block holds ``(4 + 2 * mlp_ratio) * d**2`` matrix weights (q, k, v, attention out, MLP in and
  out; 12 d^2 at the paper's mlp_ratio 4) plus ``2 d`` RMSNorm weights (Sec. 3, App. C).
- ``N_once`` = prelude + coda blocks + the three model-level RMSNorm weights (``norm_emb``, ``norm_recur``,
  ``norm_final``; the authors' code counts them as run-once "scalars").
- ``N_rec`` = the shared block + the injection parameters: W_inject (2 d^2) for ``linear``, the
  ``r * (K**2 + 2K)`` hyperconnection scalars for ``hyperconnect``, nothing for ``additive``/``passthrough``
  (Sec. 3.2: "the injection counts as recurrent").
- ``N_unique = N_once + N_rec`` = every parameter except the embedding ``wte`` and unembedding ``lm_head``; with the
  norm weights included it reproduces all 44 entries of Table 6.
- Training FLOPs per token follow the authors' ``GPT.estimate_flops`` (App. G, Eq. 6 for truncated BPTT):
  ``6 (P_prelude + P_coda + V d) + (2 (r - k) + 6 k) (P_recur_block + P_inj) + 12 d T (l_pre + l_coda)
  + (4 (r - k) + 12 k) l_rec d T`` with ``k = bptt_k`` and ``P_inj`` = 2 d^2 (linear), ``(K**2 + 2K) d``
  (hyperconnect "equivalent params"), 0 otherwise. The model-level norms and the embedding lookup are not counted.
"""

from __future__ import annotations

import math

from loopscale.model.config import LoopedConfig, as_python_number

__all__ = [
    "block_params",
    "n_once",
    "n_rec",
    "n_unique",
    "n_embedding",
    "n_total",
    "flops_per_token",
    "flops_per_token_forward",
    "train_flops",
    "tokens_for_flops",
    "model_info",
]


def _check_cfg(cfg: object) -> LoopedConfig:
    """``cfg`` itself when it is a LoopedConfig.

    Raises:
        ValueError: anything else; the message names the type and, for a run config (an object with a
            LoopedConfig ``.model``) or a dict, says how to get the LoopedConfig.
    """
    if not isinstance(cfg, LoopedConfig):
        if isinstance(getattr(cfg, "model", None), LoopedConfig):
            hint = "; pass its .model (the LoopedConfig of the run)"
        elif isinstance(cfg, dict):
            hint = "; build it from a dict with LoopedConfig(**d)"
        else:
            hint = ""
        raise ValueError(
            f"cfg must be a LoopedConfig (build one with preset_config or iso_depth), got "
            f"{type(cfg).__name__}{hint}"
        )
    return cfg


def block_params(cfg: LoopedConfig) -> int:
    """Parameters of one pre-norm transformer block: ``(4 + 2 mlp_ratio) d^2`` matrices + ``2 d`` norm weights.

    Paper Sec. 3 / App. C: n_b = 12 d^2 at mlp_ratio 4 (the paper's algebra drops the 2 d norm weights; Table 6
    includes them).

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`.
    """
    cfg = _check_cfg(cfg)
    d = cfg.d_model
    return (4 + 2 * cfg.mlp_ratio) * d * d + 2 * d


def _inject_params(cfg: LoopedConfig) -> int:
    """Injection parameters that exist in the module (counted in N_rec)."""
    d = cfg.d_model
    if cfg.injection == "linear":
        return 2 * d * d
    if cfg.injection == "hyperconnect":
        k = cfg.hc_lanes
        return cfg.r * (k * k + 2 * k)
    return 0


def _inject_flop_params(cfg: LoopedConfig) -> int:
    """Injection "equivalent params" per recurrence used by the FLOP formula (authors' ``estimate_flops``)."""
    d = cfg.d_model
    if cfg.injection == "linear":
        return 2 * d * d
    if cfg.injection == "hyperconnect":
        k = cfg.hc_lanes
        return (k * k + 2 * k) * d
    return 0


def n_once(cfg: LoopedConfig) -> int:
    """N_once: unique parameters run once per token (prelude + coda blocks + 3 model-level RMSNorms), in params.

    Paper Sec. 3.2 (N_once = (l_prelude + l_coda) n_b; the authors' code adds the 3 d norm "scalars").

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`.
    """
    cfg = _check_cfg(cfg)
    return (cfg.n_prelude + cfg.n_coda) * block_params(cfg) + 3 * cfg.d_model


def n_rec(cfg: LoopedConfig) -> int:
    """N_rec: unique parameters reused by every recurrence (shared block + injection / HC scalars), in params.

    Paper Sec. 3.2: N_rec = l_recur n_b + n_i with n_i = 2 d^2 (linear injection); hyperconnections contribute
    their r (K^2 + 2K) scalars (App. G.2); additive and passthrough injection have none.

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`.
    """
    cfg = _check_cfg(cfg)
    return cfg.n_recur_block * block_params(cfg) + _inject_params(cfg)


def n_unique(cfg: LoopedConfig) -> int:
    """N_unique = N_once + N_rec: every parameter except ``wte`` and ``lm_head`` (paper Table 6's N), in params.

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`.
    """
    return n_once(cfg) + n_rec(cfg)


def n_embedding(cfg: LoopedConfig) -> int:
    """Embedding + unembedding parameters, ``2 V d`` (untied ``wte`` and ``lm_head``; excluded from N_unique).

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`.
    """
    cfg = _check_cfg(cfg)
    return 2 * cfg.vocab_size * cfg.d_model


def n_total(cfg: LoopedConfig) -> int:
    """All parameters of the module, N_unique + N_embedding, in params.

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`.
    """
    return n_unique(cfg) + n_embedding(cfg)


def flops_per_token(cfg: LoopedConfig) -> int:
    """Training FLOPs per token (forward + backward), in FLOPs/token.

    The authors' ``GPT.estimate_flops`` (paper Sec. 3.2 and App. G Eq. 6 for truncated BPTT), with k = bptt_k::

        F = 6 (P_prelude + P_coda + V d) + (2 (r - k) + 6 k) (P_recur_block + P_inj)
            + 12 d T (l_pre + l_coda) + (4 (r - k) + 12 k) l_rec d T

    P_x count every parameter of a section (block norms included); P_inj = 2 d^2 (linear),
    (K^2 + 2K) d (hyperconnect), 0 (additive, passthrough). Attention is 12 d T per executed layer with gradient
    and 4 d T per detached (forward-only) layer. Example: paper preset s = 10, r = 4 gives 1.0473e9.

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`.
    """
    cfg = _check_cfg(cfg)
    d, T, V, r, k = cfg.d_model, cfg.seq_len, cfg.vocab_size, cfg.r, cfg.bptt_k
    pb = block_params(cfg)
    once = (cfg.n_prelude + cfg.n_coda) * pb
    rec = cfg.n_recur_block * pb + _inject_flop_params(cfg)
    matmul = 6 * (once + V * d) + (2 * (r - k) + 6 * k) * rec
    attn = 12 * d * T * (cfg.n_prelude + cfg.n_coda) + (4 * (r - k) + 12 * k) * cfg.n_recur_block * d * T
    return matmul + attn


def flops_per_token_forward(cfg: LoopedConfig) -> int:
    """Forward-only FLOPs per token (inference, or one evaluation pass), in FLOPs/token.

    The forward third of :func:`flops_per_token` with every recurrence executed (paper Sec. 3.2:
    F_fwd(r) = 2 (N_once + r N_rec) + attention 4 d T per executed layer + unembedding 2 V d)::

        F_fwd = 2 (P_prelude + P_coda + V d) + 2 r (P_recur_block + P_inj) + 4 d T (l_pre + l_coda + r l_rec)

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`.
    """
    cfg = _check_cfg(cfg)
    d, T, V, r = cfg.d_model, cfg.seq_len, cfg.vocab_size, cfg.r
    pb = block_params(cfg)
    once = (cfg.n_prelude + cfg.n_coda) * pb
    rec = cfg.n_recur_block * pb + _inject_flop_params(cfg)
    return 2 * (once + V * d) + 2 * r * rec + 4 * d * T * cfg.effective_depth


def train_flops(cfg: LoopedConfig, D: int | float) -> float:
    """Training FLOPs C for D tokens: ``C = flops_per_token(cfg) * D`` (paper Sec. 2/3.2), in FLOPs.

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`, or D is not a finite number >= 0.
    """
    D = as_python_number(D)
    if isinstance(D, bool) or not isinstance(D, int | float) or not math.isfinite(D) or D < 0:
        raise ValueError(f"D (tokens) must be a finite number >= 0, got {D!r}")
    return float(flops_per_token(cfg) * D)


def tokens_for_flops(cfg: LoopedConfig, C: float, batch_tokens: int) -> int:
    """Tokens D trained for a FLOP budget C at ``batch_tokens`` tokens per optimizer step, in tokens.

    The authors' rule (paper Sec. 2, ``base_train.py``): ``steps = round(C / (F * B))`` and ``D = steps * B``,
    with F = :func:`flops_per_token`. So the same C gives looped models (larger F) slightly fewer tokens.

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`, C not a positive finite number, batch_tokens not a positive
            int, or a budget too small for one optimizer step (the message gives the smallest usable C).
    """
    C, batch_tokens = as_python_number(C), as_python_number(batch_tokens)
    if isinstance(C, bool) or not isinstance(C, int | float) or not math.isfinite(C) or C <= 0:
        raise ValueError(f"C (training FLOPs) must be a positive finite number, got {C!r}")
    if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens <= 0:
        raise ValueError(f"batch_tokens must be a positive integer, got {batch_tokens!r}")
    per_step = flops_per_token(cfg) * batch_tokens
    steps = round(C / per_step)
    if steps < 1:
        raise ValueError(
            f"C={C:.4g} FLOPs buys {C / per_step:.3f} optimizer steps of {batch_tokens} tokens; "
            f"use C >= {0.5 * per_step:.4g} or a smaller batch_tokens"
        )
    return int(steps) * batch_tokens


def model_info(cfg: LoopedConfig) -> dict:
    """JSON-serialisable summary of one config: unique parameters, FLOPs per token and layer layout.

    Keys (a public interface of ``loopscale model info --json``): ``N_once``, ``N_rec``, ``N_unique``,
    ``N_embedding``, ``N_total`` (params); ``flops_per_token`` (training, forward + backward) and
    ``flops_per_token_forward`` (FLOPs/token); the layout ``n_prelude, n_recur_block, n_coda, r, bptt_k,
    injection, hc_lanes, d_model, n_heads, head_dim, mlp_ratio, seq_len, vocab_size, effective_depth``; and
    ``block_params`` (params of one block) and ``injection_overhead`` (injection matmul FLOPs relative to the
    blocks', r P_inj / (l_eff P_block); paper Sec. 3.2: about r/120 for the paper preset with linear injection).

    Raises:
        ValueError: cfg is not a :class:`LoopedConfig`.
    """
    cfg = _check_cfg(cfg)
    inj_overhead = cfg.r * _inject_flop_params(cfg) / (cfg.effective_depth * block_params(cfg))
    return {
        "N_once": n_once(cfg),
        "N_rec": n_rec(cfg),
        "N_unique": n_unique(cfg),
        "N_embedding": n_embedding(cfg),
        "N_total": n_total(cfg),
        "flops_per_token": flops_per_token(cfg),
        "flops_per_token_forward": flops_per_token_forward(cfg),
        "n_prelude": cfg.n_prelude,
        "n_recur_block": cfg.n_recur_block,
        "n_coda": cfg.n_coda,
        "r": cfg.r,
        "bptt_k": cfg.bptt_k,
        "injection": cfg.injection,
        "hc_lanes": cfg.hc_lanes if cfg.injection == "hyperconnect" else None,
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "head_dim": cfg.head_dim,
        "mlp_ratio": cfg.mlp_ratio,
        "seq_len": cfg.seq_len,
        "vocab_size": cfg.vocab_size,
        "effective_depth": cfg.effective_depth,
        "block_params": block_params(cfg),
        "injection_overhead": inj_overhead,
    }
