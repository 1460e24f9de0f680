"""Experiment tracking through Ray Tune's own logger callbacks (``--track`` on ``tune-lr``, ``sweep`` and ``run``).

``--track`` takes ``tensorboard``, ``mlflow[:URI]`` or ``wandb[:PROJECT]`` and may be repeated. Each target is one of
Ray 2.60's logger callbacks, added to the experiment's ``RunConfig.callbacks``:

* ``tensorboard`` -> ``ray.tune.logger.TBXLoggerCallback`` (needs ``tensorboardX``), writing one event file per trial
  under ``OUT/tensorboard/<experiment>/<trial name>/`` instead of Tune's trial folder (which lives in Ray's temporary
  session folder and is gone after the run);
* ``mlflow[:URI]`` -> ``ray.air.integrations.mlflow.MLflowLoggerCallback`` (needs ``mlflow`` or ``mlflow-skinny``);
  default URI: ``MLFLOW_TRACKING_URI``, else ``file:OUT/mlruns``. MLflow 3 refuses its file store unless
  ``MLFLOW_ALLOW_FILE_STORE=true``; asking for a ``file:`` URI (or resuming an experiment started with one) sets
  that for this process, and a store folder that cannot be made (under a file, not writable) is refused up front;
* ``wandb[:PROJECT]`` -> ``ray.air.integrations.wandb.WandbLoggerCallback`` (needs ``wandb``; default project
  ``loopscale``; the API key comes from ``WANDB_API_KEY`` or ``wandb login``, ``WANDB_MODE=offline`` logs locally).

What is logged, per Tune trial: at every report the training step (Tune's ``timesteps_total``, the x axis),
``train_loss`` and ``val_loss`` (nats/token), ``lr``, ``tokens`` and ``tokens_per_s`` (the trial's rate since its
previous report, ``members * Δtokens / Δtime_total_s``, evaluation included; at the first report, the tokens
trained over the trainer's ``attempt_s``, the time since its first step, as ``time_total_s`` then holds the trial's
start-up); the final report adds ``final_val_loss``. A seed-ensemble trial (several runs
that differ only in their seed) is one tracked run whose per-run metrics carry the member's seed
(``train_loss/seed3``); its parameters list every run id and seed.
The parameters of an MLflow run are the run's defining fields (:func:`run_params`: run id, variant, r, size,
seed, lr, D or budget, the architecture). The packages are the ``track`` extra, ``pip install -e '.[track]'`` in
the checkout (``.[wandb]`` for W&B).

On ``--resume`` a restored Tune experiment keeps the callbacks it was started with (Tune stores them with the
experiment); cells run in a new experiment get the ``--track`` of the current command. A ``--track`` target the
restored experiment was started without logs nothing for it: :func:`check_restored` warns, and :func:`describe` says so
instead of naming where its logs would be.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

KINDS = {"tensorboard": "tensorboardX", "mlflow": "mlflow", "wandb": "wandb"}
"""Tracking kind -> the Python module its Ray callback needs."""
_LABEL = {"tensorboard": "TensorBoard", "mlflow": "MLflow", "wandb": "W&B"}
"""Tracking kind -> its name in the command's last lines."""
EXTRAS = {"tensorboard": "track", "mlflow": "track", "wandb": "wandb"}
"""Tracking kind -> the pyproject extra that installs its packages."""


def install_hint(kind: str) -> str:
    """The command that installs the packages of tracking ``kind`` into a loopscale checkout's environment: its
    pyproject extra (``track``: TensorBoard and MLflow; ``wandb``: W&B), installed from the checkout's root."""
    return f"pip install -e '.[{EXTRAS[kind]}]' in the loopscale checkout"
METRICS = ("train_loss", "val_loss", "lr", "tokens", "tokens_per_s", "final_val_loss")
"""Metrics sent to the trackers (besides the step)."""


@dataclass(frozen=True)
class Target:
    """One ``--track`` value. kind: tensorboard | mlflow | wandb; arg: the MLflow URI or W&B project ('' = default)."""

    kind: str
    arg: str = ""


