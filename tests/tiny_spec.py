"""The tiny spec that the corpus and folder tests plan or train: r in {1, 2}, one size (d = 16), four token budgets
of 2048-16384 tokens, fixed LR, one CPU per trial. Import it as ``from tiny_spec import tiny_spec`` (pytest puts
this folder on sys.path)."""

from __future__ import annotations

import copy

TINY_SPEC = {
    "name": "tiny",
    "model": {"preset": "cpu", "seq_len": 32},
    "r": [1, 2],
    "sizes": [16],
    "tokens": [2048, 4096, 8192, 16384],
    "training": {"batch_tokens": 256, "eval_tokens": 256},
    "lr": {"fixed": 0.01},
    "resources": {"cpus": 1},
}


def tiny_spec(**changes) -> dict:
    """A fresh copy of :data:`TINY_SPEC` with ``changes`` (top-level keys, e.g. ``corpus=...``) applied."""
    return {**copy.deepcopy(TINY_SPEC), **changes}
