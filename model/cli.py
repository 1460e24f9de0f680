"""CLI commands of the model stage: ``loopscale model info`` and ``loopscale train``.

The model flags (``--preset``, ``--d-model`` / ``--width-scale``, ``--r``, ``--bptt-k``, ``--injection``,
``--hc-lanes``, ...) are a public interface shared by both commands; :func:`config_from_flags` turns them
into a validated :class:`~loopscale.model.config.LoopedConfig`.
"""

from __future__ import annotations

import json
import sys

import typer

from loopscale.model.config import LoopedConfig, preset_config

model_app = typer.Typer(no_args_is_help=True, help="Inspect looped model configurations.")


def config_from_flags(
    preset: str,
    r: int,
    d_model: int | None = None,
    width_scale: int | None = None,
    bptt_k: int | None = None,
    injection: str | None = None,
    hc_lanes: int = 2,
    seq_len: int | None = None,
    vocab_size: int | None = None,
    head_dim: int | None = None,
    effective_depth: int | None = None,
    n_prelude: int | None = None,
    n_coda: int | None = None,
) -> LoopedConfig:
    """Validated config from CLI flags (see :func:`loopscale.model.config.preset_config`).

    Raises:
        ValueError: any invalid combination (the message names the flag's field).
    """
    return preset_config(
        preset,
        r=r,
        d_model=d_model,
        width_scale=width_scale,
        bptt_k=bptt_k,
        injection=injection,
        hc_lanes=hc_lanes,
        seq_len=seq_len,
        vocab_size=vocab_size,
        head_dim=head_dim,
        effective_depth=effective_depth,
        n_prelude=n_prelude,
        n_coda=n_coda,
    )


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=2)


@model_app.command("info")
def info_cmd(
    preset: str = typer.Option("cpu", help="Model family: 'paper' (d = 64 s, T = 2048, V = 32064) or 'cpu'."),
    r: int = typer.Option(1, "--r", help="Recurrences of the shared block."),
    d_model: int | None = typer.Option(None, "--d-model", help="Residual width d."),
    width_scale: int | None = typer.Option(None, "--width-scale", help="Width scale s (d = 64 s)."),
    bptt_k: int | None = typer.Option(
        None, "--bptt-k", help="Truncated BPTT: last k recurrences get gradient."
    ),
    injection: str | None = typer.Option(None, help="linear | additive | passthrough | hyperconnect."),
    hc_lanes: int = typer.Option(2, "--hc-lanes", help="Hyperconnection lanes K."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Override the preset's context length T."),
    vocab_size: int | None = typer.Option(None, "--vocab-size", help="Override the preset's vocabulary V."),
    effective_depth: int | None = typer.Option(None, "--effective-depth", help="Override effective depth."),
    head_dim: int | None = typer.Option(None, "--head-dim", help="Override the preset's attention head dim."),
    n_prelude: int | None = typer.Option(None, "--n-prelude", help="Override prelude layers (r > 1)."),
    n_coda: int | None = typer.Option(None, "--n-coda", help="Override coda layers (r > 1)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Unique parameters (N_once, N_rec, N_unique), FLOPs per token and layer layout of one config.

    Keys: N_once, N_rec, N_unique, N_embedding, N_total (params), flops_per_token (training, forward + backward,
    FLOPs/token), flops_per_token_forward, and the layer layout (see loopscale.model.accounting.model_info).
    """
    from loopscale.model.accounting import model_info

    try:
        cfg = config_from_flags(
            preset,
            r,
            d_model,
            width_scale,
            bptt_k,
            injection,
            hc_lanes,
            seq_len,
            vocab_size,
            head_dim=head_dim,
            effective_depth=effective_depth,
            n_prelude=n_prelude,
            n_coda=n_coda,
        )
    except ValueError as e:
        _fail(str(e))
    info = model_info(cfg)
    if as_json:
        json.dump(info, sys.stdout)
        sys.stdout.write("\n")
        return
    for k, v in info.items():
        typer.echo(f"{k:>26}: {v}")


# ``train_cmd`` (the ``loopscale train`` command) is defined in loopscale.model.train_cli and re-exported here.
from loopscale.model.train_cli import train_cmd  # noqa: E402

__all__ = ["config_from_flags", "model_app", "train_cmd", "info_cmd"]
