"""The whole analysis of one sweep (the `fit` stage of ``loopscale run``), from ``runs.parquet`` alone.

Per variant (paper Sec. 4): per-r Chinchilla fits (Table 1), the joint law with phi free and its block bootstrap
over (budget, r) cells (Table 2, Eq. 3), restricted phi = 0 / phi = 1 fits, IsoFLOP parabolas (labelled
approximate), the law's compute-optimal frontier per r, and equivalence statements (App. F.4). With several
variants, delta-phi against the baseline with a paired bootstrap CI (Sec. 5 case studies).

Everything is written under ``out_dir``: ``analysis.json`` (all numbers), ``<variant>/fit.json``,
``<variant>/bootstrap.parquet``, ``<variant>/*.png``, ``frontier.parquet`` and ``isoflop.parquet``.
The report (:mod:`loopscale.fit.run_report`) is rebuilt from these files without refitting.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.io import (
    DUPLICATE_RUN_ID,
    cell_means,
    drop_duplicate_runs,
    no_null_cells,
    shared_r1,
    with_layers_unique,
)
from loopscale.fit.outputs import json_safe, summary_dict

ANALYSIS_VERSION = 1

FIT_RULES_VERSION = 5
"""Version of the rules by which the analysis turns runs into numbers and verdicts: the fitter's settings, the
bootstrap, the identification rule, the ladder. Raise it with every change that can alter a finished analysis's
parameters, intervals or verdict (not with report wording or figures): ``analysis.json`` records it as
``fit_rules``, ``loopscale run --resume`` refits a folder fitted under another version, and the report says when
its fits follow other rules. 1: analyses that recorded none (before 2026-12-03); 2: phi_r intervals that miss by
at most 1e-6 share a value, the per-r law fitted with the run's starts; 3: a per-r Chinchilla fit needs
:data:`CHINCHILLA_MIN_POINTS` distinct (N, D) points (it counted runs, so seeds of one cell passed as points); 4:
with two D, as with one, the D-term's E, B and beta are not identified: the rule does not check them for the box
edge (it checks the smaller of the two offsets E + B D^-beta), no frontier is computed, and a per-r Chinchilla fit
needs 3 N and 3 D; 5: the Δφ bootstrap of a grid of one D with seeds draws the same seeds for every variant's runs of
a cell (paired; it drew each variant's looped cells on their own)."""
CHINCHILLA_MIN_POINTS = 6
"""Distinct (N, D) points a per-r Chinchilla fit needs: more than the law's 5 parameters (E, A, alpha, B, beta)."""
JOINT_PARAMS = 6
"""Parameters of the joint law with phi free (E, A, alpha, B, beta, phi): the fewest points it is fitted to."""


class FitOutcome(StrEnum):
    """How one fit of the analysis ended; stored as ``outcome`` in every fit record of ``analysis.json`` (a record
    that was not fitted also carries the human-readable ``skipped`` reason)."""

    FITTED = "fitted"
    TOO_FEW_RUNS = "too_few_runs"
    """Per-r Chinchilla fit: fewer than 6 runs, or fewer than 2 sizes or 2 budgets (the law has 5 parameters)."""
    SINGLE_R = "single_r"
    """Joint fit: the variant has runs at one r only, so phi is not identified."""
    REFUSED = "refused"
    """The fitter refused the data (``ValueError``; the reason is its message)."""


class Exclusion(StrEnum):
    """Why a run is left out of every fit; stored as ``reason`` in ``analysis.json``'s ``excluded_runs``."""

    DIVERGED = "diverged"
    """The training loss became NaN/inf or exceeded the trainer's divergence threshold: no final loss."""
    FAILED = "failed"
    """The trial errored past its retries: no measurement at all."""
    DID_NOT_LEARN = "did_not_learn"
    """Trained to its end, but its final loss is not below ln V or its model collapsed to one prediction
    (:data:`loopscale.model.train.DID_NOT_LEARN`): a loss no law of the model family describes."""
    OTHER_STATUS = "status_not_ok"
    """Any other (or a missing) status."""
    DUPLICATE_RUN_ID = DUPLICATE_RUN_ID
    """A newer row of the same ``run_id`` is in the table (:func:`loopscale.fit.io.drop_duplicate_runs`)."""

    @classmethod
    def of(cls, status: Any) -> Exclusion:
        """The exclusion of a run with this ``status`` (a runs-table value)."""
        return {"diverged": cls.DIVERGED, "failed": cls.FAILED, "did_not_learn": cls.DID_NOT_LEARN}.get(
            str(status), cls.OTHER_STATUS
        )


def skipped(outcome: FitOutcome, reason: str) -> dict[str, str]:
    """The record of a fit that was not made: its outcome and why."""
    return {"outcome": outcome.value, "skipped": reason}


def fitted(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (a fit's JSON object) marked as :attr:`FitOutcome.FITTED`."""
    return {"outcome": FitOutcome.FITTED.value, **record}


def phi_identified(v: dict) -> bool:
    """False when the variant ``v`` (an ``analysis.json`` variant) carries an identification check that did not
    accept phi; True when it accepted it, or when there is no check (analysis files written before it existed)."""
    ident = v.get("identification") or {}
    return not ident or bool(ident.get("identified", True))


def phi_not_identified(names: Any, variants: dict) -> list[str]:
    """Those of the variants ``names`` whose phi the identification check did not accept (:func:`phi_identified`;
    ``variants``: ``analysis.json``'s), in order, each once: for a Δφ row (its baseline and its variant) empty
    exactly when its Δφ is a result."""
    return [n for n in dict.fromkeys(names) if not phi_identified(variants.get(n) or {})]


def missing_fit_files(run_dir: str | Path, analysis: dict) -> list[str]:
    """The data files a finished fit's ``analysis.json`` (``analysis``, read from ``run_dir/fit``) lists per
    variant (``files``: ``fit.json``, ``bootstrap.parquet``) that are not there, as paths relative to ``run_dir``
    (e.g. ``["fit/baseline/fit.json"]``); figures are left out (the report redraws or names them). A fit missing
    any is not whole: ``loopscale run`` refits instead of skipping it."""
    d = Path(run_dir) / "fit"
    out = []
    for v in (analysis.get("variants") or {}).values() if isinstance(analysis, dict) else ():
        for rel in (v.get("files") or {}).values() if isinstance(v, dict) else ():
            if isinstance(rel, str) and not rel.endswith(".png") and not (d / rel).is_file():
                out.append(f"fit/{rel}")
    return out


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes (hex), used to skip an analysis whose input did not change."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def variant_frames(df: pd.DataFrame, order: Sequence[str] | None = None) -> dict[str, pd.DataFrame]:
    """Rows per variant (``variant`` column; all rows are ``baseline`` without one), ``baseline`` first, then in
    ``order`` (e.g. the spec's ``variants``), then alphabetically; a variant without r = 1 rows
    borrows the baseline's (or those of a variant of r = 1 runs only: :func:`loopscale.fit.io.shared_r1`), so each
    frame is one variant's fit. The variant that lends its r = 1 runs gets no frame of its own when it has no looped
    runs and other variants have (a spec whose ``variants`` leave out ``baseline``: its r = 1 runs are labelled
    ``baseline``)."""
    if "variant" not in df.columns:
        return {"baseline": df}
    rank = {v: i for i, v in enumerate(order or ())}
    names = sorted(df["variant"].astype(str).unique().tolist(),
                   key=lambda v: (v != "baseline", rank.get(v, len(rank)), v))  # fmt: skip
    base, r1 = shared_r1(df, "baseline" if "baseline" in names else names[0])
    looped = set(df.loc[df["r"] > 1, "variant"].astype(str))
    out = {}
    for v in names:
        if v == base and v not in looped and looped:  # r = 1 runs only (a spec without `baseline`): lent, no fit
            continue
        sub = df[df["variant"].astype(str) == v]
        if v != base and not (sub["r"] == 1).any():
            sub = pd.concat([sub, r1])
        out[v] = sub.reset_index(drop=True)
    return out


def _effective_depth(frame: pd.DataFrame) -> pd.Series | None:
    """Layers a token passes through per run (``n_prelude + r n_recur_block + n_coda``), from ``effective_depth``
    or the three layer columns; None when the table has neither."""
    if "effective_depth" in frame.columns:
        return frame["effective_depth"]
    if {"n_prelude", "n_recur_block", "n_coda"} <= set(frame.columns):
        return frame["n_prelude"] + frame["r"] * frame["n_recur_block"] + frame["n_coda"]
    return None


def _equivalence_statements(frame: pd.DataFrame, phi: float) -> list[dict[str, Any]]:
    """One statement per r > 1 at the largest width present at every r: N_unique, N_eff, FLOPs/token, against
    the r = 1 model of that width and the same effective depth (its iso-depth partner, paper Sec. 3; with a
    unique-depth ladder there are shallower r = 1 models too), else the r = 1 model nearest in FLOPs/token."""
    from loopscale.fit.derived import equivalence

    if "d_model" not in frame.columns:
        return []
    widths = [
        w
        for w in sorted(frame["d_model"].unique())
        if frame.loc[frame["d_model"] == w, "r"].nunique() == frame["r"].nunique()
    ]
    if not widths:
        return []
    w = widths[-1]
    at_w = frame[frame["d_model"] == w]
    base = at_w[at_w["r"] == 1]
    depth = _effective_depth(at_w)
    out = []
    for r in sorted(at_w["r"].unique()):
        if r == 1:
            continue
        row = at_w[at_w["r"] == r].iloc[0]
        eq = equivalence(float(row["N_once"]), float(row["N_rec"]), float(r), phi)
        item = {
            "d_model": int(w),
            "r": int(r),
            "N_unique": float(eq["N_unique"]),
            "N_eff": float(eq["N_eff"]),
            "r_phi": float(eq["r_phi"]),
            "flops_per_token": float(row["flops_per_token"]) if "flops_per_token" in row else None,
        }
        if len(base):
            b = _iso_depth_partner(base, row, depth)
            item["N_unique_r1"] = float(b["N_once"] + b["N_rec"])
            item["flops_per_token_r1"] = float(b["flops_per_token"]) if "flops_per_token" in b else None
        out.append(item)
    return out


def _iso_depth_partner(base: pd.DataFrame, row: pd.Series, depth: pd.Series | None) -> pd.Series:
    """The r = 1 run of ``base`` (one width) to set beside the looped run ``row`` (a row of the same frame):
    one of the same effective depth (``depth``, :func:`_effective_depth` of that frame, None without layer columns)
    when there is one, else the one nearest in FLOPs/token (the deepest without that column)."""
    if depth is not None:
        same = base[depth.loc[base.index] == depth.loc[row.name]]
        if len(same):
            return same.iloc[0]
    if "flops_per_token" in base.columns and pd.notna(row.get("flops_per_token")):
        gap = (base["flops_per_token"].astype(float) - float(row["flops_per_token"])).abs()
        return base.loc[gap.idxmin()]
    return base.loc[(base["N_once"] + base["N_rec"]).idxmax()]


def _seed_strata(frame: pd.DataFrame) -> tuple[str, ...] | None:
    """Columns of a run's cell when the design holds D fixed and has seeds: the bootstrap then resamples seeds
    within every cell (a block bootstrap over (D, r) cells could never vary D). None for every other design. A
    cell column null on every run is left out (it tells no cells apart). Raises ValueError when one is null on some
    runs only (:func:`loopscale.fit.io.no_null_cells`): those runs belong to no cell."""
    # a column null on every run tells no cells apart (a table without it); one null on some runs is refused
    cols = tuple(c for c in ("d_model", "r", "layers_unique", "D") if c in frame.columns and frame[c].notna().any())
    if "D" not in frame.columns or frame["D"].nunique() != 1 or not cols:
        return None
    no_null_cells(frame, cols, "seeds as replicates")
    law = [c for c in ("N_once", "N_rec") if c in frame.columns]
    if law and int(frame.groupby(list(cols))[law].nunique().to_numpy().max()) > 1:
        # a table without the columns that tell its models apart (e.g. no d_model): a cell is one model, not one r
        cols = (*cols, *law)
    return cols if int(frame.groupby(list(cols)).size().max()) >= 2 else None


@dataclass(frozen=True)
class SeedReplicates:
    """A design whose seeds are replicates (one D, at least one cell with two or more seeds), as the joint fit of
    ``loopscale run``'s analysis and of ``loopscale fit`` treat it: the law is fitted to the cell means when there
    are at least as many cells as the joint law's parameters (else to the runs), and the bootstrap resamples seeds
    within cells.

    Attributes:
        strata: the columns of a run's cell, e.g. ``("d_model", "r", "layers_unique", "D")``.
        cells: number of cells. runs: number of runs (rows of the frame it was detected on).
    """

    strata: tuple[str, ...]
    cells: int
    runs: int

    @property
    def means(self) -> bool:
        """True when the law is fitted to the cell means (at least ``JOINT_PARAMS`` cells)."""
        return self.cells >= JOINT_PARAMS

    def fit_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The points the law is fitted to: :func:`loopscale.fit.io.cell_means` of ``frame`` (runs with ``loss``)
        over ``strata`` when :attr:`means`, else ``frame`` itself. Raises ValueError as ``cell_means``."""
        return cell_means(frame, self.strata) if self.means else frame

    def fitted_to(self) -> dict[str, Any]:
        """``analysis.json``'s ``fitted_to``: ``{"what": "cell_means" | "runs", "cells", "runs"}``: ``runs`` when
        there are fewer cells than the law's parameters (the runs are then fitted, seeds resampled within cells)."""
        return {"what": "cell_means" if self.means else "runs", "cells": self.cells, "runs": self.runs}


def seed_replicates(frame: pd.DataFrame) -> SeedReplicates | None:
    """The :class:`SeedReplicates` of ``frame`` (the runs of one fit, status ok, one row per run; ``layers_unique``
    added by :func:`loopscale.fit.io.with_layers_unique`), or None when its seeds are not replicates (several D, no ``D`` column, or
    one run per cell): then the joint law is fitted to the runs and bootstrapped in blocks."""
    strata = _seed_strata(frame)
    if not strata:
        return None
    return SeedReplicates(strata=strata, cells=int(frame.groupby(list(strata)).ngroups), runs=int(len(frame)))


RUN_SETTING_COLUMNS = (
    "lr", "peak_lr", "max_lr", "learning_rate", "lr_peak", "batch_tokens", "batch_size", "optimizer", "schedule",
    "weight_decay", "warmup_frac", "step", "steps", "iteration",
)
"""Columns that, when they differ between two runs of one cell, make them other runs than seeds of one: a
learning-rate sweep, another batch or optimizer, intermediate checkpoints of one run (by step)."""


def not_replicates_note(frame: pd.DataFrame, strata: tuple[str, ...]) -> str | None:
    """Why the runs of ``frame`` grouped into cells by ``strata`` may not be seed replicates, or None: rows of one
    cell that differ in a run setting (:data:`RUN_SETTING_COLUMNS`: an LR sweep's points, checkpoints of one run)
    or that share one ``seed`` value. Averaging them as seeds mixes other runs into the cell's mean (a table with a
    worse LR at every r = 8 cell moved phi from 0.5 to 0.39)."""
    g = frame.groupby(list(strata), sort=False, dropna=False)
    found = []
    for c in RUN_SETTING_COLUMNS:
        if c in frame.columns and c not in strata:
            n = int((g[c].nunique(dropna=False) > 1).sum())
            if n:
                vals = sorted({str(v) for v in frame[c].dropna().unique()})
                shown = ", ".join(vals[:4]) + (f" and {len(vals) - 4} more" if len(vals) > 4 else "")
                found.append(f"{c!r} in {n} of {g.ngroups} cells (values {shown})")
    settings = bool(found)
    if "seed" in frame.columns and "seed" not in strata and frame["seed"].notna().any():
        n = int((g["seed"].nunique(dropna=True) < g["seed"].count()).sum())
        if n:
            found.append(f"{'they ' if settings else ''}repeat one 'seed' value in {n} of {g.ngroups} cells")
    if not found:
        return None
    what = "differ in " + "; ".join(found) if settings else found[0]
    return (
        f"the runs of one cell ({', '.join(strata)}) are averaged as seeds of one run, but they {what}: those are "
        "other runs, and their mean is no point of the law; "
        + ("keep one setting per cell (e.g. each cell's best LR) before fitting" if settings else
           "give each run its own seed, or keep one run per cell and seed")  # fmt: skip
    )


def uneven_seeds(frame: pd.DataFrame) -> dict[str, Any] | None:
    """Where the joint law is fitted to the runs themselves (several D, or fewer cells than the law's parameters)
    and cells hold different numbers of runs (e.g. per-r seeds ``{1: 1, 2: 2}``): each run is one point of the
    fit (Huber loss summed over points), so a cell with more seeds weighs more.

    Returns ``{"cells", "runs_per_cell": [min, max], "by_r": {r: [min, max]}}`` (a cell: the runs with equal
    ``d_model``, ``layers_unique``, ``N_once``, ``N_rec``, ``N``, ``r`` and ``D``, of those the frame has), or
    None when every cell holds as many runs, or the frame lacks ``D`` or every model column (its runs could not be
    told apart as seeds of one model)."""
    cols = [c for c in ("d_model", "layers_unique", "N_once", "N_rec", "N", "r", "D")
            if c in frame.columns and frame[c].notna().any()]  # fmt: skip
    if "D" not in cols or not set(cols) & {"d_model", "N_once", "N_rec", "N"} or len(frame) == 0:
        return None
    size = frame.groupby(cols, dropna=False).size()
    if int(size.min()) == int(size.max()):
        return None
    out: dict[str, Any] = {"cells": int(len(size)), "runs_per_cell": [int(size.min()), int(size.max())]}
    if "r" in cols:
        per_r = size.groupby(level="r").agg(["min", "max"])
        out["by_r"] = {str(int(r)): [int(row["min"]), int(row["max"])] for r, row in per_r.iterrows()}
    return out


def law_per_r(joint, *, starts: int, seed: int) -> dict:
    """The joint law with one phi per r (``law="joint_per_r"``) fitted to the very points the one-phi fit ``joint``
    used (``joint.data``: cell means or runs): R^2 of both forms side by side, its phi_r, and the parameters on the
    box edge. Where it fits and one phi does not, the r^phi form is what fails, not the law's N- or D-terms. The
    one-phi optimum is one of its starts, so its objective (Huber on log loss) is never above the one-phi fit's;
    R^2 (on the loss) can still come out a hair lower, as it is not what either fit minimises."""

    from loopscale.fit.fitter import fit_data
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import check_per_r_anchor, make_law

    try:
        rs = np.unique(joint.data["r"].to_numpy(dtype=float))
        check_per_r_anchor(rs)  # a grid without r = 1: phi_r not identified (said, as other reasons are)
        lw = make_law("joint_per_r", rs=tuple(int(v) for v in rs[rs > 1]))
        # the one-phi optimum (every phi_r = phi) is a start: the per-r law nests it, so it never ends worse
        warm = np.asarray([*joint.theta[:5], *[joint.theta[5]] * len(lw.extra_names)], dtype=np.float64)
        f = fit_data(lw, prepare(joint.data, lw), starts=starts, seed=seed, delta=joint.delta, warm=warm)
    except ValueError as e:  # e.g. fewer points than the per-r law's parameters: said, not fatal
        return {"error": str(e), "r2_one_phi": float(joint.r2)}
    return {
        "r2": float(f.r2),
        "r2_one_phi": float(joint.r2),
        "objective": float(f.objective),
        "objective_one_phi": float(joint.objective),
        "phi": {k[4:]: float(v) for k, v in f.params.items() if k.startswith("phi_")},
        "n": int(f.n),
        "n_params": int(f.n_params),
        "on_bound": list(f.on_bound),
        "max_abs_residual": float(f.max_abs_residual),
    }


def _identification(
    frame, joint, boot, vdir: Path, out: Path, *, B: int, starts: int, seed: int, plots: bool, strata=None,
    address: str | None = None,
):
    """The identification rule for phi (profile, per-r phi with intervals, the verdict) and, when the grid has a
    unique-depth ladder, every looped model's worth in unique layers. With ``strata`` (seeds as replicates) the
    profile and the per-r fits use cell means, as the joint fit. Writes the figures; returns two JSON-ready
    values: the identification and the ladder rows (empty without a ladder). Inside a running Ray session (or
    with ``address``) the profile's fits and the per-r bootstraps run as Ray tasks; otherwise serially, without
    starting Ray for them."""
    from loopscale.fit.identify import identify, rule_inputs
    from loopscale.fit.identify_plots import plot_ladder, plot_per_r, plot_phi_profile
    from loopscale.fit.ladder import ladder_table

    ci = boot.ci.get("phi") if boot is not None else None
    profile, per_r = rule_inputs(frame, starts=starts, B=B, seed=seed, strata=strata, address=address)
    ident = identify(joint, ci, profile, per_r, no_interval=boot.no_interval_reason if boot is not None else None,
                     n_resamples=boot.B - boot.n_failed if boot is not None else None)
    outd = ident.to_dict()
    # the alternative to one phi: the same law with phi free per r, fitted to the same points with the joint fit's
    # starts (one fit; with the profile's 30 its optimiser could stop short of `loopscale fit --law joint_per_r`)
    if per_r is not None:
        outd["law_per_r"] = law_per_r(joint, starts=max(10, starts), seed=seed)
    outd["profile"] = json_safe(profile.to_dict("records"))
    outd["per_r"] = json_safe(per_r.to_dict("records")) if per_r is not None else []
    files = {}
    ladder_rows: list[dict] = []
    if plots:
        vdir.mkdir(parents=True, exist_ok=True)
        files["phi_profile"] = plot_phi_profile(profile, ident.phi, ident.ci, ident.details["n"], vdir / "phi_profile.png")
        if per_r is not None:
            files["phi_per_r"] = plot_per_r(per_r, ident.phi, ident.ci, vdir / "phi_per_r.png")
    runs = ladder_runs(frame)
    if runs is not None:
        try:
            worth = ladder_table(runs, n_boot=1000, seed=seed)
        except ValueError as e:  # e.g. a ladder whose loss does not fall with depth: said, not fatal
            outd["ladder_error"] = str(e)
            worth = pd.DataFrame()
        ladder_rows = json_safe(worth.to_dict("records"))
        if plots and len(worth):
            files["ladder"] = plot_ladder(runs, worth, vdir / "ladder.png")
    outd["files"] = {k: str(Path(p).relative_to(out)) for k, p in files.items()}
    return json_safe(outd), ladder_rows


def _read_runs(runs: Any) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series | None]:
    """The runs of ``runs`` (``runs.parquet`` path or DataFrame) one row per run id, the newest, as the results store
    keeps them, with ``loss`` (``final_val_loss`` when the table has no ``loss``); the older rows of a run id listed
    twice; each kept row's status (a null one as ``"missing"``; None without a ``status`` column)."""
    from loopscale.fit.io import read_table

    df, dups = drop_duplicate_runs(read_table(runs))
    if "loss" not in df.columns and "final_val_loss" in df.columns:
        df = df.assign(loss=df["final_val_loss"])
    status = df["status"].astype("string").fillna("missing") if "status" in df.columns else None
    return df, dups, status


def _chinchilla_design(sub: pd.DataFrame) -> tuple[pd.DataFrame, int, int, int]:
    """One r's runs for its Chinchilla fit (with ``N_unique``: N_once + N_rec for a table without it) and their
    distinct sizes, D and (N, D) points."""
    if "N_unique" not in sub.columns:  # a hand-made table: the unique parameters are N_once + N_rec
        sub = sub.assign(N_unique=sub["N_once"] + sub["N_rec"])
    return sub, sub["N_unique"].nunique(), sub["D"].nunique(), len(sub[["N_unique", "D"]].drop_duplicates())


def _two_values_apply(ok: pd.DataFrame) -> bool:
    """Whether fit rules version 4 (two D, or a per-r Chinchilla fit on two N or two D) changes the analysis of
    the ok runs ``ok``: a variant whose runs have two D, or an r whose runs a version-3 per-r Chinchilla fit took
    (:data:`CHINCHILLA_MIN_POINTS` points, 2 or more N and D) with two N or two D."""
    from loopscale.fit.identify import d_term_unidentified

    for frame in variant_frames(ok).values():
        if (d := d_term_unidentified(frame)) is not None and d.size == 2:
            return True
        for _, sub in frame.groupby("r"):
            _, n_sizes, n_d, points = _chinchilla_design(sub)
            if points >= CHINCHILLA_MIN_POINTS and min(n_sizes, n_d) == 2:
                return True
    return False


def _paired_seeds_apply(ok: pd.DataFrame) -> bool:
    """Whether fit rules version 5 (the Δφ bootstrap of seed replicates draws the same seeds for every variant)
    changes the analysis of the ok runs ``ok``: two variants or more with looped runs, over one D, with two runs or
    more in some cell of a variant (seed replicates; one seed per cell is bootstrapped in blocks, as before)."""
    if "variant" not in ok.columns or ok["D"].nunique() != 1:
        return False
    looped = ok[ok["r"] > 1]
    if looped["variant"].astype(str).nunique() < 2:
        return False
    cell = [c for c in ("variant", "r", "d_model", "N_once", "N_rec", "D") if c in looped.columns]
    return bool(looped.groupby(cell, dropna=False).size().max() >= 2)


RULE_CHANGES_APPLY = {4: _two_values_apply, 5: _paired_seeds_apply}
"""Per fit rules version, a test of whether its change alters the analysis of a table of ok runs (columns ``D``,
``r``, ``N_once``, ``N_rec``, ``variant``); a version without a test is taken to alter every analysis."""


def fit_rules_in_effect(made: int, runs: pd.DataFrame | None) -> int:
    """The fit rules version that an analysis made under version ``made`` of the runs table ``runs`` (all of its
    rows; the ok ones are tested) is equivalent to: :data:`FIT_RULES_VERSION` when no change since ``made`` alters
    the analysis of these runs (:data:`RULE_CHANGES_APPLY`: e.g. version 4 changed only designs with two D), else
    ``made``. So ``run --resume`` refits, and the report and ``status`` say "made under other fit rules", only where
    the rules changed what the analysis would say. ``runs`` None (unknown): ``made``."""
    if made >= FIT_RULES_VERSION or runs is None:
        return made
    ok = runs[runs["status"] == "ok"] if "status" in runs.columns else runs
    if not {"D", "r", "N_once", "N_rec"} <= set(ok.columns):
        return made
    for v in range(made + 1, FIT_RULES_VERSION + 1):
        test = RULE_CHANGES_APPLY.get(v)
        if test is None or test(ok):
            return made
    return FIT_RULES_VERSION


def frontier_unidentified(frame: pd.DataFrame) -> str | None:
    """Why the law's compute-optimal frontier cannot be read off a fit to ``frame`` (one variant's runs, with ``D``),
    or None. With one token budget D the law's ``B D^-beta`` is one constant: B and beta are not identified, so the
    law cannot say how the loss trades N against D at a fixed compute, and N*, D* and L* would follow the fitter's
    arbitrary split of that constant (two variants sharing the same r = 1 runs gave L* 8.06 and 4.84 there). With
    two it is pinned at two D, fewer values than (E, B, beta): the same (the ``smoke`` preset's fit gave B = 1.3e7,
    beta = 2.16 and B = 3.7e4, beta = 1.37 at one objective with 100 and 500 starts)."""
    from loopscale.fit.identify import d_term_unidentified

    d = d_term_unidentified(frame)
    if d is not None and d.size == 1:
        return (f"one token budget (D = {d[0]:.4g} tokens): the law's D-term B D^-beta is one "
                "constant, B and beta are not identified, so the law cannot trade N against D at a fixed compute; "
                "a grid of several D (tokens:) or FLOP budgets (budgets:) gives a frontier")
    if d is not None:
        return (f"two token budgets (D = {d[0]:.4g} and {d[1]:.4g} tokens): the law's D-term B D^-beta is pinned at "
                "those two D only, fewer values than E, B and beta, so none of the three is identified (fits of "
                "the same quality split it otherwise) and the law's trade of N against D at a fixed compute is "
                "arbitrary; a grid of three or more D (tokens:) or FLOP budgets (budgets:) gives a frontier")
    return None


def _fit_ready(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The ok runs ``df`` (one row per run, with ``loss``) as :func:`analyze` fits them: ``layers_unique`` added, and
    on a token-budget grid (``budget`` null on every run, or no ``budget`` column) without ``budget``: the cell of a run is its token budget
    D (all sizes trained for the same D), so the block bootstrap resamples whole (D, r) cells, like the paper's
    (C, r) cells. Returns ``(frame, budget_kind)`` (``"D"`` or ``"C"``)."""
    df = with_layers_unique(df)
    if "budget" not in df.columns:
        return df, "D"
    if df["budget"].isna().all():
        return df.drop(columns=["budget"]), "D"
    return df, "C"


def ladder_runs(frame: pd.DataFrame) -> pd.DataFrame | None:
    """The runs of one variant's fit (``frame``: ok runs with ``loss`` and ``layers_unique``) that its unique-depth
    ladder reads (:func:`loopscale.fit.ladder.ladder_table`, the figure ``ladder.png``): the widths whose plain
    r = 1 runs have two or more depths at some D, with a ``seed`` column (0 where the table has none); None when
    the frame has no such ladder or no looped run."""
    if not {"layers_unique", "d_model"} <= set(frame.columns):
        return None
    rung_counts = frame[frame["r"] == 1].groupby(["d_model", "D"])["layers_unique"].nunique()
    if not len(rung_counts) or int(rung_counts.max()) < 2 or not (frame["r"] > 1).any():
        return None
    runs = frame.assign(seed=frame["seed"] if "seed" in frame.columns else 0)
    keep = [int(d) for (d, _), k in rung_counts.items() if k >= 2]
    return runs[runs["d_model"].isin(keep)]


def ladder_frames(runs: Any) -> dict[str, pd.DataFrame]:
    """Per variant, :func:`ladder_runs` of the runs :func:`analyze` fits (ok runs, one row per run id), for
    redrawing ``ladder.png`` from ``analysis.json``'s ladder rows without refitting (``loopscale report``);
    variants without a ladder are left out."""
    return {v: lr for v, frame in _ok_variant_frames(runs).items() if (lr := ladder_runs(frame)) is not None}


def _ok_variant_frames(runs: Any) -> dict[str, pd.DataFrame]:
    """:func:`variant_frames` of the ok runs of ``runs`` (path or DataFrame; one row per run id, the newest), made
    ready for the fits as :func:`analyze` makes them; empty without ok runs."""
    df, _, status = _read_runs(runs)
    if status is not None:
        df = df[status == "ok"].reset_index(drop=True)
    if df.empty:
        return {}
    df, _ = _fit_ready(df)
    return variant_frames(df)


def joint_fit_points(runs: Any) -> dict[str, pd.DataFrame]:
    """Per variant, the points :func:`analyze` fits its joint law to: the cell means of its ok runs when their
    seeds are replicates (:func:`seed_replicates`), else the runs (one row per run id, the newest). For redrawing a
    fit's figures from its ``fit.json`` without refitting (``loopscale report``).

    Args:
        runs: ``runs.parquet`` path or DataFrame (the sweep's results schema).
    Returns:
        ``{variant: DataFrame}`` (empty without ok runs)."""
    out = {}
    for vname, frame in _ok_variant_frames(runs).items():
        rep = seed_replicates(frame)
        out[vname] = rep.fit_frame(frame) if rep else frame
    return out


def chinchilla_per_r(frame: pd.DataFrame, *, starts: int, seed: int) -> dict[str, dict]:
    """The per-r Chinchilla fits of a variant's runs (paper Table 1; L = E + A N^-alpha + B D^-beta with N the
    unique non-embedding parameters, ``N_unique``, or ``N_once + N_rec`` for a table without it): ``{str(r): fit
    record}``, each fitted (:func:`fitted`) or skipped (:func:`skipped`, ``TOO_FEW_RUNS``, saying why). A fit needs
    :data:`CHINCHILLA_MIN_POINTS` distinct (N, D) points with at least 3 N and 3 D: seeds of one cell are one
    point (with 2 sizes x 2 D and 2 seeds, 8 runs gave 4 points and an unmoved start), and a term pinned at two
    values (A N^-alpha at two N, B D^-beta at two D) leaves E and its own two parameters unidentified."""
    from loopscale.fit.fitter import fit_law

    per_r = {}
    for r, sub in frame.groupby("r"):
        sub, n_sizes, n_d, points = _chinchilla_design(sub)
        if points >= CHINCHILLA_MIN_POINTS and n_d >= 3 and n_sizes >= 3:
            f = fit_law(sub.assign(N=sub["N_unique"]), law="chinchilla", starts=starts, seed=seed)
            per_r[str(int(r))] = fitted(json_safe(f.to_dict()))
        else:
            per_r[str(int(r))] = skipped(
                FitOutcome.TOO_FEW_RUNS,
                f"{len(sub)} runs at {points} distinct (N, D) point{'s' * (points != 1)} ({n_sizes} N, {n_d} D; a "
                f"width or a ladder depth is an N); need >= {CHINCHILLA_MIN_POINTS} points with >= 3 N and >= 3 D "
                "(a term pinned at two values leaves its three parameters unidentified)",
            )
    return per_r


def analyze(
    runs: str | Path | pd.DataFrame,
    out_dir: str | Path,
    *,
    B: int = 200,
    starts: int = 500,
    seed: int = 0,
    workers: int | None = None,
    address: str | None = None,
    plots: bool = True,
    variant_order: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Fit everything the report shows and write it under ``out_dir``.

    Args:
        runs: ``runs.parquet`` path or DataFrame (the sweep's results schema: ``final_val_loss`` in nats/token,
            ``D`` tokens, ``C`` training FLOPs, ``N_once``, ``N_rec``, ``N_unique``, ``r``, ``budget``, ``variant``,
            ``status``, ``d_model``, ``flops_per_token``).
        out_dir: where the analysis files go (created).
        B: bootstrap resamples of the joint fit per variant (paper: 200). starts: multi-starts per fit (paper: 500).
        seed: RNG seed (same seed, same CIs whatever ``workers``). workers/address: Ray for the bootstrap.
        variant_order: the order of the variants after ``baseline`` (``loopscale run``: the spec's); others
            alphabetically (:func:`variant_frames`). The variant sections and the Δφ rows follow it.
    Returns:
        The ``analysis.json`` content (dict). With more than one variant, ``variant_comparison`` is
        :func:`loopscale.fit.variants.compare_variants`'s result, each of its ``comparisons`` with ``identified``
        (False when the identification check did not accept phi of the variant or of the baseline: the Δφ is
        then not a result) and, when False, ``not_identified`` (those variants' names); and
        ``same_losses_as_baseline_r``, the r at which the variant's runs end at the baseline's losses
        (:func:`loopscale.fit.variants.same_losses_as_baseline`), when there are any; ``a_result`` (the report's
        "a result?"): True only when both φ are identified, the Δφ has an interval and the variant's runs differ
        from the baseline's.
    Raises:
        ValueError: no ``ok`` runs, or a table the fitter rejects (its message names the column).
    """
    from loopscale.fit import (
        bootstrap,
        compute_optimal_frontier,
        fit_law,
        isoflop_parabolas,
        write_fit_outputs,
    )
    from loopscale.fit.derived import spanning_budgets
    from loopscale.fit.fitter import fit_fixed_phis
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df, dups, status = _read_runs(runs)
    counts = status.value_counts().to_dict() if status is not None else {"ok": len(df)}
    cols = ("run_id", "variant", "r", "d_model", "n_recur_block", "budget", "D", "seed", "status", "error")
    excluded = [
        {**row, "reason": Exclusion.DUPLICATE_RUN_ID.value}
        for row in dups[[c for c in cols if c in dups.columns]].to_dict("records")
    ]
    if status is not None:
        bad = df[status != "ok"]
        keep = [c for c in cols if c in bad.columns]
        excluded += [
            {**row, "reason": Exclusion.of(row.get("status")).value} for row in bad[keep].to_dict("records")
        ]
        df = df[status == "ok"].reset_index(drop=True)
    if df.empty:
        raise ValueError("no runs with status 'ok' to fit; runs by status: " + json.dumps(json_safe(counts)))
    df, budget_kind = _fit_ready(df)
    result: dict[str, Any] = {
        "version": ANALYSIS_VERSION,
        "fit_rules": FIT_RULES_VERSION,
        "n_runs": int(sum(counts.values())),
        "runs_by_status": json_safe(counts),
        "excluded_runs": json_safe(excluded),
        "settings": {"B": B, "starts": starts, "seed": seed},
        "budget_kind": budget_kind,
        "variants": {},
    }
    frontier_rows, iso_rows = [], []
    for vname, frame in variant_frames(df, variant_order).items():
        vdir = out / vname
        v: dict[str, Any] = {"n": len(frame)}
        per_r = chinchilla_per_r(frame, starts=starts, seed=seed)
        v["chinchilla_per_r"] = per_r
        if frame["r"].nunique() < 2:
            v["joint"] = skipped(FitOutcome.SINGLE_R, "a joint fit needs at least two values of r")
            result["variants"][vname] = v
            continue
        # seeds as replicates: the law (expected loss per cell) is fitted to the cell means, when there are at least
        # as many cells as the law has parameters (else to the runs, seeds resampled within cells all the same)
        rep = seed_replicates(frame)
        strata = rep.strata if rep else None
        means = bool(rep and rep.means)
        fit_frame = rep.fit_frame(frame) if rep else frame
        joint = fit_law(fit_frame, law="joint", starts=starts, seed=seed)
        boot = (
            bootstrap(
                frame,
                law="joint",
                B=B,
                seed=seed,
                workers=workers,
                address=address,
                starts=starts,
                point=joint,
                stratify_by=strata,
                cell_means=bool(means),
            )
            if B > 0
            else None
        )
        files = write_fit_outputs(vdir, joint, boot, plots=plots, extra={"variant": vname}, keep_earlier=False)
        v["joint"] = fitted(summary_dict(joint, boot))  # what fit.json holds; never read back
        v["files"] = {k: str(Path(p).relative_to(out)) for k, p in files.items()}
        v["restricted"] = {}
        restricted = fit_fixed_phis(prepare(fit_frame, make_law("joint", 0.0)), (0.0, 1.0), starts=starts, seed=seed)
        for phi, rf in zip((0.0, 1.0), restricted, strict=True):
            v["restricted"][f"phi={phi:g}"] = fitted(json_safe(rf.to_dict()))
        phi_hat = float(joint.params["phi"])
        v["equivalence"] = _equivalence_statements(frame, phi_hat)
        v["identification"], v["ladder"] = _identification(
            frame, joint, boot, vdir, out, B=B, starts=starts, seed=seed, plots=plots,
            strata=strata if means else None, address=address,
        )  # fmt: skip
        if strata:
            v["bootstrap_stratified_by"] = list(strata)
        if rep is not None:
            v["fitted_to"] = rep.fitted_to()
        if not means and (uneven := uneven_seeds(frame)):
            v["uneven_seeds"] = uneven  # the runs are the points: cells with more seeds weigh more
        # compute-optimal frontier of the law (per r, at each budget), and the approximate IsoFLOP vertices
        if "C" in frame.columns and (why := frontier_unidentified(frame)):
            v["frontier"] = skipped(FitOutcome.REFUSED, why)
        elif "C" in frame.columns:
            if budget_kind == "C":
                budgets = sorted(frame["budget"].unique())
            else:  # token budgets: the law's frontier at 4 log-spaced compute budgets spanning the whole grid, so
                # every variant's rows are at the same C (each variant's own C range gave each its own budgets)
                budgets = list(spanning_budgets(df["C"]))
            fr = compute_optimal_frontier(joint, frame, budgets)
            fr.insert(0, "variant", vname)
            frontier_rows.append(fr)
        # IsoFLOP parabolas need iso-FLOP cells (all sizes at one C); token-budget grids have none
        iso = isoflop_parabolas(frame, by=("budget", "r")) if budget_kind == "C" else pd.DataFrame()
        if len(iso):
            iso.insert(0, "variant", vname)
            iso_rows.append(iso)
        result["variants"][vname] = v
    from loopscale.fit.table_fit import looped_variants

    if len(result["variants"]) > 1 and "variant" in df.columns and len(looped_variants(df)) > 1:
        from loopscale.fit import compare_variants

        try:
            comp = json_safe(compare_variants(df, B=B, seed=seed, starts=starts, workers=workers, address=address))
        except ValueError as e:  # e.g. a variant with a single r: reported, not fatal
            comp = skipped(FitOutcome.REFUSED, str(e))
        if comp.get("comparisons"):  # the rows in the variant sections' order (computed in sorted order, numbers alike)
            rank = {v: i for i, v in enumerate(result["variants"])}
            comp["comparisons"] = dict(sorted(comp["comparisons"].items(), key=lambda kv: rank.get(kv[0], len(rank))))
        from loopscale.fit.variants import same_losses_as_baseline

        for name, c in comp.get("comparisons", {}).items():
            if same := same_losses_as_baseline(df, comp["baseline"], name):
                c["same_losses_as_baseline_r"] = same
            # a difference of phi values the grid does not identify is not a result (as phi itself is not)
            unid = phi_not_identified((comp["baseline"], name), result["variants"])
            c["identified"] = not unid
            if unid:
                c["not_identified"] = unid
            # the report's "a result?": both phi identified, an interval, and runs that differ from the baseline's
            c["a_result"] = not unid and not c.get("no_interval") and not same
        result["variant_comparison"] = comp
    import pyarrow as pa
    import pyarrow.parquet as pq

    for rows, name in ((frontier_rows, "frontier.parquet"), (iso_rows, "isoflop.parquet")):
        if rows:
            pq.write_table(
                pa.Table.from_pandas(pd.concat(rows, ignore_index=True), preserve_index=False), out / name
            )
    from loopscale.cluster.storage import write_text_atomic

    write_text_atomic(str(out / "analysis.json"), json.dumps(json_safe(result), indent=2))
    return result
