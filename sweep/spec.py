"""The sweep spec: a YAML file validated into typed pydantic models, and the grid cells it defines.

A spec names the model family (``cpu`` | ``paper``), the iso-depth layout (``effective_depth``, ``n_prelude``,
``n_coda``), the recurrences ``r``, the sizes, and either token budgets (``tokens``: D in tokens) or iso-FLOP
budgets (``budgets: {C: [sizes]}``, the paper's design, Sec. 3.2 / ``scaling_laws.sh``). Every unknown key, every
key given twice (:func:`spec_loader`) and every bad value is an error that names the key (``extra="forbid"``);
everything is checked before Ray starts.

Cells: one per (variant, budget, size, r, seed). The r = 1 runs are shared by all variants (as in the paper's
case studies, App. G): they are listed once, under variant ``baseline``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

SPEC_VERSION = 1


class SpecError(ValueError):
    """A sweep spec is invalid; the message names the key and, where possible, a valid alternative."""


def _bool_as_number(annotation: Any, value: Any) -> bool:
    """Whether ``value`` holds a bool where ``annotation`` (a field's type) wants an int or a float: pydantic's lax
    mode takes YAML's ``true`` / ``false`` as 1 / 0 there (``resources: {ensemble: true}`` became one seed per
    trial, ``r: [true, 2]`` became r = 1)."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _bool_as_number(args[0], value)
    if annotation in (int, float):
        return isinstance(value, bool)
    if origin in (typing.Union, types.UnionType):
        if bool in args:
            return False
        if isinstance(value, list | dict):  # the branch of the container's kind
            args = tuple(a for a in args if typing.get_origin(a) is (list if isinstance(value, list) else dict))
        return any(_bool_as_number(a, value) for a in args)
    if origin is list and isinstance(value, list):
        return any(_bool_as_number(args[0], v) for v in value)
    if origin is dict and isinstance(value, dict):
        return any(_bool_as_number(args[0], k) or _bool_as_number(args[1], v) for k, v in value.items())
    return False


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_as_number(cls, data: Any) -> Any:
        # YAML's true / false in a number key would be read as 1 / 0 without a word
        if isinstance(data, dict):
            for name, f in cls.model_fields.items():
                if name in data and _bool_as_number(f.annotation, data[name]):
                    raise ValueError(
                        f"{name} = {json.dumps(data[name], default=str)} holds a YAML boolean (true or false) where "
                        "a number is expected, which would be read as 1 or 0; write the number"
                    )
        return data


class ModelSpec(_Strict):
    """Model family and iso-depth layout (paper Sec. 3.1)."""

    preset: Literal["cpu", "paper"] = "cpu"
    """Model family of :func:`loopscale.model.config.preset_config`."""
    effective_depth: int | None = Field(None, ge=1)
    """Executed layers per token (None: the preset's, 10 for cpu, 20 for paper)."""
    n_prelude: int | None = Field(None, ge=0)
    """Unique layers before the loop for r > 1 (None: the preset's)."""
    n_coda: int | None = Field(None, ge=0)
    """Unique layers after the loop for r > 1 (None: the preset's). n_prelude + n_coda must be less than
    effective_depth (the looped block needs a layer), checked for r = 1 grids too."""
    seq_len: int | None = None
    """Context length T in tokens (None: the preset's)."""
    vocab_size: int | None = None
    """Vocabulary size V (None: the preset's, raised to the tokenizer's when that is larger, e.g. ``bpe:4096``;
    an explicit value must cover the tokenizer)."""
    head_dim: int | None = None
    """Attention head dimension (None: the preset's)."""
    size_unit: Literal["d_model", "width_scale"] = "d_model"
    """How ``sizes`` are read: residual width d, or the paper's width scale s (d = 64 s)."""
    injection: Literal["linear", "additive"] = "linear"
    """Injection of the looped (r > 1) baseline runs (r = 1 never has one)."""


class VariantSpec(_Strict):
    """One architecture variant of the looped runs (paper App. G). ``trunc_bptt`` uses bptt_k = ceil(r / 2);
    ``hyperconnect`` uses ``hc_lanes`` lanes and full BPTT."""

    name: Literal["baseline", "trunc_bptt", "hyperconnect"]
    hc_lanes: int = Field(2, ge=2)
    """Lanes K of ``hyperconnect`` (the only injection that has lanes; model.injection cannot be hyperconnect):
    another value on ``baseline`` or ``trunc_bptt`` is refused, as it would change nothing."""

    @model_validator(mode="after")
    def _lanes_only_for_hyperconnect(self) -> VariantSpec:
        # the default is let through: model_dump() writes it for every variant, and a dumped spec must parse again
        default = type(self).model_fields["hc_lanes"].default
        if self.name != "hyperconnect" and self.hc_lanes != default:
            raise ValueError(
                f"hc_lanes ({self.hc_lanes}) has no effect on variant {self.name!r}: only hyperconnect has lanes "
                f"(its injection); remove hc_lanes there, or use {{name: hyperconnect, hc_lanes: {self.hc_lanes}}}"
            )
        return self


def _training_spec_model() -> type[BaseModel]:
    """The ``training:`` section, derived from the :class:`loopscale.model.train.RunConfig` fields declared
    settable there (field metadata :data:`loopscale.model.train.SPEC_TRAINING`): same names, types and defaults,
    so the section is a partial override of the run configuration, not a second copy of it."""
    import typing

    from pydantic import create_model

    from loopscale.model.train import SPEC_TRAINING, RunConfig

    hints = typing.get_type_hints(RunConfig)
    fields = {
        f.name: (hints[f.name], Field(f.default, **f.metadata[SPEC_TRAINING]))
        for f in dataclasses.fields(RunConfig)
        if SPEC_TRAINING in f.metadata
    }
    model = create_model("TrainingSpec", __base__=_Strict, **fields)
    model.__doc__ = (
        "Trainer settings shared by every run: the RunConfig fields a spec may override (defaults are "
        "RunConfig's; see :class:`loopscale.model.train.RunConfig` for each field's meaning and unit)."
    )
    return model


TrainingSpec = _training_spec_model()


class TuneSpec(_Strict):
    """Stage 1, LR tuning: one Optuna study (TPE, seeded) per size and r, with ASHA on token milestones."""

    num_samples: int = Field(8, ge=1)
    """Trials per study (a study to run needs at least 2: :func:`loopscale.sweep.lr_search.check_tune_samples`)."""
    max_concurrent: int = Field(2, ge=1)
    """Trials of one study run at once."""
    lr_min: float = Field(1e-4, gt=0)
    lr_max: float = Field(1e-1, gt=0)
    lr_values: list[float] | None = None
    """A discrete LR set (e.g. the paper's 8 values) instead of log-uniform [lr_min, lr_max] (which it then
    replaces): a grid, each LR tried once. With num_samples >= the number of distinct values every value is
    tried; with fewer, num_samples of them spread evenly over the sorted set, its ends included
    (``loopscale.sweep.lr_search.lr_grid``)."""
    tokens_per_param: float | None = Field(10.0, gt=0, le=1e6, allow_inf_nan=False)
    """Short tuning budget D = tokens_per_param * (N_once + r N_rec) (the paper's sweep ratio, App. D; at most 1e6); unused when
    ``tokens`` is set, and then refused unless left at its default 10 (or null)."""
    tokens: int | None = Field(None, gt=0)
    """Absolute tuning budget in tokens, instead of ``tokens_per_param`` (a spec giving both, with tokens_per_param
    other than its default 10, is refused: keep one)."""
    num_milestones: int = Field(8, ge=1)
    """Validation points per trial; ASHA's time attribute is the milestone index 1..num_milestones."""
    grace_milestones: int = Field(1, ge=1)
    reduction_factor: float = Field(2.0, gt=1.0, allow_inf_nan=False)
    tune_per_r: bool = True
    """One study per (size, r); False: one per size (r = the largest r of the grid) shared by every r."""
    smooth: bool = False
    """Use the fitted line log LR* = a + b log N across sizes instead of each size's best (both are reported)."""
    seed: int = 0
    """Seed of the TPE samplers; each study's own seed is derived from it and the study's name, so every size and r
    draws its own LRs (``loopscale.sweep.lr_search.study_seed``)."""
    eval_tokens: int | None = Field(None, gt=0)
    """Validation tokens at each milestone (None: the training spec's)."""

    @model_validator(mode="after")
    def _check(self) -> TuneSpec:
        if self.lr_min >= self.lr_max:
            raise ValueError(f"tune.lr_min must be < tune.lr_max, got {self.lr_min} >= {self.lr_max}")
        for key in ("lr_min", "lr_max"):
            if not math.isfinite(getattr(self, key)):
                raise ValueError(f"tune.{key} must be a finite LR, got {getattr(self, key)}")
        if self.lr_values is not None and (
            not self.lr_values or not all(math.isfinite(v) and v > 0 for v in self.lr_values)
        ):
            raise ValueError(f"tune.lr_values must be a non-empty list of finite positive LRs, got {self.lr_values}")
        if self.lr_values is not None:
            # a repeated LR is one grid point, so [0.01, 0.01] tuned nothing; a range given beside the values was
            # ignored without a word (the values replace it)
            if len(set(self.lr_values)) < 2:
                raise ValueError(
                    f"tune.lr_values {self.lr_values} holds one LR: there is nothing to tune; give two or more, or fix "
                    f"it with lr: {{fixed: {self.lr_values[0]}}}"
                )
            fields = type(self).model_fields
            own_range = (self.lr_min, self.lr_max) != (fields["lr_min"].default, fields["lr_max"].default)
            outside = [v for v in self.lr_values if not self.lr_min <= v <= self.lr_max]
            if own_range and outside:
                raise ValueError(
                    f"tune.lr_values {self.lr_values} replaces the range [lr_min, lr_max] = [{self.lr_min}, "
                    f"{self.lr_max}], which leaves out {outside}: the range would be ignored; give either lr_values "
                    "or lr_min/lr_max"
                )
        if self.grace_milestones > self.num_milestones:
            raise ValueError(
                f"tune.grace_milestones ({self.grace_milestones}) must be <= tune.num_milestones ({self.num_milestones})"
            )
        if self.tokens is None and self.tokens_per_param is None:
            raise ValueError("tune needs a budget: set tune.tokens or tune.tokens_per_param")
        # both given: tokens would win without a word. The default 10 is let through, as model_dump() writes it
        # next to tokens and a dumped spec (spec.yaml, design's candidates) must parse again
        default = type(self).model_fields["tokens_per_param"].default
        if (
            self.tokens is not None
            and "tokens_per_param" in self.model_fields_set
            and self.tokens_per_param not in (None, default)
        ):
            raise ValueError(
                f"tune.tokens ({self.tokens}) and tune.tokens_per_param ({self.tokens_per_param:g}) both set the LR "
                "trials' token budget, and tune.tokens would be used: keep one (tune.tokens: absolute tokens; "
                "tune.tokens_per_param: tokens per parameter of each model)"
            )
        return self


class ResourcesSpec(_Strict):
    """Resources of one trial (Ray logical resources; fractional GPUs allowed for small models)."""

    cpus: float = Field(1.0, gt=0, allow_inf_nan=False)
    gpus: float = Field(0.0, ge=0, allow_inf_nan=False)
    ensemble: int = Field(0, ge=0)
    """Seed ensembles: the most seeds of one cell trained together in one trial as one batched model
    (``loopscale.model.ensemble``; each member's result equals its single run). 0 (default): automatic — up to
    :data:`AUTO_ENSEMBLE_CPU` members on CPU, separate runs when trials use GPUs; 1: every seed its own trial."""


AUTO_ENSEMBLE_CPU = 16
"""Members per trial of an automatic seed ensemble on CPU (``resources.ensemble: 0``)."""


def _distinct(what: str, values: list) -> None:
    """Refuse a list of grid values holding one twice (a cell is trained once; the repeat was dropped silently
    while repeated ``r``, ``seeds`` and ``ladder`` values were refused).

    Raises:
        ValueError: naming ``what`` and the repeated values."""
    seen, twice = set(), []
    for v in values:
        if v in seen and v not in twice:
            twice.append(v)
        seen.add(v)
    if twice:
        raise ValueError(f"{what} must hold distinct values, got {list(values)} ({', '.join(map(str, twice))} twice)")


