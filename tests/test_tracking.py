"""--track: parsing and checks before compute, and the smoke grid tracked into a real MLflow file store and
TensorBoard event files through Ray Tune's logger callbacks."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopscale.sweep import tracking
from loopscale.sweep.presets import preset_spec

ROOT = Path(__file__).resolve().parents[1]
HAVE_TRACK = all(importlib.util.find_spec(m) for m in ("tensorboardX", "tensorboard", "mlflow"))


def test_parse_track_forms():
    if not HAVE_TRACK:
        pytest.skip("the track extra is not installed (pip install -e '.[track]')")
    got = tracking.parse_track(["tensorboard", "mlflow", "MLflow:file:/x/mlruns", "tensorboard"])
    assert got == (
        tracking.Target("tensorboard"),
        tracking.Target("mlflow"),
        tracking.Target("mlflow", "file:/x/mlruns"),
    )
    assert tracking.parse_track(got) == got and tracking.parse_track(None) == ()


@pytest.mark.parametrize(
    ("value", "msg"),
    [("neptune", "use tensorboard, mlflow[:URI]"), ("tensorboard:/x", "takes no argument")],
)
def test_parse_track_refuses_bad_values(value, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        tracking.parse_track([value])


def test_missing_package_says_how_to_install(monkeypatch):
    """Each kind names the pyproject extra that installs it: W&B is its own extra, not the track extra."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m in ("wandb", "mlflow") else real(m, *a))
    with pytest.raises(ValueError, match=r"needs the wandb package.*pip install -e '\.\[wandb\]'"):
        tracking.parse_track(["wandb:proj"])
    with pytest.raises(ValueError, match=r"needs the mlflow package.*pip install -e '\.\[track\]'"):
        tracking.parse_track(["mlflow"])
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for kind, extra in tracking.EXTRAS.items():  # the extra named holds the kind's package
        assert any(dep.lower().startswith(tracking.KINDS[kind].lower()) for dep in extras[extra]), (kind, extra)


def test_mlflow_uri_defaults_and_relative_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "out"
    assert tracking.mlflow_uri(tracking.Target("mlflow"), out) == f"file:{out / 'mlruns'}"
    assert (
        tracking.mlflow_uri(tracking.Target("mlflow", "file:rel/mlruns"), out)
        == f"file:{tmp_path / 'rel/mlruns'}"
    )
    assert tracking.mlflow_uri(tracking.Target("mlflow", "http://host:5000"), out) == "http://host:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert tracking.mlflow_uri(tracking.Target("mlflow"), out) == "http://env:5000"


def test_run_params_are_the_defining_fields():
    c = preset_spec("smoke").cells()[3]
    d = {**c.to_dict(), "run_id": c.run_id}
    p = tracking.run_params({"cell": d, "storage": "/x"})
    assert p["run_id"] == c.run_id and p["r"] == c.r and p["size"] == c.size and p["D"] == c.run.tokens
    assert p["lr"] == c.run.lr and p["d_model"] == c.run.model.d_model and "storage" not in p
    two = tracking.run_params({"cells": [d, {**d, "run_id": "x"}]})
    assert two["run_id"] == f"{c.run_id},x"


