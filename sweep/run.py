"""``loopscale run``: the whole measurement in one command.

Stages, each skipped when its outputs already exist (so a rerun, or ``--resume`` after Ctrl-C, continues where it
stopped and never retrains a finished run):

1. ``tune-lr``: Optuna LR tuning through Ray Tune (only when the spec's ``lr`` is ``tune``) -> ``lr_table.parquet``;
2. ``sweep``: the iso-depth grid on Ray Tune -> ``runs.parquet``, ``curves.parquet``;
3. ``fit``: per-r Chinchilla fits, the joint law with block bootstrap, restricted phi = 0 / 1, IsoFLOP analysis,
   frontier (:func:`loopscale.fit.analysis.analyze`) -> ``fit/``; skipped when ``runs.parquet`` and the fit settings
   are those of the last fit that ended (``run_meta.json``'s ``fit_input``); the fit is written into
   ``fit.partial/``, which takes ``fit/``'s place when it ends (an earlier fit and its report are then moved to
   ``earlier_fit_<UTC time>/``), so a fit stopped part-way leaves the earlier one whole (a ``fit.partial/`` the stage
   did not mark with :data:`FIT_STAGING_MARK` is refused, not removed); while the stage runs, and
   after it was stopped, ``run_meta.json`` also holds ``fit_unfinished`` (its settings), so ``loopscale status``
   says the fit stage is not done and shows ``fit/`` as an earlier fit's; ``fit_command`` is the command whose
   fit ended last (the one ``fit/`` holds, named by the report's "Produced by" line);
4. ``report``: ``report.md`` and PNGs (:func:`loopscale.fit.run_report.build_report`), always rebuilt (cheap).

This module is the one place that chains sweep -> fit -> report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import typer

from loopscale.cluster.options import (
    ClusterOptions,
    NumCpusOpt,
    NumGpusOpt,
    RayTempDirOpt,
    StorageOpt,
    TuneAddressOpt,
)
from loopscale.sweep.commands import PresetOpt, SpecArg, TrackOpt, VerboseOpt
from loopscale.sweep.presets import resolve_spec

FIT_DEFAULTS = {"smoke": (100, 100), "cpu": (200, 500), "paper": (200, 500)}
"""Fit defaults (bootstrap resamples B, multi-starts per fit) by the spec's ``name`` (its content, not the file
name: a copy of configs/smoke.yaml fits like the smoke preset); any other name: the paper's (200, 500)."""

def fit_defaults(spec) -> tuple[int, int]:
    """(B, starts) of ``loopscale run``'s fit stage for ``spec`` when ``--bootstrap`` / ``--starts`` are not given
    (:data:`FIT_DEFAULTS` by ``spec.name``)."""
    return FIT_DEFAULTS.get(spec.name, FIT_DEFAULTS["paper"])


FIT_STAGING = "fit.partial"
"""The folder ``run``'s fit stage writes into; it takes ``fit/``'s place when the fit ends (the earlier ``fit/`` and
report moved to ``earlier_fit_<UTC time>/``), so that a fit stopped part-way leaves the earlier fit whole. A rerun
removes what a stopped fit left there before it fits."""
FIT_STAGING_MARK = ".loopscale-fit-stage"
"""The file the fit stage writes into :data:`FIT_STAGING` before anything else: a ``fit.partial/`` without it is not
the fit stage's (``loopscale run`` refuses to remove it)."""

#: assumed sustained throughput for --dry-run GPU-hour estimates: 40 % MFU of an H100's dense bf16 peak.
GPU_PEAK_FLOPS = 989e12
ASSUMED_MFU = 0.40


def plan(spec, *, data: bool = True) -> dict:
    """What a spec will cost, without running anything: runs, Ray Tune trials of the grid (``trials``;
    ``runs_per_trial``: how many trials train k runs, k > 1 a seed ensemble), training FLOPs, tokens, LR-tuning
    trials and an estimated GPU-hours figure at :data:`ASSUMED_MFU` of an H100 (:data:`GPU_PEAK_FLOPS`, dense bf16).
    The corpus is checked first (``SweepSpec.check_data``: SpecError when it would fail every run);
    ``lr_flops_max`` the LR studies' training FLOPs if every trial ran its full budget (``train_flops_total`` and
    the GPU-hours are the grid's alone) and ``lr_warning`` when that exceeds the grid's (else None);
    ``design_warning`` what the grid lacks for the identification rule (:func:`design_warning`; None when nothing);
    ``lr_value_warning`` the runs whose fixed or table LR is above 1 (:func:`loopscale.sweep.spec.high_lr_warning`),
    or with ``lr: tune`` a tune range wholly above 1 (:func:`loopscale.sweep.spec.high_tune_range_warning`); None
    when neither;
    ``corpus_warning`` gives its warnings every run would give too (e.g. files a directory corpus leaves out, invalid
    UTF-8 replaced, NUL bytes dropped, BPE learning fewer tokens than asked); ``eval_warning``
    says when ``eval_tokens`` is more than the validation split holds and how many tokens the runs evaluate (None
    when it fits or the split is not known without tokenizing a large corpus).

    FLOPs per run are ``C = F * D`` with F the training FLOPs/token of the model accounting (paper Sec. 3.2) and
    D the tokens the trainer will run (for iso-FLOP budgets, D = round(C / (F B)) B). ``lr_trial_tokens`` gives
    the tokens each LR study's trials train at most, ``{"size<s>_r<r>": tokens}``: ``tune.tokens`` (or
    ``tune.tokens_per_param`` x N) in whole steps of ``training.batch_tokens``, rounded up to whole steps per
    milestone (:func:`loopscale.sweep.lr_search.tuning_budget`), so it can exceed what the spec asks;
    ``lr_tokens_rounding`` names the studies whose trials train at least twice what ``tune`` asks that way (and
    ``lr_warning`` then advises fewer milestones), else None.
    ``tokens_rounding`` lists the written token budgets the trainer rounds to whole batches (``300 -> D = 256``;
    None when every one is a whole number of batches). ``steps_warning`` names runs of fewer than
    :data:`MIN_STEPS` optimizer steps and iso-FLOP runs whose whole steps miss their budget by more than 10 %
    (:func:`_steps_warning`; None when there are none). ``lr_rung_warning``: with ``lr: tune``, the LR studies whose
    ASHA compares trials first after very few optimizer steps (:func:`loopscale.sweep.lr_search.early_rung_warning`).
    ``tokens_per_param_warning``: runs that would train on fewer than
    :data:`loopscale.fit.run_report.MIN_TOKENS_PER_PARAM` tokens per unique parameter (D / N_unique), where a looped
    model's worth is still far from its trained value (:func:`loopscale.fit.run_report.short_training`), else None.
    """
    from loopscale.model.accounting import flops_per_token
    from loopscale.model.train import resolve_tokens
    from loopscale.sweep.spec import high_lr_warning, high_tune_range_warning, plain_layers

    # check_data's checks (SpecError) and warnings, not issued; none for a refit without its corpus (data=False)
    corpus_notes, eval_notes = spec._data_notes() if data else ([], [])
    lr_table = None
    if spec.lr == "tune":
        lr_table = {(s, None): 1.0 for s in spec.all_sizes()}
    cells = spec.cells(lr_table=lr_table)
    seq_len = cells[0].run.model.seq_len
    evals = [("training.eval_tokens", cells[0].run.eval_tokens)]
    if spec.lr == "tune" and spec.tune.eval_tokens is not None:
        evals.append(("tune.eval_tokens", spec.tune.eval_tokens))
    for key, ev in evals if data else ():
        if any(n.startswith(f"eval_tokens={ev} ") for n in eval_notes):
            continue  # more than a short validation split holds: its note says what is evaluated
        if ev % seq_len:  # every run rounds it up and says so in its warnings: the plan says it first
            eval_notes = [*eval_notes, f"{key}={ev} is rounded up to {-(-ev // seq_len) * seq_len} in every "
                          f"{'run' if key.startswith('training') else 'LR trial'} (whole windows of seq_len={seq_len})"]  # fmt: skip
    total_c, total_d = 0.0, 0
    by_r: dict[int, int] = {}
    rounded: dict[int, int] = {}  # tokens as written -> D trained, where they differ
    # keys (size, r, variant, budget, unique layers of a ladder spec's r = 1 models, else None: plain_layers)
    few: dict[tuple, int] = {}  # key -> optimizer steps, where fewer than MIN_STEPS
    drift: dict[tuple, float] = {}  # key -> F D / C, where whole steps miss the budget C by > 10 %
    layers_of = plain_layers(cells)
    from loopscale.fit.run_report import short_training
    from loopscale.model.accounting import n_unique

    d_n: list[tuple[int, int]] = []  # (D, N_unique) of every run: the short-training warning
    for c in cells:
        f = flops_per_token(c.run.model)
        d = resolve_tokens(c.run)
        d_n.append((int(d), n_unique(c.run.model)))
        total_c += f * d
        total_d += d
        by_r[c.r] = by_r.get(c.r, 0) + 1
        if c.run.tokens is not None and c.run.tokens != d:
            rounded[int(c.run.tokens)] = int(d)
        budget = c.run.target_flops if c.run.target_flops is not None else c.run.tokens
        key = (c.size, c.r, c.variant, budget, layers_of(c))
        if d // c.run.batch_tokens < MIN_STEPS:
            few[key] = d // c.run.batch_tokens
        if c.run.target_flops is not None and abs(f * d / c.run.target_flops - 1) > 0.1:
            drift[key] = f * d / c.run.target_flops
    n_studies = 0
    lr_trial_tokens: dict[str, int] = {}
    lr_flops = 0.0
    from loopscale.sweep.lr_search import early_rung_warning, trials_per_study

    lr_rounded: dict[str, tuple[float, int]] = {}  # study -> (tokens asked, tokens trained) where rounding doubles them
    if spec.lr == "tune":
        from loopscale.sweep.lr_search import study_keys, tuning_tokens_asked

        keys = study_keys(spec)
        n_studies = len(keys)
        for s, r in keys:
            model = spec.tuning_model(s, r)
            steps, _ = spec.tuning_steps(s, r)
            lr_trial_tokens[f"size{s}_r{r}"] = steps * spec.training.batch_tokens
            asked = tuning_tokens_asked(spec, model, r)
            if steps * spec.training.batch_tokens >= 2 * asked:
                lr_rounded[f"size{s}_r{r}"] = (asked, steps * spec.training.batch_tokens)
            lr_flops += lr_study_flops(spec, s, r)
    gpu_hours = total_c / (GPU_PEAK_FLOPS * ASSUMED_MFU) / 3600.0
    from loopscale.sweep.grid import trial_groups

    sizes = [len(g) for g in trial_groups(cells, spec.ensemble_members())]
    return {
        "spec": spec.name,
        "runs": len(cells),
        "runs_by_r": {str(k): v for k, v in sorted(by_r.items())},
        "trials": len(sizes),
        "runs_per_trial": {str(k): sizes.count(k) for k in sorted(set(sizes), reverse=True)},
        "variants": [v.name for v in spec.variants],
        "train_flops_total": total_c,
        "tokens_total": total_d,
        "lr_studies": n_studies,
        "lr_trials": n_studies * trials_per_study(spec.tune),
        "lr_trial_tokens": lr_trial_tokens,
        "lr_flops_max": lr_flops,
        "lr_warning": lr_cost_warning(lr_flops, total_c, bool(lr_rounded)),
        "lr_tokens_rounding": (
            f"an LR trial trains at least one step of training.batch_tokens = {spec.training.batch_tokens} per "
            f"milestone (tune.num_milestones = {spec.tune.num_milestones}), so "
            + ", ".join(f"{k} trains {got} tokens for the {asked:.4g} asked" for k, (asked, got) in lr_rounded.items())
            + ": lower tune.num_milestones (or training.batch_tokens) to train what tune asks"
            if lr_rounded else None
        ),
        "tokens_rounding": (f"tokens are trained in whole batches of training.batch_tokens = "
                            f"{spec.training.batch_tokens}: " + ", ".join(f"{k} -> D = {v}" for k, v in
                                                                         sorted(rounded.items()))
                            if rounded else None),  # fmt: skip
        "steps_warning": _steps_warning(few, drift, spec.training.batch_tokens),
        "tokens_per_param_warning": short_training(*zip(*d_n, strict=True), "runs would train") if d_n else None,
        "est_gpu_hours_grid": gpu_hours,
        "gpu_hours_assumption": f"{ASSUMED_MFU:.0%} MFU of {GPU_PEAK_FLOPS:.3g} FLOP/s (H100 dense bf16)",
        "corpus_warning": "; ".join(corpus_notes) or None,
        "eval_warning": "; ".join(eval_notes) or None,
        "design_warning": design_warning(spec),
        "lr_value_warning": high_tune_range_warning(spec) if spec.lr == "tune" else high_lr_warning(cells),
        "lr_rung_warning": early_rung_warning(spec),
    }


