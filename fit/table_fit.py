"""``fit_table``: the fit of ``loopscale fit`` as one Python call (a notebook gets the numbers the CLI prints).

A runs table is fitted as ``loopscale run``'s analysis fits it: one variant at a time (its looped runs and the
r = 1 runs), a table whose seeds are replicates (one D, several seeds per cell) fitted to its cell means with seeds
resampled within cells, a Chinchilla fit of one point refused. :func:`loopscale.fit.fitter.fit_law` and
:func:`loopscale.fit.bootstrapping.bootstrap` are the lower-level pieces: they fit every row they are given.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.laws import Law

_LINE = "__csv_line__"
"""A column :func:`fit_table` carries through the variant and r filters: each row's line in the CSV file it read."""


@dataclass(frozen=True)
class TableFit:
    """What :func:`fit_table` fitted, and how.

    Attributes:
        fit: the point fit (:class:`~loopscale.fit.fitter.FitResult`; parameters in nats/token, tokens and
            parameters as the table's columns).
        boot: the bootstrap (:class:`~loopscale.fit.bootstrapping.BootstrapResult`) or None without one.
        data: the runs, validated (:class:`~loopscale.fit.io.FitData`: exclusions, the kept rows).
        law: the law object fitted.
        variant: the variant fitted (None: the table has no ``variant`` column and none was asked).
        replicates: the table's seed replicates (:class:`~loopscale.fit.analysis.SeedReplicates`) when the joint law
            sees some, else None.
        by_cell: True when the law was fitted to the cell means (seeds averaged) and the bootstrap resampled seeds
            within cells, as ``loopscale run``; False when every run is a point.
        flat_terms: the terms the table cannot tell apart, in words: for the Chinchilla law one N or one D, for
            the joint laws one D.
        pooled_r: for the Chinchilla law fitted to runs of several r, those r (one architecture's law pooled; said
            in a ``UserWarning`` too, as ``loopscale fit`` says it). A bootstrap of fewer than
            :data:`loopscale.fit.bootstrapping.FEW_RESAMPLES` refitted resamples is said in a ``UserWarning``.
        identification: the verdict of the identification rule (:class:`~loopscale.fit.identify.Identification`)
            when asked (``identify=True``), else None.
        other_variants_rows: {variant: rows} of the table left out because they belong to another variant's
            fit (empty when none).
        input_warnings: what ``loopscale fit`` warns of in the table's values, one sentence each, in this order:
            rows left out for a status spelt otherwise (:attr:`loopscale.fit.io.FitData.status_note`), cells whose
            runs are not seeds (``not_replicates``), values that read as another unit
            (:func:`loopscale.fit.io.unit_warnings`: D in billions, a perplexity, ...), some looped runs with
            ``N_rec = 0`` (:func:`zero_rec_rows`) and rows that repeat a kept row
            (:attr:`loopscale.fit.io.FitData.near_duplicates`); each is also raised as a ``UserWarning``
            starting ``"table: "``. The fit is made either way.
        not_replicates: when the law was fitted to cell means, why the runs of a cell may be other runs than
            seeds (:func:`loopscale.fit.analysis.not_replicates_note`: an LR sweep, checkpoints, a repeated seed);
            also one of ``input_warnings``. None otherwise.
        column_notes: which of two columns of one quantity was fitted (:func:`column_notes`: ``"loss"``, and
            ``"N"`` for the Chinchilla law); each is also raised as a ``UserWarning`` starting ``"table: "``.
        unit_warnings: the ``input_warnings`` of values that read as another unit
            (:func:`loopscale.fit.io.unit_warnings`), by themselves (``loopscale fit --json`` key of the same name).
        zero_rec_rows: the ``input_warnings`` sentence of looped runs with ``N_rec = 0`` (:func:`zero_rec_rows`), or
            None.
    """

    fit: Any
    boot: Any
    data: Any
    law: Law
    variant: str | None = None
    replicates: Any = None
    by_cell: bool = False
    flat_terms: list[str] = field(default_factory=list)
    pooled_r: list[int] = field(default_factory=list)
    identification: Any = None
    other_variants_rows: dict[str, int] = field(default_factory=dict)
    input_warnings: list[str] = field(default_factory=list)
    not_replicates: str | None = None
    column_notes: dict[str, str] = field(default_factory=dict)
    unit_warnings: list[str] = field(default_factory=list)
    zero_rec_rows: str | None = None

    @property
    def params(self) -> dict[str, float]:
        """The point estimates (``E, A, alpha, B, beta`` and ``phi`` for the joint law)."""
        return self.fit.params

    @property
    def ci(self) -> dict[str, tuple[float, float]]:
        """The bootstrap's percentile intervals ({} without a bootstrap, or when it gave none)."""
        if self.boot is None or self.boot.no_interval_reason:
            return {}
        return dict(self.boot.ci)


