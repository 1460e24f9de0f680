"""The identification rule for phi: one synthetic table per 'not identified' cause, and one that is identified."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from loopscale.fit.bootstrapping import bootstrap
from loopscale.fit.fitter import fit_law
from loopscale.fit.identify import Cause, identify, per_r_fittable, per_r_phi, phi_profile, rule_inputs

TRUTH = dict(E=1.5, A=20.0, alpha=0.3, B=50.0, beta=0.35)
GRID = np.array([-2.5, -1.5, -0.5, 0.0, 0.5, 1.0, 1.5, 2.5])


def _table(phi_by_r: dict[int, float], *, rec_frac: float = 1.0, noise: float = 0.002, seed: int = 0,
           widths=(16, 32, 48, 64), tokens=(5e5, 1e6, 4e6), penalty: dict[int, float] | None = None):
    """Iso-depth 1 + 8/r x r + 1 grid; loss from the joint law with a per-r phi (and an optional per-r offset)."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in widths:
        nb = 12 * d * d + 2 * d
        for D in tokens:
            for r in (1, 2, 4, 8):
                if r == 1:
                    n_once, n_rec = 10 * nb + 3 * d, 0.0
                else:
                    n_once, n_rec = 2 * nb + 3 * d, rec_frac * ((8 // r) * nb + 2 * d * d)
                neff = n_once + (r ** phi_by_r.get(r, 0.0)) * n_rec
                loss = TRUTH["E"] + TRUTH["A"] * neff ** -TRUTH["alpha"] + TRUTH["B"] * D ** -TRUTH["beta"]
                loss += (penalty or {}).get(r, 0.0)
                loss *= np.exp(noise * rng.standard_normal())
                rows.append(dict(d_model=d, D=D, r=r, N_once=n_once, N_rec=n_rec, loss=loss, status="ok"))
    return pd.DataFrame(rows)


def _rule(df, *, per_r_B=0, full=True):
    point = fit_law(df, law="joint", starts=30)
    bs = bootstrap(df, law="joint", B=12, workers=1, starts=15, point=point) if full else None
    prof = phi_profile(df, GRID, starts=15) if full else None
    pr = per_r_phi(df, starts=20, B=per_r_B) if per_r_B else None
    return identify(point, bs.ci.get("phi") if bs else None, prof, pr)


def test_identified_when_the_law_holds():
    out = _rule(_table({2: 0.46, 4: 0.46, 8: 0.46}), per_r_B=8)
    assert out.identified, out.reasons
    assert out.causes == () and out.headline.startswith("phi = ")
    assert out.ci[0] <= 0.46 <= out.ci[1] and abs(out.phi - 0.46) < 0.1
    assert "not checked" not in out.headline and out.details["checks_skipped"] == []


def test_identified_headline_names_the_checks_it_could_not_make():
    """The law holds but phi per r came without intervals: phi is accepted on the other checks and the headline
    says which one was not made (it read like a full verdict)."""
    df = _table({2: 0.46, 4: 0.46, 8: 0.46})
    point = fit_law(df, law="joint", starts=30)
    out = identify(point, None, phi_profile(df, GRID, starts=15), per_r_phi(df, starts=20, B=0))
    assert out.identified, out.reasons
    assert out.headline.endswith("not checked: per_r (phi per r came without intervals)")
    two = df[df["r"].isin([1, 2])].reset_index(drop=True)  # one looped r: nothing to compare phi_r with
    out = identify(fit_law(two, law="joint", starts=30), None, None, None)
    assert out.identified and out.headline.endswith(
        "not checked: flat_profile (no profile), per_r (needs r = 1 runs and at least two r > 1, each with at least 6 "
        "runs together with the r = 1 runs)"
    )


def test_a_bootstrap_that_gave_no_interval_does_not_identify_phi():
    """`fit --bootstrap 20 --identify` on one D with one seed per cell: the bootstrap gave no interval, and the
    verdict was `identified: true` with "phi = 0.500 (no interval: the bootstrap gave none)", where a point without
    an interval is not a result. It is now not identified, saying why the bootstrap gave none; without a bootstrap
    asked for, the headline still just says there is no interval."""
    df = _table({2: 0.46, 4: 0.46, 8: 0.46})
    point = fit_law(df, law="joint", starts=30)
    prof = phi_profile(df, GRID, starts=15)
    why = "every run has the same D = 1e+10: ... --block-by r"
    out = identify(point, None, prof, None, no_interval=why)
    assert not out.identified and out.causes == (Cause.NO_INTERVAL,)
    assert out.headline == f"phi not identified by this grid: no interval: the bootstrap gave none ({why})"
    plain = identify(point, None, prof, None)
    assert plain.identified and plain.headline.startswith(f"phi = {point.params['phi']:.3f} (no interval")
    assert identify(point, (0.3, 0.6), prof, None, no_interval=None).identified
    # an interval wider than the precision target: identified, and said to be imprecise against a target the user
    # did not set ("the 0.15 asked" read as if they had)
    wide = identify(point, (0.1, 0.7), prof, None)
    assert wide.identified and not wide.precise
    assert "(half-width 0.30 > 0.15, the precision target: identified but imprecise)" in wide.headline, wide.headline
    assert identify(point, (0.1, 0.7), prof, None, target_half_width=0.3).precise


def test_not_identified_on_bound():
    # looped models far worse than any phi can explain: phi runs to the box edge (the cpu preset's failure)
    out = _rule(_table({2: 0.0, 4: 0.0, 8: 0.0}, penalty={2: 0.5, 4: 0.5, 8: 0.5}))
    assert not out.identified and Cause.ON_BOUND in out.causes
    assert "not identified" in out.headline and "edge" in out.headline
    assert out.phi < -2.0


def test_not_identified_flat_profile():
    # the shared block holds 0.01 % of the looped parameters: r^phi N_rec barely changes N_eff, whatever phi is
    out = _rule(_table({2: 0.46, 4: 0.46, 8: 0.46}, rec_frac=1e-4))
    assert min(out.details["profile_rise_at_pm1"]) < out.details["profile_threshold"]
    assert not out.identified and Cause.FLAT_PROFILE in out.causes


def test_not_identified_per_r_disagree():
    out = _rule(_table({2: 1.0, 4: 0.0, 8: -0.6}), per_r_B=8, full=False)
    assert not out.identified and Cause.PER_R_DISAGREE in out.causes
    assert "r=2" in out.reasons[Cause.PER_R_DISAGREE.value]


def test_a_per_r_phi_without_an_interval_says_why_in_the_checks_words():
    """One width, three D, one seed: r = 1's runs with one looped r's are 6, the law's 6 parameters, so every
    resample that leaves a run out is redrawn and no interval exists. `loopscale run` printed the bootstrap's
    UserWarning naming `--block-by iid` (a flag run lacks) and the report showed "–" with no reason; the row now
    keeps the reason, in the check's words, and nothing reaches the console."""
    import warnings

    df = _table({2: 0.46, 4: 0.46, 8: 0.46}, widths=(32,), tokens=(5e5, 1e6, 4e6))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        per_r = per_r_phi(df, starts=20, B=4, seed=0)
    assert not [w for w in seen if "no interval" in str(w.message)]
    assert per_r["lo"].isna().all() and per_r["no_interval"].map(lambda x: isinstance(x, str)).all()
    why = per_r["no_interval"].iloc[0]
    assert why.startswith("runs resampled one by one: ") and "--block-by" not in why
    point = fit_law(df, law="joint", starts=30)
    out = identify(point, (0.3, 0.6), None, per_r)
    assert "per_r (phi per r came without intervals)" in out.details["checks_skipped"]
    assert out.details["per_r_no_interval"]["2"] == why and len(out.details["per_r"]) == 3


def test_a_per_r_phi_the_fit_does_not_pin_down_gets_no_interval():
    """Losses that do not depend on N (a grid too short for depth to help): each per-r fit puts alpha on the box
    edge, phi_r moves no fitted loss, and its refits, warm-started at the point, kept phi_r there: zero-width
    intervals ([-2.12, -2.12]) that the headline quoted as "no common value". They now have no interval, and say
    why."""
    df = _table({2: 0.46, 4: 0.46, 8: 0.46})
    rng = np.random.default_rng(2)
    df = df.assign(loss=2.0 + TRUTH["B"] * df["D"] ** -TRUTH["beta"] + 0.002 * rng.standard_normal(len(df)))
    from loopscale.fit.bootstrapping import progress_listener

    said = []  # the bootstraps' results, as the console's summary line counts them
    with progress_listener(lambda done, total: None, lambda planned, ok, phase=None: said.append((planned, ok, phase))):
        per_r = per_r_phi(df, starts=20, B=4, seed=0)
    flat = per_r["no_interval"].fillna("").str.contains("the N-term it acts through is flat in this fit")
    assert flat.any() and per_r.loc[flat, "lo"].isna().all()
    # an r whose phi_r is flat draws no resample: not counted as 4 failed refits ("80 failed" in a run's console)
    assert said == [(4 * int((~flat).sum()), 4 * int((~flat).sum()), "per_r")] or (said == [] and flat.all())
    assert ((per_r["hi"] - per_r["lo"])[~flat] > 0.5).all()  # the others: wide, not falsely precise
    ok = per_r_phi(_table({2: 0.46, 4: 0.46, 8: 0.46}), starts=20, B=4, seed=0)  # a law with an N-term
    assert ok["no_interval"].isna().all() and (ok["hi"] > ok["lo"]).all()


def test_per_r_check_skips_r_with_fewer_runs_than_the_law_has_parameters():
    """One width, one D, two seeds per cell: 8 runs fit the joint law, but r = 1's runs with one looped r's are 4,
    fewer than its 6 parameters. The per-r check is skipped and said so (`loopscale run` and `fit --identify` died
    after training with the fitter's 'fewer than the 6 parameters' error)."""
    one = _table({2: 0.46, 4: 0.46, 8: 0.46}, widths=(32,), tokens=(1e6,))
    rng = np.random.default_rng(1)
    df = pd.concat([one.assign(seed=k, loss=one["loss"] * np.exp(0.002 * rng.standard_normal(len(one))))
                    for k in (0, 1)], ignore_index=True)  # fmt: skip
    assert per_r_fittable(df) == []
    with pytest.raises(ValueError, match=r"per-r phi at r = \[2, 4, 8\].*fewer than the joint law's 6 parameters"):
        per_r_phi(df, starts=10)
    profile, per_r = rule_inputs(df, starts=10, B=4)
    assert per_r is None and len(profile)
    out = identify(fit_law(df, law="joint", starts=20), None, profile, per_r)
    assert any(x.startswith("per_r (needs r = 1 runs and at least two r > 1, each with at least 6 runs")
               for x in out.details["checks_skipped"])
    # r = 1 with four seeds: every looped r has 6 runs with them, and the check is made
    df2 = pd.concat([df, df[df["r"] == 1].assign(seed=lambda t: t["seed"] + 2)], ignore_index=True)
    assert per_r_fittable(df2) == [2, 4, 8]


def test_fixed_D_design_does_not_flag_the_D_term():
    df = _table({2: 0.46, 4: 0.46, 8: 0.46}, tokens=(2e6,), widths=(16, 24, 32, 40, 48, 64, 80, 96))
    point = fit_law(df, law="joint", starts=60)
    out = identify(point, None, None, None)
    assert out.fixed_D and out.E_D is not None
    assert Cause.ON_BOUND not in out.causes, out.reasons  # B, beta, E are a constant here, not 'unidentified'
    assert out.E_D == pytest.approx(TRUTH["E"] + TRUTH["B"] * 2e6 ** -TRUTH["beta"], rel=0.05)


def test_identify_refuses_a_restricted_fit():
    df = _table({2: 0.46, 4: 0.46, 8: 0.46}, widths=(16, 32), tokens=(1e6, 2e6))
    with pytest.raises(ValueError, match="phi free"):
        identify(fit_law(df, law="joint", phi=0.0, starts=20), None, None, None)


def test_fixed_D_offset_at_the_floor_of_E_is_on_bound():
    """A fixed-D design whose loss keeps falling log-linearly in N drives E_D to the floor of E's box: the
    N-term's curvature is then not identified, and the rule says so."""
    df = _table({2: 0.46, 4: 0.46, 8: 0.46}, tokens=(2e6,), widths=(16, 24, 32, 40, 48, 64, 80, 96))
    n_eff = df["N_once"] + df["r"] ** 0.46 * df["N_rec"]
    df = df.assign(loss=3.0 - 0.12 * np.log(n_eff / n_eff.min()))  # no floor: E_D -> 0
    out = identify(fit_law(df, law="joint", starts=60), None, None, None)
    assert out.fixed_D and out.E_D < 0.06
    assert Cause.ON_BOUND in out.causes and "E_D" in out.reasons[Cause.ON_BOUND.value]


def test_law_with_phi_per_r_recovers_each_phi_where_one_phi_misfits():
    from loopscale.fit.laws import make_law

    df = _table({2: -0.9, 4: -0.4, 8: 0.3}, noise=0.0005)
    one = fit_law(df, law="joint", starts=30)
    per_r = fit_law(df, law="joint_per_r", starts=30)
    assert per_r.n_params == 8 and set(per_r.params) >= {"phi_2", "phi_4", "phi_8"}
    for r, phi in ((2, -0.9), (4, -0.4), (8, 0.3)):
        assert per_r.params[f"phi_{r}"] == pytest.approx(phi, abs=0.05)
    assert per_r.r2 > 0.999 > one.r2  # the same law with one phi cannot fit three different phi_r
    assert per_r.law_object().rs == (2, 4, 8)
    np.testing.assert_allclose(per_r.predict(df), df["loss"], rtol=2e-3)
    # with one common phi in the data, the per-r law finds it three times
    same = fit_law(_table({2: 0.46, 4: 0.46, 8: 0.46}, noise=0.0005), law="joint_per_r", starts=30)
    assert [round(same.params[f"phi_{r}"], 1) for r in (2, 4, 8)] == [0.5, 0.5, 0.5]
    for bad in (None, (), (1, 2), (2, 2)):
        with pytest.raises(ValueError, match="rs"):
            make_law("joint_per_r", rs=bad)
    with pytest.raises(ValueError, match="cannot be fixed"):
        make_law("joint_per_r", phi=0.5, rs=(2,))
    with pytest.raises(ValueError, match=r"one phi per looped r > 1; the table holds only r=\[1\]"):
        fit_law(df[df["r"] == 1], law="joint_per_r", starts=5)


def test_profile_and_per_r_as_ray_tasks_equal_the_serial_values():
    """Inside a running Ray session the profile's fits and the per-r fits run as Ray tasks: same values as serially
    (and a phi grid outside the box is refused before any fit)."""
    import ray

    df = _table({2: 0.46, 4: 0.46, 8: 0.46}, widths=(16, 32), tokens=(5e5, 2e6))
    prof = phi_profile(df, GRID, starts=10)
    pr = per_r_phi(df, starts=12, B=6)
    assert np.isfinite(pr[["lo", "hi"]].to_numpy()).all()
    assert pr["n_boot"].tolist() == [6, 6, 6]  # each r's refitted resamples, which the report's note reads
    with pytest.raises(ValueError, match="inside"):
        phi_profile(df, np.array([0.0, 3.5]), starts=10)
    with pytest.raises(ValueError, match="non-empty"):
        phi_profile(df, [], starts=10)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pd.testing.assert_frame_equal(phi_profile(df, GRID, starts=10), prof, check_exact=True)
        pd.testing.assert_frame_equal(per_r_phi(df, starts=12, B=6, workers=None), pr, check_exact=True)
    finally:
        ray.shutdown()


def test_law_per_r_starts_from_the_one_phi_optimum():
    """The per-r law nests the one-phi law: fitted with the one-phi optimum among its starts its objective is never
    above the one-phi fit's, even with too few random starts to find it alone (the report showed 'phi free per
    r' with a lower R^2 than one phi)."""
    from loopscale.fit import fitter
    from loopscale.fit.analysis import law_per_r

    df = _table({2: 0.5, 4: 0.45, 8: 0.4}, noise=0.01, seed=3)
    joint = fit_law(df, law="joint", starts=60)
    real = fitter.build_starts

    def poor_starts(law, obj, starts, rng, warm=None, grid=True):
        """Only the warm starts and one start far from the optimum: what random starts may give on a hard table."""
        lo, hi = law.bounds()
        far = (lo)[None, :]  # every parameter on its lower edge
        return far if warm is None else np.vstack([np.atleast_2d(warm), far])

    fitter.build_starts = poor_starts
    try:
        out = law_per_r(joint, starts=1, seed=0)
    finally:
        fitter.build_starts = real
    assert out["objective"] <= out["objective_one_phi"] * (1 + 1e-9), out
    assert out["r2"] >= out["r2_one_phi"] - 1e-3, out


def test_fixed_phi_fits_in_one_batch_equal_one_fit_each():
    """The profile fits every fixed phi in one batch: each phi's result is the one fit_law(phi=...) gives alone
    (same objective, parameters and R^2), and a profile point is that restricted fit's objective."""
    from loopscale.fit.fitter import Objective, fit_fixed_phis
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    df = _table({2: 0.3, 4: 0.5, 8: 0.6}, noise=0.01, seed=5)
    phis = [-1.0, 0.0, 0.37, 1.0, 2.5]
    many = fit_fixed_phis(prepare(df, make_law("joint", 0.0)), phis, starts=12, seed=3)
    for phi, got in zip(phis, many, strict=True):
        one = fit_law(df, law="joint", phi=phi, starts=12, seed=3)
        assert got.params == one.params and got.objective == one.objective and got.r2 == one.r2
        assert got.phi_fixed and got.params["phi"] == phi and got.starts == one.starts
    # different phi, different fits (a batch that ignored its rows' phi would give one answer five times)
    assert len({round(f.objective, 12) for f in many}) == len(phis)
    prof = phi_profile(df, np.array(phis[:3]), starts=12, seed=3)
    assert prof["objective"].tolist() == [f.objective for f in many[:3]]
    with pytest.raises(ValueError, match="starts"):
        fit_fixed_phis(prepare(df, make_law("joint", 0.0)), phis, starts=0)
    data = prepare(df, make_law("joint", 0.0))
    with pytest.raises(ValueError, match="u_sets needs a law without fitted extra parameters"):
        Objective(make_law("joint"), data.cols, u_sets=np.zeros((2, data.n)))


def test_per_r_tasks_announce_their_refits_before_they_run(monkeypatch):
    """On Ray the per-r fits run as tasks and report their refits to the driver's progress listeners: (0, n) before
    the tasks start, so the console's bootstrap display shows this phase with its clock running instead of the
    previous bootstrap's full bar, frozen, until every task is done; (n, n) after."""
    import loopscale.fit.bootstrapping as bs

    df = _table({2: 0.46, 4: 0.46, 8: 0.46}, widths=(16, 32), tokens=(5e5, 2e6))
    seen: list[tuple[int, int]] = []
    at_start: list[list] = []

    def fake_map(fn, shared, items, address=None):  # the tasks, serially; what the listeners had heard by then
        at_start.append(list(seen))
        return [fn(shared, it) for it in items]

    monkeypatch.setattr(bs, "ray_running", lambda address=None: True)
    monkeypatch.setattr(bs, "map_tasks", fake_map)
    with bs.progress_listener(lambda done, total: seen.append((done, total))):
        per_r_phi(df, starts=10, B=2, workers=None)
    assert at_start == [[(0, 6)]], at_start
    assert seen[-1] == (6, 6)


def test_analysis_fits_phi_per_r_with_the_runs_starts(tmp_path):
    """The analysis's 'phi free per r' fit is the fit `loopscale fit --law joint_per_r` gives with the same starts:
    with the profile's 30 starts it stopped short on this table (objective 1.3415e-05 against 1.3342e-05, each
    phi_r off by up to 0.17), and the report printed that fit. Also: a table without a ``budget`` column is a
    token-budget grid (it was read as a FLOP-budget grid and failed in the IsoFLOP step)."""
    from loopscale.fit.analysis import analyze

    rng = np.random.default_rng(73)
    rows = [dict(r=1, N_once=2e4, N_rec=1e4 * (k - 1), D=1e6) for k in (2, 3, 4, 5, 6)]
    rows += [dict(r=r, N_once=2e4, N_rec=1e4, D=1e6) for r in (2, 4, 8)]
    df = pd.DataFrame(rows)
    phis = {r: rng.uniform(-4, 0.5) for r in (2, 4, 8)}
    n_x = df["N_once"] + np.array([1.0 if r == 1 else r ** phis[r] for r in df["r"]]) * df["N_rec"]
    loss = 1.6 + rng.uniform(1, 20) * n_x ** -rng.uniform(0.1, 0.6) + 0.3 + rng.normal(0, 0.02, len(df))
    df = df.assign(final_val_loss=loss, status="ok", variant="baseline")
    ana = analyze(df, tmp_path / "fit", B=0, starts=500, seed=0, workers=1, plots=False)
    assert ana["budget_kind"] == "D"
    got = ana["variants"]["baseline"]["identification"]["law_per_r"]
    want = fit_law(df.rename(columns={"final_val_loss": "loss"}), law="joint_per_r", starts=500, seed=0)
    assert got["objective"] == pytest.approx(want.objective, rel=1e-9)
    for r in ("2", "4", "8"):
        assert got["phi"][r] == pytest.approx(want.params[f"phi_{r}"], abs=1e-4)


def test_a_flat_profile_names_the_phi_it_was_read_at():
    """The flat-profile reason names the phi at which the rise was read: phi_hat - 1 when the profile reaches it,
    else the profile's end, saying so (it named 'phi = phi_hat - 1' for a phi_hat of -2.8, whose phi_hat - 1 lies
    outside the search box)."""
    import dataclasses

    point = fit_law(_table({2: 0.46, 4: 0.46, 8: 0.46}, rec_frac=1e-4), law="joint", starts=30)
    prof = pd.DataFrame({"phi": GRID, "objective": point.objective * (1 + 1e-6 * (GRID + 3))})
    out = identify(dataclasses.replace(point, params={**point.params, "phi": -2.8}), None, prof, None)
    assert Cause.FLAT_PROFILE in out.causes
    why = out.reasons[Cause.FLAT_PROFILE.value]
    # phi_hat itself lies below the profile (-2.5 .. 2.5): its end -2.5 is above phi_hat, not at "phi_hat - 1"
    assert ("at phi = -2.50, the profile's end nearest phi_hat = -2.80, which lies outside the profile's range "
            "[-2.50, 2.50]") in why, why
    prof_wide = pd.DataFrame({"phi": GRID - 1.0, "objective": prof["objective"]})  # -3.5 .. 1.5
    out = identify(dataclasses.replace(point, params={**point.params, "phi": -2.8}), None, prof_wide, None)
    assert "at phi = -3.50, the profile's end (phi_hat - 1 = -3.80 lies outside it)" in out.reasons[
        Cause.FLAT_PROFILE.value]
    out = identify(dataclasses.replace(point, params={**point.params, "phi": -2.5}), None, prof, None)  # on the end
    assert "at phi = -2.50, the profile's end (phi_hat - 1 = -3.50 lies outside it)" in out.reasons[
        Cause.FLAT_PROFILE.value]
    out = identify(dataclasses.replace(point, params={**point.params, "phi": 0.3}), None, prof, None)
    assert "at phi = -0.70 (phi_hat - 1)" in out.reasons[Cause.FLAT_PROFILE.value]
    # phi_hat outside the profile's range: its nearest end lies above it, not at "phi_hat - 1" (a user's fit with
    # phi_hat = -3 and a profile from -1.5 read "at phi = -1.50, the profile's end (phi_hat - 1 = -4.00 ...)")
    lo = float(GRID.min())
    out = identify(dataclasses.replace(point, params={**point.params, "phi": lo - 1.5}), None, prof, None)
    assert (f"at phi = {lo:.2f}, the profile's end nearest phi_hat = {lo - 1.5:.2f}, which lies outside the profile's "
            f"range [{lo:.2f}, {float(GRID.max()):.2f}]") in out.reasons[Cause.FLAT_PROFILE.value]


def test_noise_free_losses_identify_phi():
    """Losses exactly on the law give phi_r intervals of zero width at the same phi, up to the fitter's last digits
    (0.459 [0.459, 0.459] three times, apart by 1e-14): they share a common value, and phi is identified (the rule
    said 'no common value')."""
    from loopscale.fit.identify import per_r_disagree
    from loopscale.fit.synthetic import PAPER_JOINT, paper_design_from_formulas, synth_joint

    df = synth_joint(paper_design_from_formulas(), noise=0.0)  # the paper's 116 runs, losses on its law (phi 0.459)
    pr = per_r_phi(df, starts=20, B=8)
    assert np.allclose(pr[["phi", "lo", "hi"]].to_numpy(), PAPER_JOINT["phi"], atol=1e-6)
    assert per_r_disagree(pr) is None
    # apart in the last digits (1e-14 here on 2026-12-03: what the rule refused), whatever the fitter's rounding
    tiny = pr.assign(lo=pr["phi"] + np.array([0.0, 0.0, 1e-14]), hi=pr["phi"])
    assert float(tiny["lo"].max()) > float(tiny["hi"].min()) and per_r_disagree(tiny) is None
    nudged = pr.assign(lo=pr["lo"] + np.array([0.0, 0.0, 2e-6]))  # ends apart by more than the tolerance: disagree
    assert per_r_disagree(nudged.assign(hi=pr["hi"] - np.array([2e-6, 0.0, 0.0]))).startswith("phi fitted per r has")
    out = identify(fit_law(df, law="joint", starts=30), (0.459, 0.459), phi_profile(df, GRID, starts=15), pr)
    assert Cause.PER_R_DISAGREE not in out.causes


def test_design_checks_phi_per_r_as_run_does():
    """`loopscale design` says it applies `loopscale run`'s per-r test to the pilot: it fits phi per r with the
    same resamples and starts (it used 20 resamples and 30 starts against run's 40 and 60, and withheld its
    recommendation for pilots that `loopscale fit --identify` accepted), so both give the same table."""
    from loopscale.fit.identify import rule_inputs
    from loopscale.sweep.design_cmd import pilot_phi_per_r

    df = pd.concat([_table({2: 0.5, 4: 0.5, 8: 0.5}, widths=(16, 32), tokens=(1e6,), noise=0.01, seed=s)
                    .assign(seed=s) for s in range(3)])  # fmt: skip
    df = df.assign(layers_unique=np.where(df["r"] == 1, 10, 2 + 8 // df["r"]))
    strata = ("d_model", "r", "layers_unique", "D")
    per_r_design, _ = pilot_phi_per_r(df, seed=0)
    _, per_r_run = rule_inputs(df, starts=500, B=200, seed=0, strata=strata)
    pd.testing.assert_frame_equal(per_r_design, per_r_run)


def test_a_flat_profile_reason_gives_digits_enough_to_tell_rise_and_threshold_apart():
    """'rises by only 6.2 % ... (one run's worth is 6.2 %)' read as equal numbers (0.0623 against 0.0625): the
    reason now prints as many digits as tell them apart."""
    df = _table({2: 0.46, 4: 0.46, 8: 0.46}, widths=(16, 32, 48, 64), tokens=(5e5, 1e6))  # 32 runs: 2/32 = 6.25 %
    point = fit_law(df, law="joint", starts=20)
    assert point.n == 32
    phi = float(point.params["phi"])
    grid = np.array([phi - 1.5, phi - 1.0, phi, phi + 1.0, phi + 1.5])
    rise = np.array([0.07, 0.0623, 0.0, 0.0623, 0.07])
    prof = pd.DataFrame({"phi": grid, "objective": point.objective * (1 + rise)})
    out = identify(point, None, prof, None)
    assert Cause.FLAT_PROFILE in out.causes
    assert "rises by only 6.23 % at phi = " in out.reasons["flat_profile"]
    assert out.reasons["flat_profile"].endswith("(one run's worth is 6.25 %)")


def test_with_two_D_the_d_term_is_not_checked_and_gives_no_frontier():
    """The smoke preset's two D: fits of one objective gave B = 1.3e7, beta = 2.16 and B = 3.7e4, beta = 1.37 (100
    vs 500 starts), and the report printed them and a frontier. With two D, as with one, E, B and beta are not
    checked against the box edge (the smaller offset E + B D^-beta is), the analysis computes no frontier, the fit
    CLI names the three as not identified, and a fit made under rules version 3 counts as today's only where the
    change does not apply (one D; three D)."""
    import dataclasses

    from loopscale.fit.analysis import FIT_RULES_VERSION, fit_rules_in_effect, frontier_unidentified
    from loopscale.fit.identify import d_term_unidentified
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law
    from loopscale.fit.table_fit import _joint_flat_terms

    two = _table({2: 0.46, 4: 0.46, 8: 0.46}, tokens=(1e6, 4e6))
    three = _table({2: 0.46, 4: 0.46, 8: 0.46})
    assert list(d_term_unidentified(two)) == [1e6, 4e6] and d_term_unidentified(three) is None
    for df, checked in ((two, False), (three, True)):
        point = fit_law(df, law="joint", starts=20)
        edge = dataclasses.replace(point, params={**point.params, "beta": 2.5})  # beta on its box edge
        out = identify(edge, None, None, None)
        assert ("beta" in out.reasons.get(Cause.ON_BOUND.value, "")) is checked
    out = identify(dataclasses.replace(point := fit_law(two, law="joint", starts=20),
                                       params={**point.params, "beta": 2.5}), None, None, None)  # fmt: skip
    p = point.params
    assert out.details["D_offsets"] == pytest.approx({"1e+06": p["E"] + p["B"] * 1e6 ** -2.5,
                                                      "4e+06": p["E"] + p["B"] * 4e6 ** -2.5})  # fmt: skip
    assert not out.fixed_D and out.E_D is None
    assert frontier_unidentified(two.assign(C=1.0)).startswith("two token budgets (D = 1e+06 and 4e+06 tokens)")
    assert frontier_unidentified(three.assign(C=1.0)) is None
    (flat,) = _joint_flat_terms(prepare(two, make_law("joint")))
    assert flat.startswith("the runs have two D (1e+06 and 4e+06): B D^-beta is pinned at those two only")
    assert _joint_flat_terms(prepare(three, make_law("joint"))) == []
    one_d = _table({2: 0.46, 4: 0.46, 8: 0.46}, tokens=(1e6,))
    assert fit_rules_in_effect(3, one_d) == FIT_RULES_VERSION == 5  # neither 4 (two D) nor 5 (variants) applies
    assert fit_rules_in_effect(3, three) == 5 and fit_rules_in_effect(3, two) == 3
    # version 5 (Δφ of seed replicates drawn paired) changes an analysis of two variants or more over one D
    # (over one D with seeds: two runs of one cell)
    seeds = pd.concat([one_d, one_d.assign(seed=1)]).fillna({"seed": 0})
    variants = pd.concat([seeds, seeds[seeds["r"] > 1].assign(variant="trunc_bptt")]).fillna({"variant": "baseline"})
    assert fit_rules_in_effect(4, variants) == 4 and fit_rules_in_effect(4, seeds.assign(variant="baseline")) == 5
    assert fit_rules_in_effect(4, pd.concat([three, three.assign(variant="x")]).fillna({"variant": "baseline"})) == 5
    # one seed per cell (bootstrapped in blocks, as before), or r = 1 runs labelled 'plain' beside one variant
    one_seed = pd.concat([one_d, one_d[one_d["r"] > 1].assign(variant="x")]).fillna({"variant": "baseline"})
    assert fit_rules_in_effect(4, one_seed) == 5
    plain = seeds.assign(variant=lambda f: f["r"].map(lambda r: "plain" if r == 1 else "baseline"))
    assert fit_rules_in_effect(4, plain) == 5
    assert fit_rules_in_effect(2, one_d) == 2 and fit_rules_in_effect(3, None) == 3  # no test for 3; runs unknown


def test_a_stored_headline_reads_in_todays_words():
    """analysis.json files written before the precision target was named hold "> the 0.15 asked" (a target the
    user had not set); the report, status and run's summary read them in today's words, other headlines as
    written."""
    from pathlib import Path

    from loopscale.fit.identify import stored_headline

    old = {"headline": "phi = -0.253, 95 % CI [-0.573, -0.041] (half-width 0.27 > the 0.15 asked: identified but "
                       "imprecise)"}  # fmt: skip
    assert stored_headline(old) == ("phi = -0.253, 95 % CI [-0.573, -0.041] (half-width 0.27 > 0.15, the precision "
                                    "target: identified but imprecise)")  # fmt: skip
    plain = {"headline": "phi not identified by this grid: on the search-box edge: alpha"}
    assert stored_headline(plain) == plain["headline"] and stored_headline({}) is None
    report = (Path(__file__).resolve().parents[1] / "docs" / "example_cpu_seeds4" / "report.md").read_text()
    assert "the 0.15 asked" not in report and "> 0.15, the precision target: identified but imprecise" in report
