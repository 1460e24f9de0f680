"""Stage 2 on the embedded local Ray: the smoke grid, no retraining, --force, retry from checkpoint, the Tuner
plan, and a SIGKILLed driver followed by --resume."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from proc_utils import descendants, end_processes, run_to_end, start_driver

from loopscale.model.accounting import flops_per_token, n_once, n_rec, n_unique
from loopscale.sweep._seams import FAULT_ENV
from loopscale.sweep.commands import run_sweep
from loopscale.sweep.grid import plan_grid
from loopscale.sweep.presets import PRESETS, preset_spec
from loopscale.sweep.spec import parse_spec
from loopscale.sweep.workspace import RunWorkspace


@pytest.fixture(scope="module")
def ray_local():
    """One embedded 2-CPU Ray for the module (run_sweep reuses it and leaves it running)."""
    from loopscale.cluster.connect import ray_session

    with ray_session(num_cpus=2, temp_dir="/tmp/lsray_sw") as info:
        yield info


@pytest.fixture(scope="module")
def smoke_out(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    t0 = time.time()
    path = run_sweep(preset_spec("smoke"), out, quiet=True)
    return out, path, time.time() - t0


def test_smoke_sweep_16_ok_rows_consistent_with_accounting(smoke_out):
    out, path, _ = smoke_out
    spec = preset_spec("smoke")
    cells = {c.run_id: c for c in spec.cells()}
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == 16 and {r["status"] for r in rows} == {"ok"}
    assert {r["run_id"] for r in rows} == set(cells)
    for row in rows:
        cfg = cells[row["run_id"]].run.model
        assert (
            row["N_once"] == n_once(cfg) and row["N_rec"] == n_rec(cfg) and row["N_unique"] == n_unique(cfg)
        )
        assert row["flops_per_token"] == flops_per_token(cfg)
        assert row["D"] == row["target_tokens"]  # multiples of the 256-token batch
        assert row["C"] == pytest.approx(flops_per_token(cfg) * row["D"], rel=1e-12)
        assert row["num_threads"] == 1  # = resources.cpus
        assert 0 < row["final_val_loss"] < 6.0 and row["trial_id"]
        assert row["ensemble_size"] == 1  # one run per trial (smoke: one seed per cell)
        assert row["compiled"] is False  # the smoke preset trains eager
        assert isinstance(json.loads(row["warnings"]), list)  # the trainer's warnings about the run ([] for none)
    curves = pq.read_table(out / "curves.parquet").to_pylist()
    assert {c["run_id"] for c in curves} == set(cells)


def test_second_run_does_not_retrain(smoke_out):
    out, path, _ = smoke_out
    before = {r["run_id"]: r["finished_at"] for r in pq.read_table(path).to_pylist()}
    run_sweep(preset_spec("smoke"), out, quiet=True)
    after = {r["run_id"]: r["finished_at"] for r in pq.read_table(path).to_pylist()}
    assert after == before  # no run was trained again (a retrained run has a new finished_at)
    assert not (out / "tune" / "grid_smoke_002").exists()  # no new experiment was started


def test_force_retrains_and_gets_the_same_loss(smoke_out):
    out, path, _ = smoke_out
    spec = preset_spec("smoke")
    cell = spec.cells()[3]
    old = {r["run_id"]: r for r in pq.read_table(path).to_pylist()}[cell.run_id]
    run_sweep(spec, out, force=True, cells=[cell], quiet=True)
    rows = {r["run_id"]: r for r in pq.read_table(path).to_pylist()}
    assert len(rows) == 16
    assert rows[cell.run_id]["finished_at"] > old["finished_at"]
    assert rows[cell.run_id]["final_val_loss"] == pytest.approx(old["final_val_loss"], abs=1e-6)


def test_trial_that_raises_once_resumes_from_checkpoint(smoke_out, tmp_path, monkeypatch):
    """A trial raising at step 8 (after its step-8 checkpoint) is retried by Tune and resumes there; the
    final loss equals the uninterrupted run's."""
    _, path, _ = smoke_out
    monkeypatch.setenv(FAULT_ENV, "6")
    d = copy.deepcopy(PRESETS["smoke"])
    d.update(sizes=[16], tokens=[4096], r=[1, 2])
    spec = parse_spec(d)
    cells = spec.cells()
    out = tmp_path / "fault"
    p = run_sweep(spec, out, quiet=True)
    rows = {r["run_id"]: r for r in pq.read_table(p).to_pylist()}
    ref = {r["run_id"]: r for r in pq.read_table(path).to_pylist()}
    assert set(rows) == {c.run_id for c in cells}
    for c in cells:
        res = RunWorkspace(str(out / "tune"), c.run_id).result()
        assert res["resumed_from_step"] == 8
        assert (out / "tune" / "faults" / c.run_id).exists()
        assert rows[c.run_id]["status"] == "ok"
        assert rows[c.run_id]["final_val_loss"] == pytest.approx(ref[c.run_id]["final_val_loss"], abs=1e-6)


