"""The model flags every command that builds a looped model takes (``loopscale model info``, ``loopscale train``).

They are declared once, in :data:`MODEL_FLAGS`, and added to a Typer command by :func:`with_model_flags`; the
command receives them as one ``model_flags`` dict that :func:`config_from_flags` turns into a validated
:class:`~loopscale.model.config.LoopedConfig` (see :func:`loopscale.model.config.preset_config`)::

    @with_model_flags
    def info_cmd(model_flags: dict, as_json: bool = typer.Option(False, "--json")) -> None:
        cfg = config_from_flags(**model_flags)
"""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Any

import typer

from loopscale.model.config import LoopedConfig, preset_config

__all__ = ["MODEL_FLAGS", "config_from_flags", "with_model_flags"]

_PANEL = "Model"

MODEL_FLAGS: dict[str, tuple[Any, Any, str, str]] = {
    "preset": (str, "cpu", "--preset", "Model family: 'paper' (d = 64 s, T = 2048, V = 32064) or 'cpu'."),
    "r": (int, 1, "--r", "Recurrences of the shared block."),
    "d_model": (int | None, None, "--d-model", "Residual width d."),
    "width_scale": (int | None, None, "--width-scale", "Width scale s (d = 64 s)."),
    "bptt_k": (int | None, None, "--bptt-k", "Truncated BPTT: last k recurrences get gradient."),
    "injection": (str | None, None, "--injection", "linear | additive | passthrough | hyperconnect."),
    "hc_lanes": (int, 2, "--hc-lanes", "Hyperconnection lanes K."),
    "seq_len": (int | None, None, "--seq-len", "Override the preset's context length T."),
    "vocab_size": (int | None, None, "--vocab-size", "Override the preset's vocabulary V."),
    "head_dim": (int | None, None, "--head-dim", "Override the preset's attention head dim."),
    "effective_depth": (int | None, None, "--effective-depth", "Override the preset's effective depth."),
    "n_prelude": (int | None, None, "--n-prelude", "Override prelude layers (r > 1)."),
    "n_coda": (int | None, None, "--n-coda", "Override coda layers (r > 1)."),
}
"""name -> (type, default, flag, help) of every model flag."""


def config_from_flags(preset: str = "cpu", r: int = 1, **flags) -> LoopedConfig:
    """Validated config from the model flags (keyword arguments named as in :data:`MODEL_FLAGS`).

    Raises:
        ValueError: an unknown flag or any invalid combination (the message names the field).
    """
    unknown = sorted(set(flags) - set(MODEL_FLAGS))
    if unknown:
        raise ValueError(f"unknown model flags {unknown}; known: {sorted(MODEL_FLAGS)}")
    return preset_config(preset, r=r, **flags)


def with_model_flags(command):
    """Add every flag of :data:`MODEL_FLAGS` to a Typer command (in the "Model" help panel) and pass their values
    to it as one keyword argument ``model_flags`` (a dict), which the command must declare."""
    sig = inspect.signature(command, eval_str=True)
    if "model_flags" not in sig.parameters:
        raise TypeError(f"{command.__name__} must take a 'model_flags' parameter")
    own = [p for p in sig.parameters.values() if p.name != "model_flags"]
    added = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=default,
            annotation=Annotated[typ, typer.Option(flag, help=help_, rich_help_panel=_PANEL)],
        )
        for name, (typ, default, flag, help_) in MODEL_FLAGS.items()
    ]

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        flags = {k: kwargs.pop(k, MODEL_FLAGS[k][1]) for k in MODEL_FLAGS}
        return command(*args, model_flags=flags, **kwargs)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added
    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # Typer must read the signature above, not the command's own
    return wrapper