def parse_track(values) -> tuple[Target, ...]:
    """Parse and check ``--track`` values (strings, or :class:`Target` s already parsed) before any compute.

    Raises:
        ValueError: an unknown kind (the message lists the valid forms), an argument on ``tensorboard``, or the
            package the kind needs is not installed (the message says how to install it).
    """
    out: list[Target] = []
    for v in values or ():
        if isinstance(v, Target):
            v = f"{v.kind}:{v.arg}" if v.arg else v.kind
        kind, _, arg = str(v).strip().partition(":")
        kind = kind.lower()
        if kind not in KINDS:
            raise ValueError(
                f"--track {v!r}: use tensorboard, mlflow[:URI] (e.g. mlflow:file:runs/x/mlruns) or "
                "wandb[:PROJECT]"
            )
        if kind == "tensorboard" and arg:
            raise ValueError(f"--track {v!r}: tensorboard takes no argument (the logs go to OUT/tensorboard)")
        mod = KINDS[kind]
        if importlib.util.find_spec(mod) is None:
            raise ValueError(
                f"--track {kind} needs the {mod} package, which is not installed: {install_hint(kind)} "
                f"(or pip install {mod}); nothing was run"
            )
        t = Target(kind, arg)
        if kind == "mlflow":
            _check_mlflow_server(arg or os.environ.get("MLFLOW_TRACKING_URI", ""))
        if t not in out:
            out.append(t)
    return tuple(out)


def _file_store_path(uri: str) -> Path | None:
    """The folder of an MLflow file store URI (``file:/abs``, ``file:rel``, ``file:///abs``, or a plain path; a
    relative one against the working directory, as :func:`mlflow_uri` resolves it), or None for another scheme."""
    from urllib.parse import urlsplit

    if not uri:
        return None
    if uri.startswith("file://"):
        return Path(urlsplit(uri).path).resolve()
    if uri.startswith("file:"):
        return Path(uri[len("file:") :]).resolve()
    return Path(uri).resolve() if not urlsplit(uri).scheme else None


def _allow_file_store(uri: str) -> None:
    """MLflow 3 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE=true``: set it (unless the environment
    already sets it) for a tracking URI that is one (:func:`_file_store_path`), in this process."""
    if _file_store_path(uri) is not None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def _check_mlflow_scheme(uri: str) -> None:
    """Refuse a tracking URI whose scheme no MLflow tracking store of this installation takes (MLflow's own store
    registry, plugins included): MLflow raised it only when the grid's first trial started, as a 280-line traceback,
    after the folder was written (``htp://host``). Where that registry cannot be asked (another MLflow), nothing is
    refused here.

    Raises:
        ValueError: naming the URI and the schemes MLflow takes."""
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry as registry
    except ImportError:
        return
    try:
        registry.get_store_builder(uri)
    except AttributeError:
        return
    except Exception:
        schemes = sorted(k for k in getattr(registry, "_registry", {}) if k)
        raise ValueError(
            f"--track mlflow: MLflow has no tracking store for {uri!r}"
            + (f" (it takes {', '.join(schemes)}, or a plain path)" if schemes else "")
            + "; give e.g. mlflow:http://host:5000 or mlflow:file:runs/x/mlruns; nothing was run"
        ) from None


def _check_mlflow_server(uri: str, timeout: float = 5.0) -> None:
    """Refuse an MLflow tracking URI the runs could not log to, before any compute: an ``http(s)`` server that does
    not answer a TCP connection within ``timeout`` seconds (MLflow's client retries such a server for minutes, with
    nothing on the console, before any trial runs), or a file store whose folder cannot be made (under a file, or
    in a folder this process may not write: MLflow failed with a traceback once the grid had started).

    Raises:
        ValueError: the server cannot be reached, or the folder cannot be made (the message names it and why)."""
    import socket
    from urllib.parse import urlsplit

    from loopscale.cluster.options import nearest_existing

    if (store := _file_store_path(uri)) is not None:
        have = nearest_existing(store)
        why = None
        if not have.is_dir():
            why = f"{have} is a file" if have == store else f"it would be under the file {have}"
        elif not os.access(have, os.W_OK | os.X_OK):
            why = f"{have} is not writable"
        if why:
            raise ValueError(f"--track mlflow: the MLflow file store {store} cannot be made: {why}; give a folder "
                             "you can write (e.g. mlflow:file:runs/x/mlruns); nothing was run")  # fmt: skip
        return
    _check_mlflow_scheme(uri)
    if uri.startswith("sqlite:///"):  # SQLAlchemy's form: sqlite:///relative/db or sqlite:////absolute/db
        db = Path(uri[len("sqlite:///") :]).resolve()
        have = nearest_existing(db.parent)
        if not have.is_dir() or not os.access(have, os.W_OK | os.X_OK):
            why = f"{have} is not writable" if have.is_dir() else f"it would be under the file {have}"
            raise ValueError(f"--track mlflow: the MLflow database {db} cannot be made: {why}; give a path you can "
                             "write (e.g. mlflow:sqlite:///runs/x/mlflow.db); nothing was run")  # fmt: skip
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
    except (OSError, ValueError) as e:
        raise ValueError(
            f"--track mlflow: the MLflow server {uri} cannot be reached ({e}); start it, or give another URI "
            "(e.g. mlflow:file:runs/x/mlruns); nothing was run"
        ) from None


