"""``loopscale tune-lr`` and ``loopscale sweep``: thin typer commands over :func:`run_tune_lr` and
:func:`run_sweep` (the Python API the ``loopscale run`` pipeline calls)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from loopscale.cluster.options import (
    ClusterOptions,
    Interrupted,
    NumCpusOpt,
    NumGpusOpt,
    RayTempDirOpt,
    StorageOpt,
    TuneAddressOpt,
    present_errors,
)
from loopscale.sweep.presets import PRESET_HELP, SPEC_HELP


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True) -> Iterator[None]:
    """While active (and ``enabled``), everything written to stdout — Python prints, Ray Tune's tables, the log
    lines Ray forwards from workers — goes to stderr, at the file-descriptor level. ``--json`` commands wrap
    their work in it so that stdout carries only the JSON object printed afterwards."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


TrackOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--track",
        # "\\[": the help is rich markup, where a bare "[track]" is a style tag and vanishes
        help="Track every run with Ray Tune's logger callbacks: tensorboard (OUT/tensorboard), mlflow[:URI] "
        "(default file:OUT/mlruns) or wandb[:PROJECT]; repeatable. Needs: pip install -e '.\\[track]' in the checkout "
        "('.\\[wandb]' for W&B).",
    ),
]
SpecArg = Annotated[str | None, typer.Argument(help=SPEC_HELP)]
PresetOpt = Annotated[str | None, typer.Option("--preset", help=PRESET_HELP)]
VerboseOpt = Annotated[
    bool,
    typer.Option("--verbose", help="Also show Ray's and Tune's own output (always kept in OUT/logs/ray.log)."),
]


class SweepInterrupted(Interrupted):
    """The driver was stopped (SIGINT) before every cell finished; rerun with ``--resume``."""


def _experiments(storage_path: str, prefix: str) -> list[str]:
    from loopscale.cluster import storage

    if not storage.exists(storage_path):
        return []
    names = [Path(n).name for n in storage.listdir(storage_path)]
    return sorted(n for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit())


def no_lr_table_message(spec, out: Path) -> str:
    """Why ``sweep`` of an ``lr: tune`` spec cannot start in ``out`` (no LR table there) and the commands that make
    one: ``tune-lr`` with the folder's own ``spec.yaml`` when it has one (``--resume`` when a study there stopped
    part-way), or ``run``, which tunes and then trains; with how much of the tuning is done
    (:func:`loopscale.sweep.run._lr_tuning_note`)."""
    from loopscale.sweep.run import lr_tuning_progress

    src = shlex.quote(str(out / "spec.yaml")) if (out / "spec.yaml").is_file() else "SPEC"
    p = lr_tuning_progress(spec, out) if out.is_dir() else None
    begun = bool(p and (p["done"] or p["trials"]))
    done = ""
    if begun:
        trials = f", and {p['trials']} trials of the others" if p["trials"] else ""
        done = f" ({p['done']} of {p['studies']} LR studies finished here{trials})"
    return (f"no LR table at {out / 'lr_table.parquet'}: the spec tunes the LR (lr: tune), and the grid's runs are "
            "defined by their LRs; make it with "
            f"`loopscale tune-lr {src} --out {shlex.quote(str(out))}{' --resume' if begun else ''}` first{done}, or "
            "use `loopscale run`, which tunes and then trains")


