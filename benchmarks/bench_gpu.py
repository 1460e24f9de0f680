"""GPU training throughput of the paper preset: tokens/s and MFU in bf16. Prints one JSON object.

For each r in ``--r`` (default 1 and 4) it trains ``LoopedLM`` of the ``paper`` preset at width scale s = ``--s``
(default 10, d = 640; V = 32064, T = 2048, depth 2 + 16 + 2) the way the trainer does on a GPU: bf16 autocast,
``torch.compile`` of the loss module (``LMLoss``: model, head, soft-cap and cross-entropy in one graph), fused
scaled-dot-product attention (flash / cuDNN / memory-efficient kernels only: the math fallback is disabled, so a run
that would fall back fails instead of reporting a slow figure; stricter than the trainer, which would fall back
silently), the trainer's ``accumulate_gradients`` over
micro-batches of ``--micro-batch-tokens`` (default 65536 = 32 rows, the paper's device batch) up to
``--batch-tokens``, and the paper preset's optimizer (``build_optimizers(..., "muonh", orthogonalization=
"polar_express")``: BatchedMuonH with Polar Express on block matrices, AdamW on the rest; ``--optimizer muon
--orthogonalization newton_schulz`` for plain Muon). ``--loss-outside-compile`` measures the trainer's earlier way
(the model compiled alone, the cross-entropy eager on its float32 logits). Tokens are uniform random ids (throughput does not depend on the text).
On CUDA it also allows TF32 for float32 matmuls, which the trainer leaves at torch's default; under bf16 autocast
the model's matmuls are bf16 either way, so only float32 work outside autocast (``--precision fp32``, the optimizer's
float32 arithmetic) can differ.

Progress goes to stderr: a line before each r's warm-up (compilation takes 30-45 s per r on an H200, with nothing
else printed) and, when an r is done, its result as one JSON line (``bench_gpu: done {...}``), so a run stopped by
a time limit still leaves the finished r's figures in its log. The JSON object on stdout comes at the end.

The first ``--warmup`` optimizer steps (compilation, allocator warm-up) are timed separately and excluded; the next
``--steps`` steps are timed with ``torch.cuda.synchronize``. MFU = F x tokens/s / peak, with F the paper's training
FLOPs/token (``loopscale.model.accounting.flops_per_token``) and peak the GPU's dense bf16 peak
(``loopscale.model.train.GPU_BF16_PEAK``: H100/H200 SXM 989e12 FLOP/s); ``--matmul-check`` also measures an
8192^3 bf16 matmul as a reachable ceiling. Target: MFU >= 0.40 on an H100/H200.

Measured on one H200 (torch 2.11): MuonH with Polar Express (2026-12-04) MFU 0.44 (r = 1) and 0.48 (r = 4) at 65,536
tokens per step; Muon with Newton-Schulz 0.44 (r = 1) on the same machine, and (2026-12-01, another machine) 0.43 /
0.46, 0.475 at the paper's 2^18 (r = 4); every figure and the commands are in ``docs/gpu_h200/README.md``.

Usage::

    python benchmarks/bench_gpu.py --matmul-check           # on a GPU machine: s = 10, r in {1, 4}
    python benchmarks/bench_gpu.py --device cpu --preset cpu --d-model 32 --precision fp32 --no-compile \\
        --steps 3 --warmup 1 --batch-tokens 2048 --micro-batch-tokens 1024   # smoke run of the script on a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import torch

from loopscale.model.accounting import flops_per_token
from loopscale.model.config import preset_config
from loopscale.model.looped import LMLoss, LoopedLM, maybe_compile
from loopscale.model.optim import build_optimizers
from loopscale.model.train import accumulate_gradients, peak_flops


def fused_sdpa_only():
    """Context allowing only fused attention kernels (no math fallback) on CUDA; a no-op on CPU."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    )