def pooled_r_note(pooled: list[int], *, flags: bool = False) -> str:
    """What is said of a Chinchilla law fitted to the runs of several r (``pooled``, sorted) as one architecture,
    with the way to fit one: in Python's words (``r=R``), or with ``flags`` in the command line's (``--r R``)."""
    phi0, one = ("--phi 0", f"--r R fits one, e.g. --r {pooled[-1]}") if flags else ("phi = 0", f"r=R fits one, e.g. r={pooled[-1]}")
    return (f"the Chinchilla law was fitted to the runs of r = {', '.join(map(str, pooled))} pooled, as one "
            f"architecture (on N_unique that is the joint law at {phi0}); {one}")


def fit_table(
    table: Any,
    law: str = "joint",
    *,
    phi: float | None = None,
    variant: str | None = None,
    r: Any = None,
    per_run: bool = False,
    bootstrap: int = 0,
    block_by: Any = "default",
    identify: bool = False,
    starts: int = 500,
    seed: int = 0,
    delta: float = 1e-3,
    workers: int | None = None,
    progress: bool = False,
) -> TableFit:
    """Fit a scaling law to a runs table exactly as ``loopscale fit TABLE`` does (and, with ``identify=True``,
    ``loopscale fit --identify``: the fit ``loopscale run``'s report shows).

    Args:
        table: a path (``.parquet``, ``.csv``, or the folder of a ``loopscale run`` / ``sweep``: its
            ``runs.parquet``), a pandas DataFrame or a pyarrow Table; columns as
            :func:`loopscale.fit.fitter.fit_law` (loss in nats/token, ``D`` in tokens, parameters).
        law: ``"joint"`` (paper Eq. 3), ``"joint_per_r"`` (one phi per looped r; a point fit) or ``"chinchilla"``.
        phi: fix phi (joint law), e.g. 0 or 1; None fits it.
        variant: the variant to fit (its looped runs and the r = 1 runs); needed when the table holds several
            variants with looped runs, which pooled would be fitted as one law.
        r: keep only these r (an int or a list of ints).
        per_run: a table whose seeds are replicates: fit every run as a point and bootstrap blocks (``block_by``),
            instead of the cell means with seeds resampled within cells (the default, as ``loopscale run``).
        bootstrap: resamples B (0: none; paper: 200).
        block_by: bootstrap blocks of a per-run fit: ``"default"`` (joint: budget,r, else D,r, or C,r where that
            makes fewer cells (:func:`loopscale.fit.io.default_block_by`); chinchilla: iid),
            ``"iid"`` (or None), or a tuple of column names.
        identify: apply the identification rule of ``loopscale run`` (joint law, phi free; needs ``bootstrap``).
        starts, seed, delta: the fitter's starts, RNG seed and Huber threshold (paper: 500, -, 1e-3).
        workers: CPUs for the bootstrap refits (None: an embedded local Ray on every core, unless the refits
            make a single chunk; 1: serial, no Ray).
        progress: print the bootstrap's ``bootstrap: i/n chunks`` lines on stderr (every chunk on a terminal;
            piped, the first, at most one a minute, and the last).
    Returns:
        :class:`TableFit`.
    Raises:
        ValueError: as ``loopscale fit`` (exit 2 there): a bad table (:func:`loopscale.fit.io.prepare`), several
            looped variants and no ``variant``, an ``r`` the table lacks, a Chinchilla fit of one point,
            ``block_by`` with seed replicates and not ``per_run``, ``bootstrap`` not a whole number >= 0,
            ``joint_per_r`` with a bootstrap, ``identify`` without a free-phi joint law or without a bootstrap,
            ``r`` not whole numbers >= 1, bad ``starts`` / ``seed`` / ``delta`` / ``workers``
            (:func:`loopscale.fit.fitter.check_fit_args`) — all before any fit.
    """
    from loopscale.fit.analysis import not_replicates_note, seed_replicates
    from loopscale.fit.bootstrapping import bootstrap_data
    from loopscale.fit.fitter import check_fit_args, fit_data
    from loopscale.fit.io import (
        TooFewRunsError,
        csv_record_lines,
        prepare,
        read_table,
        unit_warnings,
        with_layers_unique,
    )
    from loopscale.fit.laws import check_per_r_anchor, make_law

    check_fit_args(starts=starts, seed=seed, delta=delta, B=bootstrap, B_name="bootstrap", B_zero="no bootstrap",
                   workers=workers)  # fmt: skip
    if law == "joint_per_r" and bootstrap:
        raise ValueError(
            "law 'joint_per_r' is a point fit (a resample that misses one r would leave its phi_<r> unfitted): fit "
            "without a bootstrap, or fit law 'joint' with identify and a bootstrap, whose check fits phi per r"
        )
    if identify and not (law == "joint" and phi is None):
        raise ValueError("identify applies to the joint law with phi free (it decides whether the data identify phi)")
    if identify and not bootstrap:
        raise ValueError(
            "identify needs a bootstrap (e.g. bootstrap=50): the rule checks the ends of phi's interval and phi "
            "fitted per r with its intervals, both from resamples"
        )
    if r is not None:
        given_r = np.atleast_1d(np.asarray(r, dtype=object))
        bad_r = [v for v in given_r
                 if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating)
                 or not np.isfinite(v) or v != int(v) or v < 1]  # fmt: skip
        if bad_r or given_r.size == 0:
            raise ValueError(f"r={r!r} must be an integer >= 1 or a list of them (the recurrences to keep)"
                             + (f"; not one: {bad_r[0]!r}" if bad_r else ""))  # fmt: skip
    blocks = _blocks(block_by)
    lw = make_law(law, phi) if law != "joint_per_r" else None
    if law == "joint_per_r" and phi is not None:
        make_law(law, phi)  # raises: phi cannot be fixed for the per-r law
    def only_r(df: pd.DataFrame) -> pd.DataFrame:
        keep = {int(v) for v in np.atleast_1d(r)}
        if "r" not in df.columns:
            cols = [c for c in df.columns if c != _LINE]  # the table's own
            raise ValueError(f"r={r!r} given but the table has no 'r' column; columns: {cols}")
        have = sorted(int(v) for v in df["r"].dropna().unique())
        if not keep <= set(have):
            raise ValueError(f"r={sorted(keep)}: the table has r = {have}")
        return df[df["r"].isin(keep)].reset_index(drop=True)

    src = read_table(table)
    lines = csv_record_lines(table) if isinstance(table, str | Path) else None
    if lines is not None and len(lines) == len(src):  # each row's line in the file, carried through the filters
        src = src.assign(**{_LINE: lines})
    if r is not None and variant is None:  # e.g. r = 1: the runs every variant shares need no variant named
        whole = only_r(src)
        src, variant = one_variant(whole, None)
    else:
        whole = src
        src, variant = one_variant(src, variant)
        src = only_r(src) if r is not None else src
    lines = src[_LINE].tolist() if _LINE in src.columns else None
    src, whole = src.drop(columns=_LINE, errors="ignore"), whole.drop(columns=_LINE, errors="ignore")
    others = _other_variants_rows(whole, src)
    if lw is None:  # one phi per looped r of the rows fitted (status ok)
        if "r" not in src.columns:
            raise ValueError(f"law 'joint_per_r' needs an 'r' column; table has {list(src.columns)}")
        ok = src["status"].astype("string") == "ok" if "status" in src.columns else np.ones(len(src), bool)
        rs = np.unique(pd.to_numeric(src.loc[ok, "r"], errors="coerce").dropna().to_numpy(float))
        if not (rs > 1).any():
            raise ValueError(f"law 'joint_per_r' fits one phi per looped r > 1; the table holds only r = "
                             f"{[int(v) for v in rs]}: use law 'chinchilla'")  # fmt: skip
        check_per_r_anchor(rs, "; the r filter keeps only those: include 1 in it" if r is not None else "")
        lw = make_law(law, rs=tuple(int(v) for v in rs[rs > 1]))
    # the blocking's columns are checked also without a bootstrap (a typo there would otherwise pass unseen)
    try:
        with warnings.catch_warnings():  # prepare's own "table: " warnings are raised below, with the others
            warnings.filterwarnings("ignore", message="table: ")
            data = prepare(with_layers_unique(src), lw, block_by=blocks or None, lines=lines)
    except ValueError:
        if lw.name == "chinchilla":
            _one_point(src)  # seeds of one (N, D): named as one point of the law, not as too few runs
        raise
    # seeds as replicates (one D, several seeds per cell): the joint laws are fitted as `loopscale run`'s analysis
    # fits them, to the cell means, seeds resampled within cells; per_run keeps one point per run
    rep = seed_replicates(data.frame) if lw.name != "chinchilla" else None
    by_cell = rep is not None and not per_run
    not_replicates = not_replicates_note(data.frame, rep.strata) if by_cell and rep.means else None
    units, zero_rec = unit_warnings(data), zero_rec_rows(data)
    input_warnings = [w for w in (data.status_note, not_replicates, *units, zero_rec, data.near_duplicates) if w]
    notes = column_notes(data, lw)
    for w in [*notes.values(), *input_warnings]:  # said before the fit (another unit: the likeliest cause of odd numbers)
        warnings.warn(f"table: {w}", UserWarning, stacklevel=2)
    flat_terms = chinchilla_flat_terms(data) if lw.name == "chinchilla" else _joint_flat_terms(data)
    if lw.name != "chinchilla":
        flat_terms += phi_without_effect(data, lw)
    if lw.name == "joint_per_r":
        flat_terms += _single_point_phis(data)
    if by_cell and block_by not in ("default",):
        raise ValueError(
            f"block_by={block_by!r}: the table's seeds are replicates ({rep.cells} cells of {rep.runs} runs at one "
            "D), so the joint law is fitted as `loopscale run` fits it, its bootstrap resampling seeds within cells; "
            "add --per-run (per_run=True in Python) to fit every run and bootstrap the blocks you chose"
        )
    fit_input = data
    if by_cell and rep.means:  # the exclusions stay those of the runs table
        if rep.cells < lw.n_params:
            raise TooFewRunsError(  # (a run folder's fit attaches the runs left to train, as to prepare's)
                f"the table's seeds are replicates: its {rep.runs} runs are {rep.cells} cells {rep.strata}, fitted "
                f"as {rep.cells} cell means, fewer than the {lw.n_params} parameters of law {lw.name!r}; more seeds "
                "do not help: add cells (another r, width, ladder depth or token budget), or fit every run "
                "(--per-run; per_run=True in Python)"
            )
        fit_input = replace(prepare(rep.fit_frame(data.frame), lw), n_excluded=data.n_excluded,
                            excluded_by_status=data.excluded_by_status, duplicate_run_ids=data.duplicate_run_ids)  # fmt: skip
    fit = fit_data(lw, fit_input, starts=starts, seed=seed, delta=delta)
    boot = None
    if bootstrap:
        # blocks: the columns given, the law's default ones, or None (iid: "iid", "none", None)
        blocking = blocks or ("default" if block_by == "default" else None)
        kw: dict[str, Any] = dict(B=bootstrap, block_by=blocking, seed=seed, starts=starts, point=fit, delta=delta,
                                  progress=progress)  # fmt: skip
        if by_cell:  # as the analysis: seeds drawn within cells (the law refitted to each draw's means)
            kw.update(block_by=None, stratify_by=rep.strata, cell_means=rep.means)
        boot = bootstrap_data(lw, data, workers=workers, **kw)
        from loopscale.fit.bootstrapping import few_resamples_note

        if not boot.no_interval_reason and (few := few_resamples_note(boot.B - boot.n_failed)):
            warnings.warn(f"table: {few}", UserWarning, stacklevel=2)  # `loopscale fit` says it too (few_resamples)
    pooled = sorted({int(v) for v in data.cols["r"]}) if lw.name == "chinchilla" and "r" in data.cols else []
    if len(pooled) > 1:  # one architecture's law fitted to several: `loopscale fit` says so, and so does Python
        warnings.warn(f"table: {pooled_r_note(pooled)}", UserWarning, stacklevel=2)
    ident = None
    if identify:
        strata = rep.strata if by_cell and rep.means else None  # the profile and per-r fits on cell means too
        ident = identification(fit, boot, data.frame, strata=strata, starts=starts, seed=seed)
    return TableFit(
        fit=fit, boot=boot, data=data, law=lw, variant=variant, replicates=rep, by_cell=by_cell,
        flat_terms=flat_terms, pooled_r=pooled if len(pooled) > 1 else [], identification=ident,
        other_variants_rows=others, input_warnings=input_warnings, not_replicates=not_replicates, column_notes=notes,
        unit_warnings=units, zero_rec_rows=zero_rec,
    )  # fmt: skip


