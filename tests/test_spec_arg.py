"""SPEC, --preset and the default --out are resolved one way by tune-lr, sweep, run and design, so that the staged
commands compose: `tune-lr smoke` writes the LR table where `sweep smoke` and `run --preset smoke` read it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from loopscale.sweep import commands
from loopscale.sweep.cli import app
from loopscale.sweep.presets import PRESETS, preset_spec, resolve_spec
from loopscale.sweep.spec import spec_to_yaml

ROOT = Path(__file__).resolve().parents[1]


def test_resolve_spec_preset_name_file_and_conflicts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec, name = resolve_spec("smoke", None)
    assert name == "smoke" and spec == preset_spec("smoke")
    assert resolve_spec(None, "paper")[1] == "paper"
    assert resolve_spec(None, None)[1] == "cpu"
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(PRESETS["smoke"]))
    spec, name = resolve_spec(str(mine), None)
    assert name == "mine" and spec == preset_spec("smoke")
    # a file named like a preset wins over the preset, said (it was silent: the preset seemed to run)
    d = dict(PRESETS["smoke"], sizes=[16])
    (tmp_path / "smoke").write_text(yaml.safe_dump(d))
    with pytest.warns(UserWarning, match=rf"SPEC 'smoke' is read from the file {tmp_path / 'smoke'}, not the preset "
                                         r"of that name \(--preset smoke runs the preset\)"):  # fmt: skip
        assert resolve_spec("smoke", None)[0].sizes == [16]
    with pytest.raises(ValueError, match="not both"):
        resolve_spec(str(mine), "cpu")
    with pytest.raises(ValueError, match="not both"):
        resolve_spec("cpu", "smoke")
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_spec("nosuch.yaml", None)


def test_a_folder_named_like_a_preset_does_not_hide_the_preset(tmp_path, monkeypatch):
    """`loopscale run smoke` where the working directory holds a folder `smoke` (e.g. the run folder of an earlier
    `--out smoke`) runs the preset: it said "sweep spec not found: smoke" (the folder existed, so the preset name was
    not looked up). A folder named otherwise is refused saying it is a folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smoke").mkdir()
    spec, name = resolve_spec("smoke", None)
    assert name == "smoke" and spec == preset_spec("smoke")
    (tmp_path / "mine").mkdir()
    with pytest.raises(FileNotFoundError, match=r"sweep spec mine is a folder; give a YAML file .*mine/spec.yaml"):
        resolve_spec("mine", None)
    res = CliRunner().invoke(app, ["run", "smoke", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output


def _fake_stages(monkeypatch, calls):
    """tune-lr and sweep without Ray: record (stage, spec name, out) and write what the real stage would."""

    def fake_tune_lr(spec, out, **kw):
        calls.append(("tune-lr", spec.name, Path(out)))
        table = pa.table({"size": [16], "r": [1], "lr": [0.01], "lr_best": [0.01], "lr_smoothed": [0.01],
                          "best_val_loss": [3.0], "n_trials": [2], "n_pruned": [0]})  # fmt: skip
        Path(out).mkdir(parents=True, exist_ok=True)
        pq.write_table(table, Path(out) / "lr_table.parquet")
        return table

    def fake_sweep(spec, out, **kw):
        from loopscale.sweep.spec import record_folder_spec

        calls.append(("sweep", spec.name, Path(out)))
        Path(out).mkdir(parents=True, exist_ok=True)
        record_folder_spec(out, spec)  # as the real stage does before training
        from loopscale.sweep.store import ResultsStore, run_record

        store = ResultsStore(out)  # one finished run, a cell of the spec (a run id of no cell is refused next time)
        store.write_run(run_record(spec.cells()[0], {"status": "ok", "final_val_loss": 3.0}))
        store.consolidate()
        return Path(out) / "runs.parquet"

    monkeypatch.setattr(commands, "run_tune_lr", fake_tune_lr)
    monkeypatch.setattr(commands, "run_sweep", fake_sweep)


def test_tune_lr_prints_its_table_rounded(tmp_path, monkeypatch):
    """The LR table lines round the LR to 4 significant digits and the loss to 4 decimals (the Parquet table keeps
    every digit)."""
    monkeypatch.chdir(tmp_path)

    def fake_tune_lr(spec, out, **kw):
        table = pa.table({"size": [16], "r": [1], "lr": [0.021180064223925408], "lr_best": [0.021180064223925408],
                          "lr_smoothed": [0.021180064223925398], "best_val_loss": [3.687917172908783],
                          "n_trials": [6], "n_pruned": [2]})  # fmt: skip
        Path(out).mkdir(parents=True, exist_ok=True)
        pq.write_table(table, Path(out) / "lr_table.parquet")
        return table

    monkeypatch.setattr(commands, "run_tune_lr", fake_tune_lr)
    res = CliRunner().invoke(app, ["tune-lr", "smoke"])
    assert res.exit_code == 0, res.output
    assert "size    16 r  1: lr 0.02118 (best 0.02118, smoothed 0.02118, val 3.6879, 6 trials, 2 pruned)" in res.output
    assert pq.read_table(tmp_path / "runs" / "smoke" / "lr_table.parquet")["lr"][0].as_py() == 0.021180064223925408


def test_staged_commands_default_to_the_run_folder(tmp_path, monkeypatch):
    """`tune-lr smoke`, `sweep --preset smoke` and `sweep configs/smoke.yaml` all land in runs/smoke, the folder of
    `loopscale run --preset smoke`; --out still wins."""
    monkeypatch.chdir(tmp_path)
    calls: list = []
    _fake_stages(monkeypatch, calls)
    for argv in (["tune-lr", "smoke"], ["sweep", "--preset", "smoke"], ["sweep", str(ROOT / "configs" / "smoke.yaml")],
                 ["sweep", "smoke", "--out", "elsewhere"]):  # fmt: skip
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 0, (argv, res.output)
        if argv[0] == "sweep":
            assert "1 runs (ok 1) -> " in res.output, res.output  # counts, not a Python dict
    assert calls == [
        ("tune-lr", "smoke", Path("runs/smoke")),
        ("sweep", "smoke", Path("runs/smoke")),
        ("sweep", "smoke", Path("runs/smoke")),
        ("sweep", "smoke", Path("elsewhere")),
    ]
    assert (tmp_path / "runs" / "smoke" / "lr_table.parquet").is_file()
    res = CliRunner().invoke(app, ["sweep", "smoke", "--preset", "cpu"])
    assert res.exit_code == 2 and "not both" in res.output and len(calls) == 4


def test_stage_refuses_another_specs_run_folder(tmp_path, monkeypatch):
    """A sweep (or tune-lr) into the folder of a `loopscale run` of another spec would mix two grids in one
    runs.parquet: refused before anything runs, the folder unchanged; the same spec (other storage) is accepted."""
    monkeypatch.chdir(tmp_path)
    calls: list = []
    _fake_stages(monkeypatch, calls)
    out = tmp_path / "runs" / "smoke"
    out.mkdir(parents=True)
    other = preset_spec("smoke").model_copy(update={"sizes": [16]})
    (out / "spec.yaml").write_text(spec_to_yaml(other))
    before = sorted(p.name for p in out.iterdir())
    for argv in (["sweep", "smoke"], ["tune-lr", "smoke"]):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2 and "holds a run of a different spec" in res.output, res.output
    assert calls == [] and sorted(p.name for p in out.iterdir()) == before
    (out / "spec.yaml").write_text(spec_to_yaml(preset_spec("smoke")))
    res = CliRunner().invoke(app, ["sweep", "smoke", "--storage", str(tmp_path / "state")])
    assert res.exit_code == 0, res.output
    assert calls == [("sweep", "smoke", Path("runs/smoke"))]


def test_run_and_design_accept_a_preset_name_as_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["run", "smoke", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    assert '"runs": 16' in res.stdout
    res = CliRunner().invoke(app, ["run", "smoke", "--preset", "cpu", "--dry-run"])
    assert res.exit_code == 2 and "not both" in res.output


class _Stop(Exception):
    """Raised where Ray would start: the tests of what a command says and writes before that stop there."""


@pytest.fixture
def stop_at_ray(monkeypatch):
    """Ray's start (``loopscale.cluster.connect.ray_session``) raises :class:`_Stop`; returns that class."""
    import loopscale.cluster.connect as connect

    def no_ray(*a, **k):
        raise _Stop

    monkeypatch.setattr(connect, "ray_session", no_ray)
    return _Stop


def test_tune_lr_on_a_fixed_lr_spec_says_its_table_will_not_be_used(tmp_path, monkeypatch, capsys, stop_at_ray):
    from loopscale.sweep.lr_search import run_tune_lr

    with pytest.raises(stop_at_ray):
        run_tune_lr(preset_spec("smoke"), tmp_path / "o")  # smoke: lr: {fixed: 0.01}
    err = capsys.readouterr().err
    assert "note: the spec fixes the LR (lr: fixed: 0.01)" in err and "will not use this LR table" in err
    from loopscale.sweep.lr_search import study_keys, trials_per_study

    n, k = len(study_keys(preset_spec("smoke"))), trials_per_study(preset_spec("smoke").tune)
    assert f"this tunes {n} studies of {k} trials each for reference" in " ".join(err.split()), err  # what it costs
    tuned = preset_spec("smoke").model_copy(update={"lr": "tune"})
    with pytest.raises(stop_at_ray):
        run_tune_lr(tuned, tmp_path / "p")
    assert "fixes the LR" not in capsys.readouterr().err


def test_tune_lr_resume_of_nothing_says_so(tmp_path, monkeypatch, capsys, stop_at_ray):
    """`tune-lr --resume` where no LR tuning ran (a mistyped folder) says a new tuning starts, as `sweep --resume`
    does; a folder with earlier studies gets no such line."""
    from loopscale.sweep.lr_search import run_tune_lr

    tuned = preset_spec("smoke").model_copy(update={"lr": "tune"})
    out = tmp_path / "o"
    with pytest.raises(stop_at_ray):
        run_tune_lr(tuned, out, resume=True)
    assert f"--resume: nothing to resume in {out} (no earlier LR tuning there)" in capsys.readouterr().err
    (out / "tune_lr" / "lr_smoke_s16_r1").mkdir()  # an earlier study's Tune folder
    with pytest.raises(stop_at_ray):
        run_tune_lr(tuned, out, resume=True)
    assert "nothing to resume" not in capsys.readouterr().err


def test_run_resume_of_a_new_folder_says_so_once(tmp_path, monkeypatch, capfd, stop_at_ray):
    """`run --resume` on a new folder with `lr: tune` said "nothing to resume" twice: of the folder, then again of
    the LR tuning it started."""
    import contextlib

    from loopscale.cluster.options import ClusterOptions

    # stop_at_ray: the LR stage stops as it starts Ray, after its notes
    monkeypatch.setattr(ClusterOptions, "session", lambda self, **k: contextlib.nullcontext())  # run's own session
    tuned = preset_spec("smoke").model_copy(update={"lr": "tune"})
    f = tmp_path / "t.yaml"
    f.write_text(spec_to_yaml(tuned))
    res = CliRunner().invoke(app, ["run", str(f), "--out", str(tmp_path / "new"), "--resume"])
    assert isinstance(res.exception, stop_at_ray), res.output
    said = res.output + capfd.readouterr().err
    assert said.count("nothing to resume") == 1 and "(no earlier run there)" in said, said


def test_sweep_and_tune_lr_folders_record_their_spec_and_refuse_another(tmp_path, monkeypatch, stop_at_ray):
    """`sweep` and `tune-lr` record the folder's spec as `run` does: a sweep of another spec into a sweep or tune-lr
    folder is refused before anything is written (it had mixed two grids in one runs.parquet, or trained with an LR
    table tuned for another spec), and `loopscale status` names the spec of a tune-lr folder."""
    from loopscale.sweep.commands import run_sweep
    from loopscale.sweep.lr_search import run_tune_lr
    from loopscale.sweep.status import collect_status

    tuned = preset_spec("smoke").model_copy(update={"lr": "tune"})
    out = tmp_path / "o"
    with pytest.raises(stop_at_ray):
        run_tune_lr(tuned, out)
    assert (out / "spec.yaml").read_text() == spec_to_yaml(tuned)
    st = collect_status(out)
    assert st["spec"] == "smoke" and st["kind"] == "tune-lr"
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    other = tuned.model_copy(update={"sizes": [16]})
    for call in (lambda: run_sweep(other, out), lambda: run_tune_lr(other, out)):
        with pytest.raises(ValueError, match=r"holds a run of a different spec .*it differs in sizes: \[16, 32\] -> \[16\]\)"):
            call()
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    # the same spec with its Tune state elsewhere is the same folder's spec
    with pytest.raises(stop_at_ray):
        run_tune_lr(tuned.model_copy(update={"storage_path": str(tmp_path / "state")}), out)


def test_ray_option_errors_come_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for cmd in ("sweep", "tune-lr"):
        for extra in (["--num-cpus", "1", "--address", "auto"], ["--ray-temp-dir", "rel/tmp"]):
            res = CliRunner().invoke(app, [cmd, "smoke", "--out", "o", *extra])
            assert res.exit_code == 2 and "error:" in res.output, (cmd, extra, res.output)
    assert not (tmp_path / "o").exists()


def test_fit_defaults_follow_the_spec_not_its_file_name(tmp_path):
    """A copy of configs/smoke.yaml under another file name fitted with 500 starts instead of the smoke spec's 100."""
    from loopscale.sweep.run import fit_defaults

    copy = tmp_path / "smokecopy.yaml"
    copy.write_text((ROOT / "configs" / "smoke.yaml").read_text())
    spec, name = resolve_spec(str(copy), None)
    assert name == "smokecopy" and fit_defaults(spec) == fit_defaults(preset_spec("smoke")) == (100, 100)
    assert fit_defaults(preset_spec("cpu")) == (200, 500)
    assert fit_defaults(preset_spec("smoke").model_copy(update={"name": "mine"})) == (200, 500)  # the paper's


def test_tune_lr_checks_a_fixed_lr_table_before_ray(tmp_path, monkeypatch):
    """tune-lr of a spec with `lr: {table: ...}` missing an r: refused before Ray starts and before the folder is
    made (it ran 7 s of Ray, then failed); `sweep` refuses the same spec the same way."""
    import loopscale.cluster.connect as connect
    from loopscale.sweep.commands import run_tune_lr
    from loopscale.sweep.spec import SpecError

    def no_ray(*a, **k):
        raise AssertionError("Ray started")

    monkeypatch.setattr(connect, "ray_session", no_ray)
    update = {"sizes": [16, 32], "lr": {"table": {16: {1: 0.01}, 32: 0.02}}}
    with pytest.raises(SpecError, match=r"lr.table\[16\] has no entry for r = 2, 4, 8"):  # a spec's own copy
        preset_spec("smoke").model_copy(update=update)
    import pydantic

    spec = pydantic.BaseModel.model_copy(preset_spec("smoke"), update=update)  # built unvalidated, as before
    with pytest.raises(SpecError, match=r"lr.table\[16\] has no entry for r=2"):
        run_tune_lr(spec, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_tracking_lines_come_also_after_a_ctrl_c(tmp_path, monkeypatch, capfd):
    """`sweep` and `run` with --track say where the logs are also when the command is interrupted (what was logged
    before the Ctrl-C is there); before, the TensorBoard line came only after a finished command. An error (bad
    input) stays one line."""
    from loopscale.sweep import run as run_mod

    monkeypatch.chdir(tmp_path)

    def interrupted(spec, out, **kw):
        (Path(out) / "tensorboard" / "grid_smoke_001").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "run_sweep", interrupted)
    monkeypatch.setattr(run_mod, "run_pipeline", interrupted)
    for argv in (["sweep", "smoke", "--out", "a", "--track", "tensorboard"],
                 ["run", "smoke", "--out", "b", "--track", "tensorboard"]):  # fmt: skip
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 130 and "interrupted" in res.output, (argv, res.output)
        out = (tmp_path / argv[3]).resolve() / "tensorboard"
        said = capfd.readouterr().out  # the console session writes to the process's own stdout
        assert f"TensorBoard logs: {out} (view: " in said, (argv, said)

    def refused(spec, out, **kw):  # bad input found by the stage: its one error line, no tracking line
        raise ValueError("corpus file 'x' does not exist")

    monkeypatch.setattr(commands, "run_sweep", refused)
    res = CliRunner().invoke(app, ["sweep", "smoke", "--out", "c", "--track", "tensorboard"])
    assert res.exit_code == 2 and "corpus file 'x' does not exist" in res.output, res.output
    assert "TensorBoard" not in capfd.readouterr().out


def test_a_relative_corpus_found_only_beside_the_spec_is_named_with_the_fix(tmp_path, monkeypatch):
    """`corpus: data.txt` is read from the working directory (documented); run from the spec's parent folder, the
    error said only that <cwd>/data.txt does not exist. It now names the file beside the spec and the fixes, before
    anything is written; from the spec's folder, or with the file in the working directory, the spec is read."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "data.txt").write_text("some prose " * 200)
    (proj / "spec.yaml").write_text(yaml.safe_dump({**PRESETS["smoke"], "corpus": "data.txt"}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"corpus 'data.txt' of proj/spec.yaml does not exist in the working "
                                                r"directory .*; it exists beside the spec \(.*/proj/data.txt\): "
                                                r"write corpus: proj/data.txt \(that path from the working "
                                                r"directory\)"):  # fmt: skip
        resolve_spec("proj/spec.yaml", None)
    res = CliRunner().invoke(app, ["run", "proj/spec.yaml", "--out", str(tmp_path / "o"), "--dry-run"])
    assert res.exit_code == 2 and "it exists beside the spec" in res.output and not (tmp_path / "o").exists()
    monkeypatch.chdir(proj)
    assert resolve_spec("spec.yaml", None)[0].corpus == str(proj / "data.txt")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.txt").write_text("other prose " * 200)  # a file where the path is read: that one is meant
    assert resolve_spec("proj/spec.yaml", None)[0].corpus == str(tmp_path / "data.txt")


def test_a_spec_written_in_its_folder_keeps_its_own_text_beside_the_recorded_one(tmp_path, monkeypatch):
    """`loopscale sweep OUT/spec.yaml --out OUT` rewrote the user's spec.yaml as loopscale records a spec (comments
    gone, paths absolute, defaults dropped), keeping nothing of the text. Its text is now kept beside it, once,
    with a warning."""
    from loopscale.sweep.presets import preset_spec
    from loopscale.sweep.spec import FOLDER_SPEC, record_folder_spec, spec_to_yaml

    spec = preset_spec("smoke")
    out = tmp_path / "mine"
    out.mkdir()
    given = "# my notes on this grid\n" + spec_to_yaml(spec)
    (out / FOLDER_SPEC).write_text(given)
    with pytest.warns(UserWarning, match=r"spec.yaml is rewritten as loopscale records a spec .* its text as it was, "
                                         r"comments included, is kept in .*spec.yaml.given-\d{8}T\d{6}$"):  # fmt: skip
        record_folder_spec(out, spec, corpus=False)
    copies = sorted(out.glob(f"{FOLDER_SPEC}.given-*"))
    assert len(copies) == 1 and copies[0].read_text() == given
    assert (out / FOLDER_SPEC).read_text() == spec_to_yaml(spec)
    record_folder_spec(out, spec, corpus=False)  # the same text now: no second copy
    assert sorted(out.glob(f"{FOLDER_SPEC}.given-*")) == copies
