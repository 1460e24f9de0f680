"""Bootstrap CIs: block/iid resampling, coverage on the paper design, Ray determinism, variants, outputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def _small_joint(
    phi: float = 0.5, seed: int = 0, variant: str | None = None, noise: float = 0.005
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for C in (1e18, 3e18, 1e19):
        for r in (1, 2, 4):
            for d in (256, 384, 512, 768):
                n_once, n_rec = 48.0 * d * d, (192 / r + 2) * d * d
                D = C / (6 * (n_once + r * n_rec))
                L = (
                    1.6
                    + 30 * (n_once + r**phi * n_rec) ** -0.2
                    + 900 * D**-0.37
                    + noise * rng.standard_normal()
                )
                rows.append(
                    {"budget": C, "C": C, "r": r, "N_once": n_once, "N_rec": n_rec, "D": D, "loss": L}
                )
    out = pd.DataFrame(rows)
    if variant is not None:
        out["variant"] = variant
    return out


def test_block_cells_share_weights_and_iid_weights_sum_to_n():
    """Block draws give every row of a (budget, r) cell the same multiplicity; iid weights sum to n."""
    from loopscale.fit.bootstrapping import cell_ids, draw_weights
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    law = make_law("joint")
    data = prepare(_small_joint(), law)
    cells = cell_ids(data.frame, ("budget", "r"))
    assert cells.max() + 1 == 9
    W, ok, _, _ = draw_weights(law, data, cells, 20, seed=3, budget_col="budget")
    assert ok.all()
    for c in range(9):
        assert np.all(W[:, cells == c] == W[:, cells == c][:, :1])
    assert np.all(W.sum(axis=1) % 4 == 0) and np.all(W.sum(axis=1) == 36)
    Wi, _, _, _ = draw_weights(law, data, cell_ids(data.frame, None), 20, seed=3, budget_col=None)
    assert np.all(Wi.sum(axis=1) == 36) and not np.all(Wi == Wi[:, :1])


def test_block_bootstrap_ci_contains_true_phi_on_paper_design():
    """116-run design, paper coefficients + 0.010 nats noise: the (budget, r) block-bootstrap 95 % CI holds phi."""
    from loopscale.fit import bootstrap
    from loopscale.fit.synthetic import PAPER_JOINT, paper_design, synth_joint

    t = synth_joint(paper_design(), noise=0.010, seed=0)
    b = bootstrap(t, law="joint", B=40, seed=0, workers=1, starts=12, point_starts=200)
    assert b.block_by == ("budget", "r")
    lo, hi = b.ci["phi"]
    assert lo < PAPER_JOINT["phi"] < hi and hi - lo < 0.3
    assert b.n_failed == 0 and b.warm_start_share < 0.1
    # derived quantities have CIs: r^phi at r=4, N_eff ratio, compute-optimal N* per r and budget
    assert b.ci_derived["r_phi_4"][0] < 4 ** PAPER_JOINT["phi"] < b.ci_derived["r_phi_4"][1]
    assert "N_star_r8_C2.15e+19" in b.ci_derived and "neff_ratio_8" in b.ci_derived


def test_same_seed_same_ci_with_one_and_two_ray_workers():
    """Same seed => identical draws and CIs serially (workers=1) and as Ray tasks with 2 workers."""
    from loopscale.fit import bootstrap, fit_law

    t = _small_joint()
    point = fit_law(t, starts=40, seed=0)
    b1 = bootstrap(t, B=6, seed=7, workers=1, starts=10, point=point, derived=False, chunk_size=2)
    b2 = bootstrap(t, B=6, seed=7, workers=2, starts=10, point=point, derived=False, chunk_size=2)
    assert b1.ci == b2.ci
    pd.testing.assert_frame_equal(b1.draws, b2.draws)
    b3 = bootstrap(t, B=6, seed=8, workers=1, starts=10, point=point, derived=False, chunk_size=2)
    assert b3.ci != b1.ci


def test_a_bootstrap_of_one_chunk_starts_no_ray_and_two_chunks_do(monkeypatch):
    """One chunk of refits has nothing to run beside it: with no Ray running or addressed it runs in this process
    (starting an embedded Ray took longer than such a fit), with the draws of workers=1. Two chunks go to Ray."""
    import loopscale.fit.bootstrapping as bs
    from loopscale.fit import bootstrap, fit_law

    class Started(Exception):
        pass

    def no_ray(address, workers):
        raise Started(f"Ray asked for (address={address}, workers={workers})")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(bs, "_ray_context", no_ray)
    t = _small_joint()
    point = fit_law(t, starts=40, seed=0)
    one = bootstrap(t, B=4, seed=7, workers=None, starts=10, point=point, derived=False, chunk_size=4)
    serial = bootstrap(t, B=4, seed=7, workers=1, starts=10, point=point, derived=False, chunk_size=2)
    pd.testing.assert_frame_equal(one.draws, serial.draws)
    with pytest.raises(Started, match="workers=None"):
        bootstrap(t, B=4, seed=7, workers=None, starts=10, point=point, derived=False, chunk_size=2)
    with pytest.raises(Started, match="address=auto"):  # an address is Ray's to run, one chunk or not
        bootstrap(t, B=4, seed=7, address="auto", starts=10, point=point, derived=False, chunk_size=4)


def test_compare_variants_paired_delta_phi():
    """Two variants (phi 0.6 vs 0.2; the second borrows the baseline's r=1 runs): Δφ CI below 0, frac Δφ<=0 ~ 1."""
    from loopscale.fit import compare_variants

    base = _small_joint(0.6, seed=0, variant="baseline")
    other = _small_joint(0.2, seed=1, variant="trunc")
    other = other[other["r"] > 1]
    res = compare_variants(pd.concat([base, other]), B=12, seed=0, starts=12, workers=1)
    c = res["comparisons"]["trunc"]
    assert res["baseline"] == "baseline" and res["fits"]["trunc"]["n"] == 36
    assert c["delta_phi"] < -0.2 and c["ci"][1] < 0 and c["frac_delta_le_0"] == 1.0 and c["n_ok"] == 12
    with pytest.raises(ValueError, match="'variant' column"):
        compare_variants(base.drop(columns=["variant"]))


def _replicate_variants(seeds: int = 3, noise: float = 0.003) -> pd.DataFrame:
    """A one-D grid with seeds (the cpu preset's design): plain r = 1 models of 2-10 layers (baseline) and looped
    r = 2, 4, 8 at effective depth 10 for baseline (phi 0.5) and trunc (phi 0.2), losses from the joint law."""
    rng = np.random.default_rng(0)
    per_layer, rows = 12 * 16 * 16, []
    shapes = [(1, 0, L, 0) for L in (2, 4, 6, 10)] + [(2, 1, 4, 1), (4, 1, 2, 1), (8, 1, 1, 1)]
    for variant, phi in (("baseline", 0.5), ("trunc", 0.2)):
        for r, pre, blk, coda in shapes:
            if r == 1 and variant != "baseline":
                continue  # r = 1 runs are the baseline's, borrowed by every variant
            n_once, n_rec = (pre + coda) * per_layer, blk * per_layer
            for k in range(seeds):
                loss = 1.8 + 40 * (n_once + r**phi * n_rec) ** -0.35 + noise * rng.standard_normal()
                rows.append(dict(run_id=f"{variant}-{r}-{blk}-{k}", variant=variant, r=r, d_model=16, n_prelude=pre,
                                 n_recur_block=blk, n_coda=coda, N_once=n_once, N_rec=n_rec, D=1_000_000, seed=k,
                                 status="ok", loss=loss))  # fmt: skip
    return pd.DataFrame(rows)


def test_compare_variants_of_seed_replicates_fits_cell_means_and_pairs_the_shared_cells(monkeypatch):
    """At one D the block bootstrap over (D, r) cells could never vary D: every paired draw was degenerate, Δφ had
    no interval, and its φ came from per-run fits while each variant's own fit used its cell means. Seed
    replicates are now compared as they are fitted: cell means, seeds drawn within cells, and the baseline's r = 1
    cells, shared by both variants, drawn alike in both."""
    import loopscale.fit.variants as variants_mod
    from loopscale.fit import compare_variants, fit_law
    from loopscale.fit.analysis import seed_replicates
    from loopscale.fit.io import cell_means, with_layers_unique

    t = _replicate_variants()
    seen = {}
    real = variants_mod.refit_weights

    def spy(law, data, W, use, theta0, **kw):
        seen[kw["stream"]] = (data.frame.copy(), W.copy())
        return real(law, data, W, use, theta0, **kw)

    monkeypatch.setattr(variants_mod, "refit_weights", spy)
    res = compare_variants(t, B=8, seed=0, starts=20, workers=1)
    c = res["comparisons"]["trunc"]
    assert res["block_by"] is None and res["stratify_by"] == ["d_model", "r", "layers_unique", "D"]
    assert res["cell_means"] == {"baseline": True, "trunc": True}
    assert c["n_ok"] == 8 and "no_interval" not in c and c["delta_phi"] == pytest.approx(-0.3, abs=0.02)
    assert c["ci"][0] <= c["delta_phi"] <= c["ci"][1] < 0 and c["frac_delta_le_0"] == 1.0  # true Δφ: -0.3
    for v, own in (("baseline", t[t["variant"] == "baseline"]), ("trunc", t[(t["variant"] == "trunc") | (t["r"] == 1)])):
        frame = with_layers_unique(own)
        point = fit_law(cell_means(frame, seed_replicates(frame).strata), law="joint", starts=20, seed=0)
        assert res["fits"][v]["params"]["phi"] == pytest.approx(point.params["phi"], abs=1e-9)  # the variant's fit
    (fb, Mb), (ft, Mt) = seen[1], seen[2]  # baseline, trunc: each draw's cell means
    assert Mb.shape == (8, 7) and Mt.shape == (8, 7)
    r1b, r1t = (fb["r"] == 1).to_numpy(), (ft["r"] == 1).to_numpy()
    assert r1b.sum() == 4 and np.array_equal(Mb[:, r1b], Mt[:, r1t])  # the shared cells, drawn alike
    assert not np.array_equal(Mb[:, ~r1b], Mt[:, ~r1t])


def test_compare_variants_of_seed_replicates_draws_the_same_seeds_for_every_variant():
    """A variant's run and the baseline's run of one seed share that seed's data order, so a paired bootstrap
    draws the same seeds of a cell for both. Each variant's looped cells were drawn on their own: a variant whose
    runs ended at the baseline's losses (truncated BPTT on short runs, seed for seed) got Δφ = 0.000 with a 95 %
    interval of about ±0.04. Here a variant with the baseline's exact losses, its rows shuffled: every draw gives
    Δφ = 0; and one whose every loss is the baseline's plus its seed's own offset (a shared per-seed effect) gets an
    interval narrower than the one of draws made without the pairing."""
    from loopscale.fit import compare_variants

    t = _replicate_variants(noise=0.01)
    base = t[t["variant"] == "baseline"]
    twin = base[base["r"] > 1].assign(variant="twin", run_id=lambda f: f["run_id"] + "-twin")
    res = compare_variants(pd.concat([base, twin.sample(frac=1.0, random_state=3)]), B=16, seed=0, starts=10,
                           workers=1)  # fmt: skip
    c = res["comparisons"]["twin"]
    assert c["n_ok"] == 16 and c["delta_phi"] == pytest.approx(0.0, abs=1e-9)
    assert c["ci"][0] == pytest.approx(0.0, abs=1e-6) and c["ci"][1] == pytest.approx(0.0, abs=1e-6), c["ci"]
    assert res["unpaired_cells"] == 0
    # a variant's models told apart from the baseline's by N_rec alone (no d_model column; hyperconnections' lane
    # weights are counted in N_rec): still the same design cells, paired (N_rec split them: 50x wider)
    wide = pd.concat([base, base.assign(d_model=32, N_once=base["N_once"] * 4, N_rec=base["N_rec"] * 4,
                                        run_id=base["run_id"] + "w", loss=base["loss"] - 0.05)])  # fmt: skip
    lanes = wide[wide["r"] > 1].assign(variant="twin", N_rec=lambda f: f["N_rec"] + 1)
    res = compare_variants(pd.concat([wide, lanes]).drop(columns=["d_model"]), B=8, seed=0, starts=10, workers=1)
    assert res["unpaired_cells"] == 0 and res["stratify_by"][-1] == "N_rec"  # two widths: N tells cells apart
    assert res["comparisons"]["twin"]["ci"][1] - res["comparisons"]["twin"]["ci"][0] < 1e-3
    # a cell whose twin lacks one seed: that cell is drawn for each variant on its own (counted), the others paired
    # (positions in the seed order had matched seed 1 of one variant with seed 0 of the other)
    short = twin.drop(index=twin.index[(twin["r"] == 2) & (twin["seed"] == 0)])
    res = compare_variants(pd.concat([base, short]), B=8, seed=0, starts=10, workers=1)
    assert res["unpaired_cells"] == 1
    # seeds named by strings (a hand-made table): paired alike
    named = pd.concat([base, twin]).assign(seed=lambda f: "s" + f["seed"].astype(str))
    c = compare_variants(named, B=8, seed=0, starts=10, workers=1)["comparisons"]["twin"]
    assert c["ci"][0] == pytest.approx(0.0, abs=1e-6) and c["ci"][1] == pytest.approx(0.0, abs=1e-6), c["ci"]
    # unpaired (the twin's seeds relabelled, so that one draw picks other seeds of it than of the baseline): wide
    other = twin.assign(seed=lambda f: (f["seed"] + 1) % 3).sample(frac=1.0, random_state=3)
    res = compare_variants(pd.concat([base, other]), B=16, seed=0, starts=10, workers=1)
    lo, hi = res["comparisons"]["twin"]["ci"]
    assert hi - lo > 0.01, (lo, hi)


def test_compare_variants_without_any_interval_says_why():
    """One seed per cell at one D: no seed replicates, so the (D, r) block bootstrap is used, and every draw of it
    is degenerate; the row says why it has no interval."""
    from loopscale.fit import compare_variants

    res = compare_variants(_replicate_variants(seeds=1), B=4, seed=0, starts=10, workers=1)
    c = res["comparisons"]["trunc"]
    assert res["block_by"] == ["D", "r"] and c["n_ok"] == 0
    assert c["no_interval"].startswith("every paired draw of cells ('D', 'r') was degenerate for some variant")


def test_write_fit_outputs(tmp_path):
    """fit.json holds params and CIs; bootstrap.parquet one row per resample; PNGs are written."""
    import json

    import pyarrow.parquet as pq

    from loopscale.fit import bootstrap, fit_law, write_fit_outputs

    t = _small_joint()
    fit = fit_law(t, starts=30)
    b = bootstrap(t, B=5, workers=1, starts=8, point=fit)
    files = write_fit_outputs(tmp_path, fit, b)
    assert set(files) == {
        "fit.json",
        "bootstrap.parquet",
        "fit_curves.png",
        "residuals.png",
        "phi_bootstrap.png",
    }
    d = json.loads((tmp_path / "fit.json").read_text())
    assert d["params"]["phi"] == fit.params["phi"] and d["ci"]["phi"] == list(b.ci["phi"])
    assert pq.read_table(tmp_path / "bootstrap.parquet").num_rows == 5
    assert (tmp_path / "fit_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_bootstrap_bad_arguments_raise_before_work():
    """B < 1, workers < 1 and a missing block column are ValueErrors."""
    from loopscale.fit import bootstrap

    t = _small_joint()
    with pytest.raises(ValueError, match="block_by column"):
        bootstrap(t, block_by=("budget", "width"))
    with pytest.raises(ValueError, match="B=0"):
        bootstrap(t, B=0)
    with pytest.raises(ValueError, match="workers=0"):
        bootstrap(t, B=2, workers=0, starts=2)


@pytest.mark.parametrize(
    "block_by, words",
    [
        # one seed on every run: a single block, every draw is the whole table
        (("seed",), "--block-by seed: every run has seed = 0, so the table is a single block"),
        # a column null on every run: one block too (a null is a value of its own)
        (("note",), "--block-by note: every run has note = null, so the table is a single block"),
        # two values of r with phi free: a draw that leaves one out has a single r and is redrawn
        (("r2",), "every draw that leaves out one of its 2 blocks holds a single r"),
    ],
)
def test_blocking_whose_every_resample_is_the_whole_table_gives_no_interval(block_by, words):
    """Blocks that cannot vary the data (every accepted resample is the whole table) used to give a zero-width
    interval (phi = 0.93 [0.93, 0.93]) with no_interval_reason None; now the bootstrap says there is no interval,
    why, and which blocking works, and refits nothing."""
    from loopscale.fit.bootstrapping import bootstrap_data
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    t = _small_joint().assign(seed=0, note=None)
    t["r2"] = np.where(t["r"] == 1, "r1", "looped")  # two blocks, each on its own holding a single r
    if block_by == ("r2",):
        t = t[t["r"] <= 2].reset_index(drop=True)
    law = make_law("joint")
    data = prepare(t, law)
    with pytest.warns(UserWarning, match="no interval"):
        b = bootstrap_data(law, data, B=6, block_by=block_by, workers=1, starts=8, derived=False)
    assert b.no_interval_reason is not None and words in b.no_interval_reason
    assert "every resample is the whole table" in b.no_interval_reason
    assert "a blocking that works: --block-by budget,r" in b.no_interval_reason
    assert b.to_dict()["n_ok"] == 0 and all(np.isnan(v).all() for v in b.ci.values())


def test_blocking_by_a_budget_column_null_on_every_run_says_so():
    """--block-by budget on a token-budget grid (budget is null on every run) said "every run has the same budget =
    nan"; it now says that no run has a budget, and names a blocking that works."""
    from loopscale.fit.bootstrapping import design_problem
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    law = make_law("joint")
    data = prepare(_small_joint().assign(budget=np.nan), law)
    why = design_problem(law, data, ("budget",))
    assert why.startswith("no run has a budget (null on every run"), why
    assert "nan" not in why and "a blocking that works: --block-by" in why


def test_blocking_that_can_vary_the_data_keeps_its_interval():
    """The check does not fire on blockings whose draws can vary the data: three values of r, iid runs."""
    from loopscale.fit.bootstrapping import whole_table_problem
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    law = make_law("joint")
    data = prepare(_small_joint().assign(seed=0), law)
    for bb in (("r",), ("budget", "r"), None, ("seed", "r")):
        assert whole_table_problem(law, data, bb) is None, bb
    # iid over exactly as many runs as parameters: any draw that is not the whole table has too few runs
    six = prepare(_small_joint().iloc[[0, 1, 4, 5, 8, 13]], law)
    assert "fewer runs than the law's parameters" in whole_table_problem(law, six, None)


def test_stratified_bootstrap_with_one_run_per_cell_gives_no_interval():
    """Seeds resampled within cells that each hold one run: every resample is the whole table (also with
    ``cell_means``); a cell with two seeds lets the draws vary."""
    from loopscale.fit import bootstrap

    t = _small_joint().assign(seed=0)
    keys = ("budget", "r", "N_once")
    for means in (False, True):
        with pytest.warns(UserWarning, match="no interval"):
            b = bootstrap(t, B=4, workers=1, starts=8, stratify_by=keys, cell_means=means, derived=False)
        assert "every cell has one run" in b.no_interval_reason and b.to_dict()["n_ok"] == 0
    two = pd.concat([t, t.iloc[[0]].assign(seed=1, loss=t["loss"].iloc[0] + 0.01)], ignore_index=True)
    b = bootstrap(two, B=2, workers=1, starts=8, stratify_by=keys, derived=False)
    assert b.no_interval_reason is None and b.to_dict()["n_ok"] == 2


def test_estimate_outside_its_interval_is_listed():
    """A point estimate outside its own percentile interval (B = 24.2 [2123, 1.6e8]) was reported without a word;
    it is now listed in ``estimate_outside_ci`` (BootstrapResult, fit.json) and the interval is unchanged."""
    import dataclasses

    from loopscale.fit.bootstrapping import bootstrap_data, estimates_outside_ci
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law
    from loopscale.fit.outputs import summary_dict

    p = {"E": 1.0, "B": 24.189, "beta": 0.234, "phi": 0.5, "A": 3.0}
    ci = {"E": (0.5, 1.0 + 1e-9), "B": (2123.0, 1.573e8), "beta": [0.326, 2.5], "phi": (None, None), "A": (3.5, 4)}
    assert estimates_outside_ci(p, ci) == ["B", "beta", "A"]  # E within tolerance of its bound; phi no interval
    assert estimates_outside_ci({"B": 35.5}, {"B": (36.97, 1.388e8)}) == ["B"]  # a wide interval does not hide it

    law = make_law("joint")
    b = bootstrap_data(law, prepare(_small_joint(), law), B=3, workers=1, starts=10, derived=False)
    assert b.estimate_outside_ci == estimates_outside_ci(b.point.params, b.ci)
    lo, hi = b.ci["B"]
    moved = dataclasses.replace(b, ci={**b.ci, "B": (2 * b.point.params["B"], 3 * b.point.params["B"])})
    assert "B" in moved.estimate_outside_ci
    d = summary_dict(b.point, moved)
    assert "B" in d["estimate_outside_ci"] and d["ci"]["B"] == [2 * b.point.params["B"], 3 * b.point.params["B"]]
    assert (lo, hi) == b.ci["B"]


def test_piped_bootstrap_progress_prints_first_last_and_at_most_once_a_minute(monkeypatch, capsys):
    """Piped, `fit --bootstrap 200 --workers 2` printed 50 'bootstrap: i/50 chunks' lines; like the other
    commands' plain progress it now prints the first, then at most one a minute, and the last."""
    from loopscale.fit import bootstrapping as bs

    clock = iter([0.0, 1.0, 2.0, 61.0, 62.0, 63.0])
    monkeypatch.setattr(bs.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(bs.sys.stderr, "isatty", lambda: False, raising=False)
    line = bs._ChunkLines(6)
    for i in range(1, 7):
        line(i)
    assert capsys.readouterr().err.splitlines() == ["bootstrap: 1/6 chunks", "bootstrap: 4/6 chunks",
                                                    "bootstrap: 6/6 chunks"]  # fmt: skip


def test_one_budget_says_why_its_blocking_fails_where_r_alone_works():
    """One budget, blocked by (budget, r): the reason said no resample could vary the budget and named --block-by r,
    which splits the runs into the very same blocks; it now says the difference: a budget blocking asks each draw
    for two budgets."""
    from loopscale.fit.bootstrapping import design_problem
    from loopscale.fit.io import prepare
    from loopscale.fit.laws import make_law

    law = make_law("joint")
    one = _small_joint()
    one = one[one.budget == one.budget.min()] if "budget" in one.columns else one[one.C == one.C.min()].assign(budget=1e18)
    data = prepare(one, law)
    why = design_problem(law, data, ("budget", "r"))
    assert why.startswith("every run has the same budget = 1e+18: a blocking with a budget column (['budget', 'r']) "
                          "redraws every resample that holds fewer than two values of budget"), why
    assert why.endswith("a blocking that works: --block-by r (block_by='r' in Python), which draws the same cells "
                        "without asking each draw for two values of budget; or add runs at a second budget"), why
