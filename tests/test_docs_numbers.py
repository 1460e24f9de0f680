"""The numbers docs/example_cpu/README.md quotes are what its committed run folders give: each run's worth in unique
layers with its 95 % half-width, the joint fit's R^2 on the cell means and the headline's phi per r, read from the
folders' ``fit/analysis.json`` and rounded as the page rounds them. Two half-widths and one R^2 of the table of the
four half-seed runs had drifted from their files in the last digit (± 0.47 for 0.465, ± 0.26 for 0.254, R^2 0.990
for 0.9905)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs" / "example_cpu"
README = DOCS / "README.md"


def _baseline(run: Path) -> dict:
    return json.loads((run / "fit" / "analysis.json").read_text(encoding="utf-8"))["variants"]["baseline"]


def _num(s: str) -> float:
    return float(s.replace("−", "-"))


def _worth(run: Path) -> dict[int, tuple[float, float, float]]:
    """{r: (worth, lo, hi)} of a run folder's ladder."""
    return {w["r"]: (w["worth_layers"], w["worth_lo"], w["worth_hi"]) for w in _baseline(run)["ladder"]}


def _row(text: str, start: str) -> list[str]:
    """The cells of the one Markdown table row that starts with ``start``."""
    rows = [ln for ln in text.splitlines() if ln.startswith(start)]
    assert len(rows) == 1, (start, rows)
    return [c.strip() for c in rows[0].strip().strip("|").split("|")]


@pytest.mark.skipif(not README.is_file(), reason="docs/example_cpu is not in this checkout")
@pytest.mark.parametrize("name", list("abcd"))
def test_half_seed_table_quotes_each_runs_worth_half_widths_and_r2(name):
    text = README.read_text(encoding="utf-8")
    cells = _row(text, f"| {name} (")
    m = re.fullmatch(r"(\S+) / (\S+) / (\S+) \(± (\S+) / (\S+) / (\S+)\)", cells[2])
    assert m, cells[2]
    quoted = [m.group(i) for i in range(1, 7)]
    run = DOCS / "half_seeds" / name
    worth = _worth(run)
    want = [f"{worth[r][0]:.2f}" for r in (2, 4, 8)] + [
        f"{(worth[r][2] - worth[r][1]) / 2:.2f}" for r in (2, 4, 8)
    ]
    assert quoted == want, f"docs/example_cpu/README.md, run {name}: quotes {quoted}, its fit/ gives {want}"
    r2_one_phi = cells[3].split(" / ")[0]
    assert r2_one_phi == f"{_baseline(run)['joint']['r2']:.3f}", (name, cells[3])
    identified = _baseline(run)["identification"]["identified"]
    assert ("not identified" not in cells[1]) == identified, (name, cells[1])


@pytest.mark.skipif(not README.is_file(), reason="docs/example_cpu is not in this checkout")
def test_results_table_quotes_both_runs_worth_and_r2():
    text = README.read_text(encoding="utf-8")
    runs = (DOCS, DOCS / "second_seeds")
    for r, layers in ((2, 6), (4, 4), (8, 3)):
        cells = _row(text, f"| worth in unique layers, r = {r} (of {layers}) |")
        for cell, run in zip(cells[1:], runs, strict=True):
            m = re.fullmatch(r"\*\*(\S+) \[(\S+), (\S+)\]\*\* \(± (\S+)\)", cell)
            assert m, cell
            w, lo, hi = _worth(run)[r]
            assert [m.group(i) for i in range(1, 5)] == [
                f"{w:.2f}",
                f"{lo:.2f}",
                f"{hi:.2f}",
                f"{(hi - lo) / 2:.2f}",
            ]
    cells = _row(text, "| joint fit, one φ (8 cell means) |")
    for cell, run in zip(cells[1:], runs, strict=True):
        joint = _baseline(run)["joint"]
        lo, hi = joint["ci"]["phi"]
        assert f"φ = {joint['params']['phi']:.2f} [{lo:.2f}, {hi:.2f}]".replace("-", "−") in cell, cell
        assert f"R² {joint['r2']:.3f}" in cell, cell
    cells = _row(text, "| headline (identification rule) |")
    for cell, run in zip(cells[1:], runs, strict=True):
        for p in _baseline(run)["identification"]["per_r"]:
            assert f"r={p['r']}: {p['phi']:.2f} [{p['lo']:.2f}, {p['hi']:.2f}]".replace("-", "−") in cell, (
                cell
            )
