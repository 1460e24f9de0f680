"""``loopscale train``: one training run from the command line (issue 3).

Example::

    loopscale train --preset cpu --d-model 128 --r 2 --tokens 300000 --json

The model flags are those of ``loopscale model info`` (built by
:func:`loopscale.model.cli.config_from_flags`). With ``--tokenizer bpe:<n>`` the model's ``vocab_size`` is set to n
unless ``--vocab-size`` is given.
"""

from __future__ import annotations

import json
import sys

import typer

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
    "optimizer",
    "schedule",
    "seed",
    "data_seed",
    "tokenizer",
    "vocab_size",
    "data",
    "eval_tokens",
    "num_threads",
    "device",
    "time_split",
    "model",
    "corpus",
    "corpus_hash",
    "resumed_from_step",
    "warnings",
    "versions",
)
"""Keys of the ``--json`` object (units: losses nats/token, D tokens, C FLOPs, times seconds)."""


def train_cmd(
    preset: str = typer.Option("cpu", help="Model family: 'paper' or 'cpu'."),
    r: int = typer.Option(1, "--r", help="Recurrences of the shared block."),
    d_model: int | None = typer.Option(None, "--d-model", help="Residual width d."),
    width_scale: int | None = typer.Option(None, "--width-scale", help="Width scale s (d = 64 s)."),
    bptt_k: int | None = typer.Option(
        None, "--bptt-k", help="Truncated BPTT: last k recurrences get gradient."
    ),
    injection: str | None = typer.Option(None, help="linear | additive | passthrough | hyperconnect."),
    hc_lanes: int = typer.Option(2, "--hc-lanes", help="Hyperconnection lanes K."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Override the preset's context length T."),
    vocab_size: int | None = typer.Option(None, "--vocab-size", help="Override the model vocabulary V."),
    effective_depth: int | None = typer.Option(None, "--effective-depth", help="Override effective depth."),
    tokens: int | None = typer.Option(None, "--tokens", help="D: training tokens."),
    target_flops: float | None = typer.Option(
        None, "--target-flops", help="C: training FLOPs (instead of --tokens)."
    ),
    corpus: str = typer.Option(
        "embedded", help="'embedded', text file, dir, glob, .parquet, or .bin/.npy tokens."
    ),
    text_column: str = typer.Option("text", "--text-column", help="Parquet text column."),
    tokenizer: str = typer.Option("byte", help="'byte', 'bpe:<vocab_size>' or 'pretokenized'."),
    batch_tokens: int = typer.Option(2048, "--batch-tokens", help="B: tokens per optimizer step."),
    micro_batch_tokens: int | None = typer.Option(
        None, "--micro-batch-tokens", help="Tokens per micro-batch."
    ),
    optimizer: str = typer.Option("adamw", help="'adamw' or 'muon'."),
    lr: float = typer.Option(3e-3, help="Peak learning rate."),
    schedule: str = typer.Option("linear", help="'linear' (paper), 'cosine' or 'wsd'."),
    warmup_frac: float = typer.Option(0.0, "--warmup-frac", help="Fraction of steps of warmup."),
    final_lr_frac: float = typer.Option(0.1, "--final-lr-frac", help="Final LR as a fraction of the peak."),
    grad_clip: float | None = typer.Option(None, "--grad-clip", help="Clip the gradient norm."),
    seed: int = typer.Option(0, help="Init seed."),
    data_seed: int = typer.Option(0, "--data-seed", help="Data order seed."),
    eval_tokens: int = typer.Option(65536, "--eval-tokens", help="Held-out tokens for validation."),
    eval_every_steps: int | None = typer.Option(None, "--eval-every-steps", help="Evaluate every k steps."),
    checkpoint_dir: str | None = typer.Option(
        None, "--checkpoint-dir", help="Checkpoint folder (resumes from it)."
    ),
    checkpoint_every_steps: int | None = typer.Option(
        None, "--checkpoint-every-steps", help="Checkpoint every k steps."
    ),
    num_threads: int = typer.Option(1, "--num-threads", help="torch threads for this run."),
    device: str = typer.Option("cpu", help="'cpu', 'cuda' or 'auto'."),
    precision: str = typer.Option("fp32", help="'fp32' or 'bf16'."),
    cache_dir: str | None = typer.Option(None, "--cache-dir", help="Token cache folder."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Train one looped LM for D tokens (or C FLOPs) and report its validation loss (nats/token)."""
    from loopscale.model.cli import config_from_flags
    from loopscale.model.data import parse_tokenizer
    from loopscale.model.train import RunConfig, train_run

    try:
        kind, tok_vocab = parse_tokenizer(tokenizer)
        if vocab_size is None and kind == "bpe":
            vocab_size = tok_vocab
        mcfg = config_from_flags(
            preset,
            r,
            d_model,
            width_scale,
            bptt_k,
            injection,
            hc_lanes,
            seq_len,
            vocab_size,
            effective_depth=effective_depth,
        )
        run = RunConfig(
            model=mcfg,
            corpus=corpus,
            text_column=text_column,
            tokenizer=tokenizer,
            tokens=tokens,
            target_flops=target_flops,
            batch_tokens=batch_tokens,
            micro_batch_tokens=micro_batch_tokens,
            optimizer=optimizer,
            lr=lr,
            schedule=schedule,
            warmup_frac=warmup_frac,
            final_lr_frac=final_lr_frac,
            grad_clip=grad_clip,
            seed=seed,
            data_seed=data_seed,
            eval_tokens=eval_tokens,
            eval_every_steps=eval_every_steps,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every_steps=checkpoint_every_steps,
            num_threads=num_threads,
            device=device,
            precision=precision,
            cache_dir=cache_dir,
        )
        if not as_json:
            from loopscale.model.accounting import flops_per_token, n_once, n_rec
            from loopscale.model.train import resolve_tokens

            D = resolve_tokens(run)
            n_eff = n_once(mcfg) + mcfg.r * n_rec(mcfg)
            typer.echo(
                f"training r={mcfg.r} d={mcfg.d_model} on {corpus!r}: D={D} tokens ({D // batch_tokens} steps), "
                f"C={flops_per_token(mcfg) * D:.4g} FLOPs, D/(N_once + r N_rec)={D / n_eff:.3g}",
                err=True,
            )
        res = train_run(run)
    except (ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(code=2) from None
    d = res.to_dict()
    out = {k: d[k] for k in JSON_KEYS}
    if as_json:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
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
        typer.echo(f"{k:>16}: {out[k]}")
    dd = out["data"]
    typer.echo(
        f"{'data':>16}: {dd.get('n_train_tokens')} train / {dd.get('n_val_tokens')} validation tokens "
        f"({dd.get('n_train_docs')} / {dd.get('n_val_docs')} documents, split by {dd.get('split_rule')})"
        + (
            f"; BPE trained on {dd['bpe_training']['docs']} documents, {dd['bpe_training']['bytes']} bytes, "
            f"{dd['bpe_training']['merges']} merges"
            if dd.get("bpe_training")
            else ""
        )
    )
    if res.status != "ok":
        raise typer.Exit(code=1)


__all__ = ["JSON_KEYS", "train_cmd"]
