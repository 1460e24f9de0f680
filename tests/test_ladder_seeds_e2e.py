"""The unique-depth ladder and seeds as replicates, from the spec through the sweep, the fit and the report (smoke
scale), plus the spec rules and the stratified bootstrap they rely on."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from loopscale.sweep.spec import parse_spec

BASE = dict(
    name="ladder",
    model={"preset": "cpu", "seq_len": 32},
    r=[1, 2, 8],
    sizes=[16],
    tokens=[4096],
    training={"batch_tokens": 256, "eval_tokens": 2048, "optimizer": "muonh"},
    lr={"fixed": 0.02},
    resources={"cpus": 1},
)


def test_seeds_count_and_ladder_cells():
    spec = parse_spec(dict(BASE, seeds=2, ladder=[3, 2]))
    assert spec.seeds == [0, 1] and spec.ladder == [2, 3]
    cells = spec.cells()
    assert len(cells) == (3 + 2) * 2  # (r = 1, 2, 8 + two rungs) x two seeds
    rungs = [c for c in cells if c.r == 1 and c.run.model.n_recur_block in (2, 3)]
    assert len(rungs) == 4 and all(c.run.model.n_prelude == 0 and c.run.model.n_coda == 0 for c in rungs)
    assert len({c.run_id for c in cells}) == len(cells)  # every rung and seed is its own run
    with pytest.raises(ValueError, match="ladder"):
        parse_spec(dict(BASE, ladder=[2, 2]))
    with pytest.raises(ValueError, match="put 1 in r"):
        parse_spec(dict(BASE, r=[2, 8], ladder=[2]))
    with pytest.raises(ValueError, match="seeds"):
        parse_spec(dict(BASE, seeds=0))


def test_seeds_per_r():
    spec = parse_spec(dict(BASE, seeds={1: 2, 2: 3, 8: [5, 7]}, ladder=[2]))
    cells = spec.cells()
    by = {}
    for c in cells:
        key = (c.r, c.run.model.n_recur_block)
        by.setdefault(key, []).append(c.seed)
    assert by[(2, 4)] == [0, 1, 2] and by[(8, 1)] == [5, 7]
    assert by[(1, 10)] == [0, 1] and by[(1, 2)] == [0, 1]  # the ladder rung takes r = 1's seeds
    assert spec.min_seeds() == 2
    with pytest.raises(ValueError, match="every r of the grid"):
        parse_spec(dict(BASE, seeds={1: 2, 2: 3}))
    with pytest.raises(ValueError, match=r"seeds\[2\]"):
        parse_spec(dict(BASE, seeds={1: 2, 2: 0, 8: 2}))


def test_seeds_of_a_cell_are_packed_into_ensemble_trials():
    from loopscale.sweep.grid import trial_groups
    from loopscale.sweep.spec import AUTO_ENSEMBLE_CPU

    spec = parse_spec(dict(BASE, seeds=5, ladder=[2]))
    assert spec.ensemble_members() == AUTO_ENSEMBLE_CPU
    groups = trial_groups(spec.cells(), 2)
    # 4 cells (r = 1, 2, 8 and one rung) x 5 seeds, in chunks of at most 2 of near-equal size: 2 + 2 + 1
    assert len(groups) == 12 and sorted(len(g) for g in groups) == [1] * 4 + [2] * 8
    for g in groups:
        assert len({(c.r, c.run.model.n_recur_block, c.variant) for c in g}) == 1  # one cell, several seeds
        assert len({c.seed for c in g}) == len(g)
    costs = [g[0].run.model.r * g[0].run.model.n_recur_block + g[0].run.model.n_prelude + g[0].run.model.n_coda
             for g in groups]  # fmt: skip
    assert costs[0] == max(costs) and costs[-1] == min(costs)  # the longest trials start first
    assert sum(len(g) for g in trial_groups(spec.cells(), 16)) == 20 and len(trial_groups(spec.cells(), 16)) == 4
    assert all(len(g) == 1 for g in trial_groups(spec.cells(), 1))
    assert parse_spec(dict(BASE, resources={"cpus": 1, "ensemble": 1})).ensemble_members() == 1
    with pytest.raises(ValueError, match="max_members"):
        trial_groups(spec.cells(), 0)


def test_fixed_D_needs_seeds():
    from loopscale.sweep.run import check_design

    with pytest.raises(ValueError, match="seeds"):
        check_design(parse_spec(dict(BASE, ladder=[2, 3, 4, 6])))
    check_design(parse_spec(dict(BASE, ladder=[2, 3], seeds=2)))  # accepted: the fit resamples seeds
    # seeds at the looped r only: the r = 1 cells never vary in the bootstrap (it said "one seed ... no interval")
    with pytest.raises(ValueError, match=r"cells at r = 1 have one seed: .* would leave out their noise; give every r"):
        check_design(parse_spec(dict(BASE, ladder=[2, 3], seeds={1: 1, 2: 2, 8: 2})))


def test_seeds_add_runs_not_design_points():
    """Seeds replicate cells; the fit needs distinct (size, r, ladder depth, D) points: 3 cells of 8 seeds (24 runs)
    were accepted and trained a fit of 3 points. On one D the 4 free parameters need 5 points, with several D the
    law's 6 need 7: a second token budget makes 6 points, still short."""
    from loopscale.sweep.run import check_design, design_points

    spec = parse_spec(dict(BASE, seeds=8))
    assert len(spec.cells()) == 24 and design_points(spec) == {"baseline": 3}
    with pytest.raises(ValueError, match="has 3 distinct design points .*one D.* 4 free parameters .* need at least "
                                         "5, and seeds add runs"):  # fmt: skip
        check_design(spec)
    spec = parse_spec(dict(BASE, seeds=2, ladder=[2]))  # plain models of other depths are points of their own
    assert design_points(spec) == {"baseline": 4}
    with pytest.raises(ValueError, match="has 4 distinct design points"):
        check_design(spec)
    assert design_points(parse_spec(dict(BASE, seeds=2, ladder=[2, 3]))) == {"baseline": 5}
    spec = parse_spec(dict(BASE, seeds=2, tokens=[4096, 8192]))
    assert design_points(spec) == {"baseline": 6}
    with pytest.raises(ValueError, match="has 6 distinct design points .*6 parameters need at least 7"):
        check_design(spec)
    check_design(parse_spec(dict(BASE, sizes=[16, 32], tokens=[4096, 8192])))  # 12 points
    # variants: each fit counts its own looped runs with the r = 1 runs, and the message names the variant
    two = parse_spec(dict(BASE, r=[1, 2], sizes=[16, 32, 64], tokens=[4096, 8192], variants=["baseline", "trunc_bptt"]))
    assert design_points(two) == {"baseline": 12, "trunc_bptt": 12}
    check_design(two)


