"""What `loopscale fit --out` writes agrees with what it prints (--json, the console)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_cpu"


def test_fit_json_holds_every_key_of_the_json_summary(tmp_path):
    """fit.json lacked fitted_to, not_identified, ci_on_box_edge and identification, which --json printed."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["fit", str(EXAMPLE), "--bootstrap", "4", "--identify", "--starts", "8",
                                   "--workers", "1", "--json", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    said = json.loads(res.stdout)
    written = json.loads((out / "fit.json").read_text())
    assert set(said) - set(written) == {"outputs"}
    for k in ("fitted_to", "not_identified", "identification", "variant"):
        assert written[k] == said[k], k
    assert written["fitted_to"]["what"] == "cell_means" and written["fitted_to"]["cells"] == 8
    assert written["identification"]["identified"] in (True, False)
    assert {k: v for k, v in said.items() if k != "outputs"} == written
    # the console's warning of intervals from few resamples (4 here) was not in --json: a script could not see it
    assert said["few_resamples"].startswith("the 95 % intervals rest on 4 refitted resample(s)")


def test_fit_json_prints_the_bootstrap_progress_lines_on_stderr_and_only_json_on_stdout():
    """With --json the bootstrap printed no progress at all; README: `bootstrap: i/n chunks` on stderr, plain."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    res = CliRunner().invoke(app, ["fit", str(EXAMPLE), "--bootstrap", "4", "--starts", "8", "--workers", "1",
                                   "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["bootstrap"]["B"] == 4
    assert res.stderr.splitlines() == ["bootstrap: 1/1 chunks"]


def test_plain_progress_lines_print_as_piped_on_a_terminal(monkeypatch, capsys):
    import sys

    from loopscale.fit import bootstrapping as bs

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with bs.plain_progress_lines():
        line = bs._ChunkLines(5)
        for i in range(1, 6):
            line(i)
    assert capsys.readouterr().err.splitlines() == ["bootstrap: 1/5 chunks", "bootstrap: 5/5 chunks"]
    line = bs._ChunkLines(3)  # on a terminal, outside it: every chunk
    for i in range(1, 4):
        line(i)
    assert len(capsys.readouterr().err.splitlines()) == 3


def test_one_token_budget_gives_no_frontier_intervals_in_the_fit_files(tmp_path):
    """With one D the report says the frontier is not computed (B, beta not identified), while --json, fit.json and
    bootstrap.parquet held N*/D*/L* intervals (e.g. D* [0.447, 5.16e6], N* at the 1e3 end of the search)."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["fit", str(EXAMPLE), "--bootstrap", "4", "--starts", "8", "--workers", "1",
                                   "--json", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    said, written = json.loads(res.stdout), json.loads((out / "fit.json").read_text())
    star = ("N_star", "D_star", "L_star")
    for d in (said, written):
        assert "r_phi_8" in d["ci_derived"] and not [k for k in d["ci_derived"] if k.startswith(star)]
        assert d["ci_derived_at_search_edge"] == []
    tab = pq.read_table(out / "bootstrap.parquet")
    assert "r_phi_8" in tab.column_names and not [c for c in tab.column_names if c.startswith(star)]
    meta = json.loads(tab.schema.metadata[b"loopscale.bootstrap"])
    assert not [k for k in meta["ci_derived"] if k.startswith(star)]


def test_several_token_budgets_keep_the_frontier_and_an_interval_on_the_search_range_is_named():
    import numpy as np
    import pandas as pd

    from loopscale.fit.bootstrapping import BootstrapResult, derived_columns
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    # a third of the runs at twice the tokens, a third at four times: three token budgets (two leave E, B and
    # beta unidentified, and no frontier)
    for k, times in ((1, 2), (2, 4)):
        more = df["seed"] % 3 == k
        df.loc[more, ["D", "C"]] = df.loc[more, ["D", "C"]] * times
    law = make_law("joint")
    data = prepare(df, law)
    params = pd.DataFrame([{"E": 1.5, "A": 3.0, "alpha": 0.3, "B": 50.0, "beta": 0.3, "phi": 0.5}])
    cols = derived_columns(params, data, law)
    # 24 distinct C (a C per depth and budget), more than FLOP_BUDGETS_MAX: the frontier at 4 spanning them
    assert np.unique(data.cols["C"]).size == 24
    assert len([c for c in cols.columns if c.startswith("N_star_r8_C")]) == 4
    ci = {"N_star_r8_C1e+11": (999.9999999, 5e6), "N_star_r1_C1e+11": (2e3, 5e6), "D_star_r1_C1e+11": (1e3, 2e3),
          "N_star_r2_C1e+11": (1e4, 1e15 * (1 + 1e-9))}
    b = BootstrapResult(law="joint", B=1, block_by=None, draws=pd.DataFrame({"ok": [True]}), ci={}, ci_derived=ci,
                        level=0.95, n_degenerate=0, degenerate_by_kind={}, n_failed=0, warm_start_share=0.0)
    assert b.ci_derived_at_search_edge == ["N_star_r8_C1e+11", "N_star_r2_C1e+11"]
    assert b.to_dict()["ci_derived_at_search_edge"] == b.ci_derived_at_search_edge
    assert np.isfinite(cols.to_numpy()).all()


