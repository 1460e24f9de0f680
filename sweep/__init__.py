"""The sweep: spec, LR tuning (stage 1), the Ray Tune grid (stage 2) and the Parquet results store.

Public names are re-exported lazily (``import loopscale.sweep`` imports neither Ray nor torch).
"""

from __future__ import annotations

__all__ = [
    "SweepSpec",
    "SpecError",
    "Cell",
    "load_spec",
    "parse_spec",
    "run_id",
    "preset_spec",
    "ResultsStore",
    "RUNS_SCHEMA",
    "CURVES_SCHEMA",
    "run_sweep",
    "run_tune_lr",
    "read_lr_table",
    "SweepInterrupted",
]

_WHERE = {
    "SweepSpec": "spec",
    "SpecError": "spec",
    "Cell": "spec",
    "load_spec": "spec",
    "parse_spec": "spec",
    "run_id": "spec",
    "preset_spec": "presets",
    "ResultsStore": "store",
    "RUNS_SCHEMA": "store",
    "CURVES_SCHEMA": "store",
    "run_sweep": "commands",
    "run_tune_lr": "commands",
    "SweepInterrupted": "commands",
    "read_lr_table": "lr_table",
}


def __getattr__(name: str):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"loopscale.sweep.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'loopscale.sweep' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazily loaded names too (a notebook's tab completion lists them)."""
    return sorted(set(globals()) | set(__all__))