def run_sweep(
    spec,
    out_dir: str | Path,
    *,
    resume: bool = False,
    force: bool = False,
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    ray_temp_dir: str | None = None,
    lr_table: dict | None = None,
    reuse_actors: bool = True,
    max_concurrent: int = 0,
    quiet: bool = False,
    cells: list | None = None,
    track: tuple | list = (),
) -> Path:
    """Run the grid of ``spec`` (a SweepSpec or a YAML path) into ``out_dir``; return ``out_dir/runs.parquet``.

    Completed run ids (in the results store, or with a finished ``result.json`` under
    ``<storage>/checkpoints/<run_id>/``) are never trained again unless ``force``, which first moves their records,
    checkpoints and the fit/report outputs into ``out_dir/earlier_<UTC time>/`` (nothing is deleted:
    :func:`loopscale.sweep.store.set_aside_forced`). ``resume`` restores the newest grid experiment of this spec
    with ``Tuner.restore`` and finishes its unfinished trials (unless Tune's saved state of it is torn or mixed,
    :func:`loopscale.sweep.grid.tune_state_problem`: then it is left as it is); cells that no experiment holds then
    run in a new experiment. Ray: joins ``address``, reuses a Ray the caller already initialised (and leaves it
    running), or starts an embedded local one (``num_cpus``/``num_gpus``).

    ``lr_table``: {(size, r): lr}; with ``lr: tune`` and none given, ``out_dir/lr_table.parquet`` is read.
    ``cells``: run only these cells (default: all of the spec's). ``track``: ``--track`` values
    (:mod:`loopscale.sweep.tracking`). Progress is shown on the console (:class:`loopscale.sweep.console.GridView`)
    unless ``quiet`` (which turns off that display only: called from Python, Ray's and Tune's own lines go to this
    console; the ``loopscale`` commands send them to ``OUT/logs/ray.log``).

    Raises:
        SpecError / ValueError / FileNotFoundError: bad spec, GPUs requested where none exist, no LR table, a bad
            ``--track`` or its package missing (all before Ray starts).
        SweepInterrupted: the driver was stopped (SIGINT); the state is saved, rerun with ``resume=True``.
        NoRunFinished: not one of the cells finished with status ok ("0 of N runs finished ok: <most common
            error>"); the results that exist are still consolidated first.
    """
    from loopscale.cluster.storage import absolute_uri
    from loopscale.cluster.storage import join as uri_join
    from loopscale.sweep.grid import (
        error_line,
        fit_tuner,
        group_id,
        no_run_finished,
        plan_grid,
        result_grid_errors,
        trial_groups,
        trials_storage,
        tune_state_problem,
        unfinished_trials,
    )
    from loopscale.sweep.lr_table import read_lr_table
    from loopscale.sweep.spec import check_folder_spec, high_lr_warning, load_spec, record_folder_spec
    from loopscale.sweep.status import mark_started
    from loopscale.sweep.store import ResultsStore, curve_rows, run_record, set_aside_forced
    from loopscale.sweep.tracking import parse_track
    from loopscale.sweep.workspace import RunWorkspace

    if isinstance(spec, str | Path):
        spec = load_spec(spec)
    spec.check_runtime(address, num_cpus, num_gpus)
    track = parse_track(track)
    out = Path(out_dir).resolve()
    check_folder_spec(out, spec)  # before the LR table of the folder is read
    if spec.lr == "tune" and lr_table is None and cells is None:
        try:
            lr_table = read_lr_table(out / "lr_table.parquet")
        except FileNotFoundError as e:  # say the command that makes it, with this folder's spec, and what is done
            raise FileNotFoundError(no_lr_table_message(spec, out)) from e
    if cells is None:
        cells = spec.cells(lr_table=lr_table)
    storage_path = absolute_uri(spec.storage_path) if spec.storage_path else str(out / "tune")
    if resume:  # before anything is written here (the folder's record would name the refused command)
        check_resume_storage(out, spec, cells)
    store = ResultsStore(out)
    from loopscale.sweep import console, tracking

    if resume and not (out.is_dir() and any(out.iterdir())):
        console.current().say(f"--resume: nothing to resume in {out} (no earlier sweep there); starting a new one",
                              err=True)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    record_folder_spec(out, spec)  # refuses another spec's folder (runs.parquet would mix two grids)
    # `loopscale status`: running from here on, before Ray starts (a storage other than OUT/tune is recorded: the
    # folder's spec.yaml does not keep it; the default is not, so that a moved folder's status reads its own tune/)
    mark_started(out, "sweep", storage=storage_path if spec.storage_path else None)
    ids = {c.run_id for c in cells}
    if force:  # the earlier runs' records, checkpoints and fit/report are moved aside, not deleted
        groups = {group_id([c.run_id for c in g]) for g in trial_groups(cells, spec.ensemble_members()) if len(g) > 1}
        if moved := set_aside_forced(out, storage_path, ids, ids | groups):  # an ensemble's checkpoints: its group
            console.current().say(moved, err=True)
    done = store.completed_ids()
    # runs that finished while no driver was there to record them
    found = 0
    for c in cells:
        if c.run_id in done:
            continue
        res = RunWorkspace(storage_path, c.run_id).result()
        if res is not None:
            rec = run_record(c, res, finished_at=time.time())
            store.write_run(rec, curve_rows(c.run_id, res.get("curve")))
            done.add(c.run_id)
            found += 1
    if found:  # said: with a shared --storage they may be another folder's runs, trained by another command
        console.current().say(
            f"recorded {found} of {len(cells)} runs from their finished results in the storage {storage_path} "
            "(finished after the last record here, or trained by another folder's command with this storage): "
            "not trained again",
            err=True,
        )
    pending = [c for c in cells if c.run_id not in done]
    before_command = frozenset(done & ids)  # what the grid's closing line says this command did not train
    if lr_said := high_lr_warning(pending):  # before any of them trains
        console.current().say(f"warning: {lr_said}", err=True)
    errors: list[str] = []
    consolidated = False
    started = time.time()
    if pending:

        from ray import tune

        from loopscale.cluster.connect import ray_session, session_notes

        prefix = f"grid_{spec.name}_"
        with ray_session(address, num_cpus=num_cpus, num_gpus=num_gpus, temp_dir=ray_temp_dir) as ray_info:
            for line in session_notes(ray_info, address, storage_path, float(spec.resources.cpus),
                                      float(spec.resources.gpus or 0)):  # fmt: skip
                console.current().say(line, err=True)
            exps = _experiments(storage_path, prefix)
            restorable = resume and exps and tune.Tuner.can_restore(uri_join(storage_path, exps[-1]))
            if restorable and (torn := tune_state_problem(uri_join(storage_path, exps[-1]))):
                # Tune would half-restore it and hang or drop trials: its pending cells run in a new experiment
                console.current().say(
                    f"--resume: Tune's saved state of {exps[-1]} is unreadable ({torn}: the driver was stopped "
                    "while Tune copied it); its unfinished runs go on in a new experiment, from their checkpoints",
                    err=True,
                )
                restorable = False
            if restorable and (was := trials_storage(uri_join(storage_path, exps[-1]))) not in (None, storage_path):
                # its trials would write into the old place (Tune's state holds absolute paths) and the runs
                # they trained be trained again here: the pending runs go on in a new experiment instead
                console.current().say(
                    f"--resume: Tune's saved state of {exps[-1]} belongs to the storage {was} (the folder was moved "
                    "or copied since); its unfinished runs go on here in a new experiment, from their checkpoints",
                    err=True,
                )
                restorable = False
            if restorable:
                plan = plan_grid(
                    pending,
                    spec,
                    out,
                    storage_path=storage_path,
                    experiment=exps[-1],
                    reuse_actors=reuse_actors,
                    max_concurrent=max_concurrent,
                    quiet=quiet,
                    track=track,
                )
                tuner = tune.Tuner.restore(
                    uri_join(storage_path, exps[-1]),
                    trainable=plan.trainable(),
                    resume_unfinished=True,
                    resume_errored=True,
                )
                if note := tracking.check_restored(tuner, tuple(track), exps[-1]):
                    console.current().say(note, err=True)
                with console.grid_done_before(done & ids, before_command):
                    grid = fit_tuner(tuner)
                errors += result_grid_errors(grid)
                if grid.stopped_by_signal or unfinished_trials(uri_join(storage_path, exps[-1])):
                    store.consolidate()  # the runs that finished are in runs.parquet: `fit DIR` works now
                    raise SweepInterrupted("the sweep was interrupted")
                done = store.completed_ids()
                errored = not_run_again(grid, store, started)
                pending = [c for c in pending if c.run_id not in done and c.run_id not in errored]
            if pending:
                n = int(exps[-1][len(prefix) :]) + 1 if exps else 1
                plan = plan_grid(
                    pending,
                    spec,
                    out,
                    storage_path=storage_path,
                    experiment=f"{prefix}{n:03d}",
                    reuse_actors=reuse_actors,
                    max_concurrent=max_concurrent,
                    quiet=quiet,
                    track=track,
                )
                with console.grid_done_before(store.completed_ids() & ids, before_command):
                    grid = fit_tuner(plan.build())
                errors += result_grid_errors(grid)
                if grid.stopped_by_signal or unfinished_trials(uri_join(storage_path, plan.experiment)):
                    store.consolidate()  # the runs that finished are in runs.parquet: `fit DIR` works now
                    raise SweepInterrupted("the sweep was interrupted")
            # before Ray shuts down: a cluster's head lost at the grid's end makes Ray's core end this process
            # inside ray.shutdown() ("the local Raylet is dead"), which left every finished run in parts/ only
            store.consolidate()
            consolidated = True
    path = store.runs_path if consolidated else store.consolidate()
    rows = [r for r in store.runs().to_pylist() if r["run_id"] in ids]
    # the folder's runs matched the corpus when this command started (check_folder_spec): more than one content
    # hash now means the corpus changed while the grid trained, and its runs read two texts (two validation sets)
    read: dict[str, int] = {}
    for r in rows:
        if r["status"] != "failed" and r.get("corpus_sha256"):
            read[r["corpus_sha256"]] = read.get(r["corpus_sha256"], 0) + 1
    if len(read) > 1:
        counts = ", ".join(f"{n} runs {h[:12]}" for h, n in sorted(read.items(), key=lambda kv: -kv[1]))
        raise ValueError(
            f"the corpus at {spec.corpus!r} changed while the grid trained: its finished runs in {out} read "
            f"{len(read)} different contents (content hash: {counts}), i.e. two texts with two validation sets, "
            "so they are not one grid and are not fitted; leave the corpus unchanged while a sweep runs and train "
            "the grid again in another --out folder"
        )
    if not any(r["status"] == "ok" for r in rows):
        # one reason per run: a failed row's error (Tune's error for that trial), else its status
        what = {"did_not_learn": "did_not_learn (status in runs.parquet: trained to the end, but the final loss is not "
                "below ln V or the model collapsed to one prediction, which fits leave out; the LR is likely too "
                "high)"}  # fmt: skip
        reasons = [error_line(r["error"]) if r.get("error") else what.get(r["status"], f"{r['status']} (status in "
                   "runs.parquet)") for r in rows]  # fmt: skip
        raise no_run_finished(len(ids), reasons or errors)
    return path