MIN_STEPS = 5
"""Fewer optimizer steps than this in a run and the plan says so (``steps_warning``): the LR schedule, warmup and
evaluation cadence barely act, and an iso-FLOP budget's whole steps can miss it by a large factor."""


def _steps_warning(few: dict[tuple, int], drift: dict[tuple, float], batch_tokens: int) -> str | None:
    """The plan's ``steps_warning``: runs with fewer than :data:`MIN_STEPS` optimizer steps (fewest first) and
    iso-FLOP runs whose whole steps train F·D more than 10 % off their budget C (furthest first), or None."""

    def name(k: tuple) -> str:
        size, r, variant, budget, layers = k
        v = "" if variant in (None, "baseline") else f" {variant}"
        at = f"C = {budget:.4g}" if isinstance(budget, float) else f"tokens {budget}"
        return f"size {size} r={r}{v}" + (f" ({layers} layers)" if layers is not None else "") + f" at {at}"

    said = []
    if few:
        worst = sorted(few.items(), key=lambda kv: kv[1])[:3]
        said.append(f"{len(few)} run(s) train fewer than {MIN_STEPS} optimizer steps of training.batch_tokens = "
                    f"{batch_tokens} (" + ", ".join(f"{name(k)}: {n} step{'s' * (n != 1)}" for k, n in worst)
                    + (", ..." if len(few) > 3 else "") + "), too few for the LR schedule, warmup and evaluation "
                    "to act as written")  # fmt: skip
    if drift:
        worst = sorted(drift.items(), key=lambda kv: -abs(kv[1] - 1))[:3]
        said.append(f"{len(drift)} iso-FLOP run(s) train whole steps whose FLOPs F·D miss the budget C by more than "
                    "10 % (" + ", ".join(f"{name(k)}: {x:.2f}× C" for k, x in worst)
                    + (", ..." if len(drift) > 3 else "") + "), so runs of one budget do not share its compute")  # fmt: skip
    if not said:
        return None
    iso = any(isinstance(k[3], float) for k in (*few, *drift))  # an iso-FLOP spec: its budgets are the C of budgets:
    return "; ".join(said) + (f"; raise the {'compute budgets (budgets: {C: [sizes]})' if iso else 'token budgets (tokens)'}"
                              " or lower training.batch_tokens")  # fmt: skip


def design_warning(spec) -> str | None:
    """What a grid the joint law can fit still lacks for the identification rule (``loopscale.fit.identify``), or
    None: without r = 1 runs phi cannot be fitted per r (each looped r against the r = 1 runs), so that check and
    the report's per-r phi table are missing and identification rests on the profile and the parameter bounds
    alone; the paper's grid has r = 1 at every size (Sec. 3). Several variants without ``baseline`` get each their
    own phi but no Δφ (the paper's case studies, Table 3, set each variant beside the baseline)."""
    said = []
    if 1 not in spec.r:
        said.append(f"the grid has no r = 1 runs (r = {sorted(spec.r)}): phi cannot be fitted per r against r = 1, so "
                    "the identification rule's per-r check and the report's per-r phi table are left out; add 1 to r "
                    "(the paper's grid has it at every size)")  # fmt: skip
    names = [v.name for v in spec.variants]
    if len(names) > 1 and "baseline" not in names:
        said.append(f"variants {names} leave out baseline: each variant gets its own phi (with the shared r = 1 runs), "
                    "but the report has no Δφ = φ_variant − φ_baseline, which needs the baseline's looped runs; add "
                    "baseline to variants for the comparison")  # fmt: skip
    return "; ".join(said) or None


def design_points(spec, cells=None) -> dict[str, int]:
    """Distinct design points of each variant's fit: its (N_once, N_rec, r, D) points, i.e. the cells without their
    seeds, where the r = 1 runs (listed under ``baseline``) count for every variant with looped runs.

    Returns:
        {variant: number of distinct points}; ``baseline`` alone when the spec has no other variant.
    """
    if cells is None:
        lr_table = {(s, None): 1.0 for s in spec.all_sizes()} if spec.lr == "tune" else None
        cells = spec.cells(lr_table=lr_table)
    points: dict[str, set] = {}
    plain = {(c.r, c.run.model, c.run.tokens, c.run.target_flops) for c in cells if c.r == 1}
    for c in cells:
        if c.r > 1:
            points.setdefault(c.variant, set(plain)).add((c.r, c.run.model, c.run.tokens, c.run.target_flops))
    return {v: len(p) for v, p in points.items()} or {"baseline": len(plain)}


def check_design(spec) -> None:
    """Refuse a grid whose joint fit cannot be made or get a bootstrap interval, before anything is trained:

    * a single r;
    * too few distinct design points (cells without their seeds: size, r, ladder depth, D; :func:`design_points`)
      in some variant's fit. With several D the joint law's 6 parameters (paper Eq. 3) need at least 7. With one
      token budget D for every run (tokens mode; an iso-FLOP budget gives each size its own D) E + B D^-beta is
      one constant (see ``loopscale.fit.identify``), leaving 4 free parameters (it, A, alpha, phi): at least 5
      (fewer than 6 cells are fitted run by run, 6 or more as cell means: ``loopscale.fit.analysis
      .SeedReplicates``). Seeds add runs, not points: 2 cells of 4 seeds are 2 points;
    * a single budget where the fit has no seeds to resample: one iso-FLOP budget C (its runs train several D, so
      the fit is the block bootstrap over (budget, r) cells, paper Sec. 4.3, which can then never vary the
      budget, whatever the seeds), or one token budget D with a single seed in some r's cells (all: no interval;
      some: a cell of one seed never varies, so the interval would leave out its noise). A one-D design with
      seeds at every r is accepted: its fit resamples the seeds within every cell instead.

    Raises:
        ValueError: the message says what to add.
    """
    from loopscale.fit.analysis import JOINT_PARAMS  # 6: E, A, alpha, B, beta, phi

    lr_table = {(s, None): 1.0 for s in spec.all_sizes()} if spec.lr == "tune" else None
    cells = spec.cells(lr_table=lr_table)
    if len(spec.r) < 2:
        raise ValueError(
            f"the spec defines {len(cells)} runs over r = {sorted(spec.r)}; the joint law needs at least two values "
            "of r (e.g. r: [1, 2, 4, 8]); nothing was trained"
        )
    iso_flop = spec.budgets is not None
    if iso_flop:
        key, budgets = "budgets", {c.budget for c in cells}
    else:
        key, budgets = "tokens", {c.run.tokens for c in cells}
    one_D = not iso_flop and len(budgets) == 1
    if one_D:  # E, B and beta fold into one constant
        need, why = JOINT_PARAMS - 1, (f"every run has one D, so E + B D^-beta is one constant, leaving "
                                       f"{JOINT_PARAMS - 2} free parameters (it, A, alpha, phi) that need at least "
                                       f"{JOINT_PARAMS - 1}")  # fmt: skip
    else:
        need, why = JOINT_PARAMS + 1, f"the joint law's {JOINT_PARAMS} parameters need at least {JOINT_PARAMS + 1}"
    points = design_points(spec, cells)
    for variant, n in points.items():
        if n < need:
            which = f" of variant {variant!r} (its looped runs and the r = 1 runs)" if len(points) > 1 else ""
            raise ValueError(
                f"the fit{which} has {n} distinct design point{'s' if n != 1 else ''} (cells without their seeds: "
                f"size, r, ladder depth, D) over r = {sorted(spec.r)}; {why}, and seeds add runs, not points; add "
                f"sizes, values of r, ladder depths (ladder: [...]) or budgets ('{key}') (nothing was trained)"
            )
    if len(budgets) < 2 and (iso_flop or spec.min_seeds() < 2):
        ones = [r for r in spec.r if len(spec.seeds_for(r)) < 2]
        if not iso_flop and len(ones) < len(spec.r):  # seeds in some cells only: those of one seed never vary
            raise ValueError(
                f"every run has the same budget ({key}: {next(iter(budgets)):g}) and the cells at r = "
                f"{', '.join(map(str, ones))} have one seed: the joint fit resamples seeds within cells (its block "
                "bootstrap over (budget, r) cells cannot vary the budget), and a cell of one seed never varies, so "
                f"phi's interval would leave out their noise; give every r 2 seeds or more (e.g. seeds: 4) or add a "
                f"second budget to '{key}' (nothing was trained)"
            )
        instead = ("its runs train several D, so seeds are not resampled in its place" if iso_flop
                   else "there are no seeds to resample instead")  # fmt: skip
        raise ValueError(
            f"every run has the same budget ({key}: {next(iter(budgets)):g}){'' if iso_flop else ' and one seed'}: "
            f"the joint fit's block bootstrap over (budget, r) cells cannot vary the budget, and {instead}, so phi "
            f"would get no interval; add a second budget to '{key}'"
            + ("" if iso_flop else " or seeds (e.g. seeds: 4)") + " (nothing was trained)"
        )