def test_bad_track_is_refused_before_any_compute(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "loopscale.sweep.cli", "sweep", str(ROOT / "configs" / "smoke.yaml")]
        + ["--out", str(out), "--track", "comet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "--track 'comet'" in p.stderr
    assert not out.exists()


@pytest.fixture(scope="module")
def tracked_smoke(tmp_path_factory):
    """The smoke grid swept once with --track tensorboard and --track mlflow:file:OUT/mlruns."""
    if not HAVE_TRACK:
        pytest.skip("the track extra is not installed (pip install -e '.[track]')")
    from loopscale.sweep import run_sweep

    out = tmp_path_factory.mktemp("tracked") / "run"
    run_sweep(
        preset_spec("smoke"),
        out,
        num_cpus=2,
        quiet=True,
        track=["tensorboard", f"mlflow:file:{out / 'mlruns'}"],
    )
    return out, preset_spec("smoke").cells()


def test_every_smoke_run_is_in_mlflow_with_params_and_step_metrics(tracked_smoke):
    import mlflow

    out, cells = tracked_smoke
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.tracking.MlflowClient(f"file:{out / 'mlruns'}")
    exp = client.get_experiment_by_name("loopscale-smoke-grid")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    by_id = {r.data.params["run_id"]: r for r in runs}
    assert set(by_id) == {c.run_id for c in cells} and len(runs) == len(cells)
    for c in cells:
        run = by_id[c.run_id]
        assert run.info.status == "FINISHED" and run.info.run_name == f"run_{c.run_id}"
        assert int(run.data.params["r"]) == c.r and int(run.data.params["D"]) == c.run.tokens
        hist = client.get_metric_history(run.info.run_id, "train_loss")
        steps = [m.step for m in hist]
        # one point per report, on the training step: the trainer reports every 4 steps (checkpoint_every_steps)
        assert steps == sorted(steps) and len(set(steps)) >= 2 and steps[-1] == c.run.tokens // 256
        assert {"val_loss", "lr", "tokens_per_s", "final_val_loss"} <= set(run.data.metrics)
        assert run.data.metrics["tokens_per_s"] > 0
    # the closing line names the experiment the sweep logged into, and not one it did not make
    target = tracking.parse_track([f"mlflow:file:{out / 'mlruns'}"])
    assert tracking.describe(target, out, ("loopscale-smoke-tune-lr", "loopscale-smoke-grid")) == [
        f"MLflow: experiment 'loopscale-smoke-grid' at file:{out / 'mlruns'}"]


def test_tensorboard_events_are_under_out_and_readable(tracked_smoke):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, cells = tracked_smoke
    dirs = sorted((out / "tensorboard").glob("grid_smoke_*/run_*"))
    assert {d.name for d in dirs} == {f"run_{c.run_id}" for c in cells}
    ea = EventAccumulator(str(dirs[0]))
    ea.Reload()
    assert {"ray/tune/train_loss", "ray/tune/val_loss", "ray/tune/lr", "ray/tune/tokens_per_s"} <= set(
        ea.Tags()["scalars"]
    )
    losses = ea.Scalars("ray/tune/train_loss")
    assert len(losses) >= 2 and all(0 < e.value < 10 for e in losses)


def test_status_of_a_sweep_folder_reads_tunes_experiment(tracked_smoke):
    """A finished `sweep` folder is finished (its work ends with the runs), with or without its spec.yaml (older
    versions wrote none: then the spec name and the runs come from Tune's experiment)."""
    from loopscale.sweep.status import collect_status

    out, cells = tracked_smoke
    assert (out / "spec.yaml").is_file()
    for with_spec in (True, False):
        if not with_spec:
            (out / "spec.yaml").rename(out / "spec.yaml.kept")
        st = collect_status(out)
        assert (st["kind"], st["spec"], st["state"], st["stage"]) == ("sweep", "smoke", "finished", "done")
        assert st["runs"]["total"] == st["runs"]["ok"] == len(cells)
        assert st["tune"]["experiment"].startswith("grid_smoke_") and st["tune"]["trials"] == {"TERMINATED": 16}
    (out / "spec.yaml.kept").rename(out / "spec.yaml")


def test_tracked_metrics_keep_each_ensemble_member_apart():
    """A seed-ensemble trial reports each member's events with its seed, and each run's final report with its run
    id: both become per-seed metric keys; the trial's tokens/s counts every member and is logged once per step
    (every member reported it: two points at each step), as the rate since the trial's previous report (tokens /
    time_total_s counted the trial's start-up: 1,029 tokens/s logged for a smoke run training at 22,347); the step
    is the x axis."""
    base = preset_spec("smoke").cells()[0]
    cells = [{**base.to_dict(), "run_id": f"r{k}"} for k in range(2)]
    for k, c in enumerate(cells):
        c["run"] = {**c["run"], "seed": 10 + k}

    class Sink:
        def log_trial_result(self, iteration, trial, result):
            self.got = result

    logger = type("Tracked", (tracking._metrics_mixin(), Sink), {})()
    trial = type("Trial", (), {"trial_id": "t", "config": {"cells": cells}})()
    ev = {"step": 8, "tokens": 2048, "train_loss": 3.5, "lr": 0.01, "member": 1, "seed": 11, "members": 2}
    logger.log_trial_result(1, trial, {**ev, "time_total_s": 4.0, "training_iteration": 3})
    assert logger.got == {  # no rate at a trial's first report: its time holds the start-up
        "train_loss/seed11": 3.5,
        "lr/seed11": 0.01,
        "tokens/seed11": 2048.0,
        "timesteps_total": 8,
        "training_iteration": 3,
    }
    # the other member at the same step: its own metrics, and no second point of the trial's tokens/s
    logger.log_trial_result(1, trial, {**ev, "member": 0, "seed": 10, "train_loss": 3.6, "time_total_s": 4.0,
                                       "training_iteration": 3})  # fmt: skip
    assert "tokens_per_s" not in logger.got and logger.got["train_loss/seed10"] == 3.6
    logger.log_trial_result(1, trial, {**ev, "step": 16, "tokens": 4096, "time_total_s": 8.0,
                                       "training_iteration": 5})  # fmt: skip
    assert logger.got["tokens_per_s"] == 2 * (4096 - 2048) / (8.0 - 4.0)  # since the previous report
    logger.log_trial_result(1, trial, {**ev, "member": 0, "step": 16, "tokens": 4096, "time_total_s": 8.0,
                                       "training_iteration": 5})  # fmt: skip
    assert "tokens_per_s" not in logger.got  # the other member at that step: no second point
    logger.log_trial_result(1, trial, {**ev, "step": 24, "tokens": 6144, "time_total_s": 9.0,
                                       "training_iteration": 6})  # fmt: skip
    assert logger.got["tokens_per_s"] == 2 * 2048 / 1.0
    logger.log_trial_result(2, trial, {"run_id": "r0", "final_val_loss": 3.1, "training_iteration": 4})
    assert logger.got == {"final_val_loss/seed10": 3.1, "timesteps_total": 24, "training_iteration": 4}
    # a trial whose first report says how long it trained (attempt_s): its rate from its first step, start-up left
    # out, counting only the tokens of this attempt (resumed at 1024 tokens)
    first = type("Trial", (), {"trial_id": "v", "config": {"cells": cells}})()
    logger.log_trial_result(1, first, {**ev, "start_tokens": 1024, "attempt_s": 2.0, "time_total_s": 30.0,
                                       "training_iteration": 1})  # fmt: skip
    assert logger.got["tokens_per_s"] == 2 * (2048 - 1024) / 2.0
    single = type("Trial", (), {"trial_id": "u", "config": {"cells": cells[:1]}})()
    logger.log_trial_result(1, single, {"step": 4, "val_loss": 3.9, "training_iteration": 1})
    assert logger.got == {"val_loss": 3.9, "timesteps_total": 4, "training_iteration": 1}


def test_describe_tensorboard_says_when_nothing_was_written_and_how_to_view(tmp_path, monkeypatch):
    """`sweep --track tensorboard` on a finished folder printed 'TensorBoard logs: OUT/tensorboard (view: ...)'
    for a folder never created, and the view command needs the tensorboard package, which Ray does not install."""
    (target,) = tracking.parse_track(("tensorboard",))
    (line,) = tracking.describe((target,), tmp_path, "g")
    assert line == f"TensorBoard: no logs in {tmp_path.resolve() / 'tensorboard'}: no trial ran in this command"
    (tmp_path / "tensorboard").mkdir()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a))
    (line,) = tracking.describe((target,), tmp_path, "g")
    assert line.endswith("(view: pip install tensorboard, then tensorboard --logdir "
                         f"{tmp_path.resolve() / 'tensorboard'})")  # fmt: skip


