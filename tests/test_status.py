"""`loopscale status`: counts, failures, stage and state from a run directory's files (no Ray, no training)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from loopscale.sweep.presets import preset_spec
from loopscale.sweep.spec import spec_to_yaml
from loopscale.sweep.status import collect_status, fit_headlines, format_status
from loopscale.sweep.store import ResultsStore, failed_record, run_record


def test_stopped_sweep_counts_every_planned_run_once(half_done):
    out, cells = half_done
    st = collect_status(out)
    assert st["spec"] == "smoke" and st["state"] == "stopped" and st["stage"] == "sweep"
    assert st["runs"] == {"total": 16, "ok": 5, "diverged": 1, "did_not_learn": 0, "failed": 2,
                          "running": 0, "unrecorded": 0, "pending": 8}
    assert sorted(f["run_id"] for f in st["failures"]) == sorted(c.run_id for c in cells[6:8])
    # run ids blanked: the same failure of two runs reads the same
    assert {f["error"] for f in st["failures"]} == {"RuntimeError: out of memory in run …"}
    assert st["time"]["total_s"] == 125.0 and st["progress"] is None
    text = "\n".join(format_status(st))
    assert "failed (2): RuntimeError: out of memory" in text and "5 ok, 1 diverged, 2 failed" in text


def test_a_stopped_folder_on_a_nearly_full_disk_names_the_disk(half_done, monkeypatch):
    """A sweep stopped by a full disk could not write the error that stopped it, so `status` said only "stopped":
    with under DISK_SHORT_BYTES free where the folder is, it names the disk; with room there (or a folder that is
    not stopped) it says nothing of it."""
    import shutil
    from collections import namedtuple

    from loopscale.sweep import status as status_mod

    out, _ = half_done
    st = collect_status(out)
    assert st["disk_free"] is None and "disk:" not in "\n".join(format_status(st))  # this disk has room
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 4096, 4096))
    st = collect_status(out)
    assert st["state"] == "stopped" and st["disk_free"] == 4096
    lines = format_status(st)
    assert f"disk: only 4.1 kB free where {out} is; a full disk stops a command before it can record why" in "\n".join(
        lines
    )
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 0, status_mod.DISK_SHORT_BYTES))
    assert collect_status(out)["disk_free"] is None  # at the line: not short


def test_runs_that_did_not_learn_are_counted_as_finished_and_named(half_done):
    """A run whose trainer said did_not_learn is finished (not pending, not retried) and counted on its own."""
    out, cells = half_done
    ResultsStore(out).write_run(run_record(cells[8], {"status": "did_not_learn", "final_val_loss": 8.6}))
    st = collect_status(out)
    assert st["runs"] == {"total": 16, "ok": 5, "diverged": 1, "did_not_learn": 1, "failed": 2, "running": 0,
                          "unrecorded": 0, "pending": 7}
    assert "5 ok, 1 diverged, 1 did not learn, 2 failed, 0 running, 7 pending" in "\n".join(format_status(st))
    assert cells[8].run_id in ResultsStore(out).completed_ids()


def test_a_run_that_finished_unrecorded_is_not_pending(half_done):
    """A run that finished with no driver to record it (its result.json in the storage, no record) was counted
    pending, and the refit line said `run --resume` would first train it; `run` records it without training. It is
    now counted as finished and unrecorded, as the dry run's `recorded` line counts it."""
    out, cells = half_done
    (out / "tune" / "checkpoints" / cells[9].run_id).mkdir(parents=True)
    (out / "tune" / "checkpoints" / cells[9].run_id / "result.json").write_text("{}")
    st = collect_status(out)
    assert (st["runs"]["unrecorded"], st["runs"]["pending"], st["runs"]["failed"]) == (1, 7, 2)
    assert ("0 running, 7 pending (1 more finished, recorded when the sweep continues, training none of them)"
            in "\n".join(format_status(st)))  # fmt: skip
    assert collect_status(out)["fit_caveats"] == []  # no fit here: nothing to refit