def _grid_cells(spec, out: Path):
    """The grid's cells, with the folder's LR table when the spec tunes the LR; None when that table is not there
    yet (a torn one reads as absent).

    Raises:
        SpecError: the folder's LR table has no entry for a cell (another spec's)."""
    from loopscale.sweep.lr_table import lr_table_present, read_lr_table

    if spec.lr != "tune":
        return spec.cells()
    if not lr_table_present(out / "lr_table.parquet"):
        return None
    return spec.cells(lr_table=read_lr_table(out / "lr_table.parquet"))


def _grid_cells_if_known(spec, out: Path):
    """:func:`_grid_cells`, or None when the folder's LR table cannot give them (another spec's, unreadable): the
    grid is not planned yet."""
    try:
        return _grid_cells(spec, out)
    except Exception:
        return None


def unfinished_grid_note(table, refused: bool = False) -> str | None:
    """``loopscale fit``'s warning for a run or sweep folder given as the table (or its ``runs.parquet``): the runs
    its spec (``spec.yaml``) plans that ``runs.parquet`` does not hold yet (a sweep stopped part-way), counted and
    named; None for a table outside such a folder, a grid whose every run is there, or a table holding none of the
    grid's runs (another grid's, or runs defined by another loopscale). A fit of part of a grid can miss whole cells
    (a width's r = 1 runs), and nothing said so. ``refused``: the words for a fit refused for too few runs (it
    said "add runs" of a grid whose runs were not trained yet), which end with where to train them."""
    folder = Path(table)
    if folder.name == "runs.parquet":  # the folder's table, given by its file or (read_table) by its folder
        folder = folder.parent
    if not (folder.is_dir() and (folder / "spec.yaml").is_file() and (folder / "runs.parquet").is_file()):
        return None
    try:
        import pyarrow.parquet as pq

        from loopscale.sweep.spec import load_spec
        from loopscale.sweep.store import look_only

        with look_only():  # reads only: a torn LR table is not moved aside by a fit
            cells = _grid_cells_if_known(load_spec(folder / "spec.yaml"), folder)  # with its LR table (lr: tune)
        held = set(pq.read_table(folder / "runs.parquet", columns=["run_id"]).column("run_id").to_pylist())
    except Exception:  # a spec or table that does not read: the fit's own reading says what is wrong with it
        return None
    if not cells:
        return None
    missing = [c for c in cells if c.run_id not in held]
    if not missing or len(missing) == len(cells):  # none of its runs: a table of another grid, or of a loopscale
        return None  # whose runs were defined otherwise (its run ids differ), is not this spec's to count

    def name(c) -> str:
        budget = f"D = {c.run.tokens}" if c.budget is None else f"C = {c.budget:g}"
        return f"r = {c.r}, size {c.size}, {budget}, seed {c.seed}" + (f", {c.variant}" if c.variant != "baseline" else "")

    shown = "; ".join(name(c) for c in missing[:3]) + (f"; and {len(missing) - 3} more" if len(missing) > 3 else "")
    status = f"`loopscale status {shlex.quote(str(folder))}`"
    return (
        f"{folder}'s spec plans {len(cells)} runs and runs.parquet holds {len(cells) - len(missing)} of them: "
        f"{len(missing)} not trained yet ({shown}); "
        + (f"train them first: {status} gives the command that does" if refused else
           f"this fit is of the runs there are (a missing cell changes every parameter); {status} says what is left "
           "and the command that trains it")  # fmt: skip
    )


def _grid_done(spec, out: Path) -> bool:
    """True when every cell of the spec already has a finished (ok, diverged or did not learn) record, so no Ray
    is needed; a ``failed`` record does not count (the cell is retried). A torn runs.parquet or LR table reads as
    absent."""
    from loopscale.sweep.store import ResultsStore

    cells = _grid_cells(spec, out)
    return cells is not None and {c.run_id for c in cells} <= ResultsStore(out).completed_ids()


def _design_minutes(spec, out: Path) -> str:
    """``; the design predicted X min ...`` when ``out`` holds a ``loopscale design --out`` prediction with a
    candidate of ``spec``'s seeds per r (the dry run of a design's folder said only "not estimated"), with whether
    it exceeds the design's minutes and the candidate the design recommended when that is another; else ''."""
    from loopscale.sweep.spec import DESIGN_PREDICTION, seeds_per_r

    try:
        pred = json.loads((out / DESIGN_PREDICTION).read_text(encoding="utf-8"))
        mine = seeds_per_r(spec)
        (c,) = [c for c in pred.get("candidates") or [] if c.get("seeds_per_r") == mine and not c.get("refused")]
        said = (f"; the design predicted {float(c['wall_min']):.1f} min of training for these seeds ({c['seeds']}) on "
                f"{int(pred['cpus'])} CPUs, at its pilot's FLOP/s ({DESIGN_PREDICTION})")  # fmt: skip
        if not c.get("fits"):  # a candidate the design found too long for the minutes it was given
            said += f", more than the {float(pred['minutes']):g} min it was given"
        if pred.get("best") not in (None, c["seeds"]):
            said += f"; it recommended {pred['best']}"
        return said
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # none, torn, or no candidate of these seeds
        return ""


def _recorded_note(spec, out: Path, cpus: int | None = None) -> tuple[str | None, dict | str | None, bool]:
    """The dry run's ``recorded``: how many of the grid's runs ``out`` already holds a finished (ok, diverged or did
    not learn) record of, and what is left to train (runs, trials, training FLOPs), as ``run`` would continue; None
    for a folder with no run records and no finished run's result. Runs that finished with no driver there to
    record them (their result.json in a local storage) are counted apart: `run` records them without training. With ``lr: tune`` and no LR table yet,
    the grid's runs are not defined (their LR is part of them): the note says so. Reads only (call inside
    :func:`loopscale.sweep.store.look_only`).

    Returns ``(note, time_left, changes)``: ``time_left`` is :func:`loopscale.sweep.design_cmd.training_time_left`'s
    prediction for the runs left on ``cpus`` CPUs (None: the runs train on a cluster) at the FLOP/s of the
    folder's own ok records, or a sentence saying why there is none (also for a folder where no run has finished);
    None when nothing is left to train; ``changes``, whether ``run`` trains or records runs before it fits (its
    runs table then changes, and the fit with it)."""
    from loopscale.cluster.storage import absolute_uri
    from loopscale.model.accounting import flops_per_token
    from loopscale.model.train import resolve_tokens
    from loopscale.sweep.grid import trial_groups
    from loopscale.sweep.store import ResultsStore
    from loopscale.sweep.workspace import stored_result_ids

    on_cluster = "not estimated: the runs{} train on the cluster, not on this machine's CPUs"
    # no run finished here yet: no rate to take
    nothing_yet = (None, on_cluster.format("") if cpus is None else
                   "not estimated before a run has finished in this folder: the figure takes the FLOP/s of the "
                   "folder's own runs (a dry run or `status` of a stopped run gives it)" + _design_minutes(spec, out),
                   True)  # fmt: skip
    if not out.is_dir():
        return nothing_yet
    store = ResultsStore(out)
    recorded = store.recorded()
    cells = _grid_cells_if_known(spec, out)
    done_ids = store.completed_ids()
    if cells is None:
        if not recorded:
            return nothing_yet
        note = (f"{len(done_ids)} finished run record{'s' * (len(done_ids) != 1)}, but no LR table yet: LR tuning "
                "runs first, then the grid (its runs' LR is part of their definition)")  # fmt: skip
        return note, "not estimated: the grid's runs are defined once the LR table exists", True
    storage = absolute_uri(spec.storage_path) if spec.storage_path else str(out / "tune")
    stored = stored_result_ids(storage, [c.run_id for c in cells if c.run_id not in done_ids])
    if not recorded and not stored:
        return nothing_yet  # no run of the folder finished (its records lost, their results kept count): a new plan
    n_done = sum(c.run_id in done_ids for c in cells)
    left = [c for c in cells if c.run_id not in done_ids and c.run_id not in stored]
    more = f", {len(stored)} more finished and are recorded when `run` continues" if stored else ""
    if not left:
        return (f"{n_done} of {len(cells)} runs recorded{more}; nothing left to train (`run` fits and reports, "
                "unless they are up to date)"), None, bool(stored)
    if cpus is None:
        time_left = on_cluster.format(" left")
    else:
        import pandas as pd

        from loopscale.sweep.design_cmd import training_time_left

        time_left = training_time_left(spec, pd.DataFrame(list(recorded.values())), left, cpus,
                                       cores=os.cpu_count()) or (
            "not estimated: no ok run recorded here with a training time (wall_s) and FLOPs (C) to take a rate from"
        )
    flops_left = sum(flops_per_token(c.run.model) * resolve_tokens(c.run) for c in left)
    flops_all = sum(flops_per_token(c.run.model) * resolve_tokens(c.run) for c in cells)
    n_trials = len(trial_groups(left, spec.ensemble_members()))
    return (f"{n_done} of {len(cells)} runs recorded (ok, diverged or did not learn){more}; {len(left)} left to "
            f"train in {n_trials} trial{'s' * (n_trials != 1)}, {flops_left:.3g} of the grid's {flops_all:.3g} "
            f"training FLOPs ({flops_left / flops_all:.0%})"), time_left, True


