"""`loopscale design`: candidates from a spec and a pilot, simulated with per-cell noise (sweep/design_cmd.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from loopscale.fit.design import design_cell_means, match_cells
from loopscale.fit.laws import make_law
from loopscale.sweep.cli import app
from loopscale.sweep.design_cmd import design, planned_runs, print_design
from loopscale.sweep.presets import preset_spec
from loopscale.sweep.spec import parse_spec, spec_to_yaml

TRUTH = dict(E=1.5, A=6.0, alpha=0.3, B=1.0, beta=0.3, phi=0.5)
SD = {1: 0.004, 2: 0.012, 4: 0.010, 8: 0.010}  # seed SD per r (nats/token): looped cells noisier, as measured
RATE = 2e8  # training FLOP/s of one run in the synthetic pilot

SPEC = {
    "name": "tiny",
    "model": {"preset": "cpu", "seq_len": 32},
    "r": [1, 2, 4, 8],
    "sizes": [16],
    "tokens": [4096],
    "ladder": [2, 4, 6],
    "seeds": 4,
    "training": {"batch_tokens": 256},
    "lr": {"fixed": 0.01},
}


def _pilot(tmp_path, seeds: int, seed: int = 0):
    """A pilot runs.parquet of the tiny spec: losses from TRUTH plus N(0, SD[r]), wall_s = C / RATE."""
    spec = parse_spec({**SPEC, "seeds": seeds})
    runs = planned_runs(spec)
    mean = make_law("joint").predict(TRUTH, {c: runs[c].to_numpy(float) for c in ("N_once", "N_rec", "r", "D")})
    sd = runs["r"].map(SD).to_numpy()
    rng = np.random.default_rng(seed)
    runs = runs.assign(final_val_loss=mean + sd * rng.standard_normal(len(runs)), wall_s=runs["C"] / RATE,
                       status="ok")
    path = tmp_path / f"pilot{seeds}.parquet"
    runs.to_parquet(path)
    return spec, path, runs


_PER_R_SEEN: dict = {}


@pytest.fixture(autouse=True)
def _pilot_check_once(monkeypatch):
    """The pilot's per-r phi check (``pilot_phi_per_r``: 3 fits of phi_r, each with 40 bootstrap refits) computed
    once per pilot and seed in this module: most tests run ``design`` several times on the same synthetic pilot,
    and the check, deterministic in its inputs, was half of their time. Each result is handed out as a copy."""
    import copy

    import loopscale.sweep.design_cmd as dc

    real = dc.pilot_phi_per_r

    def once(runs, seed=0):
        try:
            key = (tuple(runs.columns), pd.util.hash_pandas_object(runs, index=True).to_numpy().tobytes(), seed)
        except TypeError:  # a column of unhashable cells (lists): computed each time
            return real(runs, seed=seed)
        if key not in _PER_R_SEEN:
            _PER_R_SEEN[key] = real(runs, seed=seed)
        return copy.deepcopy(_PER_R_SEEN[key])

    monkeypatch.setattr(dc, "pilot_phi_per_r", once)


def _own(warnings: list[str]) -> list[str]:
    """A design's warnings but the one on too few simulated draws (these tests take few, to be quick)."""
    return [w for w in warnings if not w.startswith("--n-sim ")]


def test_planned_runs_follow_the_spec_expansion():
    runs = planned_runs(parse_spec(SPEC))
    assert len(runs) == 4 * (4 + 3)  # 4 seeds x (r = 1, 2, 4, 8 and three ladder rungs)
    assert sorted(runs.loc[runs["r"] == 1, "layers_unique"].unique()) == [2, 4, 6, 10]
    assert (runs["C"] == runs["flops_per_token"] * runs["D"]).all() and (runs["D"] == 4096).all()


def test_cell_means_average_seeds_and_match_cells_falls_back_per_r():
    t = pd.DataFrame({"r": [1, 1, 2, 2, 2], "D": 1.0, "loss": [2.0, 4.0, 1.0, 2.0, 6.0],
                      "status": ["ok"] * 4 + ["failed"]})
    m = design_cell_means(t)
    assert m["loss"].tolist() == [3.0, 1.5] and m["n_seeds"].tolist() == [2, 2]
    measured = pd.DataFrame({"r": [1, 2, 2], "layers_unique": [10, 6, 5], "sd": [0.01, 0.02, 0.04]})
    plan = pd.DataFrame({"r": [1, 2, 4], "layers_unique": [10, 4, 3]})
    vals, src = match_cells(plan, measured, "sd")
    assert vals.tolist() == [0.01, 0.03, pytest.approx(0.02)]
    assert src == ["cell", "median of r=2", "median of all cells"]


def test_more_seeds_predict_narrower_intervals_and_longer_runs(tmp_path):
    spec, path, runs = _pilot(tmp_path, seeds=4)
    res = design(spec, path, minutes=10, cpus=2, seeds=(2, 12), n_sim=20, starts=8, seed=0)
    by_k = {c["seeds"]: c for c in res["candidates"]}
    assert set(by_k) == {"2", "4", "12"} and by_k["4"]["spec_as_written"]  # the spec as written is a candidate
    few, many = by_k["2"], by_k["12"]
    assert few["n_ok"] >= 18 and many["n_ok"] >= 18
    assert many["phi_half_width"] < few["phi_half_width"]
    for r in ("2", "4", "8"):
        assert many["worth_half_width"][r] < few["worth_half_width"][r]
        assert many["r_phi_half_width"][r] < few["r_phi_half_width"][r]
    # the truth's worth: a looped model with phi = 0.5 is worth fewer layers than it executes, more than it holds
    assert 6 < few["worth_true"]["2"] < 10 and 3 < few["worth_true"]["8"] < 10
    # time: 6x the runs, 6x the training (runs of C / RATE seconds each, 2 at once)
    assert many["wall_min"] == pytest.approx(6 * few["wall_min"], rel=0.05)
    assert few["wall_min"] * 60 == pytest.approx((runs["C"].sum() / 2 / RATE + 14 * 0.5) / 2, rel=0.1)
    # noise per cell, from the pilot's own cells
    cells = {(c["r"], c["layers_unique"]): c for c in res["cells"]}
    assert {c["noise_source"] for c in res["cells"]} == {"cell"}
    looped = [c["noise_sd"] for c in res["cells"] if c["r"] > 1]
    assert min(looped) > cells[(1, 10)]["noise_sd"]  # the pilot's looped cells are noisier (SD 0.010-0.012 vs 0.004)
    assert res["truth"]["phi"] == pytest.approx(0.5, abs=0.25)