_NOT_TRACKED: dict[Target, list[str]] = {}
"""``--track`` targets of this command that a resumed experiment did not get -> those experiments' names (see
:func:`check_restored`; :func:`describe` says so instead of pointing at logs that were not written)."""


def _callback_kind(cb) -> str | None:
    """The tracking kind of a Ray logger callback (a restored experiment's), or None for any other callback."""
    names = {c.__name__ for c in type(cb).__mro__}
    for kind, base in (("tensorboard", "TBXLoggerCallback"), ("mlflow", "MLflowLoggerCallback"),
                       ("wandb", "WandbLoggerCallback")):  # fmt: skip
        if base in names:
            return kind
    return None


def check_restored(tuner, targets: tuple[Target, ...], experiment: str) -> str | None:
    """After ``Tuner.restore`` of ``experiment``: Tune keeps the callbacks the experiment was started with, so a
    ``--track`` target of this command that it was not started with logs nothing for it. Returns the warning to print
    (None when every target is tracked, or the restored callbacks cannot be read, e.g. through Ray Client) and
    records those targets for :func:`describe`."""
    try:
        restored = tuner._local_tuner.get_run_config().callbacks or []
    except Exception:  # Ray Client (no local tuner) or another Ray: nothing to compare
        return None
    for cb in restored:  # the file store it was started with needs MLflow 3's opt-in in this process too
        if _callback_kind(cb) == "mlflow":
            _allow_file_store(getattr(cb, "tracking_uri", None) or os.environ.get("MLFLOW_TRACKING_URI") or "")
    kinds = {k for k in map(_callback_kind, restored) if k}
    missing = [t for t in targets if t.kind not in kinds]
    if not missing:
        return None
    for t in missing:
        _NOT_TRACKED.setdefault(t, []).append(experiment)
    had = ", ".join(sorted(kinds)) or "no --track"
    names = ", ".join(t.kind for t in missing)
    return (
        f"--resume: {experiment} goes on with the tracking it was started with ({had}); Tune keeps an experiment's "
        f"callbacks, so --track {names} logs nothing for its runs (runs in a new experiment, without --resume or "
        "in a new --out folder, are tracked)"
    )


def tensorboard_dir(out_dir: str | Path) -> Path:
    """Where ``--track tensorboard`` writes: ``OUT/tensorboard``."""
    return Path(out_dir).resolve() / "tensorboard"


def mlflow_uri(target: Target, out_dir: str | Path) -> str:
    """The MLflow tracking URI of ``target``: its argument (a relative ``file:`` path made absolute), else
    ``MLFLOW_TRACKING_URI``, else ``file:OUT/mlruns``."""
    uri = target.arg or os.environ.get("MLFLOW_TRACKING_URI") or f"file:{Path(out_dir).resolve() / 'mlruns'}"
    if uri.startswith("file:") and not uri.startswith("file://"):
        uri = "file:" + str(Path(uri[len("file:") :]).resolve())
    elif "://" not in uri and ":" not in uri.split("/", 1)[0]:  # a plain path
        uri = "file:" + str(Path(uri).resolve())
    return uri


def run_params(trial_config: dict) -> dict:
    """The defining fields of the run(s) of a Tune trial (grid: ``config["cell"]``/``config["cells"]``; LR
    study: ``config["base"]`` plus ``config["lr"]``), flat, as tracker parameters."""
    from loopscale.sweep.grid import trial_cells

    runs = trial_cells(trial_config) or ([trial_config["base"]] if "base" in (trial_config or {}) else [])
    if not runs:
        return {}
    c = runs[0]
    run, model = c.get("run") or {}, (c.get("run") or {}).get("model") or {}
    p = {
        "run_id": ",".join(str(x.get("run_id")) for x in runs if x.get("run_id")) or None,
        "variant": c.get("variant"),
        "r": c.get("r", model.get("r")),
        "size": c.get("size"),
        "budget": c.get("budget"),
        "seed": ",".join(str((x.get("run") or {}).get("seed")) for x in runs),
        "lr": trial_config.get("lr", run.get("lr")),
        "D": run.get("tokens"),
        "optimizer": run.get("optimizer"),
        "orthogonalization": None if run.get("optimizer") == "adamw" else run.get("orthogonalization", "newton_schulz"),
        "lr_data_factor": run.get("lr_data_factor", 1.0),
        "batch_tokens": run.get("batch_tokens"),
    }
    for k in (
        "d_model",
        "n_prelude",
        "n_recur_block",
        "n_coda",
        "bptt_k",
        "injection",
        "seq_len",
        "vocab_size",
    ):
        p[k] = model.get(k)
    return {k: v for k, v in p.items() if v is not None}


