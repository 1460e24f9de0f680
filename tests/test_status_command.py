"""`loopscale status` and the command record (``OUT/logs/command.json``): a command is running from its start, its
time counts from that start, run counts agree with the live display, and tune-lr / foreign folders are named."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopscale.sweep import console
from loopscale.sweep.presets import preset_spec
from loopscale.sweep.spec import spec_to_yaml
from loopscale.sweep.status import (
    COMMAND_NAME,
    STALE_S,
    NotAnOutput,
    collect_status,
    format_status,
    mark_started,
)
from loopscale.sweep.store import ResultsStore, run_record

STATUS = [sys.executable, "-m", "loopscale.sweep.cli", "status"]


@pytest.fixture
def started(tmp_path):
    """A smoke run folder as `loopscale run` leaves it before Ray starts: spec.yaml, no records, no progress."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(preset_spec("smoke")))
    return out


def _record(out, age_s: float, **fields) -> dict:
    """Write OUT/logs/command.json of this process, started ``age_s`` ago."""
    (out / "logs").mkdir(exist_ok=True)
    now = time.time()
    doc = {"kind": "run", "command": "loopscale run --preset smoke", "pid": os.getpid(),
           "host": socket.gethostname(), "proc_start": None, "started_at": now - age_s, "recorded_at": now - age_s,
           "stage_wall_s_at_start": {}, **fields}  # fmt: skip
    (out / "logs" / COMMAND_NAME).write_text(json.dumps(doc))
    return doc


@pytest.fixture
def busy(tmp_path):
    """A folder whose command record names a live process (``loopscale run smoke --out busy``): ``(out, live, rec)``;
    the process is ended after the test (a test may end it sooner)."""
    out = tmp_path / "busy"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield out, live, _record(out, 30, pid=live.pid, command="loopscale run smoke --out busy")
    finally:
        live.kill()
        live.wait()


def _progress(out, age_s: float, **fields) -> dict:
    (out / "logs").mkdir(exist_ok=True)
    now = time.time()
    doc = {"finished": False, "started_at": now - age_s, "updated_at": now, "pid": os.getpid(),
           "host": socket.gethostname(), **fields}  # fmt: skip
    (out / "logs" / "progress.json").write_text(json.dumps(doc))
    return doc


def test_a_command_is_running_from_its_start_before_any_progress_file(started):
    """The reported bug: 100 s into `loopscale run`, before its first progress display, status said `stopped`."""
    _record(started, 100)
    st = collect_status(started)
    assert (st["kind"], st["state"], st["stage"]) == ("run", "running", "sweep")
    assert st["command"]["pid"] == os.getpid() and st["progress"] is None
    assert 99 <= st["time"]["command_s"] < 130 and st["time"]["total_s"] == pytest.approx(
        st["time"]["command_s"]
    )
    text = "\n".join(format_status(st))
    assert "running, stage sweep" in text and "since the command started" in text
    assert f"pid {os.getpid()}" in text


def test_time_counts_from_the_command_start_not_the_progress_display(started):
    """130 s into the command, the grid display started 15 s ago: time 130 s, the stage's 15 s labelled as such."""
    _record(started, 130, stage_wall_s_at_start={"tune-lr": 60.0})
    _progress(
        started, 15, stage="grid", counts={"done": 0, "running": 2, "pending": 14, "failed": 0}, eta_s=50.0
    )
    tm = collect_status(started)["time"]
    assert 129 <= tm["command_s"] < 160 and 14 <= tm["running_stage_s"] < 45
    assert tm["total_s"] == pytest.approx(60.0 + tm["command_s"])  # earlier commands' stages + this command
    line = next(ln for ln in format_status(collect_status(started)) if ln.startswith("time:"))
    assert line.startswith("time: 2m") and "3m1" in line and "with earlier commands;" in line
    assert (
        "current stage sweep: " in line and "since its progress display started" in line and "ETA 50s" in line
    )


def test_running_runs_come_from_the_live_display_and_agree_with_its_counts(started):
    """The human runs line and --json's progress counts say the same (both count runs, not Tune trials)."""
    cells = preset_spec("smoke").cells()
    ResultsStore(started).write_run(run_record(cells[0], {"status": "ok"}))
    _record(started, 200)
    _progress(
        started, 60, stage="grid", counts={"done": 1, "running": 4, "pending": 11, "failed": 0},
        trials={"RUNNING": 2, "PENDING": 5, "TERMINATED": 1}, counts_of="runs",
    )  # fmt: skip
    st = collect_status(started)
    assert st["runs"] == {"total": 16, "ok": 1, "diverged": 0, "did_not_learn": 0, "failed": 0, "running": 4,
                          "unrecorded": 0, "pending": 11}
    assert st["runs"]["running"] == st["progress"]["counts"]["running"]
    assert "training runs" in st["counts"]["runs"] and "trials" in st["counts"]["tune.trials"]
    # every count --json gives under tune is explained (runs_per_trial is a [fewest, most] pair, not a histogram)
    assert "[fewest, most]" in st["counts"]["tune.runs_per_trial"] and "tune.runs" in st["counts"]
    text = format_status(st)
    assert any("1 ok, 0 diverged, 0 failed, 4 running, 11 pending" in ln for ln in text)
    assert any(ln.startswith("tune trials (") and "live): 8" in ln and "running 2" in ln for ln in text)


def test_a_dead_command_or_another_process_with_its_pid_is_not_running(started):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _record(started, 30, pid=dead.pid)
    assert collect_status(started)["state"] == "stopped"
    # this pid, but a process that started at another time: the command's pid was reused
    _record(started, 30, proc_start=1)
    assert collect_status(started)["state"] == "stopped"
    # a dead command's stale progress file does not make it running either
    _record(started, 30, pid=dead.pid)
    _progress(started, 20, stage="grid", pid=dead.pid)
    st = collect_status(started)
    assert st["state"] == "stopped" and st["progress"] is None and "command_s" not in st["time"]


def test_a_record_of_another_host_is_judged_by_its_age(started):
    _record(started, 30, host="elsewhere", pid=1)
    assert collect_status(started)["state"] == "running"
    _record(started, STALE_S + 60, host="elsewhere", pid=1)
    assert collect_status(started)["state"] == "stopped"
    # its progress file, fresh: running again; closed (finished): not
    _progress(started, 10, stage="grid", host="elsewhere", pid=1)
    assert collect_status(started)["state"] == "running"
    _progress(started, 10, stage="grid", host="elsewhere", pid=1, finished=True)
    assert collect_status(started)["state"] == "stopped"


def test_a_previous_commands_progress_file_is_not_the_running_commands(started):
    """A new command in an old folder: the last command's progress file (another pid) is not shown as its own."""
    _progress(started, 900, stage="bootstrap", pid=1, finished=True, done=20, total=200)
    _record(started, 5)
    st = collect_status(started)
    assert (st["state"], st["stage"], st["progress"]) == ("running", "sweep", None)


def test_mark_started_writes_only_in_a_commands_session_and_keeps_the_first_start(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    mark_started(out, "sweep")  # library use (no console session): the caller's process outlives the call
    assert not (out / "logs").exists()
    with console.session(out):
        mark_started(out, "run")
        first = json.loads((out / "logs" / COMMAND_NAME).read_text())
        mark_started(out, "sweep")  # `run` calling its sweep stage: still the same command
        again = json.loads((out / "logs" / COMMAND_NAME).read_text())
    assert first == again and first["kind"] == "run" and first["pid"] == os.getpid()
    assert (
        first["host"] == socket.gethostname() and first["started_at"] <= first["recorded_at"] <= time.time()
    )


def test_status_of_a_command_started_in_another_process(tmp_path):
    """The CLI end to end: a process that opened its session and marked its start is `running` until it exits."""
    out = tmp_path / "o"
    out.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", (
            "import time\nfrom loopscale.sweep import console\nfrom loopscale.sweep.status import mark_started\n"
            f"with console.session({str(out)!r}):\n    mark_started({str(out)!r}, 'sweep')\n    time.sleep(120)\n"
        )],
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while not (out / "logs" / COMMAND_NAME).exists() and child.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert (out / "logs" / COMMAND_NAME).exists()
        p = subprocess.run(STATUS + [str(out), "--json"], capture_output=True, text=True, timeout=120)
        st = json.loads(p.stdout)
        assert (st["kind"], st["state"], st["stage"]) == ("sweep", "running", "sweep")
        assert st["command"]["pid"] == child.pid
    finally:
        child.kill()
        child.wait()
    st = json.loads(subprocess.run(STATUS + [str(out), "--json"], capture_output=True, text=True).stdout)
    assert st["state"] == "empty" and st["command"] is None