def test_cli_json_shape_and_ranking(tmp_path):
    spec, path, _ = _pilot(tmp_path, seeds=2)
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(spec))
    res = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "1",
                                   "--seeds", "6,2/6", "--n-sim", "6", "--starts", "6", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"spec", "pilot", "truth", "cells", "assumptions", "candidates", "best", "slots"} <= set(out)
    assert out["spec"] == "tiny" and out["slots"] == 2 and len(out["cells"]) == 7
    cands = out["candidates"]
    assert [c["seeds"] for c in cands if c["fits"]] == ["2"]  # 2 seeds: 0.6 min; 6 seeds: 1.8 min
    assert cands[0]["seeds"] == "2" and out["best"] == "2" and cands[0]["spec_as_written"]
    mixed = next(c for c in cands if c["seeds"] == "2/6")
    assert mixed["seeds_per_r"] == {"1": 2, "2": 6, "4": 6, "8": 6} and mixed["runs"] == 4 * 2 + 3 * 6
    assert {"seeds", "runs", "trials", "wall_min", "fits", "phi_half_width", "r_phi_half_width",
            "worth_half_width"} <= set(
        cands[0]
    )
    assert set(cands[0]["worth_half_width"]) == {"2", "4", "8"}
    run_dir = tmp_path / "run"
    table = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5",
                                     "--seeds", "2", "--n-sim", "3", "--starts", "4", "--out", str(run_dir)])
    assert table.exit_code == 0, table.output
    assert "best within 5 min: 2 seeds per cell" in table.output
    # a budget no candidate fits: said with the quickest one's time (it said "see the warning", of a warning about
    # something else)
    tight = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "0.01",
                                     "--seeds", "2", "--n-sim", "3", "--starts", "4"])  # fmt: skip
    assert tight.exit_code == 0, tight.output
    quick = next(c for c in cands if c["seeds"] == "2")["wall_min"]
    assert f"best within 0.01 min: none: no candidate fits in 0.01 min (the quickest needs {quick:.1f} min)" in (
        " ".join(tight.output.split())
    )
    # --out: the prediction and the folder's spec, so `loopscale run --out` refuses any other spec there
    assert json.loads((run_dir / "design_prediction.json").read_text())["spec"] == "tiny"
    assert (run_dir / "spec.yaml").read_text() == spec_to_yaml(spec)
    # a second --out there keeps the first prediction (it was replaced without a copy, and the report then set a
    # throwaway prediction next to the achieved half-widths)
    first = (run_dir / "design_prediction.json").read_text()
    again = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5", "--seeds", "2",
                                     "--n-sim", "2", "--starts", "4", "--out", str(run_dir)])  # fmt: skip
    assert again.exit_code == 0, again.output
    (kept,) = run_dir.glob("earlier_design_*/design_prediction.json")
    assert kept.read_text() == first and json.loads((run_dir / "design_prediction.json").read_text())["n_sim"] == 2
    assert f"moved the earlier design_prediction.json to {kept.parent}" in again.output


def test_progress_names_each_candidate_and_its_runs_before_simulating_it(tmp_path, monkeypatch):
    """A huge --seeds count expanded and simulated for minutes with nothing on the console: design() now calls
    ``progress(label, runs, index, total)`` before each candidate, its runs counted from the one-seed plan, and the
    results are the same with or without it."""
    import loopscale.fit.design as fd

    spec, path, _ = _pilot(tmp_path, seeds=2)
    kw = dict(minutes=5, cpus=2, seeds=(6, "2/6", 6), n_sim=3, starts=4, seed=0)
    plain = design(spec, path, **kw)
    events, simulate = [], fd.simulate_design

    def logged(plan, *a, **k):
        events.append(("simulate", len(plan)))
        return simulate(plan, *a, **k)

    monkeypatch.setattr(fd, "simulate_design", logged)
    res = design(spec, path, progress=lambda *a: events.append(a), **kw)
    # 7 cells (r = 1, 2, 4, 8 and three ladder rungs at r = 1): 4 plain and 3 looped; the repeated 6 is one candidate
    assert events == [("2", 14, 0, 3), ("simulate", 14), ("6", 42, 1, 3), ("simulate", 42),
                      ("2/6", 4 * 2 + 3 * 6, 2, 3), ("simulate", 26)]
    assert {c["seeds"]: c["runs"] for c in res["candidates"]} == {"2": 14, "6": 42, "2/6": 26}
    assert json.dumps(res, sort_keys=True, default=str) == json.dumps(plain, sort_keys=True, default=str)
    # the command's progress display goes to stderr and shows nothing when stderr is not a terminal
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(spec))
    cli = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5",
                                   "--seeds", "6,2/6", "--n-sim", "3", "--starts", "4", "--json"])
    assert cli.exit_code == 0 and cli.stderr == "", cli.output
    assert json.loads(cli.stdout)["candidates"] == json.loads(json.dumps(plain["candidates"], default=str))


def test_design_out_refuses_a_folder_of_another_spec_before_simulating(tmp_path):
    """`design --out` into the run folder of another spec wrote its prediction there, and that run's report showed
    it as its own prediction; it now refuses, before the simulation, and writes nothing."""
    spec, path, _ = _pilot(tmp_path, seeds=2)
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(spec))
    other = tmp_path / "other"
    other.mkdir()
    (other / "spec.yaml").write_text(spec_to_yaml(parse_spec({**SPEC, "seeds": 5, "name": "other"})))
    res = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5",
                                   "--seeds", "2", "--n-sim", "3", "--starts", "4", "--out", str(other)])
    assert res.exit_code == 2 and "holds a run of a different spec" in res.output, res.output
    assert sorted(p.name for p in other.iterdir()) == ["spec.yaml"]
    # a `loopscale fit --out` folder (fit.json and its figures) got the run's spec.yaml and the prediction beside
    # them; a folder of someone else's report.md is refused as `run` refuses it
    for name, said in (("fit.json", "holds a `loopscale fit` output (fit.json)"),
                       ("report.md", "holds report.md, which `loopscale run` writes, but no loopscale output")):  # fmt: skip
        theirs = tmp_path / f"theirs_{name}"
        theirs.mkdir()
        (theirs / name).write_text("{}")
        res = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5",
                                       "--seeds", "2", "--n-sim", "3", "--starts", "4", "--out", str(theirs)])
        assert res.exit_code == 2 and said in " ".join(res.output.split()), res.output
        assert [p.name for p in theirs.iterdir()] == [name]


def test_design_out_that_is_a_file_is_refused_before_simulating(tmp_path, monkeypatch):
    """`design --out x.out` with x.out an existing file simulated every candidate, then died with a FileExistsError
    traceback (exit 1) making the folder. It is refused first, exit 2, in the words `run` uses."""
    import loopscale.fit.design as fd

    def boom(*a, **k):
        raise AssertionError("simulated although --out is a file")

    monkeypatch.setattr(fd, "simulate_design", boom)
    spec, path, _ = _pilot(tmp_path, seeds=2)
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(spec))
    target = tmp_path / "x.out"
    target.write_text("mine")
    res = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5",
                                   "--seeds", "2", "--n-sim", "3", "--starts", "4", "--out", str(target)])
    assert res.exit_code == 2, res.output
    assert res.output == f"error: --out {target} is a file; give a directory (new or existing)\n"
    assert target.read_text() == "mine"
    run = CliRunner().invoke(app, ["run", str(spec_file), "--dry-run", "--out", str(target)])
    assert (run.exit_code, run.output) == (2, res.output)  # the same line as `run`


def test_ensemble_trials_count_their_measured_speed_up(tmp_path):
    """A pilot whose seeds trained as ensembles of 4 sharing a wall time of 2 single runs: twice the FLOP/s."""
    from loopscale.sweep.design_cmd import _rates

    _, _, runs = _pilot(tmp_path, seeds=4)
    single = _rates(runs)
    ens = _rates(runs.assign(trial_id=runs["trial"].astype(str), wall_s=runs["wall_s"] * 2))
    assert ens["rate"].to_numpy() == pytest.approx(2 * single["rate"].to_numpy())


def test_a_pilot_filtered_to_some_seeds_keeps_its_ensembles_rates(tmp_path):
    """A pilot of ensemble trials, filtered to half of each trial's seeds: counted by trial_id rows, each trial
    had half its members and every cell trained at half its FLOP/s (with 16 members cut to 2, at 1/8); the
    recorded ``ensemble_size`` gives the rate of the whole table."""
    from loopscale.sweep.design_cmd import _rates

    _, _, runs = _pilot(tmp_path, seeds=4)
    ens = runs.assign(trial_id=runs["trial"].astype(str), wall_s=runs["wall_s"] * 2, ensemble_size=4)
    whole = _rates(ens)
    half = _rates(ens[ens["seed"] % 2 == 0])
    assert half["rate"].to_numpy() == pytest.approx(whole["rate"].to_numpy())
    # a table written before ensemble_size was recorded (null) falls back to the trial's rows
    assert _rates(ens.assign(ensemble_size=None))["rate"].to_numpy() == pytest.approx(whole["rate"].to_numpy())


