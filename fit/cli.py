"""``loopscale fit``: fit a scaling law to a runs table, optionally bootstrap it, write JSON/Parquet/PNG."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from loopscale.cluster.options import AddressOpt, NumCpusOpt, NumGpusOpt, RayTempDirOpt


@contextlib.contextmanager
def _out_dir_lock(out: Path):
    """Hold an exclusive lock on the folder ``out`` (``flock`` on its file descriptor; created when absent) while a
    fit runs and writes there, so that a second ``loopscale fit --out`` into it is refused instead of one fit's
    files silently replacing the other's. No lock file is left: the lock ends with the descriptor (also when the
    process dies), and the folders this call created are removed again when the fit left them empty (a refused table).

    The lock is the kernel's, so it excludes fits on this machine; on a network file system (NFS) another machine's
    fit is not seen. A file system that offers no ``flock`` (e.g. Lustre mounted ``noflock``) gets a warning and no
    lock.

    Raises:
        ValueError: another process holds the lock (another fit writes there now).
    """
    import fcntl
    import os
    import warnings

    out = Path(out)
    created = [p for p in (out, *out.parents) if not p.exists()]  # innermost first
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    locked = refused = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            refused = True
            raise ValueError(
                f"--out {out}: another `loopscale fit` is writing its fit there now (it holds the folder's lock), and "
                "two fits in one folder would replace each other's files; wait for it to end, or give another --out"
            ) from None
        except OSError as e:  # no flock on this file system: the fit goes on, unguarded
            warnings.warn(f"--out {out}: the folder cannot be locked ({e.strerror or e}); a second `loopscale fit` "
                          "into it now would not be refused", UserWarning, stacklevel=3)  # fmt: skip
        try:
            yield
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
        # the folders this call created, left empty (a refused table); not when another fit holds the folder: it
        # may have just created it and not written yet
        for p in [] if refused else created:
            try:
                p.rmdir()
            except OSError:  # not empty: the fit wrote there
                break


UNFINISHED_GRID_NOTE = None
"""``(table path, refused=False) -> str | None``: the warning ``fit`` prints (``--json``: ``unfinished_grid``) for a run
folder's table that lacks runs its spec plans (``refused=True``: the words added to the error of a fit refused for too
few runs). The loopscale command line sets it (:func:`loopscale.sweep.run.unfinished_grid_note`): fit/ reads tables
and knows no spec."""


def _fit_of_folder(fit_table, table, law: str, kw: dict):
    """``fit_table(table, law, **kw)``; a fit refused for too few runs (:class:`loopscale.fit.io.TooFewRunsError`)
    of a run or sweep folder whose spec plans runs not trained yet gets :data:`UNFINISHED_GRID_NOTE`'s count of
    them and where to train them added to its message (ValueError); not a fit of some of its runs (``--variant``,
    ``--r``), whose missing runs may all be others'."""
    from loopscale.fit.io import TooFewRunsError

    try:
        return fit_table(table, law, **kw)
    except TooFewRunsError as e:
        filtered = kw.get("variant") is not None or kw.get("r") is not None  # the runs missing may be of others
        if UNFINISHED_GRID_NOTE is not None and not filtered and (
                why := UNFINISHED_GRID_NOTE(table, refused=True)):  # fmt: skip
            raise ValueError(f"{e}; {why}") from None
        raise


