"""Stage 2: the grid as one Ray Tune experiment (every Tune call of the grid lives in this module).

Trials are groups of grid cells (an explicit ``tune.grid_search`` over lists of cell dicts, :func:`trial_groups`):
a cell alone, or — on CPU, by default — the seeds of one cell trained together as one seed ensemble
(``loopscale.model.ensemble.train_ensemble``: one batched model, one optimizer step for all members, each member's
result equal to its single run). The trainable is a thin function: it turns the dict configs into ``RunConfig``s,
calls ``train_run`` (one cell) or ``train_ensemble`` (several) with a callback that forwards every
evaluation/checkpoint event to ``tune.report(metrics, checkpoint=tune.Checkpoint...)``, and reports each finished
``RunResult`` once (with its ``run_id``). Only the ``ray.tune.*`` API is used (``ray.train.*`` objects fail
inside Tune trainables on Ray 2.60, ``docs/ray_tune.md`` §1).

Run identity and restarts: each trial works in its run's workspace (:mod:`loopscale.sweep.workspace`: checkpoints
under ``<storage>/checkpoints/<run_id>/``, an ensemble's under ``<storage>/checkpoints/<group_id>/``, the newest on disk wins over Tune's restored one, a finished run reports
its saved result instead of training again). The driver writes each finished run into the results store
(:mod:`loopscale.sweep.store`) from a Tune callback (:mod:`loopscale.sweep.callbacks`), keyed by run id, so a run
appears exactly once however often its trial is restarted, and a trial that errors past its retries as a
``failed`` row.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from loopscale.cluster.options import CommandFailed
from loopscale.sweep import _seams
from loopscale.sweep.workspace import DONE_KEY, RunWorkspace, event_metrics, tune_checkpoint_from

METRIC = "val_loss"
"""Metric name reported at each evaluation (nats/token)."""
RESULT_KEY = "run_result"
"""JSON of ``RunResult.to_dict()`` in the final report."""
TRAINABLE_NAME = "loopscale_grid"


# --- the trainable ------------------------------------------------------------------------------------


def trial_cells(config: dict | None) -> list[dict]:
    """The cell dicts (``Cell.to_dict()`` + ``run_id``) a grid trial trains, from its Tune config:
    ``config["cells"]``, or ``[config["cell"]]`` in an experiment saved before trials held several cells; [] for
    a config that is not a grid trial's (e.g. an LR trial)."""
    if not config:
        return []
    if "cells" in config:
        return list(config["cells"] or [])
    if "cell" in config:
        return [config["cell"]]
    return []


def group_id(run_ids: list[str]) -> str:
    """Stable 16-hex-digit id of a group of runs trained as one ensemble (sha256 of the sorted run ids)."""
    return hashlib.sha256(",".join(sorted(run_ids)).encode()).hexdigest()[:16]