def test_a_pilot_trained_otherwise_than_the_spec_is_named_in_a_warning(tmp_path):
    """The pilot's FLOP/s give every predicted time: a pilot trained eager (a table that records ``compiled``), with
    another optimizer, batch or thread count, or as single runs for a spec of seed ensembles, predicted times off by
    that speed-up without a word (the eager, single-run ladder pilot predicted 87.5 min for the compiled ensembles
    that train in 42). Each difference is named; a setting the table does not record is not compared."""
    from loopscale.sweep.design_cmd import pilot_training_gaps

    spec, path, runs = _pilot(tmp_path, seeds=4)
    spec = parse_spec({**SPEC, "training": {"batch_tokens": 256, "compile": True, "optimizer": "muonh"}})
    assert pilot_training_gaps(spec, runs) == []  # nothing recorded: nothing to compare
    same = runs.assign(compiled=True, optimizer="muonh", batch_tokens=256, num_threads=1, ensemble_size=4,
                       seq_len=32, tokenizer="byte")  # fmt: skip
    assert pilot_training_gaps(spec, same) == []
    other = same.assign(compiled=False, optimizer="adamw", batch_tokens=512, num_threads=2, ensemble_size=1)
    assert pilot_training_gaps(spec, other) == [
        "compile: the pilot trained eager, the spec compiles",
        "optimizer: the pilot's adamw, the spec's muonh",
        "batch_tokens: the pilot's 512, the spec's 256",
        "threads per run: the pilot's 2, the spec's 1",
        "seed ensembles: the pilot trained single runs, the spec up to 16 seeds per trial, so the times assume no "
        "ensemble speed-up (an upper bound)",
    ]
    mixed = same.assign(compiled=[True, None] * (len(same) // 2))  # nulls (an older table's rows) are not compared
    assert pilot_training_gaps(spec, mixed) == []
    one = parse_spec({**SPEC, "training": {"batch_tokens": 256, "compile": True, "optimizer": "muonh"},
                      "resources": {"ensemble": 1}})
    assert pilot_training_gaps(one, same.assign(ensemble_size=1)) == []  # single runs for single runs
    other.to_parquet(tmp_path / "other.parquet")
    res = design(spec, tmp_path / "other.parquet", minutes=10, cpus=2, seeds=(2,), n_sim=4, starts=4, seed=0,
                 fit_starts=30)
    (w,) = [w for w in res["warnings"] if "trained otherwise" in w]
    assert w.startswith("the pilot's runs were trained otherwise than this spec's: compile: the pilot trained eager")
    assert "which candidates fit the minutes" in w and res["best"] is not None  # times only: still recommended
    # the optimizer and the batch change the losses too, not only the times: said
    assert ("optimizer and batch_tokens also change what a run learns, so the law and the seed noise the "
            "half-widths are simulated from are another training's too") in w
    same.assign(compiled=False).to_parquet(tmp_path / "eager.parquet")
    res = design(spec, tmp_path / "eager.parquet", minutes=10, cpus=2, seeds=(2,), n_sim=4, starts=4, seed=0,
                 fit_starts=30)
    (w,) = [w for w in res["warnings"] if "trained otherwise" in w]
    assert "compile: the pilot trained eager" in w and "what a run learns" not in w  # compiling changes times only
    # the context length and the tokenizer (the attention's and the output layer's share of a step; the loss is
    # per token of the tokenizer) were not compared: a pilot of the cpu preset's T = 128 passed for a T = 32 spec
    longer = same.assign(seq_len=128, tokenizer="gpt2")
    assert pilot_training_gaps(spec, longer) == ["seq_len: the pilot's 128, the spec's 32",
                                                 "tokenizer: the pilot's gpt2, the spec's byte"]  # fmt: skip
    longer.to_parquet(tmp_path / "longer.parquet")
    res = design(spec, tmp_path / "longer.parquet", minutes=10, cpus=2, seeds=(2,), n_sim=4, starts=4, seed=0,
                 fit_starts=30)
    (w,) = [w for w in res["warnings"] if "trained otherwise" in w]
    assert "seq_len and tokenizer also change what a run learns" in w
    preset = preset_spec("cpu")  # seq_len left to the preset's model: compared as the runs train it (128)
    assert pilot_training_gaps(preset, same.assign(seq_len=128, num_threads=1, batch_tokens=preset.training.
                                                   batch_tokens, optimizer=preset.training.optimizer,
                                                   compiled=preset.training.compile)) == []  # fmt: skip


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "pilot runs table not found"),
        ("one_seed", "one seed per cell"),
        ("few_cells", "has 4 cells (r, unique layers, d_model, D), fewer than the joint law's 6 parameters"),
        ("minutes", "--minutes must be a positive finite number of minutes (the training time budget), got 0"),
        ("minutes_inf", "--minutes must be a positive finite number of minutes (the training time budget), got inf"),
        ("minutes_nan", "--minutes must be a positive finite number of minutes (the training time budget), got nan"),
        ("seeds", "--seeds entries must"),
        ("seeds_empty", "--seeds 8,,16: an empty entry"),  # was read as 8,16; `,,` as no candidate at all
        ("cpus", "--cpus 2 is fewer than the CPUs each trial takes (resources.cpus = 4), so no trial would start"),
        ("seed", "Invalid value for '--seed'"),  # was numpy's bare "expected non-negative integer"
        ("preset", "preset must be one of"),
    ],
)
def test_cli_refuses_bad_input_before_simulating(tmp_path, monkeypatch, case, message):
    import loopscale.fit.design as fd

    def boom(*a, **k):
        raise AssertionError("simulated despite bad input")

    monkeypatch.setattr(fd, "simulate_design", boom)
    spec, path, runs = _pilot(tmp_path, seeds=1 if case == "one_seed" else 2)
    if case == "few_cells":  # no ladder rungs: r = 1, 2, 4, 8 at one width and one D are 4 cells
        runs[(runs["r"] > 1) | (runs["layers_unique"] == 10)].to_parquet(path)
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(spec))
    args = ["design", str(spec_file), "--pilot", str(path), "--minutes", "5", "--seeds", "2"]
    if case == "missing":
        args[3] = str(tmp_path / "nope.parquet")
    elif case.startswith("minutes"):  # 0, and inf / nan, which are not "<= 0" but no budget either
        args[5] = {"minutes": "0", "minutes_inf": "inf", "minutes_nan": "nan"}[case]
    elif case == "seeds":
        args[7] = "0,4"
    elif case == "seeds_empty":
        args[7] = "8,,16"
    elif case == "cpus":  # each trial takes 4 CPUs: no trial fits a 2-CPU machine (it said "1 trial at once")
        spec_file.write_text(spec_to_yaml(spec.model_copy(update={"resources": spec.resources.model_copy(
            update={"cpus": 4})})))  # fmt: skip
        args += ["--cpus", "2"]
    elif case == "seed":
        args += ["--seed", "-1"]
    elif case == "preset":
        args = ["design", "--preset", "huge", *args[2:]]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_design_refuses_a_negative_seed_naming_it(tmp_path, monkeypatch):
    """design() called from Python with a negative seed: a ValueError naming the seed, before the pilot is fitted
    (numpy refused it there with "expected non-negative integer", naming nothing)."""
    import loopscale.fit.fitter as ff

    def boom(*a, **k):
        raise AssertionError("fitted the pilot despite a negative seed")

    monkeypatch.setattr(ff, "fit_law", boom)
    spec, path, _ = _pilot(tmp_path, seeds=2)
    with pytest.raises(ValueError, match=r"--seed must be >= 0 \(the simulation's RNG seed\), got -1"):
        design(spec, path, minutes=5, seeds=(2,), n_sim=3, starts=4, seed=-1)