def lr_study_flops(spec, size, r: int) -> float:
    """Training FLOPs of one LR study of ``spec`` (size ``size``, loop count ``r``) if each of its trials ran its
    full budget (ASHA stops some early): F (model accounting, paper Sec. 3.2) x the trial's tokens x trials."""
    from loopscale.model.accounting import flops_per_token
    from loopscale.sweep.lr_search import trials_per_study

    steps, _ = spec.tuning_steps(size, r)
    return flops_per_token(spec.tuning_model(size, r)) * steps * spec.training.batch_tokens * trials_per_study(spec.tune)


def lr_cost_warning(lr_flops: float, grid_flops: float, rounded: bool, what: str = "LR tuning") -> str | None:
    """The dry run's ``lr_warning``: ``what`` (the tuning, or the studies an earlier command left) may cost
    ``lr_flops`` FLOPs, more than the grid's ``grid_flops``; says what lowers it (``rounded``: trials train more
    than ``tune`` asks because of whole steps per milestone). None when it costs no more than the grid."""
    if grid_flops <= 0 or lr_flops <= grid_flops:
        return None
    return (f"{what} may cost up to {lr_flops / grid_flops:.3g}x the grid's training FLOPs ({lr_flops:.3g} against "
            f"{grid_flops:.3g}; every trial trained to its full budget, ASHA stops some early): lower "
            + ("tune.num_milestones (or training.batch_tokens), tune.num_samples, or fix lr" if rounded
               else "tune.tokens (or tune.tokens_per_param) or tune.num_samples, or fix lr"))  # fmt: skip


def lr_tuning_progress(spec, out: Path) -> dict | None:
    """How much of the LR tuning of ``spec`` (``lr: tune``) is done in ``out``: ``studies`` (how many), ``done``
    (those with a done marker in ``tune_lr/done/``, which no command tunes again), ``trials`` (finished trials of
    the other studies in the Optuna storage ``tune_lr/optuna.db``; None when it does not read, with ``db_error``
    saying why), ``per_study`` (trials one study runs) and ``rest`` (the (size, r) keys of the studies not done).
    None when the spec fixes the LR. Reads only."""
    from loopscale.sweep.lr_search import (
        done_marker,
        finished_trials,
        study_keys,
        study_name,
        trials_per_study,
    )

    if spec.lr != "tune":
        return None
    keys = study_keys(spec)
    done = [(s, r) for s, r in keys if done_marker(out, s, r).is_file()]
    rest = [k for k in keys if k not in done]
    db = out / "tune_lr" / "optuna.db"
    got = {"studies": len(keys), "done": len(done), "trials": 0, "per_study": trials_per_study(spec.tune),
           "db_error": None, "rest": rest}  # fmt: skip
    if rest and db.is_file():
        try:
            got["trials"] = len(finished_trials(f"sqlite:///{db.resolve()}", [study_name(spec.name, s, r) for s, r in rest]))
        except Exception as e:  # noqa: BLE001  a torn database: said, as `run` would fail on it too
            got["trials"] = None
            got["db_error"] = f"{db} does not read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return got


def _fit_settings_plan(spec, bootstrap: int | None, starts: int | None) -> dict:
    """The dry run's ``fit_bootstrap`` and ``fit_starts`` (B and multi-starts the fit stage will use) and
    ``fit_settings_from`` (where they come from: the options, or the defaults of the spec's name,
    :data:`FIT_DEFAULTS`): a tiny custom spec gets the paper's B = 200 and 500 starts, and its fit can take minutes
    after seconds of training."""
    b_def, s_def = fit_defaults(spec)
    b, st = (b_def if bootstrap is None else bootstrap), (s_def if starts is None else starts)
    if bootstrap is not None and starts is not None:
        src = "--bootstrap and --starts"
    else:
        which = spec.name if spec.name in FIT_DEFAULTS else None
        src = (f"the {which} preset's defaults" if which else
               f"the paper's defaults (B = {b_def}, {s_def} starts), as for every spec not named like a preset")  # fmt: skip
        src += ("" if bootstrap is None and starts is None else
                f", with {'--bootstrap' if bootstrap is not None else '--starts'} given")  # fmt: skip
        src += "; the fit's time grows with B x starts: --bootstrap and --starts lower them"
    return {"fit_bootstrap": b, "fit_starts": st, "fit_settings_from": src}


def fit_input_in_effect(before: dict, runs: Path, digest: str) -> dict:
    """``run_meta.json``'s ``fit_input`` (the runs' sha256 and the settings of the folder's last finished fit) with
    its fit rules read as today's: a change of the fit rules that does not alter this design's analysis needs no
    refit (e.g. version 4 changed only designs with two D), so such a fit of the same runs (``digest``, the sha256
    of ``runs``) counts as made under today's rules (:func:`loopscale.fit.analysis.fit_rules_in_effect`)."""
    from loopscale.fit.analysis import FIT_RULES_VERSION

    if before.get("fit_rules", 1) != FIT_RULES_VERSION and before.get("runs_sha256") == digest:
        import pandas as pd

        from loopscale.fit.analysis import fit_rules_in_effect

        return {**before, "fit_rules": fit_rules_in_effect(before.get("fit_rules", 1), pd.read_parquet(runs))}
    return before


def fit_made_as(analysis: dict, settings: dict) -> bool:
    """Whether the fit whose ``analysis.json`` is ``analysis`` was made with ``settings``' B, starts and seed, as its
    own ``settings`` record them (an analysis without them: True). A kill between a fit's taking ``fit/``'s place
    and ``run_meta.json``'s write would leave another fit there under the record's settings: ``run`` and its dry
    run then refit instead of skipping."""
    own = analysis.get("settings") if isinstance(analysis, dict) else None
    return not isinstance(own, dict) or all(own.get(k) == settings.get(k) for k in ("B", "starts", "seed"))


def _fit_stage_note(out: Path, planned: dict, trains: bool) -> str | None:
    """The dry run's ``fit_stage``: what ``run`` does with the folder's finished fit (``run_meta.json``'s
    ``fit_input``), given the fit settings it would use (``planned``: ``B``, ``starts``, ``seed``) and whether it
    trains or records runs first (``trains``: runs.parquet then changes). None for a folder without a finished fit.
    A plain ``--resume`` of a folder fitted with ``--bootstrap 100 --starts 100`` refitted at the defaults (B = 200,
    500 starts) for minutes, which the dry run did not say."""
    from loopscale.fit.analysis import FIT_RULES_VERSION, file_digest, missing_fit_files
    from loopscale.sweep.status import _read_json

    meta = _read_json(out / "run_meta.json") or {}
    before = meta.get("fit_input")
    if not isinstance(before, dict) or not (out / "fit" / "analysis.json").exists():
        return None
    aside = "the earlier fit and its report are moved aside to earlier_fit_*, not replaced"
    last, took = meta.get("fit_last"), ""
    try:  # how long the folder's last fit took, beside a refit (older folders did not record it)
        took = (f"; the folder's last fit took {float(last['wall_s']) / 60:.1f} min at B = {int(last['B'])}, "
                f"{int(last['starts'])} starts")  # fmt: skip
    except (TypeError, KeyError, ValueError):
        pass
    aside += took
    names = {"B": "B = {}", "starts": "{} starts", "seed": "seed {}"}
    differ = [k for k in names if before.get(k) != planned[k]]
    if differ:
        was = ", ".join(names[k].format(before.get(k)) for k in differ)
        now = ", ".join(names[k].format(planned[k]) for k in differ)
        opts = " ".join(f"--{'bootstrap' if k == 'B' else k} {before.get(k)}" for k in differ)
        return (f"`run` refits: the folder's fit used {was}, this command's would use {now} ({aside}); give {opts} "
                "to keep the folder's settings")
    done = _read_json(out / "fit" / "analysis.json")
    if done is None:  # torn: `run` moves it aside and refits
        return f"`run` refits: fit/analysis.json does not read (it is moved aside, and the fit made again{took})"
    if lost := missing_fit_files(out, done):
        return f"`run` refits: the folder's fit lacks {', '.join(lost)} ({aside})"
    if not fit_made_as(done, planned):
        own = done["settings"]
        return (f"`run` refits: fit/ holds a fit made with B = {own.get('B')}, {own.get('starts')} starts, seed "
                f"{own.get('seed')}, not the one run_meta.json records ({aside})")
    runs = out / "runs.parquet"
    if trains or not runs.is_file():
        return None  # runs are trained or recorded first: the runs table changes, and the fit with it
    digest = file_digest(runs)
    now_in = fit_input_in_effect(before, runs, digest)
    if now_in == {"runs_sha256": digest, **planned, "fit_rules": FIT_RULES_VERSION}:  # as `run` decides
        return f"the folder's fit (B = {planned['B']}, {planned['starts']} starts) is up to date: `run` skips it"
    made = now_in.get("fit_rules", 1)
    if now_in.get("runs_sha256") == digest and made != FIT_RULES_VERSION:
        return (f"`run` refits: the folder's fit follows fit rules version {made}, this loopscale's are version "
                f"{FIT_RULES_VERSION} ({aside})")
    return None