def column_notes(data, law: Law) -> dict[str, str]:
    """Which of two columns of one quantity a fit took, where the table holds both and they differ (or where the
    Chinchilla law's N was made of N_once + N_rec): ``{"loss": ...}`` (``loss`` against ``final_val_loss``: every
    parameter changes with it) and, for the Chinchilla law, ``{"N": ...}`` (``N`` against ``N_unique``, or N taken
    as N_once + N_rec: A and alpha change with it); empty when neither applies. ``loopscale fit`` prints them as
    notes (``--json``: ``loss_column_note``, ``n_column_note``)."""
    out = {}
    if note := _loss_column_note(data):
        out["loss"] = note
    if law.name == "chinchilla":
        if data.source_names.get("N") == "N_once + N_rec":
            out["N"] = ("the table has no N: N = N_once + N_rec, the unique parameters (as `loopscale run`'s per-r "
                        "Chinchilla fits take them)")  # fmt: skip
        elif note := _n_column_note(data):
            out["N"] = note
    return out


def _n_column_note(data) -> str | None:
    """A table with both ``N`` and ``N_unique`` whose values differ (e.g. N counts the looped block r times): which
    one the Chinchilla law was fitted on (``N``; ``N_unique`` is read only when a table has no ``N`` column), since
    the choice changes A and alpha."""
    if "N" not in data.frame.columns or not _other_column_differs(data, "N_unique", "N"):
        return None
    return (
        "the table has both N and N_unique, and they differ: the N column was fitted (N_unique is read only when a "
        "table has no N column; drop N to fit on the unique parameters)"
    )