def measured_matmul_flops(device: torch.device, n: int = 8192, reps: int = 10) -> float:
    """FLOP/s of an n x n x n bf16 matmul on random data (mean of ``reps`` after 3 warm-ups): a measured ceiling
    beside the vendor peak."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def _config(args, r: int):
    """The model config of the run at recurrence r (``--preset`` at ``--d-model`` or ``--s``)."""
    return preset_config(args.preset, r=r, **(dict(d_model=args.d_model) if args.d_model else dict(width_scale=args.s)))


def bench_one(args, r: int, device: torch.device) -> dict:
    """Train ``--warmup`` + ``--steps`` optimizer steps at recurrence r; tokens/s, MFU and memory (the options were
    checked in :func:`main`: ``--micro-batch-tokens`` a multiple of T dividing ``--batch-tokens``)."""
    cfg = _config(args, r)
    T = cfg.seq_len
    rows, n_micro = args.micro_batch_tokens // T, args.batch_tokens // args.micro_batch_tokens
    model = LoopedLM(cfg, seed=0).to(device)
    opts, _ = build_optimizers(model, args.optimizer, args.lr, orthogonalization=args.orthogonalization)

    if args.loss_outside_compile:  # the trainer before: the model compiled, the loss eager on float32 logits
        loss_fn = LMLoss(maybe_compile(model, args.compile, device))
    else:  # the trainer's way: model, head, soft-cap and cross-entropy compiled as one graph
        loss_fn = maybe_compile(LMLoss(model), args.compile, device)
    bf16 = args.precision == "bf16"
    g = torch.Generator(device=device).manual_seed(0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    @contextlib.contextmanager
    def autocast():
        attn = fused_sdpa_only() if device.type == "cuda" else contextlib.nullcontext()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), attn:
            yield

    def step() -> float:
        x = torch.randint(0, cfg.vocab_size, (rows * n_micro, T + 1), device=device, generator=g)
        loss = accumulate_gradients(loss_fn, x, n_micro, autocast)  # the trainer's step: one sync for the loss
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
        return loss

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync()
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync()
    t1 = time.perf_counter()
    losses = [step() for _ in range(args.steps)]
    sync()
    t2 = time.perf_counter()
    tps = args.steps * args.batch_tokens / (t2 - t1)
    Fpt = flops_per_token(cfg)
    peak, peak_src = peak_flops(device, torch.get_num_threads(), precision=args.precision)
    return {
        "preset": args.preset,
        "d_model": cfg.d_model,
        "r": r,
        "loss_in_compiled_graph": bool(args.compile) and not args.loss_outside_compile,  # nothing compiled: False
        "flops_per_token": Fpt,
        "tokens_per_s": tps,
        "mfu": Fpt * tps / peak if peak else None,
        "achieved_flops": Fpt * tps,
        "peak_flops": peak,
        "peak_flops_source": peak_src,
        "warmup_s": t1 - t0,
        "timed_s": t2 - t1,
        "first_loss": float(losses[0]),
        "last_loss": float(losses[-1]),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="paper")
    p.add_argument("--s", type=int, default=10, help="width scale (d = 64 s)")
    p.add_argument("--d-model", type=int, default=None, help="width instead of --s")
    p.add_argument("--r", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=200, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation)")
    p.add_argument("--batch-tokens", type=int, default=65536)
    p.add_argument("--micro-batch-tokens", type=int, default=65536)
    p.add_argument("--optimizer", default="muonh", choices=["muonh", "muon", "adamw"], help="the paper's: muonh")
    p.add_argument("--orthogonalization", default="polar_express", choices=["polar_express", "newton_schulz"],
                   help="the paper's: polar_express (adamw ignores it)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument(
        "--loss-outside-compile",
        action="store_true",
        help="compile the model alone and compute the cross-entropy eager on its logits (the trainer before "
        "LMLoss), instead of the trainer's one graph from ids to loss",
    )
    p.add_argument("--matmul-check", action="store_true", help="also measure the bf16 matmul rate (8192^3)")
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    for name, v, lo in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0), ("--batch-tokens", args.batch_tokens, 1),
                        ("--micro-batch-tokens", args.micro_batch_tokens, 1)):  # fmt: skip
        if v < lo:
            p.error(f"{name} must be >= {lo}, got {v}")
    for r in args.r:  # every run's config, before any device work
        try:
            cfg = _config(args, r)
        except (ValueError, TypeError, KeyError) as e:
            p.error(f"--preset {args.preset} --r {r}: {e}")
        if args.batch_tokens % args.micro_batch_tokens or args.micro_batch_tokens % cfg.seq_len:
            p.error(
                f"--micro-batch-tokens {args.micro_batch_tokens} must be a multiple of the sequence length "
                f"{cfg.seq_len} that divides --batch-tokens {args.batch_tokens}"
            )
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        p.error(f"--device {args.device}: {e}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run on a GPU machine (or --device cpu for a smoke run)")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    matmul = measured_matmul_flops(device) if args.matmul_check and device.type == "cuda" else None
    runs = []
    for r in args.r:
        print(f"bench_gpu: r = {r}: building{', compiling' if args.compile else ''} and {args.warmup} warm-up steps, then {args.steps} timed "
              "steps", file=sys.stderr, flush=True)  # fmt: skip
        runs.append(bench_one(args, r, device))
        print(f"bench_gpu: done {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "mode": "gpu_throughput",
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "precision": args.precision,
                "compile": args.compile,
                "optimizer": args.optimizer,
                "orthogonalization": None if args.optimizer == "adamw" else args.orthogonalization,
                "batch_tokens": args.batch_tokens,
                "micro_batch_tokens": args.micro_batch_tokens,
                "measured_bf16_matmul_flops": matmul,
                "runs": runs,
                "pass_mfu_ge_0p40": all(x["mfu"] is not None and x["mfu"] >= 0.40 for x in runs)
                if device.type == "cuda"
                else None,
            }
        )
    )


if __name__ == "__main__":
    main()