def test_one_iso_flop_budget_is_refused_whatever_the_seeds():
    """One iso-FLOP budget trains each size at its own D, so the fit is the block bootstrap over (budget, r) cells,
    which can never vary the budget: seeds did not make it acceptable (phi got no interval). Its points need 7,
    not the one-D 6: 3 sizes x r in {1, 2} were accepted as one D."""
    from loopscale.sweep.run import check_design, design_points

    iso = {k: v for k, v in BASE.items() if k not in ("tokens", "sizes")}
    iso.update(r=[1, 2], budgets={2e10: [16, 32, 48]}, seeds=2)
    spec = parse_spec(iso)
    assert design_points(spec) == {"baseline": 6}
    with pytest.raises(ValueError, match="has 6 distinct design points .*need at least 7"):
        check_design(spec)
    spec = parse_spec(dict(iso, r=[1, 2, 4]))  # 9 points, one budget
    with pytest.raises(ValueError, match=r"same budget \(budgets: 2e\+10\): .*several D, so seeds are not resampled"):
        check_design(spec)
    check_design(parse_spec(dict(iso, r=[1, 2, 4], budgets={2e10: [16, 32, 48], 4e10: [16, 32, 48]})))


def test_stratified_bootstrap_keeps_every_cell():
    from loopscale.fit.bootstrapping import bootstrap

    rng = np.random.default_rng(0)
    rows = []
    for d in (16, 32):
        nb = 12 * d * d + 2 * d
        for r, n_once, n_rec in ((1, 10 * nb, 0.0), (1, 4 * nb, 0.0), (1, 2 * nb, 0.0), (2, 2 * nb, 4 * nb),
                                 (8, 2 * nb, nb)):  # fmt: skip
            for s in range(3):
                loss = 1.6 + 20 * (n_once + r**0.4 * n_rec) ** -0.3
                rows.append(dict(d_model=d, r=r, N_once=n_once, N_rec=n_rec, layers_unique=n_once // nb,
                                 D=1e6, seed=s, loss=loss * np.exp(0.003 * rng.standard_normal())))  # fmt: skip
    df = pd.DataFrame(rows)
    bs = bootstrap(df, B=12, workers=1, starts=20, stratify_by=("d_model", "r", "layers_unique"))
    assert bs.to_dict()["stratify_by"] == ["d_model", "r", "layers_unique"]
    assert int(bs.draws["ok"].sum()) == 12  # every resample keeps every cell, so every one is refitted
    lo, hi = bs.ci["phi"]  # an interval exists, near the truth 0.4 (12 resamples: its ends are rough)
    assert lo < hi and hi - lo < 1.0 and lo - 0.1 < 0.4 < hi + 0.1


