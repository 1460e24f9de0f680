"""The single-run trainer: one point of a scaling law.

``train_run(RunConfig(...)) -> RunResult`` trains one :class:`~loopscale.model.looped.LoopedLM` on a tokenized
corpus (:mod:`loopscale.model.data`) for exactly D tokens, evaluates mean cross-entropy in nats/token on a fixed
held-out token set, and survives being stopped (atomic checkpoints, exact resume).

Accounting (paper Sec. 2 / 3.2): F = ``flops_per_token(model)`` training FLOPs/token; D is either given
(``tokens``, rounded to whole optimizer steps of B = ``batch_tokens``) or derived from C = ``target_flops`` as
D = round(C / (F B)) B; the result records C = F D.

Gradient accumulation: a step of B tokens is ``B / micro_batch_tokens`` equal micro-batches; each micro-batch loss
is its token mean divided by the number of micro-batches, so the step's gradient is that of the token mean over
the whole batch (identical to one B-token batch up to float rounding; ``test_accumulation_equals_full_batch_gradient``).

Checkpoints: ``<checkpoint_dir>/ckpt-<step>.pt`` written with ``torch.save`` to a temp
file then ``os.replace``; they hold only tensors and plain Python types (RNG states converted to tensors /
lists) and are read with ``torch.load(weights_only=True)`` with no allow-listing; anything else is refused with
:class:`CheckpointError`. The data position is the step: micro-batch j of the run is always the same windows
(:class:`~loopscale.model.data.WindowSampler`), so a resumed run consumes exactly the micro-batches the
uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import pickle
import platform
import random
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from loopscale.model.config import LoopedConfig, _is_real, python_numbers

log = logging.getLogger("loopscale.train")

CHECKPOINT_FORMAT = "loopscale-ckpt-v1"
DEVICES = ("cpu", "cuda", "auto")
PRECISIONS = ("fp32", "bf16")

GPU_BF16_PEAK = (
    (r"\bH200 NVL\b", 835e12),
    (r"\bH200\b", 989e12),
    (r"\bH100 PCIe\b", 756e12),
    (r"\bH100 NVL\b", 835e12),
    (r"\bH100\b", 989e12),
    (r"\bA100\b", 312e12),
    (r"\bL40S\b", 362e12),
    (r"\bL40\b", 181e12),
    (r"\bL4\b", 121e12),
    (r"\bA10\b", 125e12),
)
"""Dense (not sparse) bf16 peak FLOP/s of a GPU, by a pattern of its device name, the first that matches (NVIDIA
data sheets: H100/H200 SXM 989 T, H100 PCIe 756 T, H100/H200 NVL 835 T, A100 312 T, L40S 362 T, L40 181 T,
L4 121 T, A10 125 T); the MFU denominator of bf16 runs on a GPU. A device no pattern matches (an A10G, an RTX
card) has no peak, and its MFU is left empty rather than measured against another card's."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: not loadable with ``weights_only=True``, or from a different run."""


class TornCheckpointError(CheckpointError):
    """A checkpoint file that cannot be read at all (0 bytes, truncated by a crash, not a torch archive)."""


MAX_SEED = 2**32 - 1
"""The largest ``seed`` / ``data_seed`` (torch's and NumPy's generators take larger ones, but a seed past 2**63
overflowed inside torch after the run had started; 2**32 seeds are more than any sweep draws)."""