def grid_trainable(config: dict) -> None:
    """Ray Tune function trainable of one grid trial: one cell, or several cells that differ only in their seed
    (a seed ensemble).

    ``config``: ``{"cells": [Cell.to_dict() + {"run_id"}, ...], "storage": URI, "_test_seams": dict | None}`` (the
    last: :mod:`loopscale.sweep._seams`).
    Reports ``event_metrics`` at each trainer event (an ensemble: once per member, with ``member``, ``seed`` and
    ``members``; a ``tune.Checkpoint`` when one was written) and, per run, a final report with ``run_done=True``,
    ``run_id`` and ``run_result`` (JSON of its ``RunResult``). A :class:`~loopscale.model.data.CorpusContentError`
    (the corpus read whole holds no text, or a split shorter than a window) is reported as each unfinished run's
    final result, ``status`` failed with its ``error``, instead of raised: every retry would fail alike.

    Raises:
        ValueError: the cells of an ensemble trial differ in more than their seed.
        CorpusError: any other corpus error (e.g. a file missing on this node: Tune retries the trial, maybe on
            another node).
    """
    from ray import tune

    from loopscale.sweep.spec import Cell

    dicts = trial_cells(config)
    cells = [Cell.from_dict(d) for d in dicts]
    rids = [d["run_id"] for d in dicts]
    storage_uri = config["storage"]
    seams = config.get(_seams.CONFIG_KEY)
    started = time.time()
    # who trained a result and when travels with it in result.json: a run re-recorded from it later (its row lost,
    # a restored trial that only re-reports it) keeps the trial id, host and times of the attempt that trained it
    attempt = {"trial_id": tune.get_context().get_trial_id(), "host": socket.gethostname(), "started_at": started}
    results = [RunWorkspace(storage_uri, rid).result() for rid in rids]
    if any(r is None for r in results):
        from loopscale.model.data import CorpusContentError

        try:
            if len(cells) == 1:
                results = [_train_cell(cells[0], RunWorkspace(storage_uri, rids[0]), storage_uri, seams, attempt)]
            else:
                trained = _train_group(cells, rids, storage_uri, seams, attempt)
                results = [old if old is not None else new for old, new in zip(results, trained, strict=True)]
        except CorpusContentError as e:
            # the corpus, read whole, fails every attempt alike (no text, a split shorter than a window): the runs
            # are recorded failed now, with the error, instead of raising it max_failures + 1 times; no result.json
            # is saved, so a later sweep (the corpus fixed) trains them. Any other corpus error (a file missing or
            # unreadable on this node, a package not installed there) is raised: Tune retries the trial, maybe on
            # another node
            failed = {"status": "failed", "error": f"{type(e).__name__}: {e}", "attempt": attempt}
            results = [old if old is not None else failed for old in results]
    for rid, done in zip(rids, results, strict=True):
        tune.report(
            {
                DONE_KEY: True,
                "run_id": rid,
                # the per-micro-batch id list can be long (paper runs: ~10^5 ids); it stays in result.json only
                RESULT_KEY: json.dumps({k: v for k, v in done.items() if k != "micro_batch_ids"}),
                "final_val_loss": done.get("final_val_loss"),
                "status": done.get("status"),
                "started_at": started,
                "host": socket.gethostname(),
            }
        )


def _reporter(ws: RunWorkspace, storage_uri: str, seams: dict | None, fault_id: str, members: int = 1):
    """The trainer callback of a trial: forwards each event to ``tune.report`` (the checkpoint once per write;
    an ensemble's events carry ``member``, ``seed`` and ``members``)."""
    from ray import tune

    last_path: list[str | None] = [None]

    def callback(event: dict) -> None:
        _seams.maybe_fail(seams, storage_uri, fault_id, int(event.get("step") or 0))
        path = event.get("checkpoint_path")
        if path and path == last_path[0]:
            path = None  # an ensemble emits the same checkpoint once per member: hand it to Tune once
        elif path:
            last_path[0] = path
            ws.push()
        ck, stage = tune_checkpoint_from(path)
        metrics = event_metrics(event)
        if members > 1:
            metrics.update(member=int(event["member"]), seed=int(event["seed"]), members=members)
        try:
            tune.report(metrics, checkpoint=ck)
        finally:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)

    return callback


def _train_cell(cell, ws: RunWorkspace, storage_uri: str, seams: dict | None, attempt: dict) -> dict:
    from loopscale.model.train import train_run

    ws.prepare_resume()
    cfg = cell.run_config(checkpoint_dir=str(ws.dir))
    res = train_run(cfg, callback=_reporter(ws, storage_uri, seams, ws.rid)).to_dict()
    res = json.loads(json.dumps(res, default=str))
    res["attempt"] = {**attempt, "finished_at": time.time()}
    ws.save_result(res)
    return res


