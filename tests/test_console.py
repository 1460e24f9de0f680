"""The console: captured Ray output, one-line notices, progress views (no Ray started here)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from types import SimpleNamespace

import pytest

from loopscale.sweep import console
from loopscale.sweep.grid import trial_cells
from loopscale.sweep.presets import preset_spec


@pytest.mark.parametrize(
    ("line", "note"),
    [
        (
            "2026-11-30 17:08:56,037\tWARNING authentication_token_setup.py:85 -- Token auth is on.",
            "WARNING authentication_token_setup.py:85 -- Token auth is on.",
        ),
        (
            "\x1b[36m(grid_trainable pid=23756)\x1b[0m ValueError: lr must be > 0",
            "ValueError: lr must be > 0",
        ),
        # a trial's Python warning, said as the console script says its own (it read "UserWarning: ...")
        ("/x/y.py:12: UserWarning: something odd", "warning: something odd"),
        ("/x/y.py:12: CorpusWarning: corpus file 'a.txt' is odd", "warning: corpus file 'a.txt' is odd"),
        ("/x/y.py:12: FutureWarning: an API goes", "warning (FutureWarning): an API goes"),
        (
            "(t pid=2) /x/y.py:12: UserWarning: odd \x1b[32m [repeated 4x across cluster] (Ray deduplicates logs by "
            "default. Set RAY_DEDUP_LOGS=0 to disable log deduplication.)\x1b[0m",
            "warning: odd",
        ),
        ("(t pid=2) /x/y.py:12: UserWarning: odd [repeated 2x across cluster]", "warning: odd"),
        ("warning: corpus file 'a.txt' is not valid UTF-8", "warning: corpus file 'a.txt' is not valid UTF-8"),
        ("(grid_trainable pid=1, ip=10.0.0.1) Checkpoint successfully created at: Checkpoint(...)", None),
        ("2026-11-30 17:09:05,207\tINFO worker.py:2038 -- Started a local Ray instance.", None),
        ('  File "x.py", line 3, in f: raise ValueError("no")', None),
    ],
)
def test_notice_of(line, note):
    assert console.notice_of(line) == note


def test_session_captures_fds_into_the_log_and_shows_each_warning_once(tmp_path, capfd):
    with console.session(tmp_path, json_mode=False) as con:
        assert not con.interactive  # pytest's capture is not a terminal
        os.write(1, b"\x1b[32m(trainable pid=7)\x1b[0m Checkpoint successfully created\n")
        os.write(2, b"2026-01-01 00:00:00,000\tWARNING tune.py:1 -- slow sync of run 0123456789abcdef\n")
        os.write(2, b"2026-01-01 00:00:01,000\tWARNING tune.py:1 -- slow sync of run fedcba9876543210\n")
        print("plain print to sys.stdout", file=sys.__stdout__, flush=True)  # pytest swaps sys.stdout
        con.say("[2/4] sweep: a stage line")
    cap = capfd.readouterr()
    log = (tmp_path / "logs" / "ray.log").read_text()
    assert "Checkpoint successfully created" in log and "plain print to sys.stdout" in log
    assert "\x1b" not in log and log.count("slow sync of run") == 2
    assert cap.out == "[2/4] sweep: a stage line\n"  # the command's own lines on stdout, nothing of Ray's
    # notices on stderr, each distinct one once (run ids and numbers do not make a message distinct)
    assert cap.err.splitlines()[0] == "WARNING tune.py:1 -- slow sync of run 0123456789abcdef"
    assert "fedcba9876543210" not in cap.err and "Checkpoint" not in cap.err and "plain print" not in cap.err
    assert "1 repeated warnings/errors not shown" in cap.err and "\x1b" not in cap.err
    # the file descriptors are restored
    os.write(1, b"after\n")
    assert capfd.readouterr().out == "after\n"


def test_a_corpus_warning_from_this_process_and_from_trials_is_shown_once(tmp_path, capfd):
    """A corpus warning said by the driver (``warning: ...``), by the first trial (``file.py:N: CorpusWarning:
    ...``) and by Ray's log deduplication for the others (the same line plus ``[repeated 10x across cluster] (Ray
    deduplicates logs by default. ...)``, which the notice cut mid-word) was shown three times; now once."""
    msg = (
        "corpus file '/data/latin.txt' is not valid UTF-8: 2 invalid byte sequence(s) of 54010 bytes replaced by "
        "U+FFFD (convert it to UTF-8 to keep those characters)"
    )
    dedup = (
        " (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see "
        "https://docs.ray.io/en/master/ray-observability/user-guides/configure-logging.html#log-deduplication "
        "for more options.)"
    )
    with console.session(tmp_path, json_mode=False):
        os.write(2, f"warning: {msg}\n".encode())
        os.write(1, f"\x1b[36m(grid_trainable pid=11)\x1b[0m /x/model/data.py:200: CorpusWarning: {msg}\n".encode())
        os.write(1, f"(grid_trainable pid=12) /x/model/data.py:200: CorpusWarning: {msg}"
                    f"\x1b[32m [repeated 10x across cluster]{dedup}\x1b[0m\n".encode())  # fmt: skip
        os.write(1, f"(grid_trainable pid=13) /x/model/data.py:200: CorpusWarning: {msg} [repeated 5x across "
                    "cluster]\n".encode())  # fmt: skip
        os.write(2, b"warning: another message\n")
    err = capfd.readouterr().err.splitlines()
    assert err[:2] == [f"warning: {msg}", "warning: another message"]
    assert "3 repeated warnings/errors not shown" in err[2] and len(err) == 3
    assert (tmp_path / "logs" / "ray.log").read_text().count(msg) == 4  # the log keeps every line


def test_trial_failures_differing_only_in_the_run_id_are_one_notice(tmp_path, capfd):
    """Tune names trials ``run_<16 hex>``: the '_' joined the id to the word before it, so every failed trial's
    "Trial task failed" line was a distinct notice (16 lines for the 16 trials of a smoke grid on an empty corpus)."""
    with console.session(tmp_path, json_mode=False):
        for rid in ("392102c2325fc74a", "2dafe8ee91ccb153", "c0e8508de8c72332"):
            os.write(2, f"ERROR tune_controller.py:1336 -- Trial task failed for trial run_{rid}\n".encode())
        os.write(2, b"ERROR tune_controller.py:1336 -- Trial task failed for trial grid_cafe\n")  # not an id
    err = capfd.readouterr().err.splitlines()
    assert err == [
        "ERROR tune_controller.py:1336 -- Trial task failed for trial run_392102c2325fc74a",
        "ERROR tune_controller.py:1336 -- Trial task failed for trial grid_cafe",
        f"(2 repeated warnings/errors not shown; all output: {tmp_path.resolve() / 'logs' / 'ray.log'})",
    ]


def test_verbose_session_shows_everything_without_escape_codes(tmp_path, capfd):
    with console.session(tmp_path, verbose=True):
        os.write(1, b"\x1b[36m(pid=3)\x1b[0m Checkpoint successfully created\n")
    shown = capfd.readouterr().err
    assert "(pid=3) Checkpoint successfully created" in shown and "\x1b" not in shown


def test_json_session_writes_its_lines_to_stderr(tmp_path, capfd):
    with console.session(tmp_path, json_mode=True) as con:
        con.say("stage line")
    cap = capfd.readouterr()
    assert cap.out == "" and "stage line" in cap.err
    assert not (tmp_path / "logs").exists()  # nothing was captured: no log folder


def test_trial_cells_accepts_single_cells_and_ensembles():
    a, b = {"run_id": "a"}, {"run_id": "b"}
    assert trial_cells({"cell": a}) == [a]
    assert trial_cells({"cells": [a, b]}) == [a, b]
    assert trial_cells({"lr": 0.1}) == [] and trial_cells(None) == []


def _cells(n):
    out = []
    for c in preset_spec("smoke").cells()[:n]:
        d = c.to_dict()
        d["run_id"] = c.run_id
        out.append(d)
    return out


def _planned(cell: dict) -> float:
    """The FLOPs a smoke cell will train, worked out here (F x its token budget D), not by the console's own
    ``planned_flops``, so that a wrong plan there fails the ETA checks."""
    from loopscale.model.accounting import flops_per_token
    from loopscale.sweep.spec import Cell

    run = Cell.from_dict(cell).run
    assert run.tokens == 2048 and run.target_flops is None  # the smoke preset's token budget
    return float(flops_per_token(run.model)) * 2048


def test_grid_view_counts_rate_and_eta(monkeypatch):
    """Counts by trial status (an ensemble trial counts its members), tokens/s over the window from the token
    deltas (members x tokens), ETA = remaining planned FLOPs / FLOP rate; plain lines carry no escape codes."""
    from loopscale.model.accounting import flops_per_token
    from loopscale.sweep.spec import Cell

    clock = [1000.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    cells = _cells(4)
    buf = io.StringIO()
    con = console.Console(buf, interactive=False)
    view = console.GridView(con, total=4)
    ens = SimpleNamespace(trial_id="t1", status="RUNNING", config={"cells": cells[:2]})
    one = SimpleNamespace(trial_id="t2", status="PENDING", config={"cell": cells[2]})
    done = SimpleNamespace(trial_id="t3", status="TERMINATED", config={"cell": cells[3]}, last_result={"done": True})
    trials = [ens, one, done]
    clock[0] += 10
    view.observe(trials, ens, {"tokens": 512, "members": 2})
    clock[0] += 10
    view.observe(trials, ens, {"tokens": 1024, "members": 2})
    assert view.counts == {"done": 1, "running": 2, "pending": 1, "failed": 0}
    assert view.tokens_per_s == pytest.approx(2 * 1024 / 20)
    # FLOPs/token of an ensemble trial: the mean over its members (seed ensembles share one model)
    fpt = sum(float(flops_per_token(Cell.from_dict(c).run.model)) for c in cells[:2]) / 2
    spent = 2 * 1024 * fpt
    remaining = sum(_planned(c) for c in cells[:3]) - spent
    assert view.eta_s == pytest.approx(remaining / (spent / 20), rel=1e-6)
    clock[0] += console.PLAIN_EVERY_S
    view.observe(trials)
    view.close()
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("grid: 1/4 done 1 · running 2 · pending 1 · failed 0")
    assert lines[-1].startswith("grid: 1 runs done, 0 failed, 3 unfinished")
    # not a run's own tokens/s (the report's median), nor "running" trials once the grid is over
    assert "last rate " in lines[-1] and "tokens/s (the trials running at the last reports, together)" in lines[-1]
    assert "\x1b" not in buf.getvalue()
    # Ctrl-C stops every trial as TERMINATED: one whose function had not returned is unfinished, not done
    stopped = SimpleNamespace(trial_id="t4", status="TERMINATED", config={"cells": cells[:2]},
                              last_result={"tokens": 512, "done": False})  # fmt: skip
    view2 = console.GridView(con, total=2)
    view2.observe([stopped])
    assert view2.counts == {"done": 0, "running": 0, "pending": 2, "failed": 0}


def test_resumed_grid_counts_runs_finished_before(monkeypatch):
    """A resumed sweep's display counts the whole grid: runs finished by an earlier command (not in this
    experiment's trials) are done; a restored experiment's own finished trial is not counted twice."""
    buf = io.StringIO()
    monkeypatch.setattr(console, "_VIEW", None)
    monkeypatch.setattr(console, "current", lambda: console.Console(buf, interactive=False))
    cells = _cells(5)
    ids = [c["run_id"] for c in cells]
    restored_done = SimpleNamespace(trial_id="t1", status="TERMINATED", config={"cell": cells[2]},
                                    last_result={"done": True})  # fmt: skip
    left = SimpleNamespace(trial_id="t2", status="PENDING", config={"cells": cells[3:]})
    with console.grid_done_before(ids[:3]):
        console.grid_observe([restored_done, left])
    view = console._VIEW
    assert view.total == 5 and view.prior == 2
    assert view.counts == {"done": 3, "running": 0, "pending": 2, "failed": 0}
    assert view.state()["counts"]["done"] == 3
    console.end_view()
    # how many of them this command trained: none (said "3 runs done" as if it had trained them)
    assert "grid: 3 runs done (3 of them before this command, 0 by it), 0 failed, 2 unfinished" in buf.getvalue()
    # a second experiment of the same command: the runs its restored experiment finished are this command's
    buf.truncate(0)
    with console.grid_done_before(ids[:3], before_command=ids[:1]):
        console.grid_observe([left])
    console.end_view()
    assert "grid: 3 runs done (1 of them before this command, 2 by it), 0 failed, 2 unfinished" in buf.getvalue()
    assert console._GRID_DONE_BEFORE == frozenset()  # the context is left as it was


def test_grid_counts_a_run_done_at_its_final_report_whatever_its_trial_status(monkeypatch):
    """A trial stopped by Ctrl-C after its run's final report (the store has the run) but before Tune called the
    trial done is saved TERMINATED without done; restored, it stays so. The resumed display said "15 runs done, 1
    unfinished" while runs.parquet held all 16 (and an interrupted display one run fewer than was recorded). A run
    whose final report this display saw, or that was recorded before, counts as done whatever its trial's status."""
    buf = io.StringIO()
    monkeypatch.setattr(console, "_VIEW", None)
    monkeypatch.setattr(console, "current", lambda: console.Console(buf, interactive=False))
    cells = _cells(4)
    ids = [c["run_id"] for c in cells]
    stopped = SimpleNamespace(trial_id="t0", status="TERMINATED", config={"cell": cells[0]}, last_result={})
    ens = SimpleNamespace(trial_id="t1", status="RUNNING", config={"cells": cells[1:3]}, last_result={})
    left = SimpleNamespace(trial_id="t2", status="PENDING", config={"cell": cells[3]})
    with console.grid_done_before(ids[:1]):  # the stopped trial's run was recorded by the interrupted command
        console.grid_observe([stopped, ens, left])
        view = console._VIEW
        assert view.counts == {"done": 1, "running": 2, "pending": 1, "failed": 0}
        # the ensemble trial's first member ends: its final report (the store records it now)
        console.grid_observe([stopped, ens, left], ens, {"run_done": True, "run_id": ids[1], "status": "ok"})
        assert view.counts == {"done": 2, "running": 1, "pending": 1, "failed": 0}
        ens.status = "TERMINATED"  # stopped before Tune called it done: its second run never reported
        console.grid_observe([stopped, ens, left])
        assert view.counts == {"done": 2, "running": 0, "pending": 2, "failed": 0}
    console.end_view()
    assert "grid: 2 runs done (1 of them before this command, 1 by it), 0 failed, 2 unfinished" in buf.getvalue()


