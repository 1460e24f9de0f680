"""A researcher's own runs table fitted with loopscale.fit: the bootstrap's default blocks on an iso-FLOP table
without a ``budget`` column, the identification verdict from few resamples, the Python API's input warnings and
a fit folder that already holds files."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from loopscale.fit.synthetic import paper_design_from_formulas, synth_joint


def _iso_flop(noise: float = 0.01):
    """The paper's 116-run iso-FLOP design with losses from a known joint law; its budget column named ``C`` (the
    ``budget`` column dropped), as a researcher's own table would name it."""
    return synth_joint(paper_design_from_formulas(), noise=noise, seed=0).drop(columns=["budget"])


def test_default_blocks_of_an_iso_flop_table_are_its_C_cells_not_one_run_each():
    """Every valid table has D, so the default blocking (D, r) was taken before (C, r) could be: on an iso-FLOP
    table every run has its own D, and the 'block' bootstrap resampled run by run under the label (D,r)."""
    from loopscale.fit.io import default_block_by
    from loopscale.fit.laws import make_law

    df = _iso_flop()
    assert df.groupby(["D", "r"]).ngroups == len(df)  # each run its own (D, r) block
    assert default_block_by(df, make_law("joint")) == ("C", "r")
    # a token-budget grid (one D per budget, C per run) keeps (D, r); a budget column, when filled, comes first
    tok = df.assign(D=np.repeat([1e9, 2e9, 4e9, 8e9], 29)[: len(df)])
    assert default_block_by(tok, make_law("joint")) == ("D", "r")
    assert default_block_by(df.assign(budget=df["C"]), make_law("joint")) == ("budget", "r")
    assert default_block_by(df, make_law("chinchilla")) is None
    # one size on a token-budget grid: (C, r) and (D, r) make the same cells, and D is kept (as before)
    import pandas as pd

    one = pd.DataFrame({"r": [1, 2, 1, 2], "D": [1e9, 1e9, 2e9, 2e9], "C": [6e15, 9e15, 1.2e16, 1.8e16]})
    assert one.groupby(["C", "r"]).ngroups == one.groupby(["D", "r"]).ngroups == 4
    assert default_block_by(one, make_law("joint")) == ("D", "r")