def test_a_pilot_that_does_not_pin_the_law_down_gets_a_warning_and_no_recommendation(tmp_path, capsys):
    """A pilot whose loss does not depend on N (A ~ 0: r changes nothing) fits a law with phi on the search-box
    edge: the simulated half-widths predict nothing (with such a pilot, more seeds gave wider intervals and the
    design still named a best candidate). A pilot of the law itself with one D has none (B and beta, one constant
    there, are not checked)."""
    spec = parse_spec({**SPEC, "tokens": [4096, 8192]})
    runs = planned_runs(spec)
    cols = {c: runs[c].to_numpy(float) for c in ("N_once", "N_rec", "r", "D")}
    flat = make_law("joint").predict({**TRUTH, "A": 1e-12}, cols)
    rng = np.random.default_rng(0)
    runs = runs.assign(final_val_loss=flat + runs["r"].map(SD).to_numpy() * rng.standard_normal(len(runs)),
                       wall_s=runs["C"] / RATE, status="ok")
    runs.to_parquet(tmp_path / "flat.parquet")
    kw = dict(minutes=10, cpus=2, seeds=(2,), n_sim=4, starts=4, seed=0, fit_starts=30)
    res = design(spec, tmp_path / "flat.parquet", **kw)
    assert "phi" in res["truth"]["on_bound"] and res["best"] is None
    assert res["pilot_phi_per_r"] == []  # phi on the edge: not fitted per r either (the warning says why)
    assert len(res["warnings"]) == 4 and "does not pin the law down" in res["warnings"][0]
    assert res["warnings"][3].startswith("--n-sim 4: each half-width is the central 95 % range of 4 refits")
    # no depth signal either: the worth is not predicted (it printed +-172071 layers and more)
    assert res["warnings"][1].startswith("the worth in unique layers is not predicted: the law taken as truth")
    assert "less than twice the standard error of a rung's mean" in res["warnings"][1]
    assert all(not c["worth_half_width"] for c in res["candidates"])
    # two token budgets: `run` fits every run there, the design cell means (said, not blocking)
    assert "this spec's runs train for 2 different token counts D (several token or FLOP budgets): `loopscale run` fits the joint law to every run" in res["warnings"][2]
    print_design(res)
    out = capsys.readouterr().out
    assert "best within 10 min: none: see the warning above (no candidate is recommended)" in out and "warning:" in out
    spec1, path, _ = _pilot(tmp_path, seeds=4)
    res = design(spec1, path, **kw)  # one D: fitted to cell means by `run` as by the design
    assert _own(res["warnings"]) == [] and res["truth"]["on_bound"] == [] and res["best"] is not None


def test_a_spec_of_several_variants_counts_every_variants_runs_and_time(tmp_path):
    """A spec of baseline and trunc_bptt: the candidates counted only the first variant's runs (24 of 42 in the
    trial) and its training time, so `--minutes` was checked against part of the sweep. Runs, trials and time now
    count every variant (the other variant's runs at the FLOP/s of their cell in the pilot, on their own FLOPs);
    the half-widths stay those of the first variant's fit, and a warning says so."""
    spec, path, _ = _pilot(tmp_path, seeds=4)
    two = parse_spec({**SPEC, "variants": ["baseline", "trunc_bptt"]})
    kw = dict(minutes=10, cpus=2, seeds=(), n_sim=4, starts=4, seed=0, fit_starts=30)
    one_res, two_res = design(spec, path, **kw), design(two, path, **kw)
    one_c, two_c = one_res["candidates"][0], two_res["candidates"][0]
    full = planned_runs(two)
    assert two_c["runs"] == len(full) and two_c["trials"] == full["trial"].nunique()
    assert two_c["runs_fitted"] == one_c["runs"] == one_c["runs_fitted"] < two_c["runs"]
    extra = full[full["variant"] == "trunc_bptt"]  # their time: their own FLOPs at the pilot's RATE of the cell
    assert two_c["wall_min"] > one_c["wall_min"] + 0.9 * (extra["C"] / RATE).sum() / 60 / 2  # 2 slots
    assert two_c["phi_half_width"] == pytest.approx(one_c["phi_half_width"])  # the first variant's fit
    assert any(w.startswith("this spec trains 2 variants (baseline, trunc_bptt): runs, trials and times count all")
               for w in two_res["warnings"])  # fmt: skip
    assert not any("variants (" in w for w in one_res["warnings"])


def test_a_pilot_with_several_variants_uses_the_first_variants_runs(tmp_path):
    """A pilot holding another variant's runs (here 0.3 nats worse and 10x noisier, r = 1 included) predicts the same
    as the pilot without them: the law and the noise come from the variant whose fit the design predicts (pooled, the
    other variant's runs moved the truth and the seed SD of every looped cell)."""
    spec, path, runs = _pilot(tmp_path, seeds=2)
    rng = np.random.default_rng(1)
    # the other variant has r = 1 runs of its own (a table not written by `run`, which labels r = 1 baseline):
    # they belong to its fit, not to the first variant's
    other = runs.assign(variant="other",
                        final_val_loss=runs["final_val_loss"] + 0.3 + 0.1 * rng.standard_normal(len(runs)))
    mixed = tmp_path / "mixed.parquet"
    pd.concat([runs, other], ignore_index=True).to_parquet(mixed)
    kw = dict(minutes=10, cpus=2, seeds=(2,), n_sim=4, starts=4, seed=0)
    alone, both = design(spec, path, **kw), design(spec, mixed, **kw)
    assert both["truth"] == alone["truth"] and both["cells"] == alone["cells"]
    bad = parse_spec({**SPEC, "seeds": 2, "variants": ["trunc_bptt"]})
    with pytest.raises(ValueError, match=r"variants \['baseline', 'other'\] but no looped run of .*'trunc_bptt'"):
        design(bad, mixed, **kw)


def test_a_spec_without_a_ladder_is_designed_for_phi_alone(tmp_path):
    """A spec without `ladder:` (the smoke and paper presets) has no worth in unique layers to predict: the design
    predicts phi's and r^phi's half-widths (it refused: '1 ladder depth(s) of r = 1; add at least 2')."""
    spec, path, _ = _pilot(tmp_path, seeds=4)
    plain = {k: v for k, v in {**SPEC, "seeds": 2}.items() if k != "ladder"}
    plain = parse_spec({**plain, "sizes": [16, 32], "tokens": [4096, 8192]})  # 16 cells for a 6-parameter law
    res = design(plain, path, minutes=10, cpus=2, seeds=(2,), n_sim=6, starts=6, seed=0)
    (cand,) = res["candidates"]
    assert cand["worth_half_width"] == {} and cand["worth_true"] == {}
    assert np.isfinite(cand["phi_half_width"]) and set(cand["r_phi_half_width"]) == {"2", "4", "8"}
    assert res["assumptions"]["worth"].startswith("not predicted: the spec has no unique-depth ladder")