def _train_group(cells: list, rids: list[str], storage_uri: str, seams: dict | None, attempt: dict) -> list[dict]:
    """Train cells that differ only in their seed as one seed ensemble; save and return each member's result
    (with ``attempt``: the trial id, host and start time, plus its end time)."""
    from loopscale.model.ensemble import train_ensemble
    from loopscale.model.train import run_definition

    base = {**run_definition(cells[0].run), "seed": None}
    for c in cells[1:]:
        if {**run_definition(c.run), "seed": None} != base or c.variant != cells[0].variant:
            raise ValueError(f"an ensemble trial's cells must differ only in their seed; {rids} do not")
    gid = group_id(rids)
    ws = RunWorkspace(storage_uri, gid)
    ws.prepare_resume()
    cfg = cells[0].run_config(checkpoint_dir=str(ws.dir))
    members = train_ensemble(
        cfg, seeds=[c.seed for c in cells], callback=_reporter(ws, storage_uri, seams, gid, len(cells))
    )
    out = []
    finished = time.time()
    for rid, res in zip(rids, members, strict=True):
        d = json.loads(json.dumps(res.to_dict(), default=str))
        d["ensemble"] = {"group_id": gid, "members": len(cells)}
        d["attempt"] = {**attempt, "finished_at": finished}
        RunWorkspace(storage_uri, rid).save_result(d)
        out.append(d)
    return out