def _member_suffix(trial_config: dict, result: dict) -> str:
    """``/seed<k>`` for a result of one member of a seed-ensemble trial (its ``seed``, or the seed of the run its
    ``run_id`` names), so that every run of the ensemble keeps its own curve; ``""`` for a single-run trial."""
    from loopscale.sweep.grid import trial_cells

    runs = trial_cells(trial_config)
    if len(runs) < 2:
        return ""
    seed = result.get("seed")
    if seed is None and result.get("run_id"):
        seed = next(
            ((c.get("run") or {}).get("seed") for c in runs if c.get("run_id") == result["run_id"]), None
        )
    return "" if seed is None else f"/seed{int(seed)}"


def _metrics_mixin():
    from ray.tune.result import TIMESTEPS_TOTAL, TRAINING_ITERATION

    class TrackedMetrics:
        """Reduce a Tune result to :data:`METRICS` with the training step as ``timesteps_total`` before the Ray
        logger callback it is mixed into writes it."""

        def _tracked(self, trial, result: dict) -> dict:
            steps = self.__dict__.setdefault("_last_step", {})
            step = result.get("step")
            if step is None:
                step = steps.get(trial.trial_id, 0)
            steps[trial.trial_id] = int(step)
            suffix = _member_suffix(trial.config, result)
            out = {k + suffix: float(result[k]) for k in METRICS if isinstance(result.get(k), int | float)}
            t = result.get("time_total_s")
            rated = self.__dict__.setdefault("_rated", {})  # trial id -> (step, tokens, time_total_s) last rated
            tok = result.get("tokens")
            if isinstance(tok, int | float) and isinstance(t, int | float) and (rated.get(trial.trial_id) or (None,))[0] != int(step):
                # the trial's rate since its previous report, of all its members, once per step (every member of an
                # ensemble reports it); at the first report time_total_s holds the trial's start-up (imports, data,
                # model build): tokens / time_total_s read 1,029 tokens/s for a smoke run training at 22,347
                prev = rated.get(trial.trial_id)
                members = int(result.get("members") or 1)
                attempt_s, start = result.get("attempt_s"), float(result.get("start_tokens") or 0.0)
                if prev is not None and t > prev[2] and tok > prev[1]:
                    out["tokens_per_s"] = members * (float(tok) - prev[1]) / (float(t) - prev[2])
                elif prev is None and isinstance(attempt_s, int | float) and attempt_s > 0 and tok > start:
                    # the first report: the trainer's own clock from its first step (start-up left out)
                    out["tokens_per_s"] = members * (float(tok) - start) / float(attempt_s)
                rated[trial.trial_id] = (int(step), float(tok), float(t))
            out[TIMESTEPS_TOTAL] = int(step)
            out[TRAINING_ITERATION] = result.get(TRAINING_ITERATION, 0)
            return out

        def log_trial_result(self, iteration, trial, result):
            super().log_trial_result(iteration, trial, self._tracked(trial, result))

    return TrackedMetrics


FOLDER_TAG = "loopscale_folder"
"""The MLflow tag of every run a command logs: the output folder (absolute path) whose trial it is."""