def test_a_second_fit_into_a_folder_another_fit_writes_is_refused(tmp_path):
    """Two concurrent `fit --out` into one folder both said "wrote fit.json" and one fit was lost: while one fit
    holds the folder, another is refused (exit 2) before fitting; no lock file is left."""
    import fcntl
    import os

    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    out = tmp_path / "o"
    out.mkdir()
    args = ["fit", str(EXAMPLE), "--starts", "8", "--out", str(out)]
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running `loopscale fit --out o` holds it
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
        assert "another `loopscale fit` is writing its fit there now" in " ".join(res.output.split())
        assert list(out.iterdir()) == []
    finally:
        os.close(fd)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["fit.json", "fit_curves.png", "residuals.png"]
    fd = os.open(out, os.O_RDONLY)  # released when the fit ended
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    # a refused table leaves no folder behind (the lock created it)
    bad = tmp_path / "bad.csv"
    bad.write_text("loss,D\n3.0,1e6\n")
    res = CliRunner().invoke(app, ["fit", str(bad), "--out", str(tmp_path / "new" / "fit")])
    assert res.exit_code == 2 and not (tmp_path / "new").exists(), res.output


def test_a_folder_of_runs_and_their_analysis_is_a_runs_folder_for_fit_out(tmp_path):
    """docs/example_cpu/second_seeds holds runs.parquet and fit/analysis.json only (no run_meta.json, no logs/):
    --out second_seeds/fit was refused as the run's analysis, while --out second_seeds itself was accepted and
    wrote a loose fit.json beside the runs that `loopscale report` reads as the run's. Both are refused now."""
    import shutil

    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    run = tmp_path / "second_seeds"
    (run / "fit").mkdir(parents=True)
    shutil.copy(EXAMPLE / "runs.parquet", run / "runs.parquet")
    (run / "fit" / "analysis.json").write_text("{}")
    for target, where in ((run, "is the output folder of the `loopscale run`"),
                          (run / "fit", "the analysis of the `loopscale run`")):  # fmt: skip
        res = CliRunner().invoke(app, ["fit", str(run), "--starts", "5", "--out", str(target)])
        assert res.exit_code == 2, res.output
        msg = " ".join(res.output.split())
        assert where in msg and f"--out {run / 'my_fit'}" in msg, msg
    assert sorted(p.name for p in run.rglob("*")) == ["analysis.json", "fit", "runs.parquet"]
    res = CliRunner().invoke(app, ["fit", str(run), "--starts", "5", "--out", str(run / "my_fit")])
    assert res.exit_code == 0 and (run / "my_fit" / "fit.json").is_file(), res.output


