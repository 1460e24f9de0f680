"""How much does the ladder's shape move the worth in unique layers?

Usage (from the repository root)::

    python docs/example_cpu/ladder_shape.py docs/example_cpu [docs/example_cpu/second_seeds ...]

For each run folder: every looped model's worth read off the line ``loss = a + b log L`` through the plain rungs
(the report's headline reading, with its 95 % interval from the seeds of every model resampled) and off a power
law through the same rungs, ``loss = e + k N^-c`` (the joint law's N-term at fixed D), with the line's largest
miss of a rung's seed mean in standard errors. Both come from ``loopscale.fit.ladder.ladder_table``, the function
the fit stage calls, with its 1000 draws and seed 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from loopscale.fit.io import with_layers_unique
from loopscale.fit.ladder import ladder_table


def main(folders: list[str]) -> None:
    for folder in folders:
        runs = pd.read_parquet(Path(folder) / "runs.parquet")
        runs = with_layers_unique(runs[runs["status"] == "ok"]).rename(columns={"final_val_loss": "loss"})
        t = ladder_table(runs, n_boot=1000, seed=0)
        print(f"{folder}: the line misses a rung by up to {t['ladder_misfit_se'].max():.2f} standard errors")
        print("| r | worth, line [95 % CI] | worth, power law | power law - line |")
        print("|---|---|---|---|")
        for w in t.itertuples():
            print(f"| {w.r} | {w.worth_layers:.2f} [{w.worth_lo:.2f}, {w.worth_hi:.2f}] | {w.worth_power:.2f} | "
                  f"{w.worth_power - w.worth_layers:+.2f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="run folders (each with runs.parquet), e.g. docs/example_cpu")
    main(ap.parse_args().folders)