def test_resume_says_which_track_targets_the_restored_experiment_lacks(tmp_path):
    """Tune restores an experiment with the callbacks it was started with: ``--track mlflow`` on a ``--resume`` of
    an experiment started with ``--track tensorboard`` logs nothing for it. The command says so (a warning, and the
    last lines do not point at an MLflow experiment that was never written)."""
    if not HAVE_TRACK:
        pytest.skip("the track extra is not installed (pip install -e '.[track]')")
    from ray import tune

    def trainable(config):
        pass

    started = tracking.parse_track(["tensorboard"])
    tune.Tuner(trainable, run_config=tune.RunConfig(
        name="grid_x_001", storage_path=str(tmp_path / "tune"),
        callbacks=tracking.callbacks(started, tmp_path, "grid_x_001", "loopscale-x-grid"),
    ))  # fmt: skip  (writes the experiment's tuner.pkl with its callbacks)
    restored = tune.Tuner.restore(str(tmp_path / "tune" / "grid_x_001"), trainable=trainable)
    now = tracking.parse_track(["tensorboard", f"mlflow:file:{tmp_path / 'mlruns'}"])
    assert tracking.check_restored(restored, started, "grid_x_001") is None
    note = tracking.check_restored(restored, now, "grid_x_001")
    assert "grid_x_001 goes on with the tracking it was started with (tensorboard)" in note
    assert "--track mlflow logs nothing" in note
    lines = tracking.describe(now, tmp_path, "loopscale-x-grid")
    assert lines[0].startswith("TensorBoard")
    assert lines[1].startswith("MLflow: nothing logged for the resumed experiment grid_x_001"), lines
    # said once: a later command's last lines are not affected (its store holds nothing: it says so)
    assert tracking.describe(now, tmp_path, "loopscale-x-grid")[1] == (
        f"MLflow: nothing logged at file:{tmp_path / 'mlruns'}: no trial of this command or an earlier one started "
        "in 'loopscale-x-grid'")  # fmt: skip


