"""``loopscale train``: one training run from the command line.

Example::

    loopscale train --preset cpu --d-model 128 --r 2 --tokens 300000 --json

The model flags are those of ``loopscale model info``; the run flags are derived from the fields of
:class:`~loopscale.model.train.RunConfig` (both in :mod:`loopscale.model.options`). With ``--tokenizer bpe:<n>`` the model's ``vocab_size`` is set to n
unless ``--vocab-size`` is given.
"""

from __future__ import annotations

import json
import math
import sys

import typer

from loopscale.model.options import (
    config_from_flags,
    given_flags,
    in_flag_words,
    no_effect_notes,
    with_model_flags,
    with_run_flags,
)


def _how_trained(run) -> str:
    """How ``run`` trains, in one line for the console (``--json`` has each as its own key): optimizer (and its
    orthogonalisation), LR and schedule, truncated BPTT when set, seed, precision, compile and threads."""
    m = run.model
    opt = run.optimizer + (f" ({run.orthogonalization})" if run.optimizer != "adamw" else "")
    lr = f"lr={run.lr:g}" + (f" x {run.lr_data_factor:g} for the Muon matrices" if run.lr_data_factor != 1 else "")
    inj = f", {m.injection} injection" + (f" ({m.hc_lanes} lanes)" if m.injection == "hyperconnect" else "")
    bptt = f", bptt_k={m.bptt_k} of r={m.r}" if m.bptt_k is not None and m.bptt_k != m.r else ""
    return (f"{opt}, {lr} ({run.schedule}){inj if m.r > 1 else ''}{bptt}, seed={run.seed}, {run.precision}, "
            f"compile {'on' if run.compile else 'off'}, {run.num_threads} thread{'s' * (run.num_threads != 1)} on "
            f"{_device_said(run.device)}")


def _device_said(name: str) -> str:
    """The device a run trains on, as the trainer resolves it: ``auto`` names the device it picks."""
    if name != "auto":
        return name
    from loopscale.model.train import _resolve_device

    return f"{_resolve_device(name).type} (auto)"


def _resumed_line(step: int | None, steps: int, checkpoint_dir) -> str | None:
    """The console line of a run that went on from a checkpoint (``--json``: ``resumed_from_step``): a rerun of a
    finished run printed its results again as if it had trained them. None for a run trained from step 0."""
    if step is None:
        return None
    if step >= steps:
        return (f"resumed: the checkpoint in {checkpoint_dir} is of the last step ({step} of {steps}): nothing was "
                "trained again; the results above are the finished run's, measured again")  # fmt: skip
    return f"resumed: from the checkpoint in {checkpoint_dir} at step {step} of {steps} (those steps not trained again)"


JSON_KEYS = (
    "status",
    "final_val_loss",
    "best_val_loss",
    "final_val_bpb",
    "diverged_step",
    "D",
    "C",
    "N_once",
    "N_rec",
    "N_unique",
    "flops_per_token",
    "tokens_per_s",
    "mfu",
    "wall_s",
    "epochs",
    "steps",
    "lr",
    "lr_data_factor",
    "optimizer",
    "orthogonalization",
    "schedule",
    "seed",
    "data_seed",
    "tokenizer",
    "vocab_size",
    "data",
    "eval_tokens",
    "num_threads",
    "device",
    "compiled",
    "time_split",
    "model",
    "corpus",
    "corpus_hash",
    "resumed_from_step",
    "warnings",
    "versions",
    "curve",
)
"""Keys of the ``--json`` object (units: losses nats/token, D tokens, C FLOPs, times seconds)."""


