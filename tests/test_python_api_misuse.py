"""The Python API as a notebook uses it: a function given another one's result, a section's changed copy, a file
where a folder belongs, arrays of other lengths. Each gets a clear error (or a warning) naming what to give, and
nothing already written is lost."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_cpu"


def _one_d_table(n_seeds: int = 1) -> pd.DataFrame:
    """A joint-law table at one token budget D (as the ``cpu`` preset's): r in {1, 2, 4}, four widths."""
    rows = []
    for r in (1, 2, 4):
        for d in (16, 24, 32, 48):
            n_once, n_rec = 24.0 * d * d, (96 / r) * d * d
            loss = 1.5 + 30 * (n_once + r**0.5 * n_rec) ** -0.3 + 0.01 * ((d * r) % 7 - 3) / 3
            rows.append({"r": r, "N_once": n_once, "N_rec": n_rec, "D": 1e6, "C": 6e6 * (n_once + r * n_rec),
                         "loss": loss})  # fmt: skip
    return pd.DataFrame(rows)


def test_a_sections_changed_copy_gets_a_spec_files_checks():
    """``spec.model_copy(update={"tune": spec.tune.model_copy(...)})`` (the README's way to change one key of a
    section) is checked as the same values in a spec file: pydantic's ``model_copy`` of the section checks nothing,
    and a negative ``num_samples`` or ``cpus`` passed into a spec that then checked as valid."""
    from loopscale.sweep import SpecError, preset_spec

    s = preset_spec("smoke")
    with pytest.raises(SpecError) as e:
        s.model_copy(update={"tune": s.tune.model_copy(update={"num_samples": -3}),
                             "resources": s.resources.model_copy(update={"cpus": -1})})  # fmt: skip
    assert "tune.num_samples" in str(e.value) and "resources.cpus" in str(e.value)
    with pytest.raises(SpecError, match="model.preset"):
        s.model_copy(update={"model": s.model.model_copy(update={"preset": "foo"})})
    with pytest.raises(SpecError, match="num_sample"):  # a misspelt key pydantic's model_copy took silently
        s.model_copy(update={"tune": s.tune.model_copy(update={"num_sample": 4})})
    with pytest.raises(SpecError, match="training.batch_tokens"):
        s.model_copy(update={"training": s.training.model_copy(update={"batch_tokens": "banana"})})
    # a valid changed copy keeps the section's other keys (the preset's eval_tokens, not the default)
    t = s.model_copy(update={"training": s.training.model_copy(update={"batch_tokens": 512})})
    assert t.training.batch_tokens == 512 and t.training.eval_tokens == s.training.eval_tokens
    assert t.training.eval_tokens != type(s.training)().eval_tokens  # the test tells the two apart


def test_write_fit_outputs_takes_fit_tables_result(tmp_path):
    """``write_fit_outputs(out, fit_table(...))`` writes the TableFit's fit (it moved the earlier fit aside and then
    failed with AttributeError, leaving no fit.json); a fit of another type is refused before anything moves."""
    from loopscale.fit import fit_table, write_fit_outputs

    tf = fit_table(_one_d_table().assign(variant="baseline"), starts=10)
    files = write_fit_outputs(tmp_path, tf, plots=False)
    d = json.loads((tmp_path / "fit.json").read_text())
    assert set(files) == {"fit.json"} and d["params"]["phi"] == tf.fit.params["phi"] and d["variant"] == "baseline"
    before = (tmp_path / "fit.json").read_text()
    with pytest.raises(TypeError, match="give a FitResult"):
        write_fit_outputs(tmp_path, tf.fit.params, plots=False)
    with pytest.raises(TypeError, match="BootstrapResult"):
        write_fit_outputs(tmp_path, tf.fit, boot={"phi": [0.1, 0.2]}, plots=False)
    assert (tmp_path / "fit.json").read_text() == before and not list(tmp_path.glob("earlier_fit_*"))


def test_results_store_refuses_a_file_for_its_folder(tmp_path):
    """``ResultsStore("OUT/runs.parquet")`` read no runs and said nothing; it names the folder to give."""
    from loopscale.sweep.store import ResultsStore

    (tmp_path / "runs.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"is a file, not a run folder; give its folder"):
        ResultsStore(tmp_path / "runs.parquet")
    assert ResultsStore(tmp_path / "new").runs().num_rows == 0  # a folder not made yet is an empty store


def test_frontier_of_a_one_budget_fit_warns():
    """The report says "Not computed" of the frontier of a fit to one token budget (B and beta are not
    identified); the API's compute_optimal_frontier says so too, and still answers a params dict as given."""
    from loopscale.fit import compute_optimal_frontier, fit_table

    t = _one_d_table()
    tf = fit_table(t, starts=10)
    for fit in (tf.fit, tf):  # a FitResult, or fit_table's TableFit (its point fit)
        with pytest.warns(UserWarning, match=r"one token budget \(D = 1e\+06 tokens\).*arbitrary split of the D-term"):
            fr = compute_optimal_frontier(fit, t, [1e12, 1e13])
        assert len(fr) == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compute_optimal_frontier(dict(tf.fit.params), t, [1e12])


def test_read_table_of_a_folder_without_a_runs_table(tmp_path):
    """A folder without runs.parquet was read as a Parquet dataset of every file under it: a Tune folder's error
    blamed a checkpoint file, an empty one listed missing columns. Now: no Parquet file is said as such, and a
    run folder gets the message that says what rebuilds its table."""
    from loopscale.fit.io import read_table

    tune = tmp_path / "tune" / "trial" / "checkpoint_000"
    tune.mkdir(parents=True)
    (tune / "ckpt-00000004.pt").write_bytes(b"\x80\x02not parquet")
    for folder in (tmp_path / "tune", tmp_path / "tune" / "trial" / "checkpoint_000"):
        with pytest.raises(ValueError, match="is a folder without runs.parquet or any Parquet file"):
            read_table(folder)
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "spec.yaml").write_text("name: x\n")
    with pytest.raises(ValueError) as e:
        read_table(run)
    assert "runs.parquet not found" in str(e.value)
    assert "is a folder without runs.parquet or any Parquet file" not in str(e.value)
    ds = tmp_path / "ds"  # a folder of Parquet files is still a table, whatever its files' suffixes
    (ds / "year=1").mkdir(parents=True)
    _one_d_table().to_parquet(ds / "part-0")  # Parquet files named without a suffix, as Spark writes them
    _one_d_table().to_parquet(ds / "year=1" / "part-00000")
    assert len(read_table(ds)) == 24
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="is a folder without runs.parquet or any Parquet file"):
        read_table(empty)


