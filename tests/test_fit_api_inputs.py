"""The Python API takes what its docs promise and refuses the rest with a message that names it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_cpu"


def test_ladder_table_takes_a_runs_parquet_path_and_its_columns():
    """ladder_table('.../runs.parquet') raised AttributeError ('str' has no 'columns'), and runs.parquet's own
    columns (final_val_loss, n_prelude/n_recur_block/n_coda) were not read as loss and layers_unique."""
    from loopscale.fit import ladder_table

    from_path = ladder_table(EXAMPLE / "runs.parquet", n_boot=20, seed=0)
    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    by_hand = df.assign(loss=df["final_val_loss"], layers_unique=df["n_prelude"] + df["n_recur_block"] + df["n_coda"])
    ref = ladder_table(by_hand, n_boot=20, seed=0)
    assert list(from_path["r"]) == [2, 4, 8]
    pd.testing.assert_frame_equal(from_path, ref)
    with pytest.raises(ValueError, match=r"missing layers_unique \(or n_prelude, n_recur_block and n_coda\)"):
        ladder_table(df.drop(columns=["n_coda"]))
    with pytest.raises(ValueError, match=r"missing loss \(or final_val_loss\)"):
        ladder_table(df.drop(columns=["final_val_loss"]))
    nul = df.assign(d_model=df["d_model"].astype(float))
    nul.loc[nul["r"] == 4, "d_model"] = None
    with pytest.raises(ValueError, match=r"ladder_table: column 'd_model' is null on 64 of 352 runs"):
        ladder_table(nul, n_boot=5)


@pytest.mark.filterwarnings("ignore::UserWarning")  # PerRunFitWarning: fit_law and bootstrap fit every run
def test_bootstrap_refuses_the_per_r_law_and_a_point_of_another_law():
    import loopscale.fit.bootstrapping as bs
    from loopscale.fit import bootstrap, fit_law

    with pytest.raises(ValueError, match=r"law 'joint_per_r' is a point fit .*has no bootstrap") as e:
        bootstrap(EXAMPLE / "runs.parquet", law="joint_per_r", B=2, workers=1)
    assert "rs" not in str(e.value).split()
    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    chin = fit_law(df[df["r"] == 1].assign(N=lambda d: d["N_unique"]), law="chinchilla", starts=5)
    fixed = fit_law(df, law="joint", phi=0.0, starts=5)
    for point, phi, said in ((chin, None, r"law 'chinchilla' with 5 fitted parameters, and the bootstrap refits law "
                                           r"'joint' with 6 fitted parameters"),
                             (fixed, None, r"law 'joint' with 5 fitted parameters \(phi fixed at 0\), and the "
                                           r"bootstrap refits law 'joint' with 6"),
                             (fixed, 1.0, r"\(phi fixed at 0\), and the bootstrap refits law 'joint' with 5 fitted "
                                          r"parameters \(phi fixed at 1\)")):  # fmt: skip
        with pytest.raises(ValueError, match=said):
            bootstrap(df, law="joint", phi=phi, B=2, workers=1, starts=5, point=point)
    bs.check_point(fixed, bs.make_law("joint", 0.0))  # the same law: accepted


def test_fit_table_says_a_bootstrap_of_zero_is_valid():
    from loopscale.fit import fit_table

    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"must be a whole number >= 0 of resamples \(0: no bootstrap"):
            fit_table(EXAMPLE / "runs.parquet", bootstrap=bad)


def _no_fit(monkeypatch):
    """Make any fit an error, so that a check that comes after the point fit fails the test."""
    import loopscale.fit.bootstrapping as bs
    import loopscale.fit.fitter as fitter
    import loopscale.fit.table_fit as tf
    import loopscale.fit.variants as va

    def boom(*a, **k):
        raise AssertionError("a fit ran before the bad argument was refused")

    for mod in (fitter, bs, va):
        monkeypatch.setattr(mod, "fit_data", boom)
    monkeypatch.setattr(fitter, "minimize_multistart", boom)
    return tf


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"B": 2.5}, r"B=2.5 must be a whole number >= "),
        ({"B": True}, r"B=True must be a whole number >= "),
        ({"B": -3}, r"B=-3 must be a whole number >= "),
        ({"workers": 0}, r"workers=0 must be a whole number >= 1"),
        ({"seed": -1}, r"seed=-1 must be a whole number >= 0"),
        ({"delta": "x"}, r"delta='x' must be a finite number > 0"),
        ({"level": 95}, r"level=95 must be a number in \(0, 1\)"),
    ],
)
def test_bootstrap_and_compare_variants_refuse_bad_arguments_before_any_fit(monkeypatch, kwargs, message):
    """bootstrap(B=2.5) spent the point fit, then failed in np.zeros; compare_variants(B=0) said every draw was
    degenerate, B=-3 failed with numpy's 'negative dimensions' and level=95 with numpy's quantile error, all after
    the point fits."""
    from loopscale.fit import bootstrap, compare_variants

    _no_fit(monkeypatch)
    with pytest.raises(ValueError, match=message):
        bootstrap(EXAMPLE / "runs.parquet", **{"B": 4, "workers": 1, **kwargs})
    table = pd.read_parquet(EXAMPLE / "runs.parquet").assign(variant="baseline")
    with pytest.raises(ValueError, match=message):
        compare_variants(table, **{"B": 4, "workers": 1, **kwargs})


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compare_variants_without_a_bootstrap_gives_the_point_delta_and_says_why_no_interval():
    """B = 0 (what `loopscale run --bootstrap 0` passes for a spec of several variants) said every paired draw was
    degenerate, as if the design were at fault."""
    import numpy as np

    from loopscale.fit import bootstrap, compare_variants

    t = pd.read_parquet(EXAMPLE / "runs.parquet").assign(variant="baseline")
    o = t[t["r"] > 1].assign(variant="other", run_id=lambda x: x["run_id"] + "_o")
    o["final_val_loss"] = o["final_val_loss"] * (1 + 0.002 * np.log(o["r"]))
    res = compare_variants(pd.concat([t, o]), B=0, starts=20, workers=1)
    row = res["comparisons"]["other"]
    assert row["delta_phi"] == pytest.approx(row["phi"] - res["fits"]["baseline"]["params"]["phi"])
    assert row["delta_phi"] < 0 and row["n_ok"] == 0
    assert row["no_interval"].startswith("no bootstrap (B = 0)")
    with pytest.raises(ValueError, match=r"B=0 must be a whole number >= 1"):
        bootstrap(EXAMPLE / "runs.parquet", B=0, workers=1)


def test_fit_law_and_fit_table_refuse_bad_arguments_before_any_fit(monkeypatch):
    from loopscale.fit import fit_law, fit_table

    _no_fit(monkeypatch)
    for kwargs, message in (
        ({"seed": -1}, r"seed=-1 must be a whole number >= 0"),
        ({"seed": "a"}, r"seed='a' must be a whole number >= 0"),
        ({"delta": "x"}, r"delta='x' must be a finite number > 0"),
    ):
        with pytest.raises(ValueError, match=message):
            fit_law(EXAMPLE / "runs.parquet", **kwargs)
        with pytest.raises(ValueError, match=message):
            fit_table(EXAMPLE / "runs.parquet", **kwargs)
    with pytest.raises(ValueError, match=r"workers=0 must be a whole number >= 1"):
        fit_table(EXAMPLE / "runs.parquet", bootstrap=5, workers=0)
    with pytest.raises(ValueError, match=r"workers='2' must be a whole number >= 1"):
        fit_table(EXAMPLE / "runs.parquet", bootstrap=5, workers="2")


@pytest.mark.parametrize("r", [[1.5, 2], [2.9, 4], 0, [], [True]])
def test_fit_table_refuses_an_r_that_is_not_a_whole_number(monkeypatch, r):
    """fit_table(r=[1.5, 2]) fitted r in {1, 2} and r=[2.9, 4] fitted {2, 4}: int() truncated them silently."""
    from loopscale.fit import fit_table

    _no_fit(monkeypatch)
    with pytest.raises(ValueError, match=r"must be an integer >= 1 or a list of them"):
        fit_table(EXAMPLE / "runs.parquet", r=r)


def test_ladder_table_refuses_a_nan_loss_and_bad_bootstrap_arguments():
    """A NaN loss on an ok run was dropped silently (its cell reported 63 seeds); n_boot=0 raised IndexError and
    level=2 numpy's quantile error."""
    from loopscale.fit import ladder_table

    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    nan = df.copy()
    nan.loc[nan.index[nan["r"] == 2][0], "final_val_loss"] = float("nan")
    with pytest.raises(ValueError, match=r"'final_val_loss' has 1 value\(s\) that are not a finite loss > 0"):
        ladder_table(nan, n_boot=5)
    ok = ladder_table(df, n_boot=5)
    assert list(ok["n_seeds"]) == [64, 64, 64]
    for kwargs, message in (
        ({"n_boot": 0}, r"n_boot=0 must be a whole number >= 1"),
        ({"n_boot": -5}, r"n_boot=-5 must be a whole number >= 1"),
        ({"level": 2}, r"level=2 must be a number in \(0, 1\)"),
    ):
        with pytest.raises(ValueError, match=message):
            ladder_table(df, **kwargs)


