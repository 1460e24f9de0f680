"""Variant comparison: Δφ between architectures (truncated BPTT, hyperconnections, ...) with a paired bootstrap CI.

Each ``variant`` of the table is fitted with the joint law (paper §5 case studies, Table 3). A variant without ``r = 1``
runs borrows the baseline's ``r = 1`` rows (the paper reuses its r = 1 runs for every case study), so its phi is
measured against the same anchor. The paired bootstrap draws cells ``(budget, r)`` (or the ``block_by`` columns) from
the union of all variants' cells, with ``default_rng([seed, k])`` for resample ``k``; every variant takes its rows in
the drawn cells, so shared cells (e.g. the r = 1 anchor) enter all variants jointly. A draw degenerate for any variant
(single r, single budget, too few runs) is redrawn and counted.

A grid of one D with seeds per cell (seed replicates, as the ``cpu`` preset's) is compared as each variant's own fit
treats it: every variant fitted to its cell means (to its runs when it has fewer cells than the law's parameters),
and every paired draw resamples the seeds within each cell, every cell drawn alike for all variants (the same seeds
of the variants' runs of one cell, and of the r = 1 runs they share).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.bootstrapping import (
    _notify_result,
    bootstrap_phase,
    cell_ids,
    cell_mean_draws,
    percentile_ci,
    refit_weights,
)
from loopscale.fit.fitter import check_fit_args, fit_data
from loopscale.fit.io import default_block_by, prepare, read_table, shared_r1
from loopscale.fit.laws import make_law


@bootstrap_phase("variants")
def compare_variants(
    table: Any,
    baseline: str | None = None,
    B: int = 200,
    block_by: tuple[str, ...] | None = None,
    seed: int = 0,
    starts: int = 500,
    workers: int | None = None,
    address: str | None = None,
    delta: float = 1e-3,
    level: float = 0.95,
    share_r1: bool = True,
    **kwargs: Any,
) -> dict[str, Any]:
    """Fit phi per ``variant`` and report Δφ = φ_variant − φ_baseline with a paired block-bootstrap CI.

    Args:
        table: runs with a ``variant`` column plus the joint-law columns (see :func:`loopscale.fit.fitter.fit_law`).
        baseline: baseline variant name (default ``"baseline"`` if present, else the first in sorted order).
        B: paired resamples (0: the point fits' Δφ, no interval). block_by: cell columns (default ``(budget, r)`` / ``(C, r)`` / ``(D, r)``).
        seed, starts, workers, address, delta: as :func:`loopscale.fit.bootstrapping.bootstrap`.
        share_r1: a variant without r = 1 rows borrows the baseline's r = 1 rows (without any, those of the one
            variant that has r = 1 rows only, e.g. labelled 'plain', which is then no variant of the comparison:
            as :func:`loopscale.fit.analysis.variant_frames` lends them to each variant's own fit).
    Returns:
        dict: ``baseline``; ``fits`` {variant: FitResult.to_dict()}; ``comparisons`` {variant: {``phi``,
        ``delta_phi``, ``ci`` [lo, hi], ``frac_delta_le_0`` (share of ok resamples with Δφ <= 0), ``n_ok``, and
        ``no_interval`` (why) when no draw is left}}; ``block_by`` (None for seed replicates, then
        ``stratify_by``, the cell columns the seeds are resampled within, and ``cell_means`` {variant: fitted to
        its cell means}); ``n_degenerate``; ``n_failed``; ``B``.
    Raises:
        ValueError: no ``variant`` column, unknown baseline, a baseline without looped (r > 1) runs, fewer than 2
            variants, or bad rows (as ``prepare``); ``B`` not a whole number >= 0, ``starts`` / ``workers`` not
            one >= 1, ``seed`` not one >= 0, ``level`` outside (0, 1), ``delta`` not a finite number > 0 — before any fit.
    """
    check_fit_args(starts=starts, seed=seed, delta=delta, B=B, B_zero="Δφ of the point fits, with no interval",
                   level=level, workers=workers)  # fmt: skip
    df = read_table(table)
    if "variant" not in df.columns:
        raise ValueError(f"compare_variants needs a 'variant' column; table has {list(df.columns)}")
    names = sorted(df["variant"].astype(str).unique().tolist())
    if baseline is None:
        baseline = "baseline" if "baseline" in names else names[0]
    if baseline not in names:
        raise ValueError(f"baseline={baseline!r} is not a variant; valid: {names}")
    law = make_law("joint")
    df = df.assign(variant=df["variant"].astype(str)).reset_index(drop=True)
    lender, base_r1 = shared_r1(df, baseline)  # as the variants' own fits (analysis.variant_frames) borrow them
    if share_r1 and lender != baseline:  # r = 1 runs labelled otherwise (e.g. 'plain'): lent, not compared
        names = [v for v in names if v != lender]
    if len(names) < 2:
        raise ValueError(f"need at least 2 variants to compare; got {names}")
    if not (df.loc[df["variant"] == baseline, "r"] > 1).any():
        others = [v for v in names if v != baseline]
        raise ValueError(
            f"no Δφ: the baseline {baseline!r} has no looped (r > 1) runs to fit, only the r = 1 runs every "
            f"variant's fit shares, so it has no φ to compare {others} with (a spec whose variants leave out "
            "'baseline', or whose baseline looped runs all failed or diverged; add baseline to the variants, or "
            f"compare two of these variants: compare_variants(table, baseline={others[0]!r}))"
        )
    per: dict[str, pd.DataFrame] = {}
    for v in names:
        sub = df[df["variant"] == v]
        if share_r1 and not (sub["r"] == 1).any():  # the baseline too, when its r = 1 runs are labelled 'plain'
            sub = pd.concat([sub, base_r1])
        per[v] = sub.reset_index(drop=True)
    datas = {v: prepare(per[v], law, block_by=block_by) for v in names}
    if block_by is None and (reps := _replicates(datas)):
        return _compare_replicates(law, datas, reps, names, baseline, B=B, seed=seed, starts=starts, workers=workers,
                                   address=address, delta=delta, level=level, **kwargs)  # fmt: skip
    bb = block_by or default_block_by(datas[baseline].frame, law)
    if bb is None:
        raise ValueError(
            "no cell columns for the paired bootstrap: add 'budget', 'C' or 'D', or pass block_by"
        )
    fits = {v: fit_data(law, datas[v], starts=starts, seed=seed, delta=delta) for v in names}
    # union of cells; each variant maps its rows to union cell ids
    keys = sorted({tuple(k) for d in datas.values() for k in d.frame[list(bb)].itertuples(index=False)})
    index = {k: i for i, k in enumerate(keys)}
    cell_of = {
        v: np.array([index[tuple(k)] for k in d.frame[list(bb)].itertuples(index=False)])
        for v, d in datas.items()
    }
    nc = len(keys)
    budget_col = next((c for c in bb if c in ("budget", "C", "D")), None)
    Ws = {v: np.zeros((B, datas[v].n)) for v in names}
    use = np.ones(B, dtype=bool)
    n_deg = 0
    for k in range(B):
        rng = np.random.default_rng([seed, k])
        for _ in range(1000):
            cnt = np.bincount(rng.integers(0, nc, nc), minlength=nc)
            ws = {v: cnt[cell_of[v]].astype(float) for v in names}
            bad = False
            for v in names:
                used = ws[v] > 0
                d = datas[v]
                if (
                    used.sum() < law.n_params
                    or np.unique(d.cols["r"][used]).size < 2
                    or (budget_col is not None and pd.unique(d.frame[budget_col].to_numpy()[used]).size < 2)
                ):
                    bad = True
                    break
            if not bad:
                for v in names:
                    Ws[v][k] = ws[v]
                break
            n_deg += 1
        else:
            use[k] = False
    phis = {}
    for i, v in enumerate(names):
        th, ob, _ = refit_weights(
            law,
            datas[v],
            Ws[v],
            use,
            np.asarray(fits[v].theta),
            seed=seed,
            stream=1 + i,
            starts=starts,
            workers=workers,
            address=address,
            delta=delta,
            **kwargs,
        )
        phis[v] = np.where(np.isfinite(ob), th[:, 5], np.nan)
        _notify_result(B, int(np.isfinite(ob).sum()), "variants")
    why = NO_BOOTSTRAP if B == 0 else None
    if B and not use.any():
        why = (f"every paired draw of cells {tuple(bb)} was degenerate for some variant (a single r, a single "
               f"{budget_col or 'budget'} or too few runs), so Δφ has no interval; a grid of one D needs seeds "
               "per cell (its seeds are then resampled within cells)")  # fmt: skip
    return {
        "baseline": baseline,
        "block_by": list(bb),
        "B": B,
        "fits": {v: f.to_dict() for v, f in fits.items()},
        "comparisons": _comparisons(names, baseline, fits, phis, level, why),
        "n_degenerate": n_deg,
        "n_failed": int(B - use.sum()),
    }


NO_BOOTSTRAP = "no bootstrap (B = 0): Δφ is the difference of the point fits, with no interval"


def _comparisons(names, baseline, fits, phis, level, why: str | None) -> dict[str, dict[str, Any]]:
    """Δφ rows of every variant against ``baseline`` from the point fits and the paired draws ``phis`` (NaN where a
    draw failed); ``no_interval`` gives ``why`` (or that every refit failed) when no draw is left."""
    comps = {}
    for v in names:
        if v == baseline:
            continue
        dphi = phis[v] - phis[baseline]
        ok = np.isfinite(dphi)
        comps[v] = {
            "phi": fits[v].params["phi"],
            "delta_phi": fits[v].params["phi"] - fits[baseline].params["phi"],
            "ci": list(percentile_ci(dphi[ok], level)),
            "frac_delta_le_0": float(np.mean(dphi[ok] <= 0)) if ok.any() else float("nan"),
            "n_ok": int(ok.sum()),
        }
        if not ok.any():
            comps[v]["no_interval"] = why or f"every paired refit of {baseline} or {v} failed"
    return comps


def _replicates(datas: dict[str, Any]) -> dict[str, Any] | None:
    """Per variant, its :class:`loopscale.fit.analysis.SeedReplicates` when every variant's runs are seed replicates
    (one D, seeds per cell), as the variants' own fits in ``loopscale run``'s analysis treat them; else None."""
    from loopscale.fit.analysis import seed_replicates
    from loopscale.fit.io import with_layers_unique

    reps = {v: seed_replicates(with_layers_unique(d.frame)) for v, d in datas.items()}
    return reps if all(reps.values()) else None


def _compare_replicates(law, datas, reps, names, baseline, *, B, seed, starts, workers, address, delta, level,
                        **kwargs) -> dict[str, Any]:  # fmt: skip
    """:func:`compare_variants` for seed replicates: each variant fitted as its own fit is (to its cell means when
    it has at least as many cells as the law's parameters, else to its runs), and each paired draw resamples the
    seeds within every cell, the same draw for the variants' runs of one cell (same strata; the baseline's r = 1
    cells, which every variant shares, included) and, the cell's runs taken in seed order, the same seeds: draw
    ``k`` of the ``g``-th cell of the union (sorted by its strata, N_rec left out) uses ``default_rng([seed, k,
    g])``. A cell whose variants' runs have other seeds (a run missing, another seed) cannot be paired: each
    variant's runs there are drawn on their own (``default_rng([seed, k, g, 1 + j])``), counted as
    ``unpaired_cells``. A variant's
    run and the baseline's run of one seed share that seed's data order, so their noise largely cancels in Δφ;
    each variant's looped cells drawn on their own (as before fit rules 5) gave Δφ = 0.000 [-0.035, 0.042] for a
    variant whose runs ended at the baseline's losses. A block bootstrap over (D, r) cells could never vary the
    one D: every draw was degenerate and Δφ had no interval."""
    from loopscale.fit.io import cell_means, with_layers_unique

    frames = {v: with_layers_unique(datas[v].frame).reset_index(drop=True) for v in names}
    strata = {v: tuple(reps[v].strata) for v in names}
    # a cell of the union: its strata without N_rec, named (the variants' runs of one design cell, and the borrowed
    # r = 1 runs, fall in one cell; N_rec, a stratum where no d_model tells widths apart, differs between variants
    # of one design cell: hyperconnections' lane weights are counted in it)
    pair = {v: tuple(c for c in strata[v] if c != "N_rec") for v in names}
    keys = {v: [tuple(zip(pair[v], x, strict=True)) for x in frames[v][list(pair[v])].itertuples(index=False)]
            for v in names}  # fmt: skip
    union = {k: g for g, k in enumerate(sorted({k for v in names for k in keys[v]}, key=repr))}
    ids = {v: np.array([union[k] for k in keys[v]]) for v in names}
    # a run's seed as text (ints, floats, strings and nulls alike); without a seed column, its place in the cell
    labels = {v: frames[v]["seed"].astype(str).to_numpy() if "seed" in frames[v].columns else None for v in names}
    W = {v: np.zeros((B, len(frames[v]))) for v in names}
    unpaired = 0
    for g in range(len(union)):
        cell = {}
        for v in names:
            idx = np.flatnonzero(ids[v] == g)
            if idx.size:
                cell[v] = idx if labels[v] is None else idx[np.argsort(labels[v][idx], kind="stable")]
        seen = {tuple(labels[v][idx]) if labels[v] is not None else idx.size for v, idx in cell.items()}
        paired = len(seen) == 1  # the same seeds (or, without seeds, as many runs) in every variant of the cell
        unpaired += not paired and len(cell) > 1
        for j, (v, idx) in enumerate(cell.items()):
            for k in range(B):
                # paired: one draw of positions in the seed order, the same seeds for every variant; else each
                # variant's own draw (seeds that differ cannot be matched)
                rng = np.random.default_rng([seed, k, g] if paired else [seed, k, g, 1 + j])
                np.add.at(W[v][k], idx[rng.integers(0, idx.size, idx.size)], 1.0)
    fits, phis, points = {}, {}, {}
    for i, v in enumerate(names):
        f = frames[v]
        means = reps[v].means
        points[v] = prepare(cell_means(f, strata[v]), law) if means else datas[v]
        fits[v] = fit_data(law, points[v], starts=starts, seed=seed, delta=delta)
        # each draw's cell means, in cell_means' order (both group by the strata, sorted)
        draws = cell_mean_draws(W[v], datas[v].cols["loss"], cell_ids(f, strata[v])) if means else W[v]
        th, ob, _ = refit_weights(law, points[v], draws, np.ones(B, dtype=bool), np.asarray(fits[v].theta),
                                  seed=seed, stream=1 + i, starts=starts, workers=workers, address=address,
                                  delta=delta, losses=means, **kwargs)  # fmt: skip
        phis[v] = np.where(np.isfinite(ob), th[:, 5], np.nan)
        _notify_result(B, int(np.isfinite(ob).sum()), "variants")
    return {
        "baseline": baseline,
        "block_by": None,
        "stratify_by": list(strata[baseline]),
        "cell_means": {v: bool(reps[v].means) for v in names},
        "unpaired_cells": unpaired,
        "B": B,
        "fits": {v: f.to_dict() for v, f in fits.items()},
        "comparisons": _comparisons(names, baseline, fits, phis, level, NO_BOOTSTRAP if B == 0 else None),
        "n_degenerate": 0,
        "n_failed": 0,
    }



SAME_LOSS_RTOL = 1e-5
"""Relative difference of final losses below which a variant's run and the baseline's run of the same cell and seed
count as the same model (:func:`same_losses_as_baseline`): two seeds differ by ~1 %, a change that matters to
training by far more than this, float rounding of one model by less."""


def same_losses_as_baseline(df: pd.DataFrame, baseline: str, variant: str,
                            rtol: float = SAME_LOSS_RTOL) -> list[int]:  # fmt: skip
    """The looped r (> 1) at which every run of ``variant`` ends at the loss of the ``baseline`` run of the same cell
    and seed, to ``rtol``: there the variant trained, to float rounding, the baseline's models, so its φ and Δφ
    measure nothing of the change. Seen with truncated BPTT (``trunc_bptt``) on the ``smoke`` preset's short AdamW
    runs (r = 4 and 8 equal to 6 digits): the loop's state weight W_h starts at zero (W_inject = [I | 0]) and is
    still small, so the gradient through the detached early recurrences is below float precision.

    Args:
        df: runs with ``variant``, ``r``, ``loss`` (nats/token) and the cell columns present among ``d_model``,
            ``n_recur_block``, ``budget``, ``D``, ``seed``.
        baseline, variant: the two variants' names.
    Returns:
        Sorted r values (empty when the variant's runs differ at every r, or no run of it has a baseline twin).
    """
    keys = [c for c in ("r", "d_model", "n_recur_block", "budget", "D", "seed") if c in df.columns]
    if "loss" not in df.columns or "variant" not in df.columns:
        return []
    v = df[(df["variant"].astype(str) == variant) & (df["r"] > 1)]
    b = df[df["variant"].astype(str) == baseline]
    pairs = v[keys + ["loss"]].merge(b[keys + ["loss"]], on=keys, suffixes=("_v", "_b"))
    out = []
    for r, g in pairs.groupby("r"):
        if (v["r"] == r).sum() == len(g) and len(g):  # every run of the variant at this r has its twin
            lv, lb = g["loss_v"].to_numpy(float), g["loss_b"].to_numpy(float)
            if np.all(np.abs(lv - lb) <= rtol * np.maximum(np.abs(lv), np.abs(lb))):
                out.append(int(r))
    return sorted(out)
