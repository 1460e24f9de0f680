"""Driver-side Tune callbacks: they run in the driver process, never in a trial.

* ``RecordRuns`` (grid): writes each finished run into the results store once per run id, a ``failed`` row for a
  trial that errored past its retries, and prints progress.
* ``OptunaMirror`` (LR search): writes each finished Tune trial once into the persistent Optuna study, deduplicated
  by LR, so the study never holds a RUNNING trial (``docs/ray_tune.md`` §2).

The classes subclass ``ray.tune.Callback`` and are built on first use (``_recorder_cls()``, ``_mirror_cls()``) so
that importing this module does not import Ray.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from loopscale.sweep.workspace import DONE_KEY

STEP_PROGRESS_EVERY_S = 2.0
"""Seconds between two progress updates of the grid display from Tune's loop (besides each result)."""


def trial_error_text(trial) -> str:
    """The last error of a Tune trial as text: the last line of its error file (``<Type>: <message>`` of the
    exception the trainable raised), or a note when Tune left no error file."""
    lines: list[str] = []
    path = getattr(trial, "error_file", None)
    try:
        if path and Path(path).is_file():
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        else:
            lines = (trial.get_error() or "").splitlines()
    except OSError:
        pass
    lines = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("Failure # ")]
    return lines[-1][:2000] if lines else f"trial {trial.trial_id} errored (Tune kept no error text)"


def _recorder_cls():
    from ray.tune import Callback

    class RecordRuns(Callback):
        """Driver-side Tune callback: writes each finished run into the results store (once per run id) and
        updates the progress display (done/running/pending/failed, tokens/s, ETA; :mod:`loopscale.sweep.console`)."""

        def __init__(self, out_dir: str, cells: dict[str, dict], quiet: bool = False):
            self.out_dir = out_dir
            self.cells = cells
            self.quiet = quiet
            # run ids already in the store: a trial restored after an interrupt that only re-reports its saved
            # result must not overwrite the original record (its started/finished times, trial id)
            self._recorded: set[str] | None = None
            self._last_step = float("-inf")

        def on_trial_result(self, iteration, trials, trial, result, **info):
            from loopscale.sweep.grid import RESULT_KEY, trial_cells
            from loopscale.sweep.spec import Cell
            from loopscale.sweep.store import ResultsStore, curve_rows, run_record

            if self._recorded is None:
                self._recorded = ResultsStore(self.out_dir).completed_ids()
            rid = result.get("run_id") or trial_cells(trial.config)[0]["run_id"]
            if result.get(DONE_KEY) and rid not in self._recorded:
                res = json.loads(result[RESULT_KEY])
                rec = run_record(
                    Cell.from_dict(self.cells[rid]),
                    res,
                    trial_id=trial.trial_id,
                    host=result.get("host") or result.get("hostname"),
                    started_at=result.get("started_at"),
                    finished_at=time.time(),
                )
                ResultsStore(self.out_dir).write_run(rec, curve_rows(rec.run_id, res.get("curve")))
                self._recorded.add(rec.run_id)
            self._progress(trials, trial, result)

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._progress(trials)

        def on_step_end(self, iteration, trials, **info):
            """Between results too (Ray start-up, compilation, trials that report once a minute): the display
            starts with the experiment, its time and ETA move, and ``progress.json`` stays fresh for
            ``loopscale status``; at most once per :data:`STEP_PROGRESS_EVERY_S`."""
            now = time.monotonic()
            if now - self._last_step >= STEP_PROGRESS_EVERY_S:
                self._last_step = now
                self._progress(trials)

        def on_trial_error(self, iteration, trials, trial, **info):
            """The trial errored past ``max_failures``: record each of its cells that has no row yet as ``failed``
            with the trial's last error, so ``runs.parquet`` accounts for every cell (a later sweep retries it and
            replaces the row)."""
            from loopscale.sweep.grid import trial_cells
            from loopscale.sweep.spec import Cell
            from loopscale.sweep.store import ResultsStore, failed_record

            if self._recorded is None:
                self._recorded = ResultsStore(self.out_dir).completed_ids()
            err = trial_error_text(trial)
            for d in trial_cells(trial.config):
                rid = d["run_id"]
                if rid in self._recorded:
                    continue
                rec = failed_record(
                    Cell.from_dict(self.cells[rid]), err, trial_id=trial.trial_id, finished_at=time.time()
                )
                ResultsStore(self.out_dir).write_run(rec, [])
            self._progress(trials)

        def on_experiment_end(self, trials, **info):
            if not self.quiet:
                from loopscale.sweep import console

                console.grid_observe(trials)  # the final statuses, then the display's summary line
                console.end_view()

        def _progress(self, trials, trial=None, result=None):
            """Update the grid's progress display (:mod:`loopscale.sweep.console`)."""
            if self.quiet:
                return
            from loopscale.sweep import console

            console.grid_observe(trials, trial, result)

    return RecordRuns