def _one_running_trial(monkeypatch):
    """A grid display of one RUNNING trial on a clock the test sets: (clock, view, trial)."""
    clock = [0.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    view = console.GridView(console.Console(io.StringIO(), interactive=False), total=1)
    return clock, view, SimpleNamespace(trial_id="t", status="RUNNING", config={"cell": _cells(1)[0]})


def test_grid_view_restarted_trial_does_not_count_negative_tokens(monkeypatch):
    clock, view, t = _one_running_trial(monkeypatch)
    for tok in (1000, 2000, 500):  # a restart from an earlier checkpoint: 500 new tokens
        clock[0] += 5
        view.observe([t], t, {"tokens": tok})
    assert view.tokens_per_s == pytest.approx(500 / 5)  # the restart's 500 new tokens over the 5 s since
    for tok in (1000, 600):  # a restart that says it began at its checkpoint's 400 tokens: 200 new tokens
        clock[0] += 5
        view.observe([t], t, {"tokens": tok, "start_tokens": 400})
    assert view.tokens_per_s == pytest.approx(200 / 5)


def test_grid_view_resumed_trial_rate_counts_only_this_attempts_tokens(monkeypatch):
    # a trial resumed from its checkpoint at 40,000 tokens reports 44,000 ten seconds after the display first saw
    # it: 4,000 tokens trained in 10 s, not 44,000 (the rate read 3x the true one after every --resume)
    clock, view, t = _one_running_trial(monkeypatch)
    view.observe([t])
    clock[0] += 10
    view.observe([t], t, {"tokens": 44_000, "start_tokens": 40_000})
    assert view.tokens_per_s == pytest.approx(4_000 / 10)


def test_grid_view_first_rate_leaves_out_the_trials_start_up(monkeypatch):
    # the trial is seen RUNNING at t = 0 but spends 30 s starting (Ray worker, imports, data) before its first step;
    # its first report at t = 40 says it trained 10 s (attempt_s): 20,000 tokens in 10 s, not in 40 s
    clock, view, t = _one_running_trial(monkeypatch)
    view.observe([t])
    clock[0] = 40.0
    view.observe([t], t, {"tokens": 20_000, "attempt_s": 10.0})
    assert view.tokens_per_s == pytest.approx(20_000 / 10)
    clock[0] = 50.0  # the next report: the time since the previous one, as before
    view.observe([t], t, {"tokens": 25_000, "attempt_s": 20.0})
    assert view.tokens_per_s == pytest.approx(5_000 / 10)
    clock[0] = 100.0  # restarted from its checkpoint at 10,000 tokens: 4,000 new tokens in its 8 s of training
    view.observe([t], t, {"tokens": 14_000, "start_tokens": 10_000, "attempt_s": 8.0})
    assert view.tokens_per_s == pytest.approx(4_000 / 8)


def test_lr_view_best_lr_per_size_and_counts():
    buf = io.StringIO()
    view = console.LRView(console.Console(buf, interactive=False), {"s_size16_r1": (16, 1)}, per_study=3)
    view.record("s_size16_r1", 0.01, "COMPLETE", 3.2)
    view.record("s_size16_r1", 0.03, "COMPLETE", 3.1)
    view.record("s_size16_r1", 0.1, "PRUNED", None)
    assert view.best == {(16, 1): (3.1, 0.03)} and view.states == {"COMPLETE": 2, "PRUNED": 1, "FAIL": 0}
    view.close()
    assert "done 2 · pruned 1 · failed 0 · best size 16 r 1: lr 0.03 (3.100)" in buf.getvalue()


def test_lr_view_eta_from_trials_finished_so_far(monkeypatch):
    """ETA = time so far x trials left / trials finished, counted down between trials; none before the first."""
    clock = [100.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    buf = io.StringIO()
    view = console.LRView(console.Console(buf, interactive=False), {"a": (16, 1), "b": (16, 2)}, per_study=4)
    assert view.eta_s is None and view.state()["eta_s"] is None
    clock[0] += 30
    view.record("a", 0.01, "COMPLETE", 3.2)  # 1 of 8 in 30 s: 7 left
    assert view.eta_s == pytest.approx(210.0)
    clock[0] += 10
    view.record("a", 0.1, "PRUNED", None)  # 2 of 8 in 40 s: 6 left
    assert view.state()["eta_s"] == pytest.approx(120.0)
    clock[0] += 50  # no trial ended since: counted down
    assert view.eta_s == pytest.approx(70.0) and "· ETA 1m10s ·" in view._text()
    # next to a bar: the ETA first; on a terminal under 80 columns only the ETA and the failed count
    assert view._short() == ("ETA 1m10s · done 1 · pruned 1 · failed 0", "ETA 1m10s · failed 0")
    clock[0] += 500
    assert view.eta_s == 0.0
    for lr in (0.02, 0.03, 0.04, 0.05, 0.06, 0.07):
        view.record("b", lr, "COMPLETE", 3.0 + lr)
    assert view.eta_s == 0.0 and "ETA" not in view._text()
    view.close()
    assert "ETA" not in buf.getvalue().splitlines()[-1]  # the summary line has none


def test_lr_view_counts_the_trials_a_resumed_study_finished_before(monkeypatch, tmp_path):
    """--resume of a study stopped after 2 of its 3 trials: those count as finished (and their best LR), so the
    counts reach the total when the last study ends, and the ETA is of the trials left at this command's rate."""
    clock = [100.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    con = console.Console(io.StringIO(), interactive=False)
    con.out_dir = tmp_path
    before = [("a", 0.01, "COMPLETE", 3.2), ("a", 0.1, "PRUNED", None)]
    view = console.LRView(con, {"a": (16, 1), "b": (16, 2)}, per_study=3, before=before)
    assert (view.prior, view.total, view.eta_s) == (2, 6, None)
    assert view.states == {"COMPLETE": 1, "PRUNED": 1, "FAIL": 0} and view.best == {(16, 1): (3.2, 0.01)}
    clock[0] += 20
    view.record("a", 0.03, "COMPLETE", 3.1)  # 3 of 6; 1 in this command, in 20 s: 3 left
    assert view.eta_s == 60.0
    for lr in (0.02, 0.04):
        clock[0] += 10
        view.record("b", lr, "COMPLETE", 3.0 + lr)
    clock[0] += 10
    view.record("b", 0.2, "PRUNED", None)
    view.close()
    p = json.loads((tmp_path / "logs" / "progress.json").read_text())
    assert (p["finished"], p["total"], p["eta_s"]) == (True, 6, 0.0)
    assert p["trials"] == {"COMPLETE": 4, "PRUNED": 2, "FAIL": 0}
    assert p["best"] == [[16, 1, 0.03, 3.1], [16, 2, 0.02, 3.02]]
    assert con.stream.getvalue().splitlines()[-1] == (
        "tune-lr: 6 trials (2 of them before this command) in 50s: done 4 · pruned 2 · failed 0 · best size 16 "
        "r 1: lr 0.03 (3.100); size 16 r 2: lr 0.02 (3.020)"
    )


def test_bootstrap_view_follows_run_chunks(monkeypatch):
    """run_chunks (serial) reports refits through the listener; the view sums the refits of each call."""
    from loopscale.fit import bootstrapping

    monkeypatch.setattr(bootstrapping, "_refit_chunk", lambda shared, ks, W: {"n": len(ks)})
    buf = io.StringIO()
    monkeypatch.setattr(console, "_CURRENT", console.Console(buf, interactive=False))
    with console.bootstrap_view():
        bootstrapping.run_chunks({}, [([0, 1, 2], None), ([3, 4], None)], 1, None)
        bootstrapping.run_chunks({}, [([0], None)], 1, None)
        assert console._VIEW.done == 1
    assert buf.getvalue().startswith("bootstrap: 6 refits (2 bootstraps: 5 + 1)")
    assert console._VIEW is None


def test_bootstrap_summary_names_the_joint_fit_and_the_per_r_intervals(monkeypatch):
    """`run` printed 'bootstrap: 220 refits (2 bootstraps: 100 + 120)' for B = 100, and after a resume
    '(4 bootstraps: 100 + 40 + 40 + 40)', with nothing saying what the refits beyond B are."""
    from loopscale.fit import bootstrapping

    monkeypatch.setattr(bootstrapping, "_refit_chunk", lambda shared, ks, W: {"n": len(ks)})
    for per_r in ([list(range(12))], [list(range(4))] * 3):
        buf = io.StringIO()
        monkeypatch.setattr(console, "_CURRENT", console.Console(buf, interactive=False))
        with console.bootstrap_view(B=10):
            bootstrapping.run_chunks({}, [(list(range(10)), None)], 1, None)
            for ks in per_r:
                bootstrapping.run_chunks({}, [(ks, None)], 1, None)
        assert buf.getvalue().startswith(
            "bootstrap: 22 refits (joint fit B = 10; 12 for the intervals of phi per r, the identification check's)"
        ), buf.getvalue()


def test_bootstrap_summary_after_a_stop_says_what_was_done(monkeypatch):
    """A Ctrl-C in the bootstrap's first chunk printed 'bootstrap: 100 refits (joint fit B = 100) in 2s' although
    none had been done: the summary summed the planned refits. It now says how many of them were done."""
    from loopscale.fit import bootstrapping

    calls = []

    def chunk(shared, ks, W):
        calls.append(len(ks))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"n": len(ks)}

    monkeypatch.setattr(bootstrapping, "_refit_chunk", chunk)
    buf = io.StringIO()
    monkeypatch.setattr(console, "_CURRENT", console.Console(buf, interactive=False))
    with pytest.raises(KeyboardInterrupt), console.bootstrap_view(B=10):
        bootstrapping.run_chunks({}, [(list(range(4)), None), (list(range(4, 10)), None)], 1, None)
    assert buf.getvalue().startswith("bootstrap: stopped after 4 of 10 refits (joint fit B = 10)"), buf.getvalue()


def test_session_restores_descriptors_on_interrupt(tmp_path, capfd):
    with pytest.raises(KeyboardInterrupt), console.session(tmp_path):
        raise KeyboardInterrupt
    sys.__stdout__.write("visible\n")
    sys.__stdout__.flush()
    assert "visible" in capfd.readouterr().out


def test_a_long_notice_keeps_its_start_and_end():
    note = console.notice_of("x.py:1: UserWarning: " + "p" * 900 + " was moved aside")
    assert len(note) <= console.NOTICE_MAX and note.startswith("warning: ppp")
    assert note.endswith("was moved aside") and " … " in note


def _tune_fetch_metrics_warning(tmp_path, error: Exception | None = None) -> None:
    """Make Ray Tune's ExperimentAnalysis log its "Failed to fetch metrics" warning, as ``Tuner.fit`` does for a trial
    that reported but whose result files are not in the experiment folder (stopped before its first sync); with
    ``error``, reading the files fails with that error instead."""
    import pyarrow.fs as pafs
    from ray.tune.analysis.experiment_analysis import ExperimentAnalysis

    trial = SimpleNamespace(
        trial_id="abc123",
        last_result={"val_loss": 3.0},
        storage=SimpleNamespace(trial_fs_path=str(tmp_path / "never_synced"), storage_filesystem=pafs.LocalFileSystem()),
    )

    def fetch(t):
        if error is not None:
            raise error
        return ExperimentAnalysis._fetch_trial_dataframe(fake, t)

    fake = SimpleNamespace(trials=[trial], _fetch_trial_dataframe=fetch)
    ExperimentAnalysis._fetch_trial_dataframes(fake)


def test_tune_metrics_of_interrupted_trials_stay_off_the_console(tmp_path, capfd):
    """After Ctrl-C, Tune warns that it could not read the metrics files of trials stopped before their first sync
    (loopscale's results do not come from them): in ray.log, not on the console. Another failure to read them, and
    other Tune warnings, still reach the console."""
    import logging

    stream = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)  # fd 2 as it is when used
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"))  # Ray's
    log = logging.getLogger(console.TUNE_ANALYSIS_LOGGER)
    log.addHandler(handler)
    old_level, old_propagate = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False  # only through fd 2 (Ray's own handler writes to pytest's sys.stderr)
    try:
        with console.session(tmp_path, json_mode=False):
            _tune_fetch_metrics_warning(tmp_path)
            log.warning("Some other Tune warning")
            stream.flush()
        err = capfd.readouterr().err
        assert "Failed to fetch metrics" not in err and "Some other Tune warning" in err, err
        with console.session(tmp_path, json_mode=False):  # a new session: its notices are not repeats
            _tune_fetch_metrics_warning(tmp_path, error=ValueError("result.json is not JSON"))
            stream.flush()
        assert "Failed to fetch metrics for 1 trial(s)" in capfd.readouterr().err
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
        log.propagate = old_propagate
    assert "Failed to fetch metrics" in (tmp_path / "logs" / "ray.log").read_text()
    assert "were not found" in (tmp_path / "logs" / "ray.log").read_text()
    # outside a session nothing is demoted
    assert not logging.getLogger(console.TUNE_ANALYSIS_LOGGER).filters


@contextlib.contextmanager
def _logging_to_fd2(name: str):
    """Logger ``name`` at INFO writing only to fd 2 (as Ray's handler does when a command runs), in Ray's format;
    yields ``(logger, stream)`` and restores the logger after."""
    import logging

    stream = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(filename)s:%(lineno)s -- %(message)s"))
    log = logging.getLogger(name)
    log.addHandler(handler)
    old_level, old_propagate = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield log, stream
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
        log.propagate = old_propagate


def test_tunes_stop_signal_warnings_stay_off_the_console(tmp_path, capfd):
    """On a Ctrl-C of `run` or `sweep` while the grid trained, Tune's "Stop signal received ..." and "Experiment has
    been interrupted ..." warnings reached the console between the progress line and the command's own
    `interrupted: ...` line, which says the same with what to run next: they stay in ray.log (the first said once in
    the command's words: Tune saves its state first, a second Ctrl-C skips that), and other warnings of that logger
    still reach the console."""
    import logging

    with _logging_to_fd2(console.TUNE_LOGGER) as (log, stream):
        with console.session(tmp_path, json_mode=False):
            log.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run. This will try to "
                        "checkpoint the experiment state one last time. Press CTRL+C (or send SIGINT/SIGKILL/SIGTERM) "
                        "to skip.")  # fmt: skip
            log.warning("Experiment has been interrupted, but the most recent state was saved.\nResume experiment "
                        "with: Tuner.restore(path=...)")  # fmt: skip
            log.warning("Another warning of tune.py")
            stream.flush()
            log.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending Ray Tune run.")  # a second Ctrl-C
            stream.flush()
        err = capfd.readouterr().err
        assert "Stop signal received" not in err and "Experiment has been interrupted" not in err, err
        assert "Another warning of tune.py" in err
        # said in the command's words instead, once: the state is saved before the `interrupted:` line comes
        assert err.count(console.STOPPING_LINE) == 1, err
    kept = (tmp_path / "logs" / "ray.log").read_text()
    assert "Stop signal received" in kept and "Experiment has been interrupted" in kept
    assert not logging.getLogger(console.TUNE_LOGGER).filters


