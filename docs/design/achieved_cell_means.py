"""The phi half-width a run reports when the joint law is fitted to cell means (each cell's loss averaged over its
seeds) and the bootstrap resamples seeds within cells and re-averages: the fit `loopscale design` simulates.

    python docs/design/achieved_cell_means.py RUNS.parquet [B]    # prints one JSON object
"""

import json
import sys

import numpy as np
import pandas as pd

from loopscale.fit.design import NOISE_KEYS, design_cell_means
from loopscale.fit.fitter import fit_law

runs = pd.read_parquet(sys.argv[1])
B = int(sys.argv[2]) if len(sys.argv) > 2 else 200
runs = runs[runs.status == "ok"].assign(
    loss=lambda t: t.final_val_loss, layers_unique=lambda t: t.n_prelude + t.n_recur_block + t.n_coda
)
point = fit_law(design_cell_means(runs), law="joint", starts=100, seed=0)
rng = np.random.default_rng(0)
cells = [g for _, g in runs.groupby(list(NOISE_KEYS))]
phis = []
for _ in range(B):
    draw = pd.concat([g.iloc[rng.integers(len(g), size=len(g))] for g in cells])
    phis.append(fit_law(design_cell_means(draw), law="joint", starts=30, seed=int(rng.integers(1 << 31))).params["phi"])
lo, hi = np.quantile(phis, [0.025, 0.975])
print(json.dumps({"runs": len(runs), "B": B, "phi": point.params["phi"], "phi_lo": lo, "phi_hi": hi,
                  "phi_half_width": (hi - lo) / 2}))
