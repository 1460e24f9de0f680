"""``loopscale design``: choose a sweep design from measurements, before training it.

A candidate is a sweep spec at a number of seeds per cell. For each candidate the spec's own expansion
(:meth:`loopscale.sweep.spec.SweepSpec.cells`) gives the planned runs — widths, depths, r, token budgets, seeds and
ladder rungs exactly as ``loopscale sweep`` would train them — with their parameters and FLOPs from the model
accounting (paper Sec. 3.2). A pilot (a short run, or a previous run's ``runs.parquet``) supplies three
measurements:

- the truth: the joint law (paper Eq. 3) fitted to the pilot's cell means (each cell's loss averaged over seeds);
- the seed noise per cell: the standard deviation of the loss between seeds of each measured cell (nats/token),
  matched to the planned cells by (r, unique layers, d_model, D), else the pilot's median at the same r (of all
  its cells where that r has none);
- the throughput per cell: training FLOP/s of one run (``C / wall_s``, median over the cell's seeds), matched the
  same way.

:func:`loopscale.fit.design.simulate_design` then draws every planned run's loss, averages each cell over its
seeds, refits with the product's fitter and reads the worth in unique layers off the ladder as the report does; the
spread of the refits predicts the half-widths a real run reports. Candidates are listed best first (smallest phi
half-width) among those whose predicted training time fits ``--minutes``.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import typer

from loopscale.sweep.commands import PresetOpt, SpecArg
from loopscale.sweep.spec import DESIGN_PREDICTION

DEFAULT_SEEDS = (4, 8, 16, 24, 32)
"""Seeds per cell tried when ``--seeds`` is not given."""

OVERHEAD_S = 0.5
"""Seconds added per trial to its measured training time (trial start and result write; the 16-seed ``cpu`` run's
sweep stage took 1786 s for 1769 s of summed run time on 2 slots, about 0.3 s per run)."""

WALL_ASSUMPTION = (
    "training time only (the sweep stage; the fit adds minutes): every run trains at its cell's FLOP/s measured in "
    "the pilot (k C / wall_s for a trial of k seeds, median over seeds; cells without a measurement take the "
    "pilot's median at the same r, or of all its cells where that r has none), under the pilot's threads and concurrency; a seed-ensemble trial takes the sum "
    "of its members' times (the pilot's own ensemble speed-up; a pilot of single runs assumes none, an upper "
    "bound); floor(cpus / resources.cpus) trials at once, longest first, "
    f"+{OVERHEAD_S:g} s per trial"
)

PILOT_COLUMNS = ("N_once", "N_rec", "r", "D", "C", "wall_s")


def planned_runs(spec, cells=None) -> pd.DataFrame:
    """Every run ``spec`` would train, one row per run (seeds and ladder rungs included), or those of ``cells``
    (grid cells of ``spec``, e.g. the runs left to train, grouped into trials as the sweep groups them).

    Columns: ``variant``, ``d_model``, ``r``, ``layers_unique`` (prelude + shared block + coda), ``N_once``,
    ``N_rec`` (params), ``D`` (tokens, rounded to whole batches as the trainer does), ``flops_per_token``,
    ``C`` (training FLOPs), ``seed`` and ``trial`` (the Ray Tune trial that trains the run: seeds of one cell are
    packed into seed ensembles of at most ``resources.ensemble`` members, :func:`loopscale.sweep.grid.trial_groups`).

    Raises:
        SpecError: see :meth:`loopscale.sweep.spec.SweepSpec.cells`.
    """
    from loopscale.model.accounting import flops_per_token, n_once, n_rec
    from loopscale.model.train import resolve_tokens
    from loopscale.sweep.grid import trial_groups

    if cells is None:
        lr_table = {(s, None): 1.0 for s in spec.all_sizes()} if spec.lr == "tune" else None  # no cost in the LR
        cells = spec.cells(lr_table=lr_table)
    trial_of = {c.run_id: i for i, g in enumerate(trial_groups(cells, spec.ensemble_members())) for c in g}
    rows = []
    for c in cells:
        m = c.run.model
        f, d = flops_per_token(m), resolve_tokens(c.run)
        rows.append(
            dict(
                variant=c.variant,
                d_model=int(m.d_model),
                r=int(c.r),
                layers_unique=int(m.n_prelude + m.n_recur_block + m.n_coda),
                N_once=float(n_once(m)),
                N_rec=float(n_rec(m)),
                D=float(d),
                flops_per_token=float(f),
                C=float(f) * d,
                seed=int(c.seed),
                trial=trial_of[c.run_id],
            )
        )
    return pd.DataFrame(rows)


def _first_variant_fit(plan: pd.DataFrame, first: str) -> pd.DataFrame:
    """The planned runs of the fit the design predicts: variant ``first``'s and the r = 1 runs every fit shares."""
    return plan[(plan["variant"] == first) | (plan["r"] == 1)].reset_index(drop=True)