def test_a_resumed_experiment_tracked_to_an_mlflow_file_store_may_use_it(tmp_path, monkeypatch):
    """MLflow 3 refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true; a new experiment's callbacks set it, but
    `--resume` restores the experiment's own callbacks, so the resumed sweep failed with MLflow's traceback once its
    first trial reported. Restoring such an experiment now sets it too (and an experiment tracked elsewhere not)."""
    if not HAVE_TRACK:
        pytest.skip("the track extra is not installed (pip install -e '.[track]')")
    from ray import tune

    def trainable(config):
        pass

    def restored_with(target: str, name: str):
        started = tracking.parse_track([target])
        tune.Tuner(trainable, run_config=tune.RunConfig(
            name=name, storage_path=str(tmp_path / "tune"),
            callbacks=tracking.callbacks(started, tmp_path, name, "loopscale-x-grid"),
        ))  # fmt: skip  (writes the experiment's tuner.pkl with its callbacks)
        return tune.Tuner.restore(str(tmp_path / "tune" / name), trainable=trainable), started

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tuner, started = restored_with("tensorboard", "grid_x_001")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert tracking.check_restored(tuner, started, "grid_x_001") is None
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    tuner, started = restored_with(f"mlflow:file:{tmp_path / 'mlruns'}", "grid_x_002")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # a new process: only the restore can set it
    assert tracking.check_restored(tuner, started, "grid_x_002") is None
    assert os.environ.get("MLFLOW_ALLOW_FILE_STORE") == "true"


def test_a_resumed_trial_logs_on_into_its_mlflow_run(tmp_path):
    """A trial stopped and resumed (its driver killed, then --resume: Tune restores the trial and a fresh callback)
    started a second MLflow run of the same name, the first left RUNNING. It now logs on into its unfinished run;
    once that run finished, or from another output folder, a trial of the same name gets a run of its own. Names
    and paths with quotes, spaces and backslashes are matched (MLflow's filter has no escapes)."""
    if not HAVE_TRACK:
        pytest.skip("the track extra is not installed (pip install -e '.[track]')")
    from mlflow.tracking import MlflowClient

    class Trial:  # what the callback reads of a Tune trial
        def __init__(self, name: str, checkpoint: object | None = "ckpt"):
            self.name, self.trial_id, self.config, self.checkpoint = name, "t1", {"lr": 0.01}, checkpoint

        def __str__(self) -> str:
            return self.name

    store = f"file:{tmp_path / 'mlruns'}"
    targets = tracking.parse_track([f"mlflow:{store}"])

    def callback(out: str):  # a new driver's callback (Tune restores it with no runs)
        (cb,) = tracking.callbacks(targets, tmp_path / out, "grid_x_001", "loopscale-x-grid")
        cb.setup()
        return cb

    def started(cb, name: str, step: int, end: bool = False, checkpoint: object | None = "ckpt") -> str:
        trial = Trial(name, checkpoint)
        cb.log_trial_start(trial)
        cb.log_trial_result(1, trial, {"step": step, "train_loss": 3.0 - step / 100, "training_iteration": 1})
        if end:
            cb.log_trial_end(trial)
        return cb._trial_runs[trial]

    name, folder = "run_a'b", "o ut\\x"
    first = started(callback(folder), name, 4)  # stopped: its run stays RUNNING
    again = started(callback(folder), name, 8, end=True)
    assert again == first
    client = MlflowClient(tracking_uri=store)
    assert [m.step for m in client.get_metric_history(first, "train_loss")] == [4, 8]
    assert client.get_run(first).info.status == "FINISHED"
    assert started(callback(folder), name, 4) != first  # trained again after it finished: a run of its own
    stopped = started(callback(folder), "run_c", 4)
    assert started(callback(folder), "run_c", 0, checkpoint=None) != stopped  # from step 0 (e.g. --force): new
    # one search per callback, not one per trial (a file store reads every run at each search)
    cb = callback(folder)
    calls = []
    real = cb._unfinished_runs
    cb._unfinished_runs = lambda: calls.append(1) or real()
    for k in range(5):
        started(cb, f"run_d{k}", 4)
    assert calls == [1]
    elsewhere = started(callback("other"), name, 4)
    assert elsewhere != first and client.get_run(elsewhere).data.tags["loopscale_folder"] == str((tmp_path / "other").resolve())
    assert len(client.search_runs([client.get_experiment_by_name("loopscale-x-grid").experiment_id])) == 10