@pytest.mark.slow
def test_ladder_and_seeds_through_sweep_fit_and_report(tmp_path):
    spec = dict(BASE, seeds=2, ladder=[2, 3])
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    out = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "loopscale.sweep.cli", "run", str(tmp_path / "s.yaml"), "--out", str(out),
         "--bootstrap", "8", "--starts", "20", "--json", "--num-cpus", "2"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    runs = pq.read_table(out / "runs.parquet").to_pandas()
    assert len(runs) == 10 and set(runs["status"]) == {"ok"}
    assert sorted(set(runs["seed"])) == [0, 1]
    # on CPU the two seeds of each cell trained as one seed ensemble: one trial per cell, two rows per trial
    assert runs.groupby("trial_id").size().tolist() == [2] * 5
    assert (runs.groupby("trial_id")["seed"].nunique() == 2).all()
    # ... and a member's result is its single run's
    from loopscale.model.train import train_run

    cell = next(c for c in parse_spec(spec).cells() if c.r == 2 and c.seed == 1)
    single = train_run(cell.run)
    member = runs.loc[runs["run_id"] == cell.run_id, "final_val_loss"].item()
    assert member == pytest.approx(single.final_val_loss, rel=1e-4)
    assert set(runs["corpus_sha256"]) == {single.corpus_hash}  # ensemble members record the text they read
    layers = runs["n_prelude"] + runs["n_recur_block"] + runs["n_coda"]
    assert sorted(set(layers[runs["r"] == 1])) == [2, 3, 10]
    ana = json.loads((out / "fit" / "analysis.json").read_text(encoding="utf-8"))
    v = ana["variants"]["baseline"]
    assert v["bootstrap_stratified_by"] == ["d_model", "r", "layers_unique", "D"]
    ident = v["identification"]
    assert ident["fixed_D"] and ident["headline"] and isinstance(ident["identified"], bool)
    assert summary["variants"]["baseline"]["headline"] == ident["headline"]
    # next to the one-phi law: the same law with phi free per r, on the same 10 runs (5 cells < 6 parameters)
    lpr = ident["law_per_r"]
    assert lpr["n"] == v["joint"]["n"] == 10 and set(lpr["phi"]) == {"2", "8"}
    assert lpr["r2_one_phi"] == v["joint"]["r2"] and lpr["r2"] >= lpr["r2_one_phi"] - 1e-3
    # 16 steps are too few for depth to help, so the ladder may refuse to place anything; it must say so
    if v["ladder"]:
        assert {w["r"] for w in v["ladder"]} == {2, 8} and all(w["n_seeds"] == 2 for w in v["ladder"])
    else:
        assert "does not fall with depth" in ident["ladder_error"]
    report = (out / "report.md").read_text(encoding="utf-8")
    for text in ("Is φ identified?", "φ free per r", "Worth in unique layers", "Seed spread per cell",
                 ident["headline"]):  # fmt: skip
        assert text in report
    if not ident["identified"]:
        assert "not identified" in ident["headline"] and ident["causes"]
    assert (out / "fit" / "baseline" / "phi_profile.png").exists()


