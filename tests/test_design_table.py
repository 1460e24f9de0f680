"""`loopscale design`'s table when its output is not a terminal (piped, redirected, captured): never cut to `…`.

rich sizes a console that cannot ask a terminal to 80 columns (or ``$COLUMNS``); the candidates table of the ``cpu``
preset is about 100 wide, so before the fix the φ column read ``0.2…``, the seeds ``32/…`` and the ``*`` of the spec
as written was lost unless COLUMNS was raised by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loopscale.sweep.cli import app
from loopscale.sweep.design_cmd import print_design

ROOT = Path(__file__).resolve().parents[1]
LADDER_PILOT = ROOT / "docs" / "example_cpu_ladder" / "runs.parquet"


@pytest.fixture
def not_a_terminal(monkeypatch):
    """Output as rich sees a pipe: no tty override, rich's fallback width of 80 columns."""
    for k in ("TTY_COMPATIBLE", "FORCE_COLOR", "TTY_INTERACTIVE", "JUPYTER_COLUMNS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("COLUMNS", "80")


def _result() -> dict:
    """A design result shaped like :func:`loopscale.sweep.design_cmd.design`'s, with full-precision numbers."""
    rs, worth = (2, 4, 8), ("2", "4", "8")

    def cand(seeds, runs, wall, phi, own):
        return {"seeds": seeds, "spec_as_written": own, "runs": runs, "wall_min": wall, "fits": wall < 35,
                "phi_half_width": phi, "r_phi_half_width": {str(r): phi / r + 0.0123 for r in rs},
                "worth_half_width": {k: 0.987 / int(k) + 0.111 for k in worth}}

    return {
        "spec": "cpu", "pilot": "docs/example_cpu_ladder/runs.parquet", "pilot_runs": 128, "minutes": 35.0,
        "cpus": 2, "slots": 2, "n_sim": 40, "best": "16",
        "truth": {"phi": -0.572, "r2_cell_means": 0.982, "n_cells": 8},
        "cells": [dict(r=r, layers_unique=10 // r + 1, d_model=16, D=1e6, noise_sd=0.0123, noise_source="cell",
                       s_per_run=36.9, rate_source="median of r=2") for r in (1, 2, 4, 8)],
        "candidates": [cand("16", 128, 29.3, 0.211, False), cand("8", 64, 14.7, 0.353, False),
                       cand("32/64", 352, 87.5, 0.1117, True)],
        "assumptions": {"wall_time": "training time only", "noise": "per-run loss = law + N(0, sd)"},
    }


def test_piped_table_keeps_every_number_and_the_spec_marker(not_a_terminal, capsys):
    res = _result()
    print_design(res)
    out = capsys.readouterr().out
    assert "…" not in out
    assert "32/64*" in out  # the spec as written keeps its label and its marker
    for c in res["candidates"]:
        assert f"{c['phi_half_width']:.3f}" in out
        for v in c["r_phi_half_width"].values():
            assert f"{v:.3f}" in out
        for v in c["worth_half_width"].values():
            assert f"{v:.2f}" in out
    assert "±worth r=2" in out and "median of r=2" in out


def test_terminal_keeps_its_width(monkeypatch, capsys):
    """On a terminal the console is rich's own: 80 columns stay 80 (today's look, cells may be cut)."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", "80")
    print_design(_result())
    out = capsys.readouterr().out
    from rich.text import Text

    assert max(Text.from_ansi(line).cell_len for line in out.splitlines()) <= 80


@pytest.mark.skipif(not LADDER_PILOT.is_file(), reason="docs/example_cpu_ladder is not in this checkout")
def test_design_cli_captured_output_is_not_cut(not_a_terminal):
    """The finding's command (fewer draws): `loopscale design cpu --pilot docs/example_cpu_ladder/...` captured."""
    res = CliRunner().invoke(app, ["design", "cpu", "--pilot", str(LADDER_PILOT), "--minutes", "35", "--cpus", "2",
                                   "--seeds", "8", "--n-sim", "2", "--starts", "2"])
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    assert "32/64*" in res.output
    assert "±worth r=8" in res.output


def test_no_tie_is_shown_where_nothing_is_recommended(not_a_terminal, capsys):
    """A design whose warning withheld the recommendation (best: none) still marked candidates 'yes, tie', a tie
    with nothing; the table now says only whether each fits. A recommended design keeps its ties. One CPU and one
    trial at once are said in the singular ("1 trials")."""
    res = _result()
    for c in res["candidates"]:
        c.update(tie=c["fits"], diff_se=0.01)
    print_design(res)
    assert "yes, tie" in capsys.readouterr().out
    print_design({**res, "best": None, "warnings": ["the pilot does not pin the law down"], "cpus": 1, "slots": 1})
    out = capsys.readouterr().out
    assert "yes, tie" not in out and " yes " in out and "on 1 CPU, 1 trial at once" in " ".join(out.split())


def test_the_narrowest_candidate_is_marked_tie_with_those_that_tie_it(not_a_terminal, capsys):
    """The narrowest candidate read 'yes' while a wider one that tied it read 'yes, tie' and was recommended (the
    tie with the most runs): the narrowest is one of the tie too. A candidate alone at the top is no tie."""
    res = _result()
    by = {c["seeds"]: c for c in res["candidates"]}
    by["16"].update(tie=True, diff_se=0.05)  # within the tie rule of the narrowest
    by["8"].update(tie=True)  # the narrowest of those that fit: the rule's reference, no diff_se of its own
    print_design(res)
    rows = {ln.split("│")[1].strip(): ln for ln in capsys.readouterr().out.splitlines() if ln.count("│") > 4}
    assert "yes, tie" in rows["16"] and "yes, tie" in rows["8"], rows
    by["16"]["tie"] = False
    print_design(res)
    rows = {ln.split("│")[1].strip(): ln for ln in capsys.readouterr().out.splitlines() if ln.count("│") > 4}
    assert "tie" not in rows["8"], rows
