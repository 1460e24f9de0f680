"""Stage 2: the grid as one Ray Tune experiment (every Tune call of the grid lives in this module).

Trials are the grid cells (an explicit ``tune.grid_search`` over cell dicts). The trainable is a thin function:
it turns the dict config into a ``RunConfig``, calls ``loopscale.model.train.train_run`` with a callback that
forwards every evaluation/checkpoint event to ``tune.report(metrics, checkpoint=tune.Checkpoint...)``, and
reports the finished ``RunResult`` once. Only the ``ray.tune.*`` API is used (``ray.train.*`` objects fail
inside Tune trainables on Ray 2.60, ``docs/ray_tune.md`` §1).

Run identity and restarts: each trial works in its run's workspace (:mod:`loopscale.sweep.workspace`: checkpoints
under ``<storage>/checkpoints/<run_id>/``, the newest on disk wins over Tune's restored one, a finished run reports
its saved result instead of training again). The driver writes each finished run into the results store
(:mod:`loopscale.sweep.store`) from a Tune callback (:mod:`loopscale.sweep.callbacks`), keyed by run id, so a run
appears exactly once however often its trial is restarted, and a trial that errors past its retries as a
``failed`` row.
"""

from __future__ import annotations

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


def grid_trainable(config: dict) -> None:
    """Ray Tune function trainable of one grid cell.

    ``config``: ``{"cell": Cell.to_dict() + {"run_id"}, "storage": URI, "_test_seams": dict | None}`` (the
    last: :mod:`loopscale.sweep._seams`).
    Reports ``event_metrics`` at each trainer event (with a ``tune.Checkpoint`` when one was written) and a
    final report with ``run_done=True`` and ``run_result`` (JSON of the ``RunResult``).
    """
    from ray import tune

    from loopscale.sweep.spec import Cell

    cell = Cell.from_dict(config["cell"])
    rid = config["cell"]["run_id"]
    storage_uri = config["storage"]
    seams = config.get(_seams.CONFIG_KEY)
    ws = RunWorkspace(storage_uri, rid)
    started = time.time()
    done = ws.result()
    if done is None:
        ws.prepare_resume()
        done = _train_cell(cell, ws, storage_uri, seams)
    tune.report(
        {
            DONE_KEY: True,
            # the per-micro-batch id list can be long (paper runs: ~10^5 ids); it stays in result.json only
            RESULT_KEY: json.dumps({k: v for k, v in done.items() if k != "micro_batch_ids"}),
            "final_val_loss": done.get("final_val_loss"),
            "status": done.get("status"),
            "started_at": started,
            "host": socket.gethostname(),
        }
    )


def _train_cell(cell, ws: RunWorkspace, storage_uri: str, seams: dict | None) -> dict:
    from ray import tune

    from loopscale.model.train import train_run

    cfg = cell.run_config(checkpoint_dir=str(ws.dir))

    def callback(event: dict) -> None:
        _seams.maybe_fail(seams, storage_uri, ws.rid, int(event.get("step") or 0))
        if event.get("checkpoint_path"):
            ws.push()
        ck, stage = tune_checkpoint_from(event.get("checkpoint_path"))
        try:
            tune.report(event_metrics(event), checkpoint=ck)
        finally:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)

    res = train_run(cfg, callback=callback).to_dict()
    res = json.loads(json.dumps(res, default=str))
    ws.save_result(res)
    return res


# --- driver side --------------------------------------------------------------------------------------


def _trial_name(trial) -> str:
    return f"run_{trial.config['cell']['run_id']}"


def _trial_dirname(trial) -> str:
    return f"run_{trial.config['cell']['run_id']}_{trial.trial_id}"


@dataclass(frozen=True)
class TunerPlan:
    """Everything a grid ``tune.Tuner`` is built from (pure data; building it does not start Ray).

    Attributes:
        experiment: experiment name (a folder under ``storage_path``).
        storage_path: Tune's ``storage_path`` (any pyarrow URI).
        param_space: ``{"cell": tune.grid_search([...]), "storage": ..., "_test_seams": ...}``.
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
    """Assemble the grid experiment for ``cells`` (a pure function: no Ray, no I/O). ``track``: parsed ``--track``
    targets (:func:`loopscale.sweep.tracking.parse_track`).

    Raises:
        ValueError: no cells.
    """
    from ray import tune

    if not cells:
        raise ValueError("cells must be non-empty: nothing to run")
    dicts = []
    for c in cells:
        d = c.to_dict()
        d["run_id"] = c.run_id
        dicts.append(d)
    resources = {"cpu": float(spec.resources.cpus)}
    if spec.resources.gpus:
        resources["gpu"] = float(spec.resources.gpus)
    return TunerPlan(
        experiment=experiment,
        storage_path=storage_path,
        param_space={
            "cell": tune.grid_search(dicts),
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


def unfinished_trials(experiment_path: str) -> list[str]:
    """Trial ids of the experiment saved at ``experiment_path`` that neither terminated nor errored (read back
    from Tune's saved state: after a SIGINT the in-memory ResultGrid does not show them as unfinished)."""
    import logging

    from ray import tune

    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    ea = tune.ExperimentAnalysis(experiment_path)
    return [t.trial_id for t in ea.trials if t.status not in ("TERMINATED", "ERROR")]


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
    """Not one run of a command finished: the message is "0 of N runs finished: <most common error>"."""


def no_run_finished(n_total: int, reasons: list[str]) -> NoRunFinished:
    """The :class:`NoRunFinished` error for ``n_total`` runs that all failed, naming the most common reason."""
    from collections import Counter

    if not reasons:
        return NoRunFinished(f"0 of {n_total} runs finished (no error was recorded; see the Tune logs)")
    top, k = Counter(reasons).most_common(1)[0]
    return NoRunFinished(f"0 of {n_total} runs finished: {top} ({k} of {len(reasons)} failures)")


def errored_run_ids(result_grid) -> list[str]:
    """Run ids of trials that ended in ERROR (after ``max_failures`` retries)."""
    trials = result_grid._experiment_analysis.trials
    return [t.config["cell"]["run_id"] for t in trials if t.status == "ERROR" and t.config]


RESTORE_LOST = "Could not recover from checkpoint"
"""Start of the error Ray 2.60 raises when a restored trial's checkpoint, as recorded in a lagging experiment
snapshot, was already deleted by checkpoint retention (``docs/ray_tune.md`` §2)."""


def lost_checkpoint_run_ids(result_grid) -> list[str]:
    """Run ids of ERROR trials whose last error is Tune's lost restore checkpoint (:data:`RESTORE_LOST`): nothing
    is wrong with such a run, and its own workspace still holds its checkpoints, so it can run again in a new
    experiment."""
    from loopscale.sweep.callbacks import trial_error_text

    trials = result_grid._experiment_analysis.trials
    return [
        t.config["cell"]["run_id"]
        for t in trials
        if t.status == "ERROR" and t.config and RESTORE_LOST in trial_error_text(t)
    ]
