"""Design prediction: simulated refits of phi, seed noise and wall time (fit/design.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale.fit.design import flop_rate, seed_noise, simulate_phi, wall_time_s

TRUTH = dict(E=1.5, A=20.0, alpha=0.3, B=50.0, beta=0.35, phi=0.46)


def _design(seeds: int, widths=(16, 32, 48, 64), tokens=(5e5, 1e6, 4e6)) -> pd.DataFrame:
    rows = []
    for d in widths:
        nb = 12 * d * d + 2 * d
        for D in tokens:
            for r in (1, 2, 4, 8):
                n_once, n_rec = (10 * nb + 3 * d, 0.0) if r == 1 else (2 * nb + 3 * d, (8 // r) * nb + 2 * d * d)
                for s in range(seeds):
                    rows.append(dict(d_model=d, r=r, N_once=n_once, N_rec=n_rec, D=D, seed=s,
                                     C=6 * (n_once + r * n_rec) * D))
    return pd.DataFrame(rows)


def test_simulated_precision_scales_with_noise_and_seeds():
    lo = simulate_phi(_design(1), TRUTH, 0.005, n_sim=12, starts=12, seed=0)
    hi = simulate_phi(_design(1), TRUTH, 0.02, n_sim=12, starts=12, seed=0)
    more = simulate_phi(_design(4), TRUTH, 0.02, n_sim=12, starts=12, seed=0)
    assert lo.n_ok == 12 and lo.n_runs == 48 and more.n_runs == 192
    assert lo.phi_half_width < hi.phi_half_width  # 4x the noise -> a wider interval
    assert more.phi_half_width < hi.phi_half_width  # 4 seeds per cell -> narrower
    assert abs(lo.phi_bias) < 0.1 and lo.phi_half_width < 0.3
    assert set(lo.r_phi_half_width) == {2, 4, 8}
    # its cells and the half-width's Monte-Carlo SE are filled in (0 and NaN went into design_prediction.json)
    assert lo.n_cells == more.n_cells == 48 and len(lo.phi_draws) == 12
    assert 0 < lo.phi_half_width_se < lo.phi_half_width


def test_seed_noise_recovers_a_known_spread():
    rng = np.random.default_rng(0)
    d = _design(6)
    d["loss"] = 2.0 * np.exp(0.015 * rng.standard_normal(len(d)))
    sigma, cells = seed_noise(d)
    assert cells == 48 and sigma == pytest.approx(0.015, rel=0.12)
    # exactly the pooled within-cell SD of log loss (ddof 1 per cell), computed here another way
    logl = np.log(d["loss"])
    var = logl.groupby([d["d_model"], d["r"], d["D"]]).var(ddof=1)
    assert sigma == pytest.approx(float(np.sqrt(var.mean())), rel=1e-12)  # equal cell sizes: the mean of variances
    assert np.isnan(seed_noise(_design(1).assign(loss=2.0))[0])


def test_wall_time_packs_runs_onto_slots():
    d = pd.DataFrame({"C": [100.0, 100.0, 100.0, 100.0]})
    assert wall_time_s(d, rate=10.0, slots=2, overhead_s=0) == pytest.approx(20.0)
    assert wall_time_s(d, rate=10.0, slots=1, overhead_s=1) == pytest.approx(44.0)
    runs = pd.DataFrame({"C": [1e12, 2e12], "wall_s": [10.0, 20.0], "status": ["ok", "ok"]})
    assert flop_rate(runs) == pytest.approx(1e11)
    with pytest.raises(ValueError, match="slots"):
        wall_time_s(d, rate=10.0, slots=0)


def test_simulated_draws_are_refitted_in_one_batch_with_the_values_of_one_fit_each():
    """`loopscale design` refits every simulated draw of a candidate in one batch: each draw's fit equals fit_data
    on that draw alone (parameters, objective, starts reaching the best), with its own seed."""
    from loopscale.fit.fitter import fit_data, fit_many
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    law = make_law("joint")
    design = _design(1)
    mean = law.predict(TRUTH, {c: design[c].to_numpy(dtype=float) for c in ("N_once", "N_rec", "r", "D")})
    rng = np.random.default_rng(7)
    datas = [prepare(design.assign(loss=mean * np.exp(0.01 * rng.standard_normal(mean.shape))), law) for _ in range(4)]
    seeds = [11, 12, 13, 14]
    warm = law.from_public(TRUTH)
    many = fit_many(law, datas, seeds, starts=15, grid=False, warm=warm, n_polish=1)
    for data, seed, got in zip(datas, seeds, many, strict=True):
        one = fit_data(law, data, starts=15, seed=seed, grid=False, warm=warm, n_polish=1)
        assert got.params == one.params and got.objective == one.objective and got.r2 == one.r2
        assert got.n_starts_at_best == one.n_starts_at_best
    assert len({f.params["phi"] for f in many}) == 4  # each draw its own fit, not the first one four times
    with pytest.raises(ValueError, match="one seed per data set"):
        fit_many(law, datas, seeds[:3], starts=15)
    other = prepare(_design(1, tokens=(5e5, 1e6, 8e6)).assign(loss=mean), law)
    with pytest.raises(ValueError, match="differ only in their losses"):
        fit_many(law, [datas[0], other], [1, 2], starts=15)


def test_common_normals_share_the_seeds_designs_have_in_common():
    """Candidates that differ in seeds per cell get the same deviates for the seeds they share (common random
    numbers), and a cell's deviates do not depend on which other cells the design holds."""
    from loopscale.fit.design import common_normals

    few, many = _design(2), _design(4)
    a, b = common_normals(few, 5, seed=3), common_normals(many, 5, seed=3)
    key = ["d_model", "r", "D", "seed"]
    ia = few.set_index(key).index
    ib = many.reset_index(drop=True).set_index(key).index
    assert a.shape == (5, len(few))
    assert np.array_equal(a, b[:, ib.get_indexer(ia)])
    sub = many[many["d_model"] == 32].reset_index(drop=True)
    c = common_normals(sub, 5, seed=3)
    assert np.array_equal(c, b[:, ib.get_indexer(sub.set_index(key).index)])
    assert not np.array_equal(a, common_normals(few, 5, seed=4))
    assert abs(b.mean()) < 0.05 and b.std() == pytest.approx(1.0, abs=0.05)


