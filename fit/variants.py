"""Variant comparison: Δφ between architectures (truncated BPTT, hyperconnections, ...) with a paired bootstrap CI.

Each ``variant`` of the table is fitted with the joint law (paper §5 case studies, Table 3). A variant without ``r = 1``
runs borrows the baseline's ``r = 1`` rows (the paper reuses its r = 1 runs for every case study), so its phi is
measured against the same anchor. The paired bootstrap draws cells ``(budget, r)`` (or the ``block_by`` columns) from
the union of all variants' cells, with ``default_rng([seed, k])`` for resample ``k``; every variant takes its rows in
the drawn cells, so shared cells (e.g. the r = 1 anchor) enter all variants jointly. A draw degenerate for any variant
(single r, single budget, too few runs) is redrawn and counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.bootstrapping import _notify_result, percentile_ci, refit_weights
from loopscale.fit.fitter import fit_data
from loopscale.fit.io import default_block_by, prepare, read_table
from loopscale.fit.laws import make_law


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
        B: paired resamples. block_by: cell columns (default ``(budget, r)`` / ``(C, r)`` / ``(D, r)``).
        seed, starts, workers, address, delta: as :func:`loopscale.fit.bootstrapping.bootstrap`.
        share_r1: a variant without r = 1 rows borrows the baseline's r = 1 rows.
    Returns:
        dict: ``baseline``; ``fits`` {variant: FitResult.to_dict()}; ``comparisons`` {variant: {``phi``,
        ``delta_phi``, ``ci`` [lo, hi], ``frac_delta_le_0`` (share of ok resamples with Δφ <= 0), ``n_ok``}};
        ``n_degenerate``; ``B``.
    Raises:
        ValueError: no ``variant`` column, unknown baseline, fewer than 2 variants, or bad rows (as ``prepare``).
    """
    df = read_table(table)
    if "variant" not in df.columns:
        raise ValueError(f"compare_variants needs a 'variant' column; table has {list(df.columns)}")
    names = sorted(df["variant"].astype(str).unique().tolist())
    if baseline is None:
        baseline = "baseline" if "baseline" in names else names[0]
    if baseline not in names:
        raise ValueError(f"baseline={baseline!r} is not a variant; valid: {names}")
    if len(names) < 2:
        raise ValueError(f"need at least 2 variants to compare; got {names}")
    law = make_law("joint")
    df = df.assign(variant=df["variant"].astype(str)).reset_index(drop=True)
    base_r1 = df[(df["variant"] == baseline) & (df["r"] == 1)]
    per: dict[str, pd.DataFrame] = {}
    for v in names:
        sub = df[df["variant"] == v]
        if share_r1 and v != baseline and not (sub["r"] == 1).any():
            sub = pd.concat([sub, base_r1])
        per[v] = sub.reset_index(drop=True)
    datas = {v: prepare(per[v], law, block_by=block_by) for v in names}
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
    return {
        "baseline": baseline,
        "block_by": list(bb),
        "B": B,
        "fits": {v: f.to_dict() for v, f in fits.items()},
        "comparisons": comps,
        "n_degenerate": n_deg,
        "n_failed": int(B - use.sum()),
    }
