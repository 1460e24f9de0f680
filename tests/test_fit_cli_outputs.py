"""What `loopscale fit --out` writes agrees with what it prints (--json, the console)."""

from __future__ import annotations

import json
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_cpu"


def test_fit_json_holds_every_key_of_the_json_summary(tmp_path):
    """fit.json lacked fitted_to, not_identified, ci_on_box_edge and identification, which --json printed."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["fit", str(EXAMPLE), "--bootstrap", "4", "--identify", "--starts", "8",
                                   "--workers", "1", "--json", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    said = json.loads(res.stdout)
    written = json.loads((out / "fit.json").read_text())
    assert set(said) - set(written) == {"outputs"}
    for k in ("fitted_to", "not_identified", "identification", "variant"):
        assert written[k] == said[k], k
    assert written["fitted_to"]["what"] == "cell_means" and written["fitted_to"]["cells"] == 8
    assert written["identification"]["identified"] in (True, False)
    assert {k: v for k, v in said.items() if k != "outputs"} == written


def test_fit_json_prints_the_bootstrap_progress_lines_on_stderr_and_only_json_on_stdout():
    """With --json the bootstrap printed no progress at all; README: `bootstrap: i/n chunks` on stderr, plain."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    res = CliRunner().invoke(app, ["fit", str(EXAMPLE), "--bootstrap", "4", "--starts", "8", "--workers", "1",
                                   "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["bootstrap"]["B"] == 4
    assert res.stderr.splitlines() == ["bootstrap: 1/1 chunks"]


def test_plain_progress_lines_print_as_piped_on_a_terminal(monkeypatch, capsys):
    import sys

    from loopscale.fit import bootstrapping as bs

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with bs.plain_progress_lines():
        line = bs._ChunkLines(5)
        for i in range(1, 6):
            line(i)
    assert capsys.readouterr().err.splitlines() == ["bootstrap: 1/5 chunks", "bootstrap: 5/5 chunks"]
    line = bs._ChunkLines(3)  # on a terminal, outside it: every chunk
    for i in range(1, 4):
        line(i)
    assert len(capsys.readouterr().err.splitlines()) == 3