def test_half_width_monte_carlo_error_matches_its_spread():
    """The bootstrap standard error of a half-width from 40 draws is close to the half-width's actual spread over
    independent sets of 40 draws."""
    from loopscale.fit.design import _half_width, half_width_se

    rng = np.random.default_rng(0)
    sets = rng.standard_normal((400, 40))
    actual = np.std([_half_width(x, 0.95) for x in sets])
    se = np.median([half_width_se(x, seed=i) for i, x in enumerate(sets[:40])])
    assert se == pytest.approx(actual, rel=0.35) and 0.1 < actual < 0.3


def _ladder_design(seeds: int) -> pd.DataFrame:
    """A design of a ladder (plain 2, 4 and 10 layers) and two looped models (r = 2 and 4) at width 32 and two D,
    ``seeds`` runs per cell, each with a seed SD of 0.01 nats/token."""
    rows = []
    d = 32
    nb = 12 * d * d
    for D in (1e6, 4e6):
        for r, layers in ((1, 2), (1, 4), (1, 10), (2, 6), (4, 4)):
            n_once, n_rec = (layers * nb, 0.0) if r == 1 else (2 * nb, (layers - 2) * nb)
            for s in range(seeds):
                rows.append(dict(d_model=d, r=r, layers_unique=layers, N_once=n_once, N_rec=n_rec, D=D, seed=s,
                                 noise_sd=0.01))  # fmt: skip
    return pd.DataFrame(rows)


