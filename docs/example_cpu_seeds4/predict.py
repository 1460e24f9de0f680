"""Predict, before running it, the phi half-width of the cpu design at 4 and 16 seeds per cell from this 4-seed run
(loopscale.fit.design: the fitted joint law as truth, the measured seed noise, refits with the product's fitter).

    python docs/example_cpu_seeds4/predict.py    # writes design_prediction.json next to this file
    python docs/example_cpu_seeds4/predict.py --out /tmp/prediction.json
"""

import argparse
import json
from pathlib import Path

import pandas as pd

from loopscale.fit.design import seed_noise, simulate_phi
from loopscale.fit.outputs import json_safe

HERE = Path(__file__).resolve().parent


def main(out: Path) -> None:
    runs = pd.read_parquet(HERE / "runs.parquet")
    runs = runs.assign(loss=runs.final_val_loss, layers_unique=runs.n_prelude + runs.n_recur_block + runs.n_coda)
    sigma, cells = seed_noise(runs)
    truth = json.loads((HERE / "fit" / "analysis.json").read_text())["variants"]["baseline"]["joint"]["params"]
    base = runs.drop_duplicates(["r", "layers_unique"])[["N_once", "N_rec", "r", "D"]]
    result = {"seed_noise_rel": sigma, "cells_with_seeds": cells, "truth": truth}
    for k in (4, 16):
        p = simulate_phi(pd.concat([base] * k, ignore_index=True), truth, sigma, n_sim=40, starts=20, seed=1)
        result[f"seeds_{k}"] = p.to_dict()
        print(f"{k} seeds per cell: predicted phi half-width {p.phi_half_width:.3f} (SD {p.phi_sd:.3f}, Monte-Carlo "
              f"SE of the half-width {p.phi_half_width_se:.3f})")
    out.write_text(json.dumps(json_safe(result), indent=1, allow_nan=False), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "design_prediction.json",
                    help="where the prediction is written (default: design_prediction.json next to this script)")
    main(ap.parse_args().out)