def test_pilot_messages_csv_and_unknown_spec(tmp_path):
    """A pilot without its loss column is told the loss may be named final_val_loss (as `fit` says); a CSV pilot
    is read like the Parquet one; an unknown SPEC lists the presets (the message of every command's spec loader)."""
    spec, path, runs = _pilot(tmp_path, seeds=2)
    runs.drop(columns=["final_val_loss"]).to_parquet(tmp_path / "noloss.parquet")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['loss'\] \(loss may be named final_val_loss\)"):
        design(spec, tmp_path / "noloss.parquet", minutes=10, seeds=(2,), n_sim=2, starts=2)
    runs.to_csv(tmp_path / "pilot.csv", index=False)
    kw = dict(minutes=10, cpus=2, seeds=(2,), n_sim=3, starts=3, seed=0, fit_starts=20)
    from_csv, from_parquet = design(spec, tmp_path / "pilot.csv", **kw), design(spec, path, **kw)
    assert from_csv["truth"]["phi"] == pytest.approx(from_parquet["truth"]["phi"], rel=1e-9)
    assert from_csv["cells"] == from_parquet["cells"]
    res = CliRunner().invoke(app, ["design", "foo", "--pilot", str(path), "--minutes", "5"])
    assert res.exit_code == 2, res.output
    assert "sweep spec not found: foo" in res.output and "smoke, cpu, paper" in res.output


def test_a_pilot_of_another_grid_gets_a_warning_and_no_recommendation(tmp_path):
    """A pilot at one D and one width, for a spec at other D and widths: none of the planned cells is measured and
    the law (B D^-beta one constant at one D) would be extrapolated in D; a design was still recommended."""
    spec1, path, _ = _pilot(tmp_path, seeds=4)
    other = parse_spec({**SPEC, "seeds": 2, "sizes": [32], "tokens": [8192, 16384]})
    kw = dict(minutes=10, cpus=2, seeds=(2,), n_sim=3, starts=3, seed=0, fit_starts=20)
    res = design(other, path, **kw)
    assert res["best"] is None
    (w,) = [w for w in res["warnings"] if "does not cover" in w]
    assert "planned D = 8.19e+03, 1.64e+04 outside the pilot's (its one D = 4.1e+03" in w
    assert "planned widths d = 32 outside the pilot's d = 16" in w and "none of the planned cells" in w
    assert _own(design(spec1, path, **kw)["warnings"]) == []  # the pilot's own spec: covered


def test_a_pilot_whose_phi_per_r_disagrees_is_flagged(tmp_path):
    """Losses made with phi = 0.9 for r = 2 and 0.1 for r = 4, 8: phi per r has no common value, as `run`'s
    identification rule says; design said nothing ("warnings": []). The ladder spec keeps its recommendation (the
    worth stays meaningful), a spec without a ladder gets none."""
    spec = parse_spec({**SPEC, "seeds": 4, "tokens": [4096, 8192]})
    runs = planned_runs(spec)
    law = make_law("joint")
    mean = np.empty(len(runs))
    for phi, rows in ((0.9, runs["r"] <= 2), (0.1, runs["r"] > 2)):
        sub = runs[rows]
        mean[rows.to_numpy()] = law.predict({**TRUTH, "phi": phi},
                                            {c: sub[c].to_numpy(float) for c in ("N_once", "N_rec", "r", "D")})
    rng = np.random.default_rng(0)
    runs = runs.assign(final_val_loss=mean + 0.001 * rng.standard_normal(len(runs)), wall_s=runs["C"] / RATE,
                       status="ok")
    runs.to_parquet(tmp_path / "split.parquet")
    kw = dict(minutes=10, cpus=2, seeds=(2,), n_sim=3, starts=3, seed=0, fit_starts=20)
    res = design(spec, tmp_path / "split.parquet", **kw)
    (w,) = [w for w in res["warnings"] if "phi fitted per r has no common value" in w]
    assert "worth in unique layers" in w and res["best"] is not None
    phis = {int(x["r"]): x["phi"] for x in res["pilot_phi_per_r"]}
    assert phis[2] > phis[8] + 0.4
    plain = parse_spec({k: v for k, v in {**SPEC, "seeds": 2, "tokens": [4096, 8192]}.items() if k != "ladder"})
    res = design(plain, tmp_path / "split.parquet", **kw)
    assert res["best"] is None and any("no ladder" in w for w in res["warnings"])


def test_best_is_the_largest_of_the_candidates_tied_with_the_narrowest():
    """Half-widths within Monte-Carlo error of the narrowest tie, and the tie with the most runs wins (before, the
    narrowest by a noise-sized margin won, and the choice flipped with the simulation's seed)."""
    from loopscale.sweep.design_cmd import choose_best

    rng = np.random.default_rng(0)
    eps = rng.standard_normal(40)
    draws = {"16": tuple(0.10 * eps), "24": tuple(0.095 * eps + 0.02 * rng.standard_normal(40)),
             "8": tuple(0.2 * eps), "32": tuple(0.09 * eps)}
    cands = [dict(seeds=k, runs=int(k) * 8, fits=k != "32",
                  phi_half_width=float(np.quantile(v, 0.975) - np.quantile(v, 0.025)) / 2) for k, v in draws.items()]
    assert cands[0]["phi_half_width"] < cands[1]["phi_half_width"]  # 16 is the narrowest that fits
    assert choose_best(cands, draws, 40, seed=0) == "24"
    by = {c["seeds"]: c for c in cands}
    assert by["24"]["tie"] and not by["8"]["tie"] and "tie" not in by["32"]
    assert 0 < by["24"]["diff_se"] < 0.02


def test_a_run_listed_twice_in_the_pilot_is_one_run_its_newest_row(tmp_path):
    """A pilot whose run ids repeat (tables concatenated, a rerun's newer row) counted every row as a seed: a copy
    of a run was one more replicate (a smaller seed SD), and a run whose newer row diverged stayed in with its older
    ok row. As the fits read runs: one row per run id, the newest."""
    from loopscale.sweep.design_cmd import read_pilot

    spec, path, runs = _pilot(tmp_path, seeds=2)
    runs = runs.assign(run_id=[f"run{i}" for i in range(len(runs))])
    pd.concat([runs, runs]).to_parquet(tmp_path / "twice.parquet")
    assert len(read_pilot(tmp_path / "twice.parquet")) == len(runs)
    diverged = runs.iloc[:4].assign(status="diverged", final_val_loss=np.nan)
    pd.concat([runs, diverged]).to_parquet(tmp_path / "rerun.parquet")
    assert len(read_pilot(tmp_path / "rerun.parquet")) == len(runs) - 4


def test_a_pilot_with_an_ok_run_without_a_loss_is_refused_as_the_fits_refuse_it(tmp_path):
    """An ok run whose loss is NaN was dropped from the pilot without a word (the fits refuse the same table): a
    design then rested on fewer runs than the table claimed. Now it is refused, naming the column and the count."""
    from loopscale.sweep.design_cmd import read_pilot

    spec, path, runs = _pilot(tmp_path, seeds=2)
    broken = runs.copy()
    broken.loc[broken.index[::5], "final_val_loss"] = np.nan
    broken.to_parquet(tmp_path / "nan.parquet")
    n = int(broken["final_val_loss"].isna().sum())
    with pytest.raises(ValueError, match=rf"column 'final_val_loss' has {n} NaN/inf value\(s\) among the runs whose"):
        read_pilot(tmp_path / "nan.parquet")
    assert len(read_pilot(path)) == len(runs)
    folder = tmp_path / "pilot_run"  # a run folder, as `fit` takes one: its runs.parquet
    folder.mkdir()
    runs.to_parquet(folder / "runs.parquet")
    assert len(read_pilot(folder)) == len(runs)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match="has no runs.parquet"):
        read_pilot(tmp_path / "empty_dir")
    negative = runs.copy()
    negative.loc[negative.index[3], "final_val_loss"] = -1.0  # the fits refuse it; design fitted phi = -3 on it
    negative.to_parquet(tmp_path / "negative.parquet")
    with pytest.raises(ValueError, match=r"column 'final_val_loss' must be > 0 \(nats/token\); 1 ok run"):
        read_pilot(tmp_path / "negative.parquet")


