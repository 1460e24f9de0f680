"""The commands loopscale prints for a user to paste (in `status`, report.md and error messages) are shell-quoted:
with --out "/tmp/out partial" the stale-fit line said `loopscale run /tmp/out partial/spec.yaml --out /tmp/out
partial --resume`, which a shell splits into other arguments."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from loopscale.sweep.cli import app

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "example_cpu_seeds4"


def _commands(text: str, start: str) -> list[list[str]]:
    """Every backticked command in ``text`` that starts with ``start``, split as a shell splits it."""
    return [shlex.split(c) for c in re.findall(r"`([^`]*)`", " ".join(text.split())) if c.startswith(start)]


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="docs/example_cpu_seeds4 is not in this checkout")
def test_a_folder_with_a_space_gets_commands_a_shell_reads_back(tmp_path):
    d = tmp_path / "out partial" / "ex"
    shutil.copytree(EXAMPLE, d)
    t = pq.read_table(d / "runs.parquet")
    pq.write_table(t.slice(0, t.num_rows - 4), d / "runs.parquet")  # runs removed since the fit: a stale fit
    resume = ["loopscale", "run", str(d / "spec.yaml"), "--out", str(d), "--resume"]
    res = CliRunner().invoke(app, ["status", str(d)])
    assert res.exit_code == 0, res.output
    assert resume in _commands(res.output, "loopscale run")
    res = CliRunner().invoke(app, ["report", str(d)])
    assert res.exit_code == 0, res.output
    report = (d / "report.md").read_text(encoding="utf-8")
    assert resume in _commands(report, "loopscale run")
    assert ["loopscale", "fit", str(d)] in _commands(report, "loopscale fit")


def test_refit_and_lr_table_commands_are_quoted(tmp_path):
    from loopscale.sweep.lr_table import read_lr_table
    from loopscale.sweep.spec import refit_command

    d = tmp_path / "my runs"
    one = _commands(refit_command(d, ["baseline"]), "loopscale fit")
    assert one == [["loopscale", "fit", str(d), "--bootstrap", "200", "--identify", "--out", f"{d}_refit"]]
    two = _commands(refit_command(d, ["baseline", "trunc_bptt"]), "loopscale fit")
    assert [c[-3:] for c in two] == [["baseline", "--out", f"{d}_refit_baseline"],
                                     ["trunc_bptt", "--out", f"{d}_refit_trunc_bptt"]]  # fmt: skip
    with pytest.raises(FileNotFoundError) as e:
        read_lr_table(d / "lr_table.parquet")
    assert _commands(str(e.value), "loopscale tune-lr") == [["loopscale", "tune-lr", "SPEC", "--out", str(d)]]
