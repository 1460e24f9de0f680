"""The Python API fits a table as `loopscale fit` does (fit_table), and the per-run fitters (fit_law, bootstrap)
refuse or say what the CLI would fit otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_cpu"


def test_fit_table_gives_the_clis_fit_of_a_seed_replicate_table_and_fit_law_says_it_differs():
    """On the cpu example (352 runs: 8 cells of 44 seeds at one D) fit_law fitted every run (phi -0.58, R2 0.83,
    B on the box edge) without a word, while `loopscale fit` and the report fit the 8 cell means (phi -0.45,
    R2 0.98). fit_table gives the CLI's numbers; fit_law warns that it fits otherwise, and takes the run folder."""
    from typer.testing import CliRunner

    from loopscale.fit import PerRunFitWarning, fit_law, fit_table
    from loopscale.sweep.cli import app

    res = CliRunner().invoke(app, ["fit", str(EXAMPLE), "--starts", "60", "--json"])
    assert res.exit_code == 0, res.output
    cli = json.loads(res.stdout)
    tf = fit_table(EXAMPLE / "runs.parquet", starts=60)
    assert tf.by_cell and tf.replicates.cells == 8 and tf.data.n == 352
    assert tf.params == pytest.approx(cli["params"], rel=1e-9)
    assert tf.fit.n == cli["n"] == 8
    with pytest.warns(PerRunFitWarning, match=r"seeds are replicates \(8 cells of 352 runs at one D.*fit_table"):
        per_run = fit_law(EXAMPLE, starts=60)  # the run folder, as the CLI takes it
    assert per_run.n == 352 and abs(per_run.params["phi"] - tf.params["phi"]) > 0.05


def test_the_per_run_fitters_refuse_pooled_variants_and_a_one_point_chinchilla_fit():
    """fit_law pooled two variants' looped runs into one law (phi -0.04, R2 0.54) and fitted the Chinchilla law to
    one (N, D) point (R2 -0.009), both silently; the CLI refused both. They are refused in Python too, and
    fit_table fits one variant when asked."""
    from loopscale.fit import bootstrap, fit_law, fit_table

    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    hc = df[df["r"] > 1].assign(variant="hyperconnect", final_val_loss=lambda d: d["final_val_loss"] - 0.05,
                                run_id=lambda d: "hc_" + d["run_id"])
    two = pd.concat([df, hc], ignore_index=True)
    for fn in (lambda: fit_law(two, starts=10), lambda: bootstrap(two, B=2, workers=1, starts=10)):
        with pytest.raises(ValueError, match=r"holds variants \['baseline', 'hyperconnect'\] with looped runs.*"
                           r"fit_table\(table, variant='NAME'\)"):  # fmt: skip
            fn()
    one = fit_table(two, variant="hyperconnect", starts=30)
    assert one.variant == "hyperconnect" and one.data.n == len(df[df["r"] == 1]) + len(hc)
    point = df[df["r"] == 2].assign(N=lambda d: d["N_unique"])
    with pytest.raises(ValueError, match=r"share one N \(\d+\) and one D .*one point of the law"):
        fit_law(point, law="chinchilla", starts=10)


def test_fit_table_checks_its_arguments_before_fitting():
    from loopscale.fit import fit_table

    t = EXAMPLE / "runs.parquet"
    with pytest.raises(ValueError, match="identify needs a bootstrap"):
        fit_table(t, identify=True)
    with pytest.raises(ValueError, match="point fit"):
        fit_table(t, law="joint_per_r", bootstrap=5)
    with pytest.raises(ValueError, match=r"r=\[3\]: the table has r = \[1, 2, 4, 8\]"):
        fit_table(t, r=3)
    with pytest.raises(ValueError, match=r"block_by='r'.*seeds are replicates.*add --per-run \(per_run=True"):
        fit_table(t, block_by="r", bootstrap=2, workers=1)


def test_the_packages_list_their_lazy_names():
    """dir() of loopscale.fit / .model / .sweep listed only __getattr__: a notebook could not tab-complete
    fit_law, train_run or run_sweep."""
    import loopscale.fit
    import loopscale.model
    import loopscale.sweep

    assert {"fit_table", "fit_law", "bootstrap", "TableFit"} <= set(dir(loopscale.fit))
    assert "train_run" in dir(loopscale.model) and "run_sweep" in dir(loopscale.sweep)


