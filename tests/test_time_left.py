"""The training time left in a folder with recorded runs: predicted from the FLOP/s its own ok runs trained at, in
`run --dry-run` (``est_train_min_left``) and in `loopscale status` of a stopped folder (``time.train_left``)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopscale.model.train import resolve_tokens
from loopscale.sweep.design_cmd import OVERHEAD_S, training_time_left
from loopscale.sweep.presets import preset_spec
from loopscale.sweep.spec import parse_spec, spec_to_yaml
from loopscale.sweep.status import collect_status, format_status
from loopscale.sweep.store import ResultsStore, run_record

RATE = {16: 1e8, 32: 4e8}
"""Training FLOP/s per run of each width in the records these tests write (one slot)."""


def _two_seeds():
    """The smoke grid at 2 seeds a cell: 32 runs, each cell's 2 seeds one seed-ensemble trial on CPU."""
    spec = parse_spec({**preset_spec("smoke").model_dump(mode="python"), "seeds": 2})
    assert spec.ensemble_members() >= 2
    return spec


def _C(cell) -> float:
    from loopscale.model.accounting import flops_per_token

    return float(flops_per_token(cell.run.model)) * resolve_tokens(cell.run)


def _ok(cell, members: int, rate: float) -> dict:
    """An ok result of ``cell`` trained in a trial of ``members`` members of its C at ``rate`` FLOP/s per member:
    the members share the trial's wall time, members x C / rate."""
    c = _C(cell)
    return {"status": "ok", "final_val_loss": 3.0, "D": resolve_tokens(cell.run), "C": c,
            "wall_s": members * c / rate, "ensemble": {"members": members}}  # fmt: skip


def _lpt(seconds: list[float], slots: int) -> float:
    load = [0.0] * slots
    for x in sorted(seconds, reverse=True):
        load[load.index(min(load))] += x
    return max(load)


def test_the_time_left_is_each_left_run_at_its_cells_measured_rate():
    """Seed 0 of every cell recorded (trials of 2 members, so each record's k C / wall_s is its width's rate); the
    seed-1 runs left train one per trial at their own cell's rate: on 1 CPU the sum of C / rate plus the overhead
    per trial, on 2 CPUs the same trials packed longest first onto 2 slots."""
    import pandas as pd

    spec = _two_seeds()
    cells = spec.cells()
    rows = [run_record(c, _ok(c, 2, RATE[c.run.model.d_model])).to_row() for c in cells if c.seed == 0]
    left = [c for c in cells if c.seed == 1]
    per_trial = [_C(c) / RATE[c.run.model.d_model] + OVERHEAD_S for c in left]
    one = training_time_left(spec, pd.DataFrame(rows), left, cpus=1)
    assert one["seconds"] == pytest.approx(sum(per_trial), rel=1e-9)
    assert (one["runs"], one["trials"], one["slots"], one["measured_runs"], one["rate_runs"]) == (16, 16, 1, 16, 16)
    two = training_time_left(spec, pd.DataFrame(rows), left, cpus=2)
    assert two["seconds"] == pytest.approx(_lpt(per_trial, 2), rel=1e-9) and two["slots"] == 2
    assert two["seconds"] < 0.6 * one["seconds"]
    # Ray given more CPUs than the machine has cores: the trials beyond the cores share them, no faster in all
    assert training_time_left(spec, pd.DataFrame(rows), left, cpus=6, cores=2) == two


def test_cells_without_a_measurement_take_the_median_rate_of_their_r():
    """Only the D = 2048 cells recorded (both seeds, one trial each): the D = 4096 trials left take, at each r, the
    median of the rates measured there (d 16 and d 32: 2.5e8), their 2 members' FLOPs summed. Failed or rate-less
    records give no rate; with no rate at all there is no prediction."""
    import pandas as pd

    spec = _two_seeds()
    cells = spec.cells()
    short = [c for c in cells if resolve_tokens(c.run) == 2048]
    rows = [run_record(c, _ok(c, 2, RATE[c.run.model.d_model])).to_row() for c in short]
    rows.append(run_record(cells[0], {"status": "failed", "C": 1.0, "wall_s": 1e-9, "D": 2048}).to_row())
    left = [c for c in cells if resolve_tokens(c.run) == 4096]
    trials: dict = {}
    for c in left:
        key = (c.run.model.d_model, c.r)
        trials[key] = trials.get(key, OVERHEAD_S) + _C(c) / 2.5e8
    got = training_time_left(spec, pd.DataFrame(rows), left, cpus=1)
    assert got["seconds"] == pytest.approx(sum(trials.values()), rel=1e-9)
    assert (got["runs"], got["trials"], got["measured_runs"], got["rate_runs"]) == (16, 8, 0, 16)
    no_rate = [run_record(c, {"status": "ok", "final_val_loss": 3.0}).to_row() for c in short]
    assert training_time_left(spec, pd.DataFrame(no_rate), left, cpus=1) is None
    assert training_time_left(spec, pd.DataFrame(rows), [], cpus=1) is None


