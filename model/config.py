"""Model configuration for the looped (depth-recurrent) decoder and its iso-depth constructors.

Architecture: prelude (``n_prelude`` unique layers) -> a shared block of ``n_recur_block`` layers applied
``r`` times -> coda (``n_coda`` unique layers). Effective depth ``n_prelude + r * n_recur_block + n_coda``
(Schwethelm, Rueckert & Kaissis 2026, arXiv 2604.21106, Sec. 3 and App. C).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from dataclasses import dataclass
from typing import Literal

Injection = Literal["linear", "additive", "passthrough", "hyperconnect"]
INJECTIONS: tuple[str, ...] = ("linear", "additive", "passthrough", "hyperconnect")


def _is_real(v) -> bool:
    """An int or float that is not a bool (NaN and inf included: callers check finiteness)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def as_python_number(v):
    """``v`` with a NumPy (or other ``numbers``) integer made a Python ``int``, a NumPy real a Python ``float`` and
    a NumPy bool a Python ``bool``; anything else unchanged. Values read from a DataFrame are NumPy scalars
    (``np.int64``), which the ``isinstance(v, int)`` checks of the configs would otherwise refuse."""
    if isinstance(v, bool):
        return v
    if type(v).__module__ == "numpy" and type(v).__name__ in ("bool", "bool_"):  # not a numbers.Integral
        return bool(v)
    if isinstance(v, numbers.Integral) and not isinstance(v, int):
        return int(v)
    if isinstance(v, numbers.Real) and not isinstance(v, int | float):
        return float(v)
    return v