def test_ensemble_trial_that_raises_once_resumes_from_its_group_checkpoint(smoke_out, tmp_path, monkeypatch):
    """Two seeds of one cell train as one ensemble trial; raising at step 8 (after the ensemble's step-8
    checkpoint) retries the trial from that checkpoint, and seed 0's final loss equals its single run's."""
    from loopscale.sweep.grid import group_id

    _, path, _ = smoke_out
    monkeypatch.setenv(FAULT_ENV, "6")
    d = copy.deepcopy(PRESETS["smoke"])
    d.update(sizes=[16], tokens=[4096], r=[2], seeds=[0, 1])
    spec = parse_spec(d)
    cells = spec.cells()
    out = tmp_path / "fault_ens"
    rows = {r["run_id"]: r for r in pq.read_table(run_sweep(spec, out, quiet=True)).to_pylist()}
    ref = {r["run_id"]: r for r in pq.read_table(path).to_pylist()}
    gid = group_id([c.run_id for c in cells])
    assert (out / "tune" / "faults" / gid).exists()  # the fault fired once, in the ensemble trial
    assert len({rows[c.run_id]["trial_id"] for c in cells}) == 1
    for c in cells:
        res = RunWorkspace(str(out / "tune"), c.run_id).result()
        assert res["resumed_from_step"] == 8 and res["ensemble"] == {"group_id": gid, "members": 2}
        assert rows[c.run_id]["status"] == "ok" and rows[c.run_id]["ensemble_size"] == 2
    seed0 = next(c for c in cells if c.seed == 0)
    assert rows[seed0.run_id]["final_val_loss"] == pytest.approx(ref[seed0.run_id]["final_val_loss"], rel=1e-4)


def test_trial_erroring_past_its_retries_leaves_a_failed_row(ray_local, tmp_path, monkeypatch):
    """A trial that errors at every attempt (max_failures = 1: two attempts) is a ``failed`` row carrying the
    error, so runs.parquet accounts for every cell; a later sweep retries the cell and replaces the row."""
    d = copy.deepcopy(PRESETS["smoke"])
    d.update(sizes=[16], tokens=[2048], r=[1, 2], max_failures=1)
    spec = parse_spec(d)
    out = tmp_path / "failing"
    monkeypatch.setenv(FAULT_ENV, "4:always")
    from loopscale.sweep.grid import NoRunFinished

    with pytest.raises(NoRunFinished, match="0 of 2 runs finished ok: RuntimeError: injected failure"):
        run_sweep(spec, out, quiet=True)  # not one run finished: an error, after the rows are consolidated
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert {r["run_id"] for r in rows} == {c.run_id for c in spec.cells()}
    assert {r["status"] for r in rows} == {"failed"}
    for r in rows:
        assert r["error"].startswith("RuntimeError: injected failure at step")
        assert r["final_val_loss"] is None and r["trial_id"] and r["ensemble_size"] is None and r["compiled"] is None
        assert r["warnings"] is None
    monkeypatch.delenv(FAULT_ENV)
    rows = pq.read_table(run_sweep(spec, out, quiet=True)).to_pylist()
    assert len(rows) == 2 and {r["status"] for r in rows} == {"ok"} and {r["error"] for r in rows} == {None}