def callbacks(targets: tuple[Target, ...], out_dir: str | Path, experiment: str, group: str) -> list:
    """The Ray Tune logger callbacks of ``targets`` for one Tune experiment (``experiment``: its name, the
    TensorBoard subfolder; ``group``: the MLflow experiment / W&B group, e.g. ``loopscale-smoke-grid``)."""
    if not targets:
        return []
    mixin = _metrics_mixin()
    cbs = []
    for t in targets:
        if t.kind == "tensorboard":
            cbs.append(_tbx_cls(mixin)(tensorboard_dir(out_dir) / experiment))
        elif t.kind == "mlflow":
            uri = mlflow_uri(t, out_dir)
            _allow_file_store(uri)  # asked for explicitly
            cbs.append(
                _mlflow_cls(mixin)(tracking_uri=uri, experiment_name=group,
                                   tags={"loopscale": experiment, FOLDER_TAG: str(Path(out_dir).resolve())})
            )
        else:
            from ray.air.integrations.wandb import WandbLoggerCallback

            cls = type("LoopscaleWandb", (mixin, WandbLoggerCallback), {})
            cbs.append(cls(project=t.arg or "loopscale", group=group))
    return cbs


def _tbx_cls(mixin):
    from ray.tune.logger import TBXLoggerCallback

    class LoopscaleTBX(mixin, TBXLoggerCallback):
        """``TBXLoggerCallback`` writing each trial's events to ``logdir/<trial name>`` (under OUT)."""

        def __init__(self, logdir: Path):
            super().__init__()
            self.logdir = Path(logdir)

        def log_trial_start(self, trial):
            if trial in self._trial_writer:
                self._trial_writer[trial].close()
            path = self.logdir / str(trial)
            path.mkdir(parents=True, exist_ok=True)
            self._trial_writer[trial] = self._summary_writer_cls(str(path), flush_secs=30)
            self._trial_result[trial] = {}

        def _try_log_hparams(self, trial, result):
            return None  # hparams of nested cell configs are not meaningful in TensorBoard's HParams tab

    return LoopscaleTBX


def _mlflow_cls(mixin):
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    class LoopscaleMLflow(mixin, MLflowLoggerCallback):
        """``MLflowLoggerCallback`` whose runs are named after the trial and carry :func:`run_params`. A trial that
        Tune restores from its checkpoint after a stop (``--resume``; the callback starts with no runs) logs on into
        its earlier MLflow run when the newest run of its name from the same output folder did not finish
        (:meth:`_unfinished_run`), instead of starting a second run; a trial that starts without a checkpoint
        (from step 0, e.g. after ``--force``), or whose run finished, gets a new run."""

        def log_trial_start(self, trial):
            if trial not in self._trial_runs:
                restored = getattr(trial, "checkpoint", None) is not None
                run_id = self._unfinished_run(str(trial)) if restored else None
                if run_id is None:
                    tags = {**self.tags, "trial_name": str(trial)}
                    run_id = self.mlflow_util.start_run(tags=tags, run_name=str(trial)).info.run_id
                self._trial_runs[trial] = run_id
            self.mlflow_util.log_params(
                run_id=self._trial_runs[trial], params_to_log=run_params(trial.config)
            )

        def _unfinished_run(self, name: str) -> str | None:
            """The id of the newest run of the MLflow experiment tagged ``trial_name = name`` and with this
            callback's ``loopscale_folder`` tag (another output folder's trial of the same name is another run),
            when its status is not FINISHED (a stopped or killed driver left it RUNNING, KILLED or FAILED); it is
            set RUNNING again. The experiment is searched once per callback (:meth:`_unfinished_runs`: a search
            per trial read every run of a file store each time). None when there is none, or the lookup fails
            (tracking never stops a trial)."""
            if "_unfinished" not in self.__dict__:
                self._unfinished = self._unfinished_runs()
            run_id = self._unfinished.pop(name, None)
            if run_id is None:
                return None
            try:
                from mlflow.tracking import MlflowClient

                MlflowClient(tracking_uri=self.tracking_uri).update_run(run_id, status="RUNNING")
            except Exception:  # noqa: BLE001  tracking never stops a trial: a new run, as before
                return None
            return run_id

        def _unfinished_runs(self) -> dict[str, str]:
            """``{trial_name: run id}`` of the newest run of each trial name with this callback's folder tag, where
            that run did not finish; ``{}`` without the tag, for a folder path holding both kinds of quote (MLflow's
            filter has no escapes) or when MLflow cannot be asked."""
            folder = self.tags.get(FOLDER_TAG)
            quote = next((q for q in "'\"" if folder is not None and q not in folder), None)
            if quote is None:
                return {}
            try:
                from mlflow.tracking import MlflowClient

                client = MlflowClient(tracking_uri=self.tracking_uri)
                exp = client.get_experiment_by_name(self.experiment_name)
                if exp is None:
                    return {}
                newest: dict = {}
                token = None
                while True:  # every run of this folder, newest first, a page at a time
                    page = client.search_runs([exp.experiment_id], f"tags.{FOLDER_TAG} = {quote}{folder}{quote}",
                                              order_by=["attributes.start_time DESC"], max_results=1000,
                                              page_token=token)  # fmt: skip
                    for run in page:
                        newest.setdefault(run.data.tags.get("trial_name"), run)
                    token = page.token
                    if not token:
                        break
                return {n: r.info.run_id for n, r in newest.items() if n and r.info.status != "FINISHED"}
            except Exception:  # noqa: BLE001  tracking never stops a trial: new runs, as before
                return {}

    return LoopscaleMLflow