def not_run_again(grid, store, since: float) -> set[str]:
    """The runs a restored experiment's ``grid`` (Tune's ResultGrid) ended that the new experiment after it must not
    train again: its trials that errored past their retries (:func:`loopscale.sweep.grid.errored_run_ids`) and the
    runs they recorded failed in ``store`` since ``since`` (s since the epoch; e.g. a corpus content error, reported,
    not raised: the trial ends TERMINATED), except the trials Tune could not restore
    (:func:`loopscale.sweep.grid.lost_checkpoint_run_ids`: their snapshot named a checkpoint retention had
    deleted). Those resume from their own workspace, although the trial's error also recorded them failed."""
    from loopscale.sweep.grid import errored_run_ids, lost_checkpoint_run_ids

    return (set(errored_run_ids(grid)) | failed_since(store, since)) - set(lost_checkpoint_run_ids(grid))


def failed_since(store, since: float) -> set[str]:
    """Run ids whose newest record in ``store`` is ``failed`` and was written at or after ``since`` (s since the
    epoch): the runs this command's trials recorded failed."""
    from datetime import UTC, datetime

    t0 = datetime.fromtimestamp(since, UTC)
    return {rid for rid, r in store.recorded().items() if r["status"] == "failed" and r["finished_at"] and r["finished_at"] >= t0}