def test_isoflop_parabolas_of_a_token_budget_grid_keeps_its_columns():
    """On a token-budget grid (budget null) isoflop_parabolas returned a DataFrame with no columns at all; it keeps
    the documented columns (no rows), and by=("D", "r") gives one row per (D, r) cell with 3 or more sizes."""
    from loopscale.fit import isoflop_parabolas

    df = pd.read_parquet(Path(__file__).resolve().parents[1] / "docs" / "example_cpu_ladder" / "runs.parquet")
    empty = isoflop_parabolas(df.assign(budget=None))
    assert len(empty) == 0 and list(empty.columns)[-10:] == ["n_points", "n_sizes", "N_min", "N_max", "N_vertex",
                                                           "L_vertex", "curvature", "approximate", "method", "note"]  # fmt: skip
    by_d = isoflop_parabolas(df, by=("D", "r"))
    assert (by_d["n_sizes"] >= 3).any()
    few = by_d[by_d["n_sizes"] < 3]  # the looped cells: one size each, said, no vertex
    assert len(few) and few["N_vertex"].isna().all() and few["note"].str.contains("a parabola in log N needs 3").all()
    # one NaN or negative loss made its cell read "the loss rises across every size trained" or "no minimum", a
    # design problem: refused, naming the value, as the fits refuse it
    for bad in (np.nan, -3.0, 0.0):
        worse = df.assign(final_val_loss=np.where(df.index == 5, bad, df["final_val_loss"]))
        with pytest.raises(ValueError, match=r"1 ok row\(s\) have a final_val_loss that is not a positive finite "
                                             r"number \(first: "):  # fmt: skip
            isoflop_parabolas(worse, by=("D", "r"))


def test_an_isoflop_vertex_outside_the_sizes_trained_is_withheld_and_said():
    """A cell whose loss rises across every size trained put its parabola's vertex at N = 5.6 parameters for sizes
    of 1.3e4-2.8e5, with a loss below every run's, and the report printed it unflagged; a cell without a minimum
    showed a bare '-'. Now the vertex is given only inside the sizes trained, and every empty vertex says why."""
    from loopscale.fit import isoflop_parabolas

    N = np.array([1.3e4, 6.0e4, 2.8e5])
    x = np.log(N)
    up = 3.0 + 0.1 * (x - x[0]) + 0.01 * (x - x[0]) ** 2  # convex, rising: its vertex far below the smallest size
    inside = 3.0 + 0.05 * (x - x[1]) ** 2  # its vertex at the middle size
    down = 3.0 - 0.05 * (x - x[1]) ** 2  # concave: no minimum
    df = pd.DataFrame({"budget": np.repeat([1e9, 2e9, 3e9, 4e9], [3, 3, 3, 2]), "r": 1,
                       "N": [*N, *N, *N, *N[:2]], "loss": [*up, *inside, *down, *up[:2]]})  # fmt: skip
    iso = isoflop_parabolas(df).set_index("budget")
    assert iso.loc[2e9, "N_vertex"] == pytest.approx(6.0e4, rel=1e-6) and iso.loc[2e9, "note"] is None
    assert iso.loc[2e9, "L_vertex"] == pytest.approx(3.0, abs=1e-9) and iso.loc[2e9, ["N_min", "N_max"]].tolist() == [1.3e4, 2.8e5]
    out = iso.loc[1e9]
    vertex = float(np.exp(x[0] - 0.1 / (2 * 0.01)))  # where the rising parabola's minimum lies: ~87 parameters
    assert np.isnan(out["N_vertex"]) and np.isnan(out["L_vertex"]) and out["curvature"] == pytest.approx(0.01)
    assert out["note"] == (f"the loss rises across every size trained (1.3e+04 to 2.8e+05): the parabola's minimum, "
                           f"N = {vertex:.3g}, lies outside them; train smaller sizes at this budget")  # fmt: skip
    assert np.isnan(iso.loc[3e9, "N_vertex"]) and "no minimum" in iso.loc[3e9, "note"]
    assert iso.loc[4e9, "n_sizes"] == 2 and iso.loc[4e9, "note"] == "2 sizes: a parabola in log N needs 3"
    falls = 3.0 - 0.1 * (x - x[-1]) + 0.01 * (x - x[-1]) ** 2  # its minimum far above the largest size
    note = isoflop_parabolas(pd.DataFrame({"budget": 1e9, "r": 1, "N": N, "loss": falls}))["note"].iloc[0]
    assert note.startswith("the loss falls across every size trained") and note.endswith("train larger sizes at this budget")