def test_a_newer_record_replaces_a_failed_one(half_done):
    """A failed cell retried later (newer finished_at) counts once, with its new status."""
    out, cells = half_done
    ResultsStore(out).write_run(run_record(cells[6], {"status": "ok"}, finished_at=time.time() + 5))
    st = collect_status(out)
    assert st["runs"]["ok"] == 6 and st["runs"]["failed"] == 1 and st["runs"]["pending"] == 8


def _live_progress(out, age_s: float, updated_age_s: float = 0.0, **fields) -> dict:
    """Write OUT/logs/progress.json as a live display of this process would (started ``age_s`` ago, last written
    ``updated_age_s`` ago)."""
    (out / "logs").mkdir(exist_ok=True)
    now = time.time()
    doc = {"finished": False, **fields, "started_at": now - age_s, "updated_at": now - updated_age_s,
           "pid": os.getpid(), "host": socket.gethostname()}  # fmt: skip
    (out / "logs" / "progress.json").write_text(json.dumps(doc))
    return doc


def test_live_progress_file_makes_it_running_with_eta(half_done):
    """A progress file written by a live process (this one) shows the stage, throughput and ETA."""
    out, _ = half_done
    doc = _live_progress(
        out, 30, 20, stage="grid", counts={"done": 8, "running": 2, "pending": 6, "failed": 0}, tokens_per_s=1234.0,
        eta_s=90.0,
    )  # fmt: skip
    st = collect_status(out)
    assert (st["state"], st["stage"]) == ("running", "sweep")
    # the ETA written 20 s ago is counted down to now
    assert 65 <= st["time"]["eta_s"] <= 70 and 29 <= st["time"]["running_stage_s"] < 60
    assert any("1,234 tokens/s" in ln for ln in format_status(st))
    doc["finished"] = True  # the command closed its display: no longer running
    (out / "logs" / "progress.json").write_text(json.dumps(doc))
    assert collect_status(out)["state"] == "stopped"


def test_running_lr_tuning_shows_trials_and_best_lr(half_done):
    out, _ = half_done
    _live_progress(
        out, 5, stage="tune-lr", total=12, trials={"COMPLETE": 3, "PRUNED": 2, "FAIL": 1}, best=[[16, 1, 0.02, 3.25]],
        eta_s=300.0,
    )  # fmt: skip
    st = collect_status(out)
    assert (st["state"], st["stage"]) == ("running", "tune-lr")
    text = format_status(st)
    assert "LR trials: 6 of 12 (2 pruned, 1 failed); best so far size 16 r 1: lr 0.02 (3.250)" in text
    assert 295 <= st["time"]["eta_s"] <= 300 and any("ETA 5m" in ln or "ETA 4m59s" in ln for ln in text)


def test_fit_headline_is_the_one_run_prints():
    ana = {
        "variants": {
            "baseline": {"joint": {"params": {"phi": 0.5}, "ci": {"phi": [0.25, 0.75]}, "r2": 0.99, "n": 16}},
            "other": {
                "joint": {"params": {"phi": 0.1}, "r2": 0.9, "n": 8},
                "identification": {"headline": "H"},
            },
            "skipped": {"joint": {"outcome": "single_r"}},
        }
    }
    assert fit_headlines(ana) == [
        "baseline: phi = 0.500, 95 % CI [0.250, 0.750], R^2 = 0.9900 (16 runs)",
        "other: H; R^2 = 0.9000 (8 runs)",
    ]
    # intervals from fewer than 50 refits (--bootstrap 20): the line says so, as the report does; 50 and more do not
    ana["variants"]["baseline"]["joint"]["bootstrap"] = {"B": 20, "n_ok": 20}
    ana["variants"]["other"]["joint"]["bootstrap"] = {"B": 200, "n_ok": 199}
    assert fit_headlines(ana) == [
        "baseline: phi = 0.500, 95 % CI [0.250, 0.750], R^2 = 0.9900 (16 runs) (its interval rests on 20 bootstrap "
        "refits, fewer than 50: it and any verdict move with the bootstrap seed; --bootstrap 200)",
        "other: H; R^2 = 0.9000 (8 runs)",
    ]


