"""Scaling-law fitting for loopscale: laws, the Huber-LSE multi-start fitter, Ray-parallel bootstrap, derived tools.

Public API (import from ``loopscale.fit``; heavy libraries load lazily)::

    fit_table(table, law="joint", variant=None, bootstrap=0, identify=False, ...) -> TableFit  # as `loopscale fit`
    fit_law(table, law="joint", phi=None, starts=500, seed=0, delta=1e-3) -> FitResult
    bootstrap(table, law="joint", B=200, block_by="default", seed=0, workers=None, address=None, starts=500)
    compare_variants(table, baseline=None, B=200, ...)
    equivalence(N_once, N_rec, r, phi), compute_optimal_frontier(fit, flops, budgets), isoflop_parabolas(table)
    ladder_table(runs, n_boot=2000)  # worth in unique layers of each looped model on a ladder design
    write_fit_outputs(out_dir, fit, boot)  # fit: a FitResult, or fit_table's TableFit (boot then its own)
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "BootstrapResult",
    "FitResult",
    "PerRunFitWarning",
    "TableFit",
    "bootstrap",
    "compare_variants",
    "compute_optimal_frontier",
    "equivalence",
    "fit_law",
    "fit_table",
    "isoflop_parabolas",
    "ladder_table",
    "make_law",
    "write_fit_outputs",
]

_WHERE = {
    "BootstrapResult": "loopscale.fit.bootstrapping",
    "bootstrap": "loopscale.fit.bootstrapping",
    "FitResult": "loopscale.fit.fitter",
    "fit_law": "loopscale.fit.fitter",
    "fit_table": "loopscale.fit.table_fit",
    "TableFit": "loopscale.fit.table_fit",
    "PerRunFitWarning": "loopscale.fit.table_fit",
    "compare_variants": "loopscale.fit.variants",
    "compute_optimal_frontier": "loopscale.fit.derived",
    "equivalence": "loopscale.fit.derived",
    "isoflop_parabolas": "loopscale.fit.derived",
    "ladder_table": "loopscale.fit.ladder",
    "make_law": "loopscale.fit.laws",
    "write_fit_outputs": "loopscale.fit.outputs",
}


_SUBMODULES = ("analysis", "bootstrapping", "derived", "design", "fitter", "identify", "io", "ladder", "laws",
               "outputs", "plots", "run_report", "table_fit", "variants")
"""Modules the docs and the report name (``loopscale.fit.identify``: the identification rule), reachable as
attributes of the package without importing them first, as the names of :data:`__all__` are."""


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    if name in _SUBMODULES:
        return import_module(f"loopscale.fit.{name}")
    raise AttributeError(f"module 'loopscale.fit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