def test_fit_with_its_own_ray_options_keeps_rays_info_lines_off_the_console():
    """`fit --bootstrap N --workers 2 --ray-temp-dir DIR` printed Ray's INFO lines (the token-authentication notice,
    "Started a local Ray instance") on stderr, as the bootstrap's own embedded Ray does not."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    tmp = tempfile.mkdtemp(prefix="lsfit", dir="/tmp")  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    try:
        p = subprocess.run(
            [sys.executable, "-m", "loopscale.sweep.cli", "fit", str(EXAMPLE), "--bootstrap", "4", "--workers", "2",
             "--starts", "5", "--json", "--ray-temp-dir", tmp],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["bootstrap"]["B"] == 4
    # Ray's warnings and errors still show (fit/cli.py says so): on a machine whose disk was over 95% full the raylet's
    # file_system_monitor error came between them; it is the machine's, and no INFO line is let through with it
    lines = p.stderr.splitlines()
    assert not [ln for ln in lines if " INFO " in ln or "Started a local Ray instance" in ln], p.stderr
    assert [ln for ln in lines if not _rays_warning_or_error(ln)] == ["bootstrap: 1/1 chunks"], p.stderr


def _rays_warning_or_error(line: str) -> bool:
    """A raylet's or GCS's own WARNING/ERROR log line forwarded to the driver, e.g.
    ``(raylet) [2026-12-06 00:46:15,574 E 24978 24989] (raylet) file_system_monitor.cc:116: ... over 95% full``."""
    import re

    plain = re.sub(r"\x1b\[[0-9;]*m", "", line)
    return re.match(r"\((raylet|gcs_server)[^)]*\) \[[0-9-]+ [0-9:,]+ [WEC] ", plain) is not None


def test_the_fit_out_lock_neither_removes_the_holders_folder_nor_stops_a_fit_where_flock_fails(tmp_path, monkeypatch):
    """A fit refused because another holds the folder removed that folder when it was still empty (the other fit
    had just created it); a file system without flock (ENOSYS, e.g. Lustre mounted noflock) ended the fit in a
    traceback. The refused fit now leaves the folder, and a lock that cannot be taken is a warning."""
    import errno
    import fcntl
    import os

    from loopscale.fit.cli import _out_dir_lock

    out = tmp_path / "new" / "o"
    # two fits start at once into a folder that does not exist: both create it, the other fit takes the lock first
    real_open, held = os.open, []

    def other_fit_locks_first(path, flags, *a):
        fd = real_open(path, flags, *a)
        other = real_open(path, flags, *a)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.append(other)
        return fd

    monkeypatch.setattr(os, "open", other_fit_locks_first)
    with pytest.raises(ValueError, match="another `loopscale fit` is writing"):
        with _out_dir_lock(out):
            pass
    monkeypatch.setattr(os, "open", real_open)
    assert out.is_dir()  # the other fit's folder, still empty, is left to it
    os.close(held[0])
    with _out_dir_lock(out):  # free again once the other fit ends
        pass

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.warns(UserWarning, match="cannot be locked .*would not be refused"):
        with _out_dir_lock(out):
            (out / "fit.json").write_text("{}")
    assert (out / "fit.json").is_file()
    # unlocked, a fit refused for its table still removes the folders it created
    with pytest.warns(UserWarning, match="cannot be locked"), pytest.raises(ValueError, match="bad table"):
        with _out_dir_lock(tmp_path / "new2" / "o"):
            raise ValueError("bad table")
    assert not (tmp_path / "new2").exists()


def test_a_bootstrap_of_one_does_not_blame_the_data_for_its_one_point_intervals():
    """`fit --bootstrap 1` starred every parameter as 'the data do not pin this parameter down (... another basin)':
    one resample gives each parameter an interval of one point, which no estimate but its own lies in."""
    from typer.testing import CliRunner

    from loopscale.fit.bootstrapping import ESTIMATE_OUTSIDE_CI_NOTE, estimate_outside_note
    from loopscale.sweep.cli import app

    res = CliRunner().invoke(app, ["fit", str(EXAMPLE), "--bootstrap", "1", "--starts", "8", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "* estimate outside its bootstrap interval, which rests on 1 refitted resample(s): too few to say" in res.stdout
    assert ESTIMATE_OUTSIDE_CI_NOTE not in res.stdout
    assert estimate_outside_note(200) == estimate_outside_note(None) == ESTIMATE_OUTSIDE_CI_NOTE


def test_write_fit_outputs_refuses_a_runs_own_folders_as_fit_out_does(tmp_path):
    """write_fit_outputs (the Python twin of `fit --out`) wrote into a run's folder and into its fit/baseline,
    moving the run's own fit files aside, so that `loopscale report` then said its bootstrap.parquet and figures
    were missing. It refuses those folders as `fit --out` does, before anything is moved; a folder of its own is
    written as before."""
    import shutil

    import loopscale.fit as lf

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "docs" / "example_cpu_seeds4", run)
    before = sorted(p.name for p in (run / "fit" / "baseline").iterdir())
    tf = lf.fit_table(run / "runs.parquet", starts=8)
    for where, said in ((run, "is the output folder of the `loopscale run`"),
                        (run / "fit" / "baseline", "the analysis of the `loopscale run`"),
                        (run / "logs", "is inside")):  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(f"out_dir={str(where)!r} ") + ".*" + re.escape(said)):
            lf.write_fit_outputs(where, tf, plots=False)
    assert sorted(p.name for p in (run / "fit" / "baseline").iterdir()) == before
    assert not (run / "fit.json").exists()
    written = lf.write_fit_outputs(tmp_path / "mine", tf, plots=False)
    assert set(written) >= {"fit.json"} and (tmp_path / "mine" / "fit.json").is_file()
