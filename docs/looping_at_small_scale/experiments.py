"""Experiments behind docs/looping_at_small_scale/README.md: what is a looped model worth at CPU scale, and why.

Every run is one ``loopscale.model.train.train_run`` (the same trainer the sweep uses) on the embedded corpus,
byte tokens, the ``cpu`` model family (head dim 16, T = 128), batch 1024 tokens, one thread per run, two runs side
by side. Results append to ``data/<group>.jsonl`` (one JSON object per run, with its loss curve); a rerun skips the
runs already there, so the script can be stopped and restarted. The committed ``data/`` holds every run, so a rerun
of these groups writes into another folder: ``--data DIR`` (then ``analyze.py --data DIR``).

    python docs/looping_at_small_scale/experiments.py GROUP [GROUP ...] [--workers 2] [--data DIR]

Groups:
  optimizer  d=16, D=1M: r=1 at 3/6/10 unique layers and r in {2,4,8}, plain Muon vs MuonH (the paper's).
  curves     d=16, D=2M, MuonH, evaluated every 98 steps: r=1 at 3/4/6/10 layers and r in {2,4,8}.
  injection  d=16, D=1M, MuonH: r in {2,8} with additive injection, and with W_inject = [I | I/2].
  lr         d=16, D=1M, MuonH: r=1 (10 layers), r=1 (3 layers) and r=8 at LR 0.01 and 0.04.
  seeds      d=16, D=1M, MuonH: init seeds 1, 2, 3 (data order fixed) of r=1 at 3 layers and of r=2: run-to-run noise.
  width32    d=32, D=1M, MuonH and the cpu preset's old recipe (AdamW 0.0117, cosine, 5 % warmup): r=1 at 3 and 6
             layers and r=2 (the setting where looped models looked worth ~3 layers).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
BASE = dict(batch_tokens=1024, eval_tokens=32768, schedule="linear", warmup_frac=0.0, final_lr_frac=0.1)


def _cfg(d: int, r: int, depth: int | None = None, injection: str | None = None) -> dict:
    """Model keyword arguments: r=1 with ``depth`` plain layers, or the iso-depth-10 looped model (1 + 8/r x r + 1)."""
    m = dict(d_model=d, r=r)
    if depth is not None:
        m["effective_depth"] = depth
    if injection is not None:
        m["injection"] = injection
    return m


def _runs(group: str) -> list[dict]:
    runs = []
    if group == "optimizer":
        for opt, lr in (("muon", 0.02), ("muonh", 0.02)):
            for name, m in (
                ("r1_L3", _cfg(16, 1, 3)),
                ("r1_L6", _cfg(16, 1, 6)),
                ("r1_L10", _cfg(16, 1)),
                ("r2", _cfg(16, 2)),
                ("r4", _cfg(16, 4)),
                ("r8", _cfg(16, 8)),
            ):
                runs.append(dict(name=f"{opt}_{name}", model=m, tokens=1_000_000, optimizer=opt, lr=lr))
    elif group == "curves":
        for name, m in (
            ("r1_L3", _cfg(16, 1, 3)),
            ("r1_L4", _cfg(16, 1, 4)),
            ("r1_L6", _cfg(16, 1, 6)),
            ("r1_L10", _cfg(16, 1)),
            ("r2", _cfg(16, 2)),
            ("r4", _cfg(16, 4)),
            ("r8", _cfg(16, 8)),
        ):
            runs.append(
                dict(name=name, model=m, tokens=2_000_000, optimizer="muonh", lr=0.02, eval_every_steps=98)
            )
    elif group == "injection":
        for r in (2, 8):
            runs.append(dict(name=f"r{r}_additive", model=_cfg(16, r, injection="additive"), tokens=1_000_000,
                             optimizer="muonh", lr=0.02))
            runs.append(dict(name=f"r{r}_inject_state_half", model=_cfg(16, r), tokens=1_000_000,
                             optimizer="muonh", lr=0.02, inject_state_gain=0.5))
    elif group == "lr":
        for lr in (0.01, 0.04):
            for name, m in (("r1_L10", _cfg(16, 1)), ("r1_L3", _cfg(16, 1, 3)), ("r8", _cfg(16, 8))):
                runs.append(dict(name=f"{name}_lr{lr}", model=m, tokens=1_000_000, optimizer="muonh", lr=lr))
    elif group == "seeds":
        for seed in (1, 2, 3):
            for name, m in (("r1_L3", _cfg(16, 1, 3)), ("r2", _cfg(16, 2))):
                runs.append(dict(name=f"muonh_{name}_seed{seed}", model=m, tokens=1_000_000, optimizer="muonh",
                                 lr=0.02, seed=seed))
    elif group == "width32":
        for tag, kw in (("muonh", dict(optimizer="muonh", lr=0.02)),
                        ("adamw_cos", dict(optimizer="adamw", lr=0.0117, schedule="cosine", warmup_frac=0.05))):
            for name, m in (("r1_L3", _cfg(32, 1, 3)), ("r1_L6", _cfg(32, 1, 6)), ("r2", _cfg(32, 2))):
                runs.append(dict(name=f"{tag}_{name}", model=m, tokens=1_000_000, **kw))
    else:
        raise SystemExit(f"unknown group {group!r}; valid: optimizer, curves, injection, lr, seeds, width32")
    return runs


def _train(run: dict) -> dict:
    """Train one run and return its JSON record (losses in nats/byte)."""
    import torch

    from loopscale.model.config import preset_config
    from loopscale.model.looped import LoopedLM
    from loopscale.model.train import RunConfig, train_run

    m = dict(run["model"])
    mcfg = preset_config("cpu", **m)
    gain = run.get("inject_state_gain")
    orig = LoopedLM.init_weights
    if gain is not None:  # ablation: start W_inject at [I | gain I] so the loop reads its state from step 0

        def init_weights(self, seed=0):
            orig(self, seed)
            if self.inject is not None:
                d = self.cfg.d_model
                with torch.no_grad():
                    self.inject.weight[:, d:].copy_(gain * torch.eye(d))

        LoopedLM.init_weights = init_weights
    keys = ("tokens", "optimizer", "lr", "eval_every_steps", "schedule", "warmup_frac")
    kw = {**BASE, **{k: run[k] for k in keys if k in run}}
    cfg = RunConfig(model=mcfg, seed=run.get("seed", 0), data_seed=run.get("data_seed", 0), **kw)
    try:
        res = train_run(cfg)
    finally:
        LoopedLM.init_weights = orig  # worker processes are reused: never leak the ablation into the next run
    return dict(
        name=run["name"], spec=run, status=res.status, final_val_loss=res.final_val_loss, D=res.D,
        steps=res.steps, N_once=res.N_once, N_rec=res.N_rec, N_unique=res.N_unique,
        layers_unique=mcfg.n_prelude + mcfg.n_recur_block + mcfg.n_coda, r=mcfg.r,
        tokens_per_s=res.tokens_per_s, wall_s=res.wall_s, curve=res.curve,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", nargs="+")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data", type=Path, default=DATA, help="folder of the <group>.jsonl files (default: data/ here)")
    a = ap.parse_args(argv)
    a.data.mkdir(parents=True, exist_ok=True)
    for group in a.groups:
        out = a.data / f"{group}.jsonl"
        done = set()
        if out.exists():
            done = {json.loads(line)["name"] for line in out.read_text(encoding="utf-8").splitlines() if line}
        todo = [r for r in _runs(group) if r["name"] not in done]
        print(f"{group}: {len(todo)} runs to do ({len(done)} done)", flush=True)
        with ProcessPoolExecutor(max_workers=a.workers) as ex:
            for rec in ex.map(_train, todo):
                with out.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
                print(f"  {rec['name']}: {rec['final_val_loss']:.4f} nats/byte, {rec['tokens_per_s']:.0f} tok/s",
                      flush=True)


if __name__ == "__main__":
    sys.exit(main())