def _loss_column_note(data) -> str | None:
    """A table with both ``loss`` and ``final_val_loss`` whose values differ: which one was fitted (``loss``; the
    other is read only when a table has no ``loss`` column), since the choice changes every parameter."""
    if "loss" in data.source_names or not _other_column_differs(data, "final_val_loss", "loss"):
        return None
    return (
        "the table has both loss and final_val_loss, and they differ: the loss column was fitted (final_val_loss "
        "is read only when a table has no loss column)"
    )


def _other_column_differs(data, other: str, fitted: str) -> bool:
    """Whether the table holds column ``other`` (an alias not fitted) with values that differ from the ``fitted``
    column's, run by run (relative 1e-9)."""
    if other not in data.frame.columns:
        return False
    values = pd.to_numeric(data.frame[other], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    return not np.allclose(values, data.cols[fitted], rtol=1e-9, atol=0.0, equal_nan=False)


def _other_variants_rows(whole: pd.DataFrame, fitted: pd.DataFrame) -> dict[str, int]:
    """{variant: rows of ``whole`` (the table) that the fit of one variant leaves out}: the other variants' looped
    runs, and any r = 1 runs the fitted variant does not use (empty without a ``variant`` column)."""
    if "variant" not in whole.columns or "variant" not in fitted.columns:
        return {}
    have = whole["variant"].astype(str).value_counts()
    used = fitted["variant"].astype(str).value_counts()
    return {str(v): int(n - used.get(v, 0)) for v, n in sorted(have.items()) if n > used.get(v, 0)}


def _blocks(block_by: Any, label: str | None = None) -> tuple[str, ...]:
    """``block_by`` as a tuple of columns (empty for ``"default"``, ``"iid"``, ``"none"``, ``""`` and None);
    ``label``: how the message names the value (default ``block_by '<value>'``; the CLI: ``--block-by <value>``).

    Raises:
        ValueError: a column given twice, or an empty name."""
    if block_by is None or (isinstance(block_by, str) and block_by in ("default", "iid", "none", "")):
        return ()
    bb = tuple(c.strip() for c in block_by.split(",")) if isinstance(block_by, str) else tuple(block_by)
    twice = sorted({c for c in bb if bb.count(c) > 1})
    if twice or "" in bb:
        raise ValueError(
            f"{label or f'block_by {block_by!r}'}: "
            + (f"{', '.join(twice)} given twice" if twice else "an empty column name")
            + "; give each column once, comma-separated (e.g. --block-by budget,r)"
        )
    return bb


def identification(fit, boot, runs, *, strata, starts: int, seed: int):
    """The identification rule (``loopscale.fit.identify``) for a joint fit with phi free, with the effort of
    ``loopscale run``'s analysis (:func:`loopscale.fit.identify.rule_inputs`): ``runs`` the runs fitted (status
    ok), ``strata`` the cell columns when the fit is to cell means (the profile and the per-r fits then use cell
    means and resample seeds within cells, as the analysis), else None; serial."""
    from loopscale.fit.identify import identify, rule_inputs

    ci = boot.ci.get("phi") if boot is not None and not boot.no_interval_reason else None
    profile, per_r = rule_inputs(runs, starts=starts, B=boot.B if boot else 0, seed=seed, strata=strata)
    return identify(fit, ci, profile, per_r, no_interval=boot.no_interval_reason if boot is not None else None,
                    n_resamples=boot.B - boot.n_failed if boot is not None else None)


def _one_point(src: pd.DataFrame) -> None:
    """Raise :func:`chinchilla_flat_terms`'s one-point error when the ok rows of ``src`` share one N (``N`` or
    ``N_unique``, else ``N_once + N_rec``) and one D; return otherwise."""
    ok = src[src["status"].astype("string") == "ok"] if "status" in src.columns else src
    n_col = next((c for c in ("N", "N_unique") if c in ok.columns), None)
    if n_col is None and {"N_once", "N_rec"} <= set(ok.columns):
        ok, n_col = ok.assign(N=pd.to_numeric(ok["N_once"], errors="coerce") + pd.to_numeric(ok["N_rec"],
                                                                                             errors="coerce")), "N"
    if len(ok) and n_col and "D" in ok.columns and ok[n_col].nunique() == 1 and ok["D"].nunique() == 1:
        n, d = (pd.to_numeric(ok[c], errors="coerce").to_numpy(float) for c in (n_col, "D"))
        chinchilla_flat_terms(SimpleNamespace(n=len(ok), cols={"N": n, "D": d}))


def chinchilla_flat_terms(data) -> list[str]:
    """What a Chinchilla fit (L = E + A N^-alpha + B D^-beta) cannot tell apart in ``data``
    (:class:`~loopscale.fit.io.FitData`): with one N the term A N^-alpha is one constant (E, A, alpha not
    identified), with one D the term B D^-beta (E, B, beta), with two N or two D that term is pinned at two values,
    fewer than its three parameters (none of them identified either), and with one and no more than 3 values of the other
    (the 3 parameters left), none of them; with several of each but no more distinct (N, D) points than the law's 5
    parameters, none of them either.

    Raises:
        ValueError: both are single (one point: nothing to fit; the report skips such per-r fits too)."""
    n, d = (np.unique(data.cols[k]) for k in ("N", "D"))
    if n.size < 2 and d.size < 2:
        raise ValueError(
            f"law 'chinchilla': the {data.n} runs fitted share one N ({n[0]:.6g}) and one D ({d[0]:.6g}), one point "
            "of the law: its parameters cannot be fitted (the report skips such fits: it needs >= 6 points with >= 3 "
            "sizes and >= 3 budgets); fit a table with several sizes or budgets, or the joint law across r"
        )
    out = []
    one_n, one_d = n.size < 2, d.size < 2
    if one_n:
        out.append(f"every run has one N = {n[0]:.6g}: A N^-alpha is one constant, so E, A and alpha are not "
                   "identified (only E + A N^-alpha is)")  # fmt: skip
    if one_d:
        out.append(f"every run has one D = {d[0]:.6g}: B D^-beta is one constant, so E, B and beta are not "
                   "identified (only E + B D^-beta is)")  # fmt: skip
    for one, other, left in (("D", n, "E + B D^-beta, A and alpha"), ("N", d, "E + A N^-alpha, B and beta")):
        if (one_d if one == "D" else one_n) and not (one_n and one_d) and other.size <= 3:
            # one term a constant leaves 3 parameters: on no more than 3 values of the other, none is pinned
            out.append(f"the {data.n} runs lie on {other.size} distinct {'N' if one == 'D' else 'D'} at that one "
                       f"{one}, no more than the 3 parameters left ({left}): the fit passes through every point "
                       f"with nothing left over to test it, so none of them is identified (add "
                       f"{'sizes' if one == 'D' else 'token budgets'})")  # fmt: skip
    if not (one_n or one_d):
        for name, v, term, params in (("N", n, "A N^-alpha", "E, A and alpha"), ("D", d, "B D^-beta", "E, B and beta")):
            if v.size == 2:  # the term pinned at two values, fewer than its three parameters (E shared)
                out.append(f"the runs have two {name} ({v[0]:.6g} and {v[1]:.6g}): {term} is pinned at those two "
                           f"only, fewer values than {params}, so none of the three is identified")  # fmt: skip
        points = len({(float(a), float(b)) for a, b in zip(data.cols["N"], data.cols["D"], strict=True)})
        if points <= CHINCHILLA_PARAMS:
            out.append(f"the {data.n} runs lie on {points} distinct (N, D) points (seeds of one cell are one point), "
                       f"no more than the law's {CHINCHILLA_PARAMS} parameters: the fit can pass through every point "
                       "with many parameter sets, so none of them is identified (add sizes or token budgets)")  # fmt: skip
    return out


CHINCHILLA_PARAMS = 5
"""Parameters of the Chinchilla law L = E + A N^-alpha + B D^-beta."""


def _joint_flat_terms(data) -> list[str]:
    """What a joint fit (paper Eq. 3, or one phi per r) cannot tell apart in ``data``: with one D the term
    B D^-beta is one constant, with two it is pinned at two values, fewer than E, B and beta, so none of them is
    identified (the report says so for such a grid too)."""
    from loopscale.fit.identify import d_term_unidentified

    d = d_term_unidentified(data.cols)
    if d is None:
        return []
    if d.size == 2:
        return [f"the runs have two D ({d[0]:.6g} and {d[1]:.6g}): B D^-beta is pinned at those two only, fewer "
                "values than E, B and beta, so none of the three is identified (only E + B D^-beta at each D is)"]  # fmt: skip
    return [f"every run has one D = {d[0]:.6g}: B D^-beta is one constant, so E, B and beta are not identified "
            "(only E + B D^-beta is)"]  # fmt: skip


def phi_without_effect(data, law) -> list[str]:
    """The fitted phi (joint law) or phi_r (one phi per r) that cannot change the law's value at any run of
    ``data``: every looped run (of that r) has ``N_rec = 0``, so ``r^phi N_rec`` is 0 whatever phi (paper Eq. 3).
    The fit then reports any phi in its box (e.g. -0.5 or 2.6 on a table whose N_rec was written as 0 for its
    looped runs), and a bootstrap gives it an interval; one sentence each, none for a fixed phi."""
    c = data.cols
    if "N_rec" not in c or "r" not in c or not law.extra_names:
        return []
    looped = c["r"] > 1
    if law.name == "joint":
        if looped.any() and not np.any(c["N_rec"][looped] > 0):
            return ["every looped run (r > 1) has N_rec = 0: r^phi N_rec is 0 whatever phi, so phi is not "
                    "identified (N_rec is the parameter count of the shared block that is looped r times)"]  # fmt: skip
        return []
    out = []
    for r in sorted({int(v) for v in c["r"][looped]}):
        if f"phi_{r}" in law.extra_names and not np.any(c["N_rec"][c["r"] == r] > 0):
            out.append(f"every run at r = {r} has N_rec = 0: r^phi_{r} N_rec is 0 whatever phi_{r}, so phi_{r} is "
                       "not identified (N_rec is the parameter count of the shared block that is looped r times)")  # fmt: skip
    return out


def zero_rec_rows(data) -> str | None:
    """The input warning for a table where some looped runs (r > 1), not all, have ``N_rec = 0``: no parameters in
    the block they loop, so ``r^phi N_rec`` is 0 for them whatever phi (a typo in those rows, or a plain model's row
    labelled looped); None otherwise (all of them: :func:`phi_without_effect` says phi is not identified)."""
    c = data.cols
    if "N_rec" not in c or "r" not in c:
        return None
    looped = c["r"] > 1
    k = int(np.sum(looped & (c["N_rec"] <= 0)))
    if k == 0 or k == int(looped.sum()):
        return None
    return (f"{k} of {int(looped.sum())} looped runs (r > 1) have N_rec = 0, no parameters in the block they loop: "
            "r^phi N_rec is 0 for them whatever phi; check their N_rec (or their r)")  # fmt: skip


def _single_point_phis(data) -> list[str]:
    """For a fit with one phi per r (:class:`loopscale.fit.laws.JointPerRLaw`): the r whose runs are all at one
    point of the law (one N_once, N_rec and D, seeds aside), one sentence each. The law passes through that point
    whatever it is, so its phi_r takes the point's offset from the other r's law, with no residual to check it by."""
    c = data.cols
    out = []
    for r in sorted({int(v) for v in c["r"] if v > 1}):
        at = c["r"] == r
        points = {(a, b, d) for a, b, d in zip(c["N_once"][at], c["N_rec"][at], c["D"][at], strict=True)}
        if len(points) == 1:
            n = int(at.sum())
            out.append(f"phi_{r} rests on a single point of the law ({n} run{'s' * (n > 1)} at r = {r}, one N and D): "
                       "the law passes through it whatever it is, so nothing in the table checks phi_"
                       f"{r}; add r = {r} runs at other widths or token budgets")  # fmt: skip
    return out


def looped_variants(df: pd.DataFrame) -> list[str]:
    """The variants with looped (r > 1) runs in ``df`` (columns ``variant`` and ``r``), sorted: r = 1 runs are
    labelled ``baseline`` whatever the spec's variants, so they name no variant of their own."""
    return sorted(str(v) for v in df.loc[df["r"] > 1, "variant"].dropna().unique())


def one_variant(df: pd.DataFrame, variant: str | None) -> tuple[pd.DataFrame, str | None]:
    """The rows of one variant's fit (:func:`loopscale.fit.analysis.variant_frames`): ``variant``'s; without it the
    one variant that has looped runs (r = 1 runs are labelled ``baseline`` in every sweep), or the whole table when
    it holds one variant (or has no ``variant`` column). Returns ``(rows, name)``: ``name`` the variant fitted, None
    for a table without a ``variant`` column and no ``variant`` given.

    Raises:
        ValueError: several variants with looped runs and no ``variant`` (pooled, they would be fitted as one law);
            ``variant`` not in the table; several variants and no ``r`` column; looped runs of the variant fitted
            with several ``hc_lanes`` values (:func:`refuse_mixed_lanes`).
    """
    from loopscale.fit.analysis import variant_frames

    names = sorted(str(v) for v in df["variant"].dropna().unique()) if "variant" in df.columns else []
    if len(names) <= 1:  # one variant (or no column): the table is its fit
        if variant is not None and variant not in (names or ["baseline"]):
            if not names:  # no column at all: every run is taken as the baseline
                raise ValueError(f"--variant {variant}: the table has no 'variant' column, so its runs are one "
                                 "architecture's (read as 'baseline'); add a variant column to fit one of several")  # fmt: skip
            raise ValueError(f"--variant {variant}: the table's runs are all of variant {names[0]!r}")
        refuse_mixed_lanes(df, names[0] if names else variant)
        return df, (names[0] if names else variant)
    if "r" not in df.columns:
        raise ValueError(f"the table holds variants {names} but no 'r' column: give one variant's rows")
    looped = looped_variants(df)
    if variant is None:
        if len(looped) > 1:
            raise ValueError(
                f"the table holds variants {looped}: give --variant NAME (variant='NAME' in Python; each variant is "
                "its own fit, its looped runs with the r = 1 runs, as `loopscale run` fits them; pooled they would "
                "be fitted as one law)"
            )
        if not looped:
            return df, None
        variant = looped[0]  # one looped variant beside the shared r = 1 runs: that variant's fit
    if variant not in names:
        raise ValueError(f"--variant {variant}: the table's variants are {names}")
    if variant not in looped:
        raise ValueError(f"--variant {variant}: it has no looped (r > 1) runs in the table; the variants with looped "
                         f"runs are {looped}")  # fmt: skip
    rows = variant_frames(df)[variant]
    refuse_mixed_lanes(rows, variant)
    return rows, variant


def refuse_mixed_lanes(rows: pd.DataFrame, variant: str | None) -> None:
    """Refuse one fit of looped runs with several hyperconnection lane counts (``hc_lanes``): each K is another
    architecture (a spec takes one ``hyperconnect`` variant, and its error says to compare lane counts in separate
    ``--out`` folders), but the tables of two such folders, put together, were fitted as one law without a word.

    Raises:
        ValueError: naming the variant and the lane counts."""
    if "hc_lanes" not in rows.columns or "r" not in rows.columns:
        return
    lanes = sorted({int(k) for k in rows.loc[rows["r"] > 1, "hc_lanes"].dropna().unique()})
    if len(lanes) > 1:
        who = f"variant {variant!r}" if variant else "the table"
        raise ValueError(
            f"{who} holds looped runs with {' and '.join(map(str, lanes))} hyperconnection lanes (hc_lanes): each "
            "lane count is another architecture, and pooled they would be fitted as one law; fit each apart (the "
            "rows of one hc_lanes value with the r = 1 runs), as a spec keeps them in separate --out folders"
        )


class PerRunFitWarning(UserWarning):
    """:func:`loopscale.fit.fitter.fit_law` or :func:`loopscale.fit.bootstrapping.bootstrap` fitted a table
    otherwise than ``loopscale fit`` would (:func:`fit_table` fits it as the CLI does)."""


def check_per_run_table(data, law: Law, who: str, *, stratified: bool = False) -> None:
    """What the per-run fitters (``fit_law``, ``bootstrap``) refuse or say of a table that ``loopscale fit`` fits
    otherwise: several variants with looped runs (pooled into one law: refused), a Chinchilla fit of one point
    (refused), a Chinchilla table with one N or one D (:class:`PerRunFitWarning`), and seeds that are replicates
    of at least as many cells as the joint law's parameters, which the CLI and ``loopscale run`` fit as cell means
    (:class:`PerRunFitWarning`, unless ``stratified``: a bootstrap told to resample within cells).

    Args:
        data: the validated table (:class:`~loopscale.fit.io.FitData`). law: the law fitted. who: the function's
            name, for the messages.
    Raises:
        ValueError: pooled looped variants, or a Chinchilla fit of one point.
    """
    import warnings

    from loopscale.fit.analysis import seed_replicates
    from loopscale.fit.io import with_layers_unique

    frame = data.frame
    if "variant" in frame.columns and "r" in frame.columns:
        if len(looped := looped_variants(frame)) > 1:
            raise ValueError(
                f"{who}: the table holds variants {looped} with looped runs; each is its own fit (its looped runs "
                "with the r = 1 runs), pooled they would be fitted as one law: give one variant's rows, or "
                "fit_table(table, variant='NAME') (loopscale.fit), as `loopscale fit --variant NAME`"
            )
    if law.name == "chinchilla":
        for term in chinchilla_flat_terms(data):
            warnings.warn(f"{who}: {term}", PerRunFitWarning, stacklevel=3)
        return
    rep = None if stratified else seed_replicates(with_layers_unique(frame))
    if rep is not None and rep.means:
        warnings.warn(
            f"{who}: the table's seeds are replicates ({rep.cells} cells of {rep.runs} runs at one D; cells: "
            f"{', '.join(rep.strata)}): `loopscale fit` and `loopscale run` fit the law to the cell means and "
            "resample seeds within cells, while this fits every run as a point; fit_table(table) "
            "(loopscale.fit) fits as they do",
            PerRunFitWarning,
            stacklevel=3,
        )

