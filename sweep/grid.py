"""Stage 2: the grid as one Ray Tune experiment (every Tune call of the grid lives in this module).

Trials are the grid cells (an explicit ``tune.grid_search`` over cell dicts). The trainable is a thin function:
it turns the dict config into a ``RunConfig``, calls ``loopscale.model.train.train_run`` with a callback that
forwards every evaluation/checkpoint event to ``tune.report(metrics, checkpoint=tune.Checkpoint...)``, and
reports the finished ``RunResult`` once. Only the ``ray.tune.*`` API is used (``ray.train.*`` objects fail
inside Tune trainables on Ray 2.60, shared/notes/ray_tune_on_this_machine.md §3).

Run identity and restarts:

* every cell has a ``run_id`` (``loopscale.sweep.spec.run_id``); its trainer checkpoints live under
  ``<storage>/checkpoints/<run_id>/`` and the trainer resumes from the newest one there. After a hard kill of
  the driver Tune's experiment snapshot can lag the disk (restored trials restarted from an older checkpoint,
  or from step 0, in the notes), so a restarted trial always looks there first; Tune's own checkpoint
  (``tune.get_checkpoint()``) is copied in only when it is newer than anything on disk.
* a finished run writes ``<storage>/checkpoints/<run_id>/result.json``; a trial whose run already finished
  (a restored or re-created trial) reports that result instead of training again.
* the driver writes each finished run into the results store (``loopscale.sweep.store``) from a Tune callback,
  keyed by run id, so a run appears exactly once however often its trial is restarted.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRIC = "val_loss"
"""Metric name reported at each evaluation (nats/token)."""
DONE_KEY = "run_done"
"""Set (True) in the single report that carries the finished ``RunResult``."""
RESULT_KEY = "run_result"
"""JSON of ``RunResult.to_dict()`` in the final report."""
TRAINABLE_NAME = "loopscale_grid"


# --- storage helpers (shared with tune_lr) ----------------------------------------------------------


def is_local_uri(uri: str) -> bool:
    """True for plain paths and ``file://`` URIs (checkpoints can then be used in place)."""
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> Path:
    """Local path of a local URI."""
    return Path(uri[len("file://") :] if uri.startswith("file://") else uri).resolve()


