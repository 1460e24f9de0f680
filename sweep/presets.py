"""Named sweep specs: ``smoke`` (CI), ``cpu`` (the measurement on 2 CPU cores) and ``paper`` (the paper's 116-run
grid).

Each preset is plain data (a dict validated by :func:`loopscale.sweep.spec.parse_spec`); ``configs/<name>.yaml``
holds the same content (a test checks ``load_spec("configs/X.yaml") == preset_spec("X")``).
"""

from __future__ import annotations

import copy
from pathlib import Path

from loopscale.sweep.spec import SpecError, SweepSpec, load_spec, parse_spec

PAPER_LRS = [0.008, 0.010, 0.012, 0.014, 0.016, 0.018, 0.020, 0.024]
"""The paper's Muon LR sweep set (App. D; code ``lr_sweep``)."""

PAPER_BUDGETS = {
    4.64e17: [6, 8, 10, 12],
    1.0e18: [6, 8, 10, 12, 14],
    2.15e18: [8, 10, 12, 14, 16],
    4.64e18: [10, 12, 14, 16, 18, 20],
    1.0e19: [12, 16, 18, 20, 24],
    2.15e19: [18, 24, 28, 34],
}
"""Width scales s (d = 64 s) per training-FLOP budget C, identical for every r (``scaling_laws.sh``;
29 (C, s) cells x 4 r = 116 runs)."""

PRESETS: dict[str, dict] = {
    "smoke": {
        "name": "smoke",
        "model": {"preset": "cpu", "seq_len": 32},
        "r": [1, 2, 4, 8],
        "sizes": [16, 32],
        "tokens": [2048, 4096],
        "training": {"batch_tokens": 256, "eval_tokens": 2048, "checkpoint_every_steps": 4},
        "lr": {"fixed": 0.01},
        "tune": {
            "num_samples": 6,
            "max_concurrent": 2,
            "tokens": 2048,
            "num_milestones": 4,
            "lr_min": 1e-3,
            "lr_max": 1e-1,
            "eval_tokens": 1024,
        },
        "resources": {"cpus": 1},
        "max_failures": 2,
    },
    # Designed from the measurements in docs/looping_at_small_scale (2 cores, 2026-11-30): a looped model is worth
    # its unique layers only after ~50 tokens per unique parameter, so every run gets D = 1M tokens at d = 16
    # (D/N = 32-107); the paper's recipe (MuonH, linear decay from step 0 to 10 %, no warmup) at LR 0.02, the best
    # of {0.01, 0.02, 0.04} for r = 1 (3 and 10 layers) and r = 8 at this width and budget; a unique-depth ladder
    # (plain models of 2, 3, 4, 6 layers next to the 10-layer r = 1) to read each looped model as "worth k layers";
    # Seeds as replicates, because the seed-to-seed spread is as large as the differences to measure: 32 seeds per
    # plain cell (SD 0.006-0.012 nats) and 64 per looped cell, whose runs spread twice as much (SD 0.020-0.024).
    # With half of that (16/32) the verdict on one phi flipped with the seeds (two runs found phi per r disagreeing,
    # a third did not, with phi's interval +-0.20) and the intervals were +-0.4 / 0.26 / 0.25 layers; `loopscale
    # design` from that third run predicted +-0.29 / 0.21 / 0.16 layers and phi +-0.11 for 32/64 in 43 min of
    # training (docs/example_cpu). The seeds of
    # a cell train together as one seed ensemble on CPU (resources.ensemble). One D: the D-term is a constant, and
    # the law is fitted to cell means with seeds resampled within cells (loopscale.fit.io.cell_means). Training
    # steps are torch.compile-d: Inductor fuses the elementwise work that dominates a d = 16 step (1.33x on an
    # ensemble of 16 once compiled, about 25 s of compilation per trial shape; benchmarks/bench_train.py).
    "cpu": {
        "name": "cpu",
        "model": {"preset": "cpu"},
        "r": [1, 2, 4, 8],
        "sizes": [16],
        "tokens": [1_000_000],
        "ladder": [2, 3, 4, 6],
        "seeds": {1: 32, 2: 64, 4: 64, 8: 64},
        "training": {
            "batch_tokens": 1024,
            "eval_tokens": 32768,
            "optimizer": "muonh",
            "schedule": "linear",
            "warmup_frac": 0.0,
            "final_lr_frac": 0.1,
            "checkpoint_every_steps": 250,
            "compile": True,
        },
        "lr": {"fixed": 0.02},
        "tune": {
            "num_samples": 4,
            "max_concurrent": 2,
            "lr_values": [0.01, 0.014, 0.02, 0.028],
            "tokens": 250_000,
            "num_milestones": 4,
            "tune_per_r": False,
            "eval_tokens": 16384,
        },
        "resources": {"cpus": 1},
        "max_failures": 2,
    },
    # Paper Sec. 3 and App. C/D: d = 64 s, T = 2048, V = 32064, depth 2 + 16 + 2, batch 2^18 tokens, MuonH with
    # Polar Express (AdamW for embeddings/norms), linear decay from step 0 to 10 %, no warmup, no weight decay,
    # final eval on 70.8M tokens.
    # LR tuned per (s, r) over the paper's set at tokens/param 10 (the paper tuned only r in {1, 4} at s = 10), and
    # transferred to each budget's D by the paper's (D / D_ref)^-0.32 on the Muon LR (D_ref: the tuning tokens).
    "paper": {
        "name": "paper",
        "tokenizer": "bpe:32000",
        "model": {"preset": "paper", "size_unit": "width_scale"},
        "r": [1, 2, 4, 8],
        "budgets": PAPER_BUDGETS,
        "training": {
            "batch_tokens": 2**18,
            "micro_batch_tokens": 32 * 2048,
            "optimizer": "muonh",
            "orthogonalization": "polar_express",
            "schedule": "linear",
            "warmup_frac": 0.0,
            "final_lr_frac": 0.1,
            "weight_decay": 0.0,
            "eval_tokens": 34560 * 2048,
            "precision": "bf16",
            "checkpoint_every_steps": 500,
            "compile": True,
        },
        "lr": "tune",
        "lr_data_exponent": 0.32,
        "tune": {
            "num_samples": 8,
            "max_concurrent": 1,
            "lr_values": PAPER_LRS,
            "tokens_per_param": 10.0,
            "num_milestones": 8,
            "tune_per_r": True,
            "eval_tokens": 2**22,
        },
        "resources": {"cpus": 8, "gpus": 1},
        "max_failures": 3,
    },
}