def test_a_worth_whose_simulated_interval_leaves_the_ladder_is_not_predicted():
    """The truth's ladder passed the two-standard-error test (8 seeds shrink a rung's error) while some simulated
    ladders stayed nearly flat: `design` printed ±584 and ±2.8e72 layers beside a warning that the worth is not
    predicted (for the 4-seed candidate only). A looped cell whose draws give no bounded interval (its ladder flat in
    more than 2.5 % of the draws, or a half-width wider than the ladder spans) now gets none, and a note naming it."""
    from loopscale.fit.design import simulate_design

    design = _ladder_design(8)
    keys = {"2/32/1e+06", "4/32/1e+06", "2/32/4e+06", "4/32/4e+06"}

    some = simulate_design(design, {**TRUTH, "A": TRUTH["A"] * 0.05}, n_sim=12, starts=1, seed=0)
    # at D = 1e6, r = 2 a half-width of 22 layers on a ladder of 2 to 10: not predicted; the other cells are
    assert set(some.worth_true) == keys
    assert {k for k, v in some.worth_half_width.items() if np.isnan(v)} == {"2/32/1e+06"}
    assert np.isnan(some.worth_half_width_se["2/32/1e+06"])
    assert some.worth_note.startswith("the worth in unique layers is not predicted where its interval leaves the "
                                      "ladder (2/32/1e+06 (r/d_model/D): its half-width (21.9 layers) is wider than "
                                      "the ladder's span (2 to 10 layers)): ")  # fmt: skip
    assert all(0 < some.worth_half_width[k] < 8 for k in keys - {"2/32/1e+06"})
    # draws whose ladder did not fall with depth (no worth) are counted, not dropped: more than 2.5 % of them
    # leave the interval unbounded, whatever the others' spread
    from loopscale.fit.design import _unbounded_worth

    fitted = np.ones(40, dtype=bool)
    one, two = np.full(40, 5.0), np.full(40, 5.0)
    one[0], two[:2] = np.nan, np.nan
    got = _unbounded_worth({2: one, 4: two}, {2: 0.0, 4: 0.0}, fitted, design, 0.95)
    assert got == {4: "its ladder did not fall with depth in 2 of 40 draws"}


def test_a_truth_whose_ladder_is_flat_predicts_phi_and_says_why_there_is_no_worth():
    """A pilot whose fitted law is flat in depth (A = 0 here) gives a ladder whose loss does not fall with depth:
    the design ended with the ladder's own refusal, quoting a slope of 5.9e-16 as if measured (the run's report
    said 0.047 for the same runs). It now predicts phi and says why the worth is not predicted."""
    from loopscale.fit.design import simulate_design

    rows = _ladder_design(3)
    flat = {**TRUTH, "A": 0.0}
    pred = simulate_design(rows, flat, n_sim=3, starts=3, seed=0)
    assert pred.worth_true == {} and pred.worth_half_width == {}
    assert pred.worth_note.startswith("the worth in unique layers is not predicted: the law taken as truth")
    assert "does not fall with depth (slope " in pred.worth_note and pred.n_ok >= 1
    steep = simulate_design(rows, TRUTH, n_sim=3, starts=3, seed=0)  # a law where depth helps
    assert steep.worth_note is None and len(steep.worth_true) == 4  # r = 2 and 4 at each D


def test_worth_warnings_name_the_candidates_they_are_of():
    """A note on the truth's ladder is said once; a candidate whose own draws leave the ladder gets its own note,
    named with its seeds (the 8-seed candidate's ±2.8e72 layers came beside the 4-seed candidate's note only)."""
    from loopscale.fit.design import LEAVES_LADDER
    from loopscale.sweep.design_cmd import worth_warnings

    flat, flat8 = "the worth ... is not predicted: less than twice (0.0097)", "... less than twice (0.0069)"
    leaves = f"the worth in unique layers is not predicted {LEAVES_LADDER} (r = 4: ...)"
    cands = [{"seeds": "4*", "worth_note": flat}, {"seeds": "8", "worth_note": leaves},
             {"seeds": "16", "worth_note": None}, {"seeds": "12", "worth_note": flat8},
             {"seeds": "24", "worth_note": leaves}]  # fmt: skip
    assert worth_warnings(cands) == [f"seeds 4*, 12: {flat}", f"seeds 8, 24: {leaves}"]
    assert worth_warnings(cands[:1] + cands[2:4]) == [flat]  # one kind: said once, with no names
    assert worth_warnings([{"seeds": "16", "worth_note": None}]) == []