def _lr_tuning_note(p: dict | None, tuned: bool) -> str | None:
    """The dry run's ``lr_tuning_done``: with ``lr: tune`` and no LR table in the folder yet, how much of the LR
    tuning an earlier command there finished (``p``, its :func:`lr_tuning_progress`: studies done, which `run` does
    not tune again; finished trials of the others) and so what `run` tunes before the grid; with the LR table there
    (``tuned``, an ``lr: tune`` spec's), that `run` skips the tuning. None when the spec fixes the LR (``p`` None),
    or nothing of the tuning was done."""
    if tuned:
        return ("lr_table.parquet exists here: `run` skips LR tuning and trains the grid at its LRs (lr_trials and "
                "lr_flops_max above are what the tuning costs where it runs)")  # fmt: skip
    if p is None:
        return None
    n_rest = p["studies"] - p["done"]
    if p["db_error"]:
        return (f"{p['done']} of {p['studies']} LR studies finished here; {p['db_error']}, so the trials of the "
                "other studies are unknown")  # fmt: skip
    if not p["done"] and not p["trials"]:
        return None
    if not n_rest:
        return (f"all {p['studies']} LR studies finished here; `run` writes the LR table from them, training no LR "
                "trial again, then trains the grid")
    one = n_rest == 1
    kept = (f" ({p['trials']} of {'its' if one else 'their'} {n_rest * p['per_study']} trials finished earlier: their "
            f"results are reused, not trained again; --resume restores {'the stopped study' if one else 'stopped studies'}"
            " as it stopped)" if p["trials"] else "")  # fmt: skip
    return (f"{p['done']} of {p['studies']} LR studies finished here; `run` tunes the other {n_rest}{kept}, then "
            "writes the LR table and trains the grid")


def _lr_left_plan(spec, prog: dict, p: dict) -> dict:
    """For a folder where an earlier command finished part of the LR tuning (``prog``, its
    :func:`lr_tuning_progress`; ``p`` the plan): ``lr_trials_left`` (trials `run` still trains: those of the
    studies not done, less their finished ones; None when the Optuna storage does not read) and ``lr_warning``
    recomputed for those trials alone (:func:`lr_cost_warning`: the studies left, in the share of their trials not
    finished; ``lr_trials`` and ``lr_flops_max`` stay the whole tuning's)."""
    rest = prog["rest"]
    planned = len(rest) * prog["per_study"]
    left = None if prog["trials"] is None else max(planned - prog["trials"], 0)
    # the studies' FLOPs in the share of their trials left (trials of one study train alike)
    flops = sum(lr_study_flops(spec, s, r) for s, r in rest) * (1.0 if left is None or not planned else left / planned)
    what = (f"The {len(rest)} LR stud{'y' if len(rest) == 1 else 'ies'} left"
            + (f" ({left} trial{'s' * (left != 1)} to train)" if left is not None and left < planned else ""))
    return {"lr_trials_left": left,
            "lr_warning": lr_cost_warning(flops, p["train_flops_total"], bool(p.get("lr_tokens_rounding")), what)}


def lr_cost_left_warning(spec, out: Path) -> str | None:
    """The dry run's ``lr_warning`` for the LR tuning left in the folder ``out``, which ``tune-lr`` (and ``run``'s
    first stage) says as it starts that tuning: the whole tuning's FLOPs against the grid's
    (:func:`lr_cost_warning`), or, where an earlier command there finished part of it, those of the studies and
    trials left (:func:`_lr_left_plan`). None when the spec fixes the LR, the folder holds its LR table, or the
    tuning left costs no more than the grid. Reads only."""
    from loopscale.sweep.lr_table import lr_table_present

    if spec.lr != "tune" or lr_table_present(Path(out) / "lr_table.parquet"):
        return None
    p = plan(spec, data=False)
    prog = lr_tuning_progress(spec, Path(out))
    if _lr_tuning_note(prog, False) is not None:  # part of it done here: what is left, as the dry run says
        return _lr_left_plan(spec, prog, p)["lr_warning"]
    return p["lr_warning"]


def _time_left_plan(time_left: dict | str | None, cpus: int | None) -> dict:
    """The dry run's ``est_train_min_left`` (minutes of training left, or None) and ``train_time_assumption`` (what
    the figure counts, or why there is none) from :func:`_recorded_note`'s ``time_left``."""
    if time_left is None:  # every run recorded (_recorded_note's None): no figure, and why
        return {"est_train_min_left": None,
                "train_time_assumption": "nothing left to train: every run of the grid finished here (recorded, "
                                         "or recorded when `run` continues)"}
    if not isinstance(time_left, dict):
        return {"est_train_min_left": None, "train_time_assumption": time_left}
    t = time_left
    cells = ("every run left trains in a cell measured here" if t["measured_runs"] == t["runs"] else
             f"{t['measured_runs']} of the {t['runs']} runs left train in a cell measured here, the others at the "
             "median of the measured cells of their r, or of all measured cells where their r has none")  # fmt: skip
    cores = os.cpu_count() or cpus
    on = (f"on {cpus} CPU{'s' * (cpus != 1)} here" if cpus <= cores else
          f"on {cpus} CPUs given to Ray on {cores} cores here (trials beyond the cores share them: no faster in all)")
    return {
        "est_train_min_left": t["seconds"] / 60.0,
        "train_time_assumption": (
            f"the sweep stage's training alone (LR tuning and the fit not counted), {on} "
            f"({t['slots']} trial{'s' * (t['slots'] != 1)} at full speed at once), at the FLOP/s of the "
            f"{t['rate_runs']} ok "
            f"run{'s' * (t['rate_runs'] != 1)} recorded here ({cells}), as `loopscale design` predicts times"
        ),
    }


def _absent_corpus_note(spec) -> str:
    """The line a fit-only rerun without its corpus gives (:func:`_corpus_absent_for_fit`), in ``run`` and its
    ``--dry-run`` alike."""
    return (f"corpus {spec.corpus!r} is absent: not checked (every run is recorded and nothing is left to train; "
            "`run` refits the folder without it)")  # fmt: skip


def _corpus_absent_for_fit(spec, out: Path) -> bool:
    """True when ``spec``'s corpus does not exist and ``out`` needs none: every cell has a finished record and, for
    ``lr: tune``, the LR table is there (:func:`_grid_done`), so only the fit and the report run, which read the
    runs' records, not the corpus."""
    from loopscale.model.data import CorpusNotFoundError, _corpus_files

    if spec.corpus == "embedded" or not (out / "spec.yaml").is_file():
        return False
    try:
        _corpus_files(spec.corpus, spec.text_column)
        return False
    except CorpusNotFoundError:
        pass
    except Exception:  # another fault of a corpus that is there: the checks say it
        return False
    try:
        return _grid_done(spec, out)
    except Exception:  # a folder the checks refuse (another spec's LR table, torn files): they say why
        return False


def nothing_to_fit(spec, out: Path) -> str | None:
    """Why ``run`` in ``out`` can only fail, or None: every run of the grid has a finished record (so none is
    trained again) and not one is ok (each diverged or did not learn), or fewer are ok than the joint law's 6
    parameters while they span two r or more (ok runs of one r: the fit stage skips the joint law and reports the
    rest), so the fit stage has nothing it can fit. ``run`` and
    its dry run refuse such a folder at once, and ``status`` says it instead of ``--resume`` (which trained
    nothing and ended in "no runs with status 'ok' to fit"). A folder whose grid is not known yet (no LR table, an
    unreadable file) is not judged here."""
    from loopscale.sweep.store import ResultsStore

    cells = _grid_cells_if_known(spec, out) if out.is_dir() else None
    return nothing_to_fit_in(out, cells, ResultsStore(out).recorded()) if cells else None


def folder_nothing_to_fit(folder) -> str | None:
    """:func:`nothing_to_fit` of a run or sweep folder by its ``spec.yaml``, read only (a torn file is not moved
    aside); None when the folder has no readable spec (the caller's own reading says what is wrong)."""
    folder = Path(folder)
    try:
        from loopscale.sweep.spec import load_spec
        from loopscale.sweep.store import look_only

        with look_only():
            return nothing_to_fit(load_spec(folder / "spec.yaml"), folder)
    except Exception:
        return None


def nothing_to_fit_in(out, cells, latest: dict) -> str | None:
    """:func:`nothing_to_fit` for the grid ``cells`` of ``out`` and ``latest``, its newest record of each run
    ({run id: record}, as :meth:`loopscale.sweep.store.ResultsStore.recorded` gives it)."""
    from loopscale.fit.laws import make_law

    rows = [latest.get(c.run_id) for c in cells]
    if any(r is None or r["status"] == "failed" for r in rows):  # a failed run is trained again by --resume
        return None
    k = make_law("joint").n_params
    ok_r = [c.r for c, r in zip(cells, rows, strict=True) if r["status"] == "ok"]
    # a few ok runs of one r: the fit stage skips the joint law (single_r) and reports the rest; of two r or more
    # and fewer than the law's parameters, it fails
    if len(ok_r) >= k or (ok_r and len(set(ok_r)) < 2):
        return None
    n_ok = len(ok_r)
    counts = Counter(r["status"] for r in rows if r["status"] != "ok")
    said = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    head = (f"every run of the grid in {out} finished and none is ok ({said}): there is nothing to fit" if not n_ok
            else f"every run of the grid in {out} finished and only {n_ok} of {len(rows)} are ok (the others: {said}), "
                 f"fewer than the {k} parameters of the joint law `run` fits, so its fit stage cannot fit them")  # fmt: skip
    return (head + ", and a finished run is not trained again; the LR is likely too high: lower it (lr: {fixed: "
            "...}, or lr: tune) and train in a new --out folder (loopscale sweep SPEC --out DIR --force moves these "
            "runs aside and trains the same spec again)")