def fit_cmd(
    table: Annotated[
        Path,
        typer.Argument(help="Runs table (.parquet or .csv): loss or final_val_loss (nats/token: ln of a perplexity, "
                       "bits x ln 2), D (tokens), and N (parameters; Chinchilla law) or N_once, N_rec (parameters) "
                       "and r (joint law)."),
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
            "(joint: budget,r if the table has budget, else D,r, or C,r where that makes fewer cells; chinchilla: "
            "iid). A joint fit to cell means (seeds as replicates, see "
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
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed for starts and resamples.")] = 0,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", min=1, help="Parallel bootstrap workers (embedded Ray CPUs; 1 = serial, no Ray). Default: every core, through "
            "an embedded Ray (a point fit, or a bootstrap of one chunk of refits, starts none)."
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
            "--out", help="Write fit.json, bootstrap.parquet (with --identify identification.json) and PNGs here (an earlier fit's files there are first moved "
            "into a folder earlier_fit_<UTC time> there; a `loopscale run` folder, its fit/ and the folders it writes "
            "are refused, and so is a folder another `loopscale fit` is writing now). "
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
    from loopscale.cluster.options import ClusterOptions
    from loopscale.fit.laws import make_law
    from loopscale.fit.outputs import summary_dict, write_fit_outputs
    from loopscale.fit.table_fit import _blocks

    if table.is_dir():
        if not (table / "runs.parquet").is_file():
            from loopscale.fit.run_report import is_loopscale_folder, no_runs_table_message

            if is_loopscale_folder(table):  # e.g. a run killed before it wrote the table: say what rebuilds it
                raise ValueError(no_runs_table_message(table, torn=False))
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
    if workers == 1 and (unused := [o for o, v in (("--num-gpus", num_gpus), ("--ray-temp-dir", ray_temp_dir))
                                    if v is not None]):  # fmt: skip
        raise ValueError(f"--workers 1 runs the bootstrap serially, without Ray, so {' and '.join(unused)} would "
                         "change nothing: drop " + (" and ".join(unused)) + ", or --workers")
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
        from loopscale.fit.outputs import FIT_FILES, check_fit_out_dir

        check_fit_out_dir(out)

        if blocked := [n for n in FIT_FILES if (Path(out) / n).exists() and not (Path(out) / n).is_file()]:
            raise ValueError(  # the fit ran to its end, then could not put its file there (a traceback)
                f"--out {out} holds {', '.join(blocked)} as {'folders' if len(blocked) > 1 else 'a folder'}, where "
                "the fit writes a file of that name; move it away, or give another --out"
            )
    if not (delta > 0):
        raise ValueError(f"--delta {delta} must be > 0 (paper: 1e-3)")
    from loopscale.fit.laws import PHI_BOUNDS

    if phi is not None and not (math.isfinite(phi) and PHI_BOUNDS[0] <= phi <= PHI_BOUNDS[1]):  # in the flag's words
        raise ValueError(f"--phi {phi} must be a number in the paper's box [{PHI_BOUNDS[0]:g}, {PHI_BOUNDS[1]:g}], e.g. "
                         "--phi 0 or --phi 1")  # fmt: skip
    make_law(law, phi, **({"rs": (2,)} if law == "joint_per_r" else {}))  # an unknown law, a bad phi: said first
    _blocks(block_by, label=f"--block-by {block_by}")  # a column given twice or empty: said before the table
    if r_only is not None:
        entries = [x.strip() for x in r_only.split(",")]
        if r_only.strip() and not all(entries):  # `--r 1,,2` or `--r 4,`: a typo, as `design --seeds 8,,16`
            raise ValueError(f"--r {r_only}: an empty entry; list integers separated by commas, e.g. --r 4 or --r 1,2")
        try:
            r_keep = sorted({int(x) for x in entries if x})
        except ValueError:
            raise ValueError(f"--r must list integers, e.g. --r 4 or --r 1,2; got {r_only!r}") from None
    with _out_dir_lock(out) if out is not None else contextlib.nullcontext():  # one fit at a time writes there
        from loopscale.fit.table_fit import fit_table

        n_workers = workers if workers is not None else num_cpus
        kw = dict(
            phi=phi, variant=variant, r=r_keep if r_only is not None else None, per_run=per_run, bootstrap=bootstrap,
            block_by=block_by, identify=check_identified, starts=starts, seed=seed, delta=delta, workers=n_workers,
            progress=True,
        )  # fmt: skip
        import warnings

        from loopscale.fit.bootstrapping import plain_progress_lines

        # the bootstrap's `bootstrap: i/n chunks` lines go to stderr (with --json as plain as piped); stdout stays the JSON
        with warnings.catch_warnings(), plain_progress_lines() if json_out else contextlib.nullcontext():
            # its "no interval" and one-seed-cells warnings are the summary's own lines (below), said once
            warnings.filterwarnings("ignore", message="bootstrap: no interval")
            warnings.filterwarnings("ignore", message="table: ")  # the table's input warnings: printed below
            warnings.filterwarnings("ignore", message=r"bootstrap: \d+ of \d+ cells have one seed")
            if not bootstrap or (address is None and num_gpus is None and ray_temp_dir is None):
                # serial for 1 worker, else a fresh embedded local Ray started (and stopped) by the bootstrap itself
                tf = _fit_of_folder(fit_table, table, law, kw)
            else:
                from loopscale.fit.io import read_table
                from loopscale.fit.table_fit import one_variant

                one_variant(read_table(table), variant)  # a wrong --variant is said before Ray starts, not after
                import logging

                # Ray's INFO lines (its start-up, the token-authentication notice) stay off the console, as when the
                # bootstrap starts its own Ray; its warnings still show
                with opts.session(logging_level=logging.WARNING):
                    tf = _fit_of_folder(fit_table, table, law, kw)
        fit, boot, data, variant, rep = tf.fit, tf.boot, tf.data, tf.variant, tf.replicates
        flat_terms, ident = tf.flat_terms, tf.identification
        summary = summary_dict(fit, boot)
        if boot is not None and not boot.no_interval_reason:
            from loopscale.fit.laws import interval_ends_on_box

            if edge := interval_ends_on_box(boot.ci):  # interval ends the search box sets, not the data
                summary["ci_on_box_edge"] = edge
        if variant is not None:
            summary["variant"] = variant
        if tf.other_variants_rows:
            summary["other_variants_rows"] = tf.other_variants_rows
        fitted_to, fitted_line = _fitted_to(rep, per_run, data.n, bootstrap > 0)
        if fitted_to is not None:
            summary["fitted_to"] = fitted_to
        from loopscale.fit.analysis import uneven_seeds
        from loopscale.fit.run_report import uneven_seeds_line

        uneven = uneven_seeds(fit.data)  # the points fitted: runs weigh by their cell's seeds, cell means do not
        if uneven:
            summary["uneven_seeds"] = uneven
        few_points = _underdetermined(fit)
        if few_points:
            summary["underdetermined"] = few_points
        pooled = tf.pooled_r
        pooled_note = None
        if pooled:  # one architecture's law fitted to several: said, with the way to fit one
            summary["pooled_r"] = pooled
            from loopscale.fit.table_fit import pooled_r_note

            pooled_note = pooled_r_note(pooled, flags=True)
            summary["pooled_r_note"] = pooled_note
        if flat_terms:
            summary["not_identified"] = flat_terms
        if boot is not None and not boot.no_interval_reason:  # the console's warning, for a script too
            from loopscale.fit.bootstrapping import few_resamples_note

            if few := few_resamples_note(boot.B - boot.n_failed):
                summary["few_resamples"] = few
        loss_note = tf.column_notes.get("loss")
        if loss_note:
            summary["loss_column_note"] = loss_note
        unfinished = UNFINISHED_GRID_NOTE(table) if UNFINISHED_GRID_NOTE is not None else None
        if unfinished:
            summary["unfinished_grid"] = unfinished
        if tf.unit_warnings:
            summary["unit_warnings"] = tf.unit_warnings
        if tf.zero_rec_rows:
            summary["zero_rec_rows"] = tf.zero_rec_rows
        if data.near_duplicates:
            summary["near_duplicates"] = data.near_duplicates
        if data.status_note:
            summary["status_note"] = data.status_note
        if tf.not_replicates:
            summary["not_replicates"] = tf.not_replicates
        n_note = tf.column_notes.get("N")
        if n_note:
            summary["n_column_note"] = n_note
        block_note = None
        if boot is None and block_by.strip() != "default":  # checked, as every column name, but nothing resampled
            add = ("--law joint_per_r is a point fit, which takes none" if law == "joint_per_r"
                   else "add --bootstrap B (e.g. 200)")  # fmt: skip
            block_note = (f"--block-by {block_by} sets the bootstrap's blocks, and this fit has no bootstrap: it "
                          f"changed nothing; {add}")
            summary["block_by_note"] = block_note
        if ident is not None:  # strict JSON: a per-r phi without an interval has NaN ends (null here)
            from loopscale.fit.outputs import json_safe

            summary["identification"] = json_safe(ident.to_dict())
        if out is not None:
            # an earlier fit's files are moved into a folder of their own as this fit's take their place (nothing
            # written is lost; those this fit would not write, its bootstrap or its verdict, would read as this
            # fit's); the new files are written aside first, so a Ctrl-C leaves the earlier fit where it was
            from loopscale.cluster.storage import write_text_atomic
            from loopscale.fit.outputs import staged_fit

            with staged_fit(out) as stage:
                if stage.moved:
                    summary["moved_aside"] = stage.moved
                # fit.json says what --json says (what was fitted, what is not identified, the verdict), less paths
                said = {k: v for k, v in summary.items() if k != "outputs"}
                written = list(write_fit_outputs(stage.dir, fit, boot, extra=said, keep_earlier=False))
                if ident is not None:
                    path = stage.dir / "identification.json"
                    write_text_atomic(str(path), json.dumps(summary["identification"], allow_nan=False, indent=1))
                    written.append(path.name)
            summary["outputs"] = {name: str(Path(out) / name) for name in written}
        if json_out:
            typer.echo(json.dumps(summary, allow_nan=False))
            return
        p = fit.params
        from loopscale.fit.bootstrapping import (
            box_edge_interval_note,
            estimate_outside_note,
            few_resamples_note,
            phi_box_edge_warning,
        )
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
                + (" (edge)" if k in fit.on_bound else "")
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
            lines.insert(2, f"  * {estimate_outside_note(boot.B - boot.n_failed)}")
        if fitted_line:
            lines.insert(1, f"  {fitted_line}")
        if uneven:
            lines.insert(1, f"  {uneven_seeds_line(uneven)}")
        if few_points:
            lines.insert(1, f"  warning: {few_points}")
        if tf.other_variants_rows:  # rows of the table this variant's fit does not use: counted, not silent
            left = ", ".join(f"{n} of variant {v!r}" for v, n in tf.other_variants_rows.items())
            lines.insert(1, f"  not fitted: {left} (another variant's fit; --variant NAME fits it)")
        if fit.excluded_duplicates:
            ids = sorted(set(fit.excluded_duplicates))
            lines.append(
                f"  excluded ({DUPLICATE_RUN_ID}): {len(fit.excluded_duplicates)} older row(s) of a run_id that appears "
                f"more than once (the newest row of a run is fitted: largest finished_at, else the last): {', '.join(ids[:5])}"
                + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            )
        if block_note:
            lines.append(f"  note: {block_note}")
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
            else:
                if note := boot.extra.get("single_seed_note"):
                    lines.append(f"  warning: {note}")
                if note := boot.extra.get("one_run_blocks_note"):
                    lines.append(f"  note: {note}")
                if note := boot.extra.get("few_blocks_note"):
                    lines.append(f"  warning: {note}")
                if few := few_resamples_note(boot.B - boot.n_failed):
                    lines.append(f"  warning: {few}")
                if edge := box_edge_interval_note(boot.ci):
                    lines.append(f"  note: {edge}")
                if phi_edge := phi_box_edge_warning(boot.ci):  # without --identify, the only word on it
                    lines.append(f"  warning: {phi_edge}")
        if fit.on_bound:
            lines.append(
                f"  warning: {', '.join(fit.on_bound)} on the search box edge: the data do not identify "
                f"{'them' if len(fit.on_bound) > 1 else 'it'}, so read the other parameters (and their intervals) with care"
            )
        if pooled_note:
            lines.append(f"  note: {pooled_note}")
        if loss_note:
            lines.append(f"  note: {loss_note}")
        if unfinished:
            lines.append(f"  warning: {unfinished}")
        lines.extend(f"  warning: {w}" for w in tf.input_warnings)  # status, cells, units, near duplicates
        if n_note:
            lines.append(f"  note: {n_note}")
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
                lines.append(f"  moved the files already there that a fit writes ({', '.join(m['files'])}) to {m['to']}")
        print("\n".join(lines), file=sys.stdout)


def _underdetermined(fit) -> str | None:
    """When the runs ``fit`` was fitted to hold fewer distinct points of the law (distinct ``N``, ``N_once``,
    ``N_rec``, ``r`` and ``D``, of those the table has) than the law has free parameters: no parameter is pinned
    down by them (seeds of one cell add no point), so the fitted values are one of many that fit as well, and move
    with the starts' seed. None otherwise."""
    cols = [c for c in ("N", "N_once", "N_rec", "r", "D") if c in fit.data.columns]
    n = int(fit.data[cols].drop_duplicates().shape[0]) if cols else fit.n
    one_d = "D" in fit.data.columns and fit.data["D"].nunique() == 1
    # with one D, E + B D^-beta is one constant: the points need only hold it and the other free parameters
    free = fit.n_params - 2 if one_d and fit.n_params >= 3 else fit.n_params
    if n >= free:
        return None
    which = (f"the {free} free parameters left with one D (E + B D^-beta is one constant)" if one_d
             else f"the law's {fit.n_params} free parameters")  # fmt: skip
    return (f"the runs hold {n} distinct point{'s' if n != 1 else ''} ({', '.join(cols)}) for {which}: no "
            "parameter, phi included, is pinned down by them, and another --seed gives other values; add cells "
            "(widths, token budgets, r) before reading any of them")


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