def check_resume_storage(out: Path, spec, cells=None) -> None:
    """``--resume`` with a storage that holds no grid experiment of this spec, while a local storage the folder's
    earlier commands used does (another ``--storage``, or a relative one given from another directory): Tune's
    saved state and the unfinished runs' checkpoints are there, and a new experiment here would start those runs
    over. Nothing to refuse when every cell of ``cells`` (when given) is recorded as finished, or the storage holds
    the experiment. A remote earlier storage is not probed (no network, or credentials this machine lacks, would
    hang or fail a legitimate ``--resume``).

    Raises:
        ValueError: naming the storage that holds the experiment."""
    from loopscale.cluster.storage import absolute_uri, is_local_uri
    from loopscale.sweep.status import earlier_storages
    from loopscale.sweep.store import ResultsStore

    out = Path(out).resolve()
    if not out.is_dir():
        return
    if cells is not None:
        from loopscale.sweep.store import look_only

        with look_only():  # nothing is moved aside before the check has spoken
            done = ResultsStore(out).completed_ids()
        if all(c.run_id in done for c in cells):
            return
    storage_path = absolute_uri(spec.storage_path) if spec.storage_path else str(out / "tune")
    prefix = f"grid_{spec.name}_"
    if not is_local_uri(storage_path) or _experiments(storage_path, prefix):
        return  # the experiment is there (a remote storage is read when the sweep starts, not probed here)
    for where in [w for w in earlier_storages(out) if w != storage_path and is_local_uri(w)]:
        if exps := _experiments(where, prefix):
            raise ValueError(
                f"--resume: the storage {storage_path} holds no Tune experiment of this sweep, but {where}, where "
                f"an earlier command of {out} kept it, does ({exps[-1]}): its unfinished "
                f"runs' checkpoints are there; give --storage {shlex.quote(str(where))} to continue it, or drop --resume to train "
                "the unfinished runs from their start in the new storage (finished runs are kept)"
            )


