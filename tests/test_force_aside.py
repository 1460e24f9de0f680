"""``sweep --force`` moves the earlier runs' records, checkpoints and fit/report aside instead of deleting them, and
no message suggests rerunning with both --force and --resume (it would retrain the runs already redone); a sweep
writes runs.parquet before its Ray session ends; a --resume in a storage without the sweep's experiment names the
one that has it. No Ray: the grid's start is stopped as a Ctrl-C would stop it, or
the grid is replaced by one that writes its runs' records."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from loopscale.cluster.options import Interrupted, interrupt_message
from loopscale.sweep.commands import run_sweep
from loopscale.sweep.presets import preset_spec
from loopscale.sweep.status import collect_status, format_status, resume_command
from loopscale.sweep.store import ResultsStore, curve_rows, run_record
from loopscale.sweep.workspace import RunWorkspace


def _res(loss):
    return {
        "status": "ok",
        "final_val_loss": loss,
        "best_val_loss": loss,
        "D": 2048,
        "wall_s": 1.0,
        "curve": [{"step": 8, "tokens": 2048, "train_loss": loss, "val_loss": loss, "lr": 0.01}],
    }


@pytest.fixture
def finished_folder(tmp_path):
    """A smoke folder whose 16 runs finished (records, result.json and a checkpoint each, a fit and a report)."""
    cells = preset_spec("smoke").cells()
    out = tmp_path / "out"
    store = ResultsStore(out)
    losses = {}
    for i, c in enumerate(cells):
        res = _res(3.0 + 0.01 * i)
        store.write_run(run_record(c, res), curve_rows(c.run_id, res["curve"]))
        ws = RunWorkspace(str(out / "tune"), c.run_id)
        ws.save_result(res)
        (ws.dir / "ckpt_step8.pt").write_bytes(b"weights")
        losses[c.run_id] = res["final_val_loss"]
    store.consolidate()
    (out / "fit").mkdir()
    (out / "fit" / "analysis.json").write_text("{}", encoding="utf-8")
    (out / "tune_lr").mkdir()  # the LR table's figures stay in the folder: they describe no run of the grid
    (out / "tune_lr" / "loss_vs_lr_size16.png").write_bytes(b"png")
    (out / "report.md").write_text("# 16 runs\n\n![lr](tune_lr/loss_vs_lr_size16.png)\n", encoding="utf-8")
    return out, losses


def test_force_interrupted_before_training_keeps_the_earlier_records_aside(finished_folder, monkeypatch, capsys):
    out, losses = finished_folder

    def stopped(*a, **k):
        raise KeyboardInterrupt  # Ctrl-C as the grid starts: not one run redone

    monkeypatch.setattr("loopscale.cluster.connect.ray_session", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(preset_spec("smoke"), out, force=True, quiet=True)
    # the folder itself holds none of the earlier runs any more (they are to be redone) ...
    assert pq.read_table(out / "runs.parquet").num_rows == 0
    assert not (out / "fit").exists() and not (out / "report.md").exists()
    assert all(RunWorkspace(str(out / "tune"), rid).result() is None for rid in losses)
    # ... and every one of them is in the earlier_ folder, whole
    (aside,) = [p for p in out.iterdir() if p.name.startswith("earlier_")]
    rows = pq.read_table(aside / "runs.parquet").to_pylist()
    assert {r["run_id"]: r["final_val_loss"] for r in rows} == pytest.approx(losses)
    assert {r["run_id"] for r in pq.read_table(aside / "curves.parquet").to_pylist()} == set(losses)
    assert len(list((aside / "parts" / "runs").glob("*.parquet"))) == 16
    for rid, loss in losses.items():
        d = aside / "checkpoints" / rid
        assert json.loads((d / "result.json").read_text())["final_val_loss"] == loss
        assert (d / "ckpt_step8.pt").read_bytes() == b"weights"
    assert (aside / "fit" / "analysis.json").is_file()
    # the kept report still shows the LR figure, which stayed one folder up
    assert (aside / "report.md").read_text() == "# 16 runs\n\n![lr](../tune_lr/loss_vs_lr_size16.png)\n"
    assert (aside / "../tune_lr/loss_vs_lr_size16.png").resolve().is_file()
    err = capsys.readouterr().err
    assert "records of 16 finished runs" in err and str(aside) in err
    # status reads the folder's own records only: the moved-aside runs are not counted as this folder's
    st = collect_status(out)
    assert st["runs"]["total"] == 16 and st["runs"]["ok"] == 0
    # ... and it names the folder kept aside, with its runs and size, so it is not forgotten on disk
    (kept,) = st["set_aside"]
    assert kept["path"] == aside.name and kept["runs"] == 16
    assert kept["bytes"] == sum(f.stat().st_size for f in aside.rglob("*") if f.is_file()) > 16 * len(b"weights")
    (line,) = [ln for ln in format_status(st) if ln.startswith("set aside")]
    assert f"{aside.name}/ (16 runs, " in line and "delete them when no longer needed" in line


def test_force_with_nothing_earlier_moves_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "fresh"

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("loopscale.cluster.connect.ray_session", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(preset_spec("smoke"), out, force=True, quiet=True)
    assert not [p for p in out.iterdir() if p.name.startswith("earlier_")]
    assert "--force:" not in capsys.readouterr().err


def test_no_suggested_rerun_keeps_force_with_resume(tmp_path):
    line = f"loopscale sweep smoke --out {tmp_path} --force"
    assert resume_command(line, tmp_path) == f"loopscale sweep smoke --out {tmp_path} --resume"
    msg = interrupt_message(Interrupted("the sweep was interrupted"), True, {"force": True, "resume": False})
    assert "without --force" in msg and "--resume" in msg
    msg = interrupt_message(KeyboardInterrupt(), True, {"force": True})
    assert "without --force" in msg
    assert "--force" not in interrupt_message(Interrupted("x"), True, {"force": False})


def test_status_names_an_earlier_fit_a_refit_moved_aside(finished_folder):
    """A refit into the folder's fit/ moves the earlier fit's files into fit/earlier_fit_<time>/: status lists it
    (no runs table there), and lists nothing in a folder without such folders."""
    out, _ = finished_folder
    assert collect_status(out)["set_aside"] == []
    assert not [ln for ln in format_status(collect_status(out)) if ln.startswith("set aside")]
    old = out / "fit" / "earlier_fit_20261201T000000"
    old.mkdir()
    (old / "bootstrap.parquet").write_bytes(b"x" * 1500)
    st = collect_status(out)
    assert st["set_aside"] == [{"path": "fit/earlier_fit_20261201T000000", "bytes": 1500, "runs": None, "file": False}]
    assert "fit/earlier_fit_20261201T000000/ (1.5 kB)" in format_status(st)[-1]
    # a folder of the user's own named earlier_* is not one a command set aside: not listed
    (out / "earlier_x").mkdir()
    (out / "fit" / "earlier_fit_mine").mkdir()
    assert [a["path"] for a in collect_status(out)["set_aside"]] == ["fit/earlier_fit_20261201T000000"]
    # files a command moved aside as unreadable (a torn runs.parquet, analysis.json) are listed too
    (out / "runs.parquet.unreadable-0a1b2c3d").write_bytes(b"y" * 200)
    (out / "fit" / "analysis.json.unreadable-0a1b2c3d").write_bytes(b"{")
    st = collect_status(out)
    assert [a["path"] for a in st["set_aside"]] == ["fit/earlier_fit_20261201T000000",
                                                    "fit/analysis.json.unreadable-0a1b2c3d",
                                                    "runs.parquet.unreadable-0a1b2c3d"]  # fmt: skip
    # deeper ones too (a torn runs part); one inside a folder set aside is counted in that folder's line only
    (out / "parts" / "runs").mkdir(parents=True, exist_ok=True)
    (out / "parts" / "runs" / "r1.parquet.unreadable-0a1b2c3d").write_bytes(b"z")
    (old / "runs.parquet.unreadable-0a1b2c3d").write_bytes(b"z")
    paths = [a["path"] for a in collect_status(out)["set_aside"]]
    assert "parts/runs/r1.parquet.unreadable-0a1b2c3d" in paths
    assert not any(p.startswith("fit/earlier_fit_20261201T000000/") for p in paths)
    assert "runs.parquet.unreadable-0a1b2c3d (unreadable) (200 B)" in format_status(st)[-1]


def test_runs_parquet_is_written_before_ray_shuts_down(tmp_path, monkeypatch):
    """A cluster's head lost as the grid ended: Ray's core ends the driver inside ray.shutdown() ("the local Raylet
    is dead"), and runs.parquet, written after the Ray session closed, was never written (every run in parts/ only).
    The grid's records are now consolidated inside the session. No Ray: the grid writes its runs' records as trials
    would, and the session's end checks runs.parquet."""
    import contextlib
    from types import SimpleNamespace

    from loopscale.sweep import grid

    spec = preset_spec("smoke")
    out = tmp_path / "out"
    at_shutdown: dict = {}

    @contextlib.contextmanager
    def session(*a, **k):
        from loopscale.cluster.connect import RayInfo

        yield RayInfo(address="127.0.0.1:6379", started_by_us=True, cpus=2.0, gpus=0.0, nodes=1)
        store = ResultsStore(out)  # what a driver ended inside ray.shutdown() leaves
        at_shutdown["runs"] = pq.read_table(out / "runs.parquet").num_rows if store.is_consolidated() else None

    def fake_fit(tuner):
        store = ResultsStore(out)
        for c in spec.cells():
            res = _res(3.0)
            store.write_run(run_record(c, res), curve_rows(c.run_id, res["curve"]))
        return SimpleNamespace(stopped_by_signal=False)

    monkeypatch.setattr("loopscale.cluster.connect.ray_session", session)
    monkeypatch.setattr("loopscale.cluster.connect.no_node_fits", lambda *a: None)
    monkeypatch.setattr(grid, "plan_grid", lambda *a, **k: SimpleNamespace(build=lambda: None, experiment="grid_x"))
    monkeypatch.setattr(grid, "fit_tuner", fake_fit)
    monkeypatch.setattr(grid, "result_grid_errors", lambda g: [])
    monkeypatch.setattr(grid, "unfinished_trials", lambda path: False)
    run_sweep(spec, out, quiet=True)
    assert at_shutdown == {"runs": 16}


def test_resume_with_another_storage_names_the_one_holding_the_experiment(tmp_path, monkeypatch):
    """A sweep stopped with its Tune state in a relative --storage; `--resume` given from another directory (or
    with another --storage) found no experiment in the new place and started the unfinished runs over in a new one,
    without a word (their checkpoints stayed in the first storage). It is now refused before Ray starts, naming the
    storage that holds the experiment."""
    spec = preset_spec("smoke")
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    first = tmp_path / "cwd" / "st_rel"
    (first / "grid_smoke_001").mkdir(parents=True)
    earlier = {"kind": "sweep", "command": f"loopscale sweep smoke --out {out} --storage st_rel",
               "cwd": str(tmp_path / "cwd"), "started_at": 1.0, "ran_s": 60.0}  # fmt: skip
    (out / "logs" / "command.json").write_text(json.dumps({"kind": "sweep", "earlier_commands": [earlier]}))

    def no_ray(*a, **k):
        raise AssertionError("Ray started")

    monkeypatch.setattr("loopscale.cluster.connect.ray_session", no_ray)
    other = spec.model_copy(update={"storage_path": str(tmp_path / "st_rel")})
    with pytest.raises(ValueError, match=f"holds no Tune experiment of this sweep, but {first}, where an earlier "
                                         f"command of {out} kept it, does \\(grid_smoke_001\\)"):  # fmt: skip
        run_sweep(other, out, resume=True, quiet=True)
    # the same storage: nothing to refuse (Ray is reached)
    with pytest.raises(AssertionError, match="Ray started"):
        run_sweep(spec.model_copy(update={"storage_path": str(first)}), out, resume=True, quiet=True)
    # the stopped command is the folder's newest record itself: refused before anything is written, so that its
    # record (and the line `status` gives to continue it) stays that command's
    record = {**earlier, "pid": -1, "host": "elsewhere", "recorded_at": 1.0}
    (out / "logs" / "command.json").write_text(json.dumps(record))
    (out / "spec.yaml").unlink(missing_ok=True)
    before = _tree(out)
    with pytest.raises(ValueError, match=f"but {first}, where an earlier command"):
        run_sweep(other, out, resume=True, quiet=True)
    assert _tree(out) == before
    # `run --dry-run --resume` says it as `run --resume` would, writing nothing
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    res = CliRunner().invoke(app, ["run", "--preset", "smoke", "--out", str(out), "--storage", str(tmp_path / "st_rel"),
                                   "--resume", "--dry-run", "--json"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert f"but {first}, where an earlier command" in json.loads(res.stdout.splitlines()[0])["refused"]
    assert _tree(out) == before
    # a remote earlier storage is not probed (no credentials here would hang or fail a legitimate --resume)
    record["command"] = f"loopscale sweep smoke --out {out} --storage gs://bucket/x"
    (out / "logs" / "command.json").write_text(json.dumps(record))
    with pytest.raises(AssertionError, match="Ray started"):
        run_sweep(other, out, resume=True, quiet=True)


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_runs_recorded_failed_by_this_command_are_not_trained_again_in_it(tmp_path):
    """`sweep --resume`: the restored trials that recorded their runs failed (a corpus content error, reported, not
    raised) end TERMINATED, not ERROR, and their runs stayed pending: a new experiment trained them again in the same
    command. failed_since names them (records failed at or after the command's start); a failed row of an earlier
    command is not among them (a later sweep retries it)."""
    import time as _time

    from loopscale.sweep.commands import failed_since
    from loopscale.sweep.store import failed_record

    cells = preset_spec("smoke").cells()
    store = ResultsStore(tmp_path)
    store.write_run(failed_record(cells[0], "RuntimeError: earlier command", finished_at=_time.time() - 600))
    started = _time.time()
    store.write_run(failed_record(cells[1], "CorpusContentError: corpus contains no text"))
    store.write_run(run_record(cells[2], _res(3.0)))
    assert failed_since(store, started) == {cells[1].run_id}
