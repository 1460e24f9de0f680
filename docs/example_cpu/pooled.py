"""Fit several runs of one design as one run with their seeds pooled (the fit stage of ``loopscale run``, unchanged).

Two runs of the ``cpu`` design with disjoint seeds, pooled, are exactly the run of the same design with twice the
seeds per cell: each seed's result is its own (a seed-ensemble member equals its single run, and the data order
does not depend on the seed), so pooling only changes how many seeds each cell mean has.

Usage (from the repository root)::

    python docs/example_cpu/pooled.py OUT RUN [RUN ...] [--B 200] [--starts 500]

Writes ``OUT/runs.parquet`` (the pooled rows) and ``OUT/fit/`` (``analysis.json`` and figures), then prints the
headline, the worth in unique layers per r, phi per r and both joint-law R^2 (one phi, phi per r) as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from loopscale.fit.analysis import analyze


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--B", type=int, default=200)
    ap.add_argument("--starts", type=int, default=500)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    # pyarrow keeps the stored tables' schema and its metadata (loopscale.schema_version), as the results store writes
    tables = [pq.read_table(r / "runs.parquet") for r in args.runs]
    pooled = pa.concat_tables(tables, promote_options="default")
    runs = pooled.to_pandas()
    keys = ["variant", "r", "n_prelude", "n_recur_block", "n_coda", "d_model", "D", "seed"]
    if runs.duplicated(keys).any():
        raise SystemExit("the runs share seeds in some cell: pool runs with disjoint seeds only")
    args.out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pooled, args.out / "runs.parquet")
    a = analyze(args.out / "runs.parquet", args.out / "fit", B=args.B, starts=args.starts, workers=args.workers)
    v = a["variants"]["baseline"]
    ident = v["identification"]
    print(json.dumps({
        "runs": int(len(runs)),
        "seeds_per_cell": runs.groupby(["r", "n_recur_block"]).size().to_dict().__repr__(),
        "headline": ident["headline"],
        "phi": v["joint"]["params"]["phi"],
        "phi_ci": (v["joint"].get("ci") or {}).get("phi"),
        "per_r": [{k: p[k] for k in ("r", "phi", "lo", "hi")} for p in ident["per_r"]],
        "worth": [{k: w[k] for k in ("r", "worth_layers", "worth_lo", "worth_hi")} for w in v["ladder"]],
        "r2_one_phi": v["joint"]["r2"],
        "law_per_r": ident.get("law_per_r"),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