def _replicate_table(seed_sd: float = 0.003) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    nb = 12 * 16 * 16 + 32
    for r, n_once, n_rec, layers in ((1, 10 * nb, 0.0, 10), (1, 4 * nb, 0.0, 4), (1, 2 * nb, 0.0, 2),
                                     (1, 6 * nb, 0.0, 6), (2, 2 * nb, 4 * nb, 6), (8, 2 * nb, nb, 3)):  # fmt: skip
        for s in range(4):
            loss = 1.6 + 20 * (n_once + r**0.4 * n_rec) ** -0.3
            rows.append(dict(d_model=16, r=r, N_once=n_once, N_rec=n_rec, layers_unique=layers, D=1e6, seed=s,
                             loss=loss * np.exp(seed_sd * rng.standard_normal())))  # fmt: skip
    return pd.DataFrame(rows)


def test_cell_means_one_row_per_cell_and_refuses_mixed_cells():
    from loopscale.fit.io import cell_means

    df = _replicate_table()
    keys = ("d_model", "r", "layers_unique", "D")
    m = cell_means(df, keys)
    assert len(m) == 6 and set(m["n_seeds"]) == {4}
    row = m[(m["r"] == 2)].iloc[0]
    assert row["loss"] == pytest.approx(df.loc[df["r"] == 2, "loss"].mean(), rel=1e-12)
    assert row["loss_sd"] == pytest.approx(df.loc[df["r"] == 2, "loss"].std(ddof=1), rel=1e-12)
    with pytest.raises(ValueError, match="N_once varies within a cell"):
        cell_means(df, ("d_model", "r", "D"))  # the r = 1 rungs differ in depth: not one cell
    with pytest.raises(ValueError, match="do not exist"):
        cell_means(df, ("nope",))


def test_cell_means_bootstrap_refits_each_draws_means():
    """Every resample of the cell-means bootstrap is the law fitted to the means of the seeds it drew."""
    from loopscale.fit.bootstrapping import bootstrap, cell_ids, draw_weights_within
    from loopscale.fit.fitter import fit_law
    from loopscale.fit.io import cell_means, prepare
    from loopscale.fit.laws import make_law

    df = _replicate_table()
    keys = ("d_model", "r", "layers_unique", "D")
    point = fit_law(cell_means(df, keys), law="joint", starts=60, seed=0)
    assert point.n == 6
    bs = bootstrap(df, law="joint", B=3, seed=5, workers=1, starts=60, point=point, stratify_by=keys,
                   cell_means=True)  # fmt: skip
    assert bs.extra == {"stratify_by": list(keys), "cell_means": True, "n_runs": 24, "single_seed_note": None}
    data = prepare(df, make_law("joint"))
    W, ok, _, _ = draw_weights_within(make_law("joint"), data, cell_ids(data.frame, keys), 3, 5)
    k = 1
    drawn = data.frame.loc[np.repeat(np.arange(len(df)), W[k].astype(int))]
    direct = fit_law(cell_means(drawn, keys), law="joint", starts=200, seed=0)
    got = bs.draws.loc[k]
    # same data, same law: the same optimum (objectives equal; phi equal where the optimum is sharp)
    assert got["objective"] == pytest.approx(direct.objective, rel=1e-3, abs=1e-9)
    assert got["phi"] == pytest.approx(direct.params["phi"], abs=0.02)
    with pytest.raises(ValueError, match="cell_means needs stratify_by"):
        bootstrap(df, law="joint", B=2, workers=1, starts=10, cell_means=True)