@pytest.mark.filterwarnings("ignore::UserWarning")  # PerRunFitWarning: a Chinchilla fit of one D
def test_predict_names_a_missing_column():
    from loopscale.fit import fit_law

    df = pd.read_parquet(EXAMPLE / "runs.parquet")
    means = df.groupby(["r", "n_prelude", "n_recur_block", "n_coda"], as_index=False).agg(
        loss=("final_val_loss", "mean"), N_once=("N_once", "first"), N_rec=("N_rec", "first"), D=("D", "first"),
        N_unique=("N_unique", "first"),
    )
    joint = fit_law(means, starts=20)
    pred = joint.predict(means)
    assert pred.shape == (len(means),) and abs(pred - means["loss"]).max() < 0.05
    with pytest.raises(ValueError, match=r"'joint' law needs columns \['D', 'N_once', 'N_rec', 'r'\]; missing \['r'\]"):
        joint.predict(means.drop(columns=["r"]))
    chin = fit_law(means[means["r"] == 1], law="chinchilla", starts=20)
    with pytest.raises(ValueError, match=r"missing \['N \(or N_unique, or N_once \+ N_rec\)'\]"):
        chin.predict(means.drop(columns=["N_unique", "N_rec"]))


def test_equivalence_refuses_nan_and_non_numbers():
    from loopscale.fit import equivalence

    ok = equivalence(1000, 500, 4, 0.5)
    assert ok["N_eff"] == pytest.approx(1000 + 2 * 500)
    for kwargs, message in (
        ({"N_once": float("nan")}, r"N_once=nan must be finite"),
        ({"r": float("nan")}, r"r=nan must be finite"),
        ({"phi": "a"}, r"phi='a' must be a number"),
        ({"phi": [0.5, 0.6]}, r"must be one number"),
        # read as numbers before ('4' as 4, True as 1), against the docstring's "not numeric" refusal
        ({"N_once": "4"}, r"N_once='4' must be a number"),
        ({"phi": "0.4"}, r"phi='0.4' must be a number"),
        ({"N_once": True}, r"N_once=True must be a number"),
        ({"N_reference": -5}, r"N_reference=-5 must be > 0"),  # gave a ratio of -1.9
        ({"N_reference": 0}, r"N_reference=0 must be > 0"),  # gave inf and a numpy warning
    ):
        args = {"N_once": 1000, "N_rec": 500, "r": 4, "phi": 0.5, **kwargs}
        with pytest.raises(ValueError, match=message):
            equivalence(**args)