def test_fit_headline_says_why_a_variant_has_no_joint_fit():
    """A run whose looped runs all diverged (the r = 1 runs left) ended without a last line: no phi and no reason."""
    ana = {"variants": {"baseline": {"n": 2, "joint": {"outcome": "single_r",
                                                      "skipped": "a joint fit needs at least two values of r"}}}}  # fmt: skip
    assert fit_headlines(ana) == [
        "baseline: no joint fit, so no phi: a joint fit needs at least two values of r (2 runs with status ok)"
    ]


def test_status_cli_json_and_missing_dir(half_done, tmp_path):
    out, _ = half_done
    cmd = [sys.executable, "-m", "loopscale.sweep.cli", "status"]
    p = subprocess.run(cmd + [str(out), "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"]["pending"] == 8
    p = subprocess.run(cmd + [str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "nope does not exist: give the --out folder of a run or sweep" in p.stderr


def test_status_reads_the_tune_state_where_the_recorded_command_put_it(half_done, tmp_path, monkeypatch):
    """A sweep run with --storage keeps Tune's state there, and neither the folder nor its spec.yaml recorded that:
    status looked under OUT/tune only and left the trials out without a word. It now takes the --storage of the
    command line command.json records (a relative path against that command's working directory)."""
    from loopscale.sweep import status as status_mod

    out, _ = half_done
    asked: list = []
    monkeypatch.setattr(status_mod, "_tune_state", lambda storage, name: asked.append(storage))
    (out / "logs").mkdir()
    for command, want in (
        (f"loopscale sweep smoke --out {out} --storage file:///bucket/x", "file:///bucket/x"),
        (f"loopscale sweep smoke --out {out} --storage=st", str(tmp_path / "st")),
        (f"loopscale sweep smoke --out {out} --storage {tmp_path / 'abs'}", str(tmp_path / "abs")),
        (f"loopscale sweep smoke --out {out}", str(out / "tune")),
    ):
        record = {"kind": "sweep", "command": command, "cwd": str(tmp_path), "pid": -1, "host": "elsewhere",
                  "started_at": time.time() - 100, "recorded_at": time.time() - 100}  # fmt: skip
        (out / "logs" / "command.json").write_text(json.dumps(record))
        asked.clear()
        collect_status(out)
        assert asked and asked[-1] == want, (command, asked)


def test_resume_command_of_a_moved_folder_names_where_it_is_now(tmp_path):
    """A folder moved after a stop: the resume line named the old --out (resuming there would start over)."""
    from loopscale.sweep.status import resume_command

    here = tmp_path / "dst"
    here.mkdir()
    line = "loopscale run --preset smoke --out src --seed 3"
    assert resume_command(line, here, str(tmp_path)) == f"loopscale run --preset smoke --out {here} --seed 3 --resume"
    assert resume_command("loopscale run --out=src", here, str(tmp_path)) == f"loopscale run --out {here} --resume"
    # not moved, --out relative: named absolute (the line run from another directory started a new run there,
    # "nothing to resume"), and so is a relative SPEC file found where the command ran ("sweep spec not found")
    same = "loopscale run --out dst --resume"
    assert resume_command(same, here, str(tmp_path)) == f"loopscale run --out {here} --resume"
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "mine.yaml").write_text("name: mine\n")
    rel_spec = "loopscale run specs/mine.yaml --out dst"
    assert resume_command(rel_spec, here, str(tmp_path)) == f"loopscale run {tmp_path / 'specs' / 'mine.yaml'} --out {here} --resume"
    assert resume_command(f"loopscale run smoke --out {here}", here, str(tmp_path)) == f"loopscale run smoke --out {here} --resume"
    assert resume_command("loopscale run smoke", here, str(tmp_path)) == f"loopscale run smoke --out {here} --resume"
    assert resume_command(line) == f"{line} --resume"
    # the environment its error recorded goes in front (a token-auth refusal: the bare line was refused again)
    assert resume_command(line, env={"RAY_AUTH_MODE": "token"}) == f"RAY_AUTH_MODE=token {line} --resume"
    # a relative --storage was the storage under the command's working directory: the line run from elsewhere
    # made an empty second storage and restored nothing; it now names the storage the command used
    rel = f"loopscale sweep smoke --out {here} --storage st_rel"
    assert resume_command(rel, here, str(tmp_path)) == f"loopscale sweep smoke --out {here} --storage {tmp_path / 'st_rel'} --resume"
    uri = f"loopscale sweep smoke --out {here} --storage=s3://b/x"
    assert resume_command(uri, here, str(tmp_path)) == f"{uri} --resume"
    # a SPEC whose corpus is relative (read against the working directory): the line run from elsewhere found no
    # corpus; the folder's spec.yaml (the same spec, its corpus absolute) replaces it, relative or absolute
    (tmp_path / "specs" / "rel.yaml").write_text("name: mine\ncorpus: data/*.txt\n")
    (here / "spec.yaml").write_text(f"name: mine\ncorpus: {tmp_path / 'data'}/*.txt\n")
    for given in ("specs/rel.yaml", str(tmp_path / "specs" / "rel.yaml")):
        want = f"loopscale run {here / 'spec.yaml'} --out {here} --resume"
        assert resume_command(f"loopscale run {given} --out dst", here, str(tmp_path)) == want
    # the folder's spec.yaml records no storage_path: the spec's own goes on the line (a bucket's experiment was
    # otherwise started anew), a relative one made absolute where the command ran
    for store, want_store in (("s3://b/tune", "s3://b/tune"), ("st", str(tmp_path / "st"))):
        (tmp_path / "specs" / "rel.yaml").write_text(f"name: mine\ncorpus: data/*.txt\nstorage_path: {store}\n")
        want = f"loopscale run {here / 'spec.yaml'} --out {here} --storage {want_store} --resume"
        assert resume_command("loopscale run specs/rel.yaml --out dst", here, str(tmp_path)) == want
    given = "loopscale run specs/rel.yaml --out dst --storage s3://b/other"  # the command's own --storage stays
    assert "--storage s3://b/other --resume" in resume_command(given, here, str(tmp_path))
    # a spec kept on the line (its corpus absolute or embedded) with a relative storage_path: read against the
    # working directory too, so it is given absolute; a bucket's URI stays the spec's own
    (tmp_path / "specs" / "abs.yaml").write_text(f"name: mine\ncorpus: {tmp_path / 'x.txt'}\nstorage_path: st\n")
    want = f"loopscale run {tmp_path / 'specs' / 'abs.yaml'} --out {here} --storage {tmp_path / 'st'} --resume"
    assert resume_command("loopscale run specs/abs.yaml --out dst", here, str(tmp_path)) == want
    (tmp_path / "specs" / "uri.yaml").write_text("name: mine\nstorage_path: s3://b/t\n")
    want = f"loopscale run {tmp_path / 'specs' / 'uri.yaml'} --out {here} --resume"
    assert resume_command("loopscale run specs/uri.yaml --out dst", here, str(tmp_path)) == want
    # an embedded or absolute corpus keeps the user's file
    assert resume_command(rel_spec, here, str(tmp_path)) == f"loopscale run {tmp_path / 'specs' / 'mine.yaml'} --out {here} --resume"


def test_a_runs_parquet_another_program_wrote_is_named_not_a_traceback(tmp_path):
    """A runs.parquet without run_id and status (e.g. pandas' columns a, b) ended `loopscale status` in a traceback
    (KeyError: 'run_id'); it is now named as not a loopscale runs table, exit 2."""
    import pandas as pd
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    pd.DataFrame({"a": [1, 2], "b": [3.0, 4.0]}).to_parquet(tmp_path / "runs.parquet")
    res = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "runs.parquet is not a loopscale runs table: it has no run_id or status column (its columns: a, b)" in out
    assert "Traceback" not in res.output and "KeyError" not in res.output


def test_status_says_when_the_fit_it_shows_is_stale_or_of_other_fit_rules(tmp_path):
    """``status`` printed an example folder's phi verdict made under fit rules version 1 with no word of it, while
    its report opens with "Made under other fit rules" (today's fit reaches another verdict). Status now says what
    the report says above the fit: other fit rules, or a fit made from another runs table (stale)."""
    import shutil

    import pyarrow.parquet as pq

    from loopscale.fit.analysis import FIT_RULES_VERSION

    out = tmp_path / "seeds4"
    shutil.copytree("docs/example_cpu_seeds4", out)
    ana = json.loads((out / "fit" / "analysis.json").read_text())
    ana["fit_rules"] = 1  # a fit made under the first rules (the example's, as committed)
    (out / "fit" / "analysis.json").write_text(json.dumps(ana))
    assert FIT_RULES_VERSION != 1
    st = collect_status(out)
    (caveat,) = st["fit_caveats"]
    assert caveat.startswith(f"made under fit rules version 1, this loopscale applies "
                             f"version {FIT_RULES_VERSION}")  # fmt: skip
    assert f"loopscale run {out / 'spec.yaml'} --out {out} --resume" in caveat
    assert f"  ({caveat})" in format_status(st)
    assert any(ln.startswith("fit (other fit rules: see below): ") for ln in format_status(st))
    ana["fit_rules"] = FIT_RULES_VERSION  # today's rules, and the runs table it was fitted to: nothing to say
    (out / "fit" / "analysis.json").write_text(json.dumps(ana))
    assert collect_status(out)["fit_caveats"] == []
    t, fitted = pq.read_table(out / "runs.parquet"), (out / "runs.parquet").read_bytes()
    pq.write_table(t.slice(0, t.num_rows - 1), out / "runs.parquet")  # one run fewer than the fit was made from
    (stale,) = collect_status(out)["fit_caveats"]
    assert stale.startswith("stale: made from another runs table")
    # a variant's fit folder deleted: the report showed the numbers without the files' figures, status nothing
    (out / "runs.parquet").write_bytes(fitted)
    assert collect_status(out)["fit_caveats"] == []
    shutil.rmtree(out / "fit" / "baseline")
    st = collect_status(out)
    (lost,) = st["fit_caveats"]
    assert lost == (f"its files fit/baseline/fit.json, fit/baseline/bootstrap.parquet are missing (the report shows "
                    f"analysis.json's numbers without the figures drawn from them); `loopscale run {out / 'spec.yaml'} "
                    f"--out {out} --resume` refits it (training nothing)")  # fmt: skip
    assert any(ln.startswith("fit (files missing: see below): ") for ln in format_status(st))


def test_status_of_a_folder_of_runs_an_older_loopscale_defined_names_the_fit_that_refits_them(tmp_path):
    """docs/example_cpu_previous_default's runs were defined by an older loopscale, so `run --resume` (status's line
    to refit a fit of other fit rules) is refused there; status now gives the `loopscale fit` that refits them."""
    import shutil

    out = tmp_path / "prev"
    shutil.copytree("docs/example_cpu_previous_default", out)
    caveat, short = collect_status(out)["fit_caveats"]  # (its runs of few tokens per parameter: said too)
    assert short.startswith("short training: 21 of 48 ok runs trained on fewer than 10 tokens per unique parameter")
    assert caveat.startswith("made under fit rules version 1") and "--resume" not in caveat
    assert (f"`loopscale fit {out} --bootstrap 200 --identify --out {out}_refit` refits it (the "
            "recorded runs, into a new folder: `loopscale run` refuses this one, whose runs an older loopscale "
            "defined otherwise)") in caveat


def test_status_refit_line_fits_the_folder_it_describes(tmp_path):
    """A copy of an example folder: without spec.yaml status gave `loopscale run DIR/spec.yaml --resume` (which
    fails: no spec); with runs missing from the table it said `run --resume` refits it 'training nothing'; with
    runs.parquet gone (moved aside as unreadable) the fit was not called stale."""
    import shutil

    import pyarrow.parquet as pq

    out = tmp_path / "s4"
    shutil.copytree("docs/example_cpu_seeds4", out)
    (caveat,) = collect_status(out)["fit_caveats"]  # made under older fit rules, every run recorded
    assert f"`loopscale run {out / 'spec.yaml'} --out {out} --resume` refits it (training nothing)" in caveat
    t = pq.read_table(out / "runs.parquet")
    pq.write_table(t.slice(0, t.num_rows - 3), out / "runs.parquet")
    stale, rules = collect_status(out)["fit_caveats"]
    assert stale.startswith("stale: made from another runs table")
    assert "refits it (first training the 3 runs of its spec not in the table)" in rules
    (out / "runs.parquet").rename(out / "runs.parquet.unreadable-1")
    stale, _ = collect_status(out)["fit_caveats"]
    assert stale.startswith("stale: made from a runs table that is no longer there")
    (out / "runs.parquet.unreadable-1").rename(out / "runs.parquet")
    (out / "spec.yaml").unlink()
    _, rules = collect_status(out)["fit_caveats"]
    assert "spec.yaml" not in rules.split(" refits it")[0]
    assert (f"`loopscale fit {out} --bootstrap 200 --identify --out {out}_refit` refits it (the recorded runs, into "
            "a new folder: this one has no readable spec.yaml to rerun)") in rules


def test_status_moves_nothing_aside_in_a_folder_with_a_fit_and_a_torn_runs_table(tmp_path):
    """`loopscale status` on a folder with a fit and a torn runs.parquet moved it aside (its check of the folder's
    runs for the refit line read it as a command does), then listed it both as unreadable and as 'set aside by
    earlier commands', and a dry run after it could no longer name it. Status now changes nothing."""
    import shutil

    out = tmp_path / "s4"
    shutil.copytree("docs/example_cpu_seeds4", out)
    (out / "runs.parquet").write_bytes((out / "runs.parquet").read_bytes()[:500])
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    st = collect_status(out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert [u.split(" is unreadable")[0] for u in st["unreadable"]] == [str(out / "runs.parquet")]
    assert not st["set_aside"], st["set_aside"]


@pytest.mark.parametrize("lr", [{"fixed": 0.01}, "tune"])
def test_a_folder_only_design_wrote_to_is_empty_not_a_stopped_sweep(tmp_path, lr):
    """``loopscale design --out DIR`` writes the spec and its prediction; no command has run there. Status called
    it "stopped, stage sweep" with every run pending (and a resume line), as if a sweep had been interrupted."""
    spec = preset_spec("smoke").model_copy(update={"lr": lr})
    out = tmp_path / "planned"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    (out / "design_prediction.json").write_text("{}")
    st = collect_status(out)
    assert (st["state"], st["stage"], st["resume_with"]) == ("empty", "none", None)
    assert st["runs"]["pending"] == len(preset_spec("smoke").cells()) == 16
    assert "design prediction (`loopscale design --out`): design_prediction.json" in format_status(st)
    # a command that started there and stopped before any run finished is stopped, not empty
    store = ResultsStore(out)
    store.write_run(failed_record(preset_spec("smoke").cells()[0], "RuntimeError: boom"))
    assert collect_status(out)["state"] == "stopped"


def test_a_sweep_stopped_before_writing_runs_parquet_is_stopped_not_finished(tmp_path):
    """A cluster's head lost as the grid ended: Ray's core ended the driver inside ray.shutdown(), before the
    consolidation that writes runs.parquet; every run was in parts/ only. Status said "finished, stage done" (no
    resume line) and `loopscale fit DIR` then found no runs.parquet. It is now stopped in the sweep stage, says how
    many records runs.parquet lacks, and names the command that writes it."""
    spec = preset_spec("smoke")
    out = tmp_path / "out"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    store = ResultsStore(out)
    cells = spec.cells()
    for c in cells[:4]:
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    store.consolidate()
    for c in cells[4:]:
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    (out / "logs").mkdir()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {"kind": "sweep", "command": f"loopscale sweep smoke --out {out}", "cwd": str(tmp_path),
              "pid": int(ended.stdout), "host": socket.gethostname(), "started_at": time.time() - 100,
              "recorded_at": time.time() - 100}  # fmt: skip  # the driver that stopped
    (out / "logs" / "command.json").write_text(json.dumps(record))
    st = collect_status(out)
    assert (st["state"], st["stage"], st["runs_in_parts_only"]) == ("stopped", "sweep", 12)
    assert st["runs"]["ok"] == 16 and st["resume_with"].endswith("--resume")
    assert any(line.startswith("runs.parquet lacks 12 finished runs' records") for line in format_status(st))
    store.consolidate()
    st = collect_status(out)
    assert (st["state"], st["stage"], st["runs_in_parts_only"]) == ("finished", "done", 0)


def test_status_reads_the_tune_state_in_the_spec_storage_path(tmp_path, monkeypatch):
    """A sweep whose spec sets storage_path keeps Tune's state there; OUT/spec.yaml does not keep storage_path (it
    may change between commands), and the command line has no --storage: status looked under OUT/tune and showed no
    trials. The command's record now names the storage it used."""
    from loopscale.sweep import console
    from loopscale.sweep import status as status_mod
    from loopscale.sweep.status import mark_started, recorded_storage

    out = tmp_path / "o"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(preset_spec("smoke")))
    with console.session(out):
        mark_started(out, "sweep", storage=str(tmp_path / "st_spec"))
    record = json.loads((out / "logs" / "command.json").read_text())
    assert recorded_storage(record) == str(tmp_path / "st_spec")
    asked: list = []
    monkeypatch.setattr(status_mod, "_tune_state", lambda storage, name: asked.append(storage))
    collect_status(out)
    assert asked == [str(tmp_path / "st_spec")]


def test_earlier_storages_reads_the_stopped_commands_record_and_survives_a_foreign_one(tmp_path):
    """The storage check of `--resume` skips the folder's record only when it is this very process's: same pid and
    host alone was taken for it after a container restart (pid 1 again), and the stopped command's storage was
    missed. A command.json that is JSON but not a record is read as none (it raised AttributeError)."""
    from loopscale.sweep.status import _proc_start, earlier_storages

    out = tmp_path / "o"
    (out / "logs").mkdir(parents=True)
    rec = {"kind": "sweep", "command": f"loopscale sweep smoke --out {out} --storage {tmp_path / 'st'}",
           "pid": os.getpid(), "host": socket.gethostname(), "proc_start": -1}  # fmt: skip
    (out / "logs" / "command.json").write_text(json.dumps(rec))
    assert earlier_storages(out) == [str(tmp_path / "st")]  # same pid and host, another process start
    rec["proc_start"] = _proc_start(os.getpid())
    (out / "logs" / "command.json").write_text(json.dumps(rec))
    assert earlier_storages(out) == []  # this process's own record
    for doc in ('"x"', "[]", '{"earlier_commands": ["x"]}'):
        (out / "logs" / "command.json").write_text(doc)
        assert earlier_storages(out) == []


def test_status_and_the_commands_tell_a_torn_json_file_alike(tmp_path):
    """`status` (which moves nothing) and the commands (which move such a file aside) read a JSON file through one
    function, so both name the same reason: an empty file, whitespace, bytes that are not UTF-8 JSON, or JSON of
    another kind than an object."""
    from loopscale.cluster.storage import json_object, read_json_or_aside
    from loopscale.sweep.status import _read_json

    cases = {b"": "0 bytes", b" \n": "whitespace only", b"[1, 2]": "not a JSON object (a JSON list)",
             b"null": "not a JSON object (a JSON null)", b'"x"': "not a JSON object (a JSON string)",
             b"[" * 100000: "not valid JSON",
             b"\xff{": "not valid JSON: 'utf-8' codec can't decode byte 0xff", b'{"a": ': "not valid JSON: Expecting value"}
    for i, (data, why) in enumerate(cases.items()):
        assert json_object(data)[0] is None and json_object(data)[1].startswith(why)
        path = tmp_path / f"m{i}.json"
        path.write_bytes(data)
        problems: list[str] = []
        assert _read_json(path, problems) is None and problems == [f"{path} ({json_object(data)[1]})"]
        assert path.exists()  # status moved nothing
        with pytest.warns(UserWarning, match=re.escape(why)):
            assert read_json_or_aside(str(path)) is None
        assert not path.exists()  # the command moved it aside
    assert json_object(b'{"a": 1}') == ({"a": 1}, None)


def test_the_last_lines_give_delta_phi_per_variant():
    """Δφ was only in report.md: `run`'s last lines, `status` and `run --json` gave each variant's φ alone. The
    headlines now end with one Δφ line per compared variant, saying what keeps it from being a result."""
    from loopscale.sweep.status import delta_phi_lines, fit_headlines

    comp = {"baseline": "baseline", "comparisons": {
        "trunc_bptt": {"delta_phi": -0.0812, "ci": [-0.15, -0.02], "not_identified": ["baseline"],
                       "same_losses_as_baseline_r": [8]},
        "hyperconnect": {"delta_phi": 0.19, "ci": [0.11, 0.28]},
        "other": {"delta_phi": 0.05, "ci": [float("nan")] * 2, "no_interval": "no bootstrap (B = 0)"}}}  # fmt: skip
    assert delta_phi_lines({"variant_comparison": comp}) == [
        "trunc_bptt - baseline: delta phi = -0.081, 95 % CI [-0.150, -0.020] (not a result: phi not identified "
        "(baseline); its runs at r = 8 ended at the baseline's losses)",
        "hyperconnect - baseline: delta phi = 0.190, 95 % CI [0.110, 0.280]",
        "other - baseline: delta phi = 0.050 (no interval: no bootstrap (B = 0))",
    ]
    assert delta_phi_lines({"variant_comparison": {"skipped": "a variant with a single r"}}) == [
        "no delta phi: a variant with a single r"]
    # the fitter's reason opens with "no Δφ: " itself: said once ("no delta phi: no Δφ: ...")
    assert delta_phi_lines({"variant_comparison": {"skipped": "no Δφ: the baseline 'baseline' has no looped"}}) == [
        "no delta phi: the baseline 'baseline' has no looped"]
    assert delta_phi_lines({}) == [] and fit_headlines({"variant_comparison": comp})[-1].startswith("other - baseline")
    # a null of an older or hand-edited analysis.json reads as nan (it raised TypeError in `status` and `run`)
    odd = {"baseline": "baseline", "comparisons": {"x": {"delta_phi": None, "ci": [None, None]}}}
    assert delta_phi_lines({"variant_comparison": odd}) == ["x - baseline: delta phi = nan, 95 % CI [nan, nan]"]