def test_tune_metrics_never_written_matches_only_missing_files():
    missing = ("Failed to fetch metrics for 2 trial(s):\n- t1: FileNotFoundError('Could not fetch metrics for t1: both "
               "result.json and progress.csv were not found at /x')\n- t2: FileNotFoundError('... were not found at /y')")  # fmt: skip
    assert console.tune_metrics_never_written(missing)
    assert not console.tune_metrics_never_written(missing + "\n- t3: JSONDecodeError('Expecting value')")
    assert not console.tune_metrics_never_written("Failed to fetch metrics for 0 trial(s):")
    assert not console.tune_metrics_never_written("Some other warning:\n- FileNotFoundError were not found")


def test_tune_sync_racing_a_temp_file_stays_off_the_console(tmp_path, capfd):
    """Tune's background copy of its state sometimes lists the temporary file of an atomic save that is renamed
    before the copy reaches it; Tune logs an ERROR with a FileNotFoundError traceback (seen in 1 of ~40 smoke runs),
    and copies again at the next snapshot. In ray.log, not on the console; another failure to save still shows."""
    import logging

    stream = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(filename)s:%(lineno)s -- %(message)s"))
    log = logging.getLogger(console.TUNE_SYNC_LOGGER)
    log.addHandler(handler)
    old_level, old_propagate = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False
    at = f"Saving experiment state to storage at '{tmp_path}/tune/grid_x_001' failed with exception: "
    staged = "/tmp/ray/session_1/artifacts/2026/grid_x_001/driver_artifacts/"

    def fail(exc):
        try:
            raise exc
        except Exception:
            log.error(at, exc_info=True)

    try:
        with console.session(tmp_path, json_mode=False):
            fail(FileNotFoundError(f"Failed to open local file '{staged}.aa4d-tmp-basic-variant-state-1.json'"))
            stream.flush()
        err = capfd.readouterr().err
        assert "Saving experiment state" not in err and "FileNotFoundError" not in err, err
        with console.session(tmp_path, json_mode=False):
            fail(PermissionError(f"Permission denied: '{tmp_path}/tune/grid_x_001'"))
            stream.flush()
        err = capfd.readouterr().err
        assert "Saving experiment state" in err and "PermissionError" in err, err
        # the same failure reported by the next copy: the syncer's WARNING with the traceback inside its message
        syncer = logging.getLogger(console.SYNCER_LOGGER)
        syncer.addHandler(handler)
        syncer_propagate, syncer.propagate = syncer.propagate, False
        tb = ('Traceback (most recent call last):\n  File "syncer.py", line 69, in entrypoint\n'
              f"FileNotFoundError: [Errno 2] Failed to open local file '{staged}.bb5e-tmp-searcher-state-1.pkl'")  # fmt: skip
        with console.session(tmp_path, json_mode=False):
            syncer.warning(f"Last sync command failed with the following error:\n{tb}")
            stream.flush()
        err = capfd.readouterr().err
        assert "Last sync command failed" not in err and "FileNotFoundError" not in err, err
        with console.session(tmp_path, json_mode=False):
            syncer.warning("Last sync command failed with the following error:\nOSError: disk full")
            stream.flush()
        assert "OSError: disk full" in capfd.readouterr().err
    finally:
        log.removeHandler(handler)
        syncer = logging.getLogger(console.SYNCER_LOGGER)
        if handler in syncer.handlers:
            syncer.removeHandler(handler)
            syncer.propagate = syncer_propagate
        log.setLevel(old_level)
        log.propagate = old_propagate
    text = (tmp_path / "logs" / "ray.log").read_text()
    assert "tmp-basic-variant-state" in text
    assert "Last sync command failed with the following error: ... FileNotFoundError" in text
    assert not logging.getLogger(console.TUNE_SYNC_LOGGER).filters
    assert not logging.getLogger(console.SYNCER_LOGGER).filters