def test_only_trials_tune_could_not_restore_are_run_again(tmp_path):
    """After a restore, an ERROR trial whose last error is Tune's lost restore checkpoint is run again (its own
    workspace holds its checkpoints); a trial that failed in its own code is not."""
    from types import SimpleNamespace

    from loopscale.sweep.grid import errored_run_ids, lost_checkpoint_run_ids

    def trial(rid, status, error):
        f = tmp_path / f"{rid}.txt"
        f.write_text(f"Failure # 1 (occurred at 2026-11-30)\n{error}\n")
        return SimpleNamespace(
            trial_id=rid, status=status, config={"cells": [{"run_id": rid}]}, error_file=str(f)
        )

    grid = SimpleNamespace(
        _experiment_analysis=SimpleNamespace(
            trials=[
                trial(
                    "a",
                    "ERROR",
                    "ValueError: Could not recover from checkpoint as it does not exist on storage",
                ),
                trial("b", "ERROR", "RuntimeError: injected failure at step 4"),
                trial("c", "TERMINATED", ""),
            ]
        )
    )
    assert errored_run_ids(grid) == ["a", "b"]
    assert lost_checkpoint_run_ids(grid) == ["a"]


def test_tuner_plan_is_inspectable_without_ray(tmp_path):
    import ray
    from ray import tune

    spec = preset_spec("smoke")
    plan = plan_grid(
        spec.cells(), spec, tmp_path, storage_path=str(tmp_path / "tune"), experiment="grid_x_001"
    )
    assert plan.resources == {"cpu": 1.0}
    assert plan.reuse_actors and plan.max_failures == 2
    assert len(plan.param_space["cells"]["grid_search"]) == 16 and len(plan.cells) == 16
    rc, tc = plan.run_config(), plan.tune_config()
    assert isinstance(rc, tune.RunConfig) and rc.storage_path == str(tmp_path / "tune")
    assert rc.failure_config.max_failures == 2 and tc.reuse_actors is True and tc.num_samples == 1
    if not ray.is_initialized():
        plan.build()
        assert not ray.is_initialized()
    with pytest.raises(ValueError, match="cells"):
        plan_grid([], spec, tmp_path, storage_path="x", experiment="e")


# --- driver stopped mid-sweep -------------------------------------------------------------------------------


def _kill_spec(tmp_path: Path) -> Path:
    d = copy.deepcopy(PRESETS["smoke"])
    d.update(name="kill", sizes=[16], tokens=[8192], r=[1, 2, 4, 8])
    d["training"].update(checkpoint_every_steps=8)
    p = tmp_path / "kill.yaml"
    import yaml

    p.write_text(yaml.safe_dump(d))
    return p


def _driver(spec: Path, out: Path, *extra: str) -> subprocess.Popen:
    return start_driver("sweep", spec, out, "--json", *extra)


@pytest.mark.slow
def test_driver_killed_mid_sweep_then_resume_gives_one_row_per_cell(tmp_path):
    """SIGKILL (no chance to save state) after the first run is recorded; --resume ends with one ok row per cell.
    SIGINT (exit 130, then --resume) through the same presenter is tested end to end on `loopscale run`
    (tests/test_run_e2e.py) and on tune-lr (tests/test_failure_kinds_sweep.py)."""
    spec_path = _kill_spec(tmp_path)
    out = tmp_path / "out"
    proc = _driver(spec_path, out)
    parts = out / "parts" / "runs"
    seen: set[int] = set()
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(list(parts.glob("*.parquet"))) < 1:
            seen |= descendants(proc.pid)
            time.sleep(0.2)
        assert len(list(parts.glob("*.parquet"))) >= 1, (
            proc.stderr.read().decode()[-3000:] if proc.poll() else ""
        )
        seen |= descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        end_processes(seen)
    assert proc.returncode == -signal.SIGKILL
    n_before = len(list(parts.glob("*.parquet")))
    assert n_before < 4
    proc2 = _driver(spec_path, out, "--resume")
    rc2, _, se = run_to_end(proc2)
    assert rc2 == 0, se.decode()[-3000:]
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    cells = {c.run_id for c in parse_spec(__import__("yaml").safe_load(spec_path.read_text())).cells()}
    assert len(rows) == 4 and {r["run_id"] for r in rows} == cells
    assert {r["status"] for r in rows} == {"ok"}