def test_a_pilot_whose_ok_runs_read_two_corpus_contents_is_refused(tmp_path):
    """A pilot of two corpus contents is two texts' runs, not one pilot: refused as the fits refuse it."""
    from loopscale.sweep.design_cmd import read_pilot

    _, _, runs = _pilot(tmp_path, seeds=2)
    mixed = runs.assign(corpus_sha256=["c" * 64 if i % 3 else "d" * 64 for i in range(len(runs))])
    mixed.to_parquet(tmp_path / "mixed.parquet")
    n_d = (len(runs) + 2) // 3
    with pytest.raises(ValueError, match=rf"{len(runs) - n_d} runs {'c' * 12}, {n_d} runs {'d' * 12}\)"):
        read_pilot(tmp_path / "mixed.parquet")
    runs.assign(corpus_sha256="c" * 64).to_parquet(tmp_path / "one.parquet")
    assert len(read_pilot(tmp_path / "one.parquet")) == len(runs)


def test_a_candidate_run_refuses_is_timed_not_simulated_and_never_best(tmp_path, capsys):
    """One token budget and one seed per cell: `loopscale run` refuses the spec (phi would get no interval), yet the
    design simulated it and called it "fits: yes" with a predicted ±φ. It is now marked refused, with run's reason
    in a warning, and never recommended; a design where run refuses every candidate says so."""
    spec, path, _ = _pilot(tmp_path, seeds=4)
    one = parse_spec({**SPEC, "seeds": 1})
    res = design(one, path, minutes=10, cpus=2, seeds=(2, "1/2"), n_sim=3, starts=3, seed=0, fit_starts=20)
    by = {c["seeds"]: c for c in res["candidates"]}
    assert by["1"]["spec_as_written"] and by["1"]["refused"].startswith("every run has the same budget")
    assert "cells at r = 1 have one seed" in by["1/2"]["refused"] and by["2"]["refused"] is None
    for c in (by["1"], by["1/2"]):
        assert not c["fits"] and np.isnan(c["phi_half_width"]) and c["n_ok"] == 0 and c["wall_min"] > 0
    assert np.isfinite(by["2"]["phi_half_width"]) and res["best"] == "2"
    said = [w for w in res["warnings"] if w.startswith("`loopscale run` would refuse seeds")]
    assert len(said) == 2 and "seeds 1 (the spec as written) per cell" in said[0] + said[1]
    print_design(res)
    out = " ".join(capsys.readouterr().out.split())
    assert "run refuses" in out and "best within 10 min: 2 seeds per cell" in out
    alone = design(one, path, minutes=10, cpus=2, seeds=(), n_sim=3, starts=3, seed=0, fit_starts=20)
    assert alone["best"] is None
    print_design(alone)
    assert "none: `loopscale run` would refuse every candidate" in " ".join(capsys.readouterr().out.split())
    # a refusal seeds do not cause (4 design points for the one-D law's 5): the spec at every seed count, said once
    # and without run's "nothing was trained"
    few = parse_spec({k: v for k, v in SPEC.items() if k != "ladder"})
    res = design(few, path, minutes=10, cpus=2, seeds=(2, 8), n_sim=3, starts=3, seed=0, fit_starts=20)
    assert all(c["refused"] for c in res["candidates"]) and res["best"] is None
    (said,) = [w for w in res["warnings"] if "`loopscale run` would refuse" in w]
    assert said.startswith("`loopscale run` would refuse this spec at every seed count tried: the fit has 4 distinct")
    assert "nothing was trained" not in said


def test_a_pilot_whose_cells_hold_several_models_is_refused_naming_the_columns(tmp_path):
    """A pilot table without layers_unique (or n_prelude, n_recur_block, n_coda) holds the ladder's plain models of
    several depths in one r = 1 cell: the design failed inside the per-r check ("cell_means: N_rec varies within a
    cell"), where `fit` reads the same table. It is refused naming the columns to add; the same table with
    layers_unique is a pilot."""
    spec, path, runs = _pilot(tmp_path, seeds=2)
    cols = ["r", "d_model", "N_once", "N_rec", "D", "C", "wall_s", "seed", "final_val_loss"]
    runs[cols].to_csv(tmp_path / "bare.csv", index=False)
    with pytest.raises(ValueError, match=r"runs of the same cell \(r, d_model, D\) have different N_once / N_rec.*"
                                         r"add \(or fill in\) column\(s\) \['layers_unique'\] \(or n_prelude, n_recur_block and"):
        design(spec, tmp_path / "bare.csv", minutes=10, seeds=(), n_sim=2, starts=2)
    runs[cols].assign(layers_unique=np.nan).to_csv(tmp_path / "null.csv", index=False)  # a column of nulls: the same
    with pytest.raises(ValueError, match=r"add \(or fill in\) column\(s\) \['layers_unique'\]"):
        design(spec, tmp_path / "null.csv", minutes=10, seeds=(), n_sim=2, starts=2)
    # a null width on every run: the cells' own message (the check raised numpy's "zero-size array")
    runs.assign(d_model=np.nan).to_csv(tmp_path / "no_width.csv", index=False)
    with pytest.raises(ValueError, match=r"column 'd_model' is null on \d+ of \d+ runs"):
        design(spec, tmp_path / "no_width.csv", minutes=10, seeds=(), n_sim=2, starts=2)
    # N_once null on one run: named as such (a null counted as a second value, and the check said the cell mixed
    # models)
    runs.assign(N_once=np.where(np.arange(len(runs)) == 0, np.nan, runs["N_once"])).to_csv(
        tmp_path / "one_null.csv", index=False)  # fmt: skip
    with pytest.raises(ValueError) as e:
        design(spec, tmp_path / "one_null.csv", minutes=10, seeds=(), n_sim=2, starts=2)
    assert "N_once" in str(e.value) and "null" in str(e.value) and "mix models" not in str(e.value), str(e.value)
    runs[[*cols, "layers_unique"]].to_csv(tmp_path / "layers.csv", index=False)
    assert design(spec, tmp_path / "layers.csv", minutes=10, seeds=(), n_sim=2, starts=2, fit_starts=20)["cells"]


def test_a_pilot_without_some_r_or_with_failed_runs_is_said(tmp_path):
    """A pilot of r = 1 and 8 only (or with one seed in its looped cells) gave the looped cells the plain cells'
    noise and predicted a phi interval half as wide, with no warning and a recommendation; failed runs of the pilot
    were dropped without a word, and a trial's members were counted over its ok rows only (a diverged member made
    the others' time per run look longer). Each is now said, and the first withholds the recommendation."""
    from loopscale.sweep.design_cmd import _rates, read_pilot

    spec, path, runs = _pilot(tmp_path, seeds=4)
    kw = dict(minutes=10, cpus=2, seeds=(4,), n_sim=4, starts=4, seed=0, fit_starts=20)
    runs[runs["r"] != 2].to_parquet(tmp_path / "no2.parquet")
    res = design(spec, tmp_path / "no2.parquet", **kw)
    (gap,) = [w for w in res["warnings"] if "does not cover" in w]
    assert "planned r = 2 without a cell of two seeds or more in the pilot (it has r = 1, 4, 8)" in gap
    assert res["best"] is None and res["withheld"]
    # failed runs: counted in a warning; a trial's members counted over all its rows
    t = runs.assign(trial_id=[f"t{i // 4}" for i in range(len(runs))])
    bad = t.index[::7]
    t.loc[bad, "status"], t.loc[bad, "final_val_loss"] = "diverged", np.nan
    t.to_parquet(tmp_path / "div.parquet")
    res = design(spec, tmp_path / "div.parquet", **kw)
    assert any(w.startswith(f"{len(bad)} of the pilot's {len(t)} runs are not ok (diverged: {len(bad)}) and are "
                            "left out") for w in res["warnings"]), res["warnings"]
    pilot = read_pilot(tmp_path / "div.parquet")
    assert (pilot["ensemble_size"] == 4).all()  # every trial held 4 members, one of them diverged in some
    # so each ok member's rate is 4 C / wall_s, as in the pilot without failures (not 3 C / wall_s)
    assert set(_rates(pilot)["rate"].round(6)) == {round(4 * RATE, 6)}, _rates(pilot)