def test_grid_display_starts_with_the_experiment_not_the_first_result(tmp_path, capfd, monkeypatch):
    """Trials of the default job report once a minute or so, after compiling: the grid display (and progress.json,
    which `loopscale status` reads) starts and moves from Tune's loop, before any result; at most once per
    STEP_PROGRESS_EVERY_S; the summary counts the time from the experiment's start."""
    import json

    from loopscale.sweep import callbacks

    clock = [5000.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    cells = _cells(4)
    trials = [SimpleNamespace(trial_id="t1", status="RUNNING", config={"cells": cells[:2]}),
              SimpleNamespace(trial_id="t2", status="PENDING", config={"cells": cells[2:]})]  # fmt: skip
    with console.session(tmp_path, json_mode=False):
        rec = callbacks._recorder_cls()(str(tmp_path), {c["run_id"]: c for c in cells})
        rec.on_step_end(iteration=1, trials=trials)
        progress = json.loads((tmp_path / "logs" / console.PROGRESS_NAME).read_text())
        assert progress["stage"] == "grid" and progress["counts"] == {"done": 0, "running": 2, "pending": 2, "failed": 0}
        assert progress["updated_at"] == 5000.0
        clock[0] += callbacks.STEP_PROGRESS_EVERY_S / 2  # throttled: no update
        trials[1].status = "RUNNING"
        rec.on_step_end(iteration=2, trials=trials)
        assert json.loads((tmp_path / "logs" / console.PROGRESS_NAME).read_text())["counts"]["running"] == 2
        clock[0] += console.PLAIN_EVERY_S + console.HEARTBEAT_S
        rec.on_step_end(iteration=3, trials=trials)
        progress = json.loads((tmp_path / "logs" / console.PROGRESS_NAME).read_text())
        assert progress["counts"]["running"] == 4 and progress["updated_at"] == clock[0]
        rec.on_experiment_end(trials=trials)
    out = capfd.readouterr().out.splitlines()
    assert out[0].startswith("grid: 0/4 done 0 · running 4 · pending 0")  # the plain line of a running grid
    assert out[-1].startswith("grid: 0 runs done, 0 failed, 4 unfinished in 1m06s"), out


def test_progress_json_follows_a_finished_trial_at_once(tmp_path, monkeypatch):
    """progress.json was written at most every HEARTBEAT_S: `loopscale status` showed 'tune trials (live): pending
    14, running 2' beside run records of trials finished since (short trials finish several within 5 s). A change of
    the counts is written at once; an unchanged display still waits for HEARTBEAT_S."""
    import json

    clock = [5000.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    cells = _cells(4)
    trials = [SimpleNamespace(trial_id="t1", status="RUNNING", config={"cells": cells[:2]}, last_result={}),
              SimpleNamespace(trial_id="t2", status="RUNNING", config={"cells": cells[2:]}, last_result={})]  # fmt: skip
    read = lambda: json.loads((tmp_path / "logs" / console.PROGRESS_NAME).read_text())  # noqa: E731
    with console.session(tmp_path, json_mode=False):
        console.grid_observe(trials)
        assert read()["trials"] == {"RUNNING": 2} and read()["updated_at"] == 5000.0
        clock[0] += 1.0
        trials[0].status, trials[0].last_result = "TERMINATED", {"done": True}
        console.grid_observe(trials)
        assert read()["trials"] == {"TERMINATED": 1, "RUNNING": 1} and read()["counts"]["done"] == 2
        assert read()["updated_at"] == 5001.0
        clock[0] += 1.0
        console.grid_observe(trials)  # nothing changed: no write before HEARTBEAT_S
        assert read()["updated_at"] == 5001.0
        console.end_view()


def test_grid_rate_is_kept_and_eta_counts_down_between_reports(monkeypatch):
    """The default job's trials report about once a minute: a display update between reports (Tune's loop) found
    no report in the last minute and showed '0 tokens/s · ETA ?'; now the last rate stays and the ETA counts down."""
    clock = [2000.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    cells = _cells(2)
    buf = io.StringIO()
    view = console.GridView(console.Console(buf, interactive=False), total=2)
    t = SimpleNamespace(trial_id="t1", status="RUNNING", config={"cells": cells})
    view.observe([t])  # before any report: nothing measured yet
    assert view.tokens_per_s is None and view.eta_s is None
    clock[0] += 30
    view.observe([t], t, {"tokens": 512, "members": 2})
    rate, eta = view.tokens_per_s, view.eta_s
    assert rate == pytest.approx(2 * 512 / 30) and eta > 0
    clock[0] += 61  # no report in the last minute
    view.observe([t])
    assert view.tokens_per_s == rate and view.eta_s == pytest.approx(max(0.0, eta - 61))
    clock[0] += 10 * eta
    view.observe([t])
    assert view.eta_s == 0.0
    view.close()
    assert "0 tokens/s" not in buf.getvalue() and "ETA ?" not in buf.getvalue().split("\n", 1)[1]


def test_grid_rate_is_each_running_trials_rate_since_its_previous_report(monkeypatch):
    """The default job: two ensemble trials of 16 report 256,000 tokens per member every ~75 s. A 60 s window held
    both trials' reports at each report and showed 2 x 16 x 256,000 / 60 = 136,533 tokens/s all sweep long, 25 %
    above the true 109,227; each trial's rate is now its new tokens over the time since its previous report."""
    clock = [0.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    cells = _cells(4)
    view = console.GridView(console.Console(io.StringIO(), interactive=False), total=4)
    a = SimpleNamespace(trial_id="a", status="RUNNING", config={"cells": cells[:2]})
    b = SimpleNamespace(trial_id="b", status="RUNNING", config={"cells": cells[2:]})
    view.observe([a, b])  # Tune's loop sees both running from the start
    for k in range(1, 5):
        clock[0] = 75.0 * k
        view.observe([a, b], a, {"tokens": 256_000 * k, "members": 16})
        clock[0] += 0.5
        view.observe([a, b], b, {"tokens": 256_000 * k, "members": 16})
    assert view.tokens_per_s == pytest.approx(2 * 16 * 256_000 / 75.0, rel=1e-3)
    b.status = "TERMINATED"  # a finished trial's rate no longer counts
    clock[0] = 375.0
    view.observe([a, b], a, {"tokens": 256_000 * 5, "members": 16})
    assert view.tokens_per_s == pytest.approx(16 * 256_000 / 75.0, rel=1e-3)


@pytest.mark.parametrize(
    ("columns", "shows"), [(80, "run 32 · wait 319 · failed 1"), (120, "32 running · 319 pending · 1 failed")]
)
def test_grid_bar_keeps_its_counts_on_a_narrow_terminal(monkeypatch, columns, shows):
    """On an 80-column terminal the text beside the bar was cut to "ETA 25m · 160,000 tok/s · 32 r…": the
    pending and failed counts were lost. The bar now narrows and a shorter text is shown, whole."""
    monkeypatch.setenv("COLUMNS", str(columns))
    clock = [1000.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    cells = []
    for c in preset_spec("cpu").cells():
        d = c.to_dict()
        d["run_id"] = c.run_id
        cells.append(d)
    status = ["RUNNING"] * 32 + ["ERROR"] + ["PENDING"] * (len(cells) - 33)
    trials = [SimpleNamespace(trial_id=f"t{i}", status=s, config={"cell": c})
              for i, (s, c) in enumerate(zip(status, cells, strict=True))]  # fmt: skip
    buf = io.StringIO()
    view = console.GridView(console.Console(buf, interactive=True), total=len(cells))
    clock[0] += 30
    view.observe(trials, trials[0], {"tokens": 65536})
    view._progress.refresh()
    view._progress.stop()
    lines = [console.strip_ansi(x).rstrip() for x in buf.getvalue().splitlines() if "grid" in x]
    assert lines and all(len(x) <= columns for x in lines), lines
    assert lines[-1].endswith(shows) and "ETA " in lines[-1], lines[-1]
    assert len(cells) == 352 and "…" not in lines[-1]


def test_bootstrap_summary_says_how_many_planned_refits_failed(monkeypatch):
    """B = 20 with 5 resamples that found no non-degenerate draw in 1000 tries printed 'bootstrap: 15 refits (15)':
    the view counted the refits run, not the B planned, and said nothing of the failures (only the report did). It
    now says how many of the planned refits were ok and how many failed, and still names the joint fit; the per-r
    intervals' refits are counted once, whether run here or as tasks."""
    import numpy as np
    import pandas as pd

    from loopscale.fit import bootstrapping
    from loopscale.fit.identify import per_r_phi

    rows = []
    for D in (1e6, 3e6, 1e7):
        for r in (1, 2, 4):
            for d in (64, 96, 128):
                n_once, n_rec = 4.0 * d * d, 8.0 * d * d
                loss = 1.7 + 30 * (n_once + r**0.5 * n_rec) ** -0.3 + 400 * D**-0.3 + 0.001 * ((d + r) % 3)
                rows.append({"budget": D, "r": r, "N_once": n_once, "N_rec": n_rec, "D": D, "loss": loss})
    table = pd.DataFrame(rows)
    real = bootstrapping.draw_weights

    def five_fail(*args, **kwargs):
        W, ok, kinds, tries = real(*args, **kwargs)
        ok[:5] = False  # as if no non-degenerate draw was found in 1000 tries
        return W, ok, kinds, tries

    monkeypatch.setattr(bootstrapping, "draw_weights", five_fail)
    buf = io.StringIO()
    monkeypatch.setattr(console, "_CURRENT", console.Console(buf, interactive=False))
    with console.bootstrap_view(B=20):
        res = bootstrapping.bootstrap(table, B=20, starts=5, workers=1)
    assert res.n_failed >= 5
    line = buf.getvalue().splitlines()[-1]
    ok = 20 - res.n_failed
    assert line.startswith(f"bootstrap: {ok} of 20 refits ok, {res.n_failed} failed (joint fit B = 20: "
                           f"{res.n_failed} failed) in "), line  # fmt: skip
    # the per-r intervals (B = 4 each for r = 2 and 4), serially and as tasks: counted once each
    monkeypatch.setattr(bootstrapping, "draw_weights", real)

    def as_tasks(fn, shared, items, address=None):  # in-process, but as a worker: the driver's listeners unheard
        saved = list(bootstrapping._LISTENERS)
        bootstrapping._LISTENERS.clear()
        try:
            return [fn(shared, it) for it in items]
        finally:
            bootstrapping._LISTENERS.extend(saved)

    for on_ray in (False, True):
        if on_ray:
            monkeypatch.setattr(bootstrapping, "ray_running", lambda address=None: True)
            monkeypatch.setattr(bootstrapping, "map_tasks", as_tasks)
        buf = io.StringIO()
        monkeypatch.setattr(console, "_CURRENT", console.Console(buf, interactive=False))
        with console.bootstrap_view(B=20):
            out = per_r_phi(table, starts=5, B=4, workers=1)
        assert "boot_ok" not in out.columns
        line = buf.getvalue().splitlines()[-1]
        assert line.startswith("bootstrap: 8 refits (8 for the intervals of phi per r, the identification check's)")
        assert np.isfinite(out["phi"]).all()


def test_bootstrap_progress_lines_say_which_bootstrap_they_count(monkeypatch):
    """A run's analysis runs several bootstraps in a row; its progress lines read 'bootstrap: 176/200 refits', then
    'bootstrap: 12/194 refits', as if the count went back. Each line now names its bootstrap and what it is for."""
    from loopscale.fit import bootstrapping

    clock = [1000.0]

    def tick():
        clock[0] += console.PLAIN_EVERY_S + 1  # every update is due for a plain line
        return clock[0]

    monkeypatch.setattr(console.time, "time", tick)
    monkeypatch.setattr(bootstrapping, "_refit_chunk", lambda shared, ks, W: {"n": len(ks)})
    buf = io.StringIO()
    monkeypatch.setattr(console, "_CURRENT", console.Console(buf, interactive=False))
    with console.bootstrap_view(B=10):
        bootstrapping.run_chunks({}, [(list(range(10)), None)], 1, None)
        bootstrapping.run_chunks({}, [(list(range(4)), None)], 1, None)
    lines = [ln for ln in buf.getvalue().splitlines() if "/" in ln.split(" refits")[0]]
    assert "bootstrap: 10/10 refits (bootstrap 1, joint fit)" in lines, lines
    assert "bootstrap: 4/4 refits (bootstrap 2, phi per r or variant comparison)" in lines, lines
    # the variant comparison's calls have B refits too: they were called 'joint fit'; the phase names them now
    buf.truncate(0)
    buf.seek(0)
    with console.bootstrap_view(B=10):
        with bootstrapping.bootstrap_phase("variants"):
            bootstrapping.run_chunks({}, [(list(range(10)), None)], 1, None)
        with bootstrapping.bootstrap_phase("per_r"):
            bootstrapping.run_chunks({}, [(list(range(10)), None)], 1, None)
        bootstrapping.run_chunks({}, [(list(range(10)), None)], 1, None)
    lines = [ln for ln in buf.getvalue().splitlines() if "/" in ln.split(" refits")[0]]
    assert "bootstrap: 10/10 refits (bootstrap 1, variant comparison)" in lines, lines
    assert "bootstrap: 10/10 refits (bootstrap 2, phi per r)" in lines, lines
    assert "bootstrap: 10/10 refits (bootstrap 3, joint fit)" in lines, lines
    assert bootstrapping.current_phase() is None


def test_grid_rate_counts_a_new_trial_before_its_first_report(monkeypatch):
    """Two trials share the workers; when one ends, the next starts and has not reported yet. The other trial's next
    report showed the rate halved and the ETA doubled until the new trial's first report (the grid display swung at
    every trial change). A running trial without a report now counts at the mean FLOP rate of those that reported."""
    from loopscale.model.accounting import flops_per_token
    from loopscale.sweep.spec import Cell

    clock = [0.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    cells = _cells(3)
    view = console.GridView(console.Console(io.StringIO(), interactive=False), total=3)
    a = SimpleNamespace(trial_id="a", status="RUNNING", config={"cell": cells[0]})
    b = SimpleNamespace(trial_id="b", status="RUNNING", config={"cell": cells[1]})
    c = SimpleNamespace(trial_id="c", status="PENDING", config={"cell": cells[2]})
    view.observe([a, b, c])
    clock[0] = 10.0
    view.observe([a, b, c], a, {"tokens": 1000})
    view.observe([a, b, c], b, {"tokens": 1000})
    assert view.tokens_per_s == pytest.approx(200.0)
    fps_b = 100.0 * float(flops_per_token(Cell.from_dict(cells[1]).run.model))
    a.status, a.last_result, c.status = "TERMINATED", {"done": True}, "RUNNING"
    view.observe([a, b, c])  # c started; it has not reported
    clock[0] = 20.0
    view.observe([a, b, c], b, {"tokens": 2000})
    fpt_c = float(flops_per_token(Cell.from_dict(cells[2]).run.model))
    assert view.tokens_per_s == pytest.approx(100.0 + fps_b / fpt_c)  # not b's 100 tokens/s alone
    remaining = _planned(cells[1]) - 2000 * fps_b / 100.0 + _planned(cells[2])
    assert view.eta_s == pytest.approx(remaining / (2 * fps_b))


def test_grid_counts_a_run_its_trial_reports_failed_as_failed(monkeypatch):
    """A trial that reports its run failed (a corpus content error, not retried) ends TERMINATED like a finished
    one; the display counted that run as done ("16 runs done, 0 failed" while none trained)."""
    clock = [0.0]
    monkeypatch.setattr(console.time, "time", lambda: clock[0])
    cells = _cells(2)
    buf = io.StringIO()
    view = console.GridView(console.Console(buf, interactive=False), total=2)
    a = SimpleNamespace(trial_id="a", status="RUNNING", config={"cell": cells[0]})
    b = SimpleNamespace(trial_id="b", status="RUNNING", config={"cell": cells[1]})
    view.observe([a, b], a, {"run_done": True, "run_id": cells[0]["run_id"], "status": "failed"})
    view.observe([a, b], b, {"run_done": True, "run_id": cells[1]["run_id"], "status": "ok"})
    for t in (a, b):
        t.status, t.last_result = "TERMINATED", {"done": True}
    view.observe([a, b])
    assert view.counts == {"done": 1, "running": 0, "pending": 0, "failed": 1}
    view.close()
    assert "grid: 1 runs done, 1 failed" in buf.getvalue()


def test_status_names_which_bootstrap_of_the_fit_its_refit_count_is_of(tmp_path):
    """`status` during a run's fit printed 'bootstrap: 200 of 200 refits' while the console showed '72/200 refits
    (bootstrap 3, joint fit)': progress.json held the last call's count until the next heartbeat, and said nothing
    of which call. A new call is written at once, with its label and the calls that ended before it."""
    import json

    from loopscale.sweep.status import collect_status, format_status

    out = tmp_path / "run"
    (out / "logs").mkdir(parents=True)
    (out / "run_meta.json").write_text("{}")
    con = console.Console(io.StringIO(), interactive=False)
    con.out_dir = out  # as console.session sets it for a command writing into the folder
    view = console.BootstrapView(con, B=200)
    for done in (0, 120, 200):  # bootstrap 1 (the joint fit) ends
        view.step(done, 200)
    view.step(0, 200)  # bootstrap 2 starts: written now, not HEARTBEAT_S later
    doc = json.loads((out / "logs" / "progress.json").read_text())
    assert (doc["done"], doc["call"], doc["calls_ended"], doc["refits_ended"]) == (0, "bootstrap 2, joint fit", 1, 200)
    view.step(72, 200)
    view.heartbeat()
    line = next(ln for ln in format_status(collect_status(out)) if ln.startswith("bootstrap:"))
    assert line == "bootstrap: 72 of 200 refits (bootstrap 2, joint fit); 1 bootstrap of 200 refits ended before it"


def test_the_variant_comparison_and_per_r_bootstraps_run_in_their_phase(monkeypatch):
    """compare_variants and per_r_phi mark their bootstraps with their phase while they run (the console names a
    running call by it); outside them no phase is set."""
    from loopscale.fit import bootstrapping, identify, variants

    seen = []
    monkeypatch.setattr(variants, "read_table", lambda t: seen.append(bootstrapping.current_phase()) or t)
    monkeypatch.setattr(identify, "_frame", lambda t: seen.append(bootstrapping.current_phase()) or t)
    import pandas as pd

    with pytest.raises(ValueError):
        variants.compare_variants(pd.DataFrame({"x": [1]}), B=0)
    with pytest.raises((ValueError, KeyError)):
        identify.per_r_phi(pd.DataFrame({"r": [1, 1]}))
    assert seen == ["variants", "per_r"] and bootstrapping.current_phase() is None


def test_a_bootstrap_phase_is_its_own_threads():
    """The phase was one list for the whole process: two fits in threads (a notebook) read each other's phase."""
    import threading

    from loopscale.fit.bootstrapping import bootstrap_phase, current_phase

    seen = {}
    started = threading.Barrier(2)

    def fit(name: str) -> None:
        with bootstrap_phase(name):
            started.wait(timeout=10)  # both inside their phase at once
            seen[name] = current_phase()
            started.wait(timeout=10)

    threads = [threading.Thread(target=fit, args=(n,)) for n in ("variants", "per_r")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert seen == {"variants": "variants", "per_r": "per_r"} and current_phase() is None


def test_a_log_that_cannot_be_written_still_drains_the_pipe(tmp_path, capfd):
    """On a full disk the capture thread died at its first failed write to ray.log; the pipe behind fds 1 and 2 then
    broke, every later print of the driver raised BrokenPipeError, and Typer turned that into a silent exit 1. The
    log is given up with one warning and the pipe is drained on (the command's own lines still reach the console)."""
    (tmp_path / "logs").write_text("a file where the logs folder would go")  # mkdir of logs/ raises OSError
    with console.session(tmp_path, json_mode=False) as con:
        for i in range(3000):  # far more than a pipe's 64 KiB buffer: a dead reader would block or break here
            os.write(2, f"2026-01-01 00:00:00,000\tINFO line {i:05d} of Ray's output, kept nowhere\n".encode())
        os.write(2, b"2026-01-01 00:00:01,000\tWARNING tune.py:1 -- a warning after the log failed\n")
        con.say("[2/4] sweep: still said")
    cap = capfd.readouterr()
    assert cap.out == "[2/4] sweep: still said\n"
    assert "warning: Ray's output can no longer be written to" in cap.err
    assert "a warning after the log failed" in cap.err
    assert (tmp_path / "logs").is_file()