def test_a_blocking_whose_every_block_is_one_run_is_said(tmp_path):
    """--block-by D,r on an iso-FLOP table is a run-by-run bootstrap; the fit says so and names the way out."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    path = tmp_path / "runs.csv"
    _iso_flop().to_csv(path, index=False)
    base = ["fit", str(path), "--bootstrap", "2", "--starts", "5", "--workers", "1", "--json"]
    res = CliRunner().invoke(app, [*base, "--block-by", "D,r"])
    assert res.exit_code == 0, res.output
    boot = json.loads(res.stdout)["bootstrap"]
    assert boot["block_by"] == ["D", "r"]
    assert "every (D,r) block holds one run" in boot["one_run_blocks_note"]
    assert "block by it: --block-by COLUMN,r (block_by=('COLUMN', 'r') in Python)" in boot["one_run_blocks_note"]
    # blocks so few that fewer distinct resamples exist than B: 4 r blocks give 35 for B = 40 (said; nothing was)
    from loopscale.fit.bootstrapping import FEW_RESAMPLES, few_blocks_note, one_run_blocks_note

    assert few_blocks_note(np.repeat(np.arange(4), 3), ("r",), 40) == (
        "the bootstrap resamples 4 (r) blocks, which allow only 35 distinct resamples for the 40 drawn: the draws "
        "repeat, and the interval rests on those few fits; block by more columns (e.g. the budget and r) for more "
        "blocks")  # fmt: skip
    # C(7, 4) = 35 allows 35, but the draws that were fitted tell: 35 multinomial draws of 4 blocks (a single-r
    # draw drawn again, as the joint law's are) hold far fewer distinct resamples
    rng, rows = np.random.default_rng(0), []
    while len(rows) < 35:
        counts = rng.multinomial(4, [0.25] * 4)
        if (counts > 0).sum() > 1:
            rows.append(np.repeat(counts, 3))
    W, ok = np.asarray(rows, float), np.ones(35, bool)
    used = len(np.unique(W, axis=0))
    assert used < 0.9 * 35
    assert few_blocks_note(np.repeat(np.arange(4), 3), ("r",), 35, W, ok) == (
        f"the bootstrap resamples 4 (r) blocks (at most 35 distinct resamples): its 35 refitted draws hold only {used} "
        "distinct ones, so the interval rests on those few fits; block by more columns (e.g. the budget and r) for "
        "more blocks")  # fmt: skip
    assert few_blocks_note(np.repeat(np.arange(4), 3), ("r",), 35, W[:1], ok[:1]) is None  # one draw: no repeat
    many = np.asarray([np.repeat(rng.multinomial(48, [1 / 48] * 48), 2) for _ in range(100)], float)
    assert few_blocks_note(np.repeat(np.arange(48), 2), ("D", "r"), 100, many, np.ones(100, bool)) is None
    # a large B repeats draws of any blocking (8 blocks: ~850 distinct of 1000), yet rests on hundreds of fits
    eight = np.asarray([np.repeat(rng.multinomial(8, [1 / 8] * 8), 2) for _ in range(1000)], float)
    assert FEW_RESAMPLES <= len(np.unique(eight, axis=0)) < 0.9 * 1000
    assert few_blocks_note(np.repeat(np.arange(8), 2), ("D", "r"), 1000, eight, np.ones(1000, bool)) is None
    assert few_blocks_note(np.arange(12), None, 200) is None  # iid: 12 runs resampled one by one
    res = CliRunner().invoke(app, [*base[:2], "--bootstrap", "40", *base[4:], "--block-by", "r"])
    assert res.exit_code == 0, res.output
    n_r = _iso_flop()["r"].nunique()
    if math.comb(2 * n_r - 1, n_r) < 40:  # fewer possible than drawn: said whatever was drawn
        assert f"resamples {n_r} (r) blocks" in json.loads(res.stdout)["bootstrap"]["few_blocks_note"]
    # a Chinchilla table blocked without r: the advice names no r column (it has none)
    assert one_run_blocks_note(np.arange(4), ("C",)).endswith("block by it: --block-by COLUMN (block_by=('COLUMN',) "
                                                              "in Python)")  # fmt: skip
    res = CliRunner().invoke(app, base)  # the default: (C, r), blocks of several runs, no note
    boot = json.loads(res.stdout)["bootstrap"]
    assert boot["block_by"] == ["C", "r"] and "one_run_blocks_note" not in boot


def test_identification_from_few_resamples_says_so_and_is_not_precise():
    """--identify with 3 resamples printed an unqualified 'phi = x, 95 % CI [...]' (precise: true) whose interval
    did not even hold the estimate; the rule's checks stand, but the headline says the verdict rests on 3."""
    from loopscale.fit.fitter import fit_law
    from loopscale.fit.identify import identify

    df = _iso_flop()
    point = fit_law(df, "joint", starts=20, seed=0)
    phi = point.params["phi"]
    ci = (phi - 0.05, phi + 0.05)
    few = identify(point, ci, None, None, n_resamples=3)
    assert "from 3 refitted resample(s), fewer than the 50" in few.headline
    assert "half-width" not in few.headline  # 0.05 is within the target: not called imprecise
    assert few.precise is False and few.details["few_resamples"] == 3
    enough = identify(point, ci, None, None, n_resamples=200)
    assert "refitted resample" not in enough.headline and enough.precise is True
    assert "few_resamples" not in enough.to_dict()
    assert identify(point, ci, None, None).precise is True  # number unknown: nothing said


def test_fit_table_warns_of_values_in_another_unit_as_the_cli_does():
    """fit_table (documented as `loopscale fit` in one call) gave none of the CLI's input warnings: D in billions
    of tokens was fitted without a word to a Python user."""
    from loopscale.fit import fit_table

    df = _iso_flop().assign(D=lambda f: f["D"] / 1e9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tf = fit_table(df, starts=5)
    said = [str(w.message) for w in caught if str(w.message).startswith("table: ")]
    assert len(said) == 1 and "D is below 1,000 tokens on every row" in said[0]
    assert tf.input_warnings == [said[0].removeprefix("table: ")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fit_table(_iso_flop(), starts=5).input_warnings == []
    assert not [w for w in caught if str(w.message).startswith("table: ")]


def test_write_fit_outputs_keeps_the_files_already_in_its_folder(tmp_path):
    """write_fit_outputs replaced a fit.json already in its folder (the user's own file was lost); it moves such
    files aside first, as `loopscale fit --out` does, and warns where to."""
    from loopscale.fit import fit_law, write_fit_outputs

    out = tmp_path / "apiout"
    out.mkdir()
    (out / "fit.json").write_text('{"mine": 1}')
    (out / "notes.txt").write_text("kept in place")
    fit = fit_law(_iso_flop(), "joint", starts=5, seed=0)
    with pytest.warns(UserWarning, match=r"moved the files already in .* \(fit.json\) to .*earlier_fit_"):
        files = write_fit_outputs(out, fit, plots=False)
    aside = [p for p in out.iterdir() if p.is_dir()]
    assert len(aside) == 1 and json.loads((aside[0] / "fit.json").read_text()) == {"mine": 1}
    assert (out / "notes.txt").read_text() == "kept in place"
    assert json.loads((out / "fit.json").read_text())["law"] == "joint" and set(files) == {"fit.json"}