def test_a_joint_fit_of_one_r_advises_fixing_phi_only_where_phi_acts():
    """A table of r = 1 runs only was told to fix phi (--phi 0.5), which changes nothing there (r^phi = 1); a table
    of one looped r can still be fitted with phi held."""
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    t = pd.DataFrame({"N_once": [1e6, 2e6, 4e6, 8e6] * 2, "N_rec": [1e6, 2e6, 4e6, 8e6] * 2, "D": [1e8] * 4 + [1e9] * 4,
                      "loss": [3.5, 3.3, 3.2, 3.1, 3.2, 3.0, 2.9, 2.8]})  # fmt: skip
    with pytest.raises(ValueError, match=r"every run has r = 1; fit one architecture's law instead \(--law chinchilla; "
                                         r"law='chinchilla' in Python\) \(phi has no effect on runs of r = 1") as e:
        prepare(t.assign(r=1), make_law("joint"))
    assert "--phi" not in str(e.value)
    with pytest.raises(ValueError, match=r"every run has r = 4; .* or fix phi \(--phi 0.5; phi=0.5 in Python\)$"):
        prepare(t.assign(r=4), make_law("joint"))


def test_a_torn_runs_parquet_is_said_as_such_by_fit(tmp_path):
    """`loopscale fit DIR` on a folder whose runs.parquet is cut short printed pyarrow's bare "Parquet magic bytes
    not found in footer" (status on the same folder explained it): it now names the table, says it is unreadable
    and where to look, exit 2."""
    from typer.testing import CliRunner

    from loopscale.fit.io import read_table
    from loopscale.sweep.cli import app

    run = tmp_path / "run"
    run.mkdir()
    (run / "runs.parquet").write_bytes((EXAMPLE / "runs.parquet").read_bytes()[:3000])
    with pytest.raises(ValueError, match=r"runs.parquet' is not a readable Parquet table \(.*magic bytes.*\): torn"):
        read_table(run)
    res = CliRunner().invoke(app, ["fit", str(run)])
    assert res.exit_code == 2 and "is not a readable Parquet table" in res.output and "`loopscale status DIR`" in res.output


