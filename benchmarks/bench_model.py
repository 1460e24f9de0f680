"""Training throughput and MFU of the looped decoder per r at equal effective depth and width, against a plain
reference decoder written here at equal FLOPs/token. Prints one JSON object.

CPU: MFU = achieved model FLOP/s / this machine's fp32 matmul FLOP/s at the same thread count, measured here: a
square fp32 matmul (1024^3; 512^3 with --quick) timed round-robin with the models, the median of the same rounds
(process CPU time with one thread, else wall clock). This is not the trainer's ``peak_flops`` (the highest 1024^3
rate on record, best of three wall-clock runs), so MFU here and in ``bench_train.py`` have different denominators.
CUDA: bf16 autocast (optionally ``torch.compile``), MFU against the device's dense bf16 peak from the trainer's
table (``loopscale.model.train.GPU_BF16_PEAK``: H100/H200 SXM 989e12 FLOP/s, H100 PCIe 756e12; a GPU not in it is
refused).

Each row's ``pass_*`` fields judge the targets: the looped r = 1 at >= 1.0x the reference's tokens/s, r = 8 at
>= 0.95x (by tokens/s, and also by FLOP/s: the r = 8 model executes ~12 % more FLOPs per token for its input
injection at d = 256 (11 % at d = 128), so at equal FLOP/s it reads ~0.89x by tokens/s), MFU >= 0.45 for every looped r; None for an r not run,
and all None under ``--quick``.

Model FLOPs are the paper's training FLOPs/token (``loopscale.model.accounting.flops_per_token``: 6 x matmul params
+ 12 d T attention per layer, App. G of arXiv 2604.21106) times tokens; one step = forward + cross-entropy +
backward (no optimizer). Usage::

    python benchmarks/bench_model.py --quick           # d = 128, a few steps (~10-20 s on one thread)
    python benchmarks/bench_model.py --widths 128 256  # targets: r=1 >= 1.0x ref, r=8 >= 0.95x, MFU >= 0.45
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from loopscale.model.accounting import flops_per_token
from loopscale.model.config import preset_config
from loopscale.model.looped import LoopedLM, maybe_compile

# Clock for the timings: with one CPU thread, the process's CPU time (time.process_time) is far less disturbed by
# other processes sharing the cores than wall-clock time; otherwise wall-clock (perf_counter). Set in main().
CLOCK = {"fn": time.perf_counter, "name": "wall-clock (time.perf_counter)"}


class RefBlock(nn.Module):
    """Plain pre-norm block as one would write it without loops: fused qkv Linear, RoPE, QK-norm, SDPA, relu^2."""

    def __init__(self, d: int, head_dim: int):
        super().__init__()
        self.h, self.hd = d // head_dim, head_dim
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        q, k, v = (
            self.qkv(self.n1(x)).view(B, T, 3, self.h, self.hd).transpose(1, 3).unbind(2)
        )  # [B, H, T, hd]

        def rope(t):
            a, b = t.chunk(2, dim=-1)
            return torch.cat((a * cos + b * sin, b * cos - a * sin), dim=-1)

        q, k = F.rms_norm(rope(q), (self.hd,)), F.rms_norm(rope(k), (self.hd,))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        x = x + self.proj(y)
        return x + self.out(F.relu(self.fc(self.n2(x))).square())


class RefDecoder(nn.Module):
    """Plain decoder with ``depth`` unique blocks: same matmul shapes and FLOPs/token as the looped r = 1 model."""

    def __init__(self, vocab: int, d: int, depth: int, head_dim: int, seq_len: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(RefBlock(d, head_dim) for _ in range(depth))
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.head = nn.Linear(d, vocab, bias=False)
        ang = torch.outer(
            torch.arange(seq_len).float(), 10000 ** (-torch.arange(0, head_dim, 2).float() / head_dim)
        )
        self.register_buffer("cos", ang.cos(), persistent=False)  # [T, hd/2]
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, cos, sin)
        z = self.head(self.norm(x)).float()
        return 15.0 * torch.tanh(z / 15.0)


def ref_flops_per_token(vocab: int, d: int, depth: int, seq_len: int) -> int:
    """Same formula as the looped model: 6 (matmul params + V d) + 12 d T per layer (norms excluded)."""
    return 6 * (depth * 12 * d * d + vocab * d) + 12 * d * seq_len * depth


def matmul_timer(device: str, dtype: torch.dtype, n: int):
    """A callable timing 4 n x n x n matmuls; returns seconds per matmul (2 n^3 FLOPs each)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def run() -> float:
        _sync(device)
        t = CLOCK["fn"]()
        for _ in range(4):
            a @ b
        _sync(device)
        return (CLOCK["fn"]() - t) / 4

    return run


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train_step(model, idx, targets, vocab: int, device: str, autocast: bool) -> float:
    """Seconds of one forward + cross-entropy + backward (gradients cleared afterwards)."""
    _sync(device)
    t = CLOCK["fn"]()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        logits = model(idx)
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    _sync(device)
    dt = CLOCK["fn"]() - t
    for p in model.parameters():
        p.grad = None
    return dt