def _lr_folder(out, table: bool) -> None:
    from loopscale.sweep.lr_table import _lr_table_schema
    from loopscale.sweep.store import to_table, write_table_atomic

    (out / "tune_lr" / "done").mkdir(parents=True)
    (out / "tune_lr" / "done" / "size16_r1.json").write_text("{}")
    if table:
        row = dict(size=16, r=1, tuned_r=1, N_unique=1000, N_usage=1000, lr_best=0.02, best_val_loss=3.25,
                   lr_smoothed=0.02, lr=0.020000000000000004, n_trials=8, n_pruned=3, budget_tokens=1000, study_name="s",
                   storage="sqlite:///x")  # fmt: skip
        write_table_atomic(to_table([row], _lr_table_schema()), out / "lr_table.parquet")


def test_a_finished_tune_lr_folder_is_named_so_without_a_runs_line(tmp_path):
    _lr_folder(tmp_path, table=True)
    st = collect_status(tmp_path)
    assert (st["kind"], st["state"], st["stage"]) == ("tune-lr", "finished", "done")
    text = format_status(st)
    assert text[0].endswith("(tune-lr output) — finished, stage done")
    assert not any(ln.startswith("runs:") for ln in text)
    assert "LR studies: 1 done" in text and any("size 16 r 1: lr 0.02 (val 3.2500" in ln for ln in text)


@pytest.mark.parametrize("lr", ["tune", "fixed"])
def test_a_tune_lr_folder_with_a_spec_says_tune_lr_trains_none_of_its_runs(tmp_path, lr):
    """A finished tune-lr folder with its spec.yaml printed "runs: 16 planned — 0 ok, ..., 16 pending", as if
    tune-lr had left 16 runs undone; it trains none of the grid. The JSON keeps its counts."""
    from loopscale.sweep.lr_search import study_keys
    from loopscale.sweep.lr_table import _lr_table_schema
    from loopscale.sweep.spec import record_folder_spec
    from loopscale.sweep.store import to_table, write_table_atomic

    spec = preset_spec("smoke").model_copy(update={"lr": "tune" if lr == "tune" else {"fixed": 0.01}})
    record_folder_spec(tmp_path, spec)
    _lr_folder(tmp_path, table=False)
    rows = [dict(size=s, r=r, tuned_r=r, N_unique=1000, N_usage=1000, lr_best=0.02, best_val_loss=3.25, lr_smoothed=0.02,
                 lr=0.02, n_trials=8, n_pruned=3, budget_tokens=1000, study_name="s", storage="sqlite:///x")
            for s, r in study_keys(spec.model_copy(update={"lr": "tune"}))]  # fmt: skip
    write_table_atomic(to_table(rows, _lr_table_schema()), tmp_path / "lr_table.parquet")  # one LR per (size, r)
    st = collect_status(tmp_path)
    n = len(spec.cells(lr_table={(s, None): 1.0 for s in spec.all_sizes()}))
    assert (st["kind"], st["state"]) == ("tune-lr", "finished") and n == 16
    assert st["runs"] == {"total": n, "ok": 0, "diverged": 0, "did_not_learn": 0, "failed": 0, "running": 0,
                          "unrecorded": 0, "pending": n}
    text = format_status(st)
    [line] = [ln for ln in text if ln.startswith("runs:")]
    how = ("with the LRs of its lr_table.parquet" if lr == "tune" else
           "at the spec's fixed LR: lr_table.parquet is not read")  # fmt: skip
    assert line == (f"runs: the spec's grid plans {n} runs; tune-lr trains none of them (`loopscale sweep` or "
                    f"`loopscale run` of the same spec with --out this folder trains them, {how})")
    assert not any("pending" in ln for ln in text), text
    if lr == "tune":  # stopped before its table: the LRs it will write
        (tmp_path / "lr_table.parquet").unlink()
        line = next(ln for ln in format_status(collect_status(tmp_path)) if ln.startswith("runs:"))
        assert line.endswith("with the LRs of the lr_table.parquet tune-lr writes here when its studies end)")


def test_lr_studies_done_agree_with_the_lr_table(tmp_path):
    """A finished run folder kept without tune_lr/done/ (docs/example_cpu_previous_default) said "LR studies: 0 of
    3 done" above its LR table of all 3 sizes: status counted only the done markers. A study whose results the LR
    table holds (tune-lr writes it when every study has finished) counts as done, also in a table written before
    its tuned_r column, whose study_name names the study."""
    import shutil

    from loopscale.sweep.lr_table import _lr_table_schema
    from loopscale.sweep.store import to_table, write_table_atomic

    example = Path(__file__).resolve().parents[1] / "docs" / "example_cpu_previous_default"
    st = collect_status(example)
    assert st["lr"]["studies"] == {"done": 3, "total": 3} and len(st["lr"]["table"]) == 12
    assert "LR studies: 3 of 3 done" in format_status(st)
    folder = tmp_path / "copy"  # the same without a spec: the studies done, out of a total it does not know
    folder.mkdir()
    shutil.copy(example / "lr_table.parquet", folder / "lr_table.parquet")
    assert collect_status(folder)["lr"]["studies"] == {"done": 3, "total": None}
    spec = preset_spec("smoke").model_copy(update={"lr": "tune"})  # tune_per_r: one study per size and r
    (tmp_path / "spec.yaml").write_text(spec_to_yaml(spec))
    rows = [dict(size=s, r=r, tuned_r=r, N_unique=1000, N_usage=1000, lr_best=0.02, best_val_loss=3.25, lr_smoothed=0.02,
                 lr=0.02, n_trials=8, n_pruned=3, budget_tokens=1000, study_name=f"smoke_size{s}_r{r}",
                 storage="sqlite:///x") for s in (16, 32) for r in (1, 2, 4, 8)]  # fmt: skip
    write_table_atomic(to_table(rows, _lr_table_schema()), tmp_path / "lr_table.parquet")
    (tmp_path / "tune_lr" / "done").mkdir(parents=True)
    (tmp_path / "tune_lr" / "done" / "size16_r1.json").write_text("{}")
    assert collect_status(tmp_path)["lr"]["studies"] == {"done": 8, "total": 8}
    write_table_atomic(to_table(rows[:4], _lr_table_schema()), tmp_path / "lr_table.parquet")  # size 16 only
    assert collect_status(tmp_path)["lr"]["studies"] == {"done": 4, "total": 8}


def test_an_lr_table_row_without_an_lr_does_not_stop_status(tmp_path):
    """The LR table's lr column may be null (a study with no complete trial: tune-lr prints '-' for it); status
    printed it rounded and died with "unsupported format string passed to NoneType.__format__"."""
    from loopscale.sweep.lr_table import _lr_table_schema
    from loopscale.sweep.store import to_table, write_table_atomic

    _lr_folder(tmp_path, table=False)
    row = dict(size=16, r=1, tuned_r=1, N_unique=1000, N_usage=1000, lr_best=None, best_val_loss=None,
               lr_smoothed=None, lr=None, n_trials=8, n_pruned=8, budget_tokens=1000, study_name="s",
               storage="sqlite:///x")  # fmt: skip
    write_table_atomic(to_table([row], _lr_table_schema()), tmp_path / "lr_table.parquet")
    text = format_status(collect_status(tmp_path))
    assert any("size 16 r 1: lr - (val ?, 8 trials, 8 pruned)" in ln for ln in text), text


def test_an_lr_shared_across_r_names_the_study_it_came_from(tmp_path):
    """With ``tune_per_r: false`` one study per size sets the LR of every r; status listed each r with the study's
    trials as if each r had its own (18 trials shown for 6 run). Each row of another r names the study's r."""
    from loopscale.sweep.lr_table import _lr_table_schema
    from loopscale.sweep.store import to_table, write_table_atomic

    _lr_folder(tmp_path, table=False)
    rows = [dict(size=16, r=r, tuned_r=4, N_unique=1000, N_usage=1000, lr_best=0.04, best_val_loss=3.1423,
                 lr_smoothed=0.04, lr=0.04, n_trials=3, n_pruned=1, budget_tokens=1536, study_name="C_size16_r4",
                 storage="sqlite:///x") for r in (1, 2, 4)]  # fmt: skip
    write_table_atomic(to_table(rows, _lr_table_schema()), tmp_path / "lr_table.parquet")
    text = [ln.strip() for ln in format_status(collect_status(tmp_path))]
    assert "size 16 r 1: lr 0.04 (the r 4 study's: val 3.1423, 3 trials, 1 pruned)" in text, text
    assert "size 16 r 2: lr 0.04 (the r 4 study's: val 3.1423, 3 trials, 1 pruned)" in text, text
    assert "size 16 r 4: lr 0.04 (val 3.1423, 3 trials, 1 pruned)" in text, text
    for row in rows:  # a table written before tuned_r was recorded: the study's name says its r
        row["tuned_r"] = None
    write_table_atomic(to_table(rows, _lr_table_schema()), tmp_path / "lr_table.parquet")
    text = [ln.strip() for ln in format_status(collect_status(tmp_path))]
    assert "size 16 r 1: lr 0.04 (the r 4 study's: val 3.1423, 3 trials, 1 pruned)" in text, text


