"""Worth in unique layers: placing looped models on a ladder of plain models (fit/ladder.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from loopscale.fit.ladder import fit_ladder, ladder_table, phi_from_worth, worth_in_layers


def test_fit_ladder_inverts_exactly_on_a_log_linear_ladder():
    lad = fit_ladder([2, 3, 6, 10], [2.3 - 0.1 * math.log(L) for L in (2, 3, 6, 10)])
    assert lad.b == pytest.approx(-0.1) and lad.a == pytest.approx(2.3) and lad.r2 == pytest.approx(1.0)
    assert worth_in_layers(lad, 2.3 - 0.1 * math.log(4.5)) == pytest.approx(4.5)


def test_fit_ladder_refuses_flat_or_single_depth_ladders():
    with pytest.raises(ValueError, match="does not fall with depth"):
        fit_ladder([3, 6], [2.0, 2.01])
    with pytest.raises(ValueError, match="at least 2 distinct depths"):
        fit_ladder([3, 3], [2.0, 1.9])


def test_phi_from_worth_solves_the_joint_law():
    n_once, n_rec, r = 1000.0, 500.0, 4
    n_star = n_once + r**0.46 * n_rec
    assert phi_from_worth(n_star, n_once, n_rec, r) == pytest.approx(0.46)
    assert math.isnan(phi_from_worth(900.0, n_once, n_rec, r))  # worth less than its once-used part
    assert math.isnan(phi_from_worth(n_star, n_once, n_rec, 1))


def _table(noise: float, n_seeds: int, rng) -> tuple[pd.DataFrame, dict]:
    d, D = 16, 1e6
    nb = 12 * d * d + 2 * d

    def loss_at(L):  # ladder truth, linear in log L
        return 2.3 - 0.12 * math.log(L)

    rows, truth = [], {}
    for L in (2, 3, 4, 6, 10):
        for s in range(n_seeds):
            rows.append(dict(d_model=d, D=D, r=1, layers_unique=L, N_once=L * nb + 3 * d, N_rec=0,
                             loss=loss_at(L) + noise * rng.standard_normal(), seed=s))
    for r, L, worth in ((2, 6, 5.0), (4, 4, 3.5), (8, 3, 2.5)):
        n_once, n_rec = 2 * nb + 3 * d, (L - 2) * nb + 2 * d * d
        truth[r] = (worth, phi_from_worth(worth * nb + 3 * d, n_once, n_rec, r))
        for s in range(n_seeds):
            rows.append(dict(d_model=d, D=D, r=r, layers_unique=L, N_once=n_once, N_rec=n_rec,
                             loss=loss_at(worth) + noise * rng.standard_normal(), seed=s))
    return pd.DataFrame(rows), truth


def test_ladder_table_recovers_worth_and_phi_and_intervals_cover():
    rng = np.random.default_rng(0)
    exact, truth = _table(0.0, 2, rng)
    out = ladder_table(exact, n_boot=50).set_index("r")
    for r, (worth, phi) in truth.items():
        assert out.loc[r, "worth_layers"] == pytest.approx(worth, rel=1e-9)
        if math.isfinite(phi):
            assert out.loc[r, "phi_r"] == pytest.approx(phi, abs=1e-9)
    noisy, truth = _table(0.01, 4, rng)
    out = ladder_table(noisy, n_boot=400, seed=1).set_index("r")
    for r in truth:
        lo, hi = out.loc[r, "worth_lo"], out.loc[r, "worth_hi"]
        assert lo < hi and hi - lo < 3.0
        assert out.loc[r, "n_seeds"] == 4 and out.loc[r, "seed_sd"] > 0
    covered = sum(out.loc[r, "worth_lo"] <= w <= out.loc[r, "worth_hi"] for r, (w, _) in truth.items())
    assert covered >= 2  # 95 % intervals: all three miss together essentially never


def test_draws_worth_less_than_the_once_used_parameters_stay_in_the_phi_interval():
    """A looped model worth about its 2 once-used layers: in about half the draws N* <= N_once (phi_r = -inf).
    Those draws were dropped from the quantiles, so the interval described only the other half and looked bounded
    ([-3.2, -0.26] with 57 % of the draws dropped). They now count as -inf: the lower end is -inf, said by a flag
    that survives JSON, and the worth's interval, reaching below the shallowest rung, is marked extrapolated."""
    from loopscale.fit.ladder import _quantiles

    rng = np.random.default_rng(3)
    d, nb = 16, 12 * 16 * 16 + 2 * 16
    rows = [dict(d_model=d, D=1e6, r=1, layers_unique=L, N_once=L * nb + 3 * d, N_rec=0, seed=s,
                 loss=2.3 - 0.12 * math.log(L) + 0.004 * rng.standard_normal()) for L in (2, 3, 4, 6) for s in range(4)]
    rows += [dict(d_model=d, D=1e6, r=8, layers_unique=3, N_once=2 * nb + 3 * d, N_rec=nb, seed=s,
                  loss=2.3 - 0.12 * math.log(2.02) + 0.01 * rng.standard_normal()) for s in range(4)]  # fmt: skip
    w = ladder_table(pd.DataFrame(rows), n_boot=400, seed=0).iloc[0]
    assert 0.2 < w["phi_defined_frac"] < 0.9  # a share of the draws below N_once
    assert w["phi_lo"] == -np.inf and w["phi_lo_minus_inf"] and not w["phi_hi_minus_inf"]
    assert w["worth_outside_ladder"] and w["worth_lo"] < 2 <= w["worth_hi"]
    assert _quantiles(np.array([-np.inf, -np.inf, 0.1, 0.2]), 0.025) == (-np.inf, pytest.approx(0.1925))
    assert _quantiles(np.array([0.0, 1.0]), 0.25) == (0.25, 0.75)
    exact, _ = _table(0.0, 2, np.random.default_rng(0))  # worths 5, 3.5, 2.5 inside rungs 2-10: no marks
    out = ladder_table(exact, n_boot=50)
    assert not out["worth_outside_ladder"].any() and not out["phi_lo_minus_inf"].any()


