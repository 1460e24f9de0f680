"""loopscale.model: the looped (depth-recurrent) decoder, its config and its exact accounting.

Importing this package is cheap and has no side effects: the config and accounting names are plain Python, and the
torch-dependent names (``LoopedLM``, ``LMLoss``, ``maybe_compile``, and the trainer's) load on first attribute access.

Example::

    from loopscale.model import preset_config, model_info
    model_info(preset_config("paper", r=4, width_scale=10))["flops_per_token"]  # 1047336960
"""

from __future__ import annotations

import importlib

from loopscale.model.accounting import (
    block_params,
    flops_per_token,
    flops_per_token_forward,
    model_info,
    n_embedding,
    n_once,
    n_rec,
    n_total,
    n_unique,
    tokens_for_flops,
    train_flops,
)
from loopscale.model.config import INJECTIONS, PRESETS, LoopedConfig, iso_depth, preset_config, valid_r

# name -> module that defines it; loaded lazily by __getattr__ (these import torch)
_LAZY: dict[str, str] = {
    "LoopedLM": "loopscale.model.looped",
    "LMLoss": "loopscale.model.looped",
    "maybe_compile": "loopscale.model.looped",
}

# --- trainer names (appended by the trainer helper below this line) -------------------------------------------
_LAZY.update(
    {
        **dict.fromkeys(
            ("train_run", "RunConfig", "RunResult", "CheckpointError", "resolve_tokens"),
            "loopscale.model.train",
        ),
        **dict.fromkeys(
            (
                "load_tokens",
                "WindowSampler",
                "ByteTokenizer",
                "BPETokenizer",
                "CorpusError",
                "CorpusNotFoundError",
                "CorpusContentError",
                "embedded_documents",
                "embedded_manifest",
                "tokenizer_vocab_size",
                "unigram_entropy",
            ),
            "loopscale.model.data",
        ),
        **dict.fromkeys(("build_optimizers", "lr_multiplier"), "loopscale.model.optim"),
        **dict.fromkeys(("EnsembleLM", "train_ensemble"), "loopscale.model.ensemble"),
        "BatchedMuon": "loopscale.model.muon",
    }
)
# --- end trainer names -------------------------------------------------------------------------------------------

__all__ = [
    "INJECTIONS",
    "PRESETS",
    "LoopedConfig",
    "iso_depth",
    "preset_config",
    "valid_r",
    "block_params",
    "n_once",
    "n_rec",
    "n_unique",
    "n_embedding",
    "n_total",
    "flops_per_token",
    "flops_per_token_forward",
    "train_flops",
    "tokens_for_flops",
    "model_info",
    *_LAZY,
]


def __getattr__(name: str):
    """Lazy access to the torch-dependent names listed in ``_LAZY``."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'loopscale.model' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazily loaded names too (a notebook's tab completion lists them)."""
    return sorted(set(globals()) | set(__all__))

