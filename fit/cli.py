"""``loopscale fit``: fit a scaling law to a runs table, optionally bootstrap it, write JSON/Parquet/PNG."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from loopscale.cluster.options import AddressOpt, NumCpusOpt, NumGpusOpt, RayTempDirOpt

#: What ``--out`` may hold from a fit besides ``fit.json``; those a fit does not write are an earlier fit's.
_FIT_FILES = ("bootstrap.parquet", "phi_bootstrap.png", "identification.json", "fit_curves.png", "residuals.png")


def fit_cmd(
    table: Annotated[
        Path,
        typer.Argument(help="Runs table (.parquet or .csv): loss/final_val_loss, D, N or N_once/N_rec/r."),
    ],
    law: Annotated[
        str,
        typer.Option(
            "--law",
            help="'joint': paper Eq. 3, one phi for every r (with --phi: phi fixed); 'joint_per_r': Eq. 3 with one "
            "phi_<r> per looped r > 1 of the table, to see whether a single phi fits (point fit, no --bootstrap); "
            "'chinchilla': L = E + A·N^-alpha + B·D^-beta on N (or N_unique), one architecture (e.g. with --r 4).",
        ),
    ] = "joint",
    phi: Annotated[
        float | None, typer.Option("--phi", help="Fix phi (restricted joint fit, e.g. 0 or 1).")
    ] = None,
    bootstrap: Annotated[
        int, typer.Option("--bootstrap", min=0, help="Bootstrap resamples B (0: none).")
    ] = 0,
    block_by: Annotated[
        str,
        typer.Option(
            "--block-by",
            help="Bootstrap cells of a per-run fit: comma-separated columns (e.g. 'budget,r'), 'iid', or 'default' "
            "(joint: budget,r / C,r / D,r; chinchilla: iid). A joint fit to cell means (seeds as replicates, see "
            "--per-run) resamples seeds within cells instead; there --block-by needs --per-run.",
        ),
    ] = "default",
    per_run: Annotated[
        bool,
        typer.Option(
            "--per-run",
            help="Joint laws on a table whose seeds are replicates (one D, several seeds per cell, as `loopscale "
            "run`'s analysis detects them): fit every run as its own point and bootstrap blocks (--block-by) "
            "instead of fitting the cell means (seeds averaged) and resampling seeds within cells, as the "
            "analysis does (the default). No effect on other tables or on --law chinchilla (always per run).",
        ),
    ] = False,
    r_only: Annotated[
        str | None,
        typer.Option(
            "--r",
            help="Use only rows with these r (comma-separated, e.g. '4' for the per-architecture Chinchilla fit "
            "of r = 4, as the paper's Table 1).",
        ),
    ] = None,
    variant: Annotated[
        str | None,
        typer.Option(
            "--variant",
            help="Fit this variant's runs (its looped runs and the r = 1 runs, as `loopscale run` fits each variant); "
            "required when the table holds several variants.",
        ),
    ] = None,
    starts: Annotated[int, typer.Option("--starts", min=1, help="Starts per fit (paper: 500).")] = 500,
    seed: Annotated[int, typer.Option("--seed", help="Seed for starts and resamples.")] = 0,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", min=1, help="Parallel bootstrap workers (embedded Ray CPUs; 1 = serial, no Ray)."
        ),
    ] = None,
    delta: Annotated[
        float, typer.Option("--delta", help="Huber threshold on log loss (paper: 1e-3).")
    ] = 1e-3,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the fit as one JSON object on stdout.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option(
            "--out", help="Write fit.json, bootstrap.parquet and PNGs here (an earlier fit's files there that this fit "
            "does not write, e.g. its bootstrap.parquet, are moved into a folder earlier_fit_<UTC time> there). "
            "`loopscale report` is for a `loopscale run` folder, not for this one.",
        )
    ] = None,
    check_identified: Annotated[
        bool,
        typer.Option(
            "--identify",
            help="Joint law with phi free (needs --bootstrap): apply the identification rule of `loopscale run` "
            "(parameters on the search-box edge, the profile of the objective in phi, phi fitted per r) and print "
            "its verdict. The "
            "profile refits the law at 41 values of phi, in one batch (about 3 s for 50 runs on one core).",
        ),
    ] = False,
    address: AddressOpt = None,
    num_cpus: NumCpusOpt = None,
    num_gpus: NumGpusOpt = None,
    ray_temp_dir: RayTempDirOpt = None,
) -> None:
    """Fit L = E + A·N_x^-alpha + B·D^-beta (joint: N_x = N_once + r^phi·N_rec) with the paper's Huber-LSE objective;
    with --bootstrap B, percentile 95 % CIs from B block (default) or iid resamples refitted as Ray tasks. Rows whose
    status is not 'ok' are excluded and counted (n_excluded, excluded_by_status), and so are older rows of a run_id
    that appears more than once (excluded_duplicates; the newest row is fitted). TABLE may also be the output folder
    of `loopscale run` or `sweep` (its runs.parquet is used). For the joint law with phi free the verdict of the
    identification rule is printed with --identify (and is `identification` in --json)."""
    import numpy as np
    import pandas as pd

    from loopscale.cluster.options import ClusterOptions
    from loopscale.fit.bootstrapping import bootstrap_data
    from loopscale.fit.fitter import fit_data
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law
    from loopscale.fit.outputs import summary_dict, write_fit_outputs

    if table.is_dir():
        if not (table / "runs.parquet").is_file():
            raise ValueError(
                f"{str(table)!r} is a folder without runs.parquet: give a runs table (.parquet or .csv) or the "
                "output folder of `loopscale run` / `loopscale sweep`"
            )
        table = table / "runs.parquet"
    if workers is not None and num_cpus is not None and workers != num_cpus:
        raise ValueError(f"--workers {workers} and --num-cpus {num_cpus} disagree; give one of them")
    if workers == 1 and address is not None:
        raise ValueError(
            f"--workers 1 runs the bootstrap serially, without Ray, and --address {address} joins a Ray cluster for "
            "it: drop --address, or drop --workers to use the cluster's CPUs"
        )
    opts = ClusterOptions(
        address=address,
        num_cpus=num_cpus or (workers if address is None and workers != 1 else None),
        num_gpus=num_gpus,
        ray_temp_dir=ray_temp_dir,
    )
    opts.validate()
    if law == "joint_per_r" and bootstrap:
        raise ValueError(
            "--law joint_per_r is a point fit (a resample that misses one r would leave its phi_<r> unfitted): drop "
            "--bootstrap, or use --law joint --identify --bootstrap B, whose check fits phi per r with intervals"
        )
    if check_identified and not (law == "joint" and phi is None):
        raise ValueError(
            "--identify applies to the joint law with phi free (it decides whether the data identify phi); drop "
            + ("--phi" if phi is not None else f"--law {law}")
        )
    if check_identified and not bootstrap:
        raise ValueError(
            "--identify needs --bootstrap B (e.g. --bootstrap 50): the rule checks the ends of phi's interval and "
            "phi fitted per r with its intervals, both from resamples; without them it would accept phi unchecked"
        )
    if out is not None:
        from loopscale.cluster.options import usable_out_dir

        usable_out_dir(out)  # before the fit, so that a file in the way costs no compute
    lw = make_law(law, phi) if law != "joint_per_r" else None  # joint_per_r: its r come from the table, below
    if law == "joint_per_r" and phi is not None:
        make_law(law, phi)  # raises: phi cannot be fixed for the per-r law
    bb = None
    if block_by not in ("default", "iid", "none", ""):
        bb = tuple(c.strip() for c in block_by.split(","))
        twice = sorted({c for c in bb if bb.count(c) > 1})
        if twice or "" in bb:
            raise ValueError(
                f"--block-by {block_by}: "
                + (f"{', '.join(twice)} given twice" if twice else "an empty column name")
                + "; give each column once, comma-separated (e.g. --block-by budget,r)"
            )
    from loopscale.fit.io import read_table

    src = read_table(table)
    src, variant = _one_variant(src, variant)
    if r_only is not None:
        try:
            keep = {int(x) for x in r_only.split(",") if x.strip()}
        except ValueError:
            raise ValueError(f"--r must list integers, e.g. --r 4 or --r 1,2; got {r_only!r}") from None
        if "r" not in src.columns:
            raise ValueError(f"--r given but the table has no 'r' column; columns: {list(src.columns)}")
        have = sorted(int(x) for x in src["r"].dropna().unique())
        if not keep <= set(have):
            raise ValueError(f"--r {r_only}: the table has r = {have}")
        src = src[src["r"].isin(keep)].reset_index(drop=True)
    if lw is None:  # one phi per looped r of the rows fitted (status ok), as fit_law(law="joint_per_r")
        if "r" not in src.columns:
            raise ValueError(f"--law joint_per_r needs an 'r' column; table has {list(src.columns)}")
        ok = src["status"].astype("string") == "ok" if "status" in src.columns else np.ones(len(src), bool)
        rs = np.unique(pd.to_numeric(src.loc[ok, "r"], errors="coerce").dropna().to_numpy(float))
        if not (rs > 1).any():
            raise ValueError(f"--law joint_per_r fits one phi per looped r > 1; the table holds only r = "
                             f"{[int(v) for v in rs]}: use --law chinchilla")  # fmt: skip
        lw = make_law(law, rs=tuple(int(v) for v in rs[rs > 1]))
    from loopscale.fit.analysis import seed_replicates
    from loopscale.fit.io import with_layers_unique

    # the blocking's columns are checked also without --bootstrap (a typo there would otherwise pass unseen)
    data = prepare(with_layers_unique(src), lw, block_by=bb)
    if not (delta > 0):
        raise ValueError(f"--delta {delta} must be > 0 (paper: 1e-3)")
    flat_terms = _chinchilla_flat_terms(data) if lw.name == "chinchilla" else []
    # seeds as replicates (one D, several seeds per cell): the joint laws are fitted as `loopscale run`'s analysis
    # fits them, to the cell means, seeds resampled within cells; --per-run keeps one point per run
    rep = seed_replicates(data.frame) if lw.name != "chinchilla" else None
    by_cell = rep is not None and not per_run
    if by_cell and block_by != "default":
        raise ValueError(
            f"--block-by {block_by}: the table's seeds are replicates ({rep.cells} cells of {rep.runs} runs at one "
            "D), so the joint law is fitted as `loopscale run` fits it, its bootstrap resampling seeds within cells; "
            "add --per-run to fit every run and bootstrap the blocks you chose"
        )
    fit_input = data
    if by_cell and rep.means:  # the exclusions stay those of the runs table
        fit_input = replace(prepare(rep.fit_frame(data.frame), lw), n_excluded=data.n_excluded,
                            excluded_by_status=data.excluded_by_status, duplicate_run_ids=data.duplicate_run_ids)  # fmt: skip
    fit = fit_data(lw, fit_input, starts=starts, seed=seed, delta=delta)
    boot = None
    if bootstrap:
        block_arg = None if block_by in ("iid", "none", "") else (bb if bb else "default")
        kw = dict(
            B=bootstrap,
            block_by=block_arg,
            seed=seed,
            starts=starts,
            point=fit,
            delta=delta,
            progress=not json_out,
        )
        if by_cell:  # as the analysis: seeds drawn within cells (the law refitted to each draw's means)
            kw.update(block_by=None, stratify_by=rep.strata, cell_means=rep.means)
        n_workers = workers if workers is not None else num_cpus
        import warnings

        with warnings.catch_warnings():  # its "no interval" warning is the summary's own line (below), said once
            warnings.filterwarnings("ignore", message="bootstrap: no interval")
            if address is None and num_gpus is None and ray_temp_dir is None:
                # serial for 1 worker, else a fresh embedded local Ray started (and stopped) by the bootstrap itself
                boot = bootstrap_data(lw, data, workers=n_workers, **kw)
            else:
                with opts.session():
                    boot = bootstrap_data(lw, data, workers=n_workers, address=None, **kw)
    summary = summary_dict(fit, boot)
    if variant is not None:
        summary["variant"] = variant
    fitted_to, fitted_line = _fitted_to(rep, per_run, data.n, bootstrap > 0)
    if fitted_to is not None:
        summary["fitted_to"] = fitted_to
    pooled = sorted({int(v) for v in data.cols["r"]}) if lw.name == "chinchilla" and "r" in data.cols else []
    pooled_note = None
    if len(pooled) > 1:  # one architecture's law fitted to several: said, with the way to fit one
        summary["pooled_r"] = pooled
        pooled_note = (
            f"the Chinchilla law was fitted to the runs of r = {', '.join(map(str, pooled))} pooled, as one "
            f"architecture (on N_unique that is the joint law at --phi 0); --r R fits one, e.g. --r {pooled[-1]}"
        )
        summary["pooled_r_note"] = pooled_note
    if flat_terms:
        summary["not_identified"] = flat_terms
    loss_note = _loss_column_note(data)
    if loss_note:
        summary["loss_column_note"] = loss_note
    ident = None
    if check_identified and law == "joint" and phi is None:
        strata = rep.strata if by_cell and rep.means else None  # the profile and per-r fits on cell means too
        ident = _identification(fit, boot, data.frame, strata=strata, starts=starts, seed=seed)
        summary["identification"] = ident.to_dict()
    if out is not None:
        summary["outputs"] = write_fit_outputs(out, fit, boot, extra={"variant": variant} if variant else None)
        if ident is not None:
            from loopscale.cluster.storage import write_text_atomic

            path = Path(out) / "identification.json"
            write_text_atomic(str(path), json.dumps(summary["identification"], allow_nan=False, indent=1))
            summary["outputs"]["identification.json"] = str(path)
        # an earlier fit's files that this one did not write (its bootstrap, its verdict) would read as this fit's:
        # moved into a folder of their own (nothing written is lost)
        stale = [n for n in _FIT_FILES if n not in summary["outputs"] and (Path(out) / n).is_file()]
        if stale:
            import time

            aside = Path(out) / f"earlier_fit_{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
            aside.mkdir(exist_ok=True)
            for name in stale:
                (Path(out) / name).replace(aside / name)
            summary["moved_aside"] = {"files": stale, "to": str(aside)}
    if json_out:
        typer.echo(json.dumps(summary, allow_nan=False))
        return
    p = fit.params
    from loopscale.fit.bootstrapping import ESTIMATE_OUTSIDE_CI_NOTE
    from loopscale.fit.io import DUPLICATE_RUN_ID

    outside = set(boot.estimate_outside_ci) if boot is not None else set()

    excluded = dict(fit.excluded_by_status)
    if fit.excluded_duplicates:
        excluded[DUPLICATE_RUN_ID] = len(fit.excluded_duplicates)
    lines = [
        f"law {fit.law}{f' (variant {variant})' if variant else ''}: n = {data.n} runs ({fit.n_excluded} excluded: "
        f"{excluded or '-'})",
        "  "
        + "  ".join(
            f"{k} = {v:.5g}"
            + (
                f" [{boot.ci[k][0]:.4g}, {boot.ci[k][1]:.4g}]" + ("*" if k in outside else "")
                if boot and k in boot.ci and not boot.no_interval_reason
                else ""
            )
            for k, v in p.items()
        ),
        f"  R2 = {fit.r2:.5f}  RMSE = {fit.rmse:.4f}  max|res| = {fit.max_abs_residual:.4f}  objective = {fit.objective:.6g}"
        f"  on_bound = {fit.on_bound or '-'}",
    ]
    if outside:
        lines.insert(2, f"  * {ESTIMATE_OUTSIDE_CI_NOTE}")
    if fitted_line:
        lines.insert(1, f"  {fitted_line}")
    if fit.excluded_duplicates:
        ids = sorted(set(fit.excluded_duplicates))
        lines.append(
            f"  excluded ({DUPLICATE_RUN_ID}): {len(fit.excluded_duplicates)} older row(s) of a run_id that appears "
            f"more than once (the newest row of a run is fitted: largest finished_at, else the last): {', '.join(ids[:5])}"
            + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        )
    if boot is not None:
        blocking = ",".join(boot.block_by) if boot.block_by else "iid"
        if boot.extra.get("stratify_by"):
            blocking = "seeds within cells"
        if boot.no_interval_reason:  # no resample was refitted: counts of failed refits would mislead
            lines.append(f"  bootstrap B = {boot.B} ({blocking}): 0 of {boot.B} resamples refitted, so no interval")
        else:
            lines.append(
                f"  bootstrap B = {boot.B} ({blocking}): degenerate {boot.n_degenerate} (redrawn), "
                f"failed {boot.n_failed} (dropped), warm-start share {boot.warm_start_share:.3f} (refits that "
                "ended at their warm start, the point estimate; a high share can mean stuck refits)"
            )
        if boot.no_interval_reason:
            lines.append(f"  warning: no interval: {boot.no_interval_reason}")
    if fit.on_bound:
        lines.append(
            f"  warning: {', '.join(fit.on_bound)} on the search box edge: the data do not identify "
            f"{'them' if len(fit.on_bound) > 1 else 'it'}, so read the other parameters (and their intervals) with care"
        )
    if pooled_note:
        lines.append(f"  note: {pooled_note}")
    if loss_note:
        lines.append(f"  note: {loss_note}")
    for term in flat_terms:
        lines.append(f"  warning: {term}")
    if ident is not None:
        lines.append(f"  identification: {ident.headline}")
    elif law == "joint" and phi is None:
        lines.append(
            "  identification: not checked; --identify --bootstrap B applies the rule of `loopscale run` (a "
            "parameter on the search-box edge, a flat profile in phi, per-r phi without a common value)"
        )
    if out is not None:
        lines.append(f"  wrote {', '.join(sorted(summary['outputs']))} to {out}")
        if summary.get("moved_aside"):
            m = summary["moved_aside"]
            lines.append(f"  moved {', '.join(m['files'])} (an earlier fit's, not this one's) to {m['to']}")
    print("\n".join(lines), file=sys.stdout)


def _identification(fit, boot, runs, *, strata, starts: int, seed: int):
    """The identification rule (``loopscale.fit.identify``) for a joint fit with phi free, with the effort of
    ``loopscale run``'s analysis (:func:`loopscale.fit.identify.rule_inputs`): ``runs`` the runs fitted (status
    ok), ``strata`` the cell columns when the fit is to cell means (the profile and the per-r fits then use cell
    means and resample seeds within cells, as the analysis), else None; serial."""
    from loopscale.fit.identify import identify, rule_inputs

    ci = boot.ci.get("phi") if boot is not None and not boot.no_interval_reason else None
    profile, per_r = rule_inputs(runs, starts=starts, B=boot.B if boot else 0, seed=seed, strata=strata)
    return identify(fit, ci, profile, per_r)


def _chinchilla_flat_terms(data) -> list[str]:
    """What a Chinchilla fit (L = E + A N^-alpha + B D^-beta) cannot tell apart in ``data``: with one N the term
    A N^-alpha is one constant (E, A, alpha not identified), with one D the term B D^-beta (E, B, beta). Raises
    ValueError when both are single (one point: nothing to fit; the report skips such per-r fits too)."""
    import numpy as np

    n, d = (np.unique(data.cols[k]) for k in ("N", "D"))
    if n.size < 2 and d.size < 2:
        raise ValueError(
            f"--law chinchilla: the {data.n} runs fitted share one N ({n[0]:.6g}) and one D ({d[0]:.6g}), one point "
            "of the law: its parameters cannot be fitted (the report skips such fits: it needs >= 6 runs with >= 2 "
            "sizes and >= 2 budgets); fit a table with several sizes or budgets, or --law joint across r"
        )
    out = []
    if n.size < 2:
        out.append(f"every run has one N = {n[0]:.6g}: A N^-alpha is one constant, so E, A and alpha are not "
                   "identified (only E + A N^-alpha is)")  # fmt: skip
    if d.size < 2:
        out.append(f"every run has one D = {d[0]:.6g}: B D^-beta is one constant, so E, B and beta are not "
                   "identified (only E + B D^-beta is)")  # fmt: skip
    return out


def _fitted_to(rep, per_run: bool, n_runs: int, bootstrapped: bool) -> tuple[dict | None, str | None]:
    """What a joint fit was fitted to, for --json (``fitted_to``) and the console (one line), given the table's
    :class:`~loopscale.fit.analysis.SeedReplicates` (None: seeds are not replicates; the fit is per run, nothing
    said)."""
    if rep is None:
        return None, None
    cols = ", ".join(rep.strata)
    d = {"runs": n_runs, "cells": rep.cells, "cell_columns": list(rep.strata), "per_run": per_run}
    if per_run:
        return {**d, "what": "runs", "bootstrap": "blocks"}, (
            f"fitted to {n_runs} runs, one point each (--per-run); their seeds are replicates of {rep.cells} cells "
            f"({cols}), which `loopscale run` fits as cell means"
        )
    boot = "; bootstrap resamples seeds within cells" if bootstrapped else ""
    d["bootstrap"] = "seeds_within_cells"
    if rep.means:
        return {**d, "what": "cell_means"}, (
            f"fitted to {rep.cells} cell means of {n_runs} runs (seeds averaged){boot}, as `loopscale run` (cells: "
            f"{cols}; --per-run fits every run)"
        )
    return {**d, "what": "runs"}, (
        f"fitted to {n_runs} runs: their seeds are replicates, but {rep.cells} cells are fewer than the law's "
        f"parameters, so the runs are fitted{boot}, as `loopscale run` (cells: {cols})"
    )


def _one_variant(df, variant: str | None):
    """The rows of one variant's fit (:func:`loopscale.fit.analysis.variant_frames`): ``variant``'s; without it the
    one variant that has looped runs (r = 1 runs are labelled ``baseline`` in every sweep), or the whole table when
    it holds one variant (or has no ``variant`` column). Returns ``(rows, name)``: ``name`` the variant fitted, None
    for a table without a ``variant`` column and no ``variant`` given.

    Raises:
        ValueError: several variants with looped runs and no ``variant`` (pooled, they would be fitted as one law);
            ``variant`` not in the table; several variants and no ``r`` column.
    """
    from loopscale.fit.analysis import variant_frames

    names = sorted(str(v) for v in df["variant"].dropna().unique()) if "variant" in df.columns else []
    if len(names) <= 1:  # one variant (or no column): the table is its fit
        if variant is not None and variant not in (names or ["baseline"]):
            raise ValueError(f"--variant {variant}: the table's runs are all of variant {(names or ['baseline'])[0]!r}")
        return df, (names[0] if names else variant)
    if "r" not in df.columns:
        raise ValueError(f"the table holds variants {names} but no 'r' column: give one variant's rows")
    # the variants with looped runs: r = 1 runs are labelled baseline whatever the spec's variants
    looped = sorted(str(v) for v in df.loc[df["r"] > 1, "variant"].dropna().unique())
    if variant is None:
        if len(looped) > 1:
            raise ValueError(
                f"the table holds variants {looped}: give --variant NAME (each variant is its own fit, its looped "
                "runs with the r = 1 runs, as `loopscale run` fits them; pooled they would be fitted as one law)"
            )
        if not looped:
            return df, None
        variant = looped[0]  # one looped variant beside the shared r = 1 runs: that variant's fit
    frames = variant_frames(df)
    if variant not in frames:
        raise ValueError(f"--variant {variant}: the table's variants are {names}")
    if variant not in looped:
        raise ValueError(f"--variant {variant}: it has no looped (r > 1) runs in the table; the variants with looped "
                         f"runs are {looped}")
    return frames[variant], variant


def _loss_column_note(data) -> str | None:
    """A table with both ``loss`` and ``final_val_loss`` whose values differ: which one was fitted (``loss``; the
    other is read only when a table has no ``loss`` column), since the choice changes every parameter."""
    frame = data.frame
    if "loss" in data.source_names or "final_val_loss" not in frame.columns:
        return None
    import numpy as np
    import pandas as pd

    other = pd.to_numeric(frame["final_val_loss"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    if np.allclose(other, data.cols["loss"], rtol=1e-9, atol=0.0, equal_nan=False):
        return None
    return (
        "the table has both loss and final_val_loss, and they differ: the loss column was fitted (final_val_loss "
        "is read only when a table has no loss column)"
    )