def test_a_stopped_and_a_running_tune_lr_folder(tmp_path):
    _lr_folder(tmp_path, table=False)
    st = collect_status(tmp_path)
    assert (st["kind"], st["state"], st["stage"]) == ("tune-lr", "stopped", "tune-lr")
    _record(tmp_path, 40, kind="tune-lr")
    _progress(tmp_path, 30, stage="tune-lr", total=16, trials={"COMPLETE": 3, "PRUNED": 2, "FAIL": 0},
              best=[[16, 1, 0.02, 3.25]])  # fmt: skip
    st = collect_status(tmp_path)
    assert (st["kind"], st["state"], st["stage"]) == ("tune-lr", "running", "tune-lr")
    assert (
        "LR trials: 5 of 16 (2 pruned, 0 failed); best so far size 16 r 1: lr 0.02 (3.250)"
        in format_status(st)
    )


def test_the_lr_display_writes_what_status_shows(tmp_path):
    """LRView's progress file holds its trials by state and the best LR so far (status's "LR trials" line)."""
    con = console.Console(open(os.devnull, "w"), interactive=False)
    con.out_dir = tmp_path
    view = console.LRView(con, {"s16": (16, 1)}, 8)
    view.record("s16", 0.02, "COMPLETE", 3.25)
    view.record("s16", 0.5, "PRUNED", None)
    view.heartbeat()
    p = json.loads((tmp_path / "logs" / "progress.json").read_text())
    assert p["trials"] == {"COMPLETE": 1, "PRUNED": 1, "FAIL": 0} and p["best"] == [[16, 1, 0.02, 3.25]]