def trial_groups(cells: list, max_members: int) -> list[list]:
    """Pack ``cells`` into trials: cells that differ only in their seed (same run definition otherwise, same
    variant) form a group, split into chunks of at most ``max_members`` of near-equal size; a chunk of one is an
    ordinary single-run trial. Groups are ordered by planned training FLOPs (largest first) so that two parallel
    workers finish together; within a group, cells keep their order.

    Args:
        cells: :class:`~loopscale.sweep.spec.Cell` list.
        max_members: most cells per trial (>= 1; 1 = every cell its own trial).

    Raises:
        ValueError: ``max_members`` < 1.
    """
    from loopscale.model.accounting import flops_per_token
    from loopscale.model.train import run_definition

    if max_members < 1:
        raise ValueError(f"max_members must be >= 1, got {max_members}")
    by_key: dict[str, list] = {}
    for c in cells:
        key = json.dumps({**run_definition(c.run), "seed": None, "variant": c.variant}, sort_keys=True, default=str)
        by_key.setdefault(key, []).append(c)
    groups: list[list] = []
    for members in by_key.values():
        n_chunks = -(-len(members) // max_members)
        size = -(-len(members) // n_chunks)
        groups += [members[i : i + size] for i in range(0, len(members), size)]

    def cost(g: list) -> float:
        run = g[0].run
        per_run = float(run.target_flops or 0.0) or float(flops_per_token(run.model)) * float(run.tokens or 0)
        return per_run * len(g)

    return sorted(groups, key=cost, reverse=True)


# --- driver side --------------------------------------------------------------------------------------


def _trial_tag(config: dict) -> str:
    ids = [d["run_id"] for d in trial_cells(config)]
    return f"run_{ids[0]}" if len(ids) == 1 else f"ens{len(ids)}_{group_id(ids)}"


def _trial_name(trial) -> str:
    return _trial_tag(trial.config)


def _trial_dirname(trial) -> str:
    return f"{_trial_tag(trial.config)}_{trial.trial_id}"


@dataclass(frozen=True)
class TunerPlan:
    """Everything a grid ``tune.Tuner`` is built from (pure data; building it does not start Ray).

    Attributes:
        experiment: experiment name (a folder under ``storage_path``).
        storage_path: Tune's ``storage_path`` (any pyarrow URI).
        param_space: ``{"cells": tune.grid_search([[cell, ...], ...]), "storage": ..., "_test_seams": ...}``.
        resources: per-trial resources for ``tune.with_resources`` (``{"cpu": .., "gpu": ..}``).
        reuse_actors, max_failures, max_concurrent: TuneConfig / FailureConfig values.
        cells: {run_id: Cell.to_dict()} of the trials.
    """

    experiment: str
    storage_path: str
    param_space: dict
    resources: dict
    reuse_actors: bool
    max_failures: int
    max_concurrent: int
    cells: dict
    out_dir: str
    quiet: bool = False
    track: tuple = ()
    group: str = "loopscale"

    def trainable(self):
        """``tune.with_resources(grid_trainable, resources)``."""
        from ray import tune

        return tune.with_resources(grid_trainable, self.resources)

    def run_config(self):
        """The ``tune.RunConfig`` (storage, failure policy, checkpoint retention, our callback, the ``--track``
        logger callbacks of :mod:`loopscale.sweep.tracking`)."""
        from ray import tune

        from loopscale.sweep import callbacks, tracking

        return tune.RunConfig(
            name=self.experiment,
            storage_path=self.storage_path,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=self.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            callbacks=[
                callbacks._recorder_cls()(self.out_dir, self.cells, quiet=self.quiet),
                *tracking.callbacks(self.track, self.out_dir, self.experiment, self.group),
            ],
        )

    def tune_config(self):
        """The ``tune.TuneConfig`` (one sample of the explicit grid, actor reuse, concurrency)."""
        from ray import tune

        return tune.TuneConfig(
            num_samples=1,
            reuse_actors=self.reuse_actors,
            max_concurrent_trials=self.max_concurrent or None,
            trial_name_creator=_trial_name,
            trial_dirname_creator=_trial_dirname,
        )

    def build(self):
        """The ``tune.Tuner`` (constructing it does not start Ray; ``fit()`` does)."""
        from ray import tune

        return tune.Tuner(
            self.trainable(),
            param_space=self.param_space,
            tune_config=self.tune_config(),
            run_config=self.run_config(),
        )


def plan_grid(
    cells: list,
    spec,
    out_dir: str | Path,
    *,
    storage_path: str,
    experiment: str,
    reuse_actors: bool = True,
    max_concurrent: int = 0,
    quiet: bool = False,
    track: tuple = (),
) -> TunerPlan:
    """Assemble the grid experiment for ``cells`` (a pure function: no Ray, no I/O): one trial per group of
    :func:`trial_groups` with ``spec.ensemble_members()`` members at most. ``track``: parsed ``--track`` targets
    (:func:`loopscale.sweep.tracking.parse_track`).

    Raises:
        ValueError: no cells.
    """
    from ray import tune

    if not cells:
        raise ValueError("cells must be non-empty: nothing to run")
    trials = []
    for group in trial_groups(cells, spec.ensemble_members()):
        trials.append([{**c.to_dict(), "run_id": c.run_id} for c in group])
    dicts = [d for t in trials for d in t]
    resources = {"cpu": float(spec.resources.cpus)}
    if spec.resources.gpus:
        resources["gpu"] = float(spec.resources.gpus)
    return TunerPlan(
        experiment=experiment,
        storage_path=storage_path,
        param_space={
            "cells": tune.grid_search(trials),
            "storage": storage_path,
            _seams.CONFIG_KEY: _seams.from_env(),
        },
        resources=resources,
        reuse_actors=reuse_actors,
        max_failures=spec.max_failures,
        max_concurrent=max_concurrent,
        cells={d["run_id"]: d for d in dicts},
        out_dir=str(out_dir),
        quiet=quiet,
        track=tuple(track),
        group=f"loopscale-{spec.name}-grid",
    )


def fit_tuner(tuner):
    """``tuner.fit()`` (a ``ray.tune.Tuner``; returns its ResultGrid), leaving the process's SIGINT and SIGUSR1
    handlers as they were before, without Tune's warning about frequent experiment-state snapshots.

    Tune installs its own handlers (Ctrl-C ends the run and saves its state) and puts the previous ones back only
    when a signal arrives; left in place after a normal end, Tune's handler swallowed the next Ctrl-C (``loopscale
    run`` went on through its fit stage after "Stop signal received ... ending Ray Tune run" and exited 0).

    The ResultGrid carries ``stopped_by_signal``: True when Tune's handler caught a Ctrl-C (or SIGUSR1) during the
    run, which it then replaced by the previous handler. Callers stop on it even when every trial had finished by
    then (a Ctrl-C landing as a study's last trial ended was otherwise ignored: the command went on and exited 0).

    Raises:
        ValueError: this process is a Ray Client (``ray://``): Tune would run its driver, and loopscale's
            callbacks that write the folder's records, inside the cluster
            (:data:`loopscale.cluster.options.RAY_CLIENT_TUNE`)."""
    import os
    import signal
    import threading

    import ray

    if ray.util.client.ray.is_connected():  # the CLI refuses ray:// first; this guards the Python API
        from loopscale.cluster.options import RAY_CLIENT_TUNE

        raise ValueError(f"this process is connected through Ray Client (ray://): {RAY_CLIENT_TUNE}")
    # frequent small checkpoints (grid trials, ASHA's LR trials) are expected here: Tune's "snapshotting has been
    # triggered multiple times ... may become a bottleneck" warning is noise
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    saved = {}
    if threading.current_thread() is threading.main_thread():  # handlers can only be set there (Tune skips too)
        for name in ("SIGINT", "SIGUSR1"):
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) is not None:
                saved[sig] = signal.getsignal(sig)
    tune_catches = signal.SIGINT in saved and not int(os.getenv("TUNE_DISABLE_SIGINT_HANDLER", "0"))
    try:
        grid = tuner.fit()
        # Tune's handler, installed for the run, puts the previous one back when it catches a signal
        grid.stopped_by_signal = tune_catches and signal.getsignal(signal.SIGINT) is saved[signal.SIGINT]
        return grid
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


TUNE_STATE_FILES = (
    "tuner.pkl",
    "experiment_state-*.json",
    "search_gen_state-*.json",
    "searcher-state-*.pkl",
    "basic-variant-state-*.json",
    "callback-states-*.pkl",
)
"""The files Ray 2.60's ``Tuner.restore`` reads from an experiment folder (the newest of each pattern, by name):
the tuner, the trial list (JSON), the search algorithm and its wrappers, the base searcher, a grid's variant
generator, the callbacks (cloudpickle)."""


def tune_state_problem(experiment_path: str) -> str | None:
    """Why Tune cannot restore the experiment saved at ``experiment_path`` (a local path or URI), or None when every
    state file it would read (:data:`TUNE_STATE_FILES`, the newest of each pattern) loads.

    Tune copies these files from the driver's staging folder to the storage path in a background thread, so a
    driver killed (SIGKILL, a lost node) during a copy can leave one empty or truncated. ``Tuner.restore`` then logs
    "Failed to restore the run state", keeps what it had restored so far and starts the experiment over: with a
    half-restored concurrency limiter that still counts the old trials as running it never starts another trial
    (the driver waited forever), and with a restored trial counter it ran fewer trials than asked. Callers start a
    new experiment instead (the runs' own checkpoints and results survive in their workspaces).

    Files that load can still come from two snapshots (:func:`_mixed_snapshots`), which Tune restores as badly.

    Returns:
        "<file>: <what is wrong>" for the first unreadable file, else what the snapshots disagree on; None when all
        load and agree (or there is no experiment).
    """
    import fnmatch

    import ray.cloudpickle as cloudpickle

    from loopscale.cluster import storage

    try:
        names = storage.listdir(experiment_path)
    except FileNotFoundError:
        return None
    loaded: dict[str, tuple[str, object]] = {}
    for pattern in TUNE_STATE_FILES:
        found = sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))
        if not found:
            continue
        name = found[-1]
        try:
            data = storage.read_bytes(storage.join(experiment_path, name))
            if not data:
                return f"{name}: 0 bytes"
            if pattern.startswith("experiment_state-"):
                loaded[pattern] = (name, json.loads(data.decode("utf-8")))
            else:
                loaded[pattern] = (name, cloudpickle.loads(data))
        except Exception as e:  # torn JSON or pickle, or a class that no longer exists
            return f"{name}: {type(e).__name__}: {e}"[:300]
    return _mixed_snapshots(loaded)