def test_equivalence_names_arrays_of_other_shapes_and_zero_parameters():
    from loopscale.fit import equivalence

    with pytest.raises(ValueError, match=r"one shape; got shapes N_once \(3,\), N_rec \(2,\), r \(2,\)"):
        equivalence([1e5, 2e5, 3e5], [1e5, 1e5], [2, 4], 0.5)
    with pytest.raises(ValueError, match="N_once \\+ N_rec must be > 0"):
        equivalence(0, 0, 2, 0.5)
    out = equivalence(np.array([1e5, 2e5]), 1e5, 4, 0.5)  # a scalar beside an array broadcasts, as before
    assert np.allclose(out["N_eff"], [3e5, 4e5])


def test_an_odd_head_dim_is_named_before_a_d_model_is_suggested():
    """``head_dim=3`` with d_model 16 suggested d_model=18, which the odd head_dim then refused."""
    from loopscale.model import preset_config

    with pytest.raises(ValueError, match="head_dim must be even for RoPE, got 3"):
        preset_config("cpu", r=2, d_model=16, head_dim=3)
    with pytest.raises(ValueError, match="head_dim must be even for RoPE, got 3"):  # not "try width_scale=3"
        preset_config("paper", r=2, width_scale=1, head_dim=3)


def test_rows_whose_status_is_ok_spelt_otherwise_are_said_when_left_out(tmp_path):
    """A table of one's own with 'OK' on some rows among 'ok' ones: those rows were left out with no word (only a
    table of no exact 'ok' at all was refused, naming them)."""
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    t = _one_d_table().assign(status="ok")
    t.loc[[0, 5], "status"] = "OK"
    with pytest.warns(UserWarning, match=r"table: 2 rows with status 'OK' left out: .* write them as 'ok'"):
        data = prepare(t, make_law("joint"))
    assert data.n_excluded == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(t.assign(status="ok"), make_law("joint"))
    # `loopscale fit` hid it (it ignores "table: " warnings and prints the fit's input warnings, which lacked it)
    # and the fit's input_warnings lacked it too: a fit on 10 of 116 rows looked like any other
    from typer.testing import CliRunner

    from loopscale.fit.table_fit import fit_table
    from loopscale.sweep.cli import app

    with pytest.warns(UserWarning, match=r"table: 2 rows with status 'OK' left out") as seen:
        tf = fit_table(t, "joint", starts=4)
    assert sum("status 'OK'" in str(w.message) for w in seen) == 1  # said once, not by prepare and fit_table both
    assert tf.input_warnings[0].startswith("2 rows with status 'OK' left out")
    path = tmp_path / "t.csv"
    t.to_csv(path, index=False)
    for extra in ([], ["--json"]):
        res = CliRunner().invoke(app, ["fit", str(path), "--workers", "1", "--starts", "4", *extra])
        assert res.exit_code == 0, res.output
        assert "2 rows with status 'OK' left out" in " ".join(res.output.split()), res.output