class _SpecMeta(type(BaseModel)):
    """Pydantic's model metaclass, whose call (``SweepSpec(...)`` in Python) raises :class:`SpecError` in the words
    of :func:`parse_spec` instead of pydantic's ``ValidationError``. Validation itself (``model_validate``, which
    :func:`parse_spec` uses) does not pass through it, as it would through an ``__init__`` of the model's own."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as e:
            err = e
        if not args:  # parse_spec's whole message: also the checks across keys that read none of the bad ones
            parse_spec(dict(kwargs))
        raise SpecError(_fmt_error(err)) from None


class SweepSpec(_Strict, metaclass=_SpecMeta):
    """A whole sweep: the grid (stage 2) and its LR tuning (stage 1). See ``configs/*.yaml``.

    Built from keyword arguments (``SweepSpec(name="x", sizes=[16], tokens=[2048])``) it is checked as
    :func:`parse_spec` checks a mapping read from YAML and raises :class:`SpecError` in the same words."""

    name: str = "sweep"
    corpus: str = "embedded"
    """``embedded``, or a path or glob (:func:`loopscale.model.data.resolve_corpus`); a relative one is made absolute
    against the working directory when the spec is read (the trials run in their own folders)."""
    text_column: str = "text"
    tokenizer: str = "byte"
    model: ModelSpec = ModelSpec()
    r: list[int] = [1, 2, 4, 8]
    sizes: list[int] = []
    """Sizes of ``tokens`` mode (d_model, or width scales when model.size_unit = width_scale); refused with
    ``budgets``, which list their own sizes."""
    tokens: list[int] | dict[int, list[int]] | None = None
    """D in tokens: a list applied to every size, or {size: [D, ...]} for every size of ``sizes``. The trainer rounds each to whole batches of
    ``training.batch_tokens``; two values of one size that round to the same D are refused."""
    budgets: dict[float, list[int]] | None = None
    """Iso-FLOP design: {C (training FLOPs): [sizes at this budget]} (paper Sec. 3.2). Each run trains
    D = round(C / (F B)) B tokens; two budgets that give one model (size, r, variant) the same D are refused."""
    variants: list[VariantSpec] = [VariantSpec(name="baseline")]
    seeds: list[int] | dict[int, list[int]] = [0]
    """Init seeds of every cell: a list, or a count k meaning [0, ..., k-1]; or per r, ``{r: count or list}``
    for every r of the grid (ladder rungs take r = 1's), e.g. ``{1: 16, 2: 32, 4: 32, 8: 32}`` to replicate the
    noisier looped cells more. Seeds are replicates: every seed of a cell sees the same data order
    (``data_seed``); the fit's bootstrap resamples seeds within their cell."""
    data_seed: int = 0
    ladder: list[int] = []
    """Unique-depth ladder: extra plain (r = 1) models with these numbers of layers at every size and budget (e.g.
    [2, 3, 4, 6]). They are ordinary r = 1 points of the law (N = their unique parameters) and let the report place
    each looped model on plain depth ("worth k unique layers", ``loopscale.fit.ladder``)."""
    training: TrainingSpec = TrainingSpec()
    lr: Literal["tune"] | dict[str, Any] = "tune"
    """``tune`` (stage 1 picks it), ``{fixed: 3e-3}``, or ``{table: {size: lr | {r: lr}}}``."""
    tune: TuneSpec = TuneSpec()
    lr_data_exponent: float = Field(0.0, ge=0, le=2, allow_inf_nan=False)
    """Muon / MuonH only: every run's matrix LR is multiplied by (D / D_ref)^-lr_data_exponent, the AdamW groups'
    LRs are not (the paper's data transfer of the Muon LR, exponent 0.32; ``docs/paper.md`` Sec. 3). D is the run's
    training tokens and D_ref the tokens of the LR trials of the study that sets its LR: ``tune.tokens``, or
    ``tune.tokens_per_param`` x (N_once + r N_rec) of the (size, r) model (r = the grid's largest with
    ``tune.tune_per_r: false``; ladder rungs take r = 1's), rounded as ``tune-lr`` rounds them, whether the LR is
    tuned or given. 0 (default): no transfer, every budget of a size trains at its LR; at most 2."""
    resources: ResourcesSpec = ResourcesSpec()
    storage_path: str | None = None
    """Where Tune keeps experiments and checkpoints (any pyarrow URI; None: the --out directory)."""
    max_failures: int = Field(2, ge=0)

    @field_validator("variants", mode="before")
    @classmethod
    def _variants_from_names(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"name": x} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("name")
    @classmethod
    def _name_is_a_plain_word(cls, v: str) -> str:
        # it names Tune experiments (grid_<name>_NNN), Optuna studies and run folders: no paths, no spaces
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", v):
            raise ValueError(
                f"must be 1-100 letters, digits, '_', '-' or '.' starting with a letter or digit (it names Tune "
                f"experiments and Optuna studies), got {v!r}"
            )
        return v

    @field_validator("corpus")
    @classmethod
    def _corpus_absolute(cls, v: str) -> str:
        # the trials read it in their own working directory (Tune's trial folder, another node): a relative path or
        # glob is taken from this one, as storage_path is; 'embedded', '~/...' and an absolute path stay as given
        import os

        if not v or v == "embedded" or os.path.isabs(os.path.expanduser(v)):
            return v
        return os.path.abspath(v)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_known(cls, v: str) -> str:
        from loopscale.model.data import parse_tokenizer

        parse_tokenizer(v)  # ValueError naming the accepted forms
        return v

    @field_validator("storage_path")
    @classmethod
    def _storage_absolute(cls, v: str | None) -> str | None:
        from loopscale.cluster.options import validate_storage

        return validate_storage(v)

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_from_count(cls, v: Any) -> Any:
        def one(x: Any, where: str) -> Any:
            if isinstance(x, float) and x.is_integer():
                x = int(x)  # 4.0, 2e3: a count written as a float
            if isinstance(x, (float, str, bool)) or x is None:
                num = _as_number(x) if isinstance(x, str) else None
                hint = (f" (quoted, so YAML reads it as text: write {int(num)} without quotes)"
                        if num is not None and num.is_integer() and num >= 1 else "")  # fmt: skip
                raise ValueError(
                    f"seeds{where} must be a count (an integer >= 1, e.g. 4 for [0, 1, 2, 3]) or a list of integer "
                    f"seeds{' (or a mapping r -> either)' if not where else ''}; got {x!r}{hint}"
                )
            if isinstance(x, int):
                from loopscale.model.train import MAX_SEED_COUNT

                if not 1 <= x <= MAX_SEED_COUNT:
                    raise ValueError(
                        f"seeds{where} as a count must be in [1, {MAX_SEED_COUNT}] (e.g. seeds: 4 for [0, 1, 2, 3]), "
                        f"got {x}"
                    )
                return list(range(x))
            return x

        if isinstance(v, dict):
            return {k: one(x, f"[{k}]") for k, x in v.items()}
        return one(v, "")

    def seeds_for(self, r: int) -> list[int]:
        """The init seeds of the cells at recurrence ``r`` (ladder rungs: ``r = 1``)."""
        return list(self.seeds[r]) if isinstance(self.seeds, dict) else list(self.seeds)

    def min_seeds(self) -> int:
        """The fewest seeds any cell of the grid has."""
        return min(len(self.seeds_for(r)) for r in self.r)

    def ensemble_members(self) -> int:
        """Most seeds per trial (``resources.ensemble``, 0 resolved: :data:`AUTO_ENSEMBLE_CPU` on CPU, 1 with GPUs)."""
        if self.resources.ensemble:
            return self.resources.ensemble
        return 1 if self.resources.gpus > 0 else AUTO_ENSEMBLE_CPU

    @field_validator("ladder")
    @classmethod
    def _ladder_depths(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v) or len(set(v)) != len(v):
            raise ValueError(f"ladder must hold distinct layer counts >= 1, e.g. [2, 3, 4, 6]; got {v}")
        return sorted(v)

    @field_validator("r")
    @classmethod
    def _r_positive(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("r must list at least one recurrence count, e.g. [1, 2, 4, 8]")
        if any(x < 1 for x in v) or len(set(v)) != len(v):
            raise ValueError(f"r must hold distinct integers >= 1, got {v}")
        return sorted(v)  # a set of values: [4, 1, 2] is the grid of [1, 2, 4] (and its folder's spec)

    @field_validator("sizes")
    @classmethod
    def _sizes_sorted(cls, v: list[int]) -> list[int]:
        return sorted(v)  # a set of values, as r

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> SweepSpec:
        """The checks across keys, before any compute. Their independent parts (model depth and r, the grid's sizes
        and budgets, seeds, variants, lr, training and resources) are each checked, and every problem found is
        said at once (joined by "; "); lr.table is checked against the grid's sizes only once those are valid.
        Then every cell's model and trainer configuration is built (:meth:`_check_run_configs`).

        With ``context={"invalid": keys}`` (:func:`parse_spec`, once those top-level keys failed their own checks and
        were left out) only the parts that read none of them run: their problems are said with the keys' own, in one
        round. Then, and when a part found a problem, the plain r = 1 models of every size and the runs of every
        budget are built in place of every cell (:meth:`_check_plain_models`, :meth:`_check_plain_runs`), each
        unless it reads an invalid key."""
        invalid = set((info.context or {}).get("invalid", ()))
        problems: list[str] = []

        def part(check, reads: set[str]) -> bool:
            if reads & invalid:
                return False
            try:
                check()
            except ValueError as e:
                problems.append(str(e))
                return False
            return True

        grid = {"tokens", "budgets", "sizes"}
        part(self._check_depth_and_r, {"model", "r"})
        grid_ok = part(self._check_grid, grid)
        part(self._check_seeds, {"seeds", "r", "data_seed", "ladder"})
        part(self._check_variants, {"variants"})
        # lr's own form (a positive fixed LR) reads no other key; lr.table names sizes and r of the grid
        if part(self._check_lr_form, {"lr"}) and grid_ok:
            part(self._check_lr, {"lr", "r", "ladder", *grid})
        part(self._check_training, {"lr_data_exponent", "training", "resources"})
        if (problems or invalid) and grid_ok:
            # the full build below needs every key valid: the plain r = 1 runs are built now, so that a value every
            # run would refuse (e.g. a batch that is not a multiple of seq_len), a size whose model does not build and
            # two budgets that train one D come in this round too
            if part(self._check_plain_models, {"model", "tokenizer", *grid}):  # with training invalid too
                part(self._check_plain_runs, self._RUN_CONFIG_READS)
        if problems:
            raise ValueError("; ".join(problems))
        if invalid:
            return self
        # every cell must build a valid model (catches e.g. d_model not divisible by head_dim) before Ray starts
        self._check_models(self.r)
        self._check_run_configs()
        return self

    def _check_depth_and_r(self) -> None:
        """The looped block has a layer, and every r divides it. Raises: ValueError."""
        from loopscale.model.config import PRESETS, valid_r

        base = dict(PRESETS[self.model.preset])
        depth = base["effective_depth"] if self.model.effective_depth is None else self.model.effective_depth
        pre = base["n_prelude"] if self.model.n_prelude is None else self.model.n_prelude
        coda = base["n_coda"] if self.model.n_coda is None else self.model.n_coda
        if depth - pre - coda <= 0:  # no looped block: every model of the grid would fail, r = 1 included

            def given(key: str, value: int) -> str:
                return f"{value}" + ("" if getattr(self.model, key) is not None else f" (the {self.model.preset} preset's)")

            raise ValueError(
                f"model.n_prelude + model.n_coda = {given('n_prelude', pre)} + {given('n_coda', coda)} = {pre + coda} "
                f"must be less than model.effective_depth = {given('effective_depth', depth)}: the looped block "
                f"needs at least one layer; lower model.n_prelude or model.n_coda, or raise model.effective_depth"
            )
        ok = valid_r(depth, pre, coda)
        bad = [x for x in self.r if x not in ok]
        if bad:
            raise ValueError(
                f"r={bad} must divide the looped depth (effective_depth - n_prelude - n_coda = {depth - pre - coda}); "
                f"valid r: {ok}"
            )

    def _check_grid(self) -> None:
        """Exactly one of tokens (with sizes) or budgets, each non-empty, distinct, positive. Raises: ValueError."""
        if (self.tokens is None) == (self.budgets is None):
            raise ValueError("give exactly one of 'tokens' (D per size) or 'budgets' ({C: [sizes]})")
        if self.tokens is not None:
            if not self.sizes:
                raise ValueError("sizes must be non-empty with 'tokens' (empty grid)")
            _distinct("sizes", self.sizes)
            per = self.tokens if isinstance(self.tokens, dict) else {s: self.tokens for s in self.sizes}
            if isinstance(self.tokens, dict):
                extra = sorted(set(per) - set(self.sizes))
                if extra:
                    raise ValueError(f"tokens has sizes {extra} not in sizes {self.sizes}")
                missing = [s for s in self.sizes if s not in per]
                if missing:  # its runs would not be trained, without a word
                    raise ValueError(
                        f"tokens gives no token budgets for size{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(str, missing))} of sizes {self.sizes}: add {'them' if len(missing) > 1 else 'it'}"
                        f" to tokens (e.g. {missing[0]}: [...]), or remove {'them' if len(missing) > 1 else 'it'} from "
                        "sizes"
                    )
            for s, ds in per.items():
                if not ds:
                    raise ValueError(f"tokens for size {s} is empty (empty grid)")
                where = f" for size {s}" if isinstance(self.tokens, dict) else ""
                if any(d <= 0 for d in ds):
                    raise ValueError(f"tokens must all be > 0, got {list(ds)}{where}")
                _distinct(f"tokens{where}", ds)
        else:
            if self.sizes:  # every use of the sizes (grid, LR tuning, lr.table) takes those budgets list
                raise ValueError(
                    f"sizes {self.sizes} is not used with budgets: each budget lists its own sizes (budgets: {{C: "
                    "[sizes]}), and only those are trained; remove sizes, or put the sizes in budgets"
                )
            if not self.budgets:
                raise ValueError("budgets is empty (empty grid); e.g. budgets: {1e12: [32, 64]}")
            for c, ss in self.budgets.items():
                if not c > 0 or not math.isfinite(c):
                    raise ValueError(f"budgets: every C must be a finite number of FLOPs > 0, got {c}")
                if not ss:
                    raise ValueError(f"budgets[{c:g}] lists no sizes (empty grid)")
                _distinct(f"budgets[{c:g}]", ss)
        for s in self.all_sizes():
            if s <= 0:
                raise ValueError(f"sizes must be positive, got {s}")

    def _check_seeds(self) -> None:
        """Seeds per r (every r of the grid), data_seed in range, r = 1 in r with a ladder. Raises: ValueError."""
        if isinstance(self.seeds, dict) and set(self.seeds) != set(self.r):
            raise ValueError(
                f"seeds per r must give every r of the grid exactly: r = {sorted(self.r)}, seeds has "
                f"{sorted(self.seeds)}"
            )
        for r in self.r:
            got = self.seeds_for(r)
            where = f"[{r}]" if isinstance(self.seeds, dict) else ""
            if not got:
                raise ValueError(f"seeds{where} must be non-empty, e.g. [0] or a count such as 4")
            from loopscale.model.train import MAX_SEED

            if len(set(got)) != len(got) or any(not 0 <= x <= MAX_SEED for x in got):
                raise ValueError(f"seeds{where} must be distinct integers in [0, {MAX_SEED}], got {got}")
        from loopscale.model.train import MAX_SEED

        if not 0 <= self.data_seed <= MAX_SEED:
            raise ValueError(f"data_seed (the data order of every run) must be an integer in [0, {MAX_SEED}], got "
                             f"{self.data_seed}")  # fmt: skip
        if self.ladder and 1 not in self.r:
            raise ValueError(
                "ladder adds plain r = 1 models next to r = 1 of the grid: put 1 in r (e.g. r: [1, 2, 4, 8])"
            )

    def _check_variants(self) -> None:
        """Variants non-empty and distinct. Raises: ValueError."""
        if not self.variants:
            raise ValueError("variants must be non-empty, e.g. [baseline]")
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            lanes = (" (hyperconnect takes one hc_lanes per spec: compare lane counts in separate --out folders)"
                     if "hyperconnect" in twice else "")  # fmt: skip
            raise ValueError(f"variants must be distinct, got {names}: each name once, {twice} listed more than "
                             f"once{lanes}")

    def _check_lr_form(self) -> None:
        """lr's own form, which reads no other key: 'tune', ``{fixed: <a positive LR>}`` or ``{table: <a mapping>}``.
        Raises: ValueError."""
        if self.lr == "tune":
            return
        keys = set(self.lr)
        if keys == {"fixed"}:
            if not _positive_lr(self.lr["fixed"]):
                raise ValueError(f"lr.fixed must be a positive number, got {self.lr['fixed']!r}"
                                 + _quoted_hint(self.lr["fixed"]))  # fmt: skip
        elif keys == {"table"}:
            if not isinstance(self.lr["table"], dict):
                raise ValueError("lr.table must map size -> lr or size -> {r: lr}")
        else:
            close = [m for k in sorted(keys) if (m := _closest(str(k), ["fixed", "table"]))]
            raise ValueError(
                f"lr must be 'tune', {{fixed: <lr>}} or {{table: ...}}, got keys {sorted(keys)}"
                + (f" (did you mean {close[0]!r}?)" if len(close) == 1 else "")
            )

    def _check_lr(self) -> None:
        """An lr.table (once :meth:`_check_lr_form` passed) has a positive LR for every size (and r) of the grid, and
        no entry for another. Raises: ValueError."""
        if self.lr == "tune" or set(self.lr) != {"table"}:
            return
        tab = self.lr["table"]

        def as_int(k: Any) -> int | None:
            try:
                return int(k) if not isinstance(k, bool) and float(k) == int(k) else None
            except (TypeError, ValueError):
                return None

        # a mistyped size or r would be ignored without a word, as tokens' extra sizes are not
        extra = [k for k in tab if as_int(k) not in self.all_sizes()]
        if extra:
            raise ValueError(
                f"lr.table has entries for {', '.join(map(repr, extra))}, not sizes of the grid "
                f"{self.all_sizes()}: remove them (or correct the size)"
            )
        grid_r = sorted({*self.r, *([1] if self.ladder else [])})
        for k, v in tab.items():
            extra = [q for q in v if as_int(q) not in grid_r] if isinstance(v, dict) else []
            if extra:
                raise ValueError(
                    f"lr.table[{k}] has entries for r = {', '.join(map(repr, extra))}, not in the grid's r "
                    f"{grid_r}: remove them (or correct the r)"
                )
        for s in self.all_sizes():
            if s not in tab and str(s) not in tab:
                raise ValueError(f"lr.table has no entry for size {s}; sizes: {self.all_sizes()}")
            v = tab.get(s, tab.get(str(s)))
            if isinstance(v, dict):  # per r: every r of the grid (the ladder's plain models take r = 1's)
                missing = [r for r in grid_r if r not in v and str(r) not in v]
                if missing:
                    raise ValueError(
                        f"lr.table[{s}] has no entry for r = {', '.join(map(str, missing))}; it gives r = "
                        f"{', '.join(map(str, v))} and the grid has r = {sorted(self.r)}"
                    )
            for where, w in v.items() if isinstance(v, dict) else [("", v)]:
                if not _positive_lr(w):
                    key = f"[{s}][{where}]" if isinstance(v, dict) else f"[{s}]"
                    raise ValueError(f"lr.table{key} must be a positive number, got {w!r}" + _quoted_hint(w))

    def _check_training(self) -> None:
        """lr_data_exponent only with Muon / MuonH; resources.gpus above 1 whole. Raises: ValueError."""
        if self.lr_data_exponent and self.training.optimizer == "adamw":
            raise ValueError(
                f"lr_data_exponent={self.lr_data_exponent:g} scales the Muon matrix LR (the paper's data transfer), "
                "and training.optimizer is 'adamw': use optimizer muon or muonh, or lr_data_exponent 0"
            )
        if (
            self.resources.gpus > 0
            and self.resources.gpus > 1
            and self.resources.gpus != int(self.resources.gpus)
        ):
            raise ValueError(f"resources.gpus above 1 must be whole, got {self.resources.gpus}")

    _RUN_CONFIG_READS = frozenset({"model", "corpus", "text_column", "tokenizer", "data_seed", "resources", "training",
                                   "tokens", "budgets", "sizes"})
    """The keys the plain r = 1 runs' configurations read (with seed 0: not ``r`` nor ``seeds``)."""

    def _check_plain_models(self) -> None:
        """:meth:`_check_models` on the plain r = 1 models of every size; used when other keys are invalid or another
        check found a problem, so that a size whose model does not build is said in the same round (it reads the
        model, the tokenizer and the sizes only: a misspelt training key does not hold it back). When the first
        size's model does not build, the problem is the model's, left to its own check. Raises: ValueError naming
        the size."""
        try:
            self._model_config(self.all_sizes()[0], 1, "baseline", 2)
        except ValueError:
            return
        self._check_models([1])

    def _check_plain_runs(self) -> None:
        """:meth:`_check_run_configs` on the plain r = 1 runs only (seed 0), once their models build
        (:meth:`_check_plain_models`); used where that is, so that a value every run's trainer would refuse and two
        budgets that train one D are said in the same round. Raises: ValueError (the first problem found)."""
        from loopscale.model.train import MAX_SEED

        if not 0 <= self.data_seed <= MAX_SEED:  # the seeds' own check says it
            return
        self._check_run_configs(plain=True)

    def _check_models(self, rs) -> None:
        """Every size's baseline model at each r of ``rs`` builds. Raises: ValueError naming the size and r."""
        for s in self.all_sizes():
            for r in rs:
                try:
                    self._model_config(s, r, "baseline", 2)
                except ValueError as e:
                    # a small whole number read as a d_model is most likely a width scale (the paper's s = 6..14)
                    hint = ("; sizes are d_model values (model.size_unit: d_model); for the paper's width scales s "
                            "(d_model = 64 s) set model.size_unit: width_scale"
                            if self.model.size_unit == "d_model" and isinstance(s, int) and s <= 24 else "")  # fmt: skip
                    raise ValueError(f"sizes: size {s} at r={r} is invalid: {e}{hint}") from None

    def _check_run_configs(self, *, plain: bool = False) -> None:
        """Build the full trainer configuration (``RunConfig``) of every grid point, so a value that every run
        would reject (a vocabulary smaller than the tokenizer's, a batch that is not a multiple of seq_len, ...) is
        an error here, before Ray starts, naming the spec keys involved, and never a trial failure. Two budgets of
        one model that train the same D (:func:`loopscale.model.train.resolve_tokens`) are refused too. ``plain``:
        the plain r = 1 runs only, with seed 0, and no FLOP budget's check (:meth:`_check_plain_runs`)."""
        from loopscale.model.train import resolve_tokens

        points = [(1, None)] if plain else [(r, None) for r in self.r] + [(1, depth) for depth in self.ladder]
        trained: dict[tuple, dict[int, float]] = {}  # (size, model) -> {D trained: the budget written}
        for kind, budget, s in self._plan():
            for r, depth in points:
                model = self._model_config(s, r, "baseline", 2, depth=depth)
                try:
                    run = self._run_config(model, kind, budget, 1.0, 0 if plain else self.seeds_for(r)[0])
                except ValueError as e:
                    msg = str(e)
                    if "vocab_size" in msg and "tokenizer" in msg:
                        msg = (
                            f"model.vocab_size: {model.vocab_size} is smaller than the vocabulary of tokenizer "
                            f"{self.tokenizer!r}; set model.vocab_size to at least "
                            f"{_tokenizer_vocab(self.tokenizer)}, or leave it out (then it is sized from the "
                            "tokenizer)"
                        )
                    where = f"r={r}" if depth is None else f"ladder depth {depth}"
                    raise ValueError(
                        f"training: the run at size {s}, {where}, budget {budget:g} would fail in every trial: {msg}"
                    ) from None
                if kind == "C" and not plain:
                    self._check_budget(budget, s, r, depth, run)
                # each variant's looped model costs its own FLOPs per token: one D per budget for each
                models = {"baseline": run.model}
                if kind == "C" and r > 1 and depth is None:
                    models |= {
                        v.name: self._model_config(s, r, v.name, v.hc_lanes) for v in self.variants
                    }
                for variant, m in models.items():
                    D = resolve_tokens(dataclasses.replace(run, model=m))
                    seen = trained.setdefault((s, r, depth, variant), {})
                    if D in seen:
                        self._refuse_same_d(kind, seen[D], budget, D, s, r, depth, variant, run.batch_tokens)
                    seen[D] = budget

    def _refuse_same_d(
        self, kind: str, first: float, second: float, D: int, size: int, r: int, depth: int | None, variant: str, B: int
    ) -> None:
        """Refuse two budgets of one model that the trainer rounds to the same D (``resolve_tokens``): they would be
        two runs (two run ids) of one training, and the fit would count that point twice.

        Raises:
            ValueError: naming both budgets, the D they give and ``training.batch_tokens``.
        """
        if kind == "D":
            where = f" for size {size}" if isinstance(self.tokens, dict) else ""
            raise ValueError(
                f"tokens{where}: {int(first)} and {int(second)} both round to D = {D} tokens (whole batches of "
                f"training.batch_tokens = {B}: D = max(1, round(tokens / {B})) x {B}), so the same training would "
                f"run twice and be fitted as two points; keep one (runs train whole multiples of {B} tokens)"
            )
        model = f"r = {r}" if depth is None else f"ladder depth {depth}"
        if r > 1 and depth is None and (len(self.variants) > 1 or variant != "baseline"):
            model += f", variant {variant}"
        raise ValueError(
            f"budgets: {first:g} and {second:g} FLOPs both give size {size} at {model} the same D = {D} tokens (D = "
            f"round(C / (FLOPs per token x B)) x B, B = training.batch_tokens = {B}), so the same training would "
            f"run twice and be fitted as two points; keep one, or space the budgets further apart"
        )

    def _check_budget(self, C: float, size: int, r: int, depth: int | None, run) -> None:
        """Refuse a FLOP budget that buys less than one optimizer step of a model of the grid (paper Sec. 2's
        ``steps = round(C / (F * batch_tokens))`` is 0), naming the model and the smallest C that every model at
        this budget can use (looped models cost more FLOPs per token, so it is set by the costliest)."""
        from loopscale.model.accounting import flops_per_token

        per_step = float(flops_per_token(run.model)) * run.batch_tokens
        if round(C / per_step) >= 1:
            return
        need = 0.0
        for s in self.budgets[C] if self.budgets and C in self.budgets else [size]:
            for rr, dd in [(x, None) for x in self.r] + [(1, d) for d in self.ladder]:
                m = self._model_config(s, rr, "baseline", 2, depth=dd)
                need = max(need, 0.5 * float(flops_per_token(m)) * run.batch_tokens)
        where = f"r = {r}" if depth is None else f"ladder depth {depth}"
        unit = 10.0 ** (math.floor(math.log10(need)) - 3)
        need = (math.floor(need / unit) + 1) * unit  # 4 significant digits, above the need (round(0.5) is 0)
        raise ValueError(
            f"budgets[{C:g}]: size {size} at {where} gets {C / per_step:.3f} optimizer steps of {run.batch_tokens} "
            f"tokens (C / (FLOPs per token x batch_tokens)), and a run needs at least one; every model at this "
            f"budget needs C >= {need:.4g} (or a smaller training.batch_tokens)"
        )

    def check_data(self, *, warn: bool = True, grid: bool = True) -> list[str]:
        """Cheap checks of the corpus against the tokenizer and the model (:func:`loopscale.model.data.check_corpus`:
        the corpus exists, Parquet files have ``text_column``, a token file's dtype is stated and its ids fit
        ``vocab_size``; where the token counts are cheap to know — a token file, a corpus already in the token cache,
        a text or Parquet corpus of at most ``TOKENIZE_TO_CHECK_BYTES`` bytes of text (a Parquet file's text column,
        whatever its other columns weigh), tokenized here into the cache the runs
        reuse — it is not empty, BPE has enough text to train on, and both splits hold a window of ``seq_len + 1``
        tokens), before Ray starts and in ``--dry-run``.

        Returns:
            Warnings about the data that every run would also give (each also issued as a ``UserWarning`` when
            ``warn``): the corpus's (files a directory corpus leaves out, invalid UTF-8 replaced, NUL bytes dropped, the
            token cache's, e.g. BPE learning fewer tokens than asked), then ``training.eval_tokens`` (or
            ``tune.eval_tokens`` with ``lr: tune``) more than the validation split holds, saying how many tokens are
            evaluated (the runs evaluate what there is), then runs (or LR trials) that would repeat the training
            data, where the corpus's size is known (:func:`loopscale.sweep.run.corpus_epochs`, the dry run's
            ``data_warning``: every such run warns of it again as it starts; ``grid`` False: the LR trials alone,
            for ``tune-lr``, which trains no run of the grid).

        Raises:
            SpecError: the corpus would make every run fail (the message names ``corpus``/``tokenizer`` and says
                what the runs would have said).
        """
        import warnings

        from loopscale.model.data import CorpusWarning
        from loopscale.sweep.run import corpus_epochs

        corpus_notes, eval_notes = self._data_notes()
        repeat = corpus_epochs(self)["data_warning" if grid else "lr_data_warning"]
        eval_notes = [*eval_notes, repeat] if repeat else eval_notes
        if warn:
            for note in corpus_notes:
                warnings.warn(note, CorpusWarning, stacklevel=2)
            for note in eval_notes:
                warnings.warn(note, UserWarning, stacklevel=2)
        return corpus_notes + eval_notes

    def _data_notes(self) -> tuple[list[str], list[str]]:
        """(the corpus's warnings, the eval_tokens warnings) of :meth:`check_data`, issued by neither."""
        import warnings

        from loopscale.model.data import CorpusWarning, check_corpus, eval_tokens_note

        model = self._model_config(self.all_sizes()[0], min(self.r), "baseline", 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CorpusWarning)
            try:
                split = check_corpus(
                    self.corpus, self.tokenizer, model.vocab_size, self.text_column, seq_len=model.seq_len
                )
            except (ValueError, FileNotFoundError) as e:
                from loopscale.model.data import CorpusNotFoundError, spec_path_note

                where = spec_path_note(self.corpus) if isinstance(e, CorpusNotFoundError) else ""
                raise SpecError(f"corpus {self.corpus!r} / tokenizer {self.tokenizer!r}: {e}{where}") from None
        for w in caught:  # a library's warning is shown as it would have been
            if not issubclass(w.category, CorpusWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        corpus_notes = list(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, CorpusWarning)))
        from loopscale.model.train import unused_vocab_note

        if note := unused_vocab_note(model.vocab_size, self.tokenizer):  # every run would warn of it too
            corpus_notes.append(note)
        eval_notes: list[str] = []
        if split is not None:
            asked = [self.training.eval_tokens]
            if self.lr == "tune":
                asked.append(self.tune.eval_tokens or self.training.eval_tokens)
            for n in dict.fromkeys(asked):
                if note := eval_tokens_note(split.val, model.seq_len, n):
                    eval_notes.append(note)
        return corpus_notes, eval_notes

    # --- grid -------------------------------------------------------------------------------------

    def all_sizes(self) -> list[int]:
        """Every size the grid uses, sorted."""
        if self.budgets is not None:
            return sorted({s for ss in self.budgets.values() for s in ss})
        return sorted(set(self.sizes))

    def default_vocab_size(self) -> int:
        """The vocabulary V of a spec that leaves ``model.vocab_size`` out: the preset's, raised to the tokenizer's
        when that is larger (e.g. ``bpe:4096``)."""
        from loopscale.model.config import PRESETS

        return max(PRESETS[self.model.preset]["vocab_size"], _tokenizer_vocab(self.tokenizer) or 0)

    def _model_config(self, size: int, r: int, variant: str, hc_lanes: int, depth: int | None = None):
        """The model of a cell; ``depth``: a ladder rung (a plain r = 1 model with this many layers)."""
        from loopscale.model.config import preset_config

        m = self.model
        over: dict[str, Any] = dict(
            effective_depth=m.effective_depth if depth is None else depth,
            n_prelude=m.n_prelude if depth is None else 0,  # a rung has no prelude/coda (r = 1: plain layers)
            n_coda=m.n_coda if depth is None else 0,
            seq_len=m.seq_len,
            vocab_size=m.vocab_size,
            head_dim=m.head_dim,
        )
        if m.vocab_size is None:
            over["vocab_size"] = self.default_vocab_size()
        if r > 1:
            if variant == "trunc_bptt":
                over["bptt_k"] = math.ceil(r / 2)
                over["injection"] = m.injection
            elif variant == "hyperconnect":
                over["injection"] = "hyperconnect"
                over["hc_lanes"] = hc_lanes
            else:
                over["injection"] = m.injection
        width = {"d_model": size} if m.size_unit == "d_model" else {"width_scale": size}
        return preset_config(m.preset, r=r, **width, **over)

    def _run_config(self, model, kind: str, budget: float, lr: float, seed: int):
        """The RunConfig of one cell: the grid coordinates, the spec's data and the ``training:`` overrides."""
        from loopscale.model.train import RunConfig

        return RunConfig(
            model=model,
            corpus=self.corpus,
            text_column=self.text_column,
            tokenizer=self.tokenizer,
            tokens=int(budget) if kind == "D" else None,
            target_flops=float(budget) if kind == "C" else None,
            lr=lr,
            seed=seed,
            data_seed=self.data_seed,
            device="cuda" if self.resources.gpus > 0 else "cpu",
            num_threads=max(1, int(self.resources.cpus)),
            **self.training.model_dump(),
        )

    def tuning_model(self, size: int, r: int):
        """The model (a :class:`loopscale.model.config.LoopedConfig`) the LR trials of the (size, r) study train: the
        ``baseline`` variant's at that size and r (:func:`loopscale.sweep.lr_search.tuning_budget`'s base cell's)."""
        return self._model_config(size, r, "baseline", 2)

    def tuning_steps(self, size: int, r: int) -> tuple[int, int]:
        """(optimizer steps, steps per milestone) of the LR trials of the (size, r) study: the tokens
        :func:`loopscale.sweep.lr_search.tuning_tokens_asked` gives (``tune.tokens`` or ``tune.tokens_per_param`` x
        (N_once + r N_rec), paper App. D) in whole steps of ``training.batch_tokens``, rounded up to a whole number of
        steps per milestone (at least one per milestone)."""
        from loopscale.sweep.lr_search import tuning_tokens_asked

        B, M = self.training.batch_tokens, self.tune.num_milestones
        want = tuning_tokens_asked(self, self.tuning_model(size, r), r)
        steps = max(M, int(round(want / B)))
        steps = int(math.ceil(steps / M) * M)
        return steps, steps // M

    def lr_reference_tokens(self, size: int, r: int) -> int:
        """D_ref of the LR of cell (size, r), in tokens: what the LR trials of the study that sets it train
        (:meth:`tuning_steps` x batch_tokens; the study is (size, r), or (size, largest r) with ``tune.tune_per_r:
        false``). The base of :attr:`lr_data_exponent`'s transfer."""
        r_study = r if self.tune.tune_per_r else max(self.r)
        return self.tuning_steps(size, r_study)[0] * self.training.batch_tokens

    def _with_data_factor(self, run, size: int, r_lr: int, cache: dict):
        """``run`` with ``lr_data_factor`` = (D / D_ref)^-lr_data_exponent (D: its training tokens; D_ref:
        :meth:`lr_reference_tokens` of (size, r_lr), cached in ``cache``); ``run`` itself when the exponent is 0."""
        if not self.lr_data_exponent:
            return run
        from loopscale.model.train import resolve_tokens

        if (size, r_lr) not in cache:
            cache[(size, r_lr)] = self.lr_reference_tokens(size, r_lr)
        factor = (resolve_tokens(run) / cache[(size, r_lr)]) ** -self.lr_data_exponent
        # 12 significant digits: the factor is hashed into the run id, and a last-bit difference of pow() between
        # two machines' math libraries must not make two ids of one run
        return dataclasses.replace(run, lr_data_factor=float(f"{factor:.12g}"))

    def _plan(self) -> list[tuple[str, float, int]]:
        """(kind 'C' | 'D', budget, size) of every grid point, in the grid's order."""
        if self.budgets is not None:
            return [("C", float(c), s) for c, ss in sorted(self.budgets.items()) for s in ss]
        per = self.tokens if isinstance(self.tokens, dict) else {s: self.tokens for s in self.sizes}
        plan = [("D", int(d), s) for s in sorted(per) for d in per[s]]
        plan.sort(key=lambda t: (t[1], t[2]))
        return plan

    def lr_for(self, size: int, r: int, lr_table: dict | None = None) -> float:
        """The LR of cell (size, r) under the spec's LR policy.

        ``lr_table``: {(size, r): lr} from stage 1 (required when ``lr: tune``).

        Raises:
            SpecError: ``lr: tune`` without an lr_table, or a table with no entry for (size, r).
        """
        if self.lr == "tune":
            if lr_table is None:
                raise SpecError("lr is 'tune' but no LR table was given: run `loopscale tune-lr SPEC` first")
            key = (size, r) if (size, r) in lr_table else (size, None)
            if key not in lr_table:
                raise SpecError(
                    f"lr_table has no LR for size {size}, r {r}; it has {sorted(lr_table, key=str)}"
                )
            return float(lr_table[key])
        if "fixed" in self.lr:
            return float(self.lr["fixed"])
        tab = self.lr["table"]
        v = tab.get(size, tab.get(str(size)))
        if isinstance(v, dict):
            w = v.get(r, v.get(str(r)))
            if w is None:
                raise SpecError(f"lr.table[{size}] has no entry for r={r}")
            return float(w)
        return float(v)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> SweepSpec:
        """A copy of the spec; with ``update`` (top-level keys, values as in the YAML or as objects), the result is
        validated as a spec read from a file (pydantic's own ``model_copy`` skips validation: ``r="banana"`` passed,
        to fail later inside ``cells()`` or a sweep with a TypeError). Each key given replaces that key's value
        whole, as in a spec file: a section given as a mapping (``{"training": {"batch_tokens": 512}}``) is that
        section with its other keys at their defaults, not the preset's (the smoke preset's eval_tokens 2048 would
        become 65536). To change some keys of a section and keep the rest, give the section's own changed copy:
        ``update={"training": spec.training.model_copy(update={"batch_tokens": 512})}`` (a merge would keep keys that
        exclude the one given, e.g. ``tune.tokens`` beside a new ``tune.tokens_per_param``).

        Raises:
            SpecError: the updated spec is invalid; the message names the key (``r: ...``).
        """
        if not update:
            return super().model_copy(deep=deep)
        unknown = sorted(set(update) - set(type(self).model_fields))
        if unknown:
            raise SpecError(f"model_copy: unknown spec key(s) {unknown}; the keys are {sorted(type(self).model_fields)}")
        # a section given as its own changed copy (a pydantic model: ``spec.tune.model_copy(update=...)``, whose
        # own ``model_copy`` validates nothing) is read as its mapping, so its values get a spec file's checks
        return parse_spec({**self.model_dump(), **{k: _as_plain(v) for k, v in update.items()}})

    def cells(self, lr_table: dict | None = None) -> list[Cell]:
        """Every grid cell, in a fixed order (variant, budget, size, r, seed).

        ``lr_table`` ({(size, r) or (size, None): lr}) is needed when the spec's LR policy is ``tune``.

        Raises:
            SpecError: see :meth:`lr_for`.
        """
        out: list[Cell] = []
        plan = self._plan()
        seen: set[str] = set()
        d_ref: dict[tuple[int, int], int] = {}
        for v in self.variants:
            for kind, budget, size in plan:
                for r in sorted(self.r):
                    variant = v.name if r > 1 else "baseline"  # r = 1 is shared by every variant
                    for seed in self.seeds_for(r):
                        cfg = self._model_config(size, r, variant, v.hc_lanes)
                        lr = self.lr_for(size, r, lr_table)
                        cell = Cell(
                            variant=variant,
                            r=r,
                            size=size,
                            budget=budget if kind == "C" else None,
                            seed=seed,
                            run=self._with_data_factor(self._run_config(cfg, kind, budget, lr, seed), size, r, d_ref),
                        )
                        if cell.run_id not in seen:
                            seen.add(cell.run_id)
                            out.append(cell)
                if v.name != self.variants[0].name:
                    continue  # the ladder is plain r = 1 models: shared by every variant, listed once
                for depth in self.ladder:
                    cfg = self._model_config(size, 1, "baseline", v.hc_lanes, depth=depth)
                    lr = self.lr_for(size, 1, lr_table)
                    for seed in self.seeds_for(1):
                        cell = Cell(
                            variant="baseline",
                            r=1,
                            size=size,
                            budget=budget if kind == "C" else None,
                            seed=seed,
                            run=self._with_data_factor(self._run_config(cfg, kind, budget, lr, seed), size, 1, d_ref),
                        )
                        if cell.run_id not in seen:
                            seen.add(cell.run_id)
                            out.append(cell)
        if not out:
            raise SpecError("the spec defines an empty grid")
        return out

    def check_runtime(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        *,
        warn_data: bool = True,
        data: bool = True,
        models: str = "grid",
    ) -> None:
        """Checks that need the machine, run before Ray starts (``data`` False: without :meth:`check_data`, for a
        command that reads no corpus). ``models``: whose memory to check (:meth:`_check_fits_memory_here`):
        ``"grid"`` (the grid's trials, seed ensembles counted), ``"single"`` (LR tuning: one model per trial) or
        ``"none"`` (nothing trains, e.g. a refit).

        With no cluster ``address`` (and no ``RAY_ADDRESS`` in the environment) trials run on the embedded local
        Ray, which has ``num_cpus`` CPUs (default: this machine's cores) and ``num_gpus`` GPUs (default: the CUDA
        devices torch sees): a trial that asks for more could never start (Tune would wait forever). On a cluster
        more may come (autoscaler), so nothing is checked there. ``warn_data``: issue :meth:`check_data`'s warnings.

        Raises:
            SpecError: the corpus would fail every run (:meth:`check_data`); ``resources.gpus`` > 0 on the
                embedded Ray where ``torch.cuda.is_available()`` is False; ``resources.cpus`` / ``resources.gpus``
                per trial above what the embedded Ray has (one line naming every resource it lacks); a model of the
                grid that does not fit this machine's memory (:meth:`_check_fits_memory_here`).
        """
        import os

        if data:  # (LR tuning trains no run of the grid: its trials' data repeat alone)
            self.check_data(warn=warn_data, grid=models != "single")
        from loopscale.cluster.connect import joins_a_cluster

        if joins_a_cluster(address):
            return
        cpus = num_cpus if num_cpus is not None else (os.cpu_count() or 1)
        lacks: list[str] = []  # every resource a trial asks for that the embedded Ray lacks, said in one line
        fixes: list[str] = []
        if self.resources.cpus > cpus:
            lacks.append(f"resources.cpus={self.resources.cpus:g} per trial, but the embedded Ray has {cpus} CPUs "
                         f"({'--num-cpus' if num_cpus is not None else 'the cores of this machine'})")  # fmt: skip
            fixes.append(f"resources.cpus <= {cpus}")
        no_gpu = False
        if self.resources.gpus > 0:
            import torch

            if not torch.cuda.is_available():
                no_gpu = True
                lacks.append(f"resources.gpus={self.resources.gpus:g} but no GPU is available here "
                             "(torch.cuda.is_available() is False)")  # fmt: skip
                fixes.append("resources.gpus: 0")
            else:
                gpus = num_gpus if num_gpus is not None else torch.cuda.device_count()
                if self.resources.gpus > gpus:
                    lacks.append(f"resources.gpus={self.resources.gpus:g} per trial, but the embedded Ray has {gpus} GPUs")
                    fixes.append(f"resources.gpus <= {gpus}")
        if lacks:
            cluster = ("a GPU cluster" if len(lacks) == 1 else "a larger GPU cluster") if no_gpu else "a larger cluster"
            raise SpecError(
                f"{'; and '.join(lacks)}: no trial could start; set {' and '.join(fixes)}, or pass --address of "
                f"{cluster}"
            )
        if models not in ("grid", "single", "none"):
            raise ValueError(f"models must be 'grid', 'single' or 'none', got {models!r}")
        if models != "none":
            self._check_fits_memory_here(single=models == "single")

    def _check_fits_memory_here(self, *, single: bool = False) -> None:
        """Refuse a grid with a trial whose model (times its seed-ensemble members; ``single``: one model per trial,
        as LR tuning trains) the trainer would refuse for memory on this machine
        (:func:`loopscale.model.train.check_fits_memory`'s lower bound: fp32 weights, gradients and one optimizer
        state), so that it is said before Ray starts rather than by every such trial (the others trained, the
        command ending 0 on half a grid). Checked on the embedded Ray only: a cluster's nodes have their own memory.

        Raises:
            SpecError: the first model that does not fit (size, r, variant or ladder depth), with the memory it
                needs and the machine's.
        """
        import torch

        from loopscale.model.accounting import n_total
        from loopscale.model.train import (
            device_memory_bytes,
            lane_heavy_params,
            memory_need_text,
            train_state_bytes,
        )

        device = torch.device("cuda" if self.resources.gpus > 0 else "cpu")
        total = device_memory_bytes(device)
        if total is None:
            return
        most = 1 if single else self.ensemble_members()
        for v in self.variants:
            for size in reversed(self.all_sizes()):  # the largest first: the likeliest not to fit
                for r in sorted(self.r):
                    n = len(self.seeds_for(r))
                    members = math.ceil(n / math.ceil(n / most))  # the largest trial of trial_groups' split
                    variant = v.name if r > 1 else "baseline"
                    models = [(self._model_config(size, r, variant, v.hc_lanes), "")]
                    if r == 1:
                        models += [(self._model_config(size, 1, "baseline", v.hc_lanes, depth=d), f", ladder depth {d}")
                                   for d in self.ladder]  # fmt: skip
                    for cfg, rung in models:
                        one = train_state_bytes(cfg)
                        if one * members <= total:
                            continue
                        who = f"size {size}, r={r}{rung}" + (f", variant {variant}" if variant != "baseline" else "")
                        what = (f"{members} seeds per trial of {n_total(cfg):,} parameters" if members > 1 else
                                f"{n_total(cfg):,} parameters")  # fmt: skip
                        fix = ("set resources.ensemble: 1 (one seed per trial; a changed spec trains in a new --out "
                               "folder), or use smaller sizes" if members > 1 and one <= total else
                               "use smaller sizes")  # fmt: skip
                        if lanes := lane_heavy_params(cfg):  # the lanes' weights are most of it, not the width
                            fix = (f"{lanes:,} of its parameters are the hyperconnection weights of hc_lanes="
                                   f"{cfg.hc_lanes} (r (K^2 + 2K)): use fewer lanes (the paper uses 2)")  # fmt: skip
                        raise SpecError(
                            f"sizes: the model of {who} does not fit in this machine's memory: {what} "
                            f"{memory_need_text(one * members, total, device)}; every such trial would fail here (the "
                            f"embedded Ray's trials run on this machine): {fix}, or pass --address of a cluster"
                        )


@dataclass(frozen=True)
class Cell:
    """One grid cell: its grid coordinates and its full trainer configuration.

    ``budget`` is C in training FLOPs for iso-FLOP specs (None in tokens mode); ``run`` is the cell's
    :class:`loopscale.model.train.RunConfig` (without a checkpoint folder: the trial adds it).
    """

    variant: str
    r: int
    size: int
    budget: float | None
    seed: int
    run: Any = field(hash=False)  # compared: in tokens mode only the run holds D (two budgets, equal coordinates)

    @functools.cached_property
    def run_id(self) -> str:
        """Stable hash of everything that defines the run (see :func:`run_id`); computed once per cell (the cell
        and its frozen run configuration do not change)."""
        return run_id(self)

    @property
    def lr(self) -> float:
        return float(self.run.lr)

    def run_config(self, **overrides):
        """The :class:`loopscale.model.train.RunConfig` of this cell (``overrides`` e.g. checkpoint_dir)."""
        return dataclasses.replace(self.run, **overrides)

    def to_dict(self) -> dict:
        """JSON-able form (the run configuration as a dict); inverse of :meth:`from_dict`."""
        return dict(
            variant=self.variant,
            r=self.r,
            size=self.size,
            budget=self.budget,
            seed=self.seed,
            run=self.run.to_dict(),
        )

    @classmethod
    def from_dict(cls, d: dict) -> Cell:
        from loopscale.model.train import RunConfig

        return cls(
            variant=d["variant"],
            r=d["r"],
            size=d["size"],
            budget=d["budget"],
            seed=d["seed"],
            run=RunConfig.from_dict(d["run"]),
        )


def _tokenizer_vocab(tokenizer: str) -> int | None:
    """Vocabulary a tokenizer spec needs (None for 'pretokenized' or an invalid spec, which RunConfig reports)."""
    from loopscale.model.data import tokenizer_vocab_size

    try:
        return tokenizer_vocab_size(tokenizer)
    except ValueError:
        return None


def _canon(x: Any) -> Any:
    if isinstance(x, float):
        return repr(float(x))
    if isinstance(x, dict):
        return {str(k): _canon(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, list | tuple):
        return [_canon(v) for v in x]
    if hasattr(x, "to_dict"):
        return _canon(x.to_dict())
    return x


def _quoted_hint(v) -> str:
    """For a number written in quotes (YAML reads it as text), what to write instead; else ''."""
    num = _as_number(v) if isinstance(v, str) else None
    if num is None:
        return ""
    return f" ({v!r} is quoted, so YAML reads it as text: write {_number_text(num)} without quotes)"


def _positive_lr(v) -> bool:
    """True for a positive finite number (a YAML ``true``, a string, a list or ``.nan`` is not an LR)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def run_id(cell: Cell | dict) -> str:
    """Stable 16-hex-digit id of a run: sha256 over the canonical JSON of its run definition
    (:func:`loopscale.model.train.run_definition`: model config, D or C, LR, seed, data, schedule, ...) plus the
    variant. Same definition ⇒ same id, across processes and machines (floats hashed by ``repr``)."""
    from loopscale.model.train import run_definition

    if not isinstance(cell, Cell):
        cell = Cell.from_dict(cell)
    payload = run_definition(cell.run)
    payload["variant"] = cell.variant
    blob = json.dumps(_canon(payload), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _model_in(annotation) -> type[BaseModel] | None:
    """The pydantic model inside a field's annotation (``Model``, ``Model | None``, ``list[Model]``, ...)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(loc: tuple) -> str:
    """For an unknown key at ``loc`` (pydantic's error location from :class:`SweepSpec`): " (did you mean 'x'?)"
    naming the closest key the spec accepts there (:func:`_closest_key`), a hint where the key belongs, or the keys
    accepted there; '' where ``loc`` is not in a section of the spec."""
    where = ".".join(str(p) for p in loc[:-1] if not isinstance(p, int))
    elsewhere = _KEYS_ELSEWHERE.get((where, str(loc[-1])))
    if elsewhere:
        return f" ({elsewhere})"
    cls = _section_at(loc)
    if cls is None:
        return ""
    close = _closest_key(loc)
    if close:
        return f" (did you mean {close!r}?)"
    return f" (the keys {'of ' + where if where else 'at the top'} are: {', '.join(cls.model_fields)})"


def _section_at(loc: tuple) -> type[BaseModel] | None:
    """The model of the spec's section holding the key at ``loc`` (:class:`SweepSpec` for a top-level key), or
    None where ``loc`` does not run through the spec's sections."""
    cls: type[BaseModel] | None = SweepSpec
    for part in loc[:-1]:
        if isinstance(part, int):  # an item of a list: the same model
            continue
        field = cls.model_fields.get(part) if cls is not None else None
        cls = _model_in(field.annotation) if field is not None else None
        if cls is None:
            return None
    return cls


def _closest_key(loc: tuple) -> str | None:
    """The key a misspelt key at ``loc`` most likely stands for, as the spec writes it: a key of the same section
    (difflib ratio >= 0.6), or, for a top-level key, a section's key when that is closer (``eval_token`` ->
    ``'training.eval_tokens'``, not ``'tokens'``); None when nothing is that close. :func:`_did_you_mean` suggests
    it, and :func:`parse_spec` treats the section it names as unread."""
    cls = _section_at(loc)
    if cls is None:
        return None
    key = str(loc[-1])
    close = _closest(key, list(cls.model_fields))
    if cls is SweepSpec:
        import difflib

        def ratio(name: str) -> float:  # difflib's, as _closest's cutoff reads it
            return difflib.SequenceMatcher(None, key, name).ratio()

        score = {f"{name}.{sub}": ratio(sub) for name, f in SweepSpec.model_fields.items()
                 if (sec := _model_in(f.annotation)) is not None for sub in sec.model_fields}  # fmt: skip
        best = max(score, key=score.__getitem__, default=None)
        if best and score[best] >= 0.6 and (close is None or score[best] > ratio(close)):
            close = best
    return close


_KEYS_ELSEWHERE = {
    ("training", "lr"): "the LR is the top-level key lr: tune, {fixed: LR} or {table: ...}",
    ("training", "seed"): "init seeds are the top-level key seeds",
    ("training", "data_seed"): "the data order is the top-level key data_seed",
    ("training", "tokens"): "token budgets are the top-level keys sizes + tokens, or budgets",
    ("training", "device"): "trials run on GPUs when resources.gpus > 0",
    ("training", "num_threads"): "each trial's torch threads are resources.cpus",
    ("training", "lr_data_factor"): "each run's factor comes from the top-level key lr_data_exponent",
    ("model", "hc_lanes"): "lanes belong to the hyperconnect variant: variants: [{name: hyperconnect, hc_lanes: 4}]",
    ("model", "bptt_k"): "truncated BPTT is the variant trunc_bptt (bptt_k = ceil(r / 2)): variants: [trunc_bptt]",
    ("variants", "bptt_k"): "the variant trunc_bptt sets bptt_k = ceil(r / 2) itself (the paper's); another k is "
    "a single run's: `loopscale train --bptt-k K`",
    ("training", "bptt_k"): "truncated BPTT is the variant trunc_bptt (bptt_k = ceil(r / 2)): variants: [trunc_bptt]",
    ("", "bptt_k"): "truncated BPTT is the variant trunc_bptt (bptt_k = ceil(r / 2)): variants: [trunc_bptt]",
    ("model", "r"): "recurrences are the top-level key r",
    ("model", "d_model"): "widths are the top-level key sizes (or the sizes of budgets)",
    ("", "optimizer"): "the optimizer is training.optimizer",
    ("", "batch_tokens"): "the batch is training.batch_tokens",
    ("", "learning_rate"): "the LR is the top-level key lr: tune, {fixed: LR} or {table: ...}",
    ("", "lr_fixed"): "a fixed LR is lr: {fixed: LR}",
    ("", "seed"): "init seeds are the top-level key seeds (a count or a list)",
    ("", "d_model"): "widths are the top-level key sizes (or the sizes of budgets)",
    ("", "widths"): "widths are the top-level key sizes (or the sizes of budgets)",
    ("", "steps"): "the top-level key tokens gives D in tokens per run (steps = D / training.batch_tokens)",
    ("", "seq_len"): "the context length is model.seq_len",
    ("", "vocab_size"): "the vocabulary is model.vocab_size",
    ("", "preset"): "the model family is model.preset; a sweep preset is `loopscale run --preset NAME`",
}
"""Keys a spec writer puts in the wrong section, and where they belong: ``(section, key)`` -> the hint."""


def _closest(word: str, options: list[str]) -> str | None:
    """The option most like a misspelt ``word`` (difflib ratio >= 0.6), or None."""
    import difflib

    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return close[0] if close else None


_UNION_FORMS = {
    "lr": "'tune', {fixed: LR} or {table: ...}",
    "tokens": "a list of integers (D in tokens, e.g. [100000, 200000]) or a per-size mapping {size: [D, ...]}",
    "seeds": "a count, a list of integer seeds, or a mapping r -> either",
}
"""What each field typed as a union of forms accepts, in the spec's words (pydantic names each form by its type)."""


def _union_at(loc: tuple) -> int | None:
    """The index in ``loc`` (pydantic's error location from :class:`SweepSpec`) of the form's name that pydantic puts
    after a field typed as a union of forms (``lr``: ``literal['tune']``, ``dict[str,any]``), or None."""
    import types
    import typing

    cls: type[BaseModel] | None = SweepSpec
    for i, part in enumerate(loc):
        if isinstance(part, int):  # an item of a list: the same model
            continue
        field = cls.model_fields.get(part) if cls is not None else None
        if field is None:
            return None
        ann = field.annotation
        forms = [a for a in typing.get_args(ann) if a is not type(None)]
        if typing.get_origin(ann) in (typing.Union, types.UnionType) and len(forms) > 1:
            return i + 1 if i + 1 < len(loc) else None
        cls = _model_in(ann)
    return None


def _as_number(x: Any) -> float | None:
    """``x`` as a finite number when it is one or is text that reads as one ('1e5'), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, str):
        try:
            x = float(x.replace("_", ""))
        except ValueError:
            return None
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def _number_text(x: float) -> str:
    """A number as a spec would write it: 100000 for 1e5, 0.01 for 1e-2."""
    return str(int(x)) if x.is_integer() else f"{x:g}"


def _loc_text(loc: tuple) -> str:
    return ".".join(str(x) for x in loc if x != "[key]") + (" (a key)" if loc and loc[-1] == "[key]" else "")


def _fmt_one(err: dict, loc: tuple) -> str:
    """One pydantic error as ``key: message``, saying what to write for a number given as quoted text."""
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden" and loc:
        msg += _did_you_mean(loc)
    value = err.get("input")
    num = _as_number(value) if isinstance(value, str) else None
    if err["type"] in ("int_parsing", "float_parsing") and num is not None:
        if err["type"] == "float_parsing" or num.is_integer():
            msg += f" ({value!r} is quoted, so YAML reads it as text: write {_number_text(num)} without quotes)"
        else:
            msg += f" ({value!r} is quoted, so YAML reads it as text, and is not a whole number)"
    if err["type"] in ("list_type", "model_type", "dict_type") and loc and loc[-1] != "[key]":
        msg = ("must be a list" if err["type"] == "list_type" else "must be a mapping") + _shape_hint(
            err["type"], str(loc[-1]), value)
    elif err["type"] in ("int_type", "float_type", "string_type", "bool_type") and isinstance(value, list | dict):
        one = f": write {loc[-1]}: {value[0]!r}" if isinstance(value, list) and len(value) == 1 and loc else ""
        msg += f", got {value!r} (a {'list' if isinstance(value, list) else 'mapping'}){one}"
    elif err["type"] == "string_type" and isinstance(value, bool | int | float | datetime.date) and loc:
        # name: 123 / yes / 2001-12-14: YAML reads a number, a boolean or a date, not text
        if isinstance(value, bool):
            msg += (f", got {value!r}: YAML reads yes/no/on/off/true/false as a boolean; write the text in quotes, "
                    f"e.g. {loc[-1]}: 'yes'")  # fmt: skip
        else:
            kind = "a date" if isinstance(value, datetime.date) else "a number"
            msg += (f", got {value}: YAML reads it as {kind}; write the text in quotes as you meant it, e.g. "
                    f"{loc[-1]}: 'run-1'")  # fmt: skip
    where = _loc_text(loc)
    return f"{where}: {msg}" if where else msg


def _shape_hint(kind: str, key: str, value) -> str:
    """What to write when a key's value has the wrong shape (``kind``: pydantic's error type), e.g. ``r: 4`` for a
    list or ``model: cpu`` for a mapping: the value given and the same value in the shape the key takes."""
    got = f", got {value!r}"
    if kind == "list_type":
        if isinstance(value, dict):
            return got + f" (a mapping); a list is written in brackets, e.g. {key}: [1, 2]"
        if value is None:
            return got + f" (the key with no value); a list is written in brackets, e.g. {key}: [1, 2]"
        text = _number_text(n) if (n := _as_number(value)) is not None else str(value)
        return got + f"; a list is written in brackets: {key}: [{text}] for one value"
    if isinstance(value, list):
        return got + f" (a list); a mapping is written in braces: {key}: {{key: value, ...}}"
    if key == "model" and value in ("cpu", "paper"):
        return got + f"; the model family is a key of model: write model: {{preset: {value}}}"
    if value is None:
        return got + f" (the key with no value); a mapping is written in braces: {key}: {{key: value, ...}}, or " \
            "leave the key out for its defaults"
    return got + f"; a mapping is written in braces: {key}: {{key: value, ...}}"


def _fmt_union(where: tuple, errors: list[tuple[str, tuple, dict]]) -> str:
    """The errors of one field typed as a union of forms, ``errors`` as (form, location below the field, error), as one
    message saying what the field accepts in the spec's words: the errors inside the one form whose container the
    value has (a list of which an item is not an integer), else the value given, with what to write for a number."""
    field = str(where[-1])
    forms = list(dict.fromkeys(form for form, _, _ in errors))
    text = f"{_loc_text(where)}: must be {_UNION_FORMS.get(field, ' or '.join(forms))}"
    inside = {form for form, rest, _ in errors if rest}
    if len(inside) == 1:  # the value is that form's container: say what inside it is wrong
        return text + "; " + "; ".join(_fmt_one(err, where + rest) for form, rest, err in errors if form in inside)
    value = next((err.get("input") for _, rest, err in errors if not rest), None)
    text += f", got {value!r}"
    num = _as_number(value)
    if num is not None:
        quoted = " (quoted, so YAML reads it as text)" if isinstance(value, str) else ""
        if field == "lr" and num > 0:
            text += f"{quoted}: for a fixed LR write lr: {{fixed: {_number_text(num)}}}"
        elif field == "tokens" and num.is_integer() and num > 0:
            text += f"{quoted}: for one budget write tokens: [{_number_text(num)}]"
    return text


def _fmt_error(e: ValidationError) -> str:
    """A pydantic error of :class:`SweepSpec` as one line naming each key; the errors of a field typed as a union of
    forms are one message in the spec's words (:func:`_fmt_union`), not one per form under pydantic's type names."""
    parts: list[str | tuple] = []
    unions: dict[tuple, list[tuple[str, tuple, dict]]] = {}
    for err in e.errors():
        loc = tuple(err["loc"])
        i = _union_at(loc)
        if i is None:
            parts.append(_fmt_one(err, loc))
            continue
        if loc[:i] not in unions:
            unions[loc[:i]] = []
            parts.append(loc[:i])
        unions[loc[:i]].append((loc[i], loc[i + 1 :], err))
    text = [p if isinstance(p, str) else _fmt_union(p, unions[p]) for p in parts]
    return "invalid sweep spec: " + "; ".join(text)


_SAID_SPEC_NOTES: set[str] = set()
"""The notes :func:`_say_spec_notes` gave in this process (each is said once: a command reads its spec several
times)."""


def _say_spec_notes(spec: SweepSpec) -> None:
    """Warn (once per process) of what a valid spec holds that has no effect, without refusing it: a folder
    trained with it must still read its spec. ``training.decay_frac`` other than its default with a schedule other
    than 'wsd' (it is part of every run's id; ``loopscale train --decay-frac`` notes the same)."""
    import warnings

    t = spec.training
    notes = []
    if t.decay_frac != type(t).model_fields["decay_frac"].default and t.schedule != "wsd":
        notes.append(
            f"training.decay_frac ({t.decay_frac:g}) has no effect with schedule {t.schedule!r}: it is the final "
            "decay of schedule 'wsd' (warmup, constant, then the decay over the last decay_frac of the steps); "
            "leave it out of a new spec (a folder trained with it keeps it: it is part of its runs' ids), or set "
            "schedule: wsd"
        )
    for note in notes:
        if note not in _SAID_SPEC_NOTES:
            _SAID_SPEC_NOTES.add(note)
            warnings.warn(note, UserWarning, stacklevel=1)  # from this file: the console shows `warning: <note>`


def parse_spec(data: dict) -> SweepSpec:
    """Validate a spec dict (as read from YAML).

    Raises:
        SpecError: unknown keys or invalid values; the message names each key ("model.preset: ...").
    """
    if data is None:  # an empty YAML file, or one of comments only
        raise SpecError("the sweep spec is empty: it needs at least tokens (with sizes) or budgets; the presets "
                        "in configs/ (smoke.yaml, cpu.yaml, paper.yaml) are complete specs to start from, and the "
                        "README's 'Configs and presets' section lists every key")
    if not isinstance(data, dict):
        what = {"list": "a list", "str": "a single string", "int": "a number", "float": "a number"}
        raise SpecError(f"a sweep spec must be a mapping of keys (name:, r:, sizes:, ...), got "
                        f"{what.get(type(data).__name__, type(data).__name__)}")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as e:
        first = e
    else:
        if isinstance(given := data.get("corpus"), str) and given != spec.corpus:  # a relative path made absolute
            from loopscale.model.data import RELATIVE_SPEC_PATHS

            RELATIVE_SPEC_PATHS[spec.corpus] = (given, os.getcwd())
        _say_spec_notes(spec)
        return spec
    # the keys that failed their own checks: the checks across keys that read none of them are run without them, so
    # that their problems come in the same message (a second round after the fix was needed to see them)
    invalid = {err["loc"][0] for err in first.errors() if err["loc"]}
    for err in first.errors():  # a misspelt key: the key it stands for would be read at its default, so it counts
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:  # as invalid too (no problem made up from it)
            close = _closest_key(err["loc"])  # the key the message suggests; for a section's key ('training.eval_tokens')
            if close:  # its section counts as invalid
                invalid.add(close.split(".")[0])
    if invalid and all(err["loc"] for err in first.errors()):
        try:
            SweepSpec.model_validate({k: v for k, v in data.items() if k not in invalid}, context={"invalid": invalid})
        except ValidationError as e:
            across = [err for err in e.errors() if not err["loc"]]
            if across:
                raise SpecError(f"{_fmt_error(first)}; {'; '.join(_fmt_one(err, ()) for err in across)}") from None
    raise SpecError(_fmt_error(first)) from None


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a YAML sweep spec.

    Raises:
        FileNotFoundError: no such file.
        SpecError: invalid YAML (the message says where) or invalid content (the message names the key).
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"sweep spec not found: {p}")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:  # a binary or compressed file, or another encoding (offset: in the file)
        raise SpecError(
            f"sweep spec {p} is not UTF-8 text (byte {raw[e.start:e.start + 1]!r} at offset {e.start}): "
            "a spec is a YAML text file; is this the file you meant (a compressed or binary file)?"
        ) from None
    try:
        data = yaml.load(text, Loader=spec_loader())
    except yaml.YAMLError as e:  # a syntax error: say where, as one error line, not a parser traceback
        raise SpecError(f"sweep spec {p} is not valid YAML: {' '.join(str(e).split())}") from None
    except SpecError as e:  # a key given twice
        raise SpecError(f"sweep spec {p}: {e}") from None
    return parse_spec(data)


_FLOAT_RE = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+
    |[-+]?(?:[0-9][0-9_]*)?\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
"""YAML float: a dot or an exponent (the exponent's sign optional, unlike YAML 1.1), or .inf / .nan."""


def _key_number(key):
    """A mapping key as the spec reads it: a number, or a string that spells one (``'16'``, ``'1e9'``; pydantic
    takes both for a numeric key), as its float value (:func:`_as_number`); any other key as it is."""
    num = _as_number(key.strip()) if isinstance(key, str) else _as_number(key)
    return key if num is None else num


def spec_loader() -> type:
    """The YAML loader of every spec: ``yaml.SafeLoader`` that also reads scientific notation without a dot or
    an exponent sign (``1e-2``, ``2e6``, ``4.64e17``) as a number, as YAML 1.2 and Python do (PyYAML follows
    YAML 1.1 and would return the string ``'1e-2'``). Integers stay integers; an integral float such as ``2e3``
    is accepted wherever the spec means an integer (pydantic takes 2000.0 for ``int``). YAML 1.1's base-60 and
    leading-zero octal integers (``1:30`` as 90, ``010`` as 8) are not read as numbers (:data:`_INT_RE`), and a
    ``!!binary`` value raises :class:`SpecError` (its bytes are no spec value).

    A key given twice in one mapping, at any depth (``lr:`` twice, ``1e9`` and ``1.0e9`` in ``budgets``, ``16`` and
    ``'16'`` in ``tokens``), raises
    :class:`SpecError` naming the key and both lines: PyYAML keeps the last one without a word. Keys that a merge
    (``<<: *anchor``) brings in may be overridden, as YAML intends."""
    import yaml

    class SpecLoader(yaml.SafeLoader):
        def construct_document(self, node):
            self._refuse_repeated_keys(node, "", set())
            return super().construct_document(node)

        def _refuse_repeated_keys(self, node, where: str, done: set) -> None:
            if id(node) in done:  # an alias of a node already checked
                return
            done.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                for i, item in enumerate(node.value):
                    self._refuse_repeated_keys(item, f"{where}.{i}" if where else str(i), done)
            if not isinstance(node, yaml.MappingNode):
                return
            first: dict[Any, yaml.Node] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # keys a merge brings in may be overridden
                    continue
                key = _key_number(self.construct_object(key_node, deep=True))  # 16 and '16' are one size
                try:
                    other = first.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the constructor says so
                    continue
                name = f"{where}.{key_node.value}" if where else str(key_node.value)
                if other is not key_node:
                    same = "" if other.value == key_node.value else f" (as {other.value!r} and {key_node.value!r})"
                    a, b = other.start_mark.line + 1, key_node.start_mark.line + 1
                    raise SpecError(
                        f"key {name!r} is given twice{same}, "
                        + (f"both on line {a}" if a == b else f"on lines {a} and {b}")
                        + "; YAML would keep only the last without a word: keep one"
                    )
                self._refuse_repeated_keys(value_node, name, done)

        def construct_yaml_binary(self, node):  # bytes: a name became their decoded text, a number a TypeError
            raise SpecError(f"line {node.start_mark.line + 1}: a !!binary value is not a spec value (a spec holds "
                            "text, numbers, lists and mappings): write it as plain text")  # fmt: skip

    SpecLoader.add_constructor("tag:yaml.org,2002:binary", SpecLoader.construct_yaml_binary)
    SpecLoader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:float", "tag:yaml.org,2002:int")]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    # ints first (they keep priority over floats), without YAML 1.1's base-60 (data_seed: 1:30 read as 90) and
    # leading-zero octal (010 read as 8)
    SpecLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_RE, list("-+0123456789"))
    SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))
    return SpecLoader


_INT_RE = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0x[0-9a-fA-F_]+|[-+]?(?:0|[1-9][0-9_]*))$")
"""YAML int as a spec reads it: decimal (``_`` allowed as in Python), ``0b`` binary or ``0x`` hex; a base-60 value
(``1:30``) or a number with a leading zero stays text, refused where a number is meant rather than read as 90 or
as octal."""


def spec_to_yaml(spec: SweepSpec) -> str:
    """YAML text of ``spec`` (only fields that differ from the defaults), loadable by :func:`load_spec`."""
    import yaml

    data = spec.model_dump(mode="python", exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False)


FOLDER_SPEC = "spec.yaml"
"""The spec of an output folder, written by ``loopscale run``, ``sweep`` and ``tune-lr`` (:func:`record_folder_spec`)."""


HIGH_LR = 1.0
"""An LR above this is said before any run trains (:func:`high_lr_warning`). Measured with ``loopscale train``
(d_model 32, batch 1,024 tokens, 128 steps on the embedded corpus): final validation loss at LR 0.1 / 1 / 3 was
AdamW 2.84 / 4.38 / did not learn (10: diverged), Muon 2.40 / 4.56 / diverged, MuonH 2.32 / did not learn /
diverged; an LR is a base that the embedding and norm groups multiply, so no bound is refused."""


_HIGH_LR_MEASURED = ("runs of this model ended at 4.4-4.9 nats/token at LR 1 against 2.3-2.8 at LR 0.1, and diverged "
                     "or did not learn at LR 3 and 10 (d_model 32, 128 steps; AdamW, Muon, MuonH)")
"""The measurement of :data:`HIGH_LR`'s note, as both LR warnings say it."""


def plain_layers(cells: list[Cell]):
    """``cell -> unique layers | None``: the layer count of an r = 1 cell at a size whose r = 1 cells have several
    depths (a ladder's plain models beside the grid's r = 1 model, which share size and r), else None; warnings
    name such cells with it, as ``size 16 r=1 (3 layers)``."""
    depths: dict[int, set[int]] = {}
    for c in cells:
        if c.r == 1:
            depths.setdefault(c.size, set()).add(c.run.model.effective_depth)
    return lambda c: c.run.model.effective_depth if c.r == 1 and len(depths.get(c.size, ())) > 1 else None


def high_lr_warning(cells: list[Cell]) -> str | None:
    """A warning for the cells whose LR (the base LR: ``lr.fixed``, an ``lr.table`` entry, or the tuned one) is above
    :data:`HIGH_LR`, naming how many, the highest and up to three cells, or None when there are none. Such runs
    end diverged or did_not_learn, which the fit leaves out, so a typo in an LR (``3e1`` for ``3e-1``) costs a
    whole grid; the warning is given before the grid trains (``run``, ``sweep``, and a dry run's plan)."""
    high = [c for c in cells if c.lr > HIGH_LR]
    if not high:
        return None
    top = max(c.lr for c in high)

    layers_of = plain_layers(cells)

    def label(c: Cell) -> str:  # a cell's coordinates but its seed (seeds of one cell share its LR)
        v = "" if c.variant == "baseline" else f" {c.variant}"
        layers = f" ({n} layers)" if (n := layers_of(c)) is not None else ""
        at = f"C={c.run.target_flops:.3g}" if c.run.target_flops is not None else f"D={c.run.tokens}"
        return f"size {c.size} r={c.r}{v}{layers} {at}: {c.lr:g}"

    labels = list(dict.fromkeys(label(c) for c in sorted(high, key=lambda c: -c.lr)))
    named = ", ".join(labels[:3])
    return (f"{len(high)} of {len(cells)} runs train at an LR above {HIGH_LR:g} (highest {top:g}; {named}"
            + (", ..." if len(labels) > 3 else "") + f"): {_HIGH_LR_MEASURED}; such runs are recorded diverged or "
            "did_not_learn and left out of the fit. Check the LR (lr: {fixed: ...}, lr.table, or tune's "
            "lr_min/lr_max)")  # fmt: skip


def high_tune_range_warning(spec: SweepSpec) -> str | None:
    """With ``lr: tune``: a warning when every LR the studies can try is above :data:`HIGH_LR` (``tune.lr_min``, or
    the least of ``tune.lr_values``), else None. Such trials diverge or do not learn (the measurement in
    :data:`HIGH_LR`'s note), and ``tune-lr`` then ends with no LR chosen after training every trial."""
    if spec.lr != "tune":
        return None
    t = spec.tune
    low, key = (min(t.lr_values), "tune.lr_values") if t.lr_values else (t.lr_min, "tune.lr_min")
    if low <= HIGH_LR:
        return None
    return (f"every LR trial trains at an LR above {HIGH_LR:g} ({key} starts at {low:g}): {_HIGH_LR_MEASURED}, so "
            "tune-lr is likely to end with no LR chosen. Check "
            f"tune's LR range (the default is [{type(t).model_fields['lr_min'].default:g}, "
            f"{type(t).model_fields['lr_max'].default:g}])")  # fmt: skip


def check_out_outside_corpus(out: str | Path, spec: SweepSpec) -> None:
    """Refuse an output folder whose files the runs would read as corpus: a directory corpus or a folder below it,
    or a folder below the folder a corpus glob searches (:func:`loopscale.model.data.glob_root`) when a file
    written there could match the glob (``proj/**/*.md`` or ``proj/*/*`` with ``--out proj/out``, ``proj/*`` with
    ``--out proj``; not ``proj/*.md`` with ``--out proj/out``, whose files are one folder deeper than it reaches;
    any file name counts, since Tune and the report write files of many names). What the commands write there
    (runs.parquet and its parts, spec.yaml, logs, report.md) would be read by the runs that start after them, which
    then fail (a directory of text and Parquet files mixes kinds) or train on other text, and would change the
    corpus's content hash, so every later command in the folder would refuse it.

    Raises:
        ValueError: ``out`` is ``spec.corpus``, a directory, or a folder below it, or lies where the corpus glob
            could read its files; nothing is written.
    """
    from loopscale.model.data import glob_root, is_corpus_glob

    if spec.corpus == "embedded":
        return
    out_abs = Path(out).resolve()
    if is_corpus_glob(spec.corpus):
        root = glob_root(spec.corpus)
        root_abs = root.resolve()
        if not (out_abs == root_abs or root_abs in out_abs.parents):
            return
        pattern = Path(os.path.expanduser(spec.corpus)).parts[len(root.parts) :]
        if _glob_reaches_below(list(pattern), list(out_abs.relative_to(root_abs).parts)):
            raise ValueError(
                f"--out {out} lies in {str(root)!r}, which the corpus glob {spec.corpus!r} searches, and files "
                "written there (runs.parquet, spec.yaml, logs, report.md, ...) could match it: the runs that start "
                "after them would read them as corpus, and they would change the corpus's content hash, so every "
                f"later command in the folder would refuse it; give an --out folder outside {str(root)!r}, or a glob "
                "that cannot match files below it"
            )
        return
    corpus = Path(spec.corpus).expanduser()
    if not corpus.is_dir():
        return
    root = corpus.resolve()
    if out_abs == root or root in out_abs.parents:
        raise ValueError(
            f"--out {out} is inside the corpus directory {spec.corpus!r}: the files written there (runs.parquet, "
            "report.md, ...) would be read as corpus by the runs that start after them; give an --out folder "
            "outside it"
        )


def _glob_reaches_below(pattern: list[str], folder: list[str]) -> bool:
    """Whether the glob components ``pattern`` (relative to the folder a glob searches) can match a file below
    ``folder`` (its path relative to that folder, as components), the file's own name and any subfolders between
    being any names: ``**`` matches zero or more folders, another component one name (as :mod:`glob` does with
    ``recursive=True``: a name starting with ``.`` only by a component that starts with ``.``)."""
    import fnmatch

    def matches(component: str, name: str) -> bool:
        return fnmatch.fnmatchcase(name, component) and (not name.startswith(".") or component.startswith("."))

    if not folder:  # the rest of the pattern matches some path of one or more components, of names chosen to fit
        return bool(pattern)
    if not pattern:
        return False
    if pattern[0] == "**":
        return _glob_reaches_below(pattern[1:], folder) or (
            not folder[0].startswith(".") and _glob_reaches_below(pattern, folder[1:])
        )
    return matches(pattern[0], folder[0]) and _glob_reaches_below(pattern[1:], folder[1:])


def check_folder_spec(out: str | Path, spec: SweepSpec, *, corpus: bool = True, any_seeds: bool = False) -> bool:
    """Refuse to add results of ``spec`` to a folder whose ``spec.yaml`` is another spec: runs.parquet would mix two
    grids, or a sweep would train with an LR table tuned for another spec. Where Tune state lives
    (``storage_path``) may differ. A missing or torn ``spec.yaml`` (empty, cut short, not a spec this loopscale
    reads: :func:`_folder_spec_text`) passes when the folder's run records are all of cells of ``spec``
    (:func:`check_folder_runs`). The folder's corpus is checked too
    (:func:`check_folder_corpus`: its runs, checkpoints and LR table are of the text now at ``spec.corpus``), unless
    ``corpus`` is False (a fit-only rerun whose corpus is absent: nothing reads it).

    A folder that holds only a ``loopscale design --out`` prediction (:func:`design_reseeded`) takes a spec that
    differs from its ``spec.yaml`` in ``seeds`` alone, when the design simulated those seeds per r (one of its
    candidates), or with ``any_seeds`` (``loopscale design --out`` itself, which predicts anew).

    Returns:
        True when the folder takes ``spec`` so, as the design's spec with other seeds; False otherwise.
    Raises:
        DesignSeedsNotPredicted: such a folder, and seeds per r the design did not simulate.
        ValueError: ``out/spec.yaml`` differs from ``spec``, its runs are not all cells of ``spec`` (without a
            ``spec.yaml``; with this spec's, runs an older loopscale defined otherwise), or the corpus changed since;
            nothing is changed.
    """
    check_out_outside_corpus(out, spec)
    spec_file = Path(out) / FOLDER_SPEC
    old = _folder_spec_text(spec_file)
    other = bool(old) and old != spec_to_yaml(spec.model_copy(update={"storage_path": None})) and not _same_spec(old, spec)
    reseeded = other and design_reseeded(out, spec, any_seeds=any_seeds)
    if other and not reseeded:
        diff = _spec_differences(old, spec)
        raise ValueError(
            f"{Path(out).resolve()} holds a run of a different spec ({spec_file}"
            + (f"; it differs in {diff}" if diff else "")
            + "); use another --out directory (nothing there was changed)"
        )
    # without a spec.yaml (deleted, torn by a crash, or an older sweep's folder) the run records tell the grid; with
    # this spec's, records that are no cells of it were defined by another loopscale (its run ids differ)
    check_folder_runs(out, spec, same_spec=bool(old))
    if corpus:
        check_folder_corpus(out, spec)
    return reseeded


def _folder_spec_text(spec_file: Path) -> str:
    """The text of a folder's ``spec.yaml`` when it is a spec this loopscale reads; '' when it is missing or torn:
    empty, cut short (not valid YAML) or not a spec (a partial copy, a hand edit), so the folder's run records tell
    its grid (:func:`check_folder_runs`), as for a missing one."""
    try:
        text = spec_file.read_text(encoding="utf-8") if spec_file.is_file() else ""
    except (OSError, UnicodeDecodeError):
        return ""
    return text if text.strip() and _read_folder_spec(text) is not None else ""


def check_folder_runs(out: str | Path, spec: SweepSpec, *, same_spec: bool = False) -> None:
    """Refuse a folder whose run records (``runs.parquet`` and its parts; any status) include runs that are not
    cells of ``spec``: ``run`` would fit them with the spec's as one grid, and ``status`` would count fewer planned
    than the report fitted. For ``lr: tune`` the cells are those of the folder's LR table; without a readable one
    the runs' LRs are not known and the folder passes. ``same_spec``: the folder's ``spec.yaml`` is ``spec``, so
    such runs were recorded by a loopscale that defined runs otherwise (their run ids differ from today's): a
    sweep would train every cell again beside them and the fit would count both (:class:`RunsDefinedOtherwise`).

    Raises:
        RunsDefinedOtherwise: with ``same_spec``, naming how many runs are not cells of ``spec``, a few of them, why
            and the command that refits them.
        ValueError: without ``same_spec``, naming how many runs are not cells of ``spec`` and a few of them; or
            an LR table without a (size, r) of ``spec``. Nothing is changed.
    """
    from loopscale.sweep.lr_table import lr_table_present, read_lr_table
    from loopscale.sweep.store import ResultsStore

    out = Path(out)
    if not ((out / "runs.parquet").exists() or (out / "parts").is_dir()):
        return
    recorded = ResultsStore(out).recorded()
    if not recorded:
        return
    lr_table = None
    if spec.lr == "tune":
        try:
            if not lr_table_present(out / "lr_table.parquet"):
                return
            lr_table = read_lr_table(out / "lr_table.parquet")
        except (OSError, ValueError):  # unreadable, or a study without an LR: the runs' LRs are not known
            return
    try:
        want = {c.run_id for c in spec.cells(lr_table=lr_table)}
    except SpecError as e:  # the folder's LR table lacks a (size, r) of this spec: it was tuned for another grid
        has = "its spec.yaml is this spec, but" if same_spec else "has no readable spec.yaml and"
        raise ValueError(
            f"{out.resolve()} {has} its LR table is not one for this spec ({e}): its runs are of another grid; use "
            "another --out directory (nothing there was changed)"
        ) from None
    foreign = [row for rid, row in sorted(recorded.items()) if rid not in want]
    if foreign and same_spec:
        raise RunsDefinedOtherwise(out, spec, foreign, len(recorded), lr_table)
    if foreign:
        named = ", ".join(_run_named(row) for row in foreign[:3])
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise ValueError(
            f"{out.resolve()} has no readable spec.yaml and {len(foreign)} of its {len(recorded)} recorded runs are not "
            f"cells of this spec ({named}{more}): they are another grid's, and the fit would mix both; use another "
            "--out directory, or the spec they were run with (nothing there was changed)"
        )


def _run_named(row: dict) -> str:
    """A recorded run in a few words: its id, r, size, budget and seed."""
    budget = f"C {row['budget']:g}" if row.get("budget") is not None else f"{row.get('target_tokens')} tokens"
    return f"{row['run_id']} (r {row['r']}, size {row['size']}, {budget}, seed {row['seed']})"


def refit_command(out: Path, looped_variants: list[str]) -> str:
    """The command(s), in backticks, that refit a run folder's recorded runs without training, into a new folder
    beside it (``DIR_refit``): ``loopscale fit DIR --bootstrap 200 --identify --out DIR_refit``, one per variant
    (``--variant V --out DIR_refit_V``) when several variants have looped runs (a single fit is refused there)."""
    out = Path(out).resolve()
    dest = out.parent / f"{out.name}_refit"
    base = f"loopscale fit {shlex.quote(str(out))} --bootstrap 200 --identify"
    if len(looped_variants) > 1:
        return "; ".join(f"`{base} --variant {shlex.quote(v)} --out {shlex.quote(f'{dest}_{v}')}`"
                         for v in looped_variants)  # fmt: skip
    return f"`{base} --out {shlex.quote(str(dest))}`"


class RunsDefinedOtherwise(ValueError):
    """A folder's recorded runs are not cells of its own ``spec.yaml`` (:func:`check_folder_runs` with
    ``same_spec``): they trained at other LRs than the folder's LR table gives now (``lr: tune``, the table tuned
    again), or an older loopscale, whose run definition differed, made their run ids. A sweep there would train
    every cell again beside them, and the fit would count both.

    Attributes:
        refit: the command(s) that refit the recorded runs without training (``loopscale fit``, one per variant
            when several have looped runs), written into a new folder beside this one.
        other_lrs: True when the runs trained at other LRs than the folder's LR table.
    """

    def __init__(self, out: Path, spec: SweepSpec, foreign: list[dict], n_recorded: int, lr_table: dict | None):
        out = Path(out).resolve()
        self.other_lrs = False
        if lr_table is not None:
            for row in foreign:
                try:
                    want = spec.lr_for(int(row["size"]), int(row["r"]), lr_table)
                except (SpecError, KeyError, TypeError, ValueError):
                    continue
                if row.get("lr") is not None and not math.isclose(float(row["lr"]), want, rel_tol=1e-9):
                    self.other_lrs = True
                    break
        looped = sorted({str(r.get("variant")) for r in foreign if (r.get("r") or 1) > 1 and r.get("variant")})
        self.refit = refit_command(out, looped)
        named = ", ".join(_run_named(row) for row in foreign[:3])
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        why = (
            "they trained at other LRs than the folder's lr_table.parquet gives now (was it tuned again?)"
            if self.other_lrs
            else "an older loopscale recorded them, whose run definition differed, so their run ids are not today's"
        )
        super().__init__(
            f"{out}: {len(foreign)} of its {n_recorded} recorded runs are not cells of its spec as this loopscale "
            f"defines runs ({named}{more}): {why}; a sweep here would train every cell again beside them and the "
            f"fit would count both. Refit them without training with {self.refit}, rebuild the folder's report "
            f"(of the fit it holds) with `loopscale report {shlex.quote(str(out))}`, or train the spec into another --out directory"
        )


FOLDER_CORPUS = "corpus.json"
"""The content hash of the corpus an output folder's first command read (``corpus_sha256``; written by
:func:`record_folder_spec`, compared by :func:`check_folder_corpus`)."""

_HASH_MEMO: dict[tuple, str] = {}


def corpus_hash_now(spec: SweepSpec) -> str:
    """The content hash of the corpus now at ``spec.corpus`` (:func:`loopscale.model.data.resolve_corpus`: it reads
    every file once, as each trial does; the embedded corpus's is memoised on disk), memoised in this process while
    the files' paths, sizes and modification times stay the same (one command hashes the corpus once).

    Raises:
        CorpusError / FileNotFoundError: as :func:`loopscale.model.data.resolve_corpus`.
    """
    from loopscale.model.data import _corpus_files, default_cache_dir, resolve_corpus

    key: tuple = (spec.corpus, spec.text_column)
    if spec.corpus != "embedded":
        _, files = _corpus_files(spec.corpus, spec.text_column)
        key += tuple((str(f), st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()])
    if key not in _HASH_MEMO:
        _HASH_MEMO[key] = resolve_corpus(  # the files a directory leaves out are check_data's to say, once
            spec.corpus, spec.text_column, cache_dir=default_cache_dir(), warn=False
        )
    return _HASH_MEMO[key].corpus_hash


def _why_other_content(spec: SweepSpec) -> str:
    """The causes :func:`check_folder_corpus` names for a corpus whose hash differs from a folder's: its files'
    bytes or names (the hash covers both; a file's name decides whether it is validation text), and, for a corpus
    this loopscale splits by position (:meth:`loopscale.model.data.CorpusSource.skewed_split_note`), that rule."""
    why = (
        "its files' names or bytes changed since (the hash covers both: a file's name decides whether it is "
        "validation text)"
    )
    src = next((v for k, v in _HASH_MEMO.items() if k[:2] == (spec.corpus, spec.text_column)), None)
    if src is not None and src.skewed_split_note():
        why += (", or the folder was started by an earlier loopscale that split this corpus by document; this one "
                "splits it by position, because its validation-named files hold too much of its text")  # fmt: skip
    return why


def trained_in_folder(out: str | Path, spec: SweepSpec) -> list[str]:
    """What in the output folder ``out`` was trained on the corpus it was started on, and so holds to that text: its
    finished runs (``ok`` or ``diverged`` records), its LR table, its runs' checkpoints and results (``<storage>/
    checkpoints/``, storage being ``spec.storage_path`` or ``out/tune``, and the storages of the folder's earlier
    commands, :func:`loopscale.sweep.status.earlier_storages`; the LR trials' under ``out/tune_lr/ray``, or the same
    storage) and its LR studies' trials that reported (``tune_lr/optuna.db``). A storage that is not local,
    or an Optuna database that cannot be read, counts as holding some. Empty when nothing trained there (e.g. every
    trial failed before its first checkpoint)."""
    from loopscale.cluster.storage import absolute_uri, is_local_uri, local_path
    from loopscale.sweep.store import ResultsStore

    out = Path(out)
    found: list[str] = []
    if (out / "runs.parquet").exists() or (out / "parts").is_dir():
        if n := len(ResultsStore(out).completed_ids()):
            found.append(f"{n} finished run{'s' * (n != 1)}")
    if (out / "lr_table.parquet").exists():
        found.append("an LR table")
    stores = [absolute_uri(spec.storage_path)] if spec.storage_path else [str(out / "tune"), str(out / "tune_lr" / "ray")]
    from loopscale.sweep.status import earlier_storages

    # and where the folder's earlier commands kept theirs (another --storage then)
    stores += [w for w in earlier_storages(out) if w not in stores]
    for uri in stores:
        if not is_local_uri(uri):
            found.append(f"checkpoints that may be in {uri}")
            continue
        ck = local_path(uri) / "checkpoints"
        if ck.is_dir() and any(f.is_file() and not f.name.startswith(".") for f in ck.rglob("*")):
            found.append(f"checkpoints in {ck}")
    db = out / "tune_lr" / "optuna.db"
    if db.is_file():
        import sqlite3

        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
                n = con.execute(
                    "SELECT COUNT(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED') OR trial_id IN "
                    "(SELECT trial_id FROM trial_intermediate_values)"
                ).fetchone()[0]
        except sqlite3.Error:
            n = -1
        if n:
            found.append("LR trials in tune_lr/optuna.db" if n > 0 else "an unreadable tune_lr/optuna.db")
    return found


def check_folder_corpus(out: str | Path, spec: SweepSpec) -> None:
    """Refuse to work in a folder whose runs read other corpus content than the corpus now at ``spec.corpus``: the
    same path with files changed in place (regenerated shards, an edited text, a file moved between subfolders)
    would put runs on two texts, with two validation sets, into one grid, keep results of the old text as if they
    were of the new, resume checkpoints of the old text (every such trial then fails) or reuse an LR table tuned on
    it. Compared with the hash now (:func:`corpus_hash_now`): the finished records' ``corpus_sha256``
    (runs.parquet) and the hash the folder's first command recorded (``corpus.json``). A folder with neither (new,
    or written before they existed) passes, as does one whose ``corpus.json`` names other content while nothing
    there was trained on it (:func:`trained_in_folder`: every trial failed before a checkpoint; it takes the new
    corpus, :func:`record_folder_corpus`). The hash is of the files' names and bytes: a renamed file, or a Parquet
    shard rewritten with the same rows but another compression, counts as changed; a newer modification time alone
    does not.

    Raises:
        ValueError: the corpus changed since; nothing is changed.
    """
    from loopscale.cluster.storage import read_json_or_aside
    from loopscale.sweep.store import ResultsStore

    out = Path(out)
    hashes = {}
    if (out / "runs.parquet").exists() or (out / "parts").is_dir():
        hashes = ResultsStore(out).corpus_hashes()
    first = read_json_or_aside(str(out / FOLDER_CORPUS)) if (out / FOLDER_CORPUS).is_file() else None
    first_hash = (first or {}).get("corpus_sha256")
    if not hashes and not first_hash:
        return
    now = corpus_hash_now(spec)
    other = {h: n for h, n in hashes.items() if h != now}
    if other:
        n, total = sum(other.values()), sum(hashes.values())
        raise ValueError(
            f"{n} of the {total} finished runs in {out.resolve()} read other content at the corpus path "
            f"{spec.corpus!r} (content hash {', '.join(h[:12] for h in other)} in runs.parquet, {now[:12]} now): "
            f"{_why_other_content(spec)}, and new runs would be trained and evaluated on other text than the finished "
            "ones; restore the corpus, or use another --out folder for the new text (nothing there was changed)"
        )
    if first_hash and first_hash != now and (trained := trained_in_folder(out, spec)):
        raise ValueError(
            f"the corpus at {spec.corpus!r} is not the one {out.resolve()} was started on (content hash "
            f"{first_hash[:12]} in {FOLDER_CORPUS}, recorded {first.get('recorded_at', '?')}; {now[:12]} now): "
            f"{_why_other_content(spec)}, and this folder holds what was trained on the old text ({'; '.join(trained)}); "
            "restore the corpus, or use another --out folder for the new text (nothing there was changed)"
        )


def record_folder_corpus(out: str | Path, spec: SweepSpec) -> None:
    """Write ``out/corpus.json`` (the corpus path and its content hash now, :func:`corpus_hash_now`) when the folder
    has none: the first command in a folder records what later ones compare with (:func:`check_folder_corpus`). One
    that names other content, in a folder where nothing was trained on it (:func:`trained_in_folder`), is rewritten
    with the content now, saying so (a ``UserWarning``)."""
    import datetime as _dt
    import warnings

    from loopscale.cluster.storage import read_json_or_aside, write_text_atomic

    path = Path(out) / FOLDER_CORPUS
    if path.is_file() and path.stat().st_size > 0:
        old = (read_json_or_aside(str(path)) or {}).get("corpus_sha256")
        now = corpus_hash_now(spec)
        if path.is_file() and (not old or old == now or trained_in_folder(out, spec)):
            return  # kept (one moved aside as unreadable is written again below)
        if old and old != now:
            warnings.warn(
                f"the corpus at {spec.corpus!r} changed since {Path(out).resolve()} was started (content hash "
                f"{old[:12]}, {now[:12]} now); nothing there was trained on the old text, so the folder takes the new "
                f"one ({FOLDER_CORPUS} updated)",
                UserWarning,
                stacklevel=2,
            )
    doc = {
        "corpus": spec.corpus,
        "text_column": spec.text_column,
        "corpus_sha256": corpus_hash_now(spec),
        "recorded_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    write_text_atomic(str(path), json.dumps(doc, indent=1))


def _as_plain(value: Any) -> Any:
    """``value`` with every pydantic model in it (at any depth of lists and mappings) as its ``model_dump()``."""
    if isinstance(value, BaseModel):
        out = value.model_dump(warnings=False)  # its bad values are the parse's to name
        # a key pydantic's model_copy(update=...) took without a check (a misspelt ``num_sample``) is in the
        # model's __dict__ but not in its dump: kept, so that the strict parse names it rather than drop it
        out.update({k: v for k, v in vars(value).items() if k not in type(value).model_fields
                    and not isinstance(getattr(type(value), k, None), functools.cached_property)})  # fmt: skip
        return out
    if isinstance(value, list | tuple):
        return [_as_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_plain(v) for k, v in value.items()}
    return value


def folder_spec(out: str | Path) -> SweepSpec | None:
    """The spec recorded in the output folder ``out`` (its ``spec.yaml``, read as this version reads a spec); None
    when there is none or it is torn or not a spec (:func:`_folder_spec_text`)."""
    return _read_folder_spec(_folder_spec_text(Path(out) / FOLDER_SPEC) or "")


def _read_folder_spec(old_yaml: str) -> SweepSpec | None:
    """The spec of ``old_yaml`` (a folder's ``spec.yaml``) as this version reads a spec; None when it cannot be read
    (an older or hand-edited file)."""
    import yaml

    try:
        return parse_spec(yaml.load(old_yaml, Loader=spec_loader()))
    except Exception:
        return None


DESIGN_PREDICTION = "design_prediction.json"
"""What ``loopscale design --out OUT`` writes in ``OUT`` beside the spec (the report of ``OUT`` reads it)."""


class DesignSeedsNotPredicted(ValueError):
    """A folder holding only a ``loopscale design`` prediction was given the same spec with seeds per r the design
    did not simulate (:func:`design_reseeded`)."""


def seeds_per_r(spec: SweepSpec) -> dict[str, int]:
    """The number of seeds of each ``r`` of ``spec``, keyed by ``str(r)``: how ``loopscale design`` names its
    candidates (``seeds_per_r``), whose predictions depend on the counts alone."""
    return {str(r): len(spec.seeds_for(r)) for r in spec.r}


def design_only_folder(out: str | Path) -> bool:
    """True when ``out`` holds a ``loopscale design --out`` prediction and nothing else but what that command
    writes: ``spec.yaml`` (and a copy of a hand-written one, ``spec.yaml.given-*``), ``corpus.json`` and earlier
    predictions (``earlier_design_*/``), and ``logs/`` (a command's console log, written before it records its
    spec) without ``logs/command.json`` (which a ``run``, ``sweep`` or ``tune-lr`` writes once it has recorded its
    spec: it worked there). Any other file or folder (a run's records or ``run_meta.json``, its LR table, Tune's
    folders, a fit or report) makes it False."""
    out = Path(out)
    if not (out / DESIGN_PREDICTION).is_file() or (out / "logs" / "command.json").exists():
        return False
    own = {FOLDER_SPEC, FOLDER_CORPUS, DESIGN_PREDICTION}
    return all(
        p.name in own or p.name.startswith(f"{FOLDER_SPEC}.given-")
        or (p.is_dir() and (p.name == "logs" or p.name.startswith("earlier_design_")))
        for p in out.iterdir()
    )


def design_reseeded(out: str | Path, spec: SweepSpec, *, any_seeds: bool = False) -> bool:
    """Whether ``out`` holds only a ``loopscale design --out`` prediction (:func:`design_only_folder`) of a spec that
    differs from ``spec`` in ``seeds`` alone (``storage_path`` aside): nothing was trained there, and the design
    compared seed counts of this very grid, so the folder may take ``spec`` (the design's recommendation, say). Its
    seeds per r must be among the design's simulated candidates (:func:`seeds_per_r`), unless ``any_seeds``.

    Raises:
        DesignSeedsNotPredicted: such a folder, and seeds per r that no simulated candidate has (the report would
            have no prediction to set beside the run's intervals).
    """
    if not design_only_folder(out):
        return False
    old = folder_spec(out)
    if old is None:
        return False
    blank = {"storage_path": None, "seeds": [0]}
    if canonical_spec(old.model_copy(update=blank)) != canonical_spec(spec.model_copy(update=blank)):
        return False
    if any_seeds:
        return True
    try:
        pred = json.loads((Path(out) / DESIGN_PREDICTION).read_text(encoding="utf-8"))
        cands = [c for c in pred.get("candidates") or [] if not c.get("refused")]
    except (OSError, ValueError, AttributeError) as e:  # torn or not a prediction: which seeds it holds is unknown
        raise DesignSeedsNotPredicted(
            f"{Path(out).resolve()} holds a `loopscale design` prediction of this spec with other seeds, and its "
            f"{DESIGN_PREDICTION} cannot be read ({type(e).__name__}: {e}), so whether the design simulated these "
            "seeds is not known: run `loopscale design` again with this spec and --out there, or use another --out "
            "directory (nothing there was changed)"
        ) from None
    mine = seeds_per_r(spec)
    if any(c.get("seeds_per_r") == mine for c in cands):
        return True
    labels = ", ".join(str(c.get("seeds")) for c in cands) or "none"
    raise DesignSeedsNotPredicted(
        f"{Path(out).resolve()} holds only a `loopscale design` prediction of this spec with other seeds "
        f"({_short_value(old.seeds)} -> {_short_value(spec.seeds)}), and the design did not simulate these seeds per r "
        f"({', '.join(f'r {r}: {k}' for r, k in mine.items())}; its candidates: {labels}): run `loopscale design` "
        "again with this spec and --out there, or use another --out directory (nothing there was changed)"
    )


MODEL_PRESET_KEYS = ("effective_depth", "n_prelude", "n_coda", "seq_len", "head_dim")
"""The ``model:`` keys whose ``None`` means the preset's value (:func:`canonical_spec`)."""


def canonical_spec(spec: SweepSpec) -> dict[str, Any]:
    """``spec`` as a JSON-like dict (``storage_path`` left out) in which two specs that define the same runs and
    stages but are written otherwise are equal: a ``model:`` key left out (None) is the preset's value it stands
    for (``effective_depth: 10`` written out on the cpu preset), ``vocab_size`` left out is the preset's raised to
    the tokenizer's; ``tokens`` given per size with one list for every size is that list; ``seeds`` given per r
    with one list for every r is that list; an ``lr.table`` entry per r with one LR for every r of the grid is that
    LR (the table as :meth:`SweepSpec.lr_for` reads it for every size and r of the grid: ``16``, ``"16"`` and ``16.0``
    are one size). Mapping keys are strings (YAML's ``16:`` and ``"16":`` are one size). ``name`` is compared as written (the
    Tune experiments are named by it). Used to compare a folder's ``spec.yaml`` with the spec a command is given
    (:func:`check_folder_spec`)."""
    from loopscale.model.config import PRESETS

    d = spec.model_dump(mode="json")
    d.pop("storage_path", None)
    base = PRESETS[spec.model.preset]
    for k in MODEL_PRESET_KEYS:
        if d["model"].get(k) is None:
            d["model"][k] = base[k]
    if d["model"].get("vocab_size") is None:
        d["model"]["vocab_size"] = spec.default_vocab_size()

    def one_value(m: Any, keys: list[str]) -> Any:
        """A mapping over exactly ``keys`` whose values are all equal -> that value; else the mapping (str keys)."""
        if not isinstance(m, dict):
            return m
        m = {str(k): v for k, v in m.items()}
        vals = [m[k] for k in keys if k in m]
        return vals[0] if sorted(m) == sorted(keys) and vals and all(v == vals[0] for v in vals) else m

    sizes = [str(x) for x in spec.all_sizes()]
    rs = [str(x) for x in spec.r]
    d["tokens"] = one_value(d.get("tokens"), sizes)
    d["seeds"] = one_value(d.get("seeds"), rs)
    if isinstance(spec.lr, dict) and "table" in spec.lr:  # the LR each (size, r) trains at, as the cells read it
        d["lr"] = {**d["lr"], "table": {str(size): one_value({str(r): spec.lr_for(size, r) for r in spec.r}, rs)
                                        for size in spec.all_sizes()}}  # fmt: skip
    return d


def _same_spec(old_yaml: str, spec: SweepSpec) -> bool:
    """Whether the spec of ``old_yaml`` (a folder's ``spec.yaml``), read as this version reads a spec, is ``spec``
    (``storage_path`` aside) although its text differs: e.g. a relative corpus path, written before the spec made it
    absolute against the working directory, read from that same directory, ``r`` and ``sizes`` listed in another
    order (both are sorted when read: the same grid), or a value written out that the other leaves to its default
    or writes per size or per r (:func:`canonical_spec`). False when it cannot be read."""
    old = _read_folder_spec(old_yaml)
    return old is not None and canonical_spec(old) == canonical_spec(spec)


def _short_value(v: Any, most: int = 6) -> str:
    """``repr(v)`` with every list of more than ``most`` items shown as its first three, ``...``, its last and its
    length (a spec's seeds can be hundreds of numbers)."""

    def short(x: Any) -> str:
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k!r}: {short(y)}" for k, y in x.items()) + "}"
        if isinstance(x, list):
            if len(x) > most:
                return f"[{', '.join(short(y) for y in x[:3])}, ..., {short(x[-1])}] ({len(x)} values)"
            return "[" + ", ".join(short(y) for y in x) + "]"
        return repr(x)

    return short(v)