def preset_spec(name: str) -> SweepSpec:
    """The validated spec of preset ``name`` (``smoke`` | ``cpu`` | ``paper``).

    Raises:
        SpecError: unknown preset name (the message lists the valid ones).
    """
    if name not in PRESETS:
        raise SpecError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    return parse_spec(copy.deepcopy(PRESETS[name]))


SPEC_HELP = "Sweep spec YAML, or a preset name: smoke | cpu | paper (default: --preset)."
PRESET_HELP = "smoke | cpu (default) | paper."


def _check_corpus_beside_spec(corpus: str, spec_file: Path) -> None:
    """A relative ``corpus:`` is read from the working directory (as documented); when nothing is there but the
    same relative path exists beside the spec file, say so instead of only "does not exist".

    Raises:
        FileNotFoundError: that case, naming both places and the fixes.
    """
    import glob
    import os

    if corpus == "embedded" or not os.path.isabs(corpus):  # embedded, or ~/...: not made from a relative path
        return
    try:
        rel = Path(corpus).relative_to(Path.cwd().resolve())
    except ValueError:  # absolute as written, or outside the working directory: not a relative path
        return
    beside = spec_file.resolve().parent / rel
    if os.path.lexists(corpus) or glob.glob(corpus) or beside == Path(corpus):
        return  # a path that exists is read as it is, a glob only when none does
    if not (os.path.lexists(beside) or glob.glob(str(beside))):
        return
    shown = os.path.relpath(beside)
    raise FileNotFoundError(
        f"corpus {str(rel)!r} of {spec_file} does not exist in the working directory ({Path.cwd()}), where a "
        f"relative corpus path is read; it exists beside the spec ({beside}): write corpus: {shown} (that path "
        "from the working directory) or an absolute path, or run the command from the spec's folder"
    )


def resolve_spec(spec_arg: str | Path | None, preset: str | None):
    """The spec a command runs and its name (the default ``--out`` is ``runs/<name>``), from SPEC and ``--preset``.

    SPEC is a YAML path, or a preset name (``smoke``, ``cpu``, ``paper``) when no file of that name exists (a folder
    of that name, such as a run folder, does not count; a file of that name is read, with a ``UserWarning``); neither
    given: ``--preset``, else ``cpu``. The name is the preset's or the YAML file's stem, so ``loopscale tune-lr``,
    ``sweep`` and ``run`` given the same SPEC (or preset) default to one folder.

    Raises:
        ValueError: both a SPEC and ``--preset`` given.
        FileNotFoundError / SpecError: no such file (and no such preset; the message lists the presets), an
            invalid spec, or a relative corpus path missing from the working directory but present beside the spec.
    """
    if spec_arg is not None and not Path(spec_arg).is_file() and str(spec_arg) in PRESETS:
        # a folder of that name (e.g. the run folder of `--out smoke`) cannot be a spec: the preset is meant
        if preset is not None:
            raise ValueError(f"give either a SPEC or --preset, not both ({spec_arg!r} is a preset name)")
        spec_arg, preset = None, str(spec_arg)
    if spec_arg is not None and preset is not None:
        raise ValueError("give either a SPEC file or --preset, not both")
    if spec_arg is not None:
        if Path(spec_arg).is_dir():
            raise FileNotFoundError(f"sweep spec {spec_arg} is a folder; give a YAML file (a run folder's spec is "
                                    f"{Path(spec_arg) / 'spec.yaml'}) or a preset name: {', '.join(PRESETS)}")
        if not Path(spec_arg).is_file():
            raise FileNotFoundError(f"sweep spec not found: {spec_arg} (give a YAML file, or a preset name: "
                                    f"{', '.join(PRESETS)})")
        spec = load_spec(spec_arg)
        _check_corpus_beside_spec(spec.corpus, Path(spec_arg))
        if str(spec_arg) in PRESETS:  # `loopscale run smoke` with a file named smoke here: the file, said so
            import warnings

            warnings.warn(f"SPEC {str(spec_arg)!r} is read from the file {Path(spec_arg).resolve()}, not the preset of "
                          f"that name (--preset {spec_arg} runs the preset)", UserWarning, stacklevel=2)  # fmt: skip
        return spec, Path(spec_arg).stem
    name = preset or "cpu"
    return preset_spec(name), name