@pytest.mark.parametrize("where", ["file:{f}/mlruns", "{f}/x", "file://{f}", "file:{f}"])
def test_an_mlflow_file_store_that_cannot_be_made_is_refused_before_any_compute(tmp_path, where):
    """`--track mlflow:file:F/mlruns` with F a file trained the grid's first trials, then ended in a traceback
    (NotADirectoryError), leaving the folder's spec, logs and Tune state. It is now one error naming the file; a
    store that can be made (a new folder, or one that exists) is accepted."""
    if not HAVE_TRACK:
        pytest.skip("the track extra is not installed (pip install -e '.[track]')")
    f = tmp_path / "afile"
    f.write_text("x")
    uri = where.format(f=f)
    with pytest.raises(ValueError, match=rf"--track mlflow: the MLflow file store \S+ cannot be made: .*{f}.*nothing was run"):
        tracking.parse_track([f"mlflow:{uri}"])
    for ok in (f"file:{tmp_path / 'new' / 'mlruns'}", f"file://{tmp_path}", str(tmp_path / "x")):
        assert tracking.parse_track([f"mlflow:{ok}"]) == (tracking.Target("mlflow", ok),)


def test_an_mlflow_uri_no_store_takes_and_a_database_that_cannot_be_made_are_refused_before_any_compute(tmp_path):
    """`--track mlflow:htp://x` (a mistyped scheme) passed the check and the dry run; `run` wrote its folder and the
    grid's first trial ended in a 280-line traceback (UnsupportedModelRegistryStoreURIException). A SQLite database
    under a file passed too. Both are one error now; a SQLite database that can be made is accepted."""
    if not HAVE_TRACK:
        pytest.skip("the track extra is not installed (pip install -e '.[track]')")
    with pytest.raises(ValueError) as e:
        tracking.parse_track(["mlflow:htp://x"])
    assert str(e.value).startswith("--track mlflow: MLflow has no tracking store for 'htp://x' (it takes ")
    assert "http, https" in str(e.value) and "sqlite" in str(e.value) and str(e.value).endswith("nothing was run")
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(ValueError, match=rf"the MLflow database {f}/db.sqlite cannot be made: it would be under the "
                                         rf"file {f}; .*nothing was run"):  # fmt: skip
        tracking.parse_track([f"mlflow:sqlite:///{f}/db.sqlite"])
    ok = f"sqlite:///{tmp_path}/new/mlflow.db"
    assert tracking.parse_track([f"mlflow:{ok}"]) == (tracking.Target("mlflow", ok),)
    # the CLI: one line, exit 2, no folder
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", "smoke", "--out", str(out), "--track", "mlflow:htp://x"])
    assert res.exit_code == 2 and "MLflow has no tracking store for 'htp://x'" in res.output and not out.exists()