def test_on_losses_from_the_joint_law_the_power_law_ladder_reads_the_exact_worth():
    """Losses made from the joint law (E 1.8, A 40, alpha 0.35, phi 0.5, no noise) at the cpu preset's shapes: the
    line in log L read r = 4 and r = 8 as worth 6.22 and 5.09 layers against the law's exact 6.0 and 4.83 (phi_r
    0.54, not 0.5), with intervals that exclude the truth; the power law through the same rungs reads them exactly,
    and the line's misfit is reported. On a ladder that is exactly a line in log L the two agree closely."""
    from loopscale.fit.ladder import fit_power_ladder

    d, nb = 16, 12 * 16 * 16 + 2 * 16
    law = lambda n: 1.8 + 40.0 * n**-0.35  # noqa: E731
    rows = [dict(d_model=d, D=1e6, r=1, layers_unique=L, N_once=0, N_rec=L * nb + 3 * d, seed=s,
                 loss=law(L * nb + 3 * d) + 1e-4 * (s - 1.5)) for L in (2, 3, 4, 6, 10) for s in range(4)]
    exact = {}
    for r, blk in ((2, 4), (4, 2), (8, 1)):
        n_once, n_rec = 2 * nb + 3 * d, blk * nb
        n_eff = n_once + r**0.5 * n_rec
        exact[r] = (n_eff - 3 * d) / nb
        rows += [dict(d_model=d, D=1e6, r=r, layers_unique=2 + blk, N_once=n_once, N_rec=n_rec, seed=s,
                      loss=law(n_eff) + 1e-4 * (s - 1.5)) for s in range(4)]  # fmt: skip
    out = ladder_table(pd.DataFrame(rows), n_boot=100).set_index("r")
    for r, w in exact.items():
        assert out.loc[r, "worth_power"] == pytest.approx(w, rel=1e-3)
    assert out.loc[4, "worth_layers"] == pytest.approx(6.22, abs=0.01) and out.loc[8, "worth_layers"] > 5.05
    assert out.loc[8, "worth_lo"] > exact[8]  # the line's interval (seed noise) misses the truth
    assert out["ladder_misfit_se"].iloc[0] > 10  # and says its line misses the rungs
    e, k, c = fit_power_ladder([2.0, 4.0, 8.0, 16.0], [1.8 + 3 * n**-0.3 for n in (2.0, 4.0, 8.0, 16.0)])
    assert (e, k, c) == (pytest.approx(1.8, abs=1e-4), pytest.approx(3.0, rel=1e-3), pytest.approx(0.3, rel=1e-3))
    assert fit_power_ladder([2.0, 4.0], [2.0, 1.9]) is None  # fewer than 3 rungs
    line = ladder_table(_table(0.0, 2, np.random.default_rng(0))[0], n_boot=20)
    assert np.allclose(line["worth_power"], line["worth_layers"], rtol=0.05)


def test_ladder_table_needs_two_depths_per_cell():
    rng = np.random.default_rng(0)
    df, _ = _table(0.0, 1, rng)
    with pytest.raises(ValueError, match="ladder depth"):
        ladder_table(df[(df.r > 1) | (df.layers_unique == 3)], n_boot=10)