def uri_join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI or path."""
    from loopscale.cluster import storage

    return storage.join(uri, *parts)


def read_json_uri(uri: str) -> dict | None:
    """JSON at ``uri`` or None when there is no such file (or an unreadable one, which is moved aside with a
    warning: a torn ``result.json`` makes its run count as unfinished, never blocks the sweep)."""
    from loopscale.cluster import storage

    return storage.read_json_or_aside(uri)


def write_json_uri(uri: str, obj: Any) -> None:
    """Write JSON atomically at ``uri`` (local or any pyarrow filesystem)."""
    from loopscale.cluster import storage

    storage.write_bytes_atomic(uri, json.dumps(obj, sort_keys=True).encode())


def _ckpt_files(d: Path) -> list[Path]:
    if not d.is_dir():
        return []
    return [
        p
        for p in d.iterdir()
        if p.is_file() and p.name not in ("result.json",) and not p.name.startswith(".")
    ]


class RunWorkspace:
    """Where one run keeps its trainer checkpoints (a local directory) and its finished result.

    ``uri`` = ``<storage>/checkpoints/<run_id>``. For a local storage the trainer writes there directly; for
    a remote one it writes to a local cache that is fetched at start and synced after every checkpoint.
    """

    def __init__(self, storage_uri: str, rid: str):
        self.rid = rid
        self.uri = uri_join(storage_uri, "checkpoints", rid)
        self.local = is_local_uri(storage_uri)
        if self.local:
            self.dir = local_path(self.uri)
        else:
            self.dir = Path(tempfile.gettempdir()) / "loopscale_ckpt" / rid
        self.dir.mkdir(parents=True, exist_ok=True)

    def pull(self) -> None:
        """Remote storage: copy the stored checkpoint directory into the local cache (no-op when local)."""
        if self.local:
            return
        from loopscale.cluster import storage

        try:
            storage.fetch_dir(uri_join(self.uri, "trainer"), str(self.dir))
        except FileNotFoundError:
            pass

    def push(self) -> None:
        """Remote storage: upload the local checkpoint directory (no-op when local)."""
        if self.local:
            return
        from loopscale.cluster import storage

        storage.sync_dir(str(self.dir), uri_join(self.uri, "trainer"))

    def adopt(self, ckpt_dir: str) -> bool:
        """Copy checkpoint files from a Tune checkpoint directory when they are newer than the local ones
        (by file modification time); returns True when something was copied."""
        src = [p for p in Path(ckpt_dir).iterdir() if p.is_file()]
        if not src:
            return False
        newest_local = max((p.stat().st_mtime for p in _ckpt_files(self.dir)), default=-1.0)
        if max(p.stat().st_mtime for p in src) <= newest_local:
            return False
        for p in src:
            dst = self.dir / p.name
            if not dst.exists():
                shutil.copy2(p, dst)
        return True

    def prepare_resume(self) -> None:
        """Inside a Tune trial, before training: bring this run's checkpoints into :attr:`dir` — the stored ones
        (:meth:`pull`) and Tune's restored checkpoint when it is newer (:meth:`adopt`) — so the trainer resumes
        from the newest of them (Tune's snapshot can lag the files on disk after a hard kill)."""
        from ray import tune

        self.pull()
        ckpt = tune.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                self.adopt(d)

    def result(self) -> dict | None:
        """The finished ``RunResult.to_dict()`` of this run, if it finished before."""
        return read_json_uri(uri_join(self.uri, "result.json"))

    def save_result(self, result: dict) -> None:
        write_json_uri(uri_join(self.uri, "result.json"), result)

    def clear(self) -> None:
        """Delete everything of this run (``--force``)."""
        from loopscale.cluster import storage

        storage.remove(self.uri)
        if not self.local:
            shutil.rmtree(self.dir, ignore_errors=True)


def maybe_inject_fault(storage_uri: str, rid: str, fault_at_step: int | None, step: int) -> None:
    """TEST ONLY (``test_fault_at_step``): raise once per run id at the first event with step >= the value.

    Raises:
        RuntimeError: the injected failure.
    """
    if fault_at_step is None or step < fault_at_step:
        return
    from loopscale.cluster import storage

    marker = uri_join(storage_uri, "faults", rid)
    if storage.exists(marker):
        return
    storage.write_bytes_atomic(marker, str(step).encode())
    raise RuntimeError(f"injected failure at step {step} (test_fault_at_step={fault_at_step}, run {rid})")


def event_metrics(event: dict) -> dict:
    """Tune metrics of one trainer event (None values dropped: Tune's CSV logger cannot hold them)."""
    out = {k: event.get(k) for k in ("step", "tokens", "train_loss", "val_loss", "lr")}
    out = {k: (float(v) if isinstance(v, float) else v) for k, v in out.items() if v is not None}
    out[DONE_KEY] = False
    return out


def tune_checkpoint_from(path: str | None):
    """A ``tune.Checkpoint`` holding the trainer checkpoint at ``path`` (a file or a directory), staged in a
    temporary directory next to it (Tune copies it into its storage), or None. Returns (checkpoint, tmpdir)."""
    if not path:
        return None, None
    from ray import tune

    p = Path(path)
    stage = Path(tempfile.mkdtemp(prefix=".tune_stage_", dir=str(p.parent)))
    if p.is_dir():
        shutil.copytree(p, stage, dirs_exist_ok=True)
    else:
        try:
            os.link(p, stage / p.name)
        except OSError:
            shutil.copy2(p, stage / p.name)
    return tune.Checkpoint.from_directory(str(stage)), stage


# --- the trainable ------------------------------------------------------------------------------------


def grid_trainable(config: dict) -> None:
    """Ray Tune function trainable of one grid cell.

    ``config``: ``{"cell": Cell.to_dict() + {"run_id"}, "storage": URI, "fault_at_step": int | None}``.
    Reports ``event_metrics`` at each trainer event (with a ``tune.Checkpoint`` when one was written) and a
    final report with ``run_done=True`` and ``run_result`` (JSON of the ``RunResult``).
    """
    from ray import tune

    from loopscale.sweep.spec import Cell

    cell = Cell.from_dict(config["cell"])
    rid = config["cell"]["run_id"]
    storage_uri = config["storage"]
    fault = config.get("fault_at_step")
    ws = RunWorkspace(storage_uri, rid)
    started = time.time()
    done = ws.result()
    if done is None:
        ws.prepare_resume()
        done = _train_cell(cell, ws, storage_uri, fault)
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


def _train_cell(cell, ws: RunWorkspace, storage_uri: str, fault: int | None) -> dict:
    from ray import tune

    from loopscale.model.train import train_run

    cfg = cell.run_config(checkpoint_dir=str(ws.dir))

    def callback(event: dict) -> None:
        maybe_inject_fault(storage_uri, ws.rid, fault, int(event.get("step") or 0))
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


def _recorder_cls():
    from ray.tune import Callback

    class RecordRuns(Callback):
        """Driver-side Tune callback: writes each finished run into the results store (once per run id) and
        prints progress (done/running/pending/failed, tokens/s, ETA) at most every ``every_s`` seconds."""

        def __init__(self, out_dir: str, cells: dict[str, dict], every_s: float = 10.0, quiet: bool = False):
            self.out_dir = out_dir
            self.cells = cells
            self.every_s = every_s
            self.quiet = quiet
            self._last = 0.0
            self._t0 = time.time()
            self._tps: dict[str, float] = {}
            self._done_walls: list[float] = []
            # run ids already in the store: a trial restored after an interrupt that only re-reports its saved
            # result must not overwrite the original record (its started/finished times, trial id)
            self._recorded: set[str] | None = None

        def on_trial_result(self, iteration, trials, trial, result, **info):
            from loopscale.sweep.spec import Cell
            from loopscale.sweep.store import ResultsStore, curve_rows, run_record

            if self._recorded is None:
                self._recorded = ResultsStore(self.out_dir).completed_ids()
            if result.get(DONE_KEY) and trial.config["cell"]["run_id"] not in self._recorded:
                res = json.loads(result[RESULT_KEY])
                cell = Cell.from_dict(self.cells[trial.config["cell"]["run_id"]])
                rec = run_record(
                    cell,
                    res,
                    trial_id=trial.trial_id,
                    host=result.get("host") or result.get("hostname"),
                    started_at=result.get("started_at"),
                    finished_at=time.time(),
                )
                ResultsStore(self.out_dir).write_run(rec, curve_rows(rec["run_id"], res.get("curve")))
                self._recorded.add(rec["run_id"])
                self._done_walls.append(float(res.get("wall_s") or 0.0))
                self._tps.pop(trial.trial_id, None)
            elif "tokens" in result and result.get("time_total_s"):
                self._tps[trial.trial_id] = float(result["tokens"]) / float(result["time_total_s"])
            self._progress(trials)

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._progress(trials, force=True)

        def on_trial_error(self, iteration, trials, trial, **info):
            self._progress(trials, force=True)

        def _progress(self, trials, force: bool = False):
            if self.quiet:
                return
            now = time.time()
            if not force and now - self._last < self.every_s:
                return
            self._last = now
            st = [t.status for t in trials]
            done, running = st.count("TERMINATED"), st.count("RUNNING")
            pending, failed = st.count("PENDING") + st.count("PAUSED"), st.count("ERROR")
            tps = sum(self._tps.values())
            eta = "?"
            if done:
                per = (now - self._t0) / done
                eta = f"{per * (pending + running):.0f}s"
            import sys

            print(
                f"[loopscale sweep] done {done}, running {running}, pending {pending}, failed {failed}, "
                f"{tps:,.0f} tokens/s, ETA {eta}",
                file=sys.stderr,
                flush=True,
            )

    return RecordRuns


@dataclass(frozen=True)
class TunerPlan:
    """Everything a grid ``tune.Tuner`` is built from (pure data; building it does not start Ray).

    Attributes:
        experiment: experiment name (a folder under ``storage_path``).
        storage_path: Tune's ``storage_path`` (any pyarrow URI).
        param_space: ``{"cell": tune.grid_search([...]), "storage": ..., "fault_at_step": ...}``.
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

    def trainable(self):
        """``tune.with_resources(grid_trainable, resources)``."""
        from ray import tune

        return tune.with_resources(grid_trainable, self.resources)

    def run_config(self):
        """The ``tune.RunConfig`` (storage, failure policy, checkpoint retention, our callback)."""
        from ray import tune

        return tune.RunConfig(
            name=self.experiment,
            storage_path=self.storage_path,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=self.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            callbacks=[_recorder_cls()(self.out_dir, self.cells, quiet=self.quiet)],
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
) -> TunerPlan:
    """Assemble the grid experiment for ``cells`` (a pure function: no Ray, no I/O).

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
            "fault_at_step": spec.test_fault_at_step,
        },
        resources=resources,
        reuse_actors=reuse_actors,
        max_failures=spec.max_failures,
        max_concurrent=max_concurrent,
        cells={d["run_id"]: d for d in dicts},
        out_dir=str(out_dir),
        quiet=quiet,
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


class NoRunFinished(RuntimeError):
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