def test_unreachable_mlflow_server_is_refused_before_any_compute(monkeypatch):
    # MLflow's client retries a server that refuses connections for minutes before the first trial, silently
    if not HAVE_TRACK:
        pytest.skip("the track extra is not installed (pip install -e '.[track]')")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError, match=rf"MLflow server http://127.0.0.1:{port} cannot be reached.*nothing was run"):
        tracking.parse_track([f"mlflow:http://127.0.0.1:{port}"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    with pytest.raises(ValueError, match="cannot be reached"):
        tracking.parse_track(["mlflow"])
    with socket.socket() as s:  # a server that listens is accepted
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
        assert tracking.parse_track([f"mlflow:{uri}"]) == (tracking.Target("mlflow", uri),)


def test_run_names_the_mlflow_experiments_of_its_lr_studies_and_its_grid(tmp_path, monkeypatch, capfd):
    """`loopscale run` with `lr: tune` logs its LR studies into `loopscale-<spec>-tune-lr` and its grid into
    `-grid`; its last lines named only the grid's experiment."""
    if not HAVE_TRACK:
        pytest.skip("the track extra is not installed (pip install -e '.[track]')")
    import yaml
    from typer.testing import CliRunner

    from loopscale.sweep import run as run_mod
    from loopscale.sweep.cli import app

    def stopped(*a, **k):
        raise KeyboardInterrupt  # the last lines are said after a Ctrl-C too; nothing is trained

    monkeypatch.setattr(run_mod, "run_pipeline", stopped)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    spec = preset_spec("smoke").model_dump(mode="json")
    for lr, made, want in (
        ("tune", ("loopscale-t-tune-lr", "loopscale-t-grid"), "experiments 'loopscale-t-tune-lr', 'loopscale-t-grid'"),
        ({"fixed": 0.01}, ("loopscale-t-grid",), "experiment 'loopscale-t-grid'"),
        # an earlier command logged the LR studies only: the grid's experiment, never made, is not named
        ("tune", ("loopscale-t-tune-lr",), "experiment 'loopscale-t-tune-lr'"),
        # a store where nothing was logged (the command stopped before a trial started) says so
        ("tune", (), "nothing logged"),
    ):
        spec.update(name="t", lr=lr)
        path = tmp_path / f"{'tune' if lr == 'tune' else 'fixed'}{len(made)}.yaml"
        path.write_text(yaml.safe_dump(spec))
        out = tmp_path / path.stem
        for name in made:  # as an earlier command's trials left them
            MlflowClient(tracking_uri=f"file:{out / 'mlruns'}").create_experiment(name)
        track = f"mlflow:file:{out / 'mlruns'}"
        res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--track", track])
        assert res.exit_code == 130, res.output
        said = res.output + "".join(capfd.readouterr())  # the console writes to the process's own streams
        assert f"MLflow: {want} at file:{out / 'mlruns'}" in said


def test_an_empty_mlflow_store_is_said_to_hold_nothing_and_left_as_it_is(tmp_path):
    """The closing line's check opened an empty store folder with MLflow's client, which made its `.trash/` in the
    user's folder (and imported MLflow, ~1.6 s) to find no experiment there."""
    store = tmp_path / "mlruns"
    store.mkdir()
    now = tracking.parse_track([f"mlflow:file:{store}"])
    assert tracking.describe(now, tmp_path, "loopscale-x-grid") == [
        f"MLflow: nothing logged at file:{store}: no trial of this command or an earlier one started in "
        "'loopscale-x-grid'"]  # fmt: skip
    assert list(store.iterdir()) == []


def test_lr_trials_are_named_by_their_lr_and_study(tmp_path):
    """Every LR study of a command logs into one MLflow experiment, and its trials were named `lr_trainable_<id>`:
    which LR, size and r a run was could be read only from its params. Their names now say it."""
    import types

    from loopscale.sweep.lr_search import _lr_trial_name, study_plan
    from loopscale.sweep.spec import parse_spec

    trial = types.SimpleNamespace(trial_id="22c25335", config={"lr": 0.074163, "base": {"size": 16, "r": 2}})
    assert _lr_trial_name(trial) == "lr_0.07416_size16_r2_22c25335"
    assert _lr_trial_name(types.SimpleNamespace(trial_id="a1", config={})) == "lr_x_sizeNone_rNone_a1"
    spec = parse_spec({**preset_spec("smoke").model_dump(mode="json"), "lr": "tune"})
    plan = study_plan(spec, 16, 2, tmp_path, str(tmp_path / "ray"), experiment="e")
    assert plan["tune_config"].trial_name_creator is _lr_trial_name
    one = types.SimpleNamespace(trial_id="b2", config={**plan["space"].constants, "lr": 0.01})
    assert _lr_trial_name(one) == "lr_0.01_size16_r2_b2"