def interleaved_medians(fns: dict, rounds: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per callable, timed round-robin (one call of each per round) so that load from other
    processes hits every candidate alike; ``warmup`` untimed rounds first."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(warmup + rounds):
        for k, fn in fns.items():
            dt = fn()
            if i >= warmup:
                times[k].append(dt)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="d = 128, batch 8, 3 timed steps")
    ap.add_argument("--widths", type=int, nargs="+", default=None, help="d_model values (cpu preset family)")
    ap.add_argument("--rs", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (seq_len from the preset)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per model")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (MFU peak measured at the same count)"
    )
    ap.add_argument("--compile", action="store_true", help="torch.compile the models (GPU path)")
    ap.add_argument("--preset", default="cpu", choices=["cpu", "paper"])
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="auto: cuda when a GPU is present, else cpu")  # fmt: skip
    args = ap.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    torch.set_num_threads(args.threads)
    if device == "cpu" and args.threads == 1:
        CLOCK.update(fn=time.process_time, name="process CPU time (time.process_time), one thread")
    widths = args.widths if args.widths is not None else ([128] if args.quick else [128, 256])
    batch = args.batch if args.batch is not None else (8 if args.quick else 16)
    steps = args.steps if args.steps is not None else (3 if args.quick else 7)
    for name, v in (("--batch", batch), ("--steps", steps), ("--threads", args.threads), ("--seq-len", args.seq_len)):
        if v is not None and v < 1:
            ap.error(f"{name} must be >= 1, got {v}")
    for d in widths:  # every model is buildable before any is timed
        for r in sorted({1, *args.rs}):  # r = 1 is the reference's layout
            try:
                preset_config(args.preset, r=r, d_model=d, **({"seq_len": args.seq_len} if args.seq_len else {}))
            except (ValueError, TypeError) as e:
                ap.error(f"--widths {d} --rs {r}: {e}")
    n_mm = 512 if args.quick else 1024
    if device == "cuda":
        from loopscale.model.train import peak_flops

        gpu_peak, source = peak_flops(torch.device("cuda"), args.threads, precision="bf16")
        if gpu_peak is None:
            ap.error(f"no bf16 peak known for this GPU ({source}): MFU would have no denominator")
        peak_desc = f"{source}: {gpu_peak:.3g} FLOP/s (data sheet)"
        autocast = True
    else:
        peak_desc = (
            f"measured fp32 {n_mm}^3 matmul at {args.threads} thread(s), timed interleaved with the models"
        )
        autocast = False

    out = {
        "device": device if device == "cpu" else torch.cuda.get_device_name(),
        "threads": args.threads,
        "peak": peak_desc,
        "batch_sequences": batch,
        "timed_rounds": steps,
        "clock": CLOCK["name"],
        "compile": args.compile,
        "note": "medians of round-robin timings; still noisy when other processes share the CPU",
        "widths": [],
    }
    for d in widths:
        ov = {"seq_len": args.seq_len} if args.seq_len else {}
        cfg1 = preset_config(args.preset, r=1, d_model=d, **ov)
        T, V, depth = cfg1.seq_len, cfg1.vocab_size, cfg1.effective_depth
        gen = torch.Generator().manual_seed(0)
        idx = torch.randint(0, V, (batch, T), generator=gen).to(device)
        targets = idx.roll(-1, 1)
        torch.manual_seed(0)
        models = {"reference": RefDecoder(V, d, depth, cfg1.head_dim, T).to(device)}
        cfgs = {}
        for r in args.rs:
            cfgs[r] = preset_config(args.preset, r=r, d_model=d, **ov)
            models[f"r{r}"] = LoopedLM(cfgs[r], seed=0).to(device)
        fns = {
            k: functools.partial(
                train_step, maybe_compile(m, args.compile), idx, targets, V, device, autocast
            )
            for k, m in models.items()
        }
        if device == "cpu":
            fns["matmul"] = matmul_timer(device, torch.float32, n_mm)
        med = interleaved_medians(fns, steps)
        peak = 2 * n_mm**3 / med["matmul"] if device == "cpu" else gpu_peak
        ref_f = ref_flops_per_token(V, d, depth, T)
        ref_tps = batch * T / med["reference"]
        row = {
            "d_model": d,
            "peak_flops_per_s": peak,
            "reference": {"tokens_per_s": ref_tps, "flops_per_token": ref_f, "mfu": ref_tps * ref_f / peak},
            "models": [],
        }
        for r, cfg in cfgs.items():
            tps = batch * T / med[f"r{r}"]
            f = flops_per_token(cfg)
            row["models"].append(
                {
                    "r": r,
                    "layout": f"{cfg.n_prelude}+{cfg.n_recur_block}x{r}+{cfg.n_coda}",
                    "injection": cfg.injection,
                    "tokens_per_s": tps,
                    "flops_per_token": f,
                    "mfu": tps * f / peak,
                    "tokens_per_s_vs_reference": tps / ref_tps,
                    "flops_per_s_vs_reference": tps * f / (ref_tps * ref_f),
                    "flops_per_token_vs_reference": f / ref_f,
                }
            )
        by_r = {m["r"]: m for m in row["models"]}
        judge = not args.quick  # --quick figures are not measurements
        row["pass_r1_ge_1p0x_reference"] = (by_r[1]["tokens_per_s_vs_reference"] >= 1.0) if judge and 1 in by_r else None
        row["pass_r8_ge_0p95x_reference"] = (by_r[8]["tokens_per_s_vs_reference"] >= 0.95) if judge and 8 in by_r else None
        row["pass_r8_ge_0p95x_reference_by_flops"] = (
            by_r[8]["flops_per_s_vs_reference"] >= 0.95) if judge and 8 in by_r else None  # fmt: skip
        row["pass_mfu_ge_0p45"] = all(m["mfu"] >= 0.45 for m in row["models"]) if judge else None
        out["widths"].append(row)
        del models, fns
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