def _outside_table(n_scale: float = 1.0, d_scale: float = 1.0) -> pd.DataFrame:
    """A hand-made joint-law table (4 r x 3 widths x 3 D, noise-free), N and D scaled by the given factors."""
    import numpy as np

    from loopscale.fit.synthetic import joint_loss

    rows = [dict(r=r, N_once=w * 2e4, N_rec=w * 8e4 / r, D=dd) for r in (1, 2, 4, 8) for w in (1, 4, 16)
            for dd in (2e8, 5e8, 1e9)]  # fmt: skip
    df = pd.DataFrame(rows)
    df["loss"] = joint_loss(df, dict(E=1.8, A=400.0, alpha=0.34, B=2000.0, beta=0.36, phi=0.5))
    return df.assign(N_once=df.N_once * n_scale, N_rec=df.N_rec * n_scale, D=df.D * d_scale).astype(np.float64)


def test_values_that_read_as_another_unit_are_warned_about_but_a_loopscale_table_is_not():
    """A perplexity column, D in millions and N in millions were fitted without a word (E, B or A then wrong);
    each is now one warning naming the unit the fit reads. The same bounds would flag the smoke preset's own
    tables (D of 1,024 tokens), so a loopscale results table gets none."""
    import numpy as np

    from loopscale.fit.io import prepare, unit_warnings
    from loopscale.fit.laws import make_law

    law = make_law("joint")
    good = _outside_table()
    assert unit_warnings(prepare(good, law)) == []
    (ppl,) = unit_warnings(prepare(good.assign(loss=np.exp(good["loss"])), law))
    assert ppl.startswith("loss reaches ") and "(36 of 36 rows above 15)" in ppl and "natural log" in ppl
    # one row far above the others is an outlier, not a perplexity column (it was told to fit the log of it all)
    (one,) = unit_warnings(prepare(good.assign(loss=np.where(np.arange(len(good)) == 3, 30.0, good["loss"])), law))
    assert "(1 of 36 rows above 15)" in one and "check those rows" in one and "natural log" not in one
    # a perplexity column of 10-20 has most rows below 15: still named a perplexity (a third above, here)
    ppl = np.linspace(10, 20, len(good))
    (mixed,) = unit_warnings(prepare(good.assign(loss=ppl), law))
    assert f"({int((ppl > 15).sum())} of 36 rows above 15)" in mixed and "natural log" in mixed
    small = good.head(6)  # one diverged row of six kept as ok: rows to check, not a perplexity
    chin = make_law("chinchilla")
    (six,) = unit_warnings(prepare(small.assign(loss=np.where(np.arange(6) == 0, 30.0, small["loss"])), chin))
    assert "(1 of 6 rows above 15)" in six and "check those rows" in six
    (d_m,) = unit_warnings(prepare(_outside_table(d_scale=1e-7), law))
    assert d_m == ("D is below 1,000 tokens on every row (largest 100): the fit reads D in tokens; a D in "
                   "millions or billions of tokens fits another B (the other parameters are the same)")  # fmt: skip
    # with two D, E, B and beta are not pinned down: another unit of D moved E and beta too (the note said not)
    two_d = _outside_table(d_scale=1e-7)
    two_d = two_d[two_d["D"].isin(sorted(two_d["D"].unique())[:2])]
    (d_2,) = unit_warnings(prepare(two_d, law))
    assert d_2.endswith("fits another B (with 2 value(s) of D, E, B and beta are not pinned down and may move too)")
    # a grid as small as a smoke run's, cut to the fit's columns (D 4,000-20,000 tokens, N 3e3-1.6e5): none
    assert unit_warnings(prepare(_outside_table(n_scale=0.1, d_scale=2e-5), law)) == []
    # N in millions of models of 1B and more: D per parameter far beyond any trained model's
    few, n_big = unit_warnings(prepare(_outside_table(n_scale=1e-3), law))
    assert few.startswith("N_once + N_rec is below 1,000 parameters on 33 of 36 rows (e.g. 100; the others count "
                          "more)"), few  # fmt: skip
    assert n_big.startswith("D is above 100,000 tokens per parameter on every row (D / (N_once + N_rec) at least ")
    # either column can be the one in another unit: D x 1e6 moved B, not A, and the note named only N
    assert "a count of parameters in millions or billions fits another A, a D counted in a smaller unit than " \
           "tokens (bytes, characters) or scaled up fits another B" in n_big  # fmt: skip
    (d_per_n,) = unit_warnings(prepare(_outside_table(n_scale=10, d_scale=1e-5), law))  # D <= 1e4, N >= 3e5
    assert d_per_n.startswith("D is below 0.1 tokens per parameter on every row (D / (N_once + N_rec) at most ")
    (n_m,) = unit_warnings(prepare(_outside_table(n_scale=1e-6), law))
    assert n_m.startswith("N_once + N_rec is below 1,000 parameters on every row (largest 1.6)")
    # units mixed within the table: the r = 8 rows' D in billions (the check on every row let them through: a fit of
    # phi 0.98 and R^2 0.73 without a word), or their N_once, N_rec in millions
    r8 = good["r"] == 8
    (mixed_d,) = unit_warnings(prepare(good.assign(D=np.where(r8, good["D"] / 1e9, good["D"])), law))
    assert mixed_d.startswith("D is below 1,000 tokens on 9 of 36 rows (e.g. 0.2; the others reach more): the fit "
                              "reads every D in tokens"), mixed_d  # fmt: skip
    in_m = good.assign(N_once=np.where(r8, good["N_once"] / 1e6, good["N_once"]),
                       N_rec=np.where(r8, good["N_rec"] / 1e6, good["N_rec"]))  # fmt: skip
    mixed_n = unit_warnings(prepare(in_m, law))
    assert any(w.startswith("N_once + N_rec is below 1,000 parameters on 9 of 36 rows (e.g. 0.03; the others count "
                            "more)") for w in mixed_n), mixed_n  # fmt: skip
    smoke_like = _outside_table(n_scale=10, d_scale=1e-5).assign(run_id=[f"r{i}" for i in range(36)], flops_per_token=1.0,
                                                     tokenizer="byte", vocab_size=256)  # fmt: skip
    assert unit_warnings(prepare(smoke_like, law)) == []