def test_a_relative_corpus_not_found_says_how_it_was_read(tmp_path, monkeypatch):
    """`corpus: ../data/x.txt`, written relative to the spec's folder, run from another directory: "does not exist"
    with no word of the working directory (the note was given only to paths below it, and also to absolute ones
    written so)."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("some text " * 2000)
    (tmp_path / "specs").mkdir()
    rel, absolute = tmp_path / "specs" / "rel.yaml", tmp_path / "specs" / "abs.yaml"
    body = "r: [1, 2]\nsizes: [16]\ntokens: [2048]\nlr: {fixed: 0.01}\n"
    rel.write_text("corpus: ../data/x.txt\n" + body)
    absolute.write_text(f"corpus: {tmp_path / 'elsewhere' / 'x.txt'}\n" + body)
    monkeypatch.chdir(tmp_path / "specs")  # found: the relative path is read from here
    res = CliRunner().invoke(app, ["run", str(rel), "--dry-run", "--out", str(tmp_path / "o")])
    assert "does not exist" not in res.output, res.output
    monkeypatch.chdir(tmp_path)  # not found from here
    res = CliRunner().invoke(app, ["run", str(rel), "--dry-run", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "does not exist" in res.output, res.output
    assert (f"(a relative path in a spec, '../data/x.txt', is taken from the working directory, {tmp_path}, not from "
            "the spec's folder)") in " ".join(res.output.split()), res.output
    res = CliRunner().invoke(app, ["run", str(absolute), "--dry-run", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "does not exist" in res.output and "relative path in a spec" not in res.output


def test_low_level_arguments_are_refused_with_their_names():
    """lr_multiplier, WindowSampler and the loss modules took arguments that ended in ZeroDivisionError or a NaN
    loss: a warmup over every step with a step past the end, seq_len 0, windows of one token."""
    import numpy as np
    import torch

    from loopscale.model.config import iso_depth
    from loopscale.model.data import WindowSampler
    from loopscale.model.ensemble import EnsembleLM, EnsembleLoss
    from loopscale.model.looped import LMLoss, LoopedLM
    from loopscale.model.optim import lr_multiplier

    with pytest.raises(ValueError, match=r"step must be in \[0, total_steps\) = \[0, 10\), got 10"):
        lr_multiplier(10, 10, "linear", 0.0, 0.1)
    with pytest.raises(ValueError, match=r"warmup_frac must be in \[0, 1\), got 1.0"):
        lr_multiplier(3, 10, "linear", 1.0, 0.1)
    with pytest.raises(ValueError, match=r"final_lr_frac must be in \[0, 1\], got -0.5"):
        lr_multiplier(3, 10, "cosine", 0.0, -0.5)
    with pytest.raises(ValueError, match=r"decay_frac must be in \(0, 1\], got 0"):
        lr_multiplier(3, 10, "wsd", 0.0, 0.1, 0)
    assert lr_multiplier(9, 10, "linear", 0.0, 0.1) == pytest.approx(0.1 + 0.9 / 10)  # the last step still works

    stream = np.arange(1000, dtype=np.uint16)
    for kwargs, name in (({"seq_len": 0, "micro_batch_size": 2}, "seq_len"),
                         ({"seq_len": 8, "micro_batch_size": 0}, "micro_batch_size"),
                         ({"seq_len": 8.5, "micro_batch_size": 2}, "seq_len")):
        with pytest.raises(ValueError, match=f"{name} must be a whole number >= 1"):
            WindowSampler(stream, data_seed=0, **kwargs)

    cfg = iso_depth(16, 1, effective_depth=3, n_prelude=1, n_coda=1, vocab_size=32, seq_len=8, head_dim=16)
    one = torch.zeros(2, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"LMLoss takes windows \[B, T \+ 1\] of at least 2 tokens.*\(2, 1\)"):
        LMLoss(LoopedLM(cfg, seed=0))(one)
    with pytest.raises(ValueError, match=r"EnsembleLoss takes windows .*got shape \(2, 1\)"):
        EnsembleLoss(EnsembleLM(cfg, [0, 1]))(one)
    ok = torch.zeros(2, 2, dtype=torch.int64)
    assert torch.isfinite(LMLoss(LoopedLM(cfg, seed=0))(ok))


def test_an_out_folder_that_cannot_be_made_is_refused_before_work(tmp_path, monkeypatch):
    """`design --out /proc/foo` (as root, who passes os.access there) simulated for 6 s, then printed only the raw
    '[Errno 2] No such file or directory'; `run --out /proc/foo --dry-run` said refused: None. The check now makes
    (and removes) a probe folder where the folder would be created."""
    import errno
    import tempfile

    from typer.testing import CliRunner

    from loopscale.cluster.options import usable_out_dir
    from loopscale.sweep.cli import app

    ro = tmp_path / "ro"
    ro.mkdir()
    real = tempfile.mkdtemp

    def mkdtemp(*a, dir=None, **k):
        if dir is not None and Path(dir) == ro:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(ValueError, match=rf"--out {ro}/new/x cannot be created: no folder can be made in {ro} "
                                         r"\(Read-only file system\)"):  # fmt: skip
        usable_out_dir(ro / "new" / "x")
    ok = tmp_path / "ok"
    ok.mkdir()
    assert usable_out_dir(ok / "new" / "x") == ok / "new" / "x"
    assert list(ok.iterdir()) == []  # the probe is gone, nothing made
    assert usable_out_dir(ok) == ok  # an existing folder: no probe needed
    for cmd in (["run", "--preset", "smoke", "--dry-run"],
                ["design", "cpu", "--pilot", str(EXAMPLE / "runs.parquet"), "--n-sim", "2", "--minutes", "60"]):
        res = CliRunner().invoke(app, [*cmd, "--out", str(ro / "new")])
        assert res.exit_code == 2, res.output
        assert "no folder can be made in" in " ".join(res.output.split()), res.output


def test_runs_of_one_cell_that_are_not_seeds_are_said_when_averaged(tmp_path):
    """A table at one D with a second row per r = 8 cell at a worse LR was fitted as '20 cell means of 25 runs
    (seeds averaged)': the mean mixed the two LRs (phi 0.5 -> 0.39) with no word. Rows of one cell that differ in a
    run setting (lr, ...) or repeat a seed are now named; true seeds are not."""
    from typer.testing import CliRunner

    from loopscale.fit.analysis import not_replicates_note
    from loopscale.fit.table_fit import fit_table
    from loopscale.sweep.cli import app

    rng = np.random.default_rng(0)
    rows = []
    for r in (1, 2, 4, 8):
        for d in (16, 24, 32, 48, 64):
            n_once, n_rec = 24.0 * d * d, (96 / r) * d * d
            for seed in (0, 1):
                loss = 1.5 + 30 * (n_once + r**0.5 * n_rec) ** -0.3 + rng.normal(0, 0.002)
                rows.append({"r": r, "d_model": d, "N_once": n_once, "N_rec": n_rec, "D": 1e6, "loss": loss,
                             "lr": 0.01, "seed": seed})  # fmt: skip
    seeds = pd.DataFrame(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # true seeds: nothing said
        tf = fit_table(seeds, "joint", starts=4)
    assert tf.by_cell and tf.not_replicates is None
    sweep = seeds[seeds.seed == 0].copy()
    worse = sweep[sweep.r == 8].assign(lr=0.03, loss=lambda x: x.loss + 0.3)
    sweep = pd.concat([sweep, worse], ignore_index=True)
    with pytest.warns(UserWarning, match=r"table: the runs of one cell .* differ in 'lr' in 5 of 20 cells \(values "
                                         r"0.01, 0.03\); they repeat one 'seed' value in 5 of 20 cells: .* keep one "
                                         r"setting per cell"):  # fmt: skip
        tf = fit_table(sweep, "joint", starts=4)
    assert tf.not_replicates in tf.input_warnings and "per-run" not in tf.not_replicates
    cells = ("d_model", "r", "D")
    assert not_replicates_note(seeds.drop(columns="seed"), cells) is None
    # a seed column empty on every row, or one path per run (user tables keep such columns): true seeds still
    assert not_replicates_note(seeds.assign(seed=np.nan), cells) is None
    assert not_replicates_note(seeds.assign(checkpoint=[f"ck/{i}" for i in range(len(seeds))]), cells) is None
    same_seed = not_replicates_note(seeds.assign(seed=0), cells)
    assert same_seed.startswith("the runs of one cell (d_model, r, D) are averaged as seeds of one run, but they "
                                "repeat one 'seed' value in 20 of 20 cells") and "give each run its own seed" in same_seed
    path = tmp_path / "sweep.csv"
    sweep.to_csv(path, index=False)
    res = CliRunner().invoke(app, ["fit", str(path), "--workers", "1", "--starts", "4"])
    assert res.exit_code == 0, res.output
    assert "warning: the runs of one cell" in res.output and "differ in 'lr'" in " ".join(res.output.split())


def test_a_budget_column_empty_on_some_runs_is_not_the_blocking():
    """budget empty on the r = 1 rows put every r = 1 run in one bootstrap block (groupby with dropna=False), and
    the phi interval widened by ~60 % with no word. The default blocking now leaves such a column aside and says so."""
    from loopscale.fit.table_fit import fit_table

    rng = np.random.default_rng(0)
    rows = []
    for c in (1e15, 3e15, 1e16):
        for r in (1, 2, 4):
            for d in (16, 24, 32, 48):
                n_once, n_rec = 24.0 * d * d, (96 / r) * d * d
                D = c / (6 * (n_once + r * n_rec))
                loss = 1.5 + 30 * (n_once + r**0.5 * n_rec) ** -0.3 + 400 * D**-0.3 + rng.normal(0, 0.003)
                rows.append({"r": r, "N_once": n_once, "N_rec": n_rec, "D": D, "C": c, "budget": c, "loss": loss})
    full = pd.DataFrame(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message="table: the 95 % intervals rest on 4")  # B = 4: said, as fit says
        assert fit_table(full, "joint", starts=4, bootstrap=4).boot.block_by == ("budget", "r")
    part = full.assign(budget=full.budget.where(full.r > 1))
    with pytest.warns(UserWarning, match=r"bootstrap: the budget column is empty on 12 of 36 runs.* blocks by "
                                         r"\(C, r\) instead"):  # fmt: skip
        tf = fit_table(part, "joint", starts=4, bootstrap=4)
    assert tf.boot.block_by == ("C", "r")


def test_a_spec_built_in_python_is_refused_as_a_spec_file_is():
    """``SweepSpec(...)`` raised pydantic's ``ValidationError`` (another type and wording than every other spec
    problem); it now raises ``SpecError`` with the words of ``parse_spec``, and a good one builds the same spec."""
    from loopscale.sweep.spec import SpecError, SweepSpec, parse_spec

    with pytest.raises(SpecError, match=r"^invalid sweep spec: tokens must all be > 0, got \[-5\]$"):
        SweepSpec(name="x", sizes=[16], tokens=[-5])
    with pytest.raises(SpecError, match=r"tokenz: Extra inputs are not permitted \(did you mean 'tokens'\?\)"):
        SweepSpec(name="x", sizes=[16], tokenz=[2048])
    built = SweepSpec(name="x", sizes=[16], tokens=[2048], seeds=3, lr={"fixed": 0.01})
    assert built == parse_spec({"name": "x", "sizes": [16], "tokens": [2048], "seeds": 3, "lr": {"fixed": 0.01}})
    assert built.seeds == [0, 1, 2] and len(built.cells()) == 3 * 4  # 3 seeds, r = 1, 2, 4, 8