def _created(alg: dict) -> int | None:
    """Trials a saved search algorithm has created: a ``SearchGenerator``'s ``counter``, or a
    ``BasicVariantGenerator``'s (grid) trial iterator's ``counter`` (the largest, for a generator with several
    iterators; loopscale's experiments have one); None when the state does not say."""
    if isinstance(alg.get("counter"), int):
        return alg["counter"]
    counts = [getattr(it, "counter", None) for it in alg.get("_iterators") or ()]
    counts = [c for c in counts if isinstance(c, int)]
    return max(counts) if counts else None


_ENDED = ("TERMINATED", "ERROR")  # the statuses of an ended trial in Tune's trial list


def _mixed_snapshots(loaded: dict) -> str | None:
    """Whether the trial list and the search algorithm's state come from different snapshots (Tune's background
    copy can mix two when the driver dies during it), or None when they agree (or the layout is not one this check
    knows: Tune then decides). They disagree when the algorithm

    * created another number of trials than the list holds: restored, a newer one never creates the missing trial
      again, an older one creates again trials the list holds, which then train the same run twice at once;
    * holds as running (its concurrency limit's ``live_trials``) a trial the list lacks, or one the list has ended
      while the algorithm is not finished: that trial never reports its end again, so the limit stays taken (with
      ``max_concurrent: 1`` the driver waited forever);
    * (``OptunaSearch``, ``searcher-state-*.pkl``) lacks a trial the list has not ended: its first result after
      the restore raised KeyError in the searcher.
    """
    if "experiment_state-*.json" not in loaded:
        return None
    name, state = loaded["experiment_state-*.json"]
    try:
        status = {}
        for t in state["trial_data"]:
            d = json.loads(t[0])
            status[d["trial_id"]] = d.get("status")
    except (KeyError, TypeError, IndexError, ValueError):
        return None
    ids = set(status)
    ended = {i for i, st in status.items() if st in _ENDED}

    def mixed(what: str, why: str) -> str:
        return f"{what} and {name} are from different snapshots: {why}"

    for pattern in ("search_gen_state-*.json", "basic-variant-state-*.json"):
        if pattern not in loaded or not isinstance(loaded[pattern][1], dict):
            continue
        alg_name, alg = loaded[pattern]
        live = set(alg.get("_live_trials") or ())
        for key, sub in alg.items():
            if key.startswith("name:") and isinstance(sub, dict):
                live |= set(sub.get("live_trials") or ())
        created = _created(alg)
        if created is not None and created != len(ids):
            return mixed(alg_name, f"the search algorithm created {created} trials, the trial list has {len(ids)}")
        if live - ids:
            return mixed(alg_name, f"the search algorithm holds {sorted(live - ids)} as running, the list lacks them")
        finished = bool(alg.get("finished") or alg.get("_finished"))
        if live & ended and not finished:
            return mixed(alg_name, f"the search algorithm holds {sorted(live & ended)} as running, the list has ended them")
    if "searcher-state-*.pkl" in loaded and isinstance(loaded["searcher-state-*.pkl"][1], dict):
        sname, searcher = loaded["searcher-state-*.pkl"]
        known = searcher.get("_ot_trials")
        if isinstance(known, dict):
            missing = sorted(ids - ended - set(known))
            if missing:
                return mixed(sname, f"the searcher does not know {missing}, which the list has not ended")
    return None