def test_ladder_and_identification_figures_are_written(tmp_path):
    from loopscale.fit.identify_plots import plot_ladder, plot_per_r, plot_phi_profile

    rng = np.random.default_rng(3)
    runs, _ = _table(0.01, 3, rng)
    worth = ladder_table(runs, n_boot=50)
    p1 = plot_ladder(runs, worth, tmp_path / "ladder.png")
    prof = pd.DataFrame({"phi": [-1.0, 0.0, 0.5, 1.0, 2.0], "rel_rise": [0.3, 0.05, 0.0, 0.04, 0.4]})
    p2 = plot_phi_profile(prof, 0.5, (0.3, 0.7), 48, tmp_path / "profile.png")
    per_r = pd.DataFrame({"r": [2, 4, 8], "phi": [0.4, 0.5, 0.45], "lo": [0.2, 0.3, 0.3], "hi": [0.6, 0.7, 0.6]})
    p3 = plot_per_r(per_r, 0.46, (0.4, 0.52), tmp_path / "per_r.png")
    for p in (p1, p2, p3):
        assert p.exists() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_the_per_r_figure_draws_an_interval_that_lies_beside_its_point(tmp_path):
    """A percentile bootstrap interval need not contain its point estimate: phi_8 = 0.186 with [0.206, 3.46] made
    matplotlib refuse the error bars ('yerr' must not contain negative values), which ended `loopscale run` in its
    fit stage with no report. Each interval is drawn from its own ends, and a row without one (NaN) leaves the
    others' drawn."""
    import matplotlib

    from loopscale.fit import identify_plots

    matplotlib.use("Agg")
    per_r = pd.DataFrame({"r": [2, 4, 8], "phi": [-1.109, 0.480, 0.186], "lo": [-2.893, -2.498, 0.2065],
                          "hi": [0.1, 1.2, 3.46]})  # fmt: skip
    drawn = []
    real = identify_plots._intervals
    identify_plots._intervals = lambda ax, x, lo, hi, c: (drawn.append((lo.copy(), hi.copy())), real(ax, x, lo, hi, c))
    try:
        p = identify_plots.plot_per_r(per_r, 0.3, (0.1, 0.5), tmp_path / "per_r.png")
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        nan_row = per_r.assign(lo=[np.nan, -2.498, 0.2065], hi=[np.nan, 1.2, 3.46])
        identify_plots.plot_per_r(nan_row, 0.3, None, tmp_path / "per_r2.png")
    finally:
        identify_plots._intervals = real
    np.testing.assert_allclose(drawn[0][0], per_r["lo"])  # phi's panel: the interval's own ends
    np.testing.assert_allclose(drawn[1][1], np.array([2, 4, 8.0]) ** per_r["hi"].to_numpy())  # r^phi's panel
    fig = identify_plots._plt().figure()
    ax = fig.add_subplot()
    identify_plots._intervals(ax, np.array([2.0, 4.0, 8.0]), nan_row["lo"].to_numpy(), nan_row["hi"].to_numpy(), "C0")
    (bars,) = [c for c in ax.collections if len(c.get_segments())]
    np.testing.assert_allclose([s[:, 1] for s in bars.get_segments()], [[-2.498, 1.2], [0.2065, 3.46]])


def test_the_ladder_figure_draws_the_rungs_and_each_looped_model_at_its_worth(tmp_path, monkeypatch):
    """The figure's points, not only its file: the r = 1 rungs at their seed means and each looped model at its
    worth in layers, on the ladder's line, with its interval as the horizontal bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from loopscale.fit.identify_plots import plot_ladder
    from loopscale.fit.ladder import fit_ladder

    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    rng = np.random.default_rng(3)
    runs, _ = _table(0.01, 3, rng)
    worth = ladder_table(runs, n_boot=50)
    plot_ladder(runs, worth, tmp_path / "ladder.png")
    ax = figs[0].axes[0]
    rungs, *looped = ax.containers
    lad = runs[runs["r"] == 1].groupby("layers_unique")["loss"].mean()
    np.testing.assert_allclose(np.asarray(rungs.lines[0].get_xdata(), float), lad.index.to_numpy(float))
    np.testing.assert_allclose(np.asarray(rungs.lines[0].get_ydata(), float), lad.to_numpy(), rtol=1e-12)
    line = fit_ladder(lad.index.to_numpy(float), lad.to_numpy())
    assert len(looped) == len(worth) == 3
    for cont, row in zip(looped, worth.itertuples(), strict=True):
        (x,), (y,) = np.ravel(cont.lines[0].get_xdata()), np.ravel(cont.lines[0].get_ydata())
        assert x == pytest.approx(row.worth_layers) and y == pytest.approx(float(line.loss(row.worth_layers)))
        bar = cont.lines[2][0].get_segments()[0]  # the horizontal interval: (lo, y) to (hi, y)
        assert bar[:, 0] == pytest.approx([row.worth_lo, row.worth_hi])