@pytest.fixture
def half_timed(tmp_path):
    """A stopped smoke folder: 8 of its 16 runs recorded ok with a training time, the other 8 untrained."""
    spec = preset_spec("smoke")
    out = tmp_path / "run"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    (out / "run_meta.json").write_text(json.dumps({"spec_name": "smoke", "stage_wall_s": {"sweep": 60.0}}))
    cells = spec.cells()
    store = ResultsStore(out)
    for c in cells[:8]:
        store.write_run(run_record(c, _ok(c, 1, RATE[c.run.model.d_model]), finished_at=time.time() - 30))
    return out, spec, cells


@contextlib.contextmanager
def _fake_gcs():
    """A gRPC server on loopback that answers the Ray GCS call the --address probe makes
    (``loopscale.cluster.connect._GCS_METHOD``) as a head does; yields its ``host:port``. A dry run with --address
    checks the address and starts no Ray."""
    from concurrent import futures

    import grpc

    from loopscale.cluster.connect import _GCS_METHOD

    service, method = _GCS_METHOD.strip("/").split("/")
    handler = grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(
        lambda request, context: b"")})  # fmt: skip
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def _dry(out, *extra, spec_file=None):
    spec_file = spec_file or out / "spec.yaml"
    res = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", str(spec_file), "--dry-run",
                          "--json", "--out", str(out), *extra], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_dry_run_and_status_of_a_stopped_folder_give_the_training_left(half_timed, tmp_path):
    """The smoke folder half trained: `run --dry-run --num-cpus 1` predicts the 8 runs left at their own cells'
    measured rates (its cells at the other D take the median of their r), `status` gives the same on this
    machine's cores; `--address` gives none (the runs train on the cluster), a new folder none, and a folder
    whose records hold no training time says why there is none."""
    import os

    import pandas as pd

    out, spec, cells = half_timed
    p = _dry(out, "--num-cpus", "1")
    rows = pd.DataFrame(list(ResultsStore(out).recorded().values()))
    want = training_time_left(spec, rows, cells[8:], cpus=1)
    assert want is not None and p["est_train_min_left"] == pytest.approx(want["seconds"] / 60.0, rel=1e-9)
    assert p["train_time_assumption"].startswith("the sweep stage's training alone (LR tuning and the fit not "
                                                 "counted), on 1 CPU here (1 trial at full speed at once), at the FLOP/s of the 8 ok "
                                                 "runs recorded here (0 of the 8 runs left train in a cell measured")
    # the D = 4096 cells left: at each r the median of the d 16 and d 32 rates
    assert want["seconds"] == pytest.approx(sum(_C(c) / 2.5e8 + OVERHEAD_S for c in cells[8:]), rel=1e-9)
    many = _dry(out, "--num-cpus", "4096")
    assert f"on 4096 CPUs given to Ray on {os.cpu_count()} cores here" in many["train_time_assumption"]
    cores = training_time_left(spec, rows, cells[8:], cpus=os.cpu_count() or 1)
    assert many["est_train_min_left"] == pytest.approx(cores["seconds"] / 60.0, rel=1e-9)
    # a Ray head's GCS as the --address probe sees it; a made-up remote address reached a proxy on some machines
    with _fake_gcs() as address:
        cluster = _dry(out, "--address", address)
    assert cluster["est_train_min_left"] is None and "on the cluster" in cluster["train_time_assumption"]
    new = _dry(tmp_path / "new", spec_file=out / "spec.yaml")
    assert new["est_train_min_left"] is None and new["train_time_assumption"] == (
        "not estimated before a run has finished in this folder: the figure takes the FLOP/s of the folder's own "
        "runs (a dry run or `status` of a stopped run gives it)"
    )
    # the plan names the folder it is for first (the default runs/<spec> was seen nowhere)
    assert list(new)[0] == "out" and new["out"] == str((tmp_path / "new").resolve())
    dflt = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", "smoke", "--dry-run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert dflt.returncode == 0 and dflt.stdout.splitlines()[0].split() == ["out:", str(tmp_path / "runs" / "smoke")]

    st = collect_status(out)
    assert st["state"] == "stopped" and st["runs"]["pending"] == 8
    left = st["time"]["train_left"]
    here = training_time_left(spec, rows, cells[8:], cpus=os.cpu_count() or 1)
    assert left["seconds"] == pytest.approx(here["seconds"], rel=1e-9) and left["cpus"] == (os.cpu_count() or 1)
    text = "\n".join(format_status(st))
    assert "training left: about" in text and "for its 8 runs on this machine's" in text
    # stopped while joined to a cluster: its runs train on the cluster's nodes, as the dry run says (status had
    # given this machine's 2 CPUs' figure)
    import socket

    gone = subprocess.Popen(["true"])
    gone.wait()
    (out / "logs").mkdir(exist_ok=True)

    def stopped_joined(address):
        (out / "logs" / "command.json").write_text(json.dumps({
            "kind": "run", "command": f"loopscale run {out / 'spec.yaml'} --out {out} --address {address} --seed 3",
            "cwd": str(tmp_path), "pid": gone.pid, "host": socket.gethostname(), "started_at": time.time() - 60}))
        return collect_status(out)

    with _fake_gcs() as address:  # the cluster still answers: its line is the one to continue with
        st = stopped_joined(address)
    assert st["state"] == "stopped" and st["time"].get("train_left") is None
    text = "\n".join(format_status(st))
    assert ("training left: not estimated: the runs train on the cluster (`--address`), not on this machine's CPUs"
            in text) and "training left: about" not in text  # fmt: skip
    assert st["cluster_gone"] is None and f"--address {address}" in st["resume_with"] and "answer now" not in text
    # the head was lost (nothing listens at its port now): the resume line repeated the dead address, which the
    # next command refused at once; status says so and gives the line without it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    st = stopped_joined(dead)
    gone_ = st["cluster_gone"]
    assert gone_["address"] == dead and gone_["why"] == "Connection refused" and gone_["runs_left"] == 8
    assert f"--address {dead}" in st["resume_with"]
    assert gone_["resume_here"] == st["resume_with"].replace(f" --address {dead}", "")
    assert "--address" not in gone_["resume_here"] and "--seed 3" in gone_["resume_here"]
    text = "\n".join(format_status(st))
    assert (f"  the Ray cluster at {dead} does not answer now (Connection refused): that line needs it back; or "
            f"continue without --address (its 8 runs left then train on this machine): {gone_['resume_here']}"
            in text.splitlines())  # fmt: skip
    # something answers there, but not a Ray head (a web server): that line is refused too
    import http.server
    import threading

    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        st = stopped_joined(f"127.0.0.1:{web.server_address[1]}")
    finally:
        web.shutdown()
    assert st["cluster_gone"]["why"] == "something answers there, but not a Ray head"
    # stopped in its fit stage (every run recorded): the fit needs no cluster
    fit_only = "\n".join(format_status({**st, "cluster_gone": {**gone_, "runs_left": 0}}))
    assert "or continue without --address (the fit needs no cluster and trains nothing): " in fit_only

    untimed = tmp_path / "untimed"
    untimed.mkdir()
    (untimed / "spec.yaml").write_text(spec_to_yaml(spec))
    ResultsStore(untimed).write_run(run_record(cells[0], {"status": "ok", "final_val_loss": 3.0}))
    q = _dry(untimed)
    assert q["est_train_min_left"] is None and q["train_time_assumption"] == (
        "not estimated: no ok run recorded here with a training time (wall_s) and FLOPs (C) to take a rate from")
    assert collect_status(untimed)["time"].get("train_left") is None
    # every run recorded: no figure, and the plan says why (it printed None without a word)
    import shutil

    done = tmp_path / "done"
    shutil.copytree(Path(__file__).resolve().parents[1] / "docs" / "example_cpu_seeds4", done)
    d = _dry(done)
    assert d["est_train_min_left"] is None and d["train_time_assumption"] == (
        "nothing left to train: every run of the grid finished here (recorded, or recorded when `run` continues)")