def _cli():
    from loopscale.sweep.cli import app  # the console script, with its error presenter

    return app


def test_sweep_command_json_on_a_finished_out_dir(smoke_out, tmp_path):
    """The command reports the 16 rows without training again; a bad spec exits 2 naming the key."""
    import json

    import yaml
    from typer.testing import CliRunner

    out, _, _ = smoke_out
    root = Path(__file__).resolve().parents[1]
    res = CliRunner().invoke(
        _cli(), ["sweep", str(root / "configs" / "smoke.yaml"), "--out", str(out), "--json"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 16 and summary["status"] == {"ok": 16}
    d = copy.deepcopy(PRESETS["smoke"])
    d["r"] = [1, 3]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(d))
    res = CliRunner().invoke(_cli(), ["sweep", str(bad), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "r=[3] must divide the looped depth" in res.output
    assert not (tmp_path / "o").exists()  # nothing started
    res = CliRunner().invoke(_cli(), ["tune-lr", str(bad), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "valid r: [1, 2, 4, 8]" in res.output


def test_resume_of_nothing_says_so(tmp_path, capsys):
    """--resume where no sweep ran (missing or empty folder) says that a new sweep starts (a mistyped folder used
    to start the whole grid silently); a folder with an earlier sweep gets no such line."""
    from loopscale.sweep.grid import NoRunFinished

    for out in (tmp_path / "missing", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        with pytest.raises(NoRunFinished):  # no cells: nothing trains, nothing starts Ray
            run_sweep(preset_spec("smoke"), out, cells=[], resume=True, quiet=True)
        assert f"--resume: nothing to resume in {out}" in capsys.readouterr().err
    with pytest.raises(NoRunFinished):  # the folder now holds the earlier (empty) sweep's files
        run_sweep(preset_spec("smoke"), tmp_path / "empty", cells=[], resume=True, quiet=True)
    assert "nothing to resume" not in capsys.readouterr().err


def test_sweep_json_keeps_progress_on_stderr_and_progress_file(ray_local, tmp_path, capfd):
    """`sweep --json`: stdout is the JSON summary only; the grid display's lines go to stderr as the README says,
    and progress.json is written for `loopscale status` (the display was switched off with --json)."""
    import json

    import yaml
    from typer.testing import CliRunner

    d = copy.deepcopy(PRESETS["smoke"])
    d.update(r=[1, 2], sizes=[16], tokens=[2048])
    spec_file = tmp_path / "two.yaml"
    spec_file.write_text(yaml.safe_dump(d))
    out = tmp_path / "o"
    res = CliRunner().invoke(_cli(), ["sweep", str(spec_file), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip())["status"] == {"ok": 2}
    err = capfd.readouterr().err
    assert "grid: 2 runs done, 0 failed, 0 unfinished" in err, err
    progress = json.loads((out / "logs" / "progress.json").read_text())
    assert progress["stage"] == "grid" and progress["finished"] and progress["counts"]["done"] == 2


@pytest.mark.filterwarnings("ignore:`get_checkpoint` is meant to only be called")  # no Tune session here
def test_a_corpus_content_error_fails_the_runs_once_instead_of_retrying(tmp_path, monkeypatch):
    """A corpus whose content fails every run (only whitespace, larger than the pre-flight reads) raised the same
    CorpusError max_failures + 1 times in each trial (48 tracebacks for 16 trials). The trainable now reports each
    unfinished run failed with the error, once, and saves no result (a later sweep, the corpus fixed, trains it);
    a corpus missing on this node, or an empty folder there, is still raised, for Tune to retry (another node may
    have it). No Ray: the
    trainable runs here with Tune's context and report replaced."""
    import json
    from types import SimpleNamespace

    from ray import tune

    from loopscale.model.data import CorpusError, CorpusNotFoundError
    from loopscale.sweep.grid import RESULT_KEY, grid_trainable
    from loopscale.sweep.workspace import DONE_KEY

    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "cache"))
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n" * 4000)
    d = copy.deepcopy(PRESETS["smoke"])
    d.update(sizes=[16], tokens=[2048], r=[1], corpus=str(blank))
    cell = parse_spec(d).cells()[0]
    reports: list[dict] = []
    monkeypatch.setattr(tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: "t1"))
    monkeypatch.setattr(tune, "report", lambda metrics, checkpoint=None: reports.append(metrics))
    config = {"cells": [{**cell.to_dict(), "run_id": cell.run_id}], "storage": str(tmp_path / "st")}
    grid_trainable(config)  # no exception: Tune would otherwise retry it
    (done,) = [r for r in reports if r.get(DONE_KEY)]
    assert done["status"] == "failed" and done["run_id"] == cell.run_id
    assert json.loads(done[RESULT_KEY])["error"].startswith("CorpusContentError: corpus contains no text")
    assert RunWorkspace(str(tmp_path / "st"), cell.run_id).result() is None
    blank.unlink()
    with pytest.raises(CorpusNotFoundError):
        grid_trainable(config)
    # a folder with no text files on this node (an unmounted share) may hold them on another: raised, retried
    blank.mkdir()
    with pytest.raises(CorpusError, match="holds no"):
        grid_trainable(config)


def test_a_trial_tune_could_not_restore_is_run_again_though_its_error_recorded_it_failed(tmp_path):
    """A driver SIGKILLed between Tune's snapshot and checkpoint retention leaves a trial whose restore fails
    ("Could not recover from checkpoint"); past its retries Tune's error callback records its run failed. The
    resumed sweep then left that run failed (the test of a killed driver saw {'failed', 'ok'} once in CI): the
    failed records of this command's restored trials, meant for a corpus content error, also caught it. Such a
    run is run again in the new experiment; a run that failed in its own code, or recorded failed, is not."""
    import time
    from types import SimpleNamespace

    from loopscale.sweep.commands import not_run_again
    from loopscale.sweep.store import ResultsStore, failed_record

    cells = preset_spec("smoke").cells()[:4]
    lost, own, content, other = (c.run_id for c in cells)

    def trial(rid, status, error):
        f = tmp_path / f"{rid}.txt"
        f.write_text(f"Failure # 1 (occurred at 2026-12-04)\n{error}\n")
        return SimpleNamespace(trial_id=rid, status=status, config={"cells": [{"run_id": rid}]}, error_file=str(f))

    grid = SimpleNamespace(_experiment_analysis=SimpleNamespace(trials=[
        trial(lost, "ERROR", "ValueError: Could not recover from checkpoint as it does not exist on storage anymore"),
        trial(own, "ERROR", "RuntimeError: injected failure at step 4"),
        trial(content, "TERMINATED", ""),
        trial(other, "TERMINATED", ""),
    ]))  # fmt: skip
    store = ResultsStore(tmp_path / "out")
    started = time.time() - 1
    for c, err in ((cells[0], "ValueError: Could not recover from checkpoint"), (cells[1], "RuntimeError: injected"),
                   (cells[2], "CorpusContentError: no text")):  # fmt: skip
        store.write_run(failed_record(c, err, finished_at=time.time()))
    assert not_run_again(grid, store, started) == {own, content}
