"""Predict, before running it, the phi half-width of the cpu design at 4 and 16 seeds per cell from this 4-seed run
(loopscale.fit.design: the fitted joint law as truth, the measured seed noise, refits with the product's fitter).

    python docs/example_cpu_seeds4/predict.py    # writes design_prediction.json next to this file
"""

import json
from pathlib import Path

import pandas as pd

from loopscale.fit.design import seed_noise, simulate_phi

HERE = Path(__file__).resolve().parent
runs = pd.read_parquet(HERE / "runs.parquet")
runs = runs.assign(loss=runs.final_val_loss, layers_unique=runs.n_prelude + runs.n_recur_block + runs.n_coda)
sigma, cells = seed_noise(runs)
truth = json.loads((HERE / "fit" / "analysis.json").read_text())["variants"]["baseline"]["joint"]["params"]
base = runs.drop_duplicates(["r", "layers_unique"])[["N_once", "N_rec", "r", "D"]]
out = {"seed_noise_rel": sigma, "cells_with_seeds": cells, "truth": truth}
for k in (4, 16):
    p = simulate_phi(pd.concat([base] * k, ignore_index=True), truth, sigma, n_sim=40, starts=20, seed=1)
    out[f"seeds_{k}"] = p.to_dict()
    print(f"{k} seeds per cell: predicted phi half-width {p.phi_half_width:.3f} (SD {p.phi_sd:.3f})")
(HERE / "design_prediction.json").write_text(json.dumps(out, indent=1), encoding="utf-8")