def test_a_dry_run_counts_finished_runs_whose_records_are_gone(tmp_path):
    """A folder whose records are gone (runs.parquet and parts/ deleted) but whose runs finished (each result.json
    in its storage workspace) was planned as a new grid (``recorded`` None) while `status` said 16 more finished
    and `--resume` trained none of them: the dry run now says so too."""
    spec = preset_spec("smoke")
    out = tmp_path / "run"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    for c in spec.cells():
        done = out / "tune" / "checkpoints" / c.run_id
        done.mkdir(parents=True)
        (done / "result.json").write_text("{}")
    p = _dry(out)
    assert p["recorded"] == ("0 of 16 runs recorded, 16 more finished and are recorded when `run` continues; nothing "
                             "left to train (`run` fits and reports, unless they are up to date)"), p
    assert collect_status(out)["runs"]["unrecorded"] == 16


def _stopped_smoke_folder(tmp_path, result_of):
    """A stopped `run` folder of the smoke preset (spec.yaml, run_meta.json) whose every cell has a finished record,
    the i-th cell's result ``result_of(i)``: (spec, folder, store, cells)."""
    spec = preset_spec("smoke")
    out = tmp_path / "run"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    (out / "run_meta.json").write_text(json.dumps({"spec_name": "smoke", "stage_wall_s": {"sweep": 60.0}}))
    store = ResultsStore(out)
    cells = spec.cells()
    for i, c in enumerate(cells):
        store.write_run(run_record(c, result_of(i)))
    store.consolidate()
    return spec, out, store, cells