def trials_storage(experiment_path: str) -> str | None:
    """The storage path the trials of the experiment saved at ``experiment_path`` write their runs to (their
    config's ``storage``, read from a trial's ``params.json``), or None when no local trial folder records one.

    Tune's saved state holds absolute paths: a folder moved (or copied) after a stop restores trials that write
    into the old place, so a caller compares this with the storage path it was given."""
    root = Path(experiment_path)
    if "://" in experiment_path or not root.is_dir():
        return None
    for params in sorted(root.glob("*/params.json")):
        try:
            storage = json.loads(params.read_text()).get("storage")
        except (OSError, ValueError):
            continue
        if isinstance(storage, str) and storage:
            return storage
    return None


def set_aside_tune_state(experiment_path: str) -> list[str]:
    """Move every Tune state file of the experiment at ``experiment_path`` (:data:`TUNE_STATE_FILES`, all of each
    pattern) aside to ``<name>.unreadable-<id>`` (:func:`loopscale.cluster.storage.move_aside`, without a warning per
    file: the caller says it once), so that a new experiment can start in the same folder and nothing reads the old
    state again; the trial folders stay. Nothing is deleted. Returns the new locations."""
    import fnmatch

    from loopscale.cluster import storage

    return [
        storage.move_aside(storage.join(experiment_path, name), "Tune state set aside", warn=False)
        for name in storage.listdir(experiment_path)
        if any(fnmatch.fnmatchcase(name, p) for p in TUNE_STATE_FILES)
    ]