def test_a_fractional_starts_is_one_clear_error():
    """fit_law(df, starts=2.5) ended in numpy's "'float' object cannot be interpreted as an integer"."""
    from loopscale.fit import fit_law

    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    df = df[df["seed"] == df["seed"].min()]  # one seed per cell
    with pytest.raises(ValueError, match=r"starts=2.5 must be a whole number >= 1"):
        fit_law(df, starts=2.5)
    with pytest.raises(ValueError, match=r"starts=True must be a whole number"):
        fit_law(df, starts=True)


def test_fit_table_names_what_is_missing_in_the_terms_of_the_table():
    """Three refusals that said "N run(s) left is fewer than the P parameters; add runs" or asked for a variant:
    a Chinchilla fit of the 3 seeds of one (N, D) point (more seeds cannot help: one point of the law); the per-r
    joint law on 21 seed replicates in 7 cells (fitted as 7 cell means, 8 parameters: cells are missing, not runs);
    and the shared r = 1 runs of a table of two variants, which need no variant named."""
    from loopscale.fit import fit_table

    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    hc = df[df["r"] > 1].assign(variant="hyperconnect", run_id=lambda d: "hc_" + d["run_id"])
    two = pd.concat([df, hc], ignore_index=True)
    three = hc[hc["r"] == 2].head(3)
    with pytest.raises(ValueError, match=r"the 3 runs fitted share one N \(\d+\) and one D .*one point of the law"):
        fit_table(pd.concat([df[df["r"] == 1], three]), variant="hyperconnect", law="chinchilla", r=2)
    # a table of your own with N_once and N_rec but no N or N_unique column: the same (it said "add runs")
    bare = three[["r", "N_once", "N_rec", "D", "seed", "final_val_loss"]].rename(columns={"final_val_loss": "loss"})
    with pytest.raises(ValueError, match=r"the 3 runs fitted share one N \(\d+\) and one D .*one point of the law"):
        fit_table(bare, law="chinchilla")
    seven = df[df["seed"] < 3]
    seven = seven[(seven["r"] > 1) | (seven["n_recur_block"] != 10)]  # 4 plain depths + 3 looped cells
    from loopscale.fit.io import TooFewRunsError  # (a run folder's fit then names the runs left to train)

    with pytest.raises(TooFewRunsError, match=r"its \d+ runs are 7 cells .* fitted as 7 cell means, fewer than the 8 "
                       r"parameters of law 'joint_per_r'; more seeds do not help: add cells"):  # fmt: skip
        fit_table(seven, law="joint_per_r", starts=10)
    r1 = fit_table(two, law="chinchilla", r=1, starts=20)  # the r = 1 runs every variant shares
    assert r1.variant == "baseline" and r1.data.n == int((df["r"] == 1).sum())
    with pytest.raises(ValueError, match=r"holds variants \['baseline', 'hyperconnect'\]: give --variant"):
        fit_table(two, law="chinchilla", r=2, starts=20)  # r = 2 of two variants: still one variant's fit


def test_cells_left_with_one_seed_are_named_as_narrowing_the_intervals(tmp_path):
    """The cpu example with every looped cell cut to one seed gave phi [-0.35, -0.20] (all seeds: [-0.57, -0.37])
    without a word: a one-seed cell's mean is the same in every within-cell resample. The bootstrap now names such
    cells, `loopscale fit` says it once, and the report says it; with 2 seeds in every cell there is no note."""
    from typer.testing import CliRunner

    from loopscale.fit import fit_table
    from loopscale.fit.bootstrapping import single_seed_note
    from loopscale.sweep.cli import app

    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    cut = df[(df["r"] == 1) | (df["seed"] == 0)]
    keys = ("d_model", "r", "n_recur_block", "D")
    note = single_seed_note(cut, keys)
    assert note.startswith("3 of 8 cells have one seed (d_model=16, r=2, ") and "too narrow" in note
    assert single_seed_note(df[df["seed"] < 2], keys) is None  # two seeds everywhere
    assert single_seed_note(df[df["seed"] == 0], keys) is None  # one seed everywhere: no interval, said elsewhere
    with pytest.warns(UserWarning, match="3 of 8 cells have one seed"):
        tf = fit_table(cut, bootstrap=8, workers=1, starts=10)
    assert tf.boot.extra["single_seed_note"].startswith("3 of 8 cells have one seed")
    cut.to_parquet(tmp_path / "cut.parquet")
    res = CliRunner().invoke(app, ["fit", str(tmp_path / "cut.parquet"), "--bootstrap", "8", "--workers", "1",
                                   "--starts", "10"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.output.count("cells have one seed") == 1 and "  warning: 3 of 8 cells have one seed" in res.output