def test_the_lr_display_writes_each_finished_trial_at_once(tmp_path, monkeypatch):
    """A trial that ends within HEARTBEAT_S of the last write is in progress.json at once: nothing writes the file
    between trials, so a write left to the heartbeat showed the counts, best LR and ETA of a trial ago."""
    clock = [1000.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    con = console.Console(open(os.devnull, "w"), interactive=False)
    con.out_dir = tmp_path
    view = console.LRView(con, {"s16": (16, 1)}, 4)
    clock[0] += 10.0
    view.record("s16", 0.02, "COMPLETE", 3.25)
    clock[0] += 1.0  # under HEARTBEAT_S after that write
    view.record("s16", 0.01, "COMPLETE", 3.5)
    clock[0] += 1.0
    view.record("s16", 0.5, "PRUNED", None)
    p = json.loads((tmp_path / "logs" / "progress.json").read_text())
    assert p["trials"] == {"COMPLETE": 2, "PRUNED": 1, "FAIL": 0} and p["best"] == [[16, 1, 0.02, 3.25]]
    assert (p["total"], p["eta_s"], p["updated_at"], p["finished"]) == (4, 4.0, 1012.0, False)  # 3 of 4 in 12 s


def test_a_folder_that_is_not_a_loopscale_output_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(NotAnOutput, match="not a loopscale output folder"):
        collect_status(tmp_path)
    p = subprocess.run(STATUS + [str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "not a loopscale output folder" in p.stderr, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["notes.txt"]  # nothing was created there
    # a folder that does not exist is said so (it read "is not a directory"); a `loopscale fit --out` folder is
    # named as one, with where its numbers are (as `report` names it)
    with pytest.raises(FileNotFoundError, match=r"nope does not exist: give the --out folder of a run or sweep"):
        collect_status(tmp_path / "nope")
    # a folder inside a run folder (its fit/ or fit/<variant>/, which hold fit.json): the run folder is named
    run = tmp_path / "run"
    (run / "fit" / "baseline").mkdir(parents=True)
    (run / "spec.yaml").write_text(spec_to_yaml(preset_spec("smoke")))
    (run / "fit" / "baseline" / "fit.json").write_text("{}")
    for inner in (run / "fit", run / "fit" / "baseline"):
        with pytest.raises(NotAnOutput, match=rf"is inside the loopscale output folder {run} \(its "
                                              rf"{inner.relative_to(run)}/\): give that folder"):  # fmt: skip
            collect_status(inner)
    (tmp_path / "fit.json").write_text("{}")
    with pytest.raises(NotAnOutput, match=r"holds a `loopscale fit` output \(fit.json\), not the folder of a run or "
                                          r"sweep: .*this fit's numbers are in .*fit.json"):  # fmt: skip
        collect_status(tmp_path)


def _dead_pid() -> int:
    """The pid of a process that has exited (a command stopped, e.g. by Ctrl-C)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_stopped_command_says_how_long_it_ran_before_it_stopped(started):
    """Ctrl-C 12m03s into the grid: the time line says how long the command ran (its start to its last progress),
    --json has the same numbers; the finished stages of earlier commands count in the total."""
    import datetime

    pid = _dead_pid()
    t0 = _record(started, 3600, pid=pid, stage_wall_s_at_start={"tune-lr": 60.0})["started_at"]
    _progress(
        started, 3000, stage="grid", pid=pid, finished=True, updated_at=t0 + 723.0,
        counts={"done": 3, "running": 0, "pending": 13, "failed": 0},
    )  # fmt: skip
    (started / "run_meta.json").write_text(
        json.dumps({"spec_name": "smoke", "stage_wall_s": {"tune-lr": 60.0}})
    )
    st = collect_status(started)
    assert (st["state"], st["stage"], st["command"], st["progress"]) == ("stopped", "sweep", None, None)
    tm = st["time"]
    assert "command_s" not in tm and tm["ran_s"] == pytest.approx(723.0)
    assert tm["started_at"] == pytest.approx(t0) and tm["last_progress_at"] == pytest.approx(t0 + 723.0)
    assert tm["stopped_at"] == pytest.approx(t0 + 723.0) and tm["total_s"] == pytest.approx(60.0 + 723.0)
    text = format_status(st)
    line = next(ln for ln in text if ln.startswith("time:"))
    since = datetime.datetime.fromtimestamp(t0).strftime("%Y-%m-%d %H:%M:%S")
    last = datetime.datetime.fromtimestamp(t0 + 723.0)
    last = last.strftime(
        "%H:%M:%S" if last.date() == datetime.datetime.fromtimestamp(t0).date() else "%Y-%m-%d %H:%M:%S"
    )
    assert line == (
        f"time: 12m03s before it stopped (started {since}; last progress {last}), "
        "13m03s with earlier commands"
    )
    assert "  stage wall times recorded: tune-lr 1m00s" in text
    # stopped before any progress display, after a stage it finished (run_meta.json): that stage's time
    (started / "logs" / "progress.json").unlink()
    _record(started, 3600, pid=pid)
    (started / "run_meta.json").write_text(
        json.dumps({"spec_name": "smoke", "stage_wall_s": {"tune-lr": 300.0}})
    )
    st = collect_status(started)
    assert st["time"]["ran_s"] == pytest.approx(300.0) and st["time"]["last_progress_at"] is None
    line = next(ln for ln in format_status(st) if ln.startswith("time:"))
    assert line.startswith("time: 5m00s before it stopped (started ") and "last progress" not in line


def test_time_of_interrupted_commands_adds_up(started):
    """Two commands interrupted in the grid (12m03s, then 5m00s) and a third running for 100 s: the total counts all
    three (an interrupted stage records no wall time; the new command's record carries the earlier time)."""
    pid = _dead_pid()
    t0 = _record(started, 3600, pid=pid)["started_at"]
    _progress(started, 3600, stage="grid", pid=pid, finished=True, updated_at=t0 + 723.0)
    with console.session(started):
        mark_started(started, "run")
    rec = json.loads((started / "logs" / COMMAND_NAME).read_text())
    assert rec["pid"] == os.getpid() and rec["earlier_unrecorded_s"] == pytest.approx(723.0)
    # the second command, stopped after 300 s of grid progress
    t1 = _record(started, 1800, pid=pid, earlier_unrecorded_s=rec["earlier_unrecorded_s"])["started_at"]
    _progress(started, 1800, stage="grid", pid=pid, finished=True, updated_at=t1 + 300.0)
    st = collect_status(started)
    assert st["state"] == "stopped" and st["time"]["ran_s"] == pytest.approx(300.0)
    assert st["time"]["total_s"] == pytest.approx(1023.0)
    assert next(ln for ln in format_status(st) if ln.startswith("time:")).endswith("17m03s with earlier commands")
    with console.session(started):
        mark_started(started, "run")
    rec = json.loads((started / "logs" / COMMAND_NAME).read_text())
    assert rec["earlier_unrecorded_s"] == pytest.approx(1023.0)
    _record(started, 100, earlier_unrecorded_s=rec["earlier_unrecorded_s"])  # this process: running, 100 s in
    st = collect_status(started)
    assert st["state"] == "running" and st["time"]["total_s"] == pytest.approx(1123.0, abs=2.0)


def test_a_finished_or_running_commands_time_line_is_unchanged(tmp_path, started):
    """A finished folder with its (ended) command's record prints no stopped time; a running one counts from its
    start as before."""
    _lr_folder(tmp_path, table=True)
    _record(tmp_path, 600, kind="tune-lr", pid=_dead_pid())
    st = collect_status(tmp_path)
    assert st["state"] == "finished" and "ran_s" not in st["time"]
    assert not any(ln.startswith("time:") for ln in format_status(st))
    _record(started, 100)
    st = collect_status(started)
    assert "ran_s" not in st["time"] and "stopped_at" not in st["time"]
    line = next(ln for ln in format_status(st) if ln.startswith("time:"))
    # the sum of the stages' own clocks, said as such (a command's start-up is not in it)
    assert line.startswith("time: 1m4") and (", its stages' wall times summed (" in line) == bool(
        st["time"]["stage_wall_s"]), line


def test_a_finished_folders_time_names_what_earlier_stopped_commands_ran(tmp_path):
    """A finished folder whose earlier command stopped (its time outside the stage wall times: earlier_unrecorded_s)
    said "time: 13m42s, its stages' wall times summed (sweep 7m31s, fit 1m11s, report 0s)", which sum to 8m42s.
    The 5m00s of the stopped command is named in the sum now; without one the line is as before."""
    import shutil

    out = tmp_path / "seeds4"
    shutil.copytree(Path(__file__).resolve().parents[1] / "docs" / "example_cpu_seeds4", out)

    def time_line() -> str:
        st = collect_status(out)
        assert st["state"] == "finished"
        return next(ln for ln in format_status(st) if ln.startswith("time:"))

    assert time_line() == "time: 8m42s, its stages' wall times summed (sweep 7m31s, fit 1m11s, report 0s)"
    _record(out, 900, pid=_dead_pid(), earlier_unrecorded_s=300.0)
    assert time_line() == ("time: 13m42s, its stages' wall times (sweep 7m31s, fit 1m11s, report 0s) and 5m00s that "
                           "earlier commands ran before they stopped, summed")  # fmt: skip


def test_a_finished_sweep_or_tune_lr_command_counts_its_own_time(tmp_path):
    """A tune-lr (or sweep) command records no stage wall time: once finished, its time is its start to its
    progress display's last write (7m00s), and the total adds what an earlier interrupted command ran (30 s).
    The folder showed only the earlier command's 30 s before."""
    _lr_folder(tmp_path, table=True)
    pid = _dead_pid()
    t0 = _record(tmp_path, 600, kind="tune-lr", pid=pid, earlier_unrecorded_s=30.0)["started_at"]
    _progress(tmp_path, 600, stage="tune-lr", pid=pid, finished=True, updated_at=t0 + 420.0)
    st = collect_status(tmp_path)
    assert st["state"] == "finished" and st["time"]["ran_s"] == pytest.approx(420.0)
    assert st["time"]["total_s"] == pytest.approx(450.0)
    line = next(ln for ln in format_status(st) if ln.startswith("time:"))
    assert line.startswith("time: 7m00s to finish (started ") and line.endswith("), 7m30s with earlier commands")
    # the display of another (earlier) process says nothing of this command's time
    _progress(tmp_path, 600, stage="tune-lr", pid=_dead_pid(), finished=True, updated_at=t0 + 420.0)
    st = collect_status(tmp_path)
    assert "ran_s" not in st["time"] and st["time"]["total_s"] == pytest.approx(30.0)


def test_grid_trial_counts_in_json_follow_the_display_while_the_grid_runs(started, monkeypatch):
    """While the grid runs, the display's trial counts, even when Tune saved its state later: Tune saves a running
    trial as PENDING (seen in the default job: 'pending 18, terminated 4' with 2 trials running)."""
    from loopscale.sweep import status

    saved = {"experiment": "grid_smoke_000", "trials": {"PENDING": 8}, "runs": 16,
             "runs_per_trial": [2, 2], "running_ids": [], "run_ids": [], "updated_at": time.time() - 1}  # fmt: skip
    monkeypatch.setattr(status, "_tune_state", lambda storage, spec_name: dict(saved))
    _record(started, 400)
    live = {"RUNNING": 2, "PENDING": 3, "TERMINATED": 3}
    _progress(
        started, 350, stage="grid", counts={"done": 6, "running": 4, "pending": 6, "failed": 0}, trials=live
    )
    st = collect_status(started)
    assert st["tune"]["trials"] == live and st["tune"]["source"] == "progress"
    assert (st["tune"]["experiment"], st["tune"]["runs_per_trial"]) == ("grid_smoke_000", [2, 2])
    assert any(
        ln.startswith("tune trials (grid_smoke_000, live): 8, 2 runs each") for ln in format_status(st)
    )
    _record(started, 400, pid=_dead_pid())  # stopped: Tune's saved state, as before
    st = collect_status(started)
    assert st["tune"]["trials"] == saved["trials"] and st["tune"]["source"] == "tune"
    assert any(ln.startswith("tune trials (grid_smoke_000): 8") for ln in format_status(st))


def test_an_lr_table_the_spec_does_not_use_is_said_so(tmp_path):
    """tune-lr on a spec that fixes the LR writes a table no run reads: status lists it as not used (it listed
    the tuned LRs as if the runs had them)."""
    spec = preset_spec("smoke").model_copy(update={"lr": {"fixed": 0.01}})
    (tmp_path / "spec.yaml").write_text(spec_to_yaml(spec))
    _lr_folder(tmp_path, table=True)
    st = collect_status(tmp_path)
    assert st["lr"]["table_used"] is False
    text = format_status(st)
    i = text.index("LR table (tuned, not used: the spec fixes the LR of every run):")
    assert text[i + 1].startswith("  size 16 r 1: lr 0.02")
    (tmp_path / "spec.yaml").write_text(spec_to_yaml(spec.model_copy(update={"lr": "tune"})))
    st = collect_status(tmp_path)
    assert "table_used" not in st["lr"] and not any("not used" in ln for ln in format_status(st))


def test_a_stopped_folder_says_the_command_that_continues_it(started):
    """Status of a stopped run said what was pending but not how to go on: it now gives the stopped command with
    --resume (line and JSON); a running one gives none, and a finished one names its last command."""
    pid = _dead_pid()
    _record(started, 600, pid=pid, command=f"loopscale run --preset smoke --out {started}")
    st = collect_status(started)
    assert st["state"] == "stopped" and st["command"] is None
    assert st["resume_with"] == f"loopscale run --preset smoke --out {started} --resume"
    assert st["last_command"] == f"loopscale run --preset smoke --out {started}"
    assert format_status(st)[-1] == f"to continue (finished runs are kept): loopscale run --preset smoke --out {started} --resume"
    # recorded with another --out (the folder was moved since): the resume line names where it is now
    _record(started, 600, pid=pid, command="loopscale run --preset smoke --out /x/run")
    assert collect_status(started)["resume_with"] == f"loopscale run --preset smoke --out {started.resolve()} --resume"
    _record(started, 600, pid=pid, command=f"loopscale sweep s.yaml --out {started} --resume")  # --resume once
    assert collect_status(started)["resume_with"] == f"loopscale sweep s.yaml --out {started} --resume"
    _record(started, 5)  # this process: running
    st = collect_status(started)
    assert st["state"] == "running" and st["resume_with"] is None and st["last_command"] is None
    assert not any(ln.startswith("to continue") for ln in format_status(st))


def test_commands_run_one_by_one_are_each_timed(started):
    """tune-lr (7m00s), then sweep (2m00s), then run (fit and report): each new command's record lists the folder's
    earlier commands with the time each ran, and status prints them (before, a finished `run` after the stages
    run one by one showed only its own stage wall times: fit, report)."""
    pid = _dead_pid()
    t0 = _record(started, 3600, kind="tune-lr", command="loopscale tune-lr smoke", pid=pid)["started_at"]
    _progress(started, 3600, stage="tune-lr", pid=pid, finished=True, updated_at=t0 + 420.0)
    with console.session(started):
        mark_started(started, "sweep")
    rec = json.loads((started / "logs" / COMMAND_NAME).read_text())
    assert [(c["kind"], c["command"]) for c in rec["earlier_commands"]] == [("tune-lr", "loopscale tune-lr smoke")]
    assert rec["earlier_commands"][0]["ran_s"] == pytest.approx(420.0)
    # the sweep ran 120 s
    t1 = _record(started, 1800, kind="sweep", pid=pid, earlier_commands=rec["earlier_commands"],
                 earlier_unrecorded_s=rec["earlier_unrecorded_s"])["started_at"]  # fmt: skip
    _progress(started, 1800, stage="grid", pid=pid, finished=True, updated_at=t1 + 120.0)
    with console.session(started):
        mark_started(started, "run")
    rec = json.loads((started / "logs" / COMMAND_NAME).read_text())
    assert [c["kind"] for c in rec["earlier_commands"]] == ["tune-lr", "sweep"]
    assert [c["ran_s"] for c in rec["earlier_commands"]] == [pytest.approx(420.0), pytest.approx(120.0)]
    st = collect_status(started)
    assert [c["kind"] for c in st["time"]["earlier_commands"]] == ["tune-lr", "sweep"]
    assert "  earlier commands in this folder, oldest first: tune-lr 7m00s, sweep 2m00s" in format_status(st)
    # a folder's first command lists none
    (started / "logs" / COMMAND_NAME).unlink()
    with console.session(started):
        mark_started(started, "run")
    st = collect_status(started)
    assert "earlier_commands" not in st["time"]
    assert not any("earlier commands in this folder" in ln for ln in format_status(st))


def test_a_run_stopped_in_its_fit_stage_is_not_finished(started):
    """Ctrl-C in the fit stage of a rerun with other fit settings: status says the run stopped in the fit stage and
    gives the command that continues it (it said "finished, stage done", with the earlier fit's headline as if it
    were the new one's). The earlier fit's analysis.json and report.md stay where they were, whole (they were moved
    to earlier_fit_*/ before the refit, which left the folder without a report when it was stopped): the refit
    writes into fit.partial/ and takes fit/'s place only when it ends."""
    spec = preset_spec("smoke")
    store = ResultsStore(started)
    for c in spec.cells():
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    store.consolidate()
    (started / "fit").mkdir()
    earlier = {"variants": {"baseline": {"n": 16, "joint": {"params": {"phi": 0.5}, "ci": {"phi": [0.4, 0.6]},
                                                             "r2": 0.99, "n": 16}}}}  # fmt: skip
    (started / "fit" / "analysis.json").write_text(json.dumps(earlier))
    (started / "report.md").write_text("# an earlier fit's report\n")
    (started / "run_meta.json").write_text(json.dumps({"spec_name": "smoke", "stage_wall_s": {"fit": 5.0},
                                                       "fit_input": {"runs_sha256": "0" * 64, "B": 10}}))  # fmt: skip
    stop_in_fit = (
        "import sys, pathlib, loopscale.fit.analysis as a\n"
        "def stop(runs, out_dir, **kwargs):\n"
        "    pathlib.Path(out_dir, 'baseline').mkdir(parents=True)\n"
        "    pathlib.Path(out_dir, 'baseline', 'fit.json').write_text('{}')\n"  # part-way through its files
        "    raise KeyboardInterrupt\n"
        "a.analyze = stop\n"
        "from loopscale.sweep.cli import main\n"
        f"sys.argv = ['loopscale', 'run', '--preset', 'smoke', '--out', {str(started)!r}, '--resume',"
        " '--bootstrap', '200', '--starts', '300']\n"
        "main()\n"
    )
    p = subprocess.run([sys.executable, "-c", stop_in_fit], capture_output=True, text=True, timeout=300)
    assert p.returncode == 130, p.stderr[-3000:]
    assert "[3/4] fit" in p.stdout + p.stderr
    st = collect_status(started)
    assert (st["state"], st["stage"]) == ("stopped", "fit")
    assert st["resume_with"].endswith("--resume --bootstrap 200 --starts 300")
    text = format_status(st)
    assert text[0].endswith("— stopped, stage fit")
    assert text[-1].startswith("to continue (finished runs are kept): loopscale run --preset smoke")
    # the earlier fit and its report are where they were, whole; status shows that fit as an earlier one's
    assert sorted(p.name for p in (started / "fit").iterdir()) == ["analysis.json"]
    assert json.loads((started / "fit" / "analysis.json").read_text()) == earlier
    assert (started / "report.md").read_text() == "# an earlier fit's report\n"
    assert not [d for d in started.iterdir() if d.name.startswith("earlier_fit_")]
    assert (started / "fit.partial" / "baseline" / "fit.json").is_file()  # the stopped fit's files, apart
    assert any(line.startswith("fit (an earlier fit's; the fit stage started since has not ended)") for line in text)
    assert json.loads((started / "run_meta.json").read_text())["fit_input"] == {"runs_sha256": "0" * 64, "B": 10}
    assert st["last_command_error"] is None  # stopped by Ctrl-C, not by an error
    # a command that stopped on an error: status says which (it read as any stopped folder, and the --resume it
    # offered could fail the same way)
    failing = stop_in_fit.replace("raise KeyboardInterrupt", "raise ValueError(\"invalid literal for int(): '2/16'\")")
    p = subprocess.run([sys.executable, "-c", failing], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "error: invalid literal for int(): '2/16'" in p.stderr, p.stderr[-3000:]
    st = collect_status(started)
    assert (st["state"], st["last_command_error"]) == ("stopped", "invalid literal for int(): '2/16'")
    text = format_status(st)
    assert text[-2:] == ["the last command stopped on an error: invalid literal for int(): '2/16'",
                         f"to continue (finished runs are kept): {st['resume_with']}"]  # fmt: skip
    # the next fit starts from nothing: what the stopped one left is removed first (only the stage's mark is there)
    fresh = stop_in_fit.replace("    pathlib.Path(out_dir, 'baseline').mkdir",
                                "    assert [q.name for q in pathlib.Path(out_dir).iterdir()] == ['.loopscale-fit-stage'], 'stale'\n"
                                "    pathlib.Path(out_dir, 'baseline').mkdir")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, timeout=300)
    assert p.returncode == 130 and "stale" not in p.stderr, p.stderr[-3000:]


def test_a_spec_storage_out_of_reach_is_said_not_skipped(tmp_path, s3_offline):
    """A folder whose spec keeps Tune's state on a remote storage that cannot be reached (offline, no credentials):
    status left the Tune state out without a word (s3://, after pyarrow's retries) or hung (gs://, for Google's
    15-minute retry policy); it now shows what the folder holds and says why the Tune state is not there."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(preset_spec("smoke").model_copy(update={"storage_path": "s3://b/x"})))
    s = collect_status(out)
    assert s["storage_error"].startswith("storage 's3://b/x' cannot be reached: When resolving region")
    assert any(line.startswith("tune state: not read: storage 's3://b/x'") for line in format_status(s))


def test_a_second_command_in_a_folder_in_use_is_refused_before_it_writes(busy):
    """Two `loopscale run` on one --out both trained every run (two Tune experiments sharing the runs'
    checkpoints), a second tune-lr deleted the live study of a running `run`, and a short second command replaced
    the record so that status called the running one stopped. A command whose record names a live process is now
    refused, for run, sweep and tune-lr, before anything is written; a stopped one's folder is taken as before."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app
    from loopscale.sweep.status import refuse_busy_folder

    out, live, rec = busy
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    for cmd in (["run", "smoke"], ["sweep", "smoke"], ["tune-lr", "smoke"]):
        res = CliRunner().invoke(app, [*cmd, "--out", str(out)])
        assert res.exit_code == 2, res.output
        assert f"is in use: `loopscale run smoke --out busy` (pid {live.pid} on {rec['host']})" in res.output
        assert f"`loopscale {cmd[0]}` would run beside it" in res.output
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing written
    live.kill()
    live.wait()
    refuse_busy_folder(out, "`loopscale run`")  # its process has ended: the folder is free
    _record(out, 30)  # this process's own record (`run` calling its stages) is not another command
    refuse_busy_folder(out, "`loopscale sweep`")


def test_design_out_waits_for_the_command_working_in_its_folder(busy):
    """`design --out` into a folder where `run` was training rewrote its spec.yaml and wrote a prediction there,
    which the run's report then showed as made before its runs. It is refused before it simulates, as `report`
    and `fit` are; nothing in the folder changes."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    out, live, _ = busy
    before = {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")}
    pilot = Path(__file__).resolve().parents[1] / "docs" / "example_cpu_seeds4"
    res = CliRunner().invoke(app, ["design", "smoke", "--pilot", str(pilot), "--minutes", "5", "--n-sim", "2",
                                   "--starts", "3", "--seeds", "2", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert f"is in use: `loopscale run smoke --out busy` (pid {live.pid}" in said
    assert "`loopscale design --out` would run beside it (it writes the folder's spec.yaml and a prediction" in said
    assert "simulat" not in said.split("is in use")[0]  # refused before it simulated anything
    assert {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_report_waits_for_the_command_working_in_its_folder(busy):
    """`loopscale report` on a folder whose `run` was in its LR stage said runs.parquet was missing and that the
    folder held no other record of its runs (as if data were lost), and told to rerun with --resume, which the
    live command would refuse. It now names the live command and says its own report comes when it ends."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    out, live, _ = busy
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 2, res.output
    assert f"is in use: `loopscale run smoke --out busy` (pid {live.pid}" in res.output
    assert "`loopscale report` would run beside it (it writes the runs table" in " ".join(res.output.split())
    assert "runs.parquet" not in res.output.split("is in use")[0]


def test_fit_of_a_folder_whose_runs_table_is_not_written_yet_names_the_command_working_there(busy):
    """`loopscale fit DIR` while a `run` trained in DIR said only "a folder without runs.parquet", which reads as
    lost data; `report` and `run` named the live command. fit now does too; a folder with its runs.parquet is
    fitted while a command works there (fitting writes nothing in it), and a free one gets the old message."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    out, live, _ = busy
    res = CliRunner().invoke(app, ["fit", str(out)])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert f"is in use: `loopscale run smoke --out busy` (pid {live.pid}" in said
    assert "`loopscale fit` would run beside it (its runs table, runs.parquet, is written when its grid ends)" in said
    import shutil

    shutil.copy(Path(__file__).resolve().parents[1] / "docs" / "example_cpu" / "runs.parquet", out / "runs.parquet")
    res = CliRunner().invoke(app, ["fit", str(out), "--starts", "8", "--workers", "1"])
    assert res.exit_code == 0 and "law joint" in res.output, res.output
    (out / "runs.parquet").unlink()
    live.kill()
    live.wait()
    res = CliRunner().invoke(app, ["fit", str(out)])  # a loopscale folder: what rebuilds its table, as report says
    assert res.exit_code == 2 and f"{out / 'runs.parquet'} not found, and {out} holds no other record of its runs" in res.output, res.output
    parts = out / "parts" / "runs"  # a run killed after its runs recorded themselves, before it wrote the table
    parts.mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "docs" / "example_cpu" / "runs.parquet", parts / "a.parquet")
    res = CliRunner().invoke(app, ["fit", str(out)])
    assert res.exit_code == 2 and f"its runs' own records are still in {parts}: `loopscale run SPEC --out {out} --resume` rebuilds it" in res.output, res.output

def test_a_killed_command_not_yet_reaped_is_not_running(tmp_path):
    """Right after a SIGKILL, status called the command 'running' (ETA and all) while its process was a zombie
    (state Z, not yet reaped by its parent), and a `run --resume` was not blocked only by luck."""
    from loopscale.sweep.status import _pid_alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert _pid_alive(child.pid)
        child.kill()
        for _ in range(100):  # killed, not reaped (no wait() yet): a zombie
            if Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        assert not _pid_alive(child.pid)
    finally:
        child.wait()


def test_run_refuses_a_folder_of_someone_elses_report_before_writing(tmp_path):
    """`loopscale run smoke --out u3` replaced a user's own report.md in a folder holding no loopscale output,
    without a word. It is refused now, naming the file, and nothing is written; a loopscale folder (its spec.yaml)
    with a report.md is not."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app
    from loopscale.sweep.status import refuse_foreign_files

    out = tmp_path / "u3"
    (out / "fit").mkdir(parents=True)
    (out / "report.md").write_text("MY OWN REPORT")
    (out / "fit" / "fit.json").write_text("{}")
    res = CliRunner().invoke(app, ["run", "smoke", "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "holds report.md, fit/fit.json, which `loopscale run` writes, but no loopscale output" in res.output
    assert (out / "report.md").read_text() == "MY OWN REPORT" and sorted(p.name for p in out.iterdir()) == ["fit", "report.md"]
    (out / "spec.yaml").write_text(spec_to_yaml(preset_spec("smoke")))
    refuse_foreign_files(out)  # a run folder's own report
    refuse_foreign_files(tmp_path / "new")  # a folder not made yet
    # a folder of one's own named fit.partial: `run` writes its fit there first (and removes what a stopped fit left)
    mine = tmp_path / "u4"
    (mine / "fit.partial").mkdir(parents=True)
    res = CliRunner().invoke(app, ["run", "smoke", "--out", str(mine)])
    assert res.exit_code == 2 and "holds fit.partial, which `loopscale run` writes" in " ".join(res.output.split())
    assert [p.name for p in mine.iterdir()] == ["fit.partial"]
    # ... also inside a loopscale folder: the next `run` removed it as a stopped fit's (it was not)
    (mine / "spec.yaml").write_text(spec_to_yaml(preset_spec("smoke")))
    (mine / "fit.partial" / "notes.txt").write_text("MINE")
    for args in (["run", "smoke", "--out", str(mine)], ["run", "smoke", "--out", str(mine), "--dry-run"]):
        res = CliRunner().invoke(app, args)
        flat = " ".join(res.output.split())
        assert res.exit_code == 2 and "holds fit.partial/, which `loopscale run`'s fit stage writes and removes" in flat
        assert "no fit stage of this folder left it" in flat, res.output
    assert (mine / "fit.partial" / "notes.txt").read_text() == "MINE"
    assert sorted(p.name for p in mine.iterdir()) == ["fit.partial", "spec.yaml"]
    # the fit stage's own: its mark file, or (a stop before the mark was written) run_meta.json's fit_unfinished
    (mine / "run_meta.json").write_text(json.dumps({"spec_name": "smoke", "fit_unfinished": {"B": 10}}))
    refuse_foreign_files(mine)
    (mine / "run_meta.json").write_text(json.dumps({"spec_name": "smoke"}))
    with pytest.raises(ValueError, match="no fit stage of this folder left it"):
        refuse_foreign_files(mine)
    (mine / "fit.partial" / ".loopscale-fit-stage").write_text("")
    refuse_foreign_files(mine)


def test_a_folder_whose_fit_a_sweep_left_undone_is_continued_with_run(started):
    """After `sweep --force` (which moves the earlier fit and report aside) the folder has its runs but no fit:
    status said "stopped, stage fit" and suggested `loopscale sweep ... --resume`, which ends with the runs and never
    fits. It now suggests the folder's own `run` command with --resume, else `run OUT/spec.yaml --out OUT`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cells = preset_spec("smoke").cells()
    pq.write_table(pa.table({"run_id": [c.run_id for c in cells], "status": ["ok"] * len(cells)}),
                   started / "runs.parquet")  # fmt: skip
    (started / "run_meta.json").write_text(json.dumps({"spec_name": "smoke", "stage_wall_s": {"sweep": 8.0}}))
    earlier = [{"kind": "run", "command": f"loopscale run smoke --out {started}", "started_at": 1.0, "ran_s": 20.0}]
    _record(started, 60, pid=_dead_pid(), kind="sweep", command=f"loopscale sweep smoke --out {started} --force",
            earlier_commands=earlier)  # fmt: skip
    st = collect_status(started)
    assert (st["state"], st["stage"], st["last_command_finished"]) == ("stopped", "fit", "sweep")
    assert st["resume_with"] == f"loopscale run smoke --out {started} --resume"
    # the sweep did its part: nothing was interrupted ("stopped, stage fit ... 21s before it stopped" read so)
    lines = format_status(st)
    assert lines[0] == f"{started}: smoke — stage fit next: the last command, `loopscale sweep`, finished its part"
    assert any(ln.startswith("time: ") and " to finish (" in ln for ln in lines), lines
    assert not any("before it stopped" in ln for ln in lines)
    (started / "runs.parquet").unlink()  # its runs not all recorded: the sweep itself stopped
    st = collect_status(started)
    assert (st["state"], st["stage"], st["last_command_finished"]) == ("stopped", "sweep", None)
    assert format_status(st)[0] == f"{started}: smoke — stopped, stage sweep"
    pq.write_table(pa.table({"run_id": [c.run_id for c in cells], "status": ["ok"] * len(cells)}),
                   started / "runs.parquet")  # fmt: skip
    _record(started, 60, pid=_dead_pid(), kind="sweep", command=f"loopscale sweep smoke --out {started}")
    assert collect_status(started)["resume_with"] == f"loopscale run {started / 'spec.yaml'} --out {started} --resume"
    # that `run`'s relative --storage is read where it ran, not where the newest command ran
    earlier = [{"kind": "run", "command": f"loopscale run smoke --out {started} --storage st", "cwd": "/where/run/ran",
                "started_at": 1.0, "ran_s": 20.0}]  # fmt: skip
    _record(started, 60, pid=_dead_pid(), kind="sweep", command=f"loopscale sweep smoke --out {started} --force",
            earlier_commands=earlier, cwd="/elsewhere")  # fmt: skip
    assert collect_status(started)["resume_with"] == (
        f"loopscale run smoke --out {started} --storage /where/run/ran/st --resume"
    )


def test_status_names_an_unreadable_runs_file(tmp_path):
    """A folder whose runs.parquet cannot be read was shown as '? — empty' with nothing about the file (the dry run
    names it under 'unreadable'). Status names it and why, reads it as no runs, and changes nothing."""
    from loopscale.sweep.status import collect_status, format_status

    (tmp_path / "runs.parquet").write_text("my notes")
    st = collect_status(tmp_path)
    assert st["unreadable"] and st["unreadable"][0].startswith(f"{tmp_path / 'runs.parquet'} is unreadable (")
    assert any(ln.startswith("unreadable, read as no runs: ") and "the command would move it aside" in ln
               for ln in format_status(st))  # fmt: skip
    assert (tmp_path / "runs.parquet").read_text() == "my notes"


def test_status_names_an_unreadable_lr_table_and_moves_nothing(tmp_path):
    """Status read lr_table.parquet outside its look-only guard: a torn one was moved aside (renamed to
    lr_table.parquet.unreadable-<id>) by a command that only reports. It now names it, as it names a torn
    runs.parquet, and changes nothing."""
    from loopscale.sweep.spec import record_folder_spec

    record_folder_spec(tmp_path, preset_spec("smoke").model_copy(update={"lr": "tune"}))
    (tmp_path / "lr_table.parquet").write_text("garbage")
    before = sorted(p.name for p in tmp_path.iterdir())
    st = collect_status(tmp_path)
    msg = (f"{tmp_path / 'lr_table.parquet'} is unreadable (Parquet file size is 7 bytes, smaller than the minimum file "
           "footer (8 bytes)): the command would move it aside and read it as absent (tune-lr rebuilds the LR table "
           "from its finished studies)")  # fmt: skip
    assert st["unreadable"] == [msg]
    assert "table" not in (st["lr"] or {})
    assert f"unreadable, read as no LR table: {msg}" in format_status(st)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing moved aside
    assert (tmp_path / "lr_table.parquet").read_text() == "garbage"


def test_status_counts_runs_as_the_next_command_will(tmp_path):
    """Status read every runs part as a finished run, also one whose curves part is missing (a crash between the
    two writes), which the next `run` or `sweep` moves aside and counts as unfinished: status said '16 ok' where
    the rerun had 15. It now reads the folder as those commands do (the results store, changing nothing)."""
    from loopscale.sweep.status import collect_status, format_status

    spec = preset_spec("smoke")
    store = ResultsStore(tmp_path)
    for c in spec.cells():
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    lost = spec.cells()[3].run_id
    (store.curves_parts / f"{lost}.parquet").unlink()
    before = sorted(p.name for p in store.runs_parts.iterdir())
    st = collect_status(tmp_path)
    assert st["runs"]["ok"] == len(spec.cells()) - 1, st["runs"]
    assert len(st["unreadable"]) == 1 and st["unreadable"][0].startswith(f"{store.runs_parts / lost}.parquet: its curves part")
    assert any(ln.startswith("unreadable, read as no runs: ") for ln in format_status(st))
    assert sorted(p.name for p in store.runs_parts.iterdir()) == before  # nothing moved
    assert set(store.completed_ids()) == {c.run_id for c in spec.cells()} - {lost}  # what the next command reads


def test_set_aside_folders_are_listed_oldest_first_and_a_foreign_curves_part_is_named(tmp_path):
    """The folders set aside were sorted by name, so `earlier_2026...` (sweep --force) came before any
    `earlier_fit_...` (a refit) whatever their times; they are sorted by the time in their names. A curves part
    without `step` was called 'not a loopscale runs table'."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopscale.sweep.status import set_aside_folders

    for name in ("earlier_20261203T120000", "earlier_fit_20261201T000000", "earlier_fit_20261203T120000_2",
                 "earlier_fit_20261203T120000", "fit/earlier_fit_20261202T000000"):  # fmt: skip
        (tmp_path / name).mkdir(parents=True)
    assert [a["path"] for a in set_aside_folders(tmp_path)] == [
        "earlier_fit_20261201T000000", "fit/earlier_fit_20261202T000000", "earlier_20261203T120000",
        "earlier_fit_20261203T120000", "earlier_fit_20261203T120000_2"]  # fmt: skip
    spec = preset_spec("smoke")
    store = ResultsStore(tmp_path / "run")
    c = spec.cells()[0]
    store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    pq.write_table(pa.table({"run_id": [c.run_id], "loss": [1.0]}), store.curves_parts / f"{c.run_id}.parquet")
    with pytest.raises(NotAnOutput, match=r"is not a loopscale curves table: it has no step column"):
        collect_status(tmp_path / "run")


def test_a_smoothed_lr_is_not_paired_with_another_lrs_loss(tmp_path):
    """With tune.smooth the table's LR is the fitted one, which no trial trained: status printed
    'lr 0.00881 (val 4.9091 ...)' where 4.9091 was measured at 0.008621, the best trial's LR."""
    from loopscale.sweep.lr_table import _lr_table_schema
    from loopscale.sweep.store import to_table, write_table_atomic

    _lr_folder(tmp_path, table=False)
    row = dict(size=16, r=1, tuned_r=1, N_unique=1000, N_usage=1000, lr_best=0.008621, best_val_loss=4.9091,
               lr_smoothed=0.00881, lr=0.00881, n_trials=3, n_pruned=0, budget_tokens=1000, study_name="s",
               storage="sqlite:///x")  # fmt: skip
    write_table_atomic(to_table([row], _lr_table_schema()), tmp_path / "lr_table.parquet")
    text = format_status(collect_status(tmp_path))
    assert "  size 16 r 1: lr 0.00881 (val 4.9091 at lr 0.008621, the best trial's; lr is smoothed, 3 trials, " \
           "0 pruned)" in text  # fmt: skip
    # an LR that is neither the best trial's nor the smoothed one (the table edited by hand) is not called smoothed
    write_table_atomic(to_table([dict(row, lr=0.05)], _lr_table_schema()), tmp_path / "lr_table.parquet")
    text = format_status(collect_status(tmp_path))
    assert "  size 16 r 1: lr 0.05 (val 4.9091 at lr 0.008621, the best trial's; lr is neither it nor the smoothed " \
           "0.00881: the table was edited, 3 trials, 0 pruned)" in text, text  # fmt: skip


def test_a_folder_file_that_does_not_read_is_said_by_status_and_set_aside_by_run(tmp_path):
    """A spec.yaml that is not a loopscale spec, and a run_meta.json that is not a JSON object (here a list, which
    crashed `status` with AttributeError and `run` with TypeError), are named by `status` as read as absent; `run`
    (its dry run lists it) moves such a run_meta.json aside like a torn one."""
    from typer.testing import CliRunner

    from loopscale.cluster.storage import read_json_or_aside
    from loopscale.sweep.cli import app

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "spec.yaml").write_text("foo: bar\n", encoding="utf-8")
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "run_meta.json").write_text("[1, 2]", encoding="utf-8")
    st = collect_status(foreign)
    assert st["state"] == "empty" and st["spec"] is None
    (line,) = st["unreadable_own"]
    assert line.startswith(f"{foreign / 'spec.yaml'} (not a spec this loopscale reads: invalid sweep spec: foo")
    assert "sets it aside and writes its own" in line
    res = CliRunner().invoke(app, ["status", str(listed)])
    assert res.exit_code == 0, res.output
    assert f"unreadable, read as absent: {listed / 'run_meta.json'} (not a JSON object (a JSON list))" in res.output
    dry = CliRunner().invoke(app, ["run", "--preset", "smoke", "--out", str(listed), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["unreadable"] == [
        f"{listed / 'run_meta.json'} is unreadable (not a JSON object (a JSON list)): the command would move it aside "
        "and treat it as missing"
    ]
    with pytest.warns(UserWarning, match="not a JSON object"):
        assert read_json_or_aside(str(listed / "run_meta.json")) is None
    assert not (listed / "run_meta.json").exists() and len(list(listed.glob("run_meta.json.unreadable-*"))) == 1


def test_a_report_being_rewritten_is_stage_report_not_done(tmp_path):
    """While `run` writes the report (run_meta.json's report_unfinished), a folder that already held a report.md
    read as "running, stage done"; now it is stage report, running while the command lives and stopped (with the
    command that rewrites it) after it was killed there."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "docs" / "example_cpu_previous_default", out)
    assert (collect_status(out)["state"], collect_status(out)["stage"]) == ("finished", "done")
    meta = json.loads((out / "run_meta.json").read_text())
    (out / "run_meta.json").write_text(json.dumps({**meta, "report_unfinished": True}))
    _record(out, 5, command=f"loopscale run {out / 'spec.yaml'} --out {out} --resume")
    st = collect_status(out)
    assert (st["state"], st["stage"]) == ("running", "report")
    _record(out, 5, pid=2**22 + 12345, command=f"loopscale run {out / 'spec.yaml'} --out {out} --resume")  # gone
    st = collect_status(out)
    assert (st["state"], st["stage"]) == ("stopped", "report") and "--resume" in st["resume_with"]
    (out / "run_meta.json").write_text(json.dumps(meta))
    assert collect_status(out)["stage"] == "done"


def test_a_folder_whose_lr_tuning_stopped_part_way_shows_what_its_finished_studies_chose(tmp_path):
    """`status` of a tune-lr folder stopped after 1 of 2 studies said 'LR studies: 1 of 2 done' and nothing of
    the LR that study found (the LR table is written only once every study has ended); it now gives each finished
    study's best healthy trial from the Optuna storage."""
    import optuna
    from tiny_spec import tiny_spec

    from loopscale.sweep.spec import parse_spec

    out = tmp_path / "out"
    (out / "tune_lr" / "done").mkdir(parents=True)
    spec = parse_spec(tiny_spec(lr="tune", tune={"num_samples": 4, "tokens": 2048}))
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    (out / "tune_lr" / "done" / "size16_r1.json").write_text("{}")
    dist = {"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)}
    for name, trials in (("tiny_size16_r1", [(0.01, 3.3), (0.03, 3.1), (0.1, None)]), ("tiny_size16_r2", [(0.02, 3.0)])):
        st = optuna.create_study(study_name=name, storage=f"sqlite:///{out / 'tune_lr' / 'optuna.db'}")
        for lr, v in trials:
            st.add_trial(optuna.trial.create_trial(params={"lr": lr}, distributions=dist, value=v) if v is not None
                         else optuna.trial.create_trial(params={"lr": lr}, distributions=dist,
                                                        state=optuna.trial.TrialState.FAIL))  # fmt: skip
    st = collect_status(out)
    assert st["lr"]["studies"] == {"done": 1, "total": 2, "best": [
        {"size": 16, "r": 1, "lr": 0.03, "val_loss": 3.1, "trials": 3}]}  # the unfinished r = 2 study is not listed
    assert ("LR studies: 1 of 2 done; best so far: size 16 r 1: lr 0.03 (val 3.1000, 3 trials) (the LR table is "
            "written when every study has ended)") in format_status(st)


def test_a_folder_whose_lr_tuning_found_no_lr_gets_no_resume_line(tmp_path):
    """When no LR of the range learned, `run` says to move the range and run again in another --out folder, but
    `status` offered `... --resume`, which ends the same way. The error's record says --resume cannot help, and
    status says so instead of offering it."""
    spec = (Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml").read_text()
    spec_path = tmp_path / "tt.yaml"
    spec_path.write_text(spec.replace("name: smoke", "name: tt").replace("lr: {fixed: 0.01}", "lr: tune"))
    out = tmp_path / "tt"
    no_lr = (
        "import sys, loopscale.sweep.lr_search as l\n"
        "def fail(spec, out, **kw):\n"
        "    raise l._no_healthy_trial(spec, {(16, 1): ('diverged', ['diverged'] * 4)}, 1, 4)\n"
        "l.run_tune_lr = fail\n"
        "from loopscale.sweep.cli import main\n"
        f"sys.argv = ['loopscale', 'run', {str(spec_path)!r}, '--out', {str(out)!r}]\n"
        "main()\n"
    )
    p = subprocess.run([sys.executable, "-c", no_lr], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "all 4 trials diverged" in p.stderr and "another --out folder" in p.stderr, p.stderr[-3000:]
    st = collect_status(out)
    assert st["state"] == "stopped" and "all 4 trials diverged" in st["last_command_error"]
    assert st["resume_with"] is None and "--resume would end the same way" in st["cannot_resume"]
    text = format_status(st)
    assert not any(line.startswith("to continue") for line in text)
    assert text[-1].startswith("cannot continue: --resume would end the same way")
    # an error --resume can get past (here a ValueError of the same stage) still gets its line
    other = no_lr.replace("raise l._no_healthy_trial(spec, {(16, 1): ('diverged', ['diverged'] * 4)}, 1, 4)",
                          "raise ValueError('a passing problem')")
    p = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    st = collect_status(out)
    assert st["cannot_resume"] is None and st["resume_with"].endswith("--resume")


def test_a_run_a_token_auth_cluster_refused_gets_a_resume_line_with_ray_auth_mode(tmp_path):
    """A cluster with token authentication refusing the driver ends the command with "needs RAY_AUTH_MODE=token in
    this environment too", but status's line to continue lacked it: run as given, it was refused the same way. The
    refusal's record now carries the environment the command needs, and the line starts with RAY_AUTH_MODE=token.
    (The refusal is Ray's own error path, ``_ray_init``, given a Ray whose init raises what Ray 2.60 raises.)"""
    out = tmp_path / "ta"
    refused = (
        "import sys, loopscale.cluster.connect as c\n"
        "class FakeRay:\n"
        "    def init(self, **kw):\n"
        "        e = ConnectionError('Failed to connect to Ray cluster at 10.0.0.5:6379')\n"
        "        e.__cause__ = RuntimeError('RPC error: InvalidAuthToken: Authentication token is missing')\n"
        "        raise e\n"
        "real = c._ray_init\n"
        "c._ray_init = lambda ray, address, joining, *a: real(FakeRay(), '10.0.0.5:6379', True, *a)\n"
        "from loopscale.sweep.cli import main\n"
        f"sys.argv = ['loopscale', 'run', '--preset', 'smoke', '--out', {str(out)!r}]\n"
        "main()\n"
    )
    p = subprocess.run([sys.executable, "-c", refused], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "refused this process's Ray auth token" in p.stderr, p.stderr[-3000:]
    st = collect_status(out)
    assert st["state"] == "stopped" and "RAY_AUTH_MODE=token" in st["last_command_error"]
    assert st["resume_with"].startswith("RAY_AUTH_MODE=token ") and st["resume_with"].endswith(" --resume")
    assert "loopscale run --preset smoke --out " in st["resume_with"]
    assert any(line == f"to continue (finished runs are kept): {st['resume_with']}" for line in format_status(st))


def test_a_storage_another_folders_command_is_using_is_refused(tmp_path):
    """Two `run smoke --out csN --storage S` started together each trained all 16 runs, writing the same checkpoint
    files in S. A storage whose claimant folder has a live command is refused for another folder; the same folder
    (a resume) and a storage used after the other command ended are not."""
    from loopscale.sweep.status import STORAGE_CLAIM, refuse_busy_storage

    first, second, store = tmp_path / "cs1", tmp_path / "cs2", tmp_path / "cs_store"
    first.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", (
            "import time\nfrom loopscale.sweep import console\nfrom loopscale.sweep.status import mark_started\n"
            f"with console.session({str(first)!r}):\n    mark_started({str(first)!r}, 'run', storage={str(store)!r})\n"
            "    time.sleep(120)\n"
        )],
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while not (store / STORAGE_CLAIM).exists() and child.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert json.loads((store / STORAGE_CLAIM).read_text())["out"] == str(first.resolve())
        with pytest.raises(ValueError, match=rf"storage {store} is in use: .* keeps the runs of {first.resolve()} "
                                             r"there; `loopscale run` would run beside it"):  # fmt: skip
            refuse_busy_storage(str(store), second, "`loopscale run`")
        refuse_busy_storage(str(store), first, "`loopscale run`")  # its own folder: not another command's
        # the console script: refused before anything is written in the second folder
        p = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", "--preset", "smoke", "--out",
                            str(second), "--storage", str(store)], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert p.returncode == 2 and "is in use" in p.stderr, p.stderr[-2000:]
        assert not second.exists()
    finally:
        child.kill()
        child.wait()
    refuse_busy_storage(str(store), second, "`loopscale run`")  # it ended: one folder after another is allowed
    # the claimant folder's live command uses its own default storage now: S is not in use; A's default storage
    # (A/tune) given as --storage from another folder is
    child = subprocess.Popen(
        [sys.executable, "-c", (
            "import time\nfrom loopscale.sweep import console\nfrom loopscale.sweep.status import mark_started\n"
            f"with console.session({str(first)!r}):\n    mark_started({str(first)!r}, 'run')\n    time.sleep(120)\n"
        )],
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while (json.loads((first / "logs" / COMMAND_NAME).read_text()).get("pid") != child.pid
               and child.poll() is None and time.time() < deadline):  # fmt: skip
            time.sleep(0.1)
        refuse_busy_storage(str(store), second, "`loopscale sweep`")
        with pytest.raises(ValueError, match=r"storage .*cs1/tune is in use"):
            refuse_busy_storage(f"file://{first.resolve() / 'tune'}", second, "`loopscale sweep`")
    finally:
        child.kill()
        child.wait()