def test_a_folder_whose_runs_all_finished_without_one_ok_is_refused_and_status_says_why(tmp_path):
    """Every run diverged or did not learn (an LR far too high): the hints led to reruns that could not help —
    status said `--resume`, the dry run 'nothing left to train (`run` fits and reports ...)', and `run --resume`
    trained nothing and failed in the fit. `run` and its dry run now refuse such a folder before writing anything,
    naming the counts and what to change, and status says it instead of --resume; the sweep's own error names
    every reason with its count."""
    from loopscale.sweep.grid import no_run_finished

    spec, out, store, cells = _stopped_smoke_folder(tmp_path, lambda i: {"status": "did_not_learn" if i < 2 else "diverged"})
    said = (f"every run of the grid in {out} finished and none is ok (14 diverged, 2 did not learn): there is "
            "nothing to fit, and a finished run is not trained again; the LR is likely too high")
    dry = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", str(out / "spec.yaml"), "--dry-run",
                          "--json", "--out", str(out)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert dry.returncode == 2 and json.loads(dry.stdout.splitlines()[0])["refused"].startswith(said), dry.stdout
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    res = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", str(out / "spec.yaml"), "--resume",
                          "--out", str(out)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2 and said in " ".join(res.stderr.split()), res.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # refused before anything was written
    st = collect_status(out)
    assert st["state"] == "stopped" and st["resume_with"] is None and st["nothing_to_fit"].startswith(said)
    assert any(line.startswith("cannot continue: every run") for line in format_status(st))
    # one run left to train: it may learn, so nothing is refused and status gives --resume
    store.forget({cells[5].run_id})
    assert collect_status(out)["nothing_to_fit"] is None
    assert json.loads(subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "run", str(out / "spec.yaml"),
                                      "--dry-run", "--json", "--out", str(out)], capture_output=True, text=True,
                                     timeout=120).stdout)["refused"] is None  # fmt: skip
    err = str(no_run_finished(12, ["diverged (status in runs.parquet)"] * 10 + ["did_not_learn (...)"] * 2))
    assert err == ("0 of 12 runs finished ok: diverged (status in runs.parquet) (10 of 12 failures); also "
                   "did_not_learn (...) (2)")


