"""End to end: `loopscale run --preset smoke` as a user runs it (the console script, real text, embedded Ray)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loopscale.sweep.presets import preset_spec

LOOPSCALE = [sys.executable, "-m", "loopscale.sweep.cli"]


def _run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(LOOPSCALE + args, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "run"
    t0 = time.time()
    p = _run(["run", "--preset", "smoke", "--out", str(out), "--json"])
    wall = time.time() - t0
    assert p.returncode == 0, p.stderr[-4000:]
    return out, json.loads(p.stdout.strip().splitlines()[-1]), wall


def test_smoke_run_one_ok_row_per_cell(smoke_run):
    """runs.parquet holds exactly one `ok` row per grid cell, with the accounting of the model."""
    from loopscale.model.accounting import flops_per_token, n_once, n_rec

    out, _, _ = smoke_run
    cells = preset_spec("smoke").cells()
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert len(rows) == len(cells) == 16
    assert {r["run_id"] for r in rows} == {c.run_id for c in cells}
    assert all(r["status"] == "ok" for r in rows)
    by_id = {c.run_id: c for c in cells}
    for row in rows:
        cfg = by_id[row["run_id"]].run.model
        assert row["N_once"] == n_once(cfg) and row["N_rec"] == n_rec(cfg)
        assert row["D"] == by_id[row["run_id"]].run.tokens
        assert math.isclose(row["C"], flops_per_token(cfg) * row["D"], rel_tol=1e-9)
        assert 0 < row["final_val_loss"] < math.log(256) + 1
    from loopscale.model.data import default_cache_dir, resolve_corpus

    # the content hash of the text every run read (sweep and run compare it with the corpus before adding runs)
    assert {r["corpus_sha256"] for r in rows} == {resolve_corpus("embedded", cache_dir=default_cache_dir()).corpus_hash}


def test_smoke_run_fit_has_phi_inside_its_interval(smoke_run):
    """The joint fit gives a finite phi with a bootstrap CI lower < phi < upper, and R^2 is reported."""
    out, summary, _ = smoke_run
    fit = json.loads((out / "fit" / "baseline" / "fit.json").read_text())
    phi = fit["params"]["phi"]
    lo, hi = fit["ci"]["phi"]
    assert math.isfinite(phi) and lo < phi < hi
    assert summary["variants"]["baseline"]["phi"] == pytest.approx(phi)
    assert 0 < fit["r2"] <= 1
    ana = json.loads((out / "fit" / "analysis.json").read_text())
    assert set(ana["variants"]["baseline"]["restricted"]) == {"phi=0", "phi=1"}
    # the fit's own time and settings, which a later dry run sets beside a refit
    last = json.loads((out / "run_meta.json").read_text())["fit_last"]
    assert (last["B"], last["starts"]) == (100, 100) and 0 < last["wall_s"] <= json.loads(
        (out / "run_meta.json").read_text())["stage_wall_s"]["fit"]


def test_smoke_run_writes_report_and_figures(smoke_run):
    """report.md exists with the joint-fit section, and every figure it links to exists as a PNG."""
    out, _, wall = smoke_run
    report = (out / "report.md").read_text()
    assert "Joint law" in report and "φ =" in report and "Restricted fits" in report
    # the identification rule comes before any headline: a bold phi only where phi is identified
    ident = json.loads((out / "fit" / "analysis.json").read_text())["variants"]["baseline"]["identification"]
    assert ("**φ = " in report) == ident["identified"]
    assert ("not a result, φ is not identified by this grid" in report) == (not ident["identified"])
    links = [ln.split("](", 1)[1].rstrip(")") for ln in report.splitlines() if ln.startswith("![")]
    assert len(links) >= 3
    for link in links:
        png = out / link
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", link
    print(f"smoke run wall time: {wall:.1f} s")


def test_rerun_skips_every_finished_stage(smoke_run):
    """A second `run --resume` retrains nothing and refits nothing: runs.parquet is byte-identical."""
    out, _, _ = smoke_run
    before = (out / "runs.parquet").read_bytes()
    p = _run(["run", "--preset", "smoke", "--out", str(out), "--resume", "--json"])
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert {"sweep", "fit"} <= set(summary["skipped"])
    assert summary["data_caveat"] is None  # the embedded corpus: 0.00025 epochs, every eval window there
    # stage_wall_s sums the folder's commands (the first run's sweep is in it); this command's own skip the sweep
    assert summary["stage_wall_s"]["sweep"] > 0 and set(summary["this_command_stage_wall_s"]) == {"report"}
    assert summary["stage_wall_s"]["report"] > summary["this_command_stage_wall_s"]["report"]  # both reports
    assert (out / "runs.parquet").read_bytes() == before
    # the report it wrote names it, as `loopscale report` does afterwards (it did not when every stage was skipped)
    report = (out / "report.md").read_text()
    assert f"Last continued with `loopscale run --preset smoke --out {out} --resume --json`." in report
    from loopscale.sweep.cli import version_line

    assert f"Fitted with {version_line()}; each run's versions are in runs.parquet" in report  # which loopscale fitted


def test_a_fit_made_under_other_fit_rules_is_said_and_refitted_on_resume(smoke_run, tmp_path):
    """A folder fitted under earlier fit rules kept its old verdict: `run --resume` said 'runs.parquet and settings
    unchanged, skipped', and the report showed it as today's (the seeds-4 example says 'identified but imprecise',
    today's rule 'not identified'). analysis.json records the rules' version; the report says when it is not this
    installation's, and `run --resume` refits, training nothing."""
    from loopscale.fit.analysis import FIT_RULES_VERSION
    from loopscale.fit.run_report import build_report

    out, _, _ = smoke_run
    old = tmp_path / "run"
    shutil.copytree(out, old)
    assert json.loads((old / "fit" / "analysis.json").read_text())["fit_rules"] == FIT_RULES_VERSION
    assert "Made under other fit rules" not in build_report(old).read_text()
    ana = json.loads((old / "fit" / "analysis.json").read_text())
    ana.pop("fit_rules")  # as written by a version that did not record them: version 1
    (old / "fit" / "analysis.json").write_text(json.dumps(ana))
    meta = json.loads((old / "run_meta.json").read_text())
    meta["fit_input"].pop("fit_rules")
    meta["fit_input"].update(B=10, starts=10)  # as if fitted with the settings given below: only the rules differ
    (old / "run_meta.json").write_text(json.dumps(meta))
    text = build_report(old).read_text()
    assert (f"> **Made under other fit rules.** The fits shown here follow loopscale's fit rules version 1; this "
            f"installation applies version {FIT_RULES_VERSION}") in text
    runs = (old / "runs.parquet").read_bytes()
    p = _run(["run", "--preset", "smoke", "--out", str(old), "--resume", "--json", "--bootstrap", "10", "--starts",
              "10"])  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "fit" not in json.loads(p.stdout.strip().splitlines()[-1])["skipped"]
    assert (f"the folder's fit follows fit rules version 1, this loopscale's are version {FIT_RULES_VERSION}: "
            "refitting") in p.stdout + p.stderr
    assert (old / "runs.parquet").read_bytes() == runs  # nothing trained
    assert json.loads((old / "fit" / "analysis.json").read_text())["fit_rules"] == FIT_RULES_VERSION
    assert "Made under other fit rules" not in (old / "report.md").read_text()
    # the earlier fit and its report are kept, not replaced (the refit replaced them without a copy)
    aside = [d for d in old.iterdir() if d.name.startswith("earlier_fit_")]
    assert len(aside) == 1 and sorted(x.name for x in aside[0].iterdir()) == ["fit", "loss_vs_compute.png", "report.md"]
    assert "fit_rules" not in json.loads((aside[0] / "fit" / "analysis.json").read_text())
    assert "Made under other fit rules" in (aside[0] / "report.md").read_text()
    assert f"and its report moved to {aside[0]} (fit, report.md, loss_vs_compute.png)" in p.stdout + p.stderr


def test_a_refit_stopped_part_way_leaves_the_earlier_fit_and_report_whole(smoke_run, tmp_path):
    """A refit (other --bootstrap) stopped by Ctrl-C while the analysis writes its files: the folder's fit/,
    report.md and figure are as they were (they had been moved to earlier_fit_*/ before the refit, leaving no report
    at the top), the stopped fit's files are apart in fit.partial/, and status says the fit stage has not ended. A
    rerun with the folder's own fit settings then skips the fit and drops fit.partial/: the folder is done."""
    out, _, _ = smoke_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    kept = {p.relative_to(run): p.read_bytes() for p in [run / "report.md", run / "loss_vs_compute.png",
                                                          *(run / "fit").rglob("*")] if p.is_file()}  # fmt: skip
    stop_in_fit = (
        "import sys, pathlib, loopscale.fit.analysis as a\n"
        "def stop(runs, out_dir, **kwargs):\n"
        "    pathlib.Path(out_dir, 'baseline').mkdir(parents=True)\n"
        "    pathlib.Path(out_dir, 'analysis.json').write_text('{}')\n"
        "    raise KeyboardInterrupt\n"
        "a.analyze = stop\n"
        "from loopscale.sweep.cli import main\n"
        f"sys.argv = ['loopscale', 'run', '--preset', 'smoke', '--out', {str(run)!r}, '--resume', '--bootstrap', '7']\n"
        "main()\n"
    )
    p = subprocess.run([sys.executable, "-c", stop_in_fit], capture_output=True, text=True, timeout=300)
    assert p.returncode == 130, p.stderr[-3000:]
    assert {q: q_path.read_bytes() for q in kept if (q_path := run / q).is_file()} == kept
    assert (run / "fit.partial" / "analysis.json").read_text() == "{}"
    assert (run / "fit.partial" / ".loopscale-fit-stage").is_file()  # its mark: the next run may remove it
    assert not (run / "fit" / ".loopscale-fit-stage").exists()  # a finished fit keeps no mark
    assert not [d for d in run.iterdir() if d.name.startswith("earlier_fit_")]
    from loopscale.sweep.status import collect_status

    st = collect_status(run)  # in-process: the CLI's is tested elsewhere
    assert (st["state"], st["stage"], st["fit_earlier"]) == ("stopped", "fit", True)
    p = _run(["run", "--preset", "smoke", "--out", str(run), "--resume", "--json"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "fit" in json.loads(p.stdout.strip().splitlines()[-1])["skipped"]
    assert not (run / "fit.partial").exists()
    assert {q: (run / q).read_bytes() for q in kept if q.name != "report.md"} == {
        q: b for q, b in kept.items() if q.name != "report.md"}  # the report is rebuilt; the fit is the same
    st = collect_status(run)
    assert (st["state"], st["stage"], st["fit_earlier"]) == ("finished", "done", False)
    # a fit/ made with other settings than run_meta.json records (a kill between the fit's taking fit/'s place and
    # the record's write): the dry run and the run refit it instead of skipping it under the record's settings
    ana = json.loads((run / "fit" / "analysis.json").read_text())
    (run / "fit" / "analysis.json").write_text(json.dumps({**ana, "settings": {**ana["settings"], "B": 50}}))
    from loopscale.sweep.run import _fit_stage_note

    assert _fit_stage_note(run, {"B": 100, "starts": 100, "seed": 0}, trains=False).startswith(
        "`run` refits: fit/ holds a fit made with B = 50, 100 starts, seed 0, not the one run_meta.json records")
    p = subprocess.run([sys.executable, "-c", stop_in_fit.replace(", '--bootstrap', '7'", "")], capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert p.returncode == 130 and "[3/4] fit: joint law" in p.stdout + p.stderr, p.stderr[-3000:]


def test_resume_after_a_stop_between_the_last_run_and_runs_parquet(smoke_run, tmp_path):
    """A Ctrl-C or kill just after the grid's last run was recorded (its part written, runs.parquet not yet) left a
    folder of parts only; `run --resume` skipped the grid ("every cell is in runs.parquet") and then failed on the
    missing runs.parquet, every time. The resume consolidates the parts first and finishes with every run."""
    out, _, _ = smoke_run
    stopped = tmp_path / "run"
    shutil.copytree(out, stopped)
    for name in ("runs.parquet", "curves.parquet", "run_meta.json", "report.md"):
        (stopped / name).unlink()
    shutil.rmtree(stopped / "fit")
    p = _run(["run", "--preset", "smoke", "--out", str(stopped), "--resume", "--bootstrap", "20", "--starts", "10"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "every cell is in runs.parquet, skipped" in p.stdout + p.stderr
    want = {r["run_id"]: r["final_val_loss"] for r in pq.read_table(out / "runs.parquet").to_pylist()}
    got = {r["run_id"]: r["final_val_loss"] for r in pq.read_table(stopped / "runs.parquet").to_pylist()}
    assert got == want and len(got) == 16
    assert pq.read_table(stopped / "curves.parquet").num_rows == pq.read_table(out / "curves.parquet").num_rows
    assert (stopped / "report.md").exists()



def test_runs_re_recorded_from_their_stored_results_keep_who_trained_them_and_when(smoke_run, tmp_path):
    """With runs.parquet and parts/ gone, `run --resume` re-records every run from its stored result.json without
    training it again; each row keeps the Tune trial id, host and start/end times of the attempt that trained it
    (they came back null, and finished_at became the time of the re-recording)."""
    out, _, _ = smoke_run
    keys = ("trial_id", "host", "started_at", "finished_at", "final_val_loss")
    want = {r["run_id"]: {k: r[k] for k in keys} for r in pq.read_table(out / "runs.parquet").to_pylist()}
    assert all(v["trial_id"] and v["started_at"] for v in want.values())
    lost = tmp_path / "run"
    shutil.copytree(out, lost)
    for name in ("runs.parquet", "curves.parquet", "run_meta.json", "report.md"):
        (lost / name).unlink()
    shutil.rmtree(lost / "parts")
    shutil.rmtree(lost / "fit")
    p = _run(["run", "--preset", "smoke", "--out", str(lost), "--resume", "--bootstrap", "20", "--starts", "10"])
    assert p.returncode == 0, p.stderr[-3000:]
    got = {r["run_id"]: {k: r[k] for k in keys} for r in pq.read_table(lost / "runs.parquet").to_pylist()}
    assert got == want
    # said, not silent: with a shared --storage these can be another folder's runs
    assert (f"recorded 16 of 16 runs from their finished results in the storage {(lost / 'tune').resolve()}"
            in p.stdout + p.stderr)  # fmt: skip

def test_other_spec_in_same_out_dir_is_refused_without_touching_it(smoke_run, tmp_path):
    """Pointing a different spec at an existing run directory fails before any compute and changes nothing."""
    out, _, _ = smoke_run
    spec = tmp_path / "other.yaml"
    text = (
        (Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml")
        .read_text()
        .replace("name: smoke", "name: other")
    )
    spec.write_text(text)
    before = (out / "runs.parquet").read_bytes()
    p = _run(["run", str(spec), "--out", str(out)])
    assert p.returncode == 2 and "different spec" in p.stderr
    assert (out / "runs.parquet").read_bytes() == before


def test_ctrl_c_then_resume_does_not_retrain_finished_runs(tmp_path):
    """SIGINT mid-sweep exits with code 130; `--resume` completes with one ok row per cell, and runs that had
    finished before the interrupt keep their original record (not retrained)."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        LOOPSCALE + ["run", "--preset", "smoke", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    parts = out / "parts" / "runs"
    deadline = time.time() + 300
    try:
        while time.time() < deadline:
            done = list(parts.rglob("*.parquet")) if parts.exists() else []
            if len(done) >= 3:
                break
            if proc.poll() is not None:
                pytest.fail("run finished before it could be interrupted:\n" + proc.stdout.read()[-3000:])
            time.sleep(0.5)
        else:
            pytest.fail("no run finished within 300 s")
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = proc.stdout.read()
    assert rc == 130, log[-3000:]
    from loopscale.sweep.store import RUNS_SCHEMA, ResultsStore, read_table

    store = ResultsStore(out)
    recorded = pa.concat_tables([read_table(store.runs_parts, RUNS_SCHEMA), store.runs()]).to_pylist()
    finished_before = {r["run_id"]: r for r in recorded}
    assert 0 < len(finished_before) < 16
    # what finished is in runs.parquet already (`loopscale fit OUT` reads it); Tune's complaint about trials stopped
    # before their result files were written stays in the log
    assert {r["run_id"] for r in pq.read_table(out / "runs.parquet").to_pylist()} == set(finished_before)
    assert "Failed to fetch metrics" not in log and " in 0s" not in log, log[-3000:]
    # the interrupted stage's time is recorded (a resumed stage showed only its resumed part)
    swept = json.loads((out / "run_meta.json").read_text())["stage_wall_s"]["sweep"]
    assert swept > 0
    # `loopscale status` of the stopped run: what was recorded is done, the rest is pending (nothing running)
    st = json.loads(_run(["status", str(out), "--json"]).stdout)
    assert st["time"]["stage_wall_s"]["sweep"] == pytest.approx(swept)
    assert (st["state"], st["stage"]) == ("stopped", "sweep")
    assert st["runs"]["ok"] + st["runs"]["diverged"] == len(finished_before)
    # a run that finished as the driver stopped, its result.json stored but not recorded, is not pending: the resume
    # records it without training (status counts it as unrecorded)
    assert st["runs"]["running"] == 0
    assert st["runs"]["pending"] + st["runs"]["unrecorded"] == 16 - len(finished_before)
    # a SIGINT saves a consistent state, which the check before a restore must accept (else nothing is restored)
    from loopscale.sweep.grid import tune_state_problem

    exps = sorted((out / "tune").glob("grid_*"))
    assert exps and tune_state_problem(str(exps[-1])) is None
    # the resume is what is tested, not the fit: a small bootstrap keeps the test short
    p = _run(["run", "--preset", "smoke", "--out", str(out), "--resume", "--bootstrap", "20", "--starts", "10"])
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {r["run_id"]: r for r in pq.read_table(out / "runs.parquet").to_pylist()}
    assert len(rows) == 16 and all(r["status"] == "ok" for r in rows.values())
    assert json.loads((out / "run_meta.json").read_text())["stage_wall_s"]["sweep"] > swept  # both attempts
    # a calm console: stage lines, the displays' summaries and the result; Ray's own output only in OUT/logs
    shown = (p.stdout + p.stderr).splitlines()
    assert len(shown) <= 15, p.stdout + p.stderr
    assert "\x1b" not in p.stdout + p.stderr and "Checkpoint successfully created" not in p.stdout + p.stderr
    assert "Token authentication is enabled" not in p.stdout + p.stderr  # Ray's default, not a warning
    assert "nothing to resume" not in p.stderr  # there was something: the stopped run
    assert "unreadable" not in p.stderr
    assert "Checkpoint successfully created" in (out / "logs" / "ray.log").read_text()
    st = json.loads(_run(["status", str(out), "--json"]).stdout)
    assert (st["state"], st["stage"]) == ("finished", "done") and st["fit"]
    assert st["runs"] == {"total": 16, "ok": 16, "diverged": 0, "did_not_learn": 0, "failed": 0, "running": 0,
                          "unrecorded": 0, "pending": 0}
    for rid, rec in finished_before.items():
        assert rows[rid]["finished_at"] == rec["finished_at"], "a finished run was trained again"
        assert rows[rid]["final_val_loss"] == rec["final_val_loss"]
    shutil.rmtree(out, ignore_errors=True)
