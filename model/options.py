"""The flags of the commands that build a model or a run: the model flags (``loopscale model info``,
``loopscale train``) and the run flags (``loopscale train``, one per :class:`~loopscale.model.train.RunConfig` field).

They are declared once, in :data:`MODEL_FLAGS`, and added to a Typer command by :func:`with_model_flags`; the
command receives them as one ``model_flags`` dict that :func:`config_from_flags` turns into a validated
:class:`~loopscale.model.config.LoopedConfig` (see :func:`loopscale.model.config.preset_config`)::

    @with_model_flags
    def info_cmd(model_flags: dict, as_json: bool = typer.Option(False, "--json")) -> None:
        cfg = config_from_flags(**model_flags)
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import typing
from typing import Annotated, Any, Literal

import typer

from loopscale.model.config import LoopedConfig, preset_config

__all__ = [
    "MODEL_FLAGS",
    "config_from_flags",
    "given_flags",
    "in_flag_words",
    "no_effect_notes",
    "run_flag_specs",
    "with_model_flags",
    "with_run_flags",
]

_PANEL = "Model"

MODEL_FLAGS: dict[str, tuple[Any, Any, str, str]] = {
    "preset": (
        str,
        "cpu",
        "--preset",
        "Model family: 'paper' (d = 64 s, T = 2048, V = 32064) or 'cpu'. The architecture only, not the sweep "
        "preset of the same name (configs/cpu.yaml also fixes training: it trains with MuonH at a fixed LR 0.02); "
        "`train` takes its training settings from its own flags (--optimizer, --lr, ...).",
    ),
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


def in_flag_words(message: str, ctx) -> str:
    """An error of :class:`~loopscale.model.config.LoopedConfig`, :class:`~loopscale.model.train.RunConfig` or a
    checkpoint check, said with the flags of the command of click context ``ctx`` instead of the Python fields it
    names (the Python API's words): ``eval_every_steps must be None or a positive integer`` becomes
    ``--eval-every-steps must be a positive integer`` (leaving a flag out is the command line's None), and a
    checkpoint that ``differs in ['data_seeds', 'seeds']`` differs in ``--seeds``. A message that already names a
    flag (``--...``) is returned as it is.

    Field names with an underscore are replaced wherever they stand as a word (``model.seq_len`` too); one-word
    names (``r``, ``lr``, ``seed``) only as the subject at the start of the message, where they cannot be prose.
    """
    if re.search(r"(?<![\w-])--[a-z]", message):
        return message
    flags = {}
    for p in getattr(ctx.command, "params", []):
        long = [o for o in getattr(p, "opts", []) if o.startswith("--")]
        if long and p.name:
            flags[p.name] = long[0]
    # a seed ensemble's checkpoint key holds the members' seeds and data seeds, both set by --seeds
    aliases = {"seeds": flags.get("seeds"), "data_seeds": flags.get("seeds")}

    def flag_of(name: str) -> str | None:
        name = name.removeprefix("model.")
        return flags.get(name) or aliases.get(name)

    def listed(m: re.Match) -> str:
        items = [x.strip().strip("'\"") for x in m.group(2).split(",") if x.strip()]
        said = list(dict.fromkeys(flag_of(x) or x for x in items))
        return f"differs {m.group(1) or ''}in {', '.join(said)}"

    message = re.sub(r"differs (also )?in \[([^\]]*)\]", listed, message)
    if (m := re.match(r"^(\w+)(=| must be None or | must)", message)) and (f := flag_of(m.group(1))):
        message = f + {"=": " ", " must be None or ": " must be "}.get(m.group(2), m.group(2)) + message[m.end():]
    for name in sorted((n for n in flags if "_" in n), key=len, reverse=True):
        message = re.sub(rf"(?<![\w.\-/'\"])(?:model\.)?{re.escape(name)}\b(=)?",
                         lambda m, f=flags[name]: f + (" " if m.group(1) else ""), message)
    return message


def given_flags(ctx) -> set[str]:
    """Names of the parameters of a command's click context ``ctx`` given on the command line or through an
    environment variable (not left at their defaults)."""
    given = ("COMMANDLINE", "ENVIRONMENT")  # by name: Typer ships its own copy of click's ParameterSource
    return {name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", None) in given}


def no_effect_notes(given: set[str], model: LoopedConfig, run=None) -> list[str]:
    """One line per flag in ``given`` (parameter names, :func:`given_flags`) that changes nothing in the model
    ``model`` or the run ``run`` (a :class:`~loopscale.model.train.RunConfig`, optional) it was given with:
    ``--hc-lanes`` without hyperconnections, ``--n-prelude`` / ``--n-coda`` at r = 1 (the plain iso-depth baseline
    has neither, paper Sec. 3.1), ``--decay-frac`` without the 'wsd' schedule, ``--checkpoint-dir`` without
    ``--checkpoint-every-steps`` (no checkpoint is written; one already there is resumed from)."""
    notes = []
    if "hc_lanes" in given and model.injection != "hyperconnect":
        notes.append(f"--hc-lanes {model.hc_lanes} has no effect: the lanes belong to --injection hyperconnect, "
                     f"and this model's injection is {model.injection}")
    for name in ("n_prelude", "n_coda"):
        if name in given and model.r == 1:
            notes.append(f"--{name.replace('_', '-')} has no effect at r = 1: the plain baseline is effective_depth "
                         "unique layers with no prelude or coda (it sets the layout of the r > 1 models)")
    if run is not None:
        if "decay_frac" in given and run.schedule != "wsd":
            notes.append(f"--decay-frac {run.decay_frac} has no effect: it is the final decay of --schedule wsd, "
                         f"and this run's schedule is {run.schedule}")
        if "checkpoint_dir" in given and run.checkpoint_every_steps is None:
            notes.append("--checkpoint-dir without --checkpoint-every-steps writes no checkpoint (the run resumes "
                         "from one already there); add --checkpoint-every-steps K to write one every K steps")
    return notes


def with_model_flags(command):
    """Add every flag of :data:`MODEL_FLAGS` to a Typer command (in the "Model" help panel) and pass their values
    to it as one keyword argument ``model_flags`` (a dict), which the command must declare."""
    specs = {
        name: (typ, default, typer.Option(flag, help=help_, rich_help_panel=_PANEL))
        for name, (typ, default, flag, help_) in MODEL_FLAGS.items()
    }
    return _with_flags(command, "model_flags", specs)


#: ``--help`` texts of the run flags whose RunConfig docstring speaks of the Python API (None values, Cells).
CLI_HELP = {
    "checkpoint_every_steps": "Write a checkpoint every K steps (and at the last step) into --checkpoint-dir, which "
    "it needs; leave it out for no checkpoints. A rerun of the same command resumes from the newest one.",
}


def run_flag_specs() -> dict[str, tuple[Any, Any, Any]]:
    """One flag per :class:`~loopscale.model.train.RunConfig` field except ``model``: ``--<field-name>`` with the
    field's default, its type (a ``Literal`` is given as a string, checked by RunConfig) and its docstring as help. RunConfig stays the one
    declaration of a run; the command line is derived from it."""
    from loopscale.model.train import RunConfig

    hints = typing.get_type_hints(RunConfig)
    docs = _field_docs(RunConfig)
    out = {}
    for f in dataclasses.fields(RunConfig):
        if f.name == "model":
            continue
        typ, help_ = hints[f.name], CLI_HELP.get(f.name) or console_help(docs.get(f.name, ""))
        if typing.get_origin(typ) is Literal:  # RunConfig checks the value; the help lists the choices
            typ, help_ = str, f"{help_} One of: {', '.join(typing.get_args(hints[f.name]))}."
        flag = "--" + f.name.replace("_", "-")
        decls = (f"{flag}/--no-{flag[2:]}",) if typ is bool else (flag,)
        out[f.name] = (
            typ,
            f.default,
            typer.Option(*decls, help=help_, rich_help_panel="Run"),
        )
    return out


def with_run_flags(command):
    """Add one flag per RunConfig field (:func:`run_flag_specs`, "Run" help panel) to a Typer command and pass their
    values to it as one keyword argument ``run_flags`` (a dict of RunConfig keyword arguments)."""
    return _with_flags(command, "run_flags", run_flag_specs())


def console_help(doc: str) -> str:
    """A field docstring as ``--help`` shows it: reST literals (````x````) as plain words and the Python default
    ``None`` as what leaving the flag out means (``None -> x`` and ``None: x`` become ``if not given: x``)."""
    doc = re.sub(r"``([^`]+)``", r"\1", doc)
    return re.sub(r"\bNone(?: ->|:) ", "if not given: ", doc)


def _field_docs(cls) -> dict[str, str]:
    """{field: its attribute docstring} of a dataclass, read from its source (one line each)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    out = {}
    for a, b in zip(body, body[1:], strict=False):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)
        ):
            # Sphinx roles read as plain names in --help: ":func:`a.b`" -> "a.b", "``x``" -> "x"
            text = re.sub(r":\w+:`~?([^`]+)`", r"\1", " ".join(b.value.value.split()))
            out[a.target.id] = text.replace("``", "")
    return out


def _with_flags(command, param: str, specs: dict[str, tuple[Any, Any, Any]]):
    """``command`` with one keyword-only Typer option per entry of ``specs`` (name -> (type, default, option)),
    their values handed to it as one dict argument named ``param``."""
    sig = inspect.signature(command, eval_str=True)
    if param not in sig.parameters:
        raise TypeError(f"{command.__name__} must take a {param!r} parameter")
    own = [p for p in sig.parameters.values() if p.name != param]
    added = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[typ, option]
        )
        for name, (typ, default, option) in specs.items()
    ]

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        values = {k: kwargs.pop(k, specs[k][1]) for k in specs}
        return command(*args, **{param: values}, **kwargs)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added
    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # Typer must read the signature above, not the command's own
    return wrapper
