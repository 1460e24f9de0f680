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