def _read_as_run_reads(spec, out: Path) -> None:
    """Read the folder's files that :func:`run_pipeline` reads, and moves aside when unreadable, before and between
    its stages: the LR table (``lr: tune``), ``run_meta.json`` and ``fit/analysis.json``. Called inside
    :func:`loopscale.sweep.store.look_only` by the dry run, which lists an unreadable one and moves nothing."""
    from loopscale.cluster.storage import read_json_or_aside
    from loopscale.sweep.lr_table import lr_table_present

    if not out.is_dir():
        return
    if spec.lr == "tune":
        lr_table_present(out / "lr_table.parquet")
    for name in ("run_meta.json", "fit/analysis.json"):
        read_json_or_aside(str(out / name))


def run_pipeline(
    spec,
    out_dir: str | Path,
    *,
    resume: bool = False,
    cluster: ClusterOptions | None = None,
    bootstrap: int = 200,
    starts: int = 500,
    seed: int = 0,
    command: str | None = None,
    log=print,
    track: tuple | list = (),
) -> dict:
    """Run (or continue) the whole job into ``out_dir``; see the module docstring for the stages.

    ``cluster``: the Ray options (``--address``, ``--num-cpus``, ``--num-gpus``, ``--ray-temp-dir``); the spec's
    ``resources`` are checked against them before ``out_dir`` is written, and the tune-lr and sweep stages get them
    as ``loopscale tune-lr`` / ``sweep`` do (the fit stage runs in the Ray they started, or, on a fit-only rerun
    with any of the last three given, in an embedded Ray started with them). ``track``: ``--track`` values for the
    Tune stages (:mod:`loopscale.sweep.tracking`); ``log``: where the stage lines go. Progress displays are those of
    :mod:`loopscale.sweep.console` (the bootstrap's included).

    Returns:
        ``run_meta.json`` content: stage wall times (s), which stages were skipped, the paths written.
    A folder where every cell has a finished record (and, for ``lr: tune``, the LR table) is refitted without its
    corpus when that is absent: the corpus is then neither checked nor compared with the folder's, and a line says so.

    Raises:
        SpecError / ValueError: bad spec or options, a bad ``--track`` or its package missing (before any compute).
        loopscale.sweep.commands.SweepInterrupted / loopscale.sweep.lr_search.TuneInterrupted: stopped by Ctrl-C;
            the state is saved, rerun with ``resume=True``.
    """
    from loopscale.cluster.storage import new_aside_folder, read_json_or_aside, write_text_atomic
    from loopscale.fit.analysis import FIT_RULES_VERSION, analyze, file_digest, missing_fit_files
    from loopscale.fit.run_report import build_report
    from loopscale.sweep import console
    from loopscale.sweep.cli import version_line
    from loopscale.sweep.commands import run_sweep
    from loopscale.sweep.lr_search import check_tune_samples, run_tune_lr
    from loopscale.sweep.lr_table import lr_table_present
    from loopscale.sweep.spec import record_folder_spec
    from loopscale.sweep.status import mark_started
    from loopscale.sweep.store import REPORT_OUTPUTS, ResultsStore, move_report_outputs
    from loopscale.sweep.tracking import parse_track

    cluster = cluster or ClusterOptions()
    cluster.validate(tune="loopscale run")
    out = Path(out_dir).resolve()
    absent = _corpus_absent_for_fit(spec, out)
    spec.check_runtime(cluster.address, cluster.num_cpus, cluster.num_gpus, data=not absent,
                       models="none" if absent else "grid")  # fmt: skip
    check_design(spec)
    check_tune_samples(spec, out)
    lacking = design_warning(spec)
    if lacking:
        import warnings

        warnings.warn(lacking, UserWarning, stacklevel=2)
    track = parse_track(track)
    if resume:  # before anything is written here (the folder's record would name the refused command)
        from loopscale.sweep.commands import check_resume_storage

        check_resume_storage(out, spec, _grid_cells_if_known(spec, out))
    out.mkdir(parents=True, exist_ok=True)
    record_folder_spec(out, spec, corpus=not absent)  # refuses another spec's folder; --storage may change
    if absent:
        log(_absent_corpus_note(spec))
    from loopscale.cluster.storage import absolute_uri

    # `loopscale status`: running from here on, before Ray starts; a storage other than OUT/tune is recorded (the
    # folder's spec.yaml does not keep it), so that status reads the grid's Tune state there
    mark_started(out, "run", storage=absolute_uri(spec.storage_path) if spec.storage_path else None)
    meta_path = out / "run_meta.json"
    meta = read_json_or_aside(str(meta_path)) or {}
    meta["spec_name"] = spec.name  # the spec's own name, as Tune's experiments and the studies have it
    meta.setdefault("command", command)  # the command that started this run directory
    meta["last_command"] = command
    meta.setdefault("stage_wall_s", {})  # summed over every `run` of this folder (a resumed stage counts both)
    meta["last_command_stage_wall_s"] = {}  # this command's own: a stage it skipped is absent
    meta["skipped"] = []

    def save_meta() -> None:
        write_text_atomic(str(meta_path), json.dumps(meta, indent=2))

    need_ray = (spec.lr == "tune" and not lr_table_present(out / "lr_table.parquet")) or not _grid_done(spec, out)
    # every stage gets the Ray options as `loopscale tune-lr` / `sweep` give them: their checks of resources.cpus /
    # gpus against the embedded Ray count --num-cpus / --num-gpus, not this machine's cores
    ray_opts = dataclasses.asdict(cluster)
    fit_settings = {"B": bootstrap, "starts": starts, "seed": seed, "fit_rules": FIT_RULES_VERSION}

    @contextlib.contextmanager
    def timed(stage: str):
        """Add the block's wall time to the stage's, also when it is interrupted (a resumed stage then counts both
        attempts: status and the report showed only the resumed part)."""
        t0 = time.time()
        try:
            yield
        finally:
            dt = time.time() - t0
            meta["stage_wall_s"][stage] = meta["stage_wall_s"].get(stage, 0.0) + dt
            meta["last_command_stage_wall_s"][stage] = meta["last_command_stage_wall_s"].get(stage, 0.0) + dt
            save_meta()

    def stages() -> None:
        # 1. LR tuning
        if spec.lr != "tune":
            meta["skipped"].append("tune-lr")
            log("[1/4] tune-lr: the spec fixes the LR, skipped")
        else:
            if lr_table_present(out / "lr_table.parquet"):
                meta["skipped"].append("tune-lr")
                log("[1/4] tune-lr: lr_table.parquet exists, skipped")
            else:
                log("[1/4] tune-lr: Optuna studies through Ray Tune ...")
                with timed("tune-lr"):
                    run_tune_lr(spec, out, resume=resume, **ray_opts, track=track, note_fresh_resume=False)
        # 2. the grid
        if _grid_done(spec, out):
            meta["skipped"].append("sweep")
            store = ResultsStore(out)
            if not store.is_consolidated():  # the grid was stopped after its last run's record, before this
                store.consolidate()
            log("[2/4] sweep: every cell is in runs.parquet, skipped")
        else:
            log("[2/4] sweep: the iso-depth grid on Ray Tune ...")
            with timed("sweep"):
                run_sweep(spec, out, resume=resume, **ray_opts, track=track)
        # 3. fits
        digest = file_digest(out / "runs.parquet")
        ana = out / "fit" / "analysis.json"
        before = fit_input_in_effect(meta.get("fit_input") or {}, out / "runs.parquet", digest)
        done = read_json_or_aside(str(ana))
        lost = missing_fit_files(out, done) if done is not None else []
        if (done is not None and not lost and fit_made_as(done, fit_settings)
                and before == {"runs_sha256": digest, **fit_settings}):  # fmt: skip
            meta["skipped"].append("fit")
            # a refit stopped part-way left this fit in place, and it is the one asked for: what the stopped fit
            # wrote is dropped, and the stage is done
            meta.pop("fit_unfinished", None)
            if (out / FIT_STAGING).exists():
                shutil.rmtree(out / FIT_STAGING)
            log("[3/4] fit: runs.parquet, settings and fit rules unchanged, skipped")
        else:
            made = before.get("fit_rules", 1)
            if lost:
                log(f"[3/4] fit: the folder's fit lacks {', '.join(lost)}: refitting")
            elif before and made != FIT_RULES_VERSION and ana.is_file():
                log(f"[3/4] fit: the folder's fit follows fit rules version {made}, this loopscale's are version "
                    f"{FIT_RULES_VERSION}: refitting")
            finished = bool(before) and ana.is_file()  # a finished fit of other runs, settings or rules
            log(f"[3/4] fit: joint law + block bootstrap (B = {bootstrap}, {starts} starts) ...")
            # the fit is written into fit.partial/ and takes fit/'s place when it ends: a refit stopped part-way
            # leaves the folder's earlier fit and its report whole (fit_input still describes them); until then
            # fit_unfinished says the stage has not ended (status: stage fit, showing the earlier fit as earlier)
            staging = out / FIT_STAGING
            if staging.exists():  # a fit stopped part-way: no finished fit's files
                shutil.rmtree(staging)
            meta["fit_unfinished"] = fit_settings
            save_meta()
            staging.mkdir()
            (staging / FIT_STAGING_MARK).write_text("written by loopscale run's fit stage; removed when it ends\n")
            moved_line = None
            # a fit-only rerun starts no Ray for the stages above: the fit's embedded Ray is then started here with
            # --num-cpus / --num-gpus / --ray-temp-dir, when given (else the bootstrap starts one on all cores)
            own_ray = not need_ray and any(v is not None for k, v in ray_opts.items() if k != "address")
            fit_ray = cluster.session() if own_ray else contextlib.nullcontext()
            with timed("fit"), console.bootstrap_view(B=bootstrap), fit_ray, _cluster_lost_before_fit(cluster.address):
                fit_t0 = time.time()
                analyze(
                    out / "runs.parquet",
                    staging,
                    B=bootstrap,
                    starts=starts,
                    seed=seed,
                    address=cluster.address,
                    variant_order=[v.name for v in spec.variants],
                )
                if any((out / n).exists() for n in REPORT_OUTPUTS):  # kept, not replaced
                    aside = new_aside_folder(out, "earlier_fit")
                    moved = move_report_outputs(out, aside)
                    settings = ", ".join(f"{k} {v}" for k, v in before.items() if k != "runs_sha256")
                    what = (f"the earlier fit ({settings}) and its report" if finished else
                            f"the earlier fit ({settings}), whose analysis.json did not read, and its report" if before
                            else "the files of an earlier fit this folder has no record of finishing")  # fmt: skip
                    moved_line = f"[3/4] fit: {what} moved to {aside} ({', '.join(moved)})"
                (staging / FIT_STAGING_MARK).unlink()
                staging.rename(out / "fit")
                meta["fit_input"] = {"runs_sha256": digest, **fit_settings}
                # how long it took (the dry run sets it beside a refit), Ray's start-up for the bootstrap included
                meta["fit_last"] = {"wall_s": time.time() - fit_t0, "B": bootstrap, "starts": starts}
                meta["fit_command"] = command  # the report names it: the fit it shows is this command's
                meta["fit_versions"] = version_line()  # and the loopscale (and libraries) that made it
                del meta["fit_unfinished"]
                save_meta()  # at once: the record describes fit/ before Ray's shutdown, which a kill may cut short
            if moved_line:  # after the bootstrap's own summary line
                log(moved_line)

    if need_ray:
        with cluster.session():
            stages()
    else:
        stages()
    # the report names this command (last_command) also when every stage was skipped; report_unfinished until
    # it is written, so that status says stage report meanwhile (a folder's earlier report.md read as done)
    meta["report_unfinished"] = True
    save_meta()
    t0 = time.time()
    report = build_report(out)
    dt = time.time() - t0
    meta["stage_wall_s"]["report"] = meta["stage_wall_s"].get("report", 0.0) + dt
    meta["last_command_stage_wall_s"]["report"] = dt
    meta["report"] = str(report)
    del meta["report_unfinished"]
    save_meta()
    log(f"[4/4] report: {report}")
    return meta