def _mirror_cls():
    from ray.tune import Callback

    from loopscale.sweep.lr_search import METRIC, TIME_ATTR, UNHEALTHY_KEY, LRSpace, _lr_key

    class OptunaMirror(Callback):
        """Writes each finished Tune trial once into the persistent Optuna study (deduplicated by LR). A trial
        that ended in error only because Tune could not restore it (:func:`loopscale.sweep.grid.lost_checkpoint`)
        is not written: its LR is trained again from its own checkpoints (:func:`loopscale.sweep.lr_search.
        _run_study`), and a FAIL written first would keep that result out of the study."""

        def __init__(
            self, storage_url: str, study_name: str, space: LRSpace, num_milestones: int, history_path: str
        ):
            self.storage_url, self.study_name = storage_url, study_name
            self.space, self.M = space, num_milestones
            self.history_path = history_path

        def _history(self) -> dict:
            from loopscale.cluster.storage import read_json_or_aside

            return (read_json_or_aside(self.history_path) or {}).get("history", {})

        def _record(self, trial, failed: bool) -> None:
            import optuna

            from loopscale.sweep.grid import lost_checkpoint

            if not trial.config or "lr" not in trial.config or (failed and lost_checkpoint(trial)):
                return
            lr = float(trial.config["lr"])
            key = _lr_key(lr)
            study = optuna.load_study(study_name=self.study_name, storage=optuna_storage(self.storage_url))
            if any(t.user_attrs.get("lr_key") == key for t in study.get_trials(deepcopy=False)):
                return
            hist = {int(k): v for k, v in self._history().get(key, {}).items()}
            last = trial.last_result or {}
            if last.get(TIME_ATTR) is not None and last.get(METRIC) is not None:
                hist.setdefault(int(last[TIME_ATTR]), float(last[METRIC]))
            top = max(hist) if hist else 0
            reason = _fail_reason(trial) if failed else (last.get(UNHEALTHY_KEY) or None)
            if reason:
                state = optuna.trial.TrialState.FAIL
            elif top >= self.M:
                state = optuna.trial.TrialState.COMPLETE
            else:
                state = optuna.trial.TrialState.PRUNED
            value = hist[top] if state == optuna.trial.TrialState.COMPLETE else None
            study.add_trial(
                optuna.trial.create_trial(
                    params={"lr": lr},
                    distributions={"lr": self.space.distribution()},
                    value=value,
                    state=state,
                    intermediate_values=hist,
                    user_attrs={
                        "lr_key": key,
                        "tune_trial_id": trial.trial_id,
                        "last_milestone": top,
                        **(
                            {"fail_reason": reason, "fail_kind": "error" if failed else "unhealthy"}
                            if reason
                            else {}
                        ),
                    },
                )
            )
            from loopscale.sweep import console

            console.lr_trial_finished(self.study_name, lr, state.name, value)

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._record(trial, failed=False)

        def on_trial_error(self, iteration, trials, trial, **info):
            self._record(trial, failed=True)

    return OptunaMirror


def _fail_reason(trial) -> str:
    """One line for an LR trial that ended in error (from its Tune error file, run ids blanked)."""
    from loopscale.sweep.grid import error_line

    try:
        return error_line(Path(trial.error_file).read_text(encoding="utf-8", errors="replace"))
    except (OSError, TypeError):
        return "the trial raised an error (no error file)"


_STORAGES: dict = {}


def optuna_storage(url: str):
    """One ``optuna.storages.RDBStorage`` per URL and process. SQLite connections wait up to 60 s for a lock
    (readers such as optuna-dashboard may hold it) instead of failing the driver's write."""
    import optuna

    if url not in _STORAGES:
        kw = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        _STORAGES[url] = optuna.storages.RDBStorage(url, engine_kwargs=kw)
    return _STORAGES[url]