def _design_folder(tmp_path, seeds: str, n_sim: int):
    """``design --out tmp_path/run`` of the tiny spec at 2 seeds (``--seeds seeds``) from a 2-seed pilot: (spec,
    pilot path, spec file, the folder)."""
    spec, path, _ = _pilot(tmp_path, seeds=2)
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(spec))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5", "--seeds", seeds,
                                   "--n-sim", str(n_sim), "--starts", "4", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    return spec, path, spec_file, out


def test_a_design_folder_takes_the_seeds_the_design_recommends(tmp_path):
    """`design --out OUT` recorded its spec in OUT, so `run --out OUT` with the seeds the design recommended was
    refused as "a different spec ... differs in seeds", though OUT held only a prediction. A folder that holds
    nothing but a design's files now takes the same spec with the seeds of a simulated candidate, and its report sets
    that candidate's prediction beside the run's intervals; seeds the design did not simulate, any other change, or
    a folder where a command has worked, are refused as before."""
    import warnings

    from loopscale.fit.run_report import _prediction_section
    from loopscale.sweep.spec import DesignSeedsNotPredicted, check_folder_spec, record_folder_spec

    spec, path, spec_file, out = _design_folder(tmp_path, "6,2/6", n_sim=3)
    pred = json.loads((out / "design_prediction.json").read_text())
    six = parse_spec({**SPEC, "seeds": 6})
    mixed = parse_spec({**SPEC, "seeds": {1: 2, 2: [0, 1, 2, 3, 4, 5], 4: 6, 8: [10, 11, 12, 13, 14, 15]}})
    check_folder_spec(out, six)  # a candidate's seeds per r; which seeds does not matter, only how many
    check_folder_spec(out, mixed)
    with pytest.raises(DesignSeedsNotPredicted, match=r"did not simulate these seeds per r \(r 1: 3, r 2: 3, r 4: 3, "
                       r"r 8: 3; its candidates: 6, 2/6, 2\)"):  # fmt: skip
        check_folder_spec(out, parse_spec({**SPEC, "seeds": 3}))
    with pytest.raises(ValueError, match="holds a run of a different spec") as e:  # seeds and another key
        check_folder_spec(out, parse_spec({**SPEC, "seeds": 6, "name": "other"}))
    assert not isinstance(e.value, DesignSeedsNotPredicted)
    for seeds, code in ((2, 0), (6, 0), (3, 2)):  # the design's own spec, as before; its candidate 6; 3: refused
        other = tmp_path / f"seeds{seeds}.yaml"
        other.write_text(spec_to_yaml(parse_spec({**SPEC, "seeds": seeds})))
        dry = CliRunner().invoke(app, ["run", str(other), "--dry-run", "--out", str(out)])
        assert dry.exit_code == code, dry.output
        assert ("did not simulate these seeds per r" in " ".join(dry.output.split())) == (seeds == 3), dry.output
    assert (out / "spec.yaml").read_text() == spec_to_yaml(spec)  # a dry run changes nothing
    # the dry run's time left (no run has finished there) gives the design's prediction for these seeds (it said
    # only "not estimated")
    other = tmp_path / "seeds6.yaml"
    dry = CliRunner().invoke(app, ["run", str(other), "--dry-run", "--json", "--out", str(out)])
    assert dry.exit_code == 0, dry.output
    plan = json.loads(dry.stdout)
    (six_pred,) = [c for c in pred["candidates"] if c["seeds"] == "6"]
    said = (f"; the design predicted {six_pred['wall_min']:.1f} min of training for these seeds (6) on {pred['cpus']} "
            "CPUs, at its pilot's FLOP/s (design_prediction.json)")  # fmt: skip
    assert plan["est_train_min_left"] is None and said in plan["train_time_assumption"]
    # seeds the design found too long for its minutes, or not the ones it recommended: said too
    kept = (out / "design_prediction.json").read_text()
    worse = {**pred, "best": "2/6", "candidates": [{**c, "fits": c["seeds"] != "6"} for c in pred["candidates"]]}
    (out / "design_prediction.json").write_text(json.dumps(worse))
    plan = json.loads(CliRunner().invoke(app, ["run", str(other), "--dry-run", "--json", "--out", str(out)]).stdout)
    assert plan["train_time_assumption"].endswith(f"{said}, more than the {pred['minutes']:g} min it was given; it "
                                                  "recommended 2/6")  # fmt: skip
    (out / "design_prediction.json").write_text(kept)
    # recorded (as `run` does, after its console session opened OUT/logs): the design's spec is replaced (not kept
    # as a hand-written one) and said
    (out / "logs").mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record_folder_spec(out, six)
    assert [str(w.message) for w in caught] == [f"{out / 'spec.yaml'} held the spec `loopscale design` predicted for, "
                                                "with seeds [0, 1]; it now holds this spec, with seeds [0, 1, 2, 3, 4, "
                                                "5]"]  # fmt: skip
    assert (out / "spec.yaml").read_text() == spec_to_yaml(six) and not list(out.glob("spec.yaml.given-*"))
    # the prediction records the folder's seeds per r, and the report's predicted half-width is candidate 6's, not
    # the spec-as-written's (2 seeds)
    marked = json.loads((out / "design_prediction.json").read_text())
    assert marked == {**pred, "folder_seeds_per_r": {"1": 6, "2": 6, "4": 6, "8": 6}}
    hw = {c["seeds"]: c["phi_half_width"] for c in pred["candidates"]}
    assert hw["6"] != hw["2"]
    v = {"joint": {"ci": {"phi": [0.4, 0.6]}}}
    assert f"| φ (joint fit) | {hw['6']:.3g} |" in "\n".join(_prediction_section(marked, v))
    # the predicted training time beside the sweep stage's (the report set the prediction alone)
    six_min = next(c["wall_min"] for c in pred["candidates"] if c["seeds"] == "6")
    assert (f"its training time: {six_min:.3g} min, against 0.35 min of this folder's sweep stage, Ray's start-up "
            "and the recording of the runs included)") in "\n".join(_prediction_section(marked, v, 21.0))  # fmt: skip
    assert f"| φ (joint fit) | {hw['2']:.3g} |" in "\n".join(_prediction_section(pred, v))  # the design's own spec
    unsimulated = {**pred, "folder_seeds_per_r": {"1": 3, "2": 3, "4": 3, "8": 3}}
    assert _prediction_section(unsimulated, v) == []  # no candidate of those seeds: no prediction shown
    # design --out again with any seeds: it predicts anew (the earlier prediction is set aside)
    three = spec_to_yaml(parse_spec({**SPEC, "seeds": 3}))
    spec_file.write_text(three)
    with pytest.warns(UserWarning, match=r"it now holds this spec, with seeds \[0, 1, 2\]"):
        again = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5", "--seeds",
                                         "2", "--n-sim", "2", "--starts", "4", "--out", str(out)])  # fmt: skip
    assert again.exit_code == 0, again.output
    assert (out / "spec.yaml").read_text() == three and len(list(out.glob("earlier_design_*"))) == 1
    # a folder where a command has worked (run_meta.json: a stage ran) holds to its spec
    (out / "run_meta.json").write_text("{}")
    with pytest.raises(ValueError, match="holds a run of a different spec") as e:
        check_folder_spec(out, six)
    assert not isinstance(e.value, DesignSeedsNotPredicted)