@with_model_flags
@with_run_flags
def train_cmd(
    ctx: typer.Context,
    model_flags: dict,
    run_flags: dict,
    seeds: str | None = typer.Option(
        None, "--seeds", help="Train several init seeds together as one seed ensemble (one process, batched "
        "ops, one result per member, each equal to its single run up to float rounding): a count k (seeds "
        "0..k-1, as a spec's seeds: k) or a comma list, e.g. 0,3,7. With --json: a JSON list, one object per member."
    ),  # fmt: skip
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Train one looped LM for D tokens (or C FLOPs) and report its validation loss (nats/token)."""
    from loopscale.model.data import parse_tokenizer
    from loopscale.model.train import RunConfig, resolve_tokens, train_run

    # the run's own checks, said with the flags' names and before the "training ..." line
    if (run_flags.get("tokens") is None) == (run_flags.get("target_flops") is None):
        raise ValueError("give exactly one of --tokens D (training tokens) or --target-flops C (training FLOPs)")
    if run_flags.get("checkpoint_every_steps") and not run_flags.get("checkpoint_dir"):
        raise ValueError("--checkpoint-every-steps needs --checkpoint-dir DIR (a folder for the checkpoints)")
    members = None if seeds is None else _parse_seeds(seeds)
    if members is not None and run_flags["seed"] != 0:
        raise ValueError(f"give --seed or --seeds, not both (--seed {run_flags['seed']}, --seeds {seeds})")
    kind, tok_vocab = parse_tokenizer(run_flags["tokenizer"])
    if model_flags["vocab_size"] is None and kind == "bpe":
        model_flags = {**model_flags, "vocab_size": tok_vocab}
    try:  # the config's and checkpoint's errors name Python fields: said with this command's flags
        run = RunConfig(model=config_from_flags(**model_flags), **run_flags)
        _precheck(run, members)
    except ValueError as e:
        from loopscale.model.data import CorpusError

        said = in_flag_words(str(e), ctx)
        if said == str(e) or isinstance(e, CorpusError):  # a corpus error names files, not fields
            raise
        raise type(e)(said) from None
    notes = no_effect_notes(given_flags(ctx), run.model, run)  # said, and kept with the run's own warnings
    for note in notes:
        typer.echo(f"warning: {note}", err=True)
    if members is not None:
        _train_ensemble(run, members, as_json, notes)
        return
    if not as_json:
        from loopscale.model.accounting import flops_per_token, n_once, n_rec

        D, m = resolve_tokens(run), run.model
        n_eff = n_once(m) + m.r * n_rec(m)
        typer.echo(
            f"training r={m.r} d={m.d_model} on {run.corpus!r}: D={D} tokens ({_steps(D // run.batch_tokens)}), "
            f"C={flops_per_token(m) * D:.4g} FLOPs, D/(N_once + r N_rec)={D / n_eff:.3g}",
            err=True,
        )
        typer.echo(f"  {_how_trained(run)}", err=True)
    shown = _ShownWarnings()
    with shown:
        res = train_run(run)
    d = res.to_dict()
    out = {k: d[k] for k in JSON_KEYS}
    out["warnings"] = [*notes, *out["warnings"]]
    if as_json:
        _dump_json(out)
        if res.status != "ok":
            raise typer.Exit(code=1)
        return
    for k in (
        "status",
        "final_val_loss",
        "final_val_bpb",
        "D",
        "C",
        "N_once",
        "N_rec",
        "flops_per_token",
        "tokens_per_s",
        "mfu",
        "wall_s",
        "epochs",
    ):
        typer.echo(f"{k:>16}: {out[k]}" + _spent(out, k, run.batch_tokens))
    dd = out["data"]
    typer.echo(
        f"{'data':>16}: {dd.get('n_train_tokens')} train / {dd.get('n_val_tokens')} validation tokens "
        f"({_split_text(dd)})"
        + (
            f"; BPE trained on {dd['bpe_training']['docs']} document{'s' if dd['bpe_training']['docs'] != 1 else ''}, "
            f"{dd['bpe_training']['bytes']} bytes, "
            f"{dd['bpe_training']['merges']} merges"
            if dd.get("bpe_training")
            else ""
        )
    )
    if by_step := _val_by_step(out["curve"]):
        typer.echo(f"{'val_loss by step':>16}: {by_step}")
    if (said := _resumed_line(res.resumed_from_step, int(out["D"]) // run.batch_tokens, run.checkpoint_dir)) is not None:
        typer.echo(said, err=True)
    for w in out["warnings"]:  # the run's warnings it recorded without showing them (e.g. roundings, compile time)
        if w not in notes and w not in shown.messages:
            typer.echo(f"warning: {w}", err=True)
    if res.status != "ok":
        raise typer.Exit(code=1)


__all__ = ["JSON_KEYS", "train_cmd"]


class _ShownWarnings:
    """Within ``with``: the messages of the Python warnings shown (``messages``), each still shown as usual."""

    def __init__(self) -> None:
        self.messages: set[str] = set()

    def __enter__(self) -> _ShownWarnings:
        import warnings

        self._orig = warnings.showwarning

        def show(message, *args, **kwargs):
            self.messages.add(str(message))
            return self._orig(message, *args, **kwargs)

        warnings.showwarning = show
        return self

    def __exit__(self, *exc) -> None:
        import warnings

        warnings.showwarning = self._orig


def _parse_seeds(text: str) -> list[int]:
    """``--seeds``: ``"k"`` -> [0, ..., k-1]; ``"a,b,c"`` -> [a, b, c].

    Raises:
        ValueError: not a count in [1, :data:`~loopscale.model.train.MAX_SEED_COUNT`] or a list of distinct integers
            in [0, :data:`~loopscale.model.train.MAX_SEED`].
    """
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > 1 and "" in parts:  # "1,,2" or "1,2,": a missing entry, not a list of two
        raise ValueError(f"--seeds {text}: an empty entry; give a count k (seeds 0..k-1) or distinct integers >= 0, "
                         "e.g. 0,3,7")  # fmt: skip
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        vals = []
    from loopscale.model.train import MAX_SEED, MAX_SEED_COUNT

    if len(vals) == 1 and "," not in text:
        if not 1 <= vals[0] <= MAX_SEED_COUNT:
            raise ValueError(f"--seeds {text}: a count must be in [1, {MAX_SEED_COUNT}] (e.g. --seeds 4 for seeds "
                             f"0,1,2,3; one run with seed s: --seed s)")  # fmt: skip
        return list(range(vals[0]))
    if not vals or min(vals) < 0 or max(vals) > MAX_SEED or len(set(vals)) != len(vals):
        raise ValueError(f"--seeds {text}: give a count k (seeds 0..k-1) or distinct integers in [0, {MAX_SEED}], "
                         "e.g. 0,3,7 (one run with seed s: --seed s)")  # fmt: skip
    return vals


def _precheck(run, members: list[int] | None = None) -> None:
    """Refuse, before the "training ..." line, what would fail the run before its first step: the device (CUDA
    asked for, none here), its folders (:func:`loopscale.model.train.check_run_folders`), a checkpoint of another run in ``--checkpoint-dir`` (``members``: the ``--seeds`` of an
    ensemble) and the corpus (a missing file, a text column of a non-Parquet corpus, a token file read as text, ...:
    :func:`loopscale.model.data.check_corpus`, cheap, its warnings left for the run to give once).

    Raises:
        ValueError: as ``train_run`` would raise it (``CheckpointError`` is one).
    """
    import warnings

    from loopscale.model.data import check_corpus, resolve_corpus
    from loopscale.model.train import _resolve_device, check_run_folders, refuse_checkpoint_of_another_run

    _resolve_device(run.device)
    check_run_folders(run, create=False)  # made by the run itself, once nothing else refuses it
    refuse_checkpoint_of_another_run(run, None if members is None else (members, [run.data_seed] * len(members)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if run.corpus == "embedded" and run.text_column != "text":
            resolve_corpus(run.corpus, run.text_column)  # raises: the embedded corpus has no columns
        check_corpus(run.corpus, run.tokenizer, run.model.vocab_size, run.text_column, seq_len=run.model.seq_len,
                     cache_dir=run.cache_dir)  # fmt: skip


def _train_ensemble(run, members: list[int], as_json: bool, notes: list[str]) -> None:
    """``train --seeds``: the members trained as one seed ensemble; one line (or JSON object) per member, exit 1
    when any member did not finish ok. ``notes``: flags without effect, put first in each member's warnings."""
    from loopscale.model.accounting import flops_per_token
    from loopscale.model.ensemble import train_ensemble
    from loopscale.model.train import resolve_tokens

    if not as_json:
        D, m = resolve_tokens(run), run.model
        typer.echo(
            f"training {len(members)} seed{'s' * (len(members) != 1)} {members} of r={m.r} d={m.d_model} as one "
            "seed ensemble on "
            f"{run.corpus!r}: D={D} tokens ({_steps(D // run.batch_tokens)}) and C={flops_per_token(m) * D:.4g} "
            "FLOPs per member",
            err=True,
        )
        typer.echo("  " + _how_trained(run).replace(f", seed={run.seed}", ""), err=True)  # the seeds: above
    shown = _ShownWarnings()
    with shown:
        results = train_ensemble(run, members)
    rows = [{k: r.to_dict()[k] for k in JSON_KEYS} for r in results]
    for o in rows:
        o["warnings"] = [*notes, *o["warnings"]]
    if as_json:
        _dump_json(rows)
    else:
        for o in rows:
            bpb = f", bpb {o['final_val_bpb']:.4f}" if o["final_val_bpb"] is not None else ""
            loss = f"final_val_loss {o['final_val_loss']:.6f}{bpb}" if o["final_val_loss"] is not None else (
                f"diverged at step {o['diverged_step']}")
            typer.echo(f"seed {o['seed']:>4}: {o['status']}, {loss}")
            if by_step := _val_by_step(o["curve"]):
                typer.echo(f"{'':>11}val_loss by step: {by_step}")
        o = rows[0]
        said = _resumed_line(results[0].resumed_from_step, int(o["D"]) // run.batch_tokens, run.checkpoint_dir)
        if said is not None:
            typer.echo(said, err=True)
        tps = o["tokens_per_s"]
        rate = f"{tps:,.0f} tokens/s" if tps is not None and math.isfinite(tps) else "tokens/s not measured"
        typer.echo(f"per member: D {o['D']} tokens, C {o['C']:.4g} FLOPs, {rate}; "
                   f"the ensemble: {o['wall_s']:.1f} s wall, MFU {o['mfu'] if o['mfu'] is None else round(o['mfu'], 3)}")
        # the run's warnings it recorded without showing them (roundings of D, compile time), as a single run says them
        for w in dict.fromkeys(w for r in rows for w in r["warnings"]):
            if w not in notes and w not in shown.messages:
                typer.echo(f"warning: {w}", err=True)
    if any(r.status != "ok" for r in results):
        raise typer.Exit(code=1)


def _spent(out: dict, key: str, batch_tokens: int) -> str:
    """For a diverged run's ``D`` and ``C`` (its definition, which names its cell): what it trained before it
    stopped, e.g. `` (as defined; trained 512 tokens, 1 step, before it diverged)``; else empty."""
    k = out.get("diverged_step")
    if k is None or key not in ("D", "C"):
        return ""
    if key == "D":
        return f" (as defined; trained {k * batch_tokens} tokens, {_steps(k)}, before it diverged)"
    return f" (as defined; spent {out['flops_per_token'] * k * batch_tokens:.4g} FLOPs before it diverged)"


def _steps(n: int) -> str:
    """``1 step``, ``32 steps``."""
    return f"{n} step{'s' * (n != 1)}"


def _val_by_step(curve: list[dict]) -> str | None:
    """With ``--eval-every-steps``: the validation curve as ``step: loss, ...`` (nats/token; the first 12
    evaluations, all of them are in ``--json``'s ``curve``); None for a run evaluated only at its end."""
    evals = [p for p in curve if p.get("val_loss") is not None]
    if len(evals) < 2:
        return None
    text = ", ".join(f"{p['step']}: {p['val_loss']:.4f}" for p in evals[:12])
    return text + (f" ... ({len(evals)} evaluations)" if len(evals) > 12 else "")


def _finite_or_none(v):
    """``v`` with every non-finite float (NaN, inf: e.g. a diverged run's tokens/s) replaced by None."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite_or_none(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite_or_none(x) for x in v]
    return v


def _dump_json(obj) -> None:
    """Print ``obj`` as strict JSON (NaN and inf as null, which strict parsers accept) and a newline."""
    json.dump(_finite_or_none(obj), sys.stdout, allow_nan=False)
    sys.stdout.write("\n")


def _names_and_more(names: list[str], total: int) -> str:
    """``": a, b and 3 more"`` for the first ``names`` of ``total`` documents; empty without names."""
    more = total - len(names)
    return f": {', '.join(names)}" + (f" and {more} more" if more > 0 else "") if names else ""


def _split_text(dd: dict) -> str:
    """How the corpus was split, for the ``data`` line: by document (train / validation documents) or by position
    (one document, or a token file: the token tail is validation)."""
    rule = str(dd.get("split_rule") or "")
    if rule.startswith("token tail"):
        frac = rule.split()[-1]
        n_docs = (dd.get("n_train_docs") or 0) + (dd.get("n_val_docs") or 0)
        what = "a token file" if dd.get("n_train_docs") is None else f"{n_docs} document{'s' * (n_docs != 1)}"
        where = ""
        tail = dd.get("val_tail_docs") or {}  # caches built before it was kept have none
        if names := list(tail.get("names") or []):
            share = 1 - float(tail.get("first_from") or 0)  # of the first document's tokens, validation
            pct = "under 1%" if share < 0.01 else "over 99%" if share > 0.99 else f"{share:.0%}"  # never 0 % or 100 %
            if tail.get("first_from"):
                names[0] = f"the last {pct} of {names[0]}"
            where = (f": {', '.join(names)} and earlier documents" if not tail.get("complete", True)
                     else _names_and_more(names, int(tail.get("n_docs") or 0)))  # fmt: skip
        return f"{what}, split by position: the last {float(frac):.0%} of the tokens are validation{where}"
    named = _names_and_more(dd.get("val_doc_names") or [], dd.get("n_val_docs") or 0)  # older caches: no names
    return f"{dd.get('n_train_docs')} train / {dd.get('n_val_docs')} validation documents{named}; split by {rule}"