def unfinished_trials(experiment_path: str) -> list[str]:
    """Trial ids of the experiment saved at ``experiment_path`` that neither terminated nor errored (read back
    from Tune's saved state: after a SIGINT the in-memory ResultGrid does not show them as unfinished)."""
    import logging

    from ray import tune

    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    ea = tune.ExperimentAnalysis(experiment_path)
    return [t.trial_id for t in ea.trials if t.status not in _ENDED]


def error_line(err) -> str:
    """One line for a trial's error: the last line of its traceback text (``ExcType: message``), with run ids
    (16 hex digits) blanked so that the same failure of different runs reads the same."""
    import re

    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else type(err).__name__
    return re.sub(r"\b[0-9a-f]{16}\b", "…", line)[:400]


def result_grid_errors(result_grid) -> list[str]:
    """:func:`error_line` of every trial of a Tune ``ResultGrid`` that ended in error."""
    return [error_line(r.error) for r in result_grid if r.error is not None]


class NoRunFinished(CommandFailed):
    """Not one run of a command finished: the message is "0 of N runs finished ok: <most common error>".
    ``resumable`` False: ``--resume`` of the folder would end the same way (the message says what to change
    instead); ``loopscale status`` then offers no ``--resume`` line."""

    resumable: bool = True


def no_run_finished(n_total: int, reasons: list[str]) -> NoRunFinished:
    """The :class:`NoRunFinished` error for ``n_total`` runs that all failed, naming the most common reason and
    the next two with their counts (a grid of 10 diverged and 2 did-not-learn runs named the diverged only)."""
    from collections import Counter

    if not reasons:
        return NoRunFinished(f"0 of {n_total} runs finished ok (no error was recorded; see the Tune logs)")
    ranked = Counter(reasons).most_common()
    (top, k), rest = ranked[0], ranked[1:]
    also = "; ".join(f"{why} ({n})" for why, n in rest[:2]) + (f"; {len(rest) - 2} other reasons" if len(rest) > 2
                                                                else "")  # fmt: skip
    return NoRunFinished(f"0 of {n_total} runs finished ok: {top} ({k} of {len(reasons)} failures)"
                         + (f"; also {also}" if also else ""))  # fmt: skip


def errored_run_ids(result_grid) -> list[str]:
    """Run ids of trials that ended in ERROR (after ``max_failures`` retries)."""
    trials = result_grid._experiment_analysis.trials
    return [d["run_id"] for t in trials if t.status == "ERROR" and t.config for d in trial_cells(t.config)]


RESTORE_LOST = "Could not recover from checkpoint"
"""Start of the error Ray 2.60 raises when a restored trial's checkpoint, as recorded in a lagging experiment
snapshot, was already deleted by checkpoint retention (``docs/ray_tune.md`` §2)."""


def lost_checkpoint(trial) -> bool:
    """Whether a Tune trial ended in ERROR because Tune could not restore it (its last error is
    :data:`RESTORE_LOST`: the experiment snapshot named a checkpoint that retention had deleted). Nothing is wrong
    with its run, and the run's own workspace still holds its checkpoints, so it can run again in a new
    experiment."""
    from loopscale.sweep.callbacks import trial_error_text

    return trial.status == "ERROR" and bool(trial.config) and RESTORE_LOST in trial_error_text(trial)


def lost_checkpoint_run_ids(result_grid) -> list[str]:
    """Run ids of the grid trials of ``result_grid`` (Tune's ResultGrid) that :func:`lost_checkpoint` finds."""
    trials = result_grid._experiment_analysis.trials
    return [d["run_id"] for t in trials if lost_checkpoint(t) for d in trial_cells(t.config)]