def _spec_differences(old_yaml: str, spec: SweepSpec, limit: int = 4) -> str:
    """The keys in which the spec of ``old_yaml`` differs from ``spec``, as ``key: folder's value -> this one``
    (dotted keys, at most ``limit`` named); '' when the old spec cannot be read."""
    parsed = _read_folder_spec(old_yaml)
    if parsed is None:  # an older or hand-edited spec.yaml: the message stays without the detail
        return ""
    old, new = canonical_spec(parsed), canonical_spec(spec)  # what is only written otherwise is no difference
    found: list[str] = []
    for d in (old, new):  # variants by name (hc_lanes is hyperconnect's alone: other variants refuse the key)
        d["variants"] = [v["name"] if v.get("name") != "hyperconnect" else f"hyperconnect (hc_lanes {v.get('hc_lanes')})"
                         for v in d.get("variants") or []]  # fmt: skip
    if old["variants"] != new["variants"] and sorted(old["variants"]) == sorted(new["variants"]):
        found.append(f"variants: {old['variants']!r} -> {new['variants']!r} (the same variants in another order: "
                     "the order is part of the spec; list them in the folder's order)")
        old["variants"] = new["variants"]

    def walk(a, b, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in list(a) + [k for k in b if k not in a]:
                if k != "storage_path":
                    walk(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        elif a != b:
            was, now = _short_value(a), _short_value(b)
            if was == now and isinstance(a, list) and isinstance(b, list):  # they differ where the short form cuts
                i = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
                found.append(f"{path}[{i}]: {a[i]!r} -> {b[i]!r} (of lists of {len(a)} values)")
            else:
                found.append(f"{path}: {was} -> {now}")

    walk(old, new, "")
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    return "; ".join(found[:limit]) + more


def set_aside_torn_spec(out: str | Path) -> None:
    """Move a torn ``out/spec.yaml`` (empty, cut short, not a spec: :func:`_folder_spec_text`) aside to
    ``spec.yaml.unreadable-<id>``, with a warning; inside :func:`loopscale.sweep.store.look_only` (a dry run) it is
    only listed. A readable or missing one is left alone."""
    from loopscale.cluster.storage import move_aside

    spec_file = Path(out) / FOLDER_SPEC
    if spec_file.is_file() and not _folder_spec_text(spec_file):
        empty = not spec_file.read_bytes().strip()
        move_aside(str(spec_file), "0 bytes" if empty else "not a spec this loopscale reads: cut short, edited, or another tool's file")


def keep_given_spec_text(spec_file: Path, text: str) -> Path | None:
    """Before ``spec_file`` (a folder's ``spec.yaml``, the same spec: :func:`check_folder_spec` passed) is rewritten
    as ``text`` (the spec as loopscale writes it: paths absolute, defaults left out), copy its own text, when that
    differs, to ``spec.yaml.given-<UTC time>`` beside it, with a warning: a spec a user wrote there (e.g. ``sweep
    OUT/spec.yaml --out OUT``) lost its comments and layout. Returns the copy's path, or None (no file, or the
    same text)."""
    import warnings

    from loopscale.cluster.storage import aside_path, write_text_atomic

    try:
        old = spec_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if old == text:
        return None
    copy = aside_path(spec_file.parent, f"{spec_file.name}.given", sep="-")
    write_text_atomic(str(copy), old)
    warnings.warn(f"{spec_file} is rewritten as loopscale records a spec (paths made absolute, defaults left out); "
                  f"its text as it was, comments included, is kept in {copy}", UserWarning, stacklevel=3)  # fmt: skip
    return copy


def record_folder_spec(out: str | Path, spec: SweepSpec, *, corpus: bool = True, any_seeds: bool = False) -> None:
    """Check (:func:`check_folder_spec`) and write ``out/spec.yaml`` (without ``storage_path``); a torn one (empty,
    cut short, not a spec: :func:`_folder_spec_text`) is moved aside first. ``out`` must exist. The folder's first
    command also records the corpus's content hash (:func:`record_folder_corpus`). ``corpus`` False: the corpus is
    neither compared nor recorded (a fit-only rerun whose corpus is absent). ``any_seeds``: as
    :func:`check_folder_spec` (``loopscale design --out``); a design's spec replaced by the same spec with other
    seeds is said (a ``UserWarning``), and, but for ``any_seeds``, the design's prediction records those seeds per r
    as ``folder_seeds_per_r`` (the candidate the folder's report sets beside its intervals).

    Raises:
        ValueError: ``out`` holds another spec's results; the corpus cannot be read (:func:`corpus_hash_now`:
            ``CorpusError`` is a ``ValueError``), and then nothing is written.
    """
    from loopscale.cluster.storage import write_text_atomic

    spec_file = Path(out) / FOLDER_SPEC
    reseeded = check_folder_spec(out, spec, corpus=corpus, any_seeds=any_seeds)
    if corpus:  # a corpus that cannot be read refuses the command before the folder records this spec (memoised)
        corpus_hash_now(spec)
    set_aside_torn_spec(out)  # rewritten below
    text = spec_to_yaml(spec.model_copy(update={"storage_path": None}))
    if reseeded:
        import warnings

        # the design's own spec: replaced, and said; a copy is kept where its text is not as loopscale wrote it (a
        # user's comments)
        old = folder_spec(out)
        if spec_file.read_text(encoding="utf-8") != spec_to_yaml(old.model_copy(update={"storage_path": None})):
            keep_given_spec_text(spec_file, text)
        warnings.warn(f"{spec_file} held the spec `loopscale design` predicted for, with seeds {_short_value(old.seeds)}; "
                      f"it now holds this spec, with seeds {_short_value(spec.seeds)}", stacklevel=2)  # fmt: skip
    else:
        keep_given_spec_text(spec_file, text)
    write_text_atomic(str(spec_file), text)
    if reseeded and not any_seeds:  # the prediction's candidate of these seeds is the folder's (its report's)
        pred_file = Path(out) / DESIGN_PREDICTION
        pred = json.loads(pred_file.read_text(encoding="utf-8"))
        write_text_atomic(str(pred_file), json.dumps({**pred, "folder_seeds_per_r": seeds_per_r(spec)}, indent=1))
    if corpus:
        record_folder_corpus(out, spec)