def read_pilot(path: str | Path) -> pd.DataFrame:
    """The pilot's ok runs with ``loss`` (nats/token) and ``layers_unique``; refuses a pilot it cannot use.

    Raises:
        FileNotFoundError: no such file (``path`` may be a run folder holding ``runs.parquet``).
        ValueError: unreadable file (Parquet or CSV, :func:`loopscale.fit.io.read_table`), ok runs of two corpus
            contents (:func:`loopscale.fit.io.one_corpus`), missing columns, an ok
            run without a finite loss (as the fits), fewer than two r among the ok runs, or no cell with two seeds
            (the seed noise cannot be measured).
    """
    from loopscale.fit.design import cell_noise

    p = Path(path)
    if p.is_dir() and (p / "runs.parquet").is_file():  # a run folder, as `fit` takes one
        p = p / "runs.parquet"
    if not p.is_file():
        what = "has no runs.parquet" if p.is_dir() else "not found"
        raise FileNotFoundError(
            f"pilot runs table {what}: {p} (give a runs.parquet, or the folder of a pilot or a previous run)"
        )
    from loopscale.fit.io import drop_duplicate_runs, one_corpus, read_table, with_layers_unique

    try:
        runs = read_table(p)
    except Exception as e:  # pyarrow and pandas raise several types for a file that is not a table
        raise ValueError(f"pilot {p} is not a readable table (.parquet, .pq or .csv): {e}") from None
    runs = drop_duplicate_runs(runs)[0]  # a run id listed twice is one run, its newest row, as the fits read it
    inferred = "ensemble_size" not in runs.columns and "trial_id" in runs.columns
    if inferred:  # a trial's members share its wall_s: counted over every row of the trial, failed ones too
        runs = runs.assign(ensemble_size=runs.groupby("trial_id")["trial_id"].transform("size").astype(float))
    excluded: dict[str, int] = {}
    rows = len(runs)
    if "status" in runs.columns:
        off = runs.loc[runs["status"] != "ok", "status"]
        excluded = {("no status" if pd.isna(k) else str(k)): int(v) for k, v in off.value_counts(dropna=False).items()}
        runs = runs[runs["status"] == "ok"]
    one_corpus(runs, f"pilot {p}")  # two texts' runs are not one pilot, as the fits refuse them
    loss_name = "loss"  # the table's own name of the loss column, for messages
    if "loss" not in runs.columns and "final_val_loss" in runs.columns:
        runs, loss_name = runs.assign(loss=runs["final_val_loss"]), "final_val_loss"
    runs = with_layers_unique(runs)
    missing = [c for c in ("loss", *PILOT_COLUMNS) if c not in runs.columns]
    if missing:
        hint = " (loss may be named final_val_loss)" if "loss" in missing else ""
        raise ValueError(f"pilot {p} lacks column(s) {missing}{hint} (a loopscale runs.parquet has them)")
    loss = pd.to_numeric(runs["loss"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    if not np.isfinite(loss).all():  # as the fits: an ok run without a finite loss is a broken table, not a run
        bad = int((~np.isfinite(loss)).sum())
        raise ValueError(
            f"pilot {p}: column {loss_name!r} has {bad} NaN/inf value(s) among the runs whose status is 'ok' (the fits "
            "refuse such a table too): give them another status (e.g. 'diverged') or remove them"
        )
    if (loss <= 0).any():  # a loss in nats/token is > 0; the fits refuse such a table too
        rows = [str(x) for x in runs.loc[loss <= 0, "run_id"]] if "run_id" in runs.columns else []
        raise ValueError(
            f"pilot {p}: column {loss_name!r} must be > 0 (nats/token); {int((loss <= 0).sum())} ok run(s) have a "
            f"value <= 0{' (' + ', '.join(rows[:5]) + ')' if rows else ''}"
        )
    if runs["r"].nunique() < 2:
        raise ValueError(f"pilot {p} has ok runs at r={sorted(runs['r'].unique().tolist())} only; the joint law "
                         "taken as truth needs at least two values of r")
    if cell_noise(runs).empty:
        raise ValueError(f"pilot {p} has one seed per cell, so its seed noise cannot be measured; run the pilot "
                         "with seeds: 2 or more (e.g. seeds: 4)")
    runs = runs.copy()
    runs.attrs["excluded_by_status"] = excluded  # said by design(): the planned runs may lose seeds so too
    runs.attrs["rows"] = rows  # of the whole table (every variant), as the counts
    return runs


def pilot_variant(runs: pd.DataFrame, variant: str) -> pd.DataFrame:
    """The pilot rows of one variant's fit (:func:`loopscale.fit.analysis.variant_frames`, the frame `run` and `fit`
    fit): its own runs, with the baseline's r = 1 runs when it has none of its own (every variant's fit shares
    them), as the design predicts the fit of the spec's first variant. A pilot of one variant is returned as is.

    Raises:
        ValueError: the pilot has several variants but no looped run of ``variant``, or, once the other variants
            are left out, fewer than two r or no cell with two seeds.
    """
    from loopscale.fit.analysis import variant_frames
    from loopscale.fit.design import cell_noise

    if "variant" not in runs.columns or runs["variant"].nunique() <= 1:
        return runs
    have = sorted(str(v) for v in runs["variant"].unique())
    keep = variant_frames(runs).get(variant, runs.iloc[:0])
    if not ((keep["variant"].astype(str) == variant) & (keep["r"] > 1)).any():
        raise ValueError(f"the pilot holds variants {have} but no looped run of the spec's first variant "
                         f"{variant!r}, whose fit the design predicts (put that variant first in the spec)")
    if keep["r"].nunique() < 2 or cell_noise(keep).empty:
        raise ValueError(f"the pilot's runs of variant {variant!r} (and its r = 1 runs) have fewer than two r or "
                         "one seed per cell: the design cannot take its law and noise from them")
    return keep


def one_model_per_cell(runs: pd.DataFrame, pilot: str | Path) -> None:
    """Refuse a pilot whose cells, as the design matches them to planned ones (the columns of
    :data:`loopscale.fit.design.NOISE_KEYS` it has: r, unique layers, width, D), hold models of different size:
    their seed noise and FLOP/s would mix models (a ladder's plain models of several depths are one r = 1 cell
    without ``layers_unique``), and the per-r check's cell means would not be one model's.

    Raises:
        ValueError: naming the columns that would tell the models apart.
    """
    from loopscale.fit.design import NOISE_KEYS

    keys = [k for k in NOISE_KEYS if k in runs.columns and runs[k].notna().any()]  # a column of nulls tells none apart
    law = [c for c in ("N_once", "N_rec") if c in runs.columns]
    if not law or runs.empty or not keys or runs[[*keys, *law]].isna().any().any():
        return  # a value null on some runs only: the cells' own check names it ("fill in ... on those rows")
    per_cell = runs.groupby(keys)[law].nunique().to_numpy()
    if per_cell.size == 0 or int(per_cell.max()) <= 1:
        return
    # a column absent, or null on every run (it tells no cells apart), is one to fill in
    absent = [k for k in ("d_model", "layers_unique") if k not in runs.columns or runs[k].isna().all()]
    add = (f"add (or fill in) column(s) {absent}" + (" (or n_prelude, n_recur_block and n_coda, whose sum it is)"
                                         if "layers_unique" in absent else "") + ", as a loopscale runs.parquet has them"
           if absent else "check those columns: models of different N_once / N_rec share their values")  # fmt: skip
    raise ValueError(f"pilot {pilot}: runs of the same cell ({', '.join(keys)}) have different N_once / N_rec, so "
                     f"its seed noise and FLOP/s would mix models; {add}")


def _members(runs: pd.DataFrame, unknown: float = 1.0) -> pd.Series:
    """Members of each run's seed ensemble (1 for a single run): ``ensemble_size`` where the table records it, else
    the rows of the table with the run's ``trial_id``, else ``unknown`` (NaN to tell such runs apart)."""
    k = pd.Series(np.nan, index=runs.index)
    if "ensemble_size" in runs.columns:
        k = pd.to_numeric(runs["ensemble_size"], errors="coerce")
    if "trial_id" in runs.columns:
        k = k.fillna(runs.groupby("trial_id")["trial_id"].transform("size").astype(float))
    return k.fillna(unknown)


def pilot_training_gaps(spec, runs: pd.DataFrame) -> list[str]:
    """How the pilot's runs were trained otherwise than ``spec`` trains its runs, in the settings that change a
    run's FLOP/s and so the predicted time (empty: none known to differ).

    Compared: ``compiled`` with ``training.compile``, ``optimizer``, ``batch_tokens``, ``seq_len`` (the model's
    context length: attention's share of a step), ``tokenizer`` (the vocabulary: the output layer's), ``num_threads`` with
    ``resources.cpus``, and a pilot of single runs (:func:`_members`) for a spec of seed ensembles
    (``spec.ensemble_members()`` > 1; ensembles of another size are not compared: each candidate's seeds set its
    own; a table with neither ``ensemble_size`` nor ``trial_id`` does not say). A column the pilot lacks or holds only nulls for (a table
    written before it was recorded) is not compared.

    Args:
        spec: the :class:`loopscale.sweep.spec.SweepSpec` being designed. runs: the pilot's ok runs.
    Returns:
        One phrase per differing setting, e.g. ``"compile: the pilot trained eager, the spec compiles"``.
    """
    t = spec.training

    def seen(col: str) -> list:
        if col not in runs.columns:
            return []
        return sorted(runs[col].dropna().unique().tolist(), key=str)

    gaps = []
    if (c := seen("compiled")) and set(c) != {bool(t.compile)}:
        had = " and ".join("compiled" if bool(x) else "eager" for x in c)
        gaps.append(f"compile: the pilot trained {had}, the spec {'compiles' if t.compile else 'trains eager'}")
    seq_len = spec.tuning_model(spec.all_sizes()[0], spec.r[0]).seq_len  # the preset's when the spec leaves it out
    for col, want, name in (("optimizer", t.optimizer, "optimizer"), ("batch_tokens", t.batch_tokens,
                            "batch_tokens"), ("seq_len", seq_len, "seq_len"), ("tokenizer", spec.tokenizer,
                            "tokenizer"), ("num_threads", max(1, int(spec.resources.cpus)), "threads per run")):
        if (have := seen(col)) and set(map(str, have)) != {str(want)}:
            gaps.append(f"{name}: the pilot's {', '.join(map(str, have))}, the spec's {want}")
    known = _members(runs, unknown=np.nan).dropna()  # the runs whose table says how many seeds their trial held
    if (most := spec.ensemble_members()) > 1 and len(known) and known.max() == 1:
        gaps.append(f"seed ensembles: the pilot trained single runs, the spec up to {most} seeds per trial, so the "
                    "times assume no ensemble speed-up (an upper bound)")
    return gaps


def _rates(runs: pd.DataFrame) -> pd.DataFrame:
    """Training FLOP/s per run of every pilot cell: median over its seeds of ``k C / wall_s``, k the members of
    the run's seed ensemble (they share the trial's ``wall_s``; k = 1 for single runs): the run's
    ``ensemble_size`` where the table records it, else the rows of the table with its ``trial_id`` (which counts
    too few members in a pilot filtered to some of a trial's seeds), else 1."""
    from loopscale.fit.design import NOISE_KEYS

    keys = [k for k in NOISE_KEYS if k in runs.columns]
    k = _members(runs)
    rate = (k * runs["C"].astype(float) / runs["wall_s"].astype(float)).replace([np.inf, -np.inf], np.nan)
    t = runs.assign(rate=rate).dropna(subset=["rate"])
    t = t[t["rate"] > 0]
    if t.empty:
        raise ValueError("no pilot run has a positive finite C / wall_s (training FLOP/s)")
    return t.groupby(keys, sort=True)["rate"].median().reset_index()


def training_time_left(spec, records: pd.DataFrame, left, cpus: int, cores: int | None = None) -> dict | None:
    """Predicted training time of the grid cells ``left`` of ``spec`` (the runs left to train) on ``cpus`` CPUs,
    at the FLOP/s that the ok runs of ``records`` (a run folder's own records) trained at, as :func:`design` predicts
    a candidate's time (:data:`WALL_ASSUMPTION`): each run at its cell's measured rate (cell: r, unique layers, width, D), else the
    median of the cells measured at its r, else of all; a seed-ensemble trial the sum of its members' times;
    floor(cpus / resources.cpus) trials at once, longest first, :data:`OVERHEAD_S` added per trial. The sweep stage
    only: LR tuning and the fit are not counted, nor a trial's start-up beyond what its runs' ``wall_s`` holds.

    Args:
        records: run records with ``status``, ``C`` (FLOPs), ``wall_s`` (s), ``r``, ``d_model``, ``D`` and the
            layer counts (``runs.parquet``'s columns); rows without a positive finite ``C / wall_s`` are skipped.
        left: the grid cells still to train (:meth:`loopscale.sweep.spec.SweepSpec.cells`' items), grouped into
            trials as the sweep groups them. cpus: CPUs the sweep's trials share (>= 1). cores: the cores that
            run them, when known: Ray starts ``cpus // resources.cpus`` trials whatever the cores, but trials beyond
            the cores share them and train no faster in all, so the slots are ``min(cpus, cores) //
            resources.cpus`` (measured: ``--num-cpus 6`` on 2 cores took 27 s where 2 CPUs took 21 s).
    Returns:
        None when no ok record has a positive finite ``C / wall_s`` or no run is left; else a dict: ``seconds``,
        ``runs`` (left runs counted), ``trials``, ``slots`` (trials training at full speed at once),
        ``measured_runs`` (left runs whose own cell has a measured rate) and ``rate_runs`` (records the rates come
        from).
    """
    from loopscale.fit.design import match_cells, wall_time_s
    from loopscale.fit.io import with_layers_unique

    if records.empty or not left or not {"status", "C", "wall_s", "r", "d_model", "D"} <= set(records.columns):
        return None
    ok = with_layers_unique(records[records["status"] == "ok"])
    c = pd.to_numeric(ok["C"], errors="coerce")
    w = pd.to_numeric(ok["wall_s"], errors="coerce")
    ok = ok[np.isfinite(c) & np.isfinite(w) & (c > 0) & (w > 0)]
    if ok.empty:
        return None
    rates = _rates(ok)
    plan = planned_runs(spec, cells=left)
    rate, src = match_cells(plan, rates, "rate")
    per_trial = plan.assign(C=plan["C"] / rate).groupby("trial")["C"].sum().to_frame()  # seconds per trial
    slots = max(1, int(min(cpus, cores or cpus) // spec.resources.cpus))
    return dict(seconds=wall_time_s(per_trial, 1.0, slots, overhead_s=OVERHEAD_S), runs=len(plan),
                trials=len(per_trial), slots=slots, measured_runs=sum(x == "cell" for x in src),
                rate_runs=len(ok))  # fmt: skip


D_RTOL = 0.02
"""Relative tolerance when comparing token budgets (the trainer rounds D to whole batches)."""

TIE_SE = 2.0
"""Candidates whose ±phi exceeds the narrowest affordable one's by at most this many Monte-Carlo standard errors
of the difference (paired over the common draws) tie with it; among ties the one with the most runs is best."""

FEW_SIM = 20
"""Fewer simulated draws per candidate (``--n-sim``) than this are said in a warning: each half-width is then the
central 95 % range of so few refits that it, and the recommendation, move with ``--seed`` (the default is 40)."""


def pilot_coverage(plan: pd.DataFrame, runs: pd.DataFrame, measured_cells: int) -> list[str]:
    """What of the planned design the pilot does not cover (empty: it covers it).

    Four gaps: a planned token budget outside the pilot's range of D (beyond :data:`D_RTOL`; with a pilot of one
    D, any other D: there the law's B D^-beta is one fitted constant, so the pilot says nothing about how the loss
    moves with D), a planned width outside the pilot's range of ``d_model``, a planned r without a cell of two seeds
    or more in the pilot (its cells' noise then comes from other r's cells, and looped cells are about twice as
    noisy as plain ones: a pilot of r = 1, 8 predicted a phi interval half as wide as the full pilot's), and no
    planned cell measured by the pilot (its noise and speed then come from medians per r).

    Args:
        plan: planned runs (``D`` tokens, ``d_model``). runs: the pilot's runs (``D``, ``d_model`` if present).
        measured_cells: planned cells whose noise the pilot measured (noise source ``cell``).
    Returns:
        One phrase per gap.
    """
    gaps = []
    pd_, qd = np.unique(runs["D"].astype(float)), np.unique(plan["D"].astype(float))
    out_D = [D for D in qd if D < pd_.min() * (1 - D_RTOL) or D > pd_.max() * (1 + D_RTOL)]
    if out_D:
        have = (f"its one D = {pd_[0]:.3g} (B D^-beta is then one constant: the pilot cannot tell how the loss "
                "moves with D)") if pd_.size == 1 else f"its D = {pd_.min():.3g} to {pd_.max():.3g}"
        shown = (", ".join(f"{D:.3g}" for D in out_D) if len(out_D) <= 6 else  # the paper spec plans 116 D
                 f"{len(out_D)} values from {min(out_D):.3g} to {max(out_D):.3g}")  # fmt: skip
        gaps.append(f"planned D = {shown} outside the pilot's ({have})")
    if "d_model" in runs.columns and "d_model" in plan.columns:
        pw, qw = np.unique(runs["d_model"].astype(int)), np.unique(plan["d_model"].astype(int))
        out_w = [int(w) for w in qw if w < pw.min() or w > pw.max()]
        if out_w:
            gaps.append(f"planned widths d = {', '.join(map(str, out_w))} outside the pilot's d = "
                        f"{', '.join(map(str, pw.tolist()))}")
    from loopscale.fit.design import cell_noise

    noisy = set(cell_noise(runs)["r"].astype(int).tolist()) if "r" in runs.columns else set()
    if "r" in plan.columns and (no_r := sorted(set(plan["r"].astype(int)) - noisy)):
        gaps.append(f"planned r = {', '.join(map(str, no_r))} without a cell of two seeds or more in the pilot (it has "
                    f"r = {', '.join(map(str, sorted(noisy))) or 'none'}), so their seed noise is other r's (looped cells "
                    "are about twice as noisy as plain ones) and phi is extrapolated to them")  # fmt: skip
    if measured_cells == 0:
        gaps.append("none of the planned cells (r, unique layers, d_model, D) is in the pilot, so every cell's "
                    "noise and time per run are the pilot's medians per r")
    return gaps


def pilot_phi_per_r(runs: pd.DataFrame, seed: int = 0) -> tuple[pd.DataFrame | None, str | None]:
    """phi fitted per r to the pilot (the r = 1 runs with those of one r, cell means with seeds resampled within
    cells, with the resamples and starts of ``loopscale run``'s check: :func:`loopscale.fit.identify.rule_per_r`)
    and whether the intervals have no common value — the per-r test of
    :func:`loopscale.fit.identify.identify` that ``loopscale run`` applies.

    Args:
        runs: the pilot's ok runs (``loss``, ``N_once``, ``N_rec``, ``r``, ``D``, cell columns).
    Returns:
        ``(per_r, reason)``: :func:`loopscale.fit.identify.per_r_phi`'s table (None when the pilot lacks r = 1 or
        two r > 1 with enough runs, :func:`loopscale.fit.identify.per_r_fittable`) and the identification rule's sentence when the per-r intervals disagree, else None.
    """
    from loopscale.fit.identify import RULE_PER_R_B, RULE_PER_R_STARTS, per_r_disagree, rule_per_r

    strata = tuple(c for c in ("d_model", "r", "layers_unique", "D") if c in runs.columns)
    per_r = rule_per_r(runs, starts=RULE_PER_R_STARTS, B=RULE_PER_R_B, seed=seed, strata=strata)
    if per_r is None or not per_r[["lo", "hi"]].notna().all().all():
        return per_r, None
    return per_r, per_r_disagree(per_r)


def choose_best(candidates: list[dict], draws: dict[str, tuple], n_sim: int, seed: int) -> str | None:
    """The recommended candidate: among those that fit, the narrowest ±phi and every candidate tied with it —
    whose ±phi exceeds it by at most :data:`TIE_SE` Monte-Carlo standard errors of the difference, from a paired
    bootstrap over the draws the candidates share (:func:`loopscale.fit.design.boot_index`) — and among the ties
    the one with the most runs (more seeds never widen the true interval), then the narrower.

    Sets ``tie`` (bool: tied with the narrowest affordable candidate) and ``diff_se`` (the standard error of its
    difference to it) on every candidate that fits. Returns the best label, None when none fits.
    """
    from loopscale.fit.design import boot_half_widths, boot_index

    ok = [c for c in candidates if c["fits"] and math.isfinite(c["phi_half_width"])]
    if not ok:
        return None
    narrow = min(ok, key=lambda c: (c["phi_half_width"], -c["runs"]))
    idx = boot_index(n_sim, seed)
    ref = boot_half_widths(np.asarray(draws[narrow["seeds"]]), idx)
    for c in ok:
        diff = boot_half_widths(np.asarray(draws[c["seeds"]]), idx) - ref
        se = float(np.nanstd(diff, ddof=1)) if np.isfinite(diff).sum() >= 2 else math.nan
        c["diff_se"] = 0.0 if c is narrow else se
        c["tie"] = c is narrow or (math.isfinite(se) and c["phi_half_width"] - narrow["phi_half_width"] <= TIE_SE * se)
    return max((c for c in ok if c["tie"]), key=lambda c: (c["runs"], -c["phi_half_width"]))["seeds"]


def design(
    spec,
    pilot: str | Path,
    *,
    minutes: float,
    cpus: int = 2,
    seeds: tuple[int | str, ...] = DEFAULT_SEEDS,
    n_sim: int = 40,
    starts: int = 20,
    fit_starts: int = 100,
    seed: int = 0,
    progress: Callable[[str, int, int, int], None] | None = None,
) -> dict[str, Any]:
    """Predict every candidate's half-widths and training time; the result of ``loopscale design --json``.

    Args:
        spec: the :class:`loopscale.sweep.spec.SweepSpec` whose seed count varies.
        pilot: a ``runs.parquet`` with >= 2 seeds in some cell and >= 2 values of r.
        minutes: time budget of the training (sweep stage), minutes. cpus: CPUs of the machine.
        seeds: the candidates besides the spec as written: ``k`` (k seeds in every cell) or ``"k1/kL"`` (k1 seeds
            in the plain r = 1 cells, kL in the looped ones). n_sim: simulated draws per candidate. starts: starts
            per refit.
        fit_starts: starts of the fit to the pilot. seed: RNG seed (>= 0).
        progress: called as ``progress(label, runs, index, total)`` before candidate ``index`` (0-based, of
            ``total``) is expanded and simulated: its label (e.g. ``"16"``, ``"16/32"``) and its planned runs, counted
            beforehand from the one-seed plan (cells per r times seeds per r), so a huge seed count is named before
            its expansion starts. It changes nothing in the result.
    Returns:
        JSON-ready dict: ``truth`` (pilot's joint law; ``on_bound``: its parameters on the search-box edge, B and
        beta left out for a pilot of one D, where only B D^-beta is fitted),
        ``warnings`` (a truth with parameters on that edge: the pilot does not pin the law down; a pilot that does
        not cover the planned D, widths or cells, :func:`pilot_coverage`; a pilot whose phi per r disagrees,
        :func:`pilot_phi_per_r`), ``pilot_phi_per_r`` (r, phi, lo, hi), ``cells`` (noise
        and throughput per planned cell with their sources), ``assumptions``, ``candidates`` (best first: ``seeds``
        (a label: ``"16"``, ``"16/32"``), ``seeds_per_r``, ``runs``, ``trials``, ``wall_min``, ``fits``,
        ``refused`` (why ``loopscale run`` would refuse it, :func:`loopscale.sweep.run.check_design`, else None: such
        a candidate is timed, not simulated, and never fits),
        ``phi_half_width`` with its Monte-Carlo standard error ``phi_half_width_se``, ``r_phi_half_width``,
        ``worth_true``, ``worth_half_width`` (``worth_half_width_se``), ``tie``/``diff_se`` for those that fit,
        ...) and ``best`` (:func:`choose_best`'s label; None when none fits, or a warning says the predictions do
        not hold: parameters on the edge, a pilot that does not cover the design, or phi per r disagreeing in a
        spec without a ladder).
    Raises:
        ValueError / FileNotFoundError: bad arguments or pilot (before any simulation), e.g. a pilot of fewer cells
            than the joint law's parameters, or one whose cells hold models of several sizes
            (:func:`one_model_per_cell`).
    """
    from loopscale.fit.design import (
        MC_BOOT,
        DesignPrediction,
        cell_noise,
        design_cell_means,
        has_ladder,
        match_cells,
        simulate_design,
        wall_time_s,
    )
    from loopscale.fit.fitter import fit_law
    from loopscale.fit.laws import make_law
    from loopscale.sweep.run import check_design
    from loopscale.sweep.spec import parse_spec

    if not (isinstance(minutes, (int, float)) and math.isfinite(minutes) and minutes > 0):
        raise ValueError(f"--minutes must be a positive finite number of minutes (the training time budget), "
                         f"got {minutes}")
    if cpus < 1:
        raise ValueError(f"--cpus must be >= 1, got {cpus}")
    if cpus < spec.resources.cpus:  # no trial would start: the sweep gives each trial resources.cpus CPUs
        raise ValueError(f"--cpus {cpus} is fewer than the CPUs each trial takes (resources.cpus = "
                         f"{spec.resources.cpus:g}), so no trial would start on that machine; give the --cpus of "
                         "the machine the sweep runs on, or a spec whose resources.cpus fits it")  # fmt: skip
    if seed < 0:  # numpy's generators refuse it later with a message that names no option
        raise ValueError(f"--seed must be >= 0 (the simulation's RNG seed), got {seed}")
    layouts = [_seed_layout(x, spec.r) for x in seeds]
    if n_sim < 2:
        raise ValueError(f"--n-sim must be >= 2, got {n_sim}")
    first = spec.variants[0].name
    runs = pilot_variant(read_pilot(pilot), first)
    one_model_per_cell(runs, pilot)
    means, n_params = design_cell_means(runs), make_law("joint").n_params
    if len(means) < n_params:
        raise ValueError(
            f"pilot {pilot} has {len(means)} cells (r, unique layers, d_model, D), fewer than the joint law's "
            f"{n_params} parameters, so no law can be taken as truth from its cell means; use a pilot with more "
            "cells: widths, token budgets, r or ladder depths (e.g. this spec itself at a few seeds)"
        )
    truth = fit_law(means, law="joint", starts=fit_starts, seed=seed)
    warnings, blocking = [], False
    # with one token budget B D^-beta is one constant: B and beta trade off freely, and an edge there is harmless
    one_D = "D" in runs.columns and runs["D"].nunique() < 2
    edge = [p for p in truth.on_bound if not (one_D and p in ("B", "beta"))]
    if edge:
        warnings.append(
            f"the law fitted to the pilot's {truth.n} cell means has {', '.join(edge)} on the fitter's "
            "search-box edge: the pilot does not pin the law down, so the half-widths simulated from it predict "
            "nothing (they need not even shrink with more seeds) and no candidate is recommended; use a pilot "
            "with more cells (widths, token budgets, r or ladder depths)"
        )
        blocking = True
    if truth.r2 < 0:  # worse than a constant: said in its own words (the edge warning above gave only its symptom)
        warnings.append(
            f"the law fits the pilot's {truth.n} cell means worse than their mean does (R² {truth.r2:.3f}): its "
            "losses do not follow the law over the pilot's sizes, r and D (e.g. the loss rising with depth or width "
            "after too little training), so nothing simulated from that fit predicts the planned grid; no candidate "
            "is recommended"
        )
        blocking = True
    noise, rates = cell_noise(runs), _rates(runs)
    if excluded := runs.attrs.get("excluded_by_status"):
        n_ex = sum(excluded.values())
        warnings.append(
            f"{n_ex} of the pilot's {runs.attrs.get('rows', n_ex + len(runs))} runs are not ok ("
            + ", ".join(f"{k}: {v}" for k, v in sorted(excluded.items())) + ") and are left out; the planned runs "
            "may lose seeds so too, which widens their intervals beyond these predictions"
        )
    if trained := pilot_training_gaps(spec, runs):
        learns = [g.split(":")[0] for g in trained if g.startswith(("optimizer:", "batch_tokens:", "seq_len:",
                                                                     "tokenizer:"))]  # fmt: skip
        warnings.append(
            "the pilot's runs were trained otherwise than this spec's: " + "; ".join(trained) + ". The predicted "
            "times, and so which candidates fit the minutes, come from the pilot's FLOP/s and are off by what these "
            "settings change"
            + (f"; {' and '.join(learns)} also change what a run learns, so the law and the seed noise the "
               "half-widths are simulated from are another training's too" if learns else "")
            + "; take a pilot trained with the spec's training settings"
        )
    slots = max(1, int(cpus // spec.resources.cpus))
    candidates, cells, seen, draws = [], [], set(), {}
    own = {r: len(spec.seeds_for(r)) for r in spec.r}
    todo = []  # the distinct layouts, the spec as written first
    for layout in [own, *layouts]:
        key = tuple(sorted(layout.items()))
        if key not in seen:
            seen.add(key)
            todo.append(layout)
    cells_per_r = {}
    if progress is not None:  # the runs of a candidate are its one-seed plan's cells per r times its seeds per r
        one = planned_runs(parse_spec({**spec.model_dump(mode="python"), "seeds": {r: 1 for r in spec.r}}))
        cells_per_r = _first_variant_fit(one, first).groupby("r").size().to_dict()
    for index, layout in enumerate(todo):
        if progress is not None:
            progress(_label(layout), sum(int(n) * layout[r] for r, n in cells_per_r.items()), index, len(todo))
        cand = parse_spec({**spec.model_dump(mode="python"), "seeds": layout})
        try:  # a design `loopscale run` refuses (e.g. one D and one seed: no interval) is timed, not simulated
            check_design(cand)
            refused = None
        except ValueError as e:
            refused = re.sub(r"(;| \()\s*nothing was trained\)?$", "", str(e))  # said of `run`, not of a design
        full = planned_runs(cand)  # every run the sweep trains: all variants count for the time
        plan = _first_variant_fit(full, first)
        plan["noise_sd"], noise_src = match_cells(plan, noise, "sd")
        if not cells:
            rate, rate_src = match_cells(plan, rates, "rate")
            plan_src = plan.assign(noise_source=noise_src, rate=rate, rate_source=rate_src)
            keys = ["r", "layers_unique", "d_model", "D"]
            first_rows = plan_src.drop_duplicates(keys).sort_values(["r", "layers_unique"], ascending=[True, False])
            cells = [
                dict(r=int(x.r), layers_unique=int(x.layers_unique), d_model=int(x.d_model), D=float(x.D),
                     noise_sd=float(x.noise_sd), noise_source=x.noise_source, s_per_run=float(x.C / x.rate),
                     rate_source=x.rate_source)
                for x in first_rows.itertuples()
            ]
        # another variant's run trains at the FLOP/s its cell (r, unique layers, width, D) has in the pilot, on its
        # own FLOPs (truncated BPTT's fewer, hyperconnections' more)
        full_rate, _ = match_cells(full, rates, "rate")
        per_trial = full.assign(C=full["C"] / full_rate).groupby("trial")["C"].sum().to_frame()  # s per trial
        wall = wall_time_s(per_trial, 1.0, slots, overhead_s=OVERHEAD_S)
        if refused is None:
            pred = simulate_design(plan, truth.params, n_sim=n_sim, starts=starts, seed=seed)
        else:
            nan = float("nan")
            pred = DesignPrediction(n_runs=len(plan), n_sim=n_sim, n_ok=0, phi_true=float(truth.params["phi"]),
                                    phi_half_width=nan, phi_sd=nan, phi_bias=nan, on_bound_frac=nan,
                                    phi_draws=(nan,) * n_sim)  # fmt: skip
        draws[_label(layout)] = pred.phi_draws
        candidates.append({"seeds": _label(layout), "seeds_per_r": {str(r): k for r, k in layout.items()},
                           "spec_as_written": layout == own, "runs": len(full), "trials": int(full["trial"].nunique()),
                           "runs_fitted": len(plan), "wall_min": wall / 60.0,
                           "fits": refused is None and wall <= minutes * 60.0, "refused": refused, **pred.to_dict()})
    refusals: dict[str, list[str]] = {}
    for c in candidates:
        if c["refused"]:
            refusals.setdefault(c["refused"], []).append(c["seeds"] + " (the spec as written)" * c["spec_as_written"])
    for why, labels in refusals.items():
        if len(labels) == len(candidates) > 1 and "one seed" not in why:  # not a matter of seeds: the spec itself
            warnings.append(f"`loopscale run` would refuse this spec at every seed count tried: {why}; no candidate "
                            "is simulated")
            continue
        warnings.append(f"`loopscale run` would refuse seeds {', '.join(labels)} per cell: {why}; "
                        f"{'that candidate is' if len(labels) == 1 else 'those candidates are'} not simulated")
    warnings.extend(worth_warnings(candidates))
    if len(spec.variants) > 1:
        warnings.append(
            f"this spec trains {len(spec.variants)} variants ({', '.join(v.name for v in spec.variants)}): runs, "
            f"trials and times count all of them, while the half-widths are those of the first variant's fit "
            f"({first}, with the r = 1 runs); the other variants' runs take the FLOP/s the pilot measured in their "
            "cell (r, unique layers, width, D)"
        )
    gaps = pilot_coverage(plan_src, runs, sum(c["noise_source"] == "cell" for c in cells))
    if gaps:
        warnings.append(
            "the pilot does not cover the planned design: " + "; ".join(gaps) + ". The law fitted to it is "
            "extrapolated there and the half-widths and times predict nothing, so no candidate is recommended; "
            "take a pilot of this spec itself (the same widths, D, r and ladder at a few seeds, e.g. seeds: 4)"
        )
        blocking = True
    if plan_src["D"].nunique() > 1:  # the fit stage averages seeds into cells only at one D (analysis._seed_strata)
        warnings.append(
            f"this spec's runs train for {plan_src['D'].nunique()} different token counts D (several token or FLOP "
            "budgets): `loopscale run` fits the joint law to every run "
            "there (block bootstrap over (budget, r) cells: FLOP budgets, or D for token budgets), while this "
            "design refits each draw's cell means: its "
            "half-widths describe the cell-mean fit, not the interval `run` will report, which can differ from them"
        )
    ladder = has_ladder(plan_src)
    # phi on the edge of the pilot's own fit: the warning above already says no phi is pinned down, and fitting phi
    # per r to such a pilot (slow: a flat law) adds nothing
    per_r, disagree = pilot_phi_per_r(runs, seed=seed) if "phi" not in edge else (None, None)
    if disagree:
        warnings.append(
            "the pilot's runs do not identify one phi the way `loopscale run` checks it: " + disagree + "; ±φ is "
            "then the predicted precision of a number the fit may refuse to report ('phi not identified')"
            + (", while the worth in unique layers, read per r off the ladder, stays meaningful (the ±worth "
               "columns; candidates are still ranked by ±φ)" if ladder else
               ", and this spec has no ladder to report a worth instead, so no candidate is recommended")
        )
        blocking = blocking or not ladder
    if n_sim < FEW_SIM:
        warnings.append(f"--n-sim {n_sim}: each half-width is the central 95 % range of {n_sim} refits, so it and "
                        "the recommendation move with --seed (by about their Monte-Carlo error, se, or more); take "
                        "--n-sim 40 (the default) or more for a design to run")  # fmt: skip
    best = choose_best(candidates, draws, n_sim, seed)
    best = None if blocking else best
    candidates.sort(key=lambda c: (c["seeds"] != best, not c["fits"], _nan_last(c["phi_half_width"]), -c["runs"]))
    return {
        "spec": spec.name,
        "pilot": str(pilot),
        "pilot_runs": int(len(runs)),
        "minutes": float(minutes),
        "cpus": int(cpus),
        "slots": slots,
        "variant": first,
        "truth": {**truth.params, "r2_cell_means": truth.r2, "n_cells": truth.n, "on_bound": edge},
        "warnings": warnings,
        "pilot_phi_per_r": [] if per_r is None else per_r[["r", "phi", "lo", "hi"]].to_dict("records"),
        "assumptions": {
            "wall_time": WALL_ASSUMPTION,
            "noise": "per-run loss = law + N(0, sd of its cell) in nats/token; each cell averaged over its seeds "
            "and the joint law refitted to the cell means; sd measured between the pilot's seeds of the same "
            "(r, unique layers, d_model, D), else the pilot's median sd at that r (of all its cells where that r has none)",
            "half_width": "half the central 95 % range of the refits over the simulated draws; its Monte-Carlo "
            f"standard error (se) is the SD of that half-width over {MC_BOOT} bootstrap resamples of the draws; "
            "every candidate's draw i uses the same normal deviates for the seeds it shares with the others "
            "(common random numbers)",
            "best": "among the candidates that fit, the narrowest ±φ and those within "
            f"{TIE_SE:g} Monte-Carlo standard errors of it (of the difference, paired over the common draws) tie; "
            "the tie with the most runs is best (more seeds never widen the true interval)",
            "worth": "each looped model placed on the plain ladder of its width and budget in every draw, as the "
            "report does" if ladder else "not predicted: the spec has no unique-depth ladder (ladder: "
            "with two or more plain depths at every width and budget of the looped models)",
        },
        "cells": cells,
        "n_sim": n_sim,
        "candidates": candidates,
        "best": best,
        "withheld": blocking,
    }


def worth_warnings(candidates: list[dict]) -> list[str]:
    """The warnings on the worth in unique layers from the candidates' ``worth_note`` (``seeds`` their labels, the
    spec as written first). A note on the truth's own ladder (it does not fall with depth, or falls by less than
    twice a rung's standard error) is said once, with the first candidate's numbers; a note on a candidate's own
    draws (:data:`loopscale.fit.design.LEAVES_LADDER`: intervals that leave the ladder) is said with the
    candidates it is of. With more than one note, each names its candidates (``"seeds 8, 16: ..."``)."""
    from loopscale.fit.design import LEAVES_LADDER

    truth_note, truth_of, leave = None, [], {}
    for c in candidates:
        note = c.get("worth_note")
        if note and LEAVES_LADDER in note:
            leave.setdefault(note, []).append(str(c["seeds"]))
        elif note:
            truth_note, truth_of = truth_note or note, [*truth_of, str(c["seeds"])]
    notes: dict[str, list[str]] = {**({truth_note: truth_of} if truth_note else {}), **leave}
    return [note if len(notes) == 1 else f"seeds {', '.join(of)}: {note}" for note, of in notes.items()]


def _seed_layout(x: int | str, rs: list[int]) -> dict[int, int]:
    """Seeds per r of a ``--seeds`` entry: ``k`` (every cell) or ``"k1/kL"`` (plain r = 1 cells / looped cells).

    Raises:
        ValueError: not of that form, or a count < 1.
    """
    parts = str(x).strip().split("/")
    try:
        ks = [int(p) for p in parts]
    except ValueError:
        ks = []
    if len(ks) not in (1, 2) or min(ks) < 1:
        raise ValueError(f"--seeds entries must be k or k1/kL with counts >= 1 (e.g. 16 or 16/32), got {x!r}")
    return {r: ks[0] if r == 1 or len(ks) == 1 else ks[1] for r in rs}


def _label(layout: dict[int, int]) -> str:
    """``"16"`` when every r has the same seeds, else ``"16/32"`` (r = 1 / looped) or ``"r1:16 r2:32 ..."``."""
    ks = set(layout.values())
    if len(ks) == 1:
        return str(ks.pop())
    looped = {k for r, k in layout.items() if r > 1}
    if len(looped) == 1 and 1 in layout:
        return f"{layout[1]}/{looped.pop()}"
    return " ".join(f"r{r}:{k}" for r, k in sorted(layout.items()))


def _nan_last(x: float) -> float:
    return x if math.isfinite(x) else math.inf


def _fmt(x: float, nd: int = 3) -> str:
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _no_best(res: dict) -> str:
    """Why :func:`design` names no best candidate: none fits in the minutes (with the quickest one's time), or a
    warning above says no candidate is recommended."""
    fit = [c for c in res["candidates"] if c["fits"]]
    allowed = [c for c in res["candidates"] if not c.get("refused")]
    if res.get("withheld"):
        return "none: see the warning above (no candidate is recommended)"
    if not allowed:
        return "none: `loopscale run` would refuse every candidate (see the warning above)"
    if not fit:
        quickest = min((c["wall_min"] for c in allowed), default=math.nan)
        return f"none: no candidate fits in {res['minutes']:g} min (the quickest needs {quickest:.1f} min)"
    return "none: see the warning above (no candidate is recommended)"


def _console(*tables):
    """The console that prints ``tables``: on a terminal rich's own (its width, today's look); otherwise (piped,
    redirected, captured) at least as wide as the widest table needs, so no cell is cut to ``…`` — rich falls back
    to 80 columns (or ``$COLUMNS``) when it cannot ask a terminal."""
    from rich.console import Console
    from rich.measure import Measurement

    con = Console()
    if con.is_terminal:
        return con
    wide = con.options.update(width=10_000)
    need = max((Measurement.get(con, wide, t).maximum for t in tables), default=0)
    return con if need <= con.width else Console(width=need)


def print_design(res: dict[str, Any]) -> None:
    """The rich table of :func:`design`'s result, best candidate first, with the assumptions under it.

    On a terminal the tables take the terminal's width; piped or redirected, the console is widened to the
    tables' natural width (:func:`_console`), so numbers and the ``*`` of the spec as written are never cut."""
    from rich.table import Table

    t = res["truth"]
    cells = Table(title="planned cells: seed noise and time per run from the pilot")
    for col in ("r", "layers", "d", "D", "seed SD", "noise from", "s/run", "time from"):
        cells.add_column(col, justify="right")
    for c in res["cells"]:
        cells.add_row(str(c["r"]), str(c["layers_unique"]), str(c["d_model"]), f"{c['D']:.3g}",
                      f"{c['noise_sd']:.4f}", c["noise_source"], f"{c['s_per_run']:.1f}", c["rate_source"])
    rs = sorted({int(r) for c in res["candidates"] for r in c["r_phi_half_width"]})
    worth_keys = sorted({k for c in res["candidates"] for k in c["worth_half_width"]}, key=str)
    tab = Table(title=f"candidates, best first (budget {res['minutes']:g} min on {res['cpus']} CPU"
                      f"{'s' * (res['cpus'] != 1)}, {res['slots']} trial{'s' * (res['slots'] != 1)} at once, a trial "
                      f"a run or a seed ensemble; {res['n_sim']} simulated draws each)")  # fmt: skip
    for col in ("seeds", "runs", "min", "fits", "±φ", "se", *[f"±{r}^φ" for r in rs],
                *[f"±worth r={k}" for k in worth_keys]):  # fmt: skip
        tab.add_column(col, justify="right")
    ties = sum(bool(c.get("tie")) for c in res["candidates"])  # the narrowest is one of them when another ties
    for c in res["candidates"]:  # no "tie" where nothing is recommended (a warning withheld it): a tie with nothing
        tie = c.get("tie") and ties > 1 and res["best"] is not None
        fits = ("yes, tie" if tie else "yes") if c["fits"] else "run refuses" if c.get("refused") else "no"
        tab.add_row(
            c["seeds"] + ("*" if c["spec_as_written"] else ""), str(c["runs"]), f"{c['wall_min']:.1f}", fits,
            _fmt(c["phi_half_width"]), _fmt(c.get("phi_half_width_se", math.nan)),
            *[_fmt(c["r_phi_half_width"].get(str(r), math.nan)) for r in rs],
            *[_fmt(c["worth_half_width"].get(str(k), math.nan), 2) for k in worth_keys],
        )
    con = _console(cells, tab)
    con.print(
        f"[bold]{res['spec']}[/]: truth = joint law fitted to the cell means of {res['pilot']} "
        f"({res['pilot_runs']} runs, {t['n_cells']} cells, R² {t['r2_cell_means']:.3f}): phi = {t['phi']:.3f}"
    )
    con.print(cells)
    con.print(tab)
    con.print("±: predicted 95 % half-width (worth in unique layers; seed SD in nats/token); se: Monte-Carlo "
              "standard error of ±φ (bootstrap over the draws)")
    best = res["best"]
    if best is not None:  # the rule of the ties shown; withheld, no candidate is marked
        con.print(f"best: among the candidates that fit, the narrowest ±φ and those within {TIE_SE:g} se of it (the "
                  "difference's, paired over common draws) tie ('yes, tie'); the tie with the most runs is best")
    for w in res.get("warnings") or []:
        con.print(f"[bold yellow]warning:[/] {w}")
    con.print(f"best within {res['minutes']:g} min: " + (f"{best} seeds per cell" if best else _no_best(res)))
    con.print("[dim]seeds k1/kL: k1 per plain r = 1 cell, kL per looped cell; * the spec as written[/]")
    for k, v in res["assumptions"].items():
        con.print(f"[dim]{k}: {v}[/]")


def _design_with_progress(spec, pilot, **kw) -> dict[str, Any]:
    """:func:`design` with a progress display on stderr naming the candidate being simulated and its planned runs
    (a huge ``--seeds`` count expands millions of runs, for minutes). Transient: it is erased when done, and shows
    nothing when stderr is not a terminal (piped, redirected, captured)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    con = Console(stderr=True)  # disabled off a terminal: rich's Progress then still prints an empty line
    with Progress(*columns, transient=True, console=con, disable=not con.is_terminal) as bar:
        task = bar.add_task("fitting the pilot", total=None)

        def progress(label: str, runs: int, index: int, total: int) -> None:
            bar.update(task, description=f"candidate {label} seeds/cell ({runs:,} runs)", completed=index, total=total)

        return design(spec, pilot, progress=progress, **kw)


#: Why ``design --out`` waits for a command working in its folder (:func:`loopscale.sweep.status.refuse_busy_folder`).
_BUSY_WHY = ("it writes the folder's spec.yaml and a prediction that the run's report would then show as made "
             "before its runs")


def _refuse_trained_folder(out: Path) -> None:
    """Refuse ``design --out`` into a folder that holds recorded runs: a design predicts a run before it trains,
    and the folder's report sets its prediction beside the runs as the one they were designed by, so a prediction
    made afterwards (other draws, another pilot) would replace that one there. Raises ValueError; nothing is
    changed."""
    from loopscale.sweep.store import ResultsStore

    if not ((out / "runs.parquet").exists() or (out / "parts").is_dir()):
        return
    n = len(ResultsStore(out).recorded())
    if not n:
        return
    kept = f" (its prediction, {DESIGN_PREDICTION}, stays as it is)" if (out / DESIGN_PREDICTION).is_file() else ""
    raise ValueError(
        f"--out {out} holds {n} trained run{'s' * (n != 1)}: a design predicts a run before it trains, and that "
        f"folder's report would show this prediction beside them as the one they were designed by{kept}; write "
        "this prediction to a new folder (--out OTHER), or to the folder of the run it is for before that trains"
    )


def design_cmd(
    spec_path: SpecArg = None,
    preset: PresetOpt = None,
    pilot: Path = typer.Option(..., "--pilot", help="runs.parquet (or .csv, or the run folder) of a pilot or a previous run (>= 2 seeds/cell)."),
    minutes: float = typer.Option(..., "--minutes", help="Training time budget in minutes (sweep stage)."),
    cpus: int = typer.Option(2, "--cpus", min=1, help="CPUs of the machine that will run the sweep."),
    seeds: str = typer.Option(
        ",".join(map(str, DEFAULT_SEEDS)),
        "--seeds",
        help="Candidates besides the spec as written: seeds per cell, k or k1/kL (plain/looped), e.g. 8,16,16/32.",
    ),
    n_sim: int = typer.Option(40, "--n-sim", min=2, help="Simulated draws per candidate."),
    starts: int = typer.Option(20, "--starts", min=1, help="Multi-starts per refit."),
    seed: int = typer.Option(0, "--seed", min=0, help="RNG seed of the simulation."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    out: Path | None = typer.Option(
        None, "--out", help="Also write the prediction to OUT/design_prediction.json (the run folder of "
        "`loopscale run --out OUT`: its report then sets the predicted half-widths next to the achieved ones; an "
        "earlier prediction there is moved to OUT/earlier_design_<UTC time>/) and records the spec there, as `run` "
        "does; a folder of another spec, or one holding trained runs, is refused before anything is simulated (one "
        "holding only a design prediction takes this spec with other seeds; `run` there then takes any seeds the "
        "design simulated).",
    ),  # fmt: skip
) -> None:
    """Predict, from a pilot, each candidate design's phi / r^phi / worth-in-layers half-widths and training time."""
    from loopscale.fit.outputs import json_safe
    from loopscale.sweep.presets import resolve_spec

    spec, _ = resolve_spec(spec_path, preset)
    entries = re.split(r"\s*,\s*|\s+", seeds.strip())  # "8,16", "8, 16" and "8 16" alike
    if any(not x for x in entries) and seeds.strip():  # `--seeds 8,,16` or `,,`: a typo, not "no candidates"
        raise ValueError(f"--seeds {seeds}: an empty entry; give counts k or k1/kL separated by commas, e.g. "
                         "8,16,16/32 (the spec as written is always a candidate)")
    counts = tuple(x for x in entries if x)
    if out is not None:  # before simulating: a file in the way, or a folder of another spec, which would show this
        # prediction as its own
        from loopscale.cluster.options import usable_out_dir
        from loopscale.sweep.spec import check_folder_spec

        usable_out_dir(out)
        from loopscale.sweep.status import OWN_MARKS, refuse_busy_folder, refuse_foreign_files

        refuse_busy_folder(out, "`loopscale design --out`", why=_BUSY_WHY)

        if (out / "fit.json").is_file() and not any((out / m).exists() for m in OWN_MARKS):
            raise ValueError(f"--out {out} holds a `loopscale fit` output (fit.json): the prediction is for the folder "
                             "a `loopscale run` will train in; give a new folder (or that run's --out)")  # fmt: skip
        refuse_foreign_files(out)  # someone else's report.md there, which the run would replace
        check_folder_spec(out, spec, any_seeds=True)  # a folder of this design alone may change its seeds
        _refuse_trained_folder(out)
    res = _design_with_progress(spec, pilot, minutes=minutes, cpus=cpus, seeds=counts, n_sim=n_sim, starts=starts,
                                seed=seed)
    if out is not None:
        from loopscale.cluster.storage import write_text_atomic
        from loopscale.sweep.spec import record_folder_spec
        from loopscale.sweep.status import refuse_busy_folder

        refuse_busy_folder(out, "`loopscale design --out`", why=_BUSY_WHY)  # one may have started while it simulated
        out.mkdir(parents=True, exist_ok=True)
        # `loopscale run --out OUT` then refuses any other spec there, but for this one with other seeds the design
        # simulated (its recommendation, say)
        record_folder_spec(out, spec, any_seeds=True)
        if (out / DESIGN_PREDICTION).is_file():  # an earlier prediction is kept (the report reads the newest)
            from loopscale.cluster.storage import new_aside_folder

            aside = new_aside_folder(out, "earlier_design")
            (out / DESIGN_PREDICTION).replace(aside / DESIGN_PREDICTION)
            print(f"moved the earlier {DESIGN_PREDICTION} to {aside}", file=sys.stderr)
        write_text_atomic(str(out / DESIGN_PREDICTION), json.dumps(json_safe(res), indent=1))
    if as_json:
        typer.echo(json.dumps(json_safe(res)))
    else:
        print_design(res)