@contextlib.contextmanager
def _cluster_lost_before_fit(address: str | None):
    """The fit stage's words for a cluster (``--address``) that stopped answering after the sweep: the address
    check's "no Ray cluster answers at ...; check the address" read as a mistyped address, of a cluster the same
    command had trained on seconds before, and did not say that the runs are recorded or that the fit needs no
    cluster. Raises ValueError (one line; the command's exit 2) in place of
    :class:`loopscale.cluster.connect.ClusterUnreachable`."""
    from loopscale.cluster.connect import ClusterUnreachable, joins_a_cluster

    try:
        yield
    except ClusterUnreachable as e:
        if not joins_a_cluster(address):
            raise
        raise ValueError(
            f"the Ray cluster at {e.address} stopped answering before the fit ({e.why}); every finished run is "
            "recorded in runs.parquet: rerun this command with --resume once the cluster is back, or without "
            "--address (and RAY_ADDRESS) to fit on this machine: the fit trains nothing"
        ) from None


def corpus_epochs(spec) -> dict:
    """The corpus against the largest runs, for ``--dry-run``, without tokenizing anything.

    Returns ``corpus_train_tokens`` (training-split tokens, or ``"unknown until tokenized"``),
    ``corpus_tokens_from`` (how that is known, or the upper bound used), ``tokens_max_run`` (the largest per-run D),
    ``epochs_max_run`` (the most passes over the training split any run makes, as the trainer counts them:
    D / (windows of seq_len in the split x seq_len); a lower bound when only an upper bound on the corpus is known;
    None when unknown), ``epochs_max_lr_trial`` (the same for the LR studies' trials at their full budget,
    ``lr_trial_tokens``; None without ``lr: tune`` or when unknown) and ``data_warning``: the trainer's epochs
    warning (:func:`loopscale.model.data.implied_epochs`, same threshold: more than one epoch) for the run that
    repeats the data most, with how many runs do, and how many LR studies' trials would repeat it, else None;
    ``lr_data_warning``: the LR studies' part of it alone (what ``tune-lr``, which trains no run of the grid, says).
    """
    import warnings

    from loopscale.model.data import implied_epochs, train_tokens_if_cheap
    from loopscale.model.train import resolve_tokens

    lr_table = {(s, None): 1.0 for s in spec.all_sizes()} if spec.lr == "tune" else None
    runs = [c.run for c in spec.cells(lr_table=lr_table)]
    d_t = [(int(resolve_tokens(r)), int(r.model.seq_len)) for r in runs]
    exact, at_most, how = train_tokens_if_cheap(
        spec.corpus, spec.tokenizer, text_column=spec.text_column, cache_dir=runs[0].cache_dir
    )
    out = {
        "corpus_train_tokens": exact if exact is not None else "unknown until tokenized",
        "corpus_tokens_from": how,
        "tokens_max_run": max(d for d, _ in d_t),
        "epochs_max_run": None,
        "epochs_max_lr_trial": None,
        "data_warning": None,
        "lr_data_warning": None,
    }
    n = exact if exact is not None else at_most
    if n is None:
        return out
    per_epoch = [((n - 1) // t) * t for _, t in d_t]
    if min(per_epoch) <= 0:
        out["data_warning"] = (f"the training split ({'' if exact is not None else 'at most '}{n} tokens) is shorter "
                               "than one window of seq_len + 1 tokens: the runs would fail")
        return out
    lr_note = _lr_trial_epochs(spec, n, exact is not None, out)
    out["lr_data_warning"] = lr_note
    epochs = [d / e for (d, _), e in zip(d_t, per_epoch, strict=True)]
    i = max(range(len(runs)), key=epochs.__getitem__)
    out["epochs_max_run"] = epochs[i]
    out["data_warning"] = lr_note
    if epochs[i] > 1:
        if exact is not None:  # the trainer's own warning, word for word
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                implied_epochs(d_t[i][0], per_epoch[i])
            msg = str(caught[0].message)
        else:  # n is an upper bound on the corpus: a lower bound on the epochs
            msg = (f"D = {d_t[i][0]} training tokens exceeds the at most {per_epoch[i]} available (one epoch: the "
                   f"training split's whole windows of seq_len): at least {epochs[i]:.2f} epochs (data repeats)")  # fmt: skip
        many = sum(e > 1 for e in epochs)
        out["data_warning"] = (f"{many} of {len(runs)} runs would repeat the training data (more than one epoch); "
                               f"the run that repeats it most: {msg}" + (f"; {lr_note}" if lr_note else ""))
    return out


def _lr_trial_epochs(spec, n: int, exact: bool, out: dict) -> str | None:
    """Passes of the LR studies' trials over a training split of ``n`` tokens (``exact``: else an upper bound), at
    their full budget (``SweepSpec.tuning_steps``, whole steps per milestone, of ``SweepSpec.tuning_model``): sets
    ``out["epochs_max_lr_trial"]`` (None without ``lr: tune``) and returns the warning part for studies whose
    trials would make more than one pass, else None. The LR a study picks is then the best at repeating the data,
    which the grid's runs may not do. The advice names what to lower: ``tune.tokens`` (or
    ``tune.tokens_per_param``, whichever the spec uses), or ``tune.num_milestones`` where the tokens asked fit in one
    pass and the rounding to whole steps per milestone is what makes the trials repeat the data."""
    if spec.lr != "tune":
        return None
    from loopscale.sweep.lr_search import study_keys, tuning_tokens_asked

    worst, over = 0.0, []
    keys = study_keys(spec)
    for s, r in keys:
        model = spec.tuning_model(s, r)  # not tuning_budget's base cell: that expands the whole grid per study
        steps, _ = spec.tuning_steps(s, r)
        t = int(model.seq_len)
        per_epoch = ((n - 1) // t) * t
        if per_epoch <= 0:
            continue
        e = steps * spec.training.batch_tokens / per_epoch
        worst = max(worst, e)
        if e > 1:
            asked = tuning_tokens_asked(spec, model, r)
            over.append((e, s, r, steps * spec.training.batch_tokens, asked <= per_epoch))
    out["epochs_max_lr_trial"] = worst
    if not over:
        return None
    e, s, r, d, rounding = max(over)
    knob = "tune.tokens" if spec.tune.tokens is not None else "tune.tokens_per_param"
    fix = (f"lower tune.num_milestones (or training.batch_tokens): the {knob} asked fit in one pass, the whole steps "
           "per milestone do not" if rounding else f"lower {knob}, or give a larger corpus")
    return (f"{len(over)} of {len(keys)} LR studies' trials would repeat the training data at their full budget "
            f"(size {s}, r {r}: {d} tokens, {'' if exact else 'at least '}{e:.2f} epochs); {fix}")


def _refuse_busy_storage(spec, out_dir) -> None:
    """:func:`loopscale.sweep.status.refuse_busy_storage` for the spec's storage (``--storage`` applied)."""
    from loopscale.cluster.storage import absolute_uri
    from loopscale.sweep.status import refuse_busy_storage

    refuse_busy_storage(absolute_uri(spec.storage_path) if spec.storage_path else None, out_dir, "`loopscale run`")


def run_cmd(
    spec_path: SpecArg = None,
    preset: PresetOpt = None,
    out: Path | None = typer.Option(
        None, "--out", help="Output directory (default: runs/<preset name or spec file name>)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run (restores Tune state)."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the plan (runs, FLOPs, GPU-hours, epochs over the corpus) and exit."
    ),
    bootstrap: int | None = typer.Option(
        None, "--bootstrap", min=0, help="Bootstrap resamples (default 200, the paper's; 100 for the smoke spec)."
    ),
    starts: int | None = typer.Option(
        None, "--starts", min=1, help="Multi-starts per fit (default 500, the paper's; 100 for the smoke spec)."
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the fits and the bootstrap."),
    address: TuneAddressOpt = None,
    num_cpus: NumCpusOpt = None,
    num_gpus: NumGpusOpt = None,
    ray_temp_dir: RayTempDirOpt = None,
    storage: StorageOpt = None,
    track: TrackOpt = None,
    verbose: VerboseOpt = False,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (plan or run summary)."),
) -> None:
    """Measure phi end to end: LR tuning -> iso-depth grid -> fits with bootstrap -> report.md."""
    from loopscale.sweep import console, tracking
    from loopscale.sweep.commands import stdout_to_stderr
    from loopscale.sweep.spec import check_folder_spec, check_out_outside_corpus, set_aside_torn_spec
    from loopscale.sweep.status import fit_headlines

    spec, name = resolve_spec(spec_path, preset)
    if storage is not None:
        from loopscale.cluster.options import validate_storage

        spec = spec.model_copy(update={"storage_path": validate_storage(storage)})
    cluster = ClusterOptions(address=address, num_cpus=num_cpus, num_gpus=num_gpus, ray_temp_dir=ray_temp_dir)
    cluster.validate(tune="loopscale run")
    targets = tracking.parse_track(track)
    from loopscale.cluster.options import usable_out_dir

    out_dir = out or Path("runs") / name
    usable_out_dir(out_dir)  # a file in the way is said now, not after the sweep
    if dry_run:
        from loopscale.sweep.store import look_only

        # a folder with nothing left to train refits without its corpus, as `run` does (_corpus_absent_for_fit);
        # read changing nothing (a runs part without its curves part is not moved aside by a dry run)
        with look_only() as early:
            absent = _corpus_absent_for_fit(spec, Path(out_dir).resolve())
        # the folder the run would write (the default runs/<spec> is otherwise seen nowhere), then the plan
        try:
            p = {"out": str(Path(out_dir).resolve()), **plan(spec, data=not absent)}
        except ValueError as e:  # the corpus would fail every run (check_data): --json still prints an object
            if as_json:
                json.dump({"out": str(Path(out_dir).resolve()), "refused": str(e)}, sys.stdout)
                sys.stdout.write("\n")
            raise
        p.update(_fit_settings_plan(spec, bootstrap, starts))
        if absent:
            p["corpus_warning"] = _absent_corpus_note(spec)
        else:
            p.update(corpus_epochs(spec))
        from loopscale.sweep.status import refuse_busy_folder, refuse_foreign_files

        with look_only() as unreadable:  # a dry run changes nothing: files `run` would move aside are listed
            try:
                from loopscale.sweep.lr_search import check_tune_samples

                check_design(spec)
                check_tune_samples(spec, out_dir)
                # the folder, as `run` checks it: another command working there, files of someone else's that
                # `run` would replace, another spec's results, runs on other corpus content
                check_out_outside_corpus(out_dir, spec)
                refuse_busy_folder(out_dir, "`loopscale run`")
                _refuse_busy_storage(spec, out_dir)
                refuse_foreign_files(out_dir)
                check_folder_spec(out_dir, spec, corpus=not absent)
                set_aside_torn_spec(out_dir)  # listed: `run` keeps a torn spec.yaml aside and writes its own
                _read_as_run_reads(spec, Path(out_dir))
                if why := nothing_to_fit(spec, Path(out_dir)):
                    raise ValueError(why)
                if resume:  # as `run --resume` checks it, before anything is written
                    from loopscale.sweep.commands import check_resume_storage

                    check_resume_storage(Path(out_dir), spec, _grid_cells_if_known(spec, Path(out_dir).resolve()))
                # the storage, as `run` checks it before anything is written: a bucket out of reach is probed now;
                # a local one is checked for a file in its way, no write permission or no folder makeable there
                # (a probe folder made and removed at once)
                from loopscale.cluster.options import reachable_storage
                from loopscale.cluster.storage import is_local_uri, local_path

                reachable_storage(spec.storage_path)
                if spec.storage_path and is_local_uri(spec.storage_path):
                    usable_out_dir(local_path(spec.storage_path), what="storage (--storage, or the spec's storage_path)")
                p["refused"] = None
                cpus = (num_cpus or os.cpu_count() or 1) if address is None else None
                from loopscale.sweep.lr_table import lr_table_present

                tuned = spec.lr == "tune" and lr_table_present(Path(out_dir) / "lr_table.parquet")
                prog = None if tuned else lr_tuning_progress(spec, Path(out_dir))  # the Optuna storage read once
                p["lr_tuning_done"] = _lr_tuning_note(prog, tuned)
                if tuned:
                    p["lr_warning"] = None  # the tuning it warns of will not run: lr_tuning_done says so
                elif p["lr_tuning_done"] is not None:  # part done: the trials and the cost of what is left
                    p.update(_lr_left_plan(spec, prog, p))
                p["recorded"], time_left, trains = _recorded_note(spec, Path(out_dir), cpus)
                p.update(_time_left_plan(time_left, cpus))
                p["fit_stage"] = _fit_stage_note(Path(out_dir), {"B": p["fit_bootstrap"], "starts": p["fit_starts"],
                                                                 "seed": seed}, trains)  # fmt: skip
            except ValueError as e:  # the plan says what `run` would refuse, and exits as `run` would
                p["refused"] = str(e)
        p["unreadable"] = list(dict.fromkeys([*early, *unreadable])) or None  # each file once (several checks read it)
        try:  # what this machine would refuse (e.g. GPUs asked, none here); a plan for a cluster is still a plan
            spec.check_runtime(address, num_cpus, num_gpus, warn_data=False, data=not absent,
                               models="none" if absent else "grid")  # the plan states them  # fmt: skip
            p["refused_here"] = None
        except ValueError as e:
            p["refused_here"] = f"{e} (with these options on this machine; the plan holds for a cluster)"
        if as_json:
            json.dump(p, sys.stdout)
            sys.stdout.write("\n")
        else:
            for k, v in p.items():
                if k == "refused" and v:  # its text is the error line below, said once
                    v = "yes: the error below says why"
                typer.echo(f"{k:>22}: {v:.4g}" if isinstance(v, float) else f"{k:>22}: {v}")
        if p["refused"]:
            raise ValueError(f"run would refuse this spec: {p['refused']}")
        return
    check_out_outside_corpus(out_dir, spec)  # before the console session writes its logs there
    from loopscale.sweep.status import refuse_busy_folder, refuse_foreign_files

    refuse_busy_folder(out_dir, "`loopscale run`")
    _refuse_busy_storage(spec, out_dir)
    refuse_foreign_files(out_dir)
    if why := nothing_to_fit(spec, Path(out_dir)):
        raise ValueError(why)
    from loopscale.cluster.options import reachable_storage

    fresh = not (Path(out_dir).is_dir() and any(Path(out_dir).iterdir()))  # before a storage inside it is made
    reachable_storage(spec.storage_path, write=True)  # a bucket out of reach, a path not writable: one line, first
    b_def, s_def = fit_defaults(spec)
    with stdout_to_stderr(as_json), console.session(out_dir, verbose=verbose, json_mode=as_json) as con:
        if resume and fresh:  # e.g. a mistyped folder: say it before hours of training start
            con.say(f"--resume: nothing to resume in {out_dir} (no earlier run there); starting a new run", err=True)
        # with `lr: tune` the LR studies log into their own MLflow experiment / W&B group before the grid's
        groups = ("tune-lr", "grid") if spec.lr == "tune" else ("grid",)
        with tracking.described(targets, out_dir, tuple(f"loopscale-{spec.name}-{g}" for g in groups), con.say):
            meta = run_pipeline(
                spec,
                out_dir,
                resume=resume,
                cluster=cluster,
                bootstrap=b_def if bootstrap is None else bootstrap,
                starts=s_def if starts is None else starts,
                seed=seed,
                command="loopscale " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                log=con.say,
                track=targets,
            )
    ana = json.loads((Path(out_dir) / "fit" / "analysis.json").read_text(encoding="utf-8"))
    from loopscale.sweep.status import runs_caveats

    # losses of a small corpus, runs of few tokens per parameter: said under the headline, as the report does
    small, short = runs_caveats(Path(out_dir))
    if not as_json:
        for line in fit_headlines(ana):
            typer.echo(line)
        if small:
            typer.echo(f"caution, small data: {small}")
        if short:
            typer.echo(f"caution, short training: {short}")
    if as_json:
        summary = {
            "out": str(Path(out_dir).resolve()),
            "report": meta["report"],
            "skipped": meta["skipped"],
            "stage_wall_s": meta["stage_wall_s"],
            "this_command_stage_wall_s": meta["last_command_stage_wall_s"],
            "data_caveat": small,
            "training_caveat": short,
        }
        from loopscale.fit.identify import stored_headline

        summary["variants"] = {
            k: {
                "phi": (v.get("joint") or {}).get("params", {}).get("phi"),
                "ci": (v.get("joint") or {}).get("ci", {}).get("phi"),
                "r2": (v.get("joint") or {}).get("r2"),
                "identified": (v.get("identification") or {}).get("identified"),
                "headline": stored_headline(v.get("identification") or {}),
            }
            for k, v in ana.get("variants", {}).items()
        }
        if comp := ana.get("variant_comparison"):  # Δφ per variant (fit/analysis.json has the same)
            summary["variant_comparison"] = {"baseline": comp.get("baseline"), "skipped": comp.get("skipped"),
                                             "comparisons": comp.get("comparisons")}  # fmt: skip
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
