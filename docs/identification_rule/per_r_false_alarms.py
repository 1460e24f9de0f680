"""How often does the identification rule's per-r test refuse a phi that IS common to every r?

The rule (``loopscale.fit.identify``) reports phi only when phi fitted per r (the r = 1 runs with those of one r)
has 95 % intervals with a common value. This script measures the test's false-alarm rate on the default job's own
design: it takes the cells and seed counts of ``docs/example_cpu/runs.parquet`` (the ``cpu`` preset: d = 16,
D = 1e6 tokens, a plain ladder of 2, 3, 4, 6 and 10 layers and r = 2, 4, 8), replaces every run's loss by the joint law with ONE
phi (the law fitted to that run's cell means with phi held at its fitted value) plus Gaussian seed noise with each
cell's measured seed SD, and applies the per-r test exactly as ``loopscale run`` does (cell means, seeds resampled
within cells, ``RULE_PER_R_B`` resamples, ``RULE_PER_R_STARTS`` starts). Every simulated pilot has a common phi, so
every refusal is a false alarm. Each pilot's ``gap`` (largest lower end minus smallest upper end of its phi_r
intervals; > 0 means refused) is set beside the gap of the real runs (``gap_observed``).

    .venv/bin/python docs/identification_rule/per_r_false_alarms.py [--pilots 40] [--B 40]

With ``--ladder observed`` the plain cells keep the example's measured means (their misfit to the law, up to 3
standard errors on a rung) and only the looped cells sit on the one-phi law: does the ladder's shape alone open
such gaps? Prints one JSON object and writes it as ``per_r_false_alarms_B<B>[_observed_ladder].json`` into ``--out``
(default: beside this file, where the committed results are; give another folder for a scaled-down try).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from loopscale.fit.analysis import seed_replicates
from loopscale.fit.fitter import fit_law
from loopscale.fit.identify import RULE_PER_R_B, RULE_PER_R_STARTS, per_r_disagree, per_r_phi
from loopscale.fit.io import cell_means, read_table, with_layers_unique
from loopscale.fit.laws import make_law

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent / "example_cpu" / "runs.parquet"


def _observed_gap(fit_dir: Path) -> float:
    """Largest lower end minus smallest upper end of the phi_r intervals the run's analysis recorded."""
    per_r = json.loads((fit_dir / "analysis.json").read_text())["variants"]["baseline"]["identification"]["per_r"]
    return max(x["lo"] for x in per_r) - min(x["hi"] for x in per_r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pilots", type=int, default=40, help="simulated pilots")
    ap.add_argument("--B", type=int, default=RULE_PER_R_B, help="bootstrap resamples of each phi_r interval")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE,
                    help="folder of the JSON result (default: beside this script, the committed ones)")
    ap.add_argument("--ladder", choices=("law", "observed"), default="law",
                    help="the plain r = 1 cells' mean losses: the one-phi law's ('law'), or the example's measured "
                         "cell means ('observed': the ladder's own misfit to the law kept, looped cells on the law)")
    a = ap.parse_args()

    runs = with_layers_unique(read_table(RUNS))
    runs = runs[runs["status"] == "ok"].rename(columns={"final_val_loss": "loss"}).reset_index(drop=True)
    strata = seed_replicates(runs).strata
    means = cell_means(runs, strata)
    joint = fit_law(means, law="joint", starts=500, seed=0)  # phi free: its phi is the common phi of the truth
    phi = float(joint.params["phi"])
    truth = fit_law(means, law="joint", phi=phi, starts=500, seed=0)
    cols = {k: runs[k].to_numpy(float) for k in ("N_once", "N_rec", "r", "D")}
    mean_loss = make_law("joint", phi).predict(truth.params, cols)  # paper Eq. 3 at one phi, nats/token
    if a.ladder == "observed":  # the plain rungs where they were measured: their misfit to the law is kept
        observed = runs.groupby(list(strata))["loss"].transform("mean").to_numpy(float)
        mean_loss = np.where(runs["r"].to_numpy() == 1, observed, mean_loss)
    sd = runs.groupby(list(strata))["loss"].transform("std").to_numpy(float)

    rng = np.random.default_rng(a.seed)
    rows, t0 = [], time.time()
    for k in range(a.pilots):
        sim = runs.assign(loss=mean_loss + sd * rng.standard_normal(len(runs)))
        pr = per_r_phi(sim, starts=RULE_PER_R_STARTS, B=a.B, seed=k, stratify_by=strata)
        why = per_r_disagree(pr) if pr[["lo", "hi"]].notna().all().all() else "no interval"
        gap = float(pr["lo"].max() - pr["hi"].min())  # > 0: the intervals share no value (by this much in phi)
        rows.append({"pilot": k, "refused": why is not None, "gap": round(gap, 4),
                     "per_r": {str(int(x.r)): [round(x.phi, 4), round(x.lo, 4), round(x.hi, 4)]
                               for x in pr.itertuples()}})  # fmt: skip
    out = {
        "design": str(RUNS.relative_to(HERE.parent.parent)),
        "runs": len(runs),
        "cells": int(len(means)),
        "true_phi": round(phi, 4),
        "seed_sd_nats_median": round(float(np.median(sd)), 5),
        "ladder": a.ladder,
        "B": a.B,
        "starts": RULE_PER_R_STARTS,
        "pilots": a.pilots,
        "refused": int(sum(r["refused"] for r in rows)),
        "largest_gap": max(r["gap"] for r in rows),
        # the same statistic on the real runs: the example and its second, independent set of seeds
        "gap_observed": {name: round(_observed_gap(HERE.parent / "example_cpu" / sub), 4)
                         for name, sub in (("example_cpu", "fit"), ("second_seeds", "second_seeds/fit"))},
        "wall_s": round(time.time() - t0, 1),
        "rows": rows,
    }
    name = f"per_r_false_alarms_B{a.B}" + ("_observed_ladder" if a.ladder == "observed" else "")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))


if __name__ == "__main__":
    main()
