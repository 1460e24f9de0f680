"""CLI commands of the model stage: ``loopscale model info`` and ``loopscale train``.

The model flags (``--preset``, ``--d-model`` / ``--width-scale``, ``--r``, ``--bptt-k``, ``--injection``,
``--hc-lanes``, ...) are a public interface shared by both commands, declared once in
:mod:`loopscale.model.options`. Errors are presented (message and exit code) by the console script.
"""

from __future__ import annotations

import json
import sys

import typer

from loopscale.model.options import (
    config_from_flags,
    given_flags,
    in_flag_words,
    no_effect_notes,
    with_model_flags,
)


@with_model_flags
def info_cmd(
    ctx: typer.Context,
    model_flags: dict,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Unique parameters (N_once, N_rec, N_unique), FLOPs per token and layer layout of one config.

    Keys: N_once, N_rec, N_unique, N_embedding, N_total (params), flops_per_token (training, forward + backward,
    FLOPs/token), flops_per_token_forward, and the layer layout (see loopscale.model.accounting.model_info).
    """
    from loopscale.model.accounting import model_info

    try:
        cfg = config_from_flags(**model_flags)
    except ValueError as e:  # named as the Python fields: said with the flags
        raise ValueError(in_flag_words(str(e), ctx)) from None
    for note in no_effect_notes(given_flags(ctx), cfg):
        typer.echo(f"warning: {note}", err=True)
    info = model_info(cfg)
    if as_json:
        json.dump(info, sys.stdout)
        sys.stdout.write("\n")
        return
    for k, v in info.items():
        typer.echo(f"{k:>26}: {v}")


# ``train_cmd`` (the ``loopscale train`` command) is defined in loopscale.model.train_cli and re-exported here.
from loopscale.model.train_cli import train_cmd  # noqa: E402

__all__ = ["config_from_flags", "train_cmd", "info_cmd"]