def python_numbers(obj) -> None:
    """Replace, in place, every NumPy-scalar field of the (frozen) dataclass ``obj`` by :func:`as_python_number`."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        w = as_python_number(v)
        if w is not v:
            object.__setattr__(obj, f.name, w)


@dataclass(frozen=True, kw_only=True)
class LoopedConfig:
    """Configuration of one looped decoder.

    Fields are validated in ``__post_init__``; every violation raises ``ValueError`` naming the field,
    the value and the rule. ``injection=None`` resolves to ``"passthrough"`` for ``r == 1`` (the paper's
    plain r = 1 baseline, which has no injection) and ``"linear"`` otherwise; ``bptt_k=None`` resolves to
    ``r`` (full backpropagation through time).
    """

    vocab_size: int = 256
    """Vocabulary size V (padded size for the paper preset: 32064)."""
    seq_len: int = 128
    """Context length T in tokens."""
    d_model: int = 64
    """Residual width d."""
    head_dim: int = 16
    """Attention head dimension; n_heads = d_model // head_dim."""
    n_prelude: int = 0
    """Unique layers before the loop (run once)."""
    n_recur_block: int = 10
    """Layers in the shared block (run r times)."""
    n_coda: int = 0
    """Unique layers after the loop (run once)."""
    r: int = 1
    """Number of recurrences of the shared block."""
    injection: Injection | None = None
    """How the prelude output e enters each recurrence: linear u = W[e||h] (W init [I|0]), additive u = h + e,
    passthrough u = h, or hyperconnect (K lanes, per-iteration alpha/M/beta)."""
    bptt_k: int | None = None
    """Truncated BPTT: only the last bptt_k recurrences carry gradient (None -> r, full BPTT)."""
    hc_lanes: int = 2
    """Hyperconnection lanes K (only used with injection='hyperconnect')."""
    logit_softcap: float = 15.0
    """Logits are soft-capped as c * tanh(z / c), in logit units: a finite c > 0, or exactly 0 for no cap (NaN,
    inf, None and negative values raise ValueError)."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon (added to the mean square): a finite number > 0."""
    rope_base: float = 10000.0
    """RoPE base theta (angle t * theta^(-2j / head_dim)): a finite number > 0."""
    mlp_ratio: int = 4
    """MLP hidden width = mlp_ratio * d_model (squared ReLU)."""

    def __post_init__(self) -> None:
        python_numbers(self)
        for name in (
            "vocab_size",
            "seq_len",
            "d_model",
            "head_dim",
            "n_recur_block",
            "hc_lanes",
            "mlp_ratio",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("n_prelude", "n_coda"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 1:
            raise ValueError(f"r must be an integer >= 1, got {self.r!r}")
        if self.head_dim % 2 != 0:  # first: a d_model suggested for an odd head_dim would still be refused
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.d_model % self.head_dim != 0:
            raise ValueError(
                f"d_model must be divisible by head_dim: d_model={self.d_model}, head_dim={self.head_dim} "
                f"(try d_model={(self.d_model // self.head_dim + 1) * self.head_dim})"
            )
        inj = self.injection
        if inj is None:
            inj = "passthrough" if self.r == 1 else "linear"
            object.__setattr__(self, "injection", inj)
        if inj not in INJECTIONS:
            raise ValueError(f"injection must be one of {INJECTIONS}, got {inj!r}")
        if self.r == 1 and inj != "passthrough":
            raise ValueError(
                f"injection must be 'passthrough' when r = 1 (no recurrence to inject into), got {inj!r}"
            )
        k = self.r if self.bptt_k is None else self.bptt_k
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= self.r:
            raise ValueError(f"bptt_k must be an integer in [1, r={self.r}], got {self.bptt_k!r}")
        object.__setattr__(self, "bptt_k", k)
        if inj == "hyperconnect":
            if self.hc_lanes < 2:
                raise ValueError(f"hc_lanes must be >= 2 with injection='hyperconnect', got {self.hc_lanes}")
            if k < self.r:
                raise ValueError(
                    f"bptt_k must equal r with injection='hyperconnect' (got bptt_k={k}, r={self.r}); "
                    "truncated BPTT with hyperconnections is not supported (as in the paper's code)"
                )
        # the float fields: a NaN passes any `<` / `<=` test, and a NaN or inf here makes every logit NaN
        c = self.logit_softcap
        if not _is_real(c) or not math.isfinite(c) or c < 0:
            raise ValueError(
                f"logit_softcap must be a finite number > 0 (the cap c of c * tanh(z / c)) or 0 (no cap), got {c!r}"
            )
        for name, rule in (
            ("norm_eps", "the RMSNorm epsilon, e.g. 1e-6"),
            ("rope_base", "the RoPE base, e.g. 10000"),
        ):
            v = getattr(self, name)
            if not _is_real(v) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0 ({rule}), got {v!r}")

    @property
    def n_heads(self) -> int:
        """Number of attention heads, d_model // head_dim."""
        return self.d_model // self.head_dim

    @property
    def effective_depth(self) -> int:
        """Executed layers per token: n_prelude + r * n_recur_block + n_coda."""
        return self.n_prelude + self.r * self.n_recur_block + self.n_coda

    def replace(self, **changes) -> LoopedConfig:
        """A copy with ``changes`` applied (validated again).

        A change of ``r`` keeps the layer counts (``n_prelude``, ``n_recur_block``, ``n_coda``), so the effective
        depth changes with it (the cpu preset's r = 1 model, 10 unique layers, becomes 40 layers deep at
        ``replace(r=4)``): for the iso-depth partner at another r, same effective depth and fewer unique layers
        (paper Sec. 3.1), use :func:`iso_depth` (or :func:`preset_config` with the new ``r``). It carries the
        defaults that follow ``r`` along, unless ``changes`` sets them too: full BPTT (``bptt_k == r``) stays full
        at the new ``r``, and the default injection of the old ``r`` (``"passthrough"`` at r = 1, ``"linear"``
        above) becomes the new ``r``'s. A truncated ``bptt_k`` or a non-default injection is kept (and validated
        against the new ``r``).

        Raises:
            ValueError: the changed config is invalid (see the class).
        """
        if "r" in changes:
            if "bptt_k" not in changes and self.bptt_k == self.r:
                changes["bptt_k"] = None
            if "injection" not in changes and self.injection == ("passthrough" if self.r == 1 else "linear"):
                changes["injection"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain-dict form (JSON/Parquet friendly)."""
        return dataclasses.asdict(self)


MAX_DEPTH = 10_000
"""Most layers an iso-depth model may have (``effective_depth``, ``n_prelude``, ``n_coda``): far above any model
trained (the paper's are 10-42 deep), and low enough that listing the valid r of a depth stays instant."""


def _depths(effective_depth, n_prelude, n_coda) -> tuple[int, int, int]:
    """The three layer counts as Python ints (:func:`as_python_number`).

    Raises:
        ValueError: one that is not a non-negative integer, or above :data:`MAX_DEPTH`, named.
    """
    out = []
    for name, v in (("effective_depth", effective_depth), ("n_prelude", n_prelude), ("n_coda", n_coda)):
        v = as_python_number(v)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if v > MAX_DEPTH:
            raise ValueError(f"{name} must be at most {MAX_DEPTH:,} layers, got {v:,}")
        out.append(v)
    return out[0], out[1], out[2]


def valid_r(effective_depth: int, n_prelude: int, n_coda: int) -> list[int]:
    """The r values for which ``iso_depth`` can build a model at this depth (r = 1 always works).

    Raises:
        ValueError: a value that is not a non-negative integer, or ``effective_depth <= n_prelude + n_coda``
            (no layer left to loop).
    """
    effective_depth, n_prelude, n_coda = _depths(effective_depth, n_prelude, n_coda)
    looped = effective_depth - n_prelude - n_coda
    if looped <= 0:
        raise ValueError(
            f"effective_depth must exceed n_prelude + n_coda: effective_depth={effective_depth}, "
            f"n_prelude={n_prelude}, n_coda={n_coda}"
        )
    small = [r for r in range(1, math.isqrt(looped) + 1) if looped % r == 0]  # divisor pairs: O(sqrt(looped))
    return sorted(set(small) | {looped // r for r in small})


def iso_depth(
    d_model: int,
    r: int,
    *,
    effective_depth: int,
    n_prelude: int,
    n_coda: int,
    **kwargs,
) -> LoopedConfig:
    """Build the iso-depth config at recurrence ``r`` (paper Sec. 3.1).

    r = 1 gives ``effective_depth`` unique layers with no prelude, coda or injection (passthrough);
    r > 1 gives ``n_prelude`` + (``effective_depth`` - n_prelude - n_coda) / r shared layers x r + ``n_coda``.
    Extra keyword arguments (``vocab_size``, ``seq_len``, ``head_dim``, ``injection``, ``bptt_k``, ...)
    are passed to :class:`LoopedConfig`.

    Raises:
        ValueError: r < 1, a looped depth that r does not divide (the message lists the valid r), or any
            invalid :class:`LoopedConfig` field.
    """
    r = as_python_number(r)
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise ValueError(f"r must be an integer >= 1, got {r!r}")
    effective_depth, n_prelude, n_coda = _depths(effective_depth, n_prelude, n_coda)
    if r == 1:  # a plain model: its effective_depth unique layers, no prelude or coda to leave room for
        if effective_depth < 1:
            raise ValueError(f"effective_depth must be >= 1 (layers), got {effective_depth}")
        return LoopedConfig(
            d_model=d_model, n_prelude=0, n_recur_block=effective_depth, n_coda=0, r=1, **kwargs
        )
    looped = effective_depth - n_prelude - n_coda
    if effective_depth <= 0 or looped <= 0:
        raise ValueError(
            f"effective_depth must exceed n_prelude + n_coda: effective_depth={effective_depth}, "
            f"n_prelude={n_prelude}, n_coda={n_coda}"
        )
    if looped % r != 0:
        raise ValueError(
            f"r={r} must divide the looped depth (effective_depth - n_prelude - n_coda = {looped}); "
            f"valid r: {valid_r(effective_depth, n_prelude, n_coda)}"
        )
    return LoopedConfig(
        d_model=d_model, n_prelude=n_prelude, n_recur_block=looped // r, n_coda=n_coda, r=r, **kwargs
    )


# --- presets -------------------------------------------------------------------------------------------

PAPER = dict(vocab_size=32064, seq_len=2048, head_dim=128, effective_depth=20, n_prelude=2, n_coda=2)
"""The paper's preset (Sec. 3, App. C): d = 64 s, head dim 128, T = 2048, V = 32064 (padded), depth 2 + 16 + 2."""

CPU = dict(vocab_size=256, seq_len=128, head_dim=16, effective_depth=10, n_prelude=1, n_coda=1)
"""CPU family: byte vocabulary, short context, depth 1 + 8 + 1 so that r in {1, 2, 4, 8} all divide the loop.
Chosen, not from the paper. Measured with ``benchmarks/bench_model.py`` (2026-11-30, one thread, batch 16 x 128,
forward + backward): d = 128 trains at about 4.2-4.4k tokens/s for every r on an idle core (MFU about 0.55-0.6 of
the measured fp32 matmul rate), about 2.3k tokens/s when other processes share the core."""

PRESETS = {"paper": PAPER, "cpu": CPU}


def preset_override_names() -> tuple[str, ...]:
    """The keyword overrides :func:`preset_config` accepts: the preset keys and the :class:`LoopedConfig` fields
    other than ``d_model``, ``r`` (arguments of their own) and ``n_recur_block`` (derived from r), sorted."""
    fields = {f.name for f in dataclasses.fields(LoopedConfig)} - {"d_model", "r", "n_recur_block"}
    return tuple(sorted(fields | {k for p in PRESETS.values() for k in p}))


def preset_config(
    preset: str,
    *,
    r: int,
    d_model: int | None = None,
    width_scale: int | None = None,
    **overrides,
) -> LoopedConfig:
    """Config for ``preset`` ('paper' or 'cpu') at recurrence ``r``.

    Width: ``d_model`` directly, or ``width_scale`` s, a positive integer, with d = 64 s (paper convention; also
    accepted for 'cpu'). ``overrides`` may change any preset key (``seq_len``, ``vocab_size``, ``head_dim``,
    ``effective_depth``, ``n_prelude``, ``n_coda``) or pass :class:`LoopedConfig` fields (``injection``,
    ``bptt_k``, ``hc_lanes``, ``logit_softcap``, ``norm_eps``, ``rope_base``, ``mlp_ratio``); an override of None
    keeps the preset's value. ``n_recur_block`` is not an override: it follows from ``r`` and the depths.

    Raises:
        ValueError: unknown preset, both or neither of d_model / width_scale, a width_scale that is not a positive
            integer (the message gives the d_model to pass instead when 64 s is whole), an unknown override (the
            message lists the valid names and the closest one), or an invalid config.
    """
    if preset not in PRESETS:
        sweep = (" ('smoke' is a sweep preset, configs/smoke.yaml, whose models are preset 'cpu' at seq_len 32, "
                 "d_model 16 and 32)" if preset == "smoke" else "")  # fmt: skip
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}{sweep}")
    if (d_model is None) == (width_scale is None):
        got = "neither" if d_model is None else f"both (d_model={d_model!r}, width_scale={width_scale!r})"
        raise ValueError(f"give exactly one of d_model or width_scale (--d-model / --width-scale on the command line), "
                         f"got {got}: e.g. d_model=16 (the cpu sweep preset's width) or width_scale=10 (d = 64 s = 640, "
                         "the paper preset's s = 10)")
    if width_scale is not None:
        if not isinstance(width_scale, numbers.Integral) or isinstance(width_scale, bool) or width_scale <= 0:
            d = 64 * width_scale if _is_real(width_scale) and math.isfinite(width_scale) and width_scale > 0 else None
            hint = f"; for d_model = {int(d)} pass d_model={int(d)} instead" if d is not None and d == int(d) else ""
            raise ValueError(
                f"width_scale must be a positive integer s (d_model = 64 s: 1, 2, 3, ...), got {width_scale!r}{hint}"
            )
        d_model = 64 * int(width_scale)
    valid = preset_override_names()
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, valid, n=1)
        raise ValueError(
            f"unknown preset_config override {name!r}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + ("; n_recur_block follows from r and effective_depth - n_prelude - n_coda" if name == "n_recur_block" else "")
            + f"; valid overrides: {', '.join(valid)} (d_model, width_scale and r are their own arguments)"
        )
    base = dict(PRESETS[preset])
    base.update({k: v for k, v in overrides.items() if v is not None})
    eff, pre, coda = base.pop("effective_depth"), base.pop("n_prelude"), base.pop("n_coda")
    hd = base.get("head_dim")
    if isinstance(hd, int) and not isinstance(hd, bool) and hd > 0 and hd % 2:  # before a width is suggested for it
        raise ValueError(f"head_dim must be even for RoPE, got {hd}")
    if width_scale is not None and isinstance(hd, int) and hd > 0 and d_model % hd:  # say it in the width asked for
        s_ok = next(s for s in range(int(width_scale) + 1, int(width_scale) + hd + 1) if (64 * s) % hd == 0)
        raise ValueError(
            f"d_model must be divisible by head_dim: width_scale={width_scale} gives d_model={d_model}, head_dim={hd} "
            f"(try width_scale={s_ok}, d_model={64 * s_ok}, or a smaller head_dim)"
        )
    return iso_depth(d_model, r, effective_depth=eff, n_prelude=pre, n_coda=coda, **base)