MAX_SEED_COUNT = 100_000
"""The largest seed count (``--seeds k``, a spec's ``seeds: k``): a larger one is taken for a typo (a count of
10**20 ended in an OverflowError traceback, a count of 10**9 would build a list of a billion seeds)."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


DEFINES_RUN = "loopscale.defines_run"
"""Field-metadata key: True on the :class:`RunConfig` fields that define a run (what is trained, on what data, how
it is measured). The run id of the sweep and the trainer's checkpoint key are both derived from this one
declaration (:func:`run_definition`)."""
SPEC_TRAINING = "loopscale.spec_training"
"""Field-metadata key: present on the :class:`RunConfig` fields a sweep spec's ``training:`` section may override;
its value holds the pydantic constraints of that key (``{"gt": 0}``...)."""


DEFINES_RUN_UNLESS_DEFAULT = "loopscale.defines_run_unless_default"
"""Field-metadata key: True on a run-defining field added after runs were recorded without it. Such a field enters
:func:`run_definition` (so run ids and checkpoint keys) only when set away from its default, the behaviour of the
earlier runs, whose ids therefore stay valid."""


def _defines(default, *, spec: dict | None = None, unless_default: bool = False):
    """A run-defining field (``spec``: the constraints when a spec's ``training:`` section may set it;
    ``unless_default``: see :data:`DEFINES_RUN_UNLESS_DEFAULT`)."""
    md = {DEFINES_RUN: True}
    if unless_default:
        md[DEFINES_RUN_UNLESS_DEFAULT] = True
    if spec is not None:
        md[SPEC_TRAINING] = spec
    return field(default=default, metadata=md)


def _setting(default, *, spec: dict | None = None):
    """A field that changes how, not what, is trained (threads, device, cadences, paths)."""
    return field(default=default, metadata={} if spec is None else {SPEC_TRAINING: spec})


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run. Validated in ``__post_init__`` (``ValueError`` names the field).

    Exactly one horizon: ``tokens`` (D) or ``target_flops`` (C). Fields declared with ``_defines`` define the run
    (see :data:`DEFINES_RUN`, :func:`run_definition`); the others (threads, device, evaluation and checkpoint
    cadence, paths) change how, not what, is trained.
    """

    model: LoopedConfig = field(metadata={DEFINES_RUN: True})
    """Model architecture (``vocab_size`` must be >= the tokenizer's)."""
    corpus: str = _defines("embedded")
    """'embedded' | text file | directory | glob | .parquet file(s) | .bin/.npy token file."""
    text_column: str = _defines("text")
    """Text column of Parquet corpora."""
    tokenizer: str = _defines("byte")
    """'byte' (vocab 256) | 'bpe:<vocab_size>' | 'pretokenized' (token files)."""
    tokens: int | None = _defines(None)
    """D, training tokens (rounded to whole steps of batch_tokens)."""
    target_flops: float | None = _defines(None)
    """C, training FLOPs; D = round(C / (F B)) B."""
    batch_tokens: int = _defines(2048, spec={"gt": 0})
    """B, tokens per optimizer step (a multiple of model.seq_len; the paper: 2^18)."""
    micro_batch_tokens: int | None = _defines(None, spec={"gt": 0})
    """Tokens per forward/backward (gradient accumulation when smaller than batch_tokens); None -> batch_tokens."""
    optimizer: Literal["adamw", "muon", "muonh"] = _defines("adamw", spec={})
    """'adamw' | 'muon' | 'muonh' (the paper's hyperball Muon; see loopscale.model.optim)."""
    orthogonalization: Literal["newton_schulz", "polar_express"] = _defines(
        "newton_schulz", spec={}, unless_default=True
    )
    """How 'muon' / 'muonh' orthogonalise their update: 'newton_schulz' (torch's quintic, 5 steps) | 'polar_express'
    (the paper's, arXiv 2505.16932, 5 steps); 'adamw' takes only the default. Part of the run id only when
    'polar_express'."""
    lr: float = _defines(3e-3)
    """Peak LR (muon / muonh: the matrix LR, times lr_data_factor; the AdamW groups follow at the paper's ratios
    to lr)."""
    lr_data_factor: float = _defines(1.0, unless_default=True)
    """'muon' / 'muonh' only: the matrix groups train at lr * lr_data_factor, the AdamW groups at their ratios to
    lr alone (the paper's data transfer of the Muon LR, (D / D_ref)^-0.32, set per run by a sweep spec's
    lr_data_exponent). Part of the run id only when not 1."""
    schedule: Literal["linear", "cosine", "wsd"] = _defines("linear", spec={})
    """'linear' (paper: no warmup, linear decay to final_lr_frac) | 'cosine' | 'wsd'."""
    warmup_frac: float = _defines(0.0, spec={"ge": 0.0, "lt": 1.0})
    """Fraction of steps of linear warmup."""
    final_lr_frac: float = _defines(0.1, spec={"ge": 0.0, "le": 1.0})
    """The LR the decay ends at, as a fraction f of the peak. ``cosine`` trains its last step at f; ``linear`` (the
    paper's) and ``wsd`` reach f one step after the last, so their last step trains at f + (1 − f) / n, n the steps
    of the decay (:func:`loopscale.model.optim.lr_multiplier`)."""
    decay_frac: float = _defines(0.2, spec={"gt": 0.0, "le": 1.0})
    """'wsd' only: fraction of steps in the final decay (with ``warmup_frac``, at most 1)."""
    weight_decay: float = _defines(0.0, spec={"ge": 0.0})
    """Decoupled weight decay on 2-D matrices (paper: 0; 'muonh' refuses any other value)."""
    grad_clip: float | None = _defines(None, spec={"gt": 0.0})
    """Clip the global gradient norm to this value (paper: none)."""
    seed: int = _defines(0)
    """Model initialisation seed."""
    data_seed: int = _defines(0)
    """Batch-order seed (the same for every r)."""
    eval_tokens: int = _defines(65536, spec={"gt": 0})
    """Size of the fixed held-out token set of the validation loss (nats/token; fewer if the validation split is
    smaller)."""
    eval_every_steps: int | None = _setting(None, spec={"gt": 0})
    """Evaluate every k steps (always at the end; None: at the end only, as the paper)."""
    checkpoint_dir: str | None = _setting(None)
    """Folder of atomic checkpoints; a run resumes from the newest one found there."""
    checkpoint_every_steps: int | None = _setting(None, spec={"gt": 0})
    """Write a checkpoint every k steps (and at the last step): a positive integer, or None for no checkpoints (0
    is refused). With k set, ``train_run`` / ``train_ensemble`` need ``checkpoint_dir`` and raise ValueError before
    any training without it (a sweep ``Cell.run`` has the preset's k but no folder: use
    ``cell.run_config(checkpoint_dir=...)``)."""
    num_threads: int = _setting(1)
    """torch.set_num_threads for this run (the sweep runs several runs side by side)."""
    device: str = _setting("cpu")
    """'cpu' | 'cuda' | 'cuda:<i>' | 'auto'."""
    precision: Literal["fp32", "bf16"] = _defines("fp32", spec={})
    """'fp32' | 'bf16' (autocast; meant for GPU)."""
    compile: bool = _setting(False, spec={})
    """torch.compile the training steps (Inductor; on CPU it needs a C++ compiler, else eager with a warning): the
    loss module (``LMLoss``: model, head, soft-cap and cross-entropy as one graph) is compiled. On CPU, evaluation
    stays eager (its no-grad graph and last, shorter chunk would recompile)."""
    diverge_loss: float = _setting(20.0)
    """A training loss above this (nats/token), NaN or inf ends the run with status 'diverged'."""
    cache_dir: str | None = _setting(None)
    """Token cache and peak-FLOP/s cache folder (None -> $LOOPSCALE_CACHE or ~/.cache/loopscale)."""

    def __post_init__(self) -> None:
        from loopscale.model.data import parse_tokenizer
        from loopscale.model.muon import ORTHOGONALIZATIONS
        from loopscale.model.optim import OPTIMIZERS, SCHEDULES

        python_numbers(self)
        if not isinstance(self.model, LoopedConfig):
            raise ValueError(
                f"model must be a LoopedConfig (see loopscale.model.preset_config), got {type(self.model)!r}"
            )
        T = self.model.seq_len
        if (self.tokens is None) == (self.target_flops is None):
            raise ValueError("give exactly one of tokens (D) or target_flops (C)")
        if self.tokens is not None and (not _is_int(self.tokens) or self.tokens <= 0):
            raise ValueError(f"tokens must be a positive integer (training tokens D), got {self.tokens!r}")
        if self.cache_dir is not None:  # a file in its place: every token-cache write failed with a traceback
            if not isinstance(self.cache_dir, str | os.PathLike) or not str(self.cache_dir):
                raise ValueError(f"cache_dir must be a folder path, or None for $LOOPSCALE_CACHE or "
                                 f"~/.cache/loopscale; got {self.cache_dir!r}")  # fmt: skip
            from loopscale.model.data import usable_cache_dir

            usable_cache_dir(self.cache_dir, "cache_dir")
        if self.target_flops is not None and (
            isinstance(self.target_flops, bool)
            or not isinstance(self.target_flops, int | float)
            or not math.isfinite(self.target_flops)
            or self.target_flops <= 0
        ):
            raise ValueError(
                f"target_flops must be a positive finite number (FLOPs C), got {self.target_flops!r}"
            )
        if not _is_int(self.batch_tokens) or self.batch_tokens <= 0 or self.batch_tokens % T:
            raise ValueError(
                f"batch_tokens must be a positive multiple of model.seq_len={T}, got {self.batch_tokens!r} "
                f"(e.g. {max(1, round(self.batch_tokens / T) if _is_int(self.batch_tokens) else 16) * T})"
            )
        if self.micro_batch_tokens is not None:
            mb = self.micro_batch_tokens
            if not _is_int(mb) or mb <= 0 or mb % T or self.batch_tokens % mb:
                raise ValueError(
                    f"micro_batch_tokens must be a positive multiple of model.seq_len={T} that divides "
                    f"batch_tokens={self.batch_tokens}, got {mb!r}"
                )
        if self.tokens is not None and round(self.tokens / self.batch_tokens) < 1:
            raise ValueError(
                f"tokens={self.tokens} is at most half a batch (batch_tokens={self.batch_tokens}), so it rounds to "
                f"no optimizer step; use tokens >= {self.batch_tokens} or a smaller batch_tokens"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.orthogonalization not in ORTHOGONALIZATIONS:
            raise ValueError(
                f"orthogonalization must be one of {ORTHOGONALIZATIONS}, got {self.orthogonalization!r}"
            )
        if self.optimizer == "adamw" and self.orthogonalization != "newton_schulz":
            raise ValueError(
                f"orthogonalization={self.orthogonalization!r} needs optimizer 'muon' or 'muonh' (AdamW does not "
                "orthogonalise its update)"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("lr", "weight_decay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        v = self.lr_data_factor
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"lr_data_factor must be a finite number > 0, got {v!r}")
        if self.optimizer == "adamw" and v != 1:
            raise ValueError(
                f"lr_data_factor={v!r} needs optimizer 'muon' or 'muonh' (it scales the matrix LR of Muon only, as "
                "the paper's data transfer does); with 'adamw' scale lr itself"
            )
        if self.optimizer == "muonh" and self.weight_decay:
            raise ValueError(
                f"weight_decay={self.weight_decay!r} with optimizer 'muonh': MuonH has no weight decay (every "
                "matrix stays on the sphere of its initial norm, where decay is a first-order no-op); use "
                "weight_decay 0, or optimizer 'muon' or 'adamw' for decay"
            )
        for name in ("warmup_frac", "final_lr_frac", "decay_frac", "diverge_loss"):
            if not _is_real(getattr(self, name)):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
        if self.grad_clip is not None and not _is_real(self.grad_clip):
            raise ValueError(f"grad_clip must be None or a number > 0, got {self.grad_clip!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be True or False, got {self.compile!r}")
        if not 0 <= self.warmup_frac < 1:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac!r}")
        if not 0 <= self.final_lr_frac <= 1:
            raise ValueError(f"final_lr_frac must be in [0, 1], got {self.final_lr_frac!r}")
        if not 0 < self.decay_frac <= 1:
            raise ValueError(f"decay_frac must be in (0, 1], got {self.decay_frac!r}")
        if self.schedule == "wsd" and self.warmup_frac + self.decay_frac > 1:  # the decay would start in the warmup
            raise ValueError(
                f"schedule 'wsd' is warmup, constant, then the decay over the last decay_frac of the steps, so "
                f"warmup_frac + decay_frac must be <= 1; got {self.warmup_frac!r} + {self.decay_frac!r} (the LR "
                "would warm up to the peak, then drop at once to where the decay had got to)"
            )
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be None or > 0, got {self.grad_clip!r}")
        for name in ("seed", "data_seed"):
            if not _is_int(getattr(self, name)) or not 0 <= getattr(self, name) <= MAX_SEED:
                raise ValueError(f"{name} must be an integer in [0, {MAX_SEED}], got {getattr(self, name)!r}")
        if not _is_int(self.eval_tokens) or self.eval_tokens < 1:
            raise ValueError(f"eval_tokens must be a positive integer, got {self.eval_tokens!r}")
        for name in ("eval_every_steps", "checkpoint_every_steps"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 1):
                raise ValueError(f"{name} must be None or a positive integer, got {v!r}")
        if not _is_int(self.num_threads) or self.num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer, got {self.num_threads!r}")
        if self.device not in DEVICES and not re.fullmatch(r"cuda:\d+", str(self.device)):
            raise ValueError(f"device must be one of {DEVICES} or 'cuda:<i>', got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not self.diverge_loss > 0:
            raise ValueError(f"diverge_loss must be > 0 (nats/token), got {self.diverge_loss!r}")
        kind, vocab = parse_tokenizer(self.tokenizer)
        if kind != "pretokenized" and self.model.vocab_size < vocab:
            raise ValueError(
                f"model.vocab_size={self.model.vocab_size} is smaller than the tokenizer's vocabulary "
                f"({self.tokenizer!r}: {vocab}); set vocab_size to {vocab} (--vocab-size on the command line, "
                "model.vocab_size in a spec)"
            )

    @property
    def micro_tokens(self) -> int:
        """Tokens per micro-batch (micro_batch_tokens or batch_tokens)."""
        return self.micro_batch_tokens or self.batch_tokens

    def to_dict(self) -> dict:
        """Plain-dict form (the model config nested as a dict); inverse of :meth:`from_dict`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """The config of :meth:`to_dict` (``model`` as a dict or a LoopedConfig). Raises ValueError like the
        constructor."""
        m = d["model"]
        return cls(**{**d, "model": m if isinstance(m, LoopedConfig) else LoopedConfig(**m)})


def run_optimizers(model, cfg: RunConfig):
    """:func:`loopscale.model.optim.build_optimizers` for ``model`` (a LoopedLM or EnsembleLM) with the optimizer
    settings of ``cfg``: optimizer, lr, weight_decay, orthogonalization and lr_data_factor (the matrix LR's
    factor). Returns (optimizers, assignment)."""
    from loopscale.model.optim import build_optimizers

    return build_optimizers(
        model,
        cfg.optimizer,
        cfg.lr,
        cfg.weight_decay,
        orthogonalization=cfg.orthogonalization,
        matrix_lr_factor=cfg.lr_data_factor,
    )


def key_differences(saved: dict, now: dict) -> list[str]:
    """The fields in which two checkpoint keys (:func:`checkpoint_key`) differ, those present in either one
    (a field at its default is absent from the key: :data:`DEFINES_RUN_UNLESS_DEFAULT`); within the model config
    (a dict in both) its own fields, as ``model.r``."""
    out = []
    for k in sorted({*saved, *now}):
        a, b = saved.get(k), now.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{k}.{f}" for f in key_differences(a, b)]
        else:
            out.append(k)
    return out


def run_defining_fields() -> tuple[str, ...]:
    """Names of the :class:`RunConfig` fields that define a run (declared with :data:`DEFINES_RUN`)."""
    return tuple(f.name for f in dataclasses.fields(RunConfig) if f.metadata.get(DEFINES_RUN))


def run_definition(cfg: RunConfig) -> dict:
    """The run-defining fields of ``cfg`` as a plain dict (the model config as a dict): what the sweep's run id
    hashes and what the trainer's checkpoint key holds (with D and the corpus hash added)."""
    out = {}
    for f in dataclasses.fields(RunConfig):
        if f.metadata.get(DEFINES_RUN):
            v = getattr(cfg, f.name)
            if not (f.metadata.get(DEFINES_RUN_UNLESS_DEFAULT) and v == f.default):
                out[f.name] = v
    out["model"] = cfg.model.to_dict()
    return out


def checkpoint_key(cfg: RunConfig, D: int, corpus_hash: str) -> dict:
    """What a checkpoint must match to be resumed by ``cfg``: its run definition plus the resolved D (tokens)
    and the hash of the corpus actually read."""
    return {**run_definition(cfg), "D": int(D), "corpus_hash": corpus_hash}


def ensemble_key(key: dict, seeds: list[int], data_seeds: list[int]) -> dict:
    """A seed ensemble's checkpoint key: a member's :func:`checkpoint_key` with its ``seed`` and ``data_seed``
    replaced by the members' lists (used by ``train_ensemble`` and :func:`refuse_checkpoint_of_another_run`)."""
    return {**{f: v for f, v in key.items() if f not in ("seed", "data_seed")}, "seeds": list(seeds),
            "data_seeds": list(data_seeds)}  # fmt: skip


def check_run_key(path, saved: dict, now: dict) -> None:
    """Refuse the checkpoint at ``path`` when its key ``saved`` is not ``now`` (:func:`checkpoint_key`, or
    :func:`ensemble_key`): the run that wrote it is another.

    Raises:
        CheckpointError: naming the fields that differ (:func:`key_differences`); a seed ensemble's checkpoint met
            by a single run (or the other way round) is said as such, with the fields that differ besides the
            seeds (the two kinds name them otherwise: ``seed``, ``data_seed`` against ``seeds``, ``data_seeds``).
    """
    if saved == now:
        return
    if ("seeds" in saved) == ("seeds" in now):
        detail = f"differs in {key_differences(saved, now)}"
        a, b = saved.get("seeds"), now.get("seeds")
        if isinstance(a, list) and isinstance(b, list) and a != b and sorted(a) == sorted(b):
            # an ensemble's members are stacked in their order: the same seeds in another order are another run
            detail += f"; it holds these seeds in another order, {a}, which is part of the run: give them so"
    else:
        def kind(key: dict) -> str:
            return (f"a seed ensemble (seeds {key.get('seeds')})" if "seeds" in key else
                    f"a single run (seed {key.get('seed')})")  # fmt: skip

        seedless = [{f: v for f, v in k.items() if f not in ("seed", "data_seed", "seeds", "data_seeds")}
                    for k in (saved, now)]  # fmt: skip
        rest = key_differences(*seedless)
        detail = f"it was written by {kind(saved)}, and this is {kind(now)}" + (f"; it differs also in {rest}" if rest else "")
    raise CheckpointError(f"checkpoint {str(path)!r} belongs to a different run ({detail}); use another "
                          "checkpoint_dir or delete it")  # fmt: skip


def refuse_checkpoint_of_another_run(cfg: RunConfig, members: tuple[list[int], list[int]] | None = None) -> None:
    """Before the corpus is read: raise when the newest checkpoint in ``cfg.checkpoint_dir`` belongs to another run,
    comparing every field of the checkpoint key but the corpus hash (known only once the corpus is read; the run
    compares it then). Only the key is read (``torch.load(mmap=True)``: tensors stay on disk); a checkpoint that
    cannot be read is left to the run, which moves a torn one aside or refuses an unsafe one. ``members``: (seeds,
    data seeds) of a seed ensemble (:func:`ensemble_key`), None for a single run.

    Raises:
        CheckpointError: the checkpoint of a different run, naming the fields that differ (as the run would).
    """
    import torch

    path = latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint_dir is not None else None
    if path is None:
        return
    try:
        st = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # torn or unsafe: the run says so (and moves a torn one aside)
        return
    saved = st.get("run_key") if isinstance(st, dict) and st.get("format") == CHECKPOINT_FORMAT else None
    if not isinstance(saved, dict):
        return
    now = checkpoint_key(cfg, resolve_tokens(cfg), saved.get("corpus_hash"))
    check_run_key(path, saved, now if members is None else ensemble_key(now, *members))


@dataclass
class RunResult:
    """What one run measured. Losses in nats/token, times in seconds, FLOPs in FLOPs, D in tokens."""

    status: str
    """'ok' | 'diverged' (NaN/inf or exploding training loss: no final loss) | 'did_not_learn' (trained to the end,
    final loss not below ln V or a model collapsed to one prediction: :data:`DID_NOT_LEARN`)."""
    final_val_loss: float | None
    """Mean CE on the fixed held-out set at the end (None when diverged)."""
    best_val_loss: float | None
    final_val_bpb: float | None
    """Bits per byte of final_val_loss (byte and BPE tokenizers; None for pre-tokenized corpora)."""
    diverged_step: int | None
    model: dict
    N_once: int
    N_rec: int
    N_unique: int
    flops_per_token: int
    D: int
    """Training tokens of the run as defined (``steps * batch_tokens``): a diverged run stopped after
    ``diverged_step`` steps and keeps its planned D, which is what names its cell."""
    C: float
    """Training FLOPs of the run as defined, ``flops_per_token * D`` (a diverged run spent
    ``flops_per_token * diverged_step * batch_tokens``)."""
    batch_tokens: int
    micro_batch_tokens: int
    steps: int
    """Optimizer steps of the run as defined (a diverged run stopped at ``diverged_step``)."""
    optimizer: str
    orthogonalization: str | None
    """'newton_schulz' | 'polar_express' for 'muon' / 'muonh'; None for 'adamw'."""
    lr: float
    lr_data_factor: float
    """The matrix groups' peak LR is lr * lr_data_factor (1 but for a spec's lr_data_exponent)."""
    schedule: str
    warmup_frac: float
    final_lr_frac: float
    seed: int
    data_seed: int
    corpus: str
    corpus_hash: str
    tokenizer: str
    vocab_size: int
    """The model's vocabulary V (as configured; the corpus's largest id + 1 is ``corpus_vocab_size``)."""
    corpus_vocab_size: int
    """Vocabulary the corpus needs: the tokenizer's, or the largest id + 1 of a pre-tokenized file."""
    epochs: float
    eval_tokens: int
    curve: list[dict]
    """Loss curve: dicts with step, tokens, train_loss, val_loss (None between evals), lr."""
    wall_s: float
    """Wall time of the run (s) over all its attempts: a resumed run adds the time its earlier attempts took up to
    the checkpoint it resumed from (steps redone after that checkpoint count once). A rerun of a finished run
    (resumed from the checkpoint of its last step, nothing trained) reports the time that checkpoint recorded: the
    finished run's, less its last checkpoint's save and the did-not-learn check (:func:`run_wall`)."""
    tokens_per_s: float
    """Training tokens per second (eval excluded) over the training steps of all attempts (a resumed run adds those
    its checkpoint recorded); NaN when no step was timed (:func:`throughput`)."""
    mfu: float | None
    """Achieved training FLOP/s / peak_flops."""
    peak_flops: float | None
    peak_flops_source: str
    time_split: dict
    """Seconds spent in data, forward_backward, optimizer, eval, checkpoint and in all (``total``), in this process
    only (``wall_s`` counts the earlier attempts too)."""
    num_threads: int
    device: str
    compiled: bool
    """Whether the training steps ran torch.compile-d: ``compile`` asked for and not fallen back to eager
    (:func:`loopscale.model.looped.compile_fallback`); evaluation on CPU is eager either way."""
    versions: dict
    optimizer_assignment: dict
    """Which parameters each optimizer got (names by optimizer)."""
    micro_batch_ids: list[int]
    """Global indices of the micro-batches consumed, in order (whole run, across resumes)."""
    data_digest: str
    """sha256 chain over the window ids of every consumed micro-batch."""
    resumed_from_step: int | None
    warnings: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    """What the run trained and validated on: ``split_rule``, ``n_train_tokens``, ``n_val_tokens``,
    ``n_train_docs``, ``n_val_docs``, split by document ``val_doc_names`` (the first
    :data:`loopscale.model.data.VAL_NAMES_KEPT` validation documents; absent for a cache built before they were
    kept), split by position ``val_tail_docs`` (the documents the validation tail covers: ``names``, ``n_docs``,
    ``first_from``, the share of the first one that stays training; absent for a token file or an older cache)
    and, for BPE, ``bpe_training`` (docs, bytes, merges the tokenizer learned)."""

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------------------
# Peak FLOP/s (MFU denominator)
# --------------------------------------------------------------------------------------------------------

_PEAK_CACHE: dict[str, float] = {}


def peak_flops(
    device, num_threads: int, cache_dir: str | Path | None = None, precision: str = "bf16"
) -> tuple[float | None, str]:
    """MFU denominator in FLOP/s and how it was obtained.

    CPU: measured fp32 matmul FLOP/s (1024 x 1024 @ 1024 x 1024, best of repeated ~0.3 s of work) at
    ``num_threads`` threads, measured once per process and (CPU, threads, torch version), and kept in
    ``<cache_dir>/peak_flops.json`` as the highest rate ever measured there: a measurement taken while other
    processes share the core (on 2 vCPUs of one core, the sibling's load halves it) reads low, and a stale low
    value would make MFU read high.
    GPU: the dense bf16 peak of the device from :data:`GPU_BF16_PEAK`; None when the device is unknown, or when
    ``precision`` is not ``"bf16"`` (an fp32 run's rate depends on TF32 settings this table does not cover).
    """
    import re

    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if precision != "bf16":
            return None, f"no {precision} peak for GPU {name} (MFU is measured against the bf16 peak of bf16 runs)"
        for pattern, v in GPU_BF16_PEAK:
            if re.search(pattern, name):
                return v, f"bf16 dense peak of {name}"
        return None, f"unknown GPU {name}"
    key = f"cpu|{platform.machine()}|{platform.processor()}|{os.cpu_count()}|t{num_threads}|torch{torch.__version__}"
    if key in _PEAK_CACHE:
        return _PEAK_CACHE[key], "measured fp32 matmul (cached)"
    from loopscale.model.data import default_cache_dir

    path = (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()) / "peak_flops.json"
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = {}
    prev = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        n = 1024
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        best = 0.0
        for _ in range(3):
            reps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 0.1:
                torch.mm(a, b)
                reps += 1
            best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    finally:
        torch.set_num_threads(prev)
    if isinstance(stored.get(key), int | float) and float(stored[key]) > best:
        _PEAK_CACHE[key] = float(stored[key])  # an earlier, quieter measurement on this machine
        return _PEAK_CACHE[key], "measured fp32 matmul (highest on record)"
    _PEAK_CACHE[key] = best
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stored[key] = best
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(stored), encoding="utf-8")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError:
        pass
    return best, "measured fp32 matmul"


# --------------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------------


CODE_PATHS = ("model", "sweep", "fit", "cluster", "pyproject.toml")
"""The paths of loopscale's checkout that make its code (the four packages and the dependency pins): a change
elsewhere leaves :func:`loopscale_version` clean."""


def loopscale_version() -> str:
    """loopscale's version: its installed metadata's (``"not installed"`` for a source tree that is not), with
    ``+git.<commit>`` (and ``.dirty`` when the code differs from it: tracked files of :data:`CODE_PATHS`; an edited
    README, test or docs page, or a run folder refitted inside the checkout, changes no result) where the package
    runs from loopscale's own git checkout, as an editable install does: the metadata's version stays the same from
    commit to commit. A copy installed into a folder of another git repository (e.g. a ``.venv`` inside a project)
    is no checkout of loopscale: that repository's commit is not reported (:func:`_source_checkout`)."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    try:
        own = version("loopscale")
    except PackageNotFoundError:
        own = "not installed"
    root = Path(__file__).resolve().parents[1]
    if not _source_checkout(root):
        return own
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)  # fmt: skip
        if sha.returncode != 0 or not sha.stdout.strip():
            return own
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                *CODE_PATHS], capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return own
    return f"{own}+git.{sha.stdout.strip()}" + (".dirty" if dirty.stdout.strip() else "")


def _source_checkout(root: Path) -> bool:
    """Whether ``root`` (the folder above the package's ``model/``) is loopscale's source root in a git checkout:
    it holds this project's ``pyproject.toml`` (``name = "loopscale"``) and the package folders ``model/``,
    ``sweep/``, ``fit/`` and ``cluster/``, and the git repository that holds it tracks that ``pyproject.toml`` and
    this module. An installed copy (``site-packages/loopscale/``) has no ``pyproject.toml`` and is never one, also
    where ``site-packages`` lies in another project's repository."""
    import subprocess
    import tomllib

    if not all((root / d).is_dir() for d in ("model", "sweep", "fit", "cluster")):
        return False
    try:
        name = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8")).get("project", {}).get("name")
    except (OSError, ValueError):
        return False
    if name != "loopscale":
        return False
    try:
        tracked = subprocess.run(["git", "-C", str(root), "ls-files", "--error-unmatch", "--", "pyproject.toml",
                                  "model/train.py"], capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return tracked.returncode == 0


def run_versions() -> dict[str, str]:
    """The versions a run's result records (``versions``; runs.parquet's ``versions`` column as JSON): loopscale's
    (:func:`loopscale_version`), torch's, NumPy's and Python's."""
    import torch

    return {"loopscale": loopscale_version(), "torch": torch.__version__, "numpy": np.__version__,
            "python": sys.version.split()[0]}  # fmt: skip


def _rng_state() -> dict:
    """Global RNG states as tensors / plain types (loadable with weights_only=True, no allow-listing)."""
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    py = random.getstate()
    out = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {
            "version": int(py[0]),
            "state": torch.tensor(py[1], dtype=torch.int64),
            "gauss": None if py[2] is None else float(py[2]),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [s for s in torch.cuda.get_rng_state_all()]
    return out


def _set_rng_state(s: dict) -> None:
    import torch

    torch.set_rng_state(s["torch"])
    n = s["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = s["python"]
    random.setstate((p["version"], tuple(int(x) for x in p["state"].tolist()), p["gauss"]))
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def save_checkpoint(path: str | Path, state: dict) -> Path:
    """Write ``state`` atomically (temp file in the same folder, then ``os.replace``)."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no temporary file
    return path


def load_checkpoint(path: str | Path) -> dict:
    """Load a checkpoint with ``torch.load(weights_only=True)`` (no allow-listing).

    Raises:
        TornCheckpointError: the file cannot be read at all: empty, not a ``torch.save`` zip archive (cut short by
            a crash, or a file of another kind under a checkpoint's name), or an archive torch cannot read.
        CheckpointError: the file holds objects other than tensors and plain types (e.g. an arbitrary pickled
            object), or is not a loopscale checkpoint.
    """
    import zipfile

    import torch

    try:
        size = Path(path).stat().st_size
    except OSError as e:
        raise TornCheckpointError(f"checkpoint {str(path)!r} cannot be read: {e}") from None
    if size == 0:
        raise TornCheckpointError(f"checkpoint {str(path)!r} cannot be read: it is empty (0 bytes)")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a file cut short loses its end record
        raise TornCheckpointError(
            f"checkpoint {str(path)!r} cannot be read: it is not a torch.save archive ({size} bytes; cut short "
            "by a crash, or another file under a checkpoint's name)"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"checkpoint {str(path)!r} was refused by torch.load(weights_only=True): it holds objects that are not "
            f"tensors or plain Python types ({first}). loopscale never turns safe loading off; delete the file "
            "(or the checkpoint_dir) to start the run afresh."
        ) from None
    except (RuntimeError, EOFError, OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise TornCheckpointError(f"checkpoint {str(path)!r} cannot be read: {str(e) or type(e).__name__}") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a {CHECKPOINT_FORMAT} checkpoint")
    return state


_CKPT_RE = re.compile(r"^ckpt-(\d+)\.pt$")


def latest_checkpoint(checkpoint_dir: str | Path | None) -> Path | None:
    """Newest ``ckpt-<step>.pt`` in ``checkpoint_dir`` (None when there is none)."""
    if checkpoint_dir is None or not Path(checkpoint_dir).is_dir():
        return None
    found = [(int(m.group(1)), p) for p in Path(checkpoint_dir).iterdir() if (m := _CKPT_RE.match(p.name))]
    return max(found)[1] if found else None


def _newest_readable_checkpoint(checkpoint_dir: str | Path | None) -> tuple[Path | None, dict | None]:
    """(path, state) of the newest checkpoint that can be read; (None, None) when there is none. A torn one
    (:class:`TornCheckpointError`) is renamed to ``<name>.unreadable`` with a warning and the next older one is
    tried, so a crash mid-write costs the steps since the previous checkpoint, never the run. A checkpoint
    refused by safe loading still raises :class:`CheckpointError`."""
    while (path := latest_checkpoint(checkpoint_dir)) is not None:
        try:
            return path, load_checkpoint(path)
        except TornCheckpointError as e:
            os.replace(path, path.with_name(path.name + ".unreadable"))
            older = latest_checkpoint(checkpoint_dir) is not None  # (it had said "an older one" when none was left)
            goes_on = "resuming from an older one" if older else "no older one is left: training from step 0"
            warnings.warn(f"{e}; moved aside to {path.name}.unreadable, {goes_on}", stacklevel=2)
    return None, None


_DATA_SUMMARY_KEYS = ("split_rule", "n_train_tokens", "n_val_tokens", "n_train_docs", "n_val_docs", "val_doc_names",
                      "val_tail_docs", "bpe_training")

# --------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------


def accumulate_gradients(loss_fn, windows, n_micro: int, autocast=None) -> float:
    """Forward/backward over ``windows`` (int64 tensor [b, T + 1]) split into ``n_micro`` equal micro-batches.

    ``loss_fn`` maps a micro-batch of windows [b / n_micro, T + 1] to its token-mean cross-entropy (nats/token):
    a :class:`loopscale.model.looped.LMLoss`, compiled or not. Each micro-batch adds grad(token-mean CE /
    n_micro), so the accumulated gradient is that of the token mean over all b T targets (not a mean of unequal
    micro means). Returns the batch mean loss (nats/token).

    Raises:
        ValueError: b not divisible by n_micro.
    """
    import torch

    b = windows.shape[0]
    if n_micro < 1 or b % n_micro:
        raise ValueError(f"n_micro={n_micro} must divide the number of windows {b}")
    total = None
    for chunk in windows.chunk(n_micro):
        with autocast() if autocast else torch.enable_grad():
            loss = loss_fn(chunk) / n_micro
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    return float(total)  # one device sync per step


def _evaluate(loss_fn, ev, micro_windows: int, autocast) -> float:
    """Token-mean validation loss (nats/token) of the windows ev [n, T + 1] under ``loss_fn`` (an LMLoss)."""
    import torch

    was = loss_fn.training
    loss_fn.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for chunk in ev.split(max(1, micro_windows)):
            with autocast():
                total += float(loss_fn(chunk, "sum"))
            n += chunk[:, 1:].numel()
    loss_fn.train(was)
    return total / n


def unused_vocab_note(vocab_size: int, tokenizer: str, corpus_ids: int | None = None) -> str | None:
    """The warning for a model vocabulary well above the tokenizer's ids, or None.

    Rows of the embedding and the output head beyond the tokenizer's ``n`` ids are never an input or a target; the
    head still computes their logits, so F and C (training FLOPs, paper Sec. 3.2) count them. A few rows of padding
    (the paper's 32064 for a 32000 BPE) are usual; the note is given beyond max(64, n / 10) extra rows. A
    ``pretokenized`` corpus's vocabulary is not known (its largest id is not its size): with ``corpus_ids`` (its
    largest id + 1, once the file is read) the note is given only for a vocabulary more than twice that and over 64
    rows above it (a shard of a larger tokenizer's text may lack its rarest ids; not half of them); without it, none.
    """
    from loopscale.model.data import parse_tokenizer

    kind, n = parse_tokenizer(tokenizer)
    if kind == "pretokenized":
        if corpus_ids is None or vocab_size - corpus_ids <= max(64, corpus_ids):
            return None
        return (f"vocab_size={vocab_size} is {vocab_size - corpus_ids} rows more than the token file needs (its "
                f"largest id is {corpus_ids - 1}): those rows of the embedding and output head are never an input "
                "or a target, yet the head computes their logits (F and C count them); set vocab_size to the "
                f"vocabulary of the tokenizer that wrote the file (at least {corpus_ids}: `loopscale train "
                "--vocab-size`, a spec's model.vocab_size)")  # fmt: skip
    extra = vocab_size - n
    if extra <= max(64, n // 10):
        return None
    return (f"vocab_size={vocab_size} is {extra} rows more than the {tokenizer} tokenizer's {n} ids: those rows of "
            f"the embedding and output head are never an input or a target, yet the head computes their logits (F "
            f"and C count them); set vocab_size to {n} (`loopscale train --vocab-size {n}`, a spec's "
            f"model.vocab_size; the paper preset's own is 32064, for its 32000-token BPE)")  # fmt: skip


COLLAPSE_SPREAD = 1e-4
"""A trained model whose logits vary by at most this much (absolute, over positions, for every vocabulary entry)
predicts one next-token distribution whatever its input: it collapsed (:func:`collapse_note`). An untrained model's
logits vary by 0.015-0.06 over positions (cpu preset, d = 16-256); a learning one's far more."""

COLLAPSE_POSITIONS = 64
"""Positions of the one validation window whose logits :func:`collapse_note` compares (a causal model's first
positions: the check costs a forward of that many tokens, whatever ``seq_len`` and the vocabulary)."""


DID_NOT_LEARN = "did_not_learn"
"""Status of a run that trained to its end (lr > 0) but learned nothing a scaling law can use: its final validation
loss is not below ln V (:func:`not_learned_note`), or its model collapsed to one prediction (:func:`collapse_note`).
Its final loss is kept; fits leave it out, as they leave out diverged runs (status not ok)."""


def not_learned_note(final_val: float, vocab_size: int, lr: float) -> str | None:
    """The warning of a run whose final validation loss (nats/token) is not below ln V, the loss of the uniform
    prediction an untrained model starts at (the LR trials' "did not learn" rule), else None. Measured: the smoke
    grid at LR 30 ended 4 of its runs at 8.6-11.3 nats/token against ln 256 = 5.55, under the divergence threshold,
    and they were fitted as ok runs."""
    start = math.log(vocab_size)
    if final_val < start:  # NaN is not below it
        return None
    return (f"the run did not learn: its final validation loss {final_val:.4f} nats/token is not below ln V = "
            f"{start:.4f}, the loss of a uniform prediction over the vocabulary (status {DID_NOT_LEARN}: fits leave it "
            f"out); lr={lr:g} is likely too high, or the run too short")  # fmt: skip


def collapse_note(logits, final_val: float, lr: float) -> str | None:
    """The warning for a run whose model collapsed to a constant prediction, or None.

    An LR far too high can drive a model to output the same next-token distribution at every position, whatever
    the input (measured: d = 16, byte vocabulary, LR 5 and 50: logits equal at every position, validation loss
    5.12 and 5.28 nats/token, constant from then on, against 3.14 at LR 0.3); the run does not diverge, but its
    loss says nothing about the model family: its status is :data:`DID_NOT_LEARN`.

    Args:
        logits: one model's logits [b, t, V] on validation windows (float).
        final_val: the run's final validation loss (nats/token), for the message.
        lr: the run's LR, for the message.

    Returns:
        The warning when every logit varies by at most :data:`COLLAPSE_SPREAD` over the positions, else None.
    """
    flat = logits.detach().float().flatten(0, -2)  # [b t, V]
    if flat.shape[0] < 2 or float((flat - flat.mean(dim=0)).abs().max()) > COLLAPSE_SPREAD:
        return None
    return (f"the model collapsed: it predicts the same next-token distribution at every position whatever its "
            f"input (logits equal within {COLLAPSE_SPREAD:g}), so its final loss {final_val:.4f} nats/token measures "
            f"no learning (status {DID_NOT_LEARN}: fits leave it out); lr={lr:g} is likely too high")  # fmt: skip


def did_not_learn_note(final_val: float, vocab_size: int, lr: float, logits) -> str | None:
    """Why a run that trained to its end with ``lr`` > 0 has status :data:`DID_NOT_LEARN`, or None: its final
    validation loss is not below ln V (:func:`not_learned_note`), or its model, whose ``logits`` [b, t, V] are those of
    :func:`prediction_logits`, collapsed to one prediction (:func:`collapse_note`). Used by ``train_run`` and, per
    member, ``train_ensemble``."""
    return not_learned_note(final_val, vocab_size, lr) or collapse_note(logits, final_val, lr)


def prediction_logits(model, ev, autocast):
    """Logits of ``model`` (a LoopedLM [b, t, V] or an EnsembleLM [k, b, t, V]) on the first validation window's
    first :data:`COLLAPSE_POSITIONS` input tokens (ev: int64 windows [n, T + 1]), as float, without gradients."""
    import torch

    with torch.no_grad(), autocast():
        return model(ev[:1, : min(ev.shape[1] - 1, COLLAPSE_POSITIONS)]).float()


def _resolve_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available; use device='cpu' or 'auto'")
    return dev


TRAIN_STATE_BYTES_PER_PARAM = 12
"""Least memory a trained parameter takes, in bytes: fp32 weight, gradient and one optimizer state (AdamW keeps
two, Muon one momentum); activations come on top."""


def device_memory_bytes(device) -> int | None:
    """Total memory of ``device`` in bytes: the GPU's (``torch.cuda.get_device_properties``), or the machine's
    physical memory for CPU (``os.sysconf``); None when it cannot be read."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None


def train_state_bytes(mcfg: LoopedConfig) -> int:
    """The lower bound of one model's training memory in bytes: :data:`TRAIN_STATE_BYTES_PER_PARAM` (fp32 weights,
    gradients and one optimizer state) per parameter, ``n_total`` (embeddings included); activations not counted."""
    from loopscale.model.accounting import n_total

    return TRAIN_STATE_BYTES_PER_PARAM * n_total(mcfg)


def lane_heavy_params(mcfg: LoopedConfig) -> int:
    """The hyperconnection weights of ``mcfg`` (r (K^2 + 2K), K = ``hc_lanes``; counted in N_rec) when they are most
    of its parameters, else 0: a model that does not fit in memory for its lanes is told to lower K, not its width."""
    from loopscale.model.accounting import _inject_params, n_total

    lanes = _inject_params(mcfg) if mcfg.injection == "hyperconnect" else 0
    return lanes if 2 * lanes > n_total(mcfg) else 0


def memory_need_text(need: int, total: int, device) -> str:
    """``need at least X GiB for ... and this <type> device has Y GiB``: the bound of :func:`train_state_bytes`
    (``need`` bytes, all models counted) against ``total`` bytes of ``device``, as the memory refusals say it."""
    gib = 2.0**30
    return (
        f"need at least {need / gib:,.1f} GiB for fp32 weights, gradients and one optimizer state "
        f"({TRAIN_STATE_BYTES_PER_PARAM} bytes per parameter, activations not counted), and this {device.type} device "
        f"has {total / gib:,.1f} GiB"
    )


def check_fits_memory(mcfg: LoopedConfig, device, members: int = 1) -> None:
    """Refuse a model whose weights, gradients and optimizer state alone exceed the device's memory, before it is
    built (a d_model of 100000 asked torch for 40 GB and ended in an allocator traceback). A lower bound:
    :func:`train_state_bytes` times ``members``; a model under it may still not fit once activations are counted.

    Raises:
        ValueError: the bound exceeds :func:`device_memory_bytes` (the message gives both in GiB).
    """
    from loopscale.model.accounting import n_total

    total = device_memory_bytes(device)
    need = train_state_bytes(mcfg) * members
    if total is not None and need > total:
        who = f"{members} models of {n_total(mcfg):,} parameters" if members > 1 else f"{n_total(mcfg):,} parameters"
        fix = "use a smaller d_model (or width_scale)"
        if lanes := lane_heavy_params(mcfg):  # the lanes' mixing weights are most of it: K is what to lower
            fix = (f"{lanes:,} of them are the hyperconnection weights of hc_lanes={mcfg.hc_lanes} (r (K^2 + 2K) "
                   "parameters): use fewer lanes (the paper uses 2)")  # fmt: skip
        raise ValueError(
            f"the model does not fit in memory: {who} (d_model={mcfg.d_model}) {memory_need_text(need, total, device)}; "
            + fix
        )


def resolve_tokens(cfg: RunConfig) -> int:
    """D in tokens: ``tokens`` rounded to whole batches, or round(C / (F B)) B from ``target_flops``
    (paper Sec. 2; :func:`loopscale.model.accounting.tokens_for_flops`). Python's ``round``, as the authors' code:
    a budget of exactly k + 1/2 batches goes to the even step count (5,120 tokens at B = 2,048 trains 4,096,
    7,168 trains 8,192)."""
    from loopscale.model.accounting import tokens_for_flops

    if cfg.target_flops is not None:
        return tokens_for_flops(cfg.model, float(cfg.target_flops), cfg.batch_tokens)
    tokens, b = cfg.tokens, int(cfg.batch_tokens)
    if isinstance(tokens, int) or float(tokens).is_integer():  # whole numbers in integers: a float division
        q, rem = divmod(int(tokens), b)  # turned --tokens 99999999999999999999999 into D = 99999999999999991611392
        q += 2 * rem > b or (2 * rem == b and q % 2 == 1)  # round half to even, as round()
        return max(1, q) * b
    return max(1, round(tokens / b)) * b


@dataclass
class _Prepared:
    """What a trainer derives from a :class:`RunConfig` before any training compute (:func:`_prepare`)."""

    device: object  # torch.device
    data: object  # loopscale.model.data.TokenData
    D: int  # training tokens
    B: int  # tokens per optimizer step
    steps: int  # optimizer steps, D // B
    n_micro: int  # micro-batches per step
    micro_windows: int  # windows of seq_len tokens per micro-batch
    sampler: object  # WindowSampler of cfg.data_seed
    ev_np: np.ndarray  # evaluation windows [n, seq_len + 1]
    epochs: float  # passes over the training split implied by D
    warnings: list  # the run's warnings (epochs, compile fallback, rounding of tokens)


def checkpoint_dir_missing(every: int) -> str:
    """The message of a run with ``checkpoint_every_steps=every`` but no ``checkpoint_dir``: what is wrong and the
    three ways out (a folder; no checkpoints, which is None since 0 is refused; for a sweep cell, the cell's
    ``run_config(checkpoint_dir=...)``, since ``Cell.run`` has the preset's cadence but not the folder the sweep's
    trial adds)."""
    return (
        f"checkpoint_every_steps needs checkpoint_dir (a folder for the checkpoints): checkpoint_every_steps={every} "
        "but checkpoint_dir=None. Give checkpoint_dir='<folder>' (e.g. dataclasses.replace(cfg, "
        "checkpoint_dir='ckpt'); created when missing, a rerun resumes from it), or set "
        "checkpoint_every_steps=None for no checkpoints (0 is not accepted). For a sweep Cell, train "
        "cell.run_config(checkpoint_dir='<folder>') rather than cell.run: the cell's run has the preset's "
        "checkpoint cadence, and the sweep's trial adds the folder"
    )


def _nearest_existing(path: Path) -> Path | None:
    """``path`` when it exists, else its nearest existing ancestor (at the latest ``.`` for a relative path, the root
    for an absolute one): where a folder still to be made would be created. None only when the working folder of a
    relative path no longer exists."""
    return next((a for a in (path, *path.parents) if a.exists()), None)


def check_run_folders(cfg: RunConfig, *, create: bool = True) -> None:
    """The folders a run writes, checked before it reads its corpus: ``checkpoint_every_steps`` without a
    ``checkpoint_dir``, a ``checkpoint_dir`` that is a file or cannot be made (when checkpoints will be written;
    a probe folder is made and removed where it would be created, and the first checkpoint makes it, so a run
    refused before then leaves no empty folder), a ``cache_dir`` that cannot be made (made now). ``create`` False
    (a command's pre-check, which may still refuse the run for another reason): nothing is made, and only a file
    where a folder or one of its parents belongs is refused.

    Raises:
        ValueError: naming the folder and the system's reason.
    """
    if cfg.checkpoint_every_steps is not None and cfg.checkpoint_dir is None:
        raise ValueError(checkpoint_dir_missing(cfg.checkpoint_every_steps))
    if cfg.checkpoint_dir is not None and Path(cfg.checkpoint_dir).exists() and not Path(cfg.checkpoint_dir).is_dir():
        raise ValueError(
            f"checkpoint_dir {cfg.checkpoint_dir!r} is a file, not a folder: give a folder for the checkpoints "
            "(created when missing)"
        )
    if not create:
        writes = cfg.checkpoint_dir if cfg.checkpoint_every_steps is not None else None  # else never written
        for name, folder in (("checkpoint_dir", writes), ("cache_dir", cfg.cache_dir)):
            if folder is None:
                continue
            above = _nearest_existing(Path(folder).expanduser() if name == "cache_dir" else Path(folder))
            if above is not None and not above.is_dir():
                raise ValueError(f"{name} {str(folder)!r} cannot be created: {str(above)!r} is a file")
        return
    if cfg.checkpoint_dir is not None and cfg.checkpoint_every_steps is not None and not Path(cfg.checkpoint_dir).is_dir():
        # a folder that cannot be made failed at the first checkpoint, steps later; it is not made now (the first
        # checkpoint makes it), so a run refused before then leaves no empty folder: a probe folder is made and
        # removed where it would be created (root passes a permission check on /proc, where making one fails)
        import tempfile

        above = _nearest_existing(Path(cfg.checkpoint_dir)) or Path(".")
        why = f"Not a directory: {str(above)!r}" if not above.is_dir() else None
        if why is None:
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".loopscale-probe-", dir=above))
            except OSError as e:
                why = f"{e.strerror or e}: no folder can be made in {str(above)!r}"
        if why is not None:
            raise ValueError(f"checkpoint_dir {cfg.checkpoint_dir!r} cannot be created ({why}): give a folder that can "
                             "hold the checkpoints")  # fmt: skip
    if cfg.cache_dir is not None:
        try:  # made now, as the first token-cache write would make it (a bare "[Errno 2] ... '/proc/x'" there)
            Path(cfg.cache_dir).expanduser().mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(
                f"cache_dir {str(cfg.cache_dir)!r} cannot be created ({e.strerror or e}): give a folder that can hold "
                "the token cache (new or existing)"
            ) from None


def _prepare(cfg: RunConfig, members: int = 1) -> _Prepared:
    """Check ``cfg`` against its corpus and the machine and derive the run's sizes; shared by ``train_run`` and
    ``train_ensemble`` (``members``: the models trained together).

    Raises:
        ValueError / CorpusError: not a RunConfig, checkpoint_every_steps without checkpoint_dir, a checkpoint_dir
            that is a file or cannot be created (it is created here when checkpoints are written), a cache_dir that
            cannot be created (it is created here), a model too large for the device's memory (:func:`check_fits_memory`), bad corpus,
            tokenizer/model vocabulary mismatch, a stream shorter than a window (all before any training compute).
    """
    from loopscale.model.data import (
        WindowSampler,
        eval_tokens_note,
        eval_windows,
        implied_epochs,
        load_tokens,
    )
    from loopscale.model.looped import compile_fallback

    if not isinstance(cfg, RunConfig):
        raise ValueError(f"cfg must be a RunConfig, got {type(cfg)!r}")
    check_run_folders(cfg)
    mcfg = cfg.model
    device = _resolve_device(cfg.device)
    check_fits_memory(mcfg, device, members)
    with warnings.catch_warnings(record=True) as corpus_caught:
        warnings.simplefilter("always")
        data = load_tokens(cfg.corpus, cfg.tokenizer, text_column=cfg.text_column, cache_dir=cfg.cache_dir)
    if mcfg.vocab_size < data.vocab_size:
        from loopscale.model.data import uint16_pairs_hint

        hint = uint16_pairs_hint(data.meta["files"][0], data.train) if data.meta.get("corpus_kind") == "tokens" else ""
        fix = f"set vocab_size to {data.vocab_size} (--vocab-size on the command line, model.vocab_size in a spec)"
        raise ValueError(
            f"model.vocab_size={mcfg.vocab_size} is smaller than the corpus vocabulary {data.vocab_size}; "
            + (f"{hint}; if the ids are real, {fix}" if hint else fix)
        )
    D = resolve_tokens(cfg)
    B = cfg.batch_tokens
    micro_windows = cfg.micro_tokens // mcfg.seq_len
    sampler = WindowSampler(data.train, mcfg.seq_len, micro_windows, cfg.data_seed)
    ev_np = eval_windows(data.val, mcfg.seq_len, cfg.eval_tokens)
    run_warnings: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        epochs = implied_epochs(D, sampler.tokens_per_epoch)
        if note := eval_tokens_note(len(data.val), mcfg.seq_len, cfg.eval_tokens):
            warnings.warn(note, UserWarning, stacklevel=2)
    from loopscale.model.data import CorpusWarning

    for w in corpus_caught:  # the corpus's own warnings are the run's; a library's is shown, not recorded
        if issubclass(w.category, CorpusWarning):
            run_warnings.append(str(w.message))
            warnings.warn(str(w.message), CorpusWarning, stacklevel=3)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    for w in caught:
        run_warnings.append(str(w.message))
        warnings.warn(str(w.message), UserWarning, stacklevel=3)
    if why := compile_fallback(cfg.compile, device):
        run_warnings.append(why)
    if cfg.tokens is not None and D != cfg.tokens:
        run_warnings.append(f"tokens={cfg.tokens} rounded to D={D} (whole steps of batch_tokens={B})")
    if note := unused_vocab_note(mcfg.vocab_size, cfg.tokenizer, data.vocab_size):
        run_warnings.append(note)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if getattr(device, "type", str(device)) == "cpu" and cfg.num_threads > cpus:
        run_warnings.append(f"num_threads={cfg.num_threads} is more than the {cpus} CPU(s) this process may use: the "
                            f"threads contend for them and training slows (set num_threads <= {cpus})")  # fmt: skip
    if cfg.target_flops is not None:
        from loopscale.model.accounting import flops_per_token

        trained = flops_per_token(mcfg) * D
        if abs(trained / cfg.target_flops - 1) > 0.01:
            run_warnings.append(f"target_flops={cfg.target_flops:.4g} trains C = F·D = {trained:.4g} FLOPs "
                                f"({trained / cfg.target_flops - 1:+.1%}): D={D} is whole steps of "
                                f"batch_tokens={B}")  # fmt: skip
    if (n_eval := int(ev_np.shape[0] * mcfg.seq_len)) > cfg.eval_tokens:
        run_warnings.append(f"eval_tokens={cfg.eval_tokens} rounded up to {n_eval} (whole windows of "
                            f"seq_len={mcfg.seq_len})")  # fmt: skip
    if cfg.lr == 0:
        run_warnings.append("lr=0: no parameter moves, so the final loss is the initial model's")
    if getattr(device, "type", str(device)) == "cpu" and cfg.precision == "bf16":
        run_warnings.append("precision=bf16 on a CPU: bf16 autocast is meant for GPUs; on a CPU its casts can cost "
                            "more than its matmuls save (measured: 2.4x slower than fp32 at d_model 16, r 2, on a "
                            "Xeon with AMX-BF16), and its losses differ from fp32 runs' by rounding; compare "
                            "tokens_per_s with precision=fp32")  # fmt: skip
    return _Prepared(
        device=device,
        data=data,
        D=D,
        B=B,
        steps=D // B,
        n_micro=B // cfg.micro_tokens,
        micro_windows=micro_windows,
        sampler=sampler,
        ev_np=ev_np,
        epochs=epochs,
        warnings=run_warnings,
    )


def train_run(cfg: RunConfig, *, callback=None) -> RunResult:
    """Train one run and measure it.

    Args:
        cfg: the run (validated).
        callback: called as ``callback(event)`` after every evaluation and every checkpoint write, with
            ``step``, ``tokens``, ``train_loss``, ``val_loss`` (or None), ``lr``, ``checkpoint_path`` (or None),
            ``final`` (bool), ``start_tokens`` (tokens per member already trained when this attempt began: 0, or
            the resumed checkpoint's), ``attempt_s`` (seconds since this attempt's first step began: training
            only, without the start-up before it). Exceptions it raises propagate (Ray Tune stops trials that way).

    Returns:
        :class:`RunResult`; a diverged run (NaN/inf loss or loss > ``diverge_loss``) returns status
        'diverged' with ``diverged_step`` and everything measured so far, it does not raise.

    Raises:
        ValueError / CorpusError: checkpoint_every_steps without checkpoint_dir (the message says the ways out:
            give checkpoint_dir, set checkpoint_every_steps=None, or for a sweep cell train
            ``cell.run_config(checkpoint_dir=...)``), bad corpus, tokenizer/model vocabulary mismatch, a stream
            shorter than a window (all before any training compute).
        CheckpointError: an unusable checkpoint in ``checkpoint_dir``.
    """
    import torch

    from loopscale.model.accounting import flops_per_token
    from loopscale.model.looped import LMLoss, LoopedLM, maybe_compile
    from loopscale.model.optim import lr_multiplier

    t_start = time.perf_counter()
    prep = _prepare(cfg)
    mcfg, T = cfg.model, cfg.model.seq_len
    device, data, sampler, ev_np, epochs = prep.device, prep.data, prep.sampler, prep.ev_np, prep.epochs
    D, B, steps_total, n_micro, mb_windows = prep.D, prep.B, prep.steps, prep.n_micro, prep.micro_windows
    run_warnings = prep.warnings
    F = flops_per_token(mcfg)
    C = float(F) * D
    log.info("run: D=%d tokens, %d steps of %d, C=%.4g FLOPs, F=%d FLOPs/token", D, steps_total, B, C, F)
    run_key = checkpoint_key(cfg, D, data.meta["corpus_hash"])

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    try:
        model = LoopedLM(mcfg, seed=cfg.seed).to(device)
        opts, assignment = run_optimizers(model, cfg)
        log.info("optimizer assignment: muon=%s adamw=%s", assignment["muon"], assignment["adamw"])
        # the loss (model, head, soft-cap and cross-entropy in one graph) is what gets compiled
        loss_fn = maybe_compile(LMLoss(model), cfg.compile, device)
        # on CPU evaluation runs eager: no-grad and the evaluation batch shape would compile a second graph
        eval_loss = loss_fn if device.type == "cuda" else LMLoss(model)
        use_bf16 = cfg.precision == "bf16"

        def autocast():
            return torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16)

        ev = torch.from_numpy(ev_np).to(device)
        start_step, micro_ids, digest, curve = 0, [], hashlib.sha256(b"loopscale-data").hexdigest(), []
        best_val, resumed_from, wall_before = None, None, 0.0
        train_before = (0, 0.0)  # (tokens, s) of training steps in the attempts before the checkpoint
        ckpt_path, st = _newest_readable_checkpoint(cfg.checkpoint_dir)
        if ckpt_path is not None:
            check_run_key(ckpt_path, st["run_key"], run_key)
            model.load_state_dict(st["model"])
            for o, s in zip(opts, st["optimizers"], strict=True):
                o.load_state_dict(s)
            _set_rng_state(st["rng"])
            start_step, micro_ids, digest = st["step"], list(st["micro_batch_ids"]), st["data_digest"]
            curve, best_val, resumed_from = list(st["curve"]), st["best_val_loss"], st["step"]
            wall_before = float(st.get("wall_s") or 0.0)  # checkpoints before this field: 0
            train_before = (int(st.get("train_tokens") or 0), float(st.get("train_s") or 0.0))
            log.info("resumed from %s at step %d", ckpt_path, start_step)

        times = {"data": 0.0, "forward_backward": 0.0, "optimizer": 0.0, "eval": 0.0, "checkpoint": 0.0}
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        status, diverged_step, train_loss, cur_lr = "ok", None, float("nan"), cfg.lr
        final_val = None
        log_every = max(1, steps_total // 100)
        params = [p for p in model.parameters()]
        tok_trained = 0
        t_train = 0.0
        t_first = None  # this attempt's first step (s): with torch.compile it holds the compilation

        def point(done: int, val: float | None) -> dict:
            """The curve point (and event body) after ``done`` optimizer steps."""
            return {"step": done, "tokens": done * B, "train_loss": train_loss, "val_loss": val, "lr": cur_lr}

        def evaluate() -> float:
            nonlocal best_val
            te = time.perf_counter()
            val = _evaluate(eval_loss, ev, mb_windows, autocast)
            times["eval"] += time.perf_counter() - te
            best_val = val if best_val is None or val < best_val else best_val
            return val

        def emit(pt: dict, path: Path | None, final: bool) -> None:
            if callback is not None:
                event = {
                    **pt,
                    "checkpoint_path": None if path is None else str(path),
                    "final": final,
                    "start_tokens": start_step * B,
                    "attempt_s": time.perf_counter() - t_loop,
                }
                callback({**event, "status": status} if final else event)

        t_loop = time.perf_counter()  # this attempt's first step begins (after data, model and resume)
        model.train()
        for step in range(start_step, steps_total):
            t0 = time.perf_counter()
            mult = lr_multiplier(
                step, steps_total, cfg.schedule, cfg.warmup_frac, cfg.final_lr_frac, cfg.decay_frac
            )
            for o in opts:
                for g in o.param_groups:
                    g["lr"] = g["base_lr"] * mult
            cur_lr = cfg.lr * mult
            wins = []
            for m in range(n_micro):
                j = step * n_micro + m
                win, ids = sampler.micro_batch(j)
                wins.append(win)
                digest = hashlib.sha256(digest.encode() + ids.tobytes()).hexdigest()
                micro_ids.append(j)
            x = torch.from_numpy(np.concatenate(wins)).to(device, non_blocking=True)
            t_data = time.perf_counter() - t0
            train_loss = accumulate_gradients(loss_fn, x, n_micro, autocast)
            t1 = time.perf_counter()
            times["data"] += t_data
            times["forward_backward"] += t1 - t0 - t_data
            if not math.isfinite(train_loss) or train_loss > cfg.diverge_loss:
                status, diverged_step = "diverged", step + 1
                curve.append(point(step + 1, None))
                log.warning("run diverged at step %d (train loss %s)", step + 1, train_loss)
                emit(curve[-1], None, final=True)
                break
            if cfg.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            for o in opts:
                o.step()
            for o in opts:
                o.zero_grad(set_to_none=True)
            sync()
            t2 = time.perf_counter()
            times["optimizer"] += t2 - t1
            t_train += t2 - t0
            t_first = t2 - t0 if t_first is None else t_first
            tok_trained += B
            done = step + 1
            is_last = done == steps_total
            do_eval = is_last or (cfg.eval_every_steps is not None and done % cfg.eval_every_steps == 0)
            do_ckpt = cfg.checkpoint_every_steps is not None and (
                is_last or done % cfg.checkpoint_every_steps == 0
            )
            val = evaluate() if do_eval else None
            if is_last:
                final_val = val
            pt = point(done, val)
            if do_eval or do_ckpt or done % log_every == 0:
                curve.append(pt)
            path = None
            if do_ckpt:
                path = _write_ckpt(cfg, done, run_key, model, opts, micro_ids, digest, curve, best_val, times,
                                   wall_before + time.perf_counter() - t_start,
                                   (train_before[0] + tok_trained, train_before[1] + t_train))
            if do_eval or path is not None:
                emit(pt, path, final=is_last)

        if status == "ok" and final_val is None:
            # resumed from the checkpoint of the last step: nothing left to train, measure again
            final_val = evaluate()
            if curve and curve[-1]["step"] == steps_total:
                curve[-1] = {**curve[-1], "val_loss": final_val}
            else:
                curve.append(point(steps_total, final_val))
            emit(curve[-1], None, final=True)
        if status == "ok" and cfg.lr > 0 and (
            note := did_not_learn_note(final_val, mcfg.vocab_size, cfg.lr, prediction_logits(model, ev, autocast))
        ):
            status = DID_NOT_LEARN
            run_warnings.append(note)
        threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(prev_threads)

    # the run's wall time: this process's plus what the attempts before its checkpoint took (the peak measurement
    # below is not part of it)
    attempt_s = time.perf_counter() - t_start
    wall = run_wall(wall_before, attempt_s, resumed_from, steps_total)
    peak, peak_src = peak_flops(device, cfg.num_threads, cfg.cache_dir, cfg.precision)
    tps = throughput(train_before, tok_trained, t_train)
    mfu = (F * tps / peak) if (peak and math.isfinite(tps) and tps > 0) else None
    if note := compile_time_note(cfg, device, tps, tok_trained, t_train, t_first, B):
        run_warnings.append(note)
    return make_result(
        cfg,
        data,
        D=D,
        steps=steps_total,
        eval_tokens=int(ev_np.shape[0] * T),
        epochs=epochs,
        status=status,
        final_val=final_val,
        best_val=best_val,
        diverged_step=diverged_step,
        curve=curve,
        wall=wall,
        tps=tps,
        mfu=mfu,
        peak=(peak, peak_src),
        times={**times, "total": attempt_s},
        threads=threads_used,
        device=device,
        assignment=assignment,
        micro_ids=micro_ids,
        digest=digest,
        resumed_from=resumed_from,
        warnings=run_warnings,
    )


def run_wall(wall_before: float, attempt_s: float, resumed_from: int | None, steps_total: int) -> float:
    """A run's wall time (s) over its attempts: ``wall_before`` (what the attempts before the checkpoint it resumed
    from took, as that checkpoint recorded; 0 for none) plus this attempt's ``attempt_s``. A run resumed from the
    checkpoint of its last step trained nothing in this attempt, and that checkpoint was written after the final
    evaluation: its time is ``wall_before`` alone (each rerun of a finished run added its start-up and its
    re-evaluation). That is the finished run's ``wall_s`` less what followed the checkpoint's timing: its save and
    the did-not-learn check (measured: 1.0003 s against 1.0087 s for an 8-step run). A checkpoint older than the
    ``wall_s`` field (``wall_before`` 0) counts this attempt."""
    if resumed_from is not None and resumed_from >= steps_total and wall_before > 0:
        return wall_before
    return wall_before + attempt_s


def make_result(cfg: RunConfig, data, *, D: int, steps: int, eval_tokens: int, epochs: float, status: str,
                final_val, best_val, diverged_step, curve, wall: float, tps: float, mfu, peak: tuple,
                times: dict, threads: int, device, assignment: dict, micro_ids: list, digest: str,
                resumed_from, warnings: list) -> RunResult:
    """The :class:`RunResult` of one run (or one ensemble member, whose ``cfg`` carries its seeds): the run's
    definition and accounting from ``cfg`` and the corpus ``data``, its measurements from the keywords (losses in
    nats/token, D in tokens, times in seconds; ``peak`` = (peak FLOP/s or None, its source))."""

    from loopscale.model.accounting import flops_per_token, n_once, n_rec, n_unique
    from loopscale.model.looped import compile_fallback

    mcfg = cfg.model
    F = flops_per_token(mcfg)
    bpt = data.bytes_per_token_val
    return RunResult(
        status=status,
        final_val_loss=final_val,
        best_val_loss=best_val,
        final_val_bpb=final_val / math.log(2) / bpt if (final_val is not None and bpt) else None,
        diverged_step=diverged_step,
        model=mcfg.to_dict(),
        N_once=n_once(mcfg),
        N_rec=n_rec(mcfg),
        N_unique=n_unique(mcfg),
        flops_per_token=int(F),
        D=D,
        C=float(F) * D,
        batch_tokens=cfg.batch_tokens,
        micro_batch_tokens=cfg.micro_tokens,
        steps=steps,
        optimizer=cfg.optimizer,
        orthogonalization=None if cfg.optimizer == "adamw" else cfg.orthogonalization,
        lr=cfg.lr,
        lr_data_factor=cfg.lr_data_factor,
        schedule=cfg.schedule,
        warmup_frac=cfg.warmup_frac,
        final_lr_frac=cfg.final_lr_frac,
        seed=cfg.seed,
        data_seed=cfg.data_seed,
        corpus=cfg.corpus,
        corpus_hash=data.meta["corpus_hash"],
        tokenizer=data.tokenizer_name,
        vocab_size=mcfg.vocab_size,
        corpus_vocab_size=data.vocab_size,
        epochs=epochs,
        eval_tokens=eval_tokens,
        curve=curve,
        wall_s=wall,
        tokens_per_s=tps,
        mfu=mfu,
        peak_flops=peak[0],
        peak_flops_source=peak[1],
        time_split=dict(times),
        num_threads=threads,
        device=str(device),
        compiled=bool(cfg.compile) and compile_fallback(cfg.compile, device) is None,
        versions=run_versions(),
        optimizer_assignment=assignment,
        micro_batch_ids=micro_ids,
        data_digest=digest,
        resumed_from_step=resumed_from,
        warnings=list(warnings),
        data={k: data.meta.get(k) for k in _DATA_SUMMARY_KEYS if k in data.meta},
    )


def compile_time_note(cfg: RunConfig, device, tps: float, tokens: int, seconds: float, first_s: float | None,
                      batch_tokens: int) -> str | None:
    """The warning of a compiled run (``cfg.compile``, not fallen back to eager) that trained at least 2 steps in
    this attempt: its ``tokens_per_s`` counts the first step, which holds torch.compile's compilation; the note gives
    that step's time (s) and the rate (tokens/s) of the steps after it. None otherwise."""
    from loopscale.model.looped import compile_fallback

    if not cfg.compile or compile_fallback(cfg.compile, device) or first_s is None or tokens < 2 * batch_tokens:
        return None
    rest = seconds - first_s
    if rest <= 0:
        return None
    return (
        f"tokens_per_s ({tps:,.0f}) includes torch.compile's compilation, in the first step ({first_s:.1f} s of "
        f"{seconds:.1f} s of training steps); the steps after it trained {(tokens - batch_tokens) / rest:,.0f} "
        "tokens/s"
    )


def throughput(before: tuple[int, float], tokens: int, seconds: float) -> float:
    """Training tokens/s of a run over all its attempts: ``before`` = (tokens, s) of the training steps of the
    attempts before its checkpoint (saved in it as ``train_tokens``, ``train_s``), plus this attempt's. NaN when no
    step was timed (a run resumed from the checkpoint of its last step, under a checkpoint without those fields)."""
    tok, sec = before[0] + tokens, before[1] + seconds
    return tok / sec if sec > 0 else float("nan")


def _write_ckpt(cfg, step, run_key, model, opts, micro_ids, digest, curve, best_val, times, wall_s,
                train: tuple[int, float]) -> Path:
    t0 = time.perf_counter()
    state = {
        "wall_s": float(wall_s),
        "train_tokens": int(train[0]),
        "train_s": float(train[1]),
        "format": CHECKPOINT_FORMAT,
        "step": int(step),
        "run_key": run_key,
        "model": model.state_dict(),
        "optimizers": [o.state_dict() for o in opts],
        "rng": _rng_state(),
        "micro_batch_ids": list(micro_ids),
        "data_digest": digest,
        "curve": list(curve),
        "best_val_loss": best_val,
    }
    return _save_newest_two(cfg.checkpoint_dir, step, state, times, t0)


def _save_newest_two(ckpt_dir, step: int, state: dict, times: dict, t0: float) -> Path:
    """Save ``state`` as ``ckpt_dir/ckpt-<step>.pt`` (atomically, :func:`save_checkpoint`), delete all but the
    newest two checkpoints there, and add the time since ``t0`` (``time.perf_counter``) to ``times["checkpoint"]``.
    Used by :func:`train_run` and ``train_ensemble``."""
    d = Path(ckpt_dir)
    path = save_checkpoint(d / f"ckpt-{step:08d}.pt", state)
    for old in sorted(p for p in d.iterdir() if _CKPT_RE.match(p.name) and p != path)[:-1]:
        old.unlink(missing_ok=True)  # keep the newest two
    times["checkpoint"] += time.perf_counter() - t0
    return path


__all__ = [
    "CheckpointError",
    "TornCheckpointError",
    "RunConfig",
    "checkpoint_key",
    "check_run_key",
    "collapse_note",
    "did_not_learn_note",
    "DID_NOT_LEARN",
    "not_learned_note",
    "RunResult",
    "accumulate_gradients",
    "latest_checkpoint",
    "load_checkpoint",
    "peak_flops",
    "resolve_tokens",
    "ensemble_key",
    "key_differences",
    "refuse_checkpoint_of_another_run",
    "run_defining_fields",
    "run_optimizers",
    "run_definition",
    "save_checkpoint",
    "train_run",
]