def describe(targets: tuple[Target, ...], out_dir: str | Path, group: str | tuple[str, ...]) -> list[str]:
    """One line per target saying where its results are (printed at the end of a command). ``group``: the MLflow
    experiment / W&B group the command logged into, or several (``loopscale run``: its LR studies' and its grid's)."""
    groups = (group,) if isinstance(group, str) else tuple(group)
    named = ", ".join(repr(g) for g in groups)
    plural = "s" if len(groups) > 1 else ""
    lines = []
    for t in targets:
        if t in _NOT_TRACKED:
            exps = ", ".join(_NOT_TRACKED.pop(t))
            lines.append(
                f"{_LABEL[t.kind]}: nothing logged for the resumed experiment {exps} (Tune keeps the tracking "
                f"an experiment was started with, and it was started without --track {t.kind})"
            )
            continue
        if t.kind == "tensorboard":
            import importlib.util

            d = tensorboard_dir(out_dir)
            if not d.is_dir():  # e.g. every cell was done already: no trial ran, so no event file was written
                lines.append(f"TensorBoard: no logs in {d}: no trial ran in this command")
                continue
            # tensorboardX (installed with Ray) writes the event files; viewing them needs the tensorboard package
            view = f"tensorboard --logdir {d}"
            if importlib.util.find_spec("tensorboard") is None:
                view = f"pip install tensorboard, then {view}"
            lines.append(f"TensorBoard logs: {d} (view: {view})")
        elif t.kind == "mlflow":
            uri = mlflow_uri(t, out_dir)
            there = _experiments_in_store(uri, groups)
            # Ray's MLflow callback makes the experiment when Tune starts, before any trial (so a named one may hold no
            # run yet); none there: Tune never started (every cell was done already, or a stop came before)
            if there == []:
                lines.append(f"MLflow: nothing logged at {uri}: no trial of this command or an earlier one started "
                             f"in {'any of ' if len(groups) > 1 else ''}{named}")  # fmt: skip
            else:  # a server (None) is not asked: an answer could take MLflow's retries
                shown = groups if there is None else there
                lines.append(f"MLflow: experiment{'s' * (len(shown) > 1)} {', '.join(map(repr, shown))} at {uri}")
        else:
            lines.append(f"W&B: project {t.arg or 'loopscale'}, group{plural} {named}")
    _NOT_TRACKED.clear()
    return lines


def _experiments_in_store(uri: str, groups: tuple[str, ...]) -> list[str] | None:
    """Those of the MLflow experiments ``groups`` that the file store ``uri`` holds (a store folder that does not
    exist, or holds no experiment folder, holds none; it is left as it is), in order; None for a URI that is not a
    file store, or a store MLflow cannot read."""
    store = _file_store_path(uri)
    if store is None:
        return None
    if not store.is_dir():
        return []
    if not any(p.is_dir() and p.name != ".trash" for p in store.iterdir()):
        return []  # no experiment folder: nothing to ask MLflow (its client would make .trash/ in the user's folder)
    try:
        _allow_file_store(uri)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        return [g for g in groups if client.get_experiment_by_name(g) is not None]
    except Exception:  # noqa: BLE001  the closing line is informative: say what was asked for
        return None


@contextlib.contextmanager
def described(targets: tuple[Target, ...], out_dir: str | Path, group: str | tuple[str, ...], say: Callable[[str], None]) -> Iterator[None]:
    """Say :func:`describe`'s lines (with ``say``) when the block ends, and also when it is stopped by a Ctrl-C or
    SIGTERM (what was logged before the stop is there); not after an error, whose one line stays the last."""
    from loopscale.cluster.options import Interrupted

    def say_all() -> None:
        for line in describe(targets, out_dir, group):
            say(line)

    try:
        yield
    except (KeyboardInterrupt, Interrupted):
        say_all()
        raise
    say_all()