def test_a_design_folder_takes_the_seeds_for_tune_lr_too_and_holds_once_a_command_worked(tmp_path, monkeypatch):
    """`tune-lr` checked the design folder, made OUT/tune_lr, then recorded its spec: by then the folder was no longer
    the design's alone, so the candidate's seeds were refused after the check had passed (and the empty tune_lr/
    refused every later command). It records first now. A folder whose logs/command.json says a command recorded
    its spec there holds to it; an unreadable prediction is said as such; a spec.yaml edited by hand is kept aside
    when replaced. Spec errors of ``SweepSpec(...)`` are parse_spec's whole message."""
    import warnings

    import loopscale.sweep.status as status
    from loopscale.sweep.lr_search import run_tune_lr
    from loopscale.sweep.spec import (
        DesignSeedsNotPredicted,
        SpecError,
        SweepSpec,
        check_folder_spec,
        design_only_folder,
        record_folder_spec,
    )

    spec, _, _, out = _design_folder(tmp_path, "6", n_sim=2)
    design_files = sorted(p.name for p in out.iterdir())
    six = parse_spec({**SPEC, "seeds": 6})

    class Started(Exception):
        pass

    def started(*a, **k):
        raise Started

    monkeypatch.setattr(status, "mark_started", started)  # tune-lr stops as it would start Ray
    with pytest.raises(Started), pytest.warns(UserWarning, match="it now holds this spec, with seeds"):
        run_tune_lr(six, out, quiet=True)
    assert (out / "spec.yaml").read_text() == spec_to_yaml(six) and (out / "tune_lr").is_dir()
    # logs/command.json: a command recorded its spec here and worked (mark_started writes it): not the design's alone
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in design_files:
        (copy / name).write_bytes((out / name).read_bytes())
    (copy / "spec.yaml").write_text(spec_to_yaml(spec))
    assert design_only_folder(copy)
    (copy / "logs").mkdir()
    assert design_only_folder(copy)  # a console log alone: written before a command records its spec
    (copy / "logs" / "command.json").write_text("{}")
    assert not design_only_folder(copy)
    with pytest.raises(ValueError, match="holds a run of a different spec"):
        check_folder_spec(copy, six)
    (copy / "logs" / "command.json").unlink()
    # a torn prediction: said, not "the design did not simulate these seeds"
    (copy / "design_prediction.json").write_text('{"candidates": [')
    with pytest.raises(DesignSeedsNotPredicted, match=r"design_prediction.json cannot be read \(JSONDecodeError"):
        check_folder_spec(copy, six)
    (copy / "design_prediction.json").write_bytes((out / "design_prediction.json").read_bytes())
    # a spec.yaml with a user's comments is copied aside before it is replaced
    (copy / "spec.yaml").write_text("# tried on the laptop first\n" + spec_to_yaml(spec))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record_folder_spec(copy, six)
    said = [str(w.message) for w in caught]
    assert len(said) == 2 and "its text as it was, comments included, is kept in" in said[0], said
    assert "it now holds this spec, with seeds [0, 1, 2, 3, 4, 5]" in said[1]
    (given,) = copy.glob("spec.yaml.given-*")
    assert given.read_text().startswith("# tried on the laptop first\n")
    # SweepSpec(...): the checks across keys that read none of the bad keys are said too, as parse_spec says them
    bad = dict(name="x", sizes=[16], tokens=[2048], tokenz=[1], r=[2, 4], ladder=[2, 3], lr={"fixed": 0.01})
    with pytest.raises(SpecError) as built:
        SweepSpec(**bad)
    with pytest.raises(SpecError) as parsed:
        parse_spec(bad)
    assert str(built.value) == str(parsed.value) and "tokenz" in str(built.value) and str(built.value).count(";") >= 1


def test_design_out_refuses_a_folder_that_holds_trained_runs(tmp_path):
    """`design --out RUNDIR` after the run had trained there moved the prediction the run was designed by aside and
    wrote a new one (other draws), which the rebuilt report showed as the design. A folder that holds trained runs
    is now refused before anything is simulated, the same spec too, and its prediction is left as it is."""
    from loopscale.sweep.store import ResultsStore, run_record

    spec, path, spec_file, out = _design_folder(tmp_path, "2", n_sim=2)
    first = (out / "design_prediction.json").read_text()
    store = ResultsStore(out)
    for c in spec.cells()[:3]:  # as `run --out RUNDIR` records its runs
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    res = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5", "--seeds", "2",
                                   "--n-sim", "2", "--starts", "4", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert (f"--out {out} holds 3 trained runs: a design predicts a run before it trains" in " ".join(res.output.split())
            and "(its prediction, design_prediction.json, stays as it is)" in " ".join(res.output.split())), res.output
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert (out / "design_prediction.json").read_text() == first


def test_design_cpus_and_n_sim_out_of_range_are_refused_by_the_parser(tmp_path):
    """`design --cpus 0` and `--n-sim 1` were plain error lines from the design itself, where other commands' options
    out of range (`--num-cpus 0`, `--bootstrap -1`) are refused by the command-line parser with its usage box."""
    spec, path, _ = _pilot(tmp_path, seeds=2)
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(spec_to_yaml(spec))
    for opt, value, bound in (("--cpus", "0", "greater than or equal to 1"), ("--n-sim", "1", "greater than or equal to 2")):
        res = CliRunner().invoke(app, ["design", str(spec_file), "--pilot", str(path), "--minutes", "5", opt, value])
        assert res.exit_code == 2 and f"Invalid value for '{opt}'" in res.output and bound in res.output, res.output


def test_many_planned_d_outside_the_pilot_are_said_as_a_range():
    """`design --preset paper` with a CPU pilot listed all 116 planned D in its coverage warning; more than six are
    said as their count and range."""
    import pandas as pd

    from loopscale.sweep.design_cmd import pilot_coverage

    pilot = pd.DataFrame({"D": [4096.0] * 4, "d_model": [16, 16, 32, 32], "r": [1, 2, 1, 2],
                          "loss": [3.0, 3.1, 2.9, 3.0]})
    plan = pd.DataFrame({"D": [1e9 * k for k in range(1, 11)], "d_model": [16] * 10, "r": [1] * 10})
    (gap, *_) = pilot_coverage(plan, pilot, measured_cells=1)
    assert gap.startswith("planned D = 10 values from 1e+09 to 1e+10 outside the pilot's (its one D = 4.1e+03")
    (few, *_) = pilot_coverage(plan.head(2), pilot, measured_cells=1)
    assert few.startswith("planned D = 1e+09, 2e+09 outside the pilot's")


def test_a_pilot_the_law_fits_worse_than_a_constant_is_said_in_its_own_words(tmp_path, monkeypatch):
    """A ladder pilot whose loss rose with depth after 8k tokens gave the truth fit R² -0.39; the design said only
    that parameters were on the search-box edge. A negative R² now has its own warning, and blocks the
    recommendation."""
    import dataclasses

    import loopscale.fit.fitter as fitter

    spec1, path, _ = _pilot(tmp_path, seeds=4)
    kw = dict(minutes=10, cpus=2, seeds=(2,), n_sim=4, starts=4, seed=0, fit_starts=30)
    assert design(spec1, path, **kw)["best"] is not None  # a pilot of the law itself: recommended
    real = fitter.fit_law
    monkeypatch.setattr(fitter, "fit_law", lambda *a, **k: dataclasses.replace(real(*a, **k), r2=-0.39))
    res = design(spec1, path, **kw)
    said = [w for w in res["warnings"] if "worse than their mean does (R² -0.390)" in w]
    assert len(said) == 1 and said[0].endswith("no candidate is recommended") and res["best"] is None