def test_a_folder_whose_runs_all_finished_with_too_few_ok_for_the_law_is_refused_as_well(tmp_path):
    """Half the runs diverged or did not learn (an LR table with one LR far too high) and 4 ok runs were left, fewer
    than the joint law's 6 parameters: the dry run refused nothing, status gave `--resume`, and `run --resume` ended
    each time in "4 run(s) left is fewer than the 6 parameters". Such a folder is now refused as one without an ok
    run, naming the counts; with 6 ok runs, or a run still to train, it is not."""
    from loopscale.sweep.run import nothing_to_fit

    spec, out, store, cells = _stopped_smoke_folder(tmp_path, lambda i: {"status": "ok", "final_val_loss": 3.0} if i < 4
                                                    else {"status": "did_not_learn" if i < 6 else "diverged"})  # fmt: skip
    assert len({c.r for c in cells[:4]}) > 1  # ok runs of two r or more: the joint fit fails on 4
    said = (f"every run of the grid in {out} finished and only 4 of 16 are ok (the others: 10 diverged, 2 did not "
            "learn), fewer than the 6 parameters of the joint law `run` fits, so its fit stage cannot fit them, and a "
            "finished run is not trained again; the LR is likely too high")  # fmt: skip
    assert nothing_to_fit(spec, out).startswith(said)
    st = collect_status(out)
    assert st["resume_with"] is None and st["nothing_to_fit"].startswith(said)
    assert any(line.startswith("cannot continue: every run of the grid") for line in format_status(st))
    store.forget({cells[5].run_id})  # a run left to train: --resume may add an ok run
    assert nothing_to_fit(spec, out) is None
    store.write_run(run_record(cells[5], {"status": "ok", "final_val_loss": 3.0}))
    store.write_run(run_record(cells[6], {"status": "ok", "final_val_loss": 3.0}))
    store.consolidate()
    assert nothing_to_fit(spec, out) is None  # 6 ok runs: as many as the law's parameters
    # ok runs of one r only (the looped ones diverged): the fit stage skips the joint law and reports the rest, so
    # the folder is not refused
    for c in cells:
        ok = c.r == 1 and c.size == cells[0].size
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0} if ok else {"status": "diverged"}))
    store.consolidate()
    assert 0 < sum(c.r == 1 and c.size == cells[0].size for c in cells) < 6
    assert nothing_to_fit(spec, out) is None


def test_a_sweep_folder_whose_runs_all_diverged_says_its_error_and_that_nothing_is_left_to_fit(tmp_path):
    """`loopscale sweep` of a grid whose every run diverged exits 1 with "0 of 4 runs finished ok". Its folder's status
    read "finished, stage done" (the sweep's runs did all finish) and gave neither that error nor why `loopscale fit`
    has nothing to fit, which `run`'s folders got. It now gives both; a sweep that ended well gives neither."""
    spec = preset_spec("smoke")
    out = tmp_path / "sweep"
    (out / "logs").mkdir(parents=True)
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    store = ResultsStore(out)
    for c in spec.cells():
        store.write_run(run_record(c, {"status": "diverged"}))
    store.consolidate()
    ended = {"how": "error", "message": "NoRunFinished: 0 of 16 runs finished ok: diverged (status in runs.parquet) "
             "(16 of 16 failures)", "at": time.time()}  # fmt: skip
    import socket

    gone = subprocess.Popen(["true"])
    gone.wait()  # the pid of a command that ended, on this host
    record = {"kind": "sweep", "command": f"loopscale sweep smoke --out {out}", "cwd": str(tmp_path),
              "pid": gone.pid, "host": socket.gethostname(), "started_at": time.time() - 60, "ended": ended}  # fmt: skip
    (out / "logs" / "command.json").write_text(json.dumps(record))
    st = collect_status(out)
    assert (st["kind"], st["state"], st["stage"]) == ("sweep", "finished", "done")
    assert st["last_command_error"] == ended["message"]
    assert st["nothing_to_fit"].startswith(f"every run of the grid in {out} finished and none is ok (16 diverged)")
    lines = format_status(st)
    assert f"the last command ended on an error: {ended['message']}" in lines
    assert any(line.startswith("cannot continue: every run of the grid") for line in lines)
    # the same folder after a sweep that ended well (its runs ok): no error, nothing refused
    for c in spec.cells():
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    store.consolidate()
    del record["ended"]
    (out / "logs" / "command.json").write_text(json.dumps(record))
    st = collect_status(out)
    assert st["state"] == "finished" and st["last_command_error"] is None and st["nothing_to_fit"] is None
    # a sweep that ended well with a few ok runs (`loopscale fit --phi 0.5` fits 5): it has nothing to continue
    for i, c in enumerate(spec.cells()):
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0} if i < 5 else {"status": "diverged"}))
    store.consolidate()
    st = collect_status(out)
    assert st["state"] == "finished" and st["nothing_to_fit"] is None
    assert not any(line.startswith("cannot continue") for line in format_status(st))
