"""benchmarks/bench_train.py refuses a member count below 1 before training anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_train_refuses_ensemble_below_one():
    for args in (["--one", "--ensemble", "0"], ["--ensemble", "-2"]):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, (args, proc.stderr)
        assert "--ensemble must be >= 1" in proc.stderr and proc.stdout == "", (args, proc.stdout)
