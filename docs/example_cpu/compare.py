"""Compare two runs of the same design with different seeds: does each estimate of the second run land inside the
first run's 95 % interval (and the other way round)?

Usage (from the repository root)::

    python docs/example_cpu/compare.py docs/example_cpu docs/example_cpu/second_seeds [--json]

Each argument is a run folder (``runs.parquet`` + ``fit/analysis.json``, as ``loopscale run`` writes it). Compared:
each looped model's worth in unique layers, phi fitted per r, the joint fit's phi, and the joint fit's R^2 (on the
points it was fitted to). Prints a Markdown table, or one JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def quantities(run: Path) -> dict[str, tuple[float, float | None, float | None]]:
    """{name: (estimate, lo, hi)} of one run's baseline variant (lo/hi None when there is no interval)."""
    v = json.loads((run / "fit" / "analysis.json").read_text(encoding="utf-8"))["variants"]["baseline"]
    out: dict[str, tuple[float, float | None, float | None]] = {}
    for w in v.get("ladder") or []:
        out[f"worth in unique layers, r={w['r']}"] = (w["worth_layers"], w["worth_lo"], w["worth_hi"])
    for p in v["identification"].get("per_r") or []:
        out[f"phi_r, r={p['r']}"] = (p["phi"], p["lo"], p["hi"])
    j = v["joint"]
    lo, hi = (j.get("ci") or {}).get("phi") or (None, None)
    out["phi (joint fit)"] = (j["params"]["phi"], lo, hi)
    out["R^2 (joint fit)"] = (j["r2"], None, None)
    return out


def inside(x: float, lo: float | None, hi: float | None) -> bool | None:
    """x in [lo, hi] (None without an interval)."""
    return None if lo is None or hi is None else bool(lo <= x <= hi)


def compare(first: Path, second: Path) -> list[dict]:
    """One row per quantity both runs have: estimates, intervals, and whether each lands in the other's."""
    a, b = quantities(first), quantities(second)
    rows = []
    for k in a:
        if k not in b:
            continue
        (xa, la, ha), (xb, lb, hb) = a[k], b[k]
        rows.append(
            dict(quantity=k, first=xa, first_lo=la, first_hi=ha, second=xb, second_lo=lb, second_hi=hb,
                 second_in_first=inside(xb, la, ha), first_in_second=inside(xa, lb, hb))  # fmt: skip
        )
    return rows


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path, help="the first run folder (runs.parquet + fit/analysis.json)")
    ap.add_argument("second", type=Path, help="the second run folder")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    args = ap.parse_args(argv)
    rows = compare(args.first, args.second)
    if args.json:
        print(json.dumps(rows))
        return
    print("| quantity | first run [95 % CI] | second run [95 % CI] | second inside first | first inside second |")
    print("|---|---|---|---|---|")
    yn = {True: "yes", False: "**no**", None: "–"}
    for r in rows:
        print(
            f"| {r['quantity']} | {_f(r['first'])} [{_f(r['first_lo'])}, {_f(r['first_hi'])}] | "
            f"{_f(r['second'])} [{_f(r['second_lo'])}, {_f(r['second_hi'])}] | {yn[r['second_in_first']]} | "
            f"{yn[r['first_in_second']]} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