def run_tune_lr(spec, out_dir: str | Path, **kwargs):
    """Stage 1 (see :func:`loopscale.sweep.lr_search.run_tune_lr`): returns the LR table (pyarrow Table)."""
    from loopscale.sweep.lr_search import run_tune_lr as _run

    return _run(spec, out_dir, **kwargs)


def _with_storage(spec, storage: str | None):
    """``spec`` with ``storage_path`` replaced by ``--storage`` (validated) when given."""
    from loopscale.cluster.options import validate_storage

    if storage is None:
        return spec
    return spec.model_copy(update={"storage_path": validate_storage(storage)})


def _run_stage(
    stage,
    spec_path: str | None,
    preset: str | None,
    out: Path | None,
    storage: str | None,
    as_json: bool,
    ray: ClusterOptions,
    verbose: bool = False,
    track: list[str] | None = None,
    group: str = "",
    **kw,
):
    """Resolve SPEC / ``--preset`` (:func:`loopscale.sweep.presets.resolve_spec`; ``--out`` defaults to
    ``runs/<name>`` as in ``loopscale run``), apply ``--storage``, check ``--track`` and that OUT is not another
    spec's run folder, and run ``stage(spec, out, <Ray flags>, track, **kw)`` in a console session
    (:func:`loopscale.sweep.console.session`: Ray's output to ``OUT/logs/``); with ``--json`` anything the stage
    prints goes to stderr. At the end, also after a Ctrl-C (not after an error), one line per tracking target says
    where its results are."""
    from loopscale.cluster.options import reachable_storage, usable_out_dir
    from loopscale.sweep import console, tracking
    from loopscale.sweep.presets import resolve_spec
    from loopscale.sweep.spec import check_folder_spec

    # --address with --num-cpus, a relative --ray-temp-dir, Ray Client: said before anything is written
    ray.validate(tune=f"loopscale {'sweep' if group == 'grid' else group}")
    spec, name = resolve_spec(spec_path, preset)
    spec = _with_storage(spec, storage)
    out = out if out is not None else Path("runs") / name
    usable_out_dir(out)
    check_folder_spec(out, spec)
    from loopscale.sweep.status import refuse_busy_folder

    refuse_busy_folder(out, f"`loopscale {'sweep' if group == 'grid' else group}`")
    from loopscale.cluster.storage import absolute_uri
    from loopscale.sweep.status import refuse_busy_storage

    refuse_busy_storage(absolute_uri(spec.storage_path) if spec.storage_path else None, out,
                        f"`loopscale {'sweep' if group == 'grid' else group}`")  # fmt: skip
    targets = tracking.parse_track(track)
    reachable_storage(spec.storage_path, write=True)  # a bucket out of reach, a path not writable: one line, first
    with stdout_to_stderr(as_json), console.session(out, verbose=verbose, json_mode=as_json) as con:
        with tracking.described(targets, out, f"loopscale-{spec.name}-{group}", con.say):
            return stage(spec, out, **dataclasses.asdict(ray), track=targets, **kw)