def test_fit_states_units_and_fits_the_chinchilla_law_on_n_once_plus_n_rec(tmp_path):
    """`fit --law chinchilla --r 4` of a looped table without N refused it ('missing N'); N = N_once + N_rec (the
    unique parameters, as the run's per-r fits take them) is now fitted and said; --json carries the unit
    warnings; --help names every unit."""
    import json

    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    table = tmp_path / "t.csv"
    _outside_table().to_csv(table, index=False)
    res = CliRunner().invoke(app, ["fit", str(table), "--law", "chinchilla", "--r", "4", "--starts", "20",
                                   "--workers", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "law chinchilla: n = 9 runs" in res.output
    assert "note: the table has no N: N = N_once + N_rec, the unique parameters" in res.output
    millions = tmp_path / "m.csv"
    _outside_table(d_scale=1e-6).to_csv(millions, index=False)
    js = CliRunner().invoke(app, ["fit", str(millions), "--starts", "20", "--workers", "1", "--json"])
    assert js.exit_code == 0, js.output
    assert json.loads(js.stdout)["unit_warnings"][0].startswith("D is below 0.1 tokens per parameter on every row")
    helped = CliRunner().invoke(app, ["fit", "--help"], env={"COLUMNS": "200"})
    assert "(nats/token: ln of a perplexity, bits x ln 2), D (tokens)" in " ".join(helped.output.split())


def test_the_modules_the_docs_name_are_attributes_of_the_package():
    """The report's rule line names `loopscale.fit.identify`; `import loopscale.fit as lf; lf.identify` raised
    AttributeError in a fresh interpreter (a submodule is an attribute only once imported)."""
    import subprocess
    import sys

    code = "import loopscale.fit as lf; print(lf.identify.identify.__name__, lf.laws.PHI_BOUNDS)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["identify", "(-3.0,", "3.0)"], out.stderr


def test_the_frontier_refuses_an_r_its_table_cannot_give_flops_for():
    """compute_optimal_frontier fitted FLOPs per token per r from the run table and took 6 N at any other r, in
    silence: at r = 16 beside a table of r <= 8 it used 6 FLOPs per parameter (29 at r = 8) and called more looping
    cheaper. Such an r, an r below 1, params without E..beta, and make_law's rs for a law that takes none are
    refused, each naming the fix."""
    from loopscale.fit import compute_optimal_frontier
    from loopscale.fit.laws import make_law

    rows = []
    for r in (1, 2, 4, 8):
        for d in (64, 128):
            n_once, n_rec = 48 * d * d, (192 / r + 2) * d * d
            D = 1e9
            rows.append({"r": r, "N_once": n_once, "N_rec": n_rec, "D": D, "C": 6 * (n_once + r * n_rec) * D})
    t = pd.DataFrame(rows)
    P = {"E": 1.57, "A": 28.0, "alpha": 0.2, "B": 916.0, "beta": 0.37, "phi": 0.46}
    assert set(compute_optimal_frontier(P, t, [1e20], r_values=[8])["r"]) == {8.0}
    with pytest.raises(ValueError, match=r"r_values \[16\] have no runs in the table \(its r: \[1, 2, 4, 8\]\)"):
        compute_optimal_frontier(P, t, [1e20], r_values=[8, 16])
    assert set(compute_optimal_frontier(P, lambda N, r: 6 * N, [1e20], r_values=[16])["r"]) == {16.0}  # F given
    assert set(compute_optimal_frontier(P, t.drop(columns=["C"]), [1e20], r_values=[16])["r"]) == {16.0}  # 6 N, said
    with pytest.raises(ValueError, match=r"r_values=\[0\] must be whole numbers >= 1"):
        compute_optimal_frontier(P, t, [1e20], r_values=[0])
    with pytest.raises(ValueError, match=r"fit is missing \['alpha', 'B', 'beta'\]"):
        compute_optimal_frontier({"E": 1.57, "A": 28.0}, lambda N, r: 6 * N, [1e19])
    with pytest.raises(ValueError, match=r"rs=\(2, 4\) applies to law='joint_per_r' only"):
        make_law("joint", rs=(2, 4))


def test_a_header_with_spaces_around_a_name_is_said(tmp_path):
    """' loss' and 'D ' in a CSV header: the error said loss and D were missing, listing ' loss' and 'D ' without
    saying that the spaces were the problem."""
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    path = tmp_path / "t.csv"
    path.write_text("r, loss,D ,N_once,N_rec\n1,3.0,1e6,10,20\n")
    with pytest.raises(ValueError, match=r"missing \['loss', 'D'\].*' loss', 'D ' have spaces around the name: "
                                         r"remove them from the header"):  # fmt: skip
        prepare(str(path), make_law("joint"))
    path.write_text("r, final_val_loss,D,N_once,N_rec\n1,3.0,1e6,10,20\n")  # the name loopscale writes, spaced
    with pytest.raises(ValueError, match=r"missing \['loss'\].*' final_val_loss' has spaces around the name"):
        prepare(str(path), make_law("joint"))
    path.write_text("r,loss,D,N_once,N_rec_x\n1,3.0,1e6,10,20\n")
    with pytest.raises(ValueError, match=r"missing \['N_rec'\]; table has") as e:
        prepare(str(path), make_law("joint"))
    assert "spaces" not in str(e.value)
    # other tools' names and another case: named as likely renames (the error listed only what was missing)
    path.write_text("val_loss,tokens,params\n3.0,1e6,10\n")
    with pytest.raises(ValueError, match=r"; if they are those, rename 'val_loss' to loss, 'tokens' to D, 'params' to "
                                         r"N \(loss in nats/token, D in tokens, N in parameters\); table has"):  # fmt: skip
        prepare(str(path), make_law("chinchilla"))
    path.write_text("r,Loss,D,n_once,N_rec\n1,3.0,1e6,10,20\n")
    with pytest.raises(ValueError, match=r"rename 'Loss' to loss, 'n_once' to N_once \("):
        prepare(str(path), make_law("joint"))
    # a loopscale-like table's size is the width d, a data column names a corpus: neither is offered as N or D
    path.write_text("loss,data,size\n3.0,fineweb,16\n")
    with pytest.raises(ValueError, match=r"missing \['N', 'D'\]|missing \['D', 'N'\]") as e:
        prepare(str(path), make_law("chinchilla"))
    assert "rename" not in str(e.value)


def test_a_filtered_dataframe_names_rows_by_position_and_index_label():
    """On b[b.budget >= 1e18] with a NaN at index label 18 the message said 'first at row 2': df.loc[2] is another
    row or a KeyError. A DataFrame whose index is not its positions now gets both."""
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    rows = [{"r": r, "N_once": 24.0 * d * d, "N_rec": 96 / r * d * d, "D": D, "loss": 3.0 + 0.01 * i}
            for i, (r, d, D) in enumerate((r, d, D) for r in (1, 2, 4) for d in (16, 32) for D in (1e6, 2e6))]  # fmt: skip
    t = pd.DataFrame(rows)
    t.index = t.index + 100
    t.loc[103, "loss"] = np.nan
    with pytest.raises(ValueError, match=r"first at row 3 = index label 103\)"):
        prepare(t, make_law("joint"))
    with pytest.raises(ValueError, match=r"first at row 3\)"):  # positions and labels agree: the row alone
        prepare(t.reset_index(drop=True), make_law("joint"))
    # a filtered frame's index holds NumPy integers: the label as a number, not "np.int64(103)"
    filtered = t[t["r"] != 2]  # labels 100-103 and 108-111
    assert not isinstance(filtered.index, pd.RangeIndex)
    with pytest.raises(ValueError, match=r"first at row 3 = index label 103\)"):
        prepare(filtered, make_law("joint"))


def test_rows_without_a_status_beside_ok_rows_are_said():
    """After a merge, 105 of 116 rows had a null status and fit_table fitted the 11 'ok' ones without a word (the CLI
    printed only the count). Rows with no status, or a status none of loopscale's ('completed'), beside 'ok' rows
    are said in a UserWarning and the input warnings; loopscale's own statuses (diverged, failed) are not."""
    import warnings

    from loopscale.fit.table_fit import fit_table

    df = pd.read_parquet(Path(__file__).resolve().parents[1] / "docs" / "example_cpu_previous_default" / "runs.parquet")
    df["status"] = df["status"].astype(object)
    df.loc[df.index[:5], "status"] = None
    with pytest.warns(UserWarning, match=r"table: 5 rows with no status \(null\) left out beside the 43 with status "
                                         r"'ok': the fits take only 'ok' rows"):  # fmt: skip
        tf = fit_table(df, starts=8)
    assert tf.data.n == 43 and tf.input_warnings[0].startswith("5 rows with no status (null) left out")
    df.loc[df.index[5:7], "status"] = "completed"
    with pytest.warns(UserWarning, match=r"7 rows with status 'completed' or none \(null\) left out beside the 41"):
        fit_table(df, starts=8)
    ours = df.assign(status=["failed", "diverged", *["ok"] * (len(df) - 2)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loopscale's own statuses: the counts only, as before
        assert fit_table(ours, starts=8).input_warnings == []


def test_fit_table_says_a_pooled_chinchilla_fit_and_few_resamples_as_the_command_does():
    """`loopscale fit` notes a Chinchilla law fitted to several r pooled and intervals from fewer than 50 resamples;
    fit_table said neither (a notebook user who forgot r= got the pooled fit in silence)."""
    from loopscale.fit.table_fit import fit_table

    df = pd.read_parquet(Path(__file__).resolve().parents[1] / "docs" / "example_cpu_previous_default" / "runs.parquet")
    with pytest.warns(UserWarning, match=r"table: the Chinchilla law was fitted to the runs of r = 1, 2, 4, 8 pooled, "
                                         r"as one architecture .*r=R fits one, e.g. r=8"):  # fmt: skip
        assert fit_table(df, law="chinchilla", starts=8).pooled_r == [1, 2, 4, 8]
    with pytest.warns(UserWarning, match=r"table: the 95 % intervals rest on 6 refitted resample\(s\)"):
        fit_table(df[df["r"] == 1], law="chinchilla", starts=8, bootstrap=6, workers=1)


def test_polars_tables_are_read_and_predict_checks_its_values():
    """A polars DataFrame was refused (fit_table and predict); predict returned NaN with numpy's RuntimeWarning for
    a negative D, and a Chinchilla fit made from N_once + N_rec could not predict on its own
    table. polars tables are read, predict reads N as the fit does and refuses values the law is not defined at."""
    import polars as pl

    from loopscale.fit.table_fit import fit_table

    df = pd.read_parquet(Path(__file__).resolve().parents[1] / "docs" / "example_cpu_previous_default" / "runs.parquet")
    tf = fit_table(pl.from_pandas(df), starts=8)
    assert tf.data.n == len(df) and tf.params == fit_table(df, starts=8).params
    assert np.allclose(tf.fit.predict(pl.from_pandas(df)), tf.fit.predict(df))
    for bad in (-1.0, 0.0, np.inf):
        with pytest.raises(ValueError, match=r"predict: column 'D' holds .* at row 3 \(1 such row\(s\)\); the law "
                                             r"needs finite values, > 0"):  # fmt: skip
            tf.fit.predict(df.assign(D=np.where(df.index == 3, bad, df["D"])))
    # the values prepare refuses (one rule table): r below 1 or between whole numbers, a negative N_once
    with pytest.raises(ValueError, match=r"column 'r' holds 1.5 at row 3 .* a whole number >= 1"):
        tf.fit.predict(df.assign(r=np.where(df.index == 3, 1.5, df["r"])))
    with pytest.raises(ValueError, match=r"column 'N_once' holds -1.0 at row 0 .* >= 0 \(parameters\)"):
        tf.fit.predict(df.assign(N_once=np.where(df.index == 0, -1.0, df["N_once"])))
    # a NaN (a failed run's row in a runs table): NaN for that row, the others predicted
    got = tf.fit.predict(df.assign(D=np.where(df.index == 3, np.nan, df["D"])))
    assert np.isnan(got[3]) and np.isfinite(np.delete(got, 3)).all()
    plain = df[df["r"] == 1][["D", "N_once", "N_rec", "final_val_loss"]]
    ch = fit_table(plain, law="chinchilla", starts=8)  # N read as N_once + N_rec
    assert np.allclose(ch.fit.predict(plain[["D", "N_once", "N_rec"]]),
                       ch.fit.predict(plain.assign(N=plain["N_once"] + plain["N_rec"])[["D", "N"]]))  # fmt: skip


def test_a_fixed_phi_must_be_a_number_not_a_bool_or_text():
    """phi=True was read as phi = 1 and phi='0' as 0, while starts=True and B=True are refused."""
    from loopscale.fit.laws import make_law

    for bad in (True, False, "0", "0.5"):
        with pytest.raises(ValueError, match=re.escape(f"phi={bad!r} is not a number; fix phi to a number")):
            make_law("joint", phi=bad)
    assert make_law("joint", phi=np.float32(0.5)).fixed == {"phi": 0.5}
