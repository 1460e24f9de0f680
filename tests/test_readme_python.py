"""The README's "Python API" block runs as written, from the repository root, and prints what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python API") :]
    (code,) = re.findall(r"```python\n(.*?)```", section[: section.index("\n## ", 3)], flags=re.S)
    return code


def test_the_readme_python_block_runs_and_fits_as_the_cli(tmp_path):
    env = {**os.environ, "LOOPSCALE_CACHE": os.environ.get("LOOPSCALE_CACHE", str(tmp_path / "cache"))}
    p = subprocess.run([sys.executable, "-c", _block()], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 4, p.stdout
    m = re.fullmatch(r"phi = (-?\d\.\d{3}), R2 = (\d\.\d{3}), fitted to 8 cell means of 352 runs", lines[0])
    assert m, lines[0]
    from loopscale.fit import fit_table

    want = fit_table(ROOT / "docs" / "example_cpu" / "runs.parquet", starts=100)
    assert float(m.group(1)) == round(want.params["phi"], 3) and float(m.group(2)) == round(want.fit.r2, 3)
    from loopscale.model import flops_per_token, n_once, n_rec, preset_config

    cfg = preset_config("cpu", r=4, d_model=32)
    assert lines[1].split() == [str(n_once(cfg)), str(n_rec(cfg)), str(flops_per_token(cfg))]
    loss, D, C = lines[2].split()
    assert 0 < float(loss) < 6 and int(D) == 4096 and float(C) == flops_per_token(cfg) * 4096
    n, rid = lines[3].split()
    assert int(n) == 8 and len(rid) >= 8