def sweep_cmd(
    spec_path: SpecArg = None,
    preset: PresetOpt = None,
    out: Path | None = typer.Option(
        None, "--out", help="Output directory (runs.parquet, curves.parquet, Tune state; with `lr: tune` it reads "
        "lr_table.parquet there; default: runs/<preset name or spec file name>).",
    ),  # fmt: skip
    resume: bool = typer.Option(False, "--resume", help="Restore the interrupted experiment and finish it."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Retrain cells whose run id already finished; their earlier records, checkpoints and fit/report are "
        "moved into OUT/earlier_<UTC time>/ first (nothing is deleted).",
    ),
    address: TuneAddressOpt = None,
    num_cpus: NumCpusOpt = None,
    num_gpus: NumGpusOpt = None,
    ray_temp_dir: RayTempDirOpt = None,
    storage: StorageOpt = None,
    track: TrackOpt = None,
    verbose: VerboseOpt = False,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON summary object on stdout."),
) -> None:
    """Stage 2: train every grid cell of SPEC on Ray Tune and write runs.parquet / curves.parquet. Exits 1 when
    not one run finished ("0 of N runs finished ok: <most common error>")."""
    t0 = time.time()
    ray = ClusterOptions(address=address, num_cpus=num_cpus, num_gpus=num_gpus, ray_temp_dir=ray_temp_dir)
    path = _run_stage(
        run_sweep,
        spec_path,
        preset,
        out,
        storage,
        as_json,
        ray,
        verbose,
        track,
        "grid",
        resume=resume,
        force=force,
    )
    import pyarrow.parquet as pq

    t = pq.read_table(path).to_pylist()
    status = {}
    for row in t:
        status[row["status"]] = status.get(row["status"], 0) + 1
    summary = {
        "runs_parquet": str(path),
        "rows": len(t),
        "status": status,
        "wall_s": round(time.time() - t0, 2),
    }
    if as_json:
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
    else:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(status.items()))
        typer.echo(f"{len(t)} runs ({counts}) -> {path} in {summary['wall_s']} s")


def tune_lr_cmd(
    spec_path: SpecArg = None,
    preset: PresetOpt = None,
    out: Path | None = typer.Option(
        None, "--out", help="Output directory (lr_table.parquet, tune_lr/; default: runs/<preset name or spec file name>, "
        "where `loopscale sweep` and `run` of the same spec look for the LR table).",
    ),  # fmt: skip
    resume: bool = typer.Option(False, "--resume", help="Restore an interrupted study and finish it."),
    address: TuneAddressOpt = None,
    num_cpus: NumCpusOpt = None,
    num_gpus: NumGpusOpt = None,
    ray_temp_dir: RayTempDirOpt = None,
    storage: StorageOpt = None,
    no_plot: bool = typer.Option(False, "--no-plot", help="Skip the loss-vs-LR plots."),
    track: TrackOpt = None,
    verbose: VerboseOpt = False,
    as_json: bool = typer.Option(False, "--json", help="Print the LR table as JSON on stdout."),
) -> None:
    """Stage 1: tune the LR per size (and r) with Optuna + ASHA on Ray Tune; writes lr_table.parquet."""
    ray = ClusterOptions(address=address, num_cpus=num_cpus, num_gpus=num_gpus, ray_temp_dir=ray_temp_dir)
    table = _run_stage(
        run_tune_lr, spec_path, preset, out, storage, as_json, ray, verbose, track, "tune-lr", resume=resume, plot=not no_plot
    )
    rows = table.to_pylist()
    if as_json:
        json.dump(rows, sys.stdout)
        sys.stdout.write("\n")
    else:
        for row in rows:
            typer.echo(
                f"size {row['size']:>5} r {row['r']:>2}: lr {_g4(row['lr'])} (best {_g4(row['lr_best'])}, "
                f"smoothed {_g4(row['lr_smoothed'])}, val {_f4(row['best_val_loss'])}, {row['n_trials']} trials, "
                f"{row['n_pruned']} pruned)"
            )


def _g4(x: float | None) -> str:
    """An LR as printed: 4 significant digits (the table keeps every digit), '-' for None."""
    return "-" if x is None else f"{x:.4g}"


def _f4(x: float | None) -> str:
    """A loss (nats/token) as printed: 4 decimals, '-' for None."""
    return "-" if x is None else f"{x:.4f}"


if __name__ == "__main__":  # python -m loopscale.sweep.commands sweep|tune-lr ... (used by the kill tests)
    app = typer.Typer(add_completion=False)
    app.command("sweep")(present_errors(sweep_cmd))
    app.command("tune-lr")(present_errors(tune_lr_cmd))
    app()
