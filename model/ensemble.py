"""Seed ensembles: k replicas of one run (same architecture, different init seeds) trained as one batched model.

At the CPU preset's widths (d = 16-48) a step has a fixed per-operation cost (dispatch, autograd, small kernels)
beside its arithmetic. :class:`EnsembleLM` stacks the weights of k :class:`~loopscale.model.looped.LoopedLM` (one
per seed) along a leading member dimension and runs every layer as one batched op (``torch.bmm`` for the matmuls,
the member dim folded into the batch for attention), so k runs pay that per-op cost once. The saving is bounded
by that cost's share of a step: about 60 % of an eager d = 16 step, 15-30 % of a ``torch.compile``-d one
(``benchmarks/bench_train.py --ensemble 4 --compile`` measures it, against one model at k x the batch as well).
Members never mix: every op acts on a member's own slice, the loss is the sum of the members' own token means (so
each member's gradient is that of its own loss), AdamW is elementwise, :class:`~loopscale.model.muon.BatchedMuon`
orthogonalises each member's matrices separately, and gradient clipping uses each member's own global norm.

:func:`train_ensemble` trains the ensemble and returns one :class:`~loopscale.model.train.RunResult` per member,
the same (up to float rounding of the batched ops) as ``train_run(dataclasses.replace(cfg, seed=s, data_seed=ds))``
for that member: same batches in the same order, same init, same optimizer, schedule and evaluation. With Muon /
MuonH that rounding grows over long runs, since Newton-Schulz runs in bf16 (``loopscale.model.muon.NS_DTYPE``):
measured up to 5e-4 relative on the final loss after 512 steps, 4e-8 with NS in fp32.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from loopscale.model.config import LoopedConfig
from loopscale.model.looped import LoopedLM, check_token_ids, maybe_compile

log = logging.getLogger("loopscale.train")

__all__ = ["EnsembleLM", "train_ensemble"]


def _lin(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-member linear map: x [k, ..., d_in], w [k, d_out, d_in] -> [k, ..., d_out] (one ``torch.bmm``)."""
    k = x.shape[0]
    y = torch.bmm(x.reshape(k, -1, x.shape[-1]), w.mT)
    return y.view(*x.shape[:-1], w.shape[1])


def _norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim with a per-member weight w [k, d] (None: weightless); x [k, ..., d]."""
    y = F.rms_norm(x, (x.size(-1),), eps=eps)
    if w is None:
        return y
    return y * w.view(w.shape[0], *([1] * (x.dim() - 2)), w.shape[1]).to(x.dtype)


class EnsembleLM(nn.Module):
    """k LoopedLMs of one config with weights stacked on a leading member dimension.

    Parameter names are LoopedLM's (``recur.0.attn.c_q.weight`` ...), each of shape [k, *LoopedLM shape]; member i
    starts with exactly the weights of ``LoopedLM(cfg, seed=seeds[i])``. ``forward(idx)`` takes token ids
    idx [B, T] (the same batch for every member) or [k, B, T] (one batch per member) and returns soft-capped logits
    [k, B, T, V] (float32 or wider), member i's slice equal to LoopedLM's forward with member i's weights.

    Raises:
        ValueError: ``cfg`` is not a LoopedConfig, ``seeds`` is empty, or ``idx`` has the wrong shape / dtype /
            length or (CPU, eager) ids outside [0, vocab_size) (see :meth:`forward`).
    """

    member_dims = 1
    """Leading dims that index members (``build_optimizers`` gives Muon the [k, m, n] matrices)."""

    def __init__(self, cfg: LoopedConfig, seeds: list[int]):
        super().__init__()
        if not isinstance(cfg, LoopedConfig):
            raise ValueError(f"cfg must be a LoopedConfig, got {type(cfg)!r}")
        seeds = [int(s) for s in seeds]
        if not seeds:
            raise ValueError("seeds must be a non-empty list of init seeds")
        self.cfg, self.seeds, self.k = cfg, seeds, len(seeds)
        holder = LoopedLM(cfg, seed=seeds[0])  # its module tree carries the stacked parameters
        states = [holder.state_dict()] + [LoopedLM(cfg, seed=s).state_dict() for s in seeds[1:]]
        self._roles = {n: role for role, items in holder.param_groups().items() for n, _ in items}
        for name, _ in list(holder.named_parameters()):
            mod_name, _, attr = name.rpartition(".")
            mod = holder.get_submodule(mod_name)
            setattr(mod, attr, nn.Parameter(torch.stack([st[name] for st in states])))
        for name in (
            "wte",
            "norm_emb",
            "prelude",
            "recur",
            "coda",
            "inject",
            "hc",
            "norm_recur",
            "norm_final",
            "lm_head",
        ):
            setattr(self, name, getattr(holder, name))
        self.register_buffer("rope_cos", holder.rope_cos, persistent=False)
        self.register_buffer("rope_sin", holder.rope_sin, persistent=False)

    # --- bookkeeping ---------------------------------------------------------------------------------------

    def param_groups(self) -> dict[str, list[tuple[str, nn.Parameter]]]:
        """LoopedLM's optimizer roles (``matrix``, ``embedding``, ``unembedding``, ``norm``, ``hc``) by name,
        with the stacked [k, ...] parameters."""
        groups: dict[str, list[tuple[str, nn.Parameter]]] = {
            k: [] for k in ("matrix", "embedding", "unembedding", "norm", "hc")
        }
        for name, p in self.named_parameters():
            groups[self._roles[name]].append((name, p))
        return groups

    def member_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Member i's weights as a LoopedLM state dict (detached copies)."""
        return {n: p.detach()[i].clone() for n, p in self.named_parameters()}

    # --- forward -------------------------------------------------------------------------------------------

    def _block(self, blk, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """LoopedLM's Block with per-member weights: x [k, B, T, d] -> [k, B, T, d]."""
        from loopscale.model.looped import apply_rope

        k, B, T, d = x.shape
        at, eps = blk.attn, self.cfg.norm_eps
        H, hd = at.n_heads, at.head_dim
        w_qkv = torch.cat((at.c_q.weight, at.c_k.weight, at.c_v.weight), dim=1)  # [k, 3d, d]
        qkv = _lin(_norm(x, blk.n1.weight, eps), w_qkv).view(k * B, T, 3, H, hd)
        qk = apply_rope(qkv[:, :, :2], cos.to(qkv.dtype), sin.to(qkv.dtype))
        qk = F.rms_norm(qk, (hd,), eps=at.eps)
        q, kk, v = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)
        y = F.scaled_dot_product_attention(q, kk, v, is_causal=True)  # [k B, H, T, hd]
        y = y.transpose(1, 2).reshape(k, B, T, d)
        x = x + _lin(y, at.c_proj.weight)
        h = _lin(_norm(x, blk.n2.weight, eps), blk.mlp.c_fc.weight)
        return x + _lin(F.relu(h).square(), blk.mlp.c_proj.weight)

    def _recur_once(self, u, cos, sin):
        for blk in self.recur:
            u = self._block(blk, u, cos, sin)
        return _norm(u, self.norm_recur.weight, self.cfg.norm_eps)

    def _inject(self, e_in, h):
        mode = self.cfg.injection
        if mode == "linear":
            return e_in + _lin(h, self.inject.weight[:, :, self.cfg.d_model :])
        if mode == "additive":
            return h + e_in
        return h

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits [k, B, T, V] for int64 idx [B, T] (shared) or [k, B, T] (per member); see the class docstring.

        As :meth:`LoopedLM.forward`: int32 is refused, and ids outside [0, cfg.vocab_size) raise ValueError for a
        CPU ``idx`` run eagerly (:func:`~loopscale.model.looped.check_token_ids`; the members' embeddings are one
        [k V, d] table, so an unchecked id >= V would silently read the next member's rows).

        Raises:
            ValueError: wrong shape or dtype, T > cfg.seq_len, or (CPU, eager) an id outside [0, vocab_size).
        """
        cfg, k = self.cfg, self.k
        if idx.dtype != torch.int64 or idx.dim() not in (2, 3) or (idx.dim() == 3 and idx.shape[0] != k):
            raise ValueError(
                f"idx must be an int64 (torch.long) tensor [B, T] or [k={k}, B, T], got {tuple(idx.shape)} "
                f"{idx.dtype}"
            )
        check_token_ids(idx, cfg.vocab_size)
        if idx.dim() == 2:
            idx = idx.unsqueeze(0).expand(k, *idx.shape)
        _, B, T = idx.shape
        if T > cfg.seq_len:
            raise ValueError(
                f"sequence length T={T} exceeds seq_len={cfg.seq_len}; raise seq_len in the config"
            )
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        V, d, eps = cfg.vocab_size, cfg.d_model, cfg.norm_eps
        offs = (torch.arange(k, device=idx.device) * V).view(k, 1, 1)
        x = F.embedding(idx + offs, self.wte.weight.view(k * V, d))  # [k, B, T, d]
        x = _norm(x, self.norm_emb.weight, eps)
        for blk in self.prelude:
            x = self._block(blk, x, cos, sin)
        e = x
        r, n_detached = cfg.r, cfg.r - cfg.bptt_k
        if self.hc is not None:
            hc = self.hc
            lanes = e.unsqueeze(1).expand(k, cfg.hc_lanes, *e.shape[1:])  # [k, K, B, T, d]
            for i in range(r):
                u = torch.einsum("mk,mkbtd->mbtd", hc.alpha[:, i].to(lanes.dtype), lanes)
                s = self._recur_once(u, cos, sin)
                mixed = torch.einsum("mjk,mkbtd->mjbtd", hc.M[:, i].to(lanes.dtype), lanes)
                lanes = mixed + hc.beta[:, i].to(lanes.dtype)[:, :, None, None, None] * s.unsqueeze(1)
            h = lanes.sum(dim=1)
        else:
            h = torch.zeros_like(e) if cfg.injection == "additive" else e
            e_in = _lin(e, self.inject.weight[:, :, :d]) if self.inject is not None else e
            if n_detached > 0:
                with torch.no_grad():
                    for _ in range(n_detached):
                        h = self._recur_once(self._inject(e_in, h), cos, sin)
                h = h.detach()
            for _ in range(n_detached, r):
                h = self._recur_once(self._inject(e_in, h), cos, sin)
        x = h
        for blk in self.coda:
            x = self._block(blk, x, cos, sin)
        logits = _lin(_norm(x, self.norm_final.weight, eps), self.lm_head.weight)  # [k, B, T, V]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        c = cfg.logit_softcap
        return c * torch.tanh(logits / c) if c > 0 else logits


def member_losses(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Per-member cross-entropy [k] (nats/token) of logits [k, B, T, V] against targets [B, T] or [k, B, T]
    (``reduction`` 'mean' over each member's tokens or 'sum')."""
    k, V = logits.shape[0], logits.shape[-1]
    if targets.dim() == 2:
        targets = targets.unsqueeze(0).expand(k, *targets.shape)
    logits = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
    ce = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="none").view(k, -1)
    return ce.mean(1) if reduction == "mean" else ce.sum(1)


class EnsembleLoss(nn.Module):
    """Per-member language-model loss of an :class:`EnsembleLM` as one module (the ensemble's :class:`LMLoss`),
    so that ``torch.compile`` fuses the head, soft-cap and cross-entropy of all members into one graph.

    ``forward(windows, reduction="mean")``: windows [B, T + 1] (one data order for every member) or
    [k, B, T + 1] (one per member) int64 -> :func:`member_losses` [k] in nats/token ('mean') or nats ('sum').

    Raises:
        ValueError: ``windows`` not 2-D or 3-D, or shorter than 2 tokens (no target: the mean would be NaN).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, windows: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if windows.dim() not in (2, 3) or windows.shape[-1] < 2:
            raise ValueError(
                f"EnsembleLoss takes windows [B, T + 1] or [k, B, T + 1] of at least 2 tokens (inputs and their "
                f"next-token targets), got shape {tuple(windows.shape)}"
            )
        return member_losses(self.model(windows[..., :-1]), windows[..., 1:], reduction)


def clip_member_grad_norms_(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip each member's global gradient norm to ``max_norm`` (``torch.nn.utils.clip_grad_norm_`` per member:
    factor min(1, max_norm / (norm + 1e-6))); params are [k, ...]. Returns the norms before clipping [k]."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads])  # [n_params, k]
    total = norms.norm(dim=0)  # [k]
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))
    return total


def _int_seeds(values) -> list:
    """Each value as a Python int when it is an integer of any kind (``int``, numpy or torch integer scalars),
    else None (bools, floats, strings)."""
    import operator

    out = []
    for v in values:
        try:
            out.append(None if isinstance(v, bool) else operator.index(v))
        except TypeError:
            out.append(None)
    return out


def train_ensemble(cfg, seeds: list[int], data_seeds: list[int] | None = None, *, callback=None) -> list:
    """Train ``len(seeds)`` = k members of the run ``cfg`` as one :class:`EnsembleLM` in this process.

    Member i is the run ``dataclasses.replace(cfg, seed=seeds[i], data_seed=data_seeds[i])`` (``cfg.seed`` and
    ``cfg.data_seed`` are ignored; ``data_seeds`` None -> ``cfg.data_seed`` for every member, i.e. the same batch
    order, and one shared batch feeds all members). Its RunResult is what ``train_run`` returns for that run, up to
    float rounding of the batched ops, except: ``wall_s`` and ``time_split`` are the ensemble's (shared),
    ``tokens_per_s`` is per member (its D over the shared training time) and ``mfu`` is the process's
    (k F tokens_per_s / peak).

    Args:
        cfg: the run (a :class:`~loopscale.model.train.RunConfig`).
        seeds: init seeds, one per member (distinct).
        data_seeds: batch-order seeds, one per member, or None.
        callback: called as ``callback(event)`` after every evaluation, once per member, with train_run's keys
            (``step``, ``tokens``, ``train_loss``, ``val_loss``, ``lr``, ``checkpoint_path``, ``final``,
            ``start_tokens``, ``attempt_s``; the final one also ``status``) plus ``member`` (index) and ``seed``; also after every
            checkpoint write.

    Checkpoints: as train_run (``checkpoint_dir``, ``checkpoint_every_steps``, atomic, the newest two kept, resume
    from the newest), one file for the whole ensemble (stacked weights, both optimizers, every member's curve,
    data digest and status); a checkpoint of another run (a single run, other seeds) raises CheckpointError.

    Returns:
        list of k RunResults in the order of ``seeds``; a member that diverges gets status 'diverged' as in
        train_run (the others keep training).

    Raises:
        ValueError: empty or repeated seeds, data_seeds of another length or negative, and train_run's corpus
            errors, all before any training compute.
        CheckpointError: an unusable checkpoint in ``checkpoint_dir`` (unreadable, or of another run).
    """
    from loopscale.model.accounting import flops_per_token
    from loopscale.model.data import WindowSampler
    from loopscale.model.optim import lr_multiplier
    from loopscale.model.train import (
        CHECKPOINT_FORMAT,
        DID_NOT_LEARN,
        RunConfig,
        _newest_readable_checkpoint,
        _prepare,
        _save_newest_two,
        check_run_key,
        checkpoint_key,
        compile_time_note,
        did_not_learn_note,
        ensemble_key,
        make_result,
        peak_flops,
        prediction_logits,
        run_optimizers,
        run_wall,
        throughput,
    )

    t_start = time.perf_counter()
    if not isinstance(cfg, RunConfig):
        raise ValueError(f"cfg must be a RunConfig, got {type(cfg)!r}")
    raw = list(seeds)
    seeds = _int_seeds(raw)
    if not seeds or any(s is None or s < 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {raw!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct (a repeated seed trains the same run twice), got {seeds!r}")
    k = len(seeds)
    raw = None if data_seeds is None else list(data_seeds)
    data_seeds = [cfg.data_seed] * k if raw is None else _int_seeds(raw)
    if len(data_seeds) != k or any(s is None or s < 0 for s in data_seeds):
        raise ValueError(f"data_seeds must be None or {k} integers >= 0 (one per seed), got {raw!r}")
    member_cfgs = [
        dataclasses.replace(cfg, seed=s, data_seed=ds) for s, ds in zip(seeds, data_seeds, strict=True)
    ]
    prep = _prepare(cfg, members=k)
    mcfg, T = cfg.model, cfg.model.seq_len
    device, data, ev_np, epochs, run_warnings = prep.device, prep.data, prep.ev_np, prep.epochs, prep.warnings
    D, B, steps_total, n_micro, mb_windows = prep.D, prep.B, prep.steps, prep.n_micro, prep.micro_windows
    Fpt = flops_per_token(mcfg)
    shared = len(set(data_seeds)) == 1
    samplers = [
        WindowSampler(data.train, T, mb_windows, ds) for ds in (data_seeds[:1] if shared else data_seeds)
    ]
    log.info("ensemble of %d: D=%d tokens, %d steps of %d", k, D, steps_total, B)
    run_key = ensemble_key(checkpoint_key(cfg, D, data.meta["corpus_hash"]), seeds, data_seeds)

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    try:
        model = EnsembleLM(mcfg, seeds).to(device)
        opts, assignment = run_optimizers(model, cfg)
        # the loss (model, head and cross-entropy in one graph) compiled for training steps only (one shape);
        # evaluation runs eager, so no-grad and the last, smaller evaluation chunk do not trigger recompilation
        loss_fn = maybe_compile(EnsembleLoss(model), cfg.compile, device)
        eval_loss = EnsembleLoss(model)
        use_bf16 = cfg.precision == "bf16"

        def autocast():
            return torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16)

        def evaluate() -> list[float]:
            model.eval()
            tot, n = torch.zeros(k, dtype=torch.float64, device=device), 0
            with torch.no_grad():
                for chunk in ev.split(max(1, mb_windows)):
                    with autocast():
                        tot += eval_loss(chunk, "sum").double()
                    n += chunk[:, 1:].numel()
            model.train()
            return (tot / n).tolist()

        ev = torch.from_numpy(ev_np).to(device)
        digests = [hashlib.sha256(b"loopscale-data").hexdigest()] * k
        micro_ids: list[int] = []
        curves: list[list[dict]] = [[] for _ in range(k)]
        best = [None] * k
        status, div_step, losses = ["ok"] * k, [None] * k, [float("nan")] * k
        start_step, resumed_from, wall_before = 0, None, 0.0
        train_before = (0, 0.0)  # (tokens per member, s) of training steps before the checkpoint
        ckpt_path, st = _newest_readable_checkpoint(cfg.checkpoint_dir)  # a torn newest one is moved aside
        if ckpt_path is not None:
            check_run_key(ckpt_path, st["run_key"], run_key)
            model.load_state_dict(st["model"])
            for o, s_ in zip(opts, st["optimizers"], strict=True):
                o.load_state_dict(s_)
            start_step = resumed_from = st["step"]
            micro_ids, digests, curves = list(st["micro_batch_ids"]), list(st["data_digest"]), st["curve"]
            best, status, div_step, losses = (
                st["best_val_loss"],
                st["status"],
                st["diverged_step"],
                st["losses"],
            )
            wall_before = float(st.get("wall_s") or 0.0)  # checkpoints before this field: 0
            train_before = (int(st.get("train_tokens") or 0), float(st.get("train_s") or 0.0))
            log.info("resumed ensemble from %s at step %d", ckpt_path, start_step)
        times = {"data": 0.0, "forward_backward": 0.0, "optimizer": 0.0, "eval": 0.0, "checkpoint": 0.0}
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        log_every = max(1, steps_total // 100)
        params = list(model.parameters())
        cur_lr, tok_trained, t_train = cfg.lr, 0, 0.0
        t_first = None  # this attempt's first step (s): with torch.compile it holds the compilation

        def write_ckpt(done: int):
            t0 = time.perf_counter()
            state = {
                "format": CHECKPOINT_FORMAT,
                "wall_s": wall_before + time.perf_counter() - t_start,
                "train_tokens": int(train_before[0] + tok_trained),
                "train_s": float(train_before[1] + t_train),
                "step": int(done),
                "run_key": run_key,
                "model": model.state_dict(),
                "optimizers": [o.state_dict() for o in opts],
                "micro_batch_ids": list(micro_ids),
                "data_digest": list(digests),
                "curve": curves,
                "best_val_loss": list(best),
                "status": list(status),
                "diverged_step": list(div_step),
                "losses": list(losses),
            }
            return _save_newest_two(cfg.checkpoint_dir, done, state, times, t0)

        def emit(i: int, done: int, val, final: bool, path=None) -> None:
            if callback is None:
                return
            ev_ = {
                "step": done,
                "tokens": done * B,
                "train_loss": losses[i],
                "val_loss": val,
                "lr": cur_lr,
                "checkpoint_path": None if path is None else str(path),
                "final": final,
                "start_tokens": start_step * B,
                "attempt_s": time.perf_counter() - t_loop,
                "member": i,
                "seed": seeds[i],
            }
            callback({**ev_, "status": status[i]} if final else ev_)

        def point(done, i, val):
            return {"step": done, "tokens": done * B, "train_loss": losses[i], "val_loss": val, "lr": cur_lr}

        finals: list[float | None] = [None] * k
        t_loop = time.perf_counter()  # this attempt's first step begins (after data, model and resume)
        model.train()
        for step in range(start_step, steps_total):
            t0 = time.perf_counter()
            mult = lr_multiplier(
                step, steps_total, cfg.schedule, cfg.warmup_frac, cfg.final_lr_frac, cfg.decay_frac
            )
            for o in opts:
                for g in o.param_groups:
                    g["lr"] = g["base_lr"] * mult
            cur_lr = cfg.lr * mult
            acc = torch.zeros(k, device=device)
            t_data = 0.0
            for m in range(n_micro):
                td = time.perf_counter()
                j = step * n_micro + m
                got = [s.micro_batch(j) for s in samplers]
                win = got[0][0] if shared else np.stack([w for w, _ in got])
                x = torch.from_numpy(win).to(device, non_blocking=True)
                for i in range(k):
                    if status[i] == "ok":  # a diverged member's data chain stops where its run stopped
                        ids = got[0 if shared else i][1]
                        digests[i] = hashlib.sha256(digests[i].encode() + ids.tobytes()).hexdigest()
                micro_ids.append(j)
                t_data += time.perf_counter() - td
                with autocast():
                    loss = loss_fn(x) / n_micro  # [k]
                loss.sum().backward()
                acc += loss.detach()
            losses = [
                v if st == "ok" else old for v, st, old in zip(acc.tolist(), status, losses, strict=True)
            ]
            t1 = time.perf_counter()
            times["data"] += t_data
            times["forward_backward"] += t1 - t0 - t_data
            for i in range(k):
                if status[i] == "ok" and (not math.isfinite(losses[i]) or losses[i] > cfg.diverge_loss):
                    status[i], div_step[i] = "diverged", step + 1
                    curves[i].append(point(step + 1, i, None))
                    log.warning("member %d (seed %d) diverged at step %d", i, seeds[i], step + 1)
                    emit(i, step + 1, None, True)
            if "ok" not in status:
                break
            if cfg.grad_clip is not None:
                clip_member_grad_norms_(params, cfg.grad_clip)
            for o in opts:
                o.step()
            for o in opts:
                o.zero_grad(set_to_none=True)
            sync()
            t2 = time.perf_counter()
            times["optimizer"] += t2 - t1
            t_train += t2 - t0
            t_first = t2 - t0 if t_first is None else t_first
            tok_trained += B
            done = step + 1
            # the last step takes the same branches as every other (as train_run): evaluated, logged, checkpointed
            is_last = done == steps_total
            do_eval = is_last or (cfg.eval_every_steps is not None and done % cfg.eval_every_steps == 0)
            do_ckpt = cfg.checkpoint_every_steps is not None and (
                is_last or done % cfg.checkpoint_every_steps == 0
            )
            vals = [None] * k
            if do_eval:
                te = time.perf_counter()
                vals = evaluate()
                times["eval"] += time.perf_counter() - te
            for i in range(k):
                if status[i] != "ok":
                    continue
                if do_eval:
                    best[i] = vals[i] if best[i] is None or vals[i] < best[i] else best[i]
                if is_last:
                    finals[i] = vals[i]
                if do_eval or do_ckpt or done % log_every == 0:
                    curves[i].append(point(done, i, vals[i]))
            path = write_ckpt(done) if do_ckpt else None
            for i in range(k):
                if status[i] == "ok" and (do_eval or path is not None):
                    emit(i, done, vals[i], is_last, path)

        if "ok" in status and all(finals[i] is None for i in range(k) if status[i] == "ok"):
            # resumed from the checkpoint of the last step: nothing left to train, measure again
            te = time.perf_counter()
            vals = evaluate()
            times["eval"] += time.perf_counter() - te
            for i in range(k):
                if status[i] == "ok":
                    finals[i] = vals[i]
                    best[i] = vals[i] if best[i] is None or vals[i] < best[i] else best[i]
                    c = curves[i]
                    if c and c[-1]["step"] == steps_total:
                        c[-1] = {**c[-1], "val_loss": vals[i]}
                    else:
                        c.append(point(steps_total, i, vals[i]))
                    emit(i, steps_total, vals[i], True)
        collapsed = [None] * k  # per member: why it did not learn (not_learned_note, collapse_note), as train_run
        if cfg.lr > 0 and "ok" in status:
            logits = prediction_logits(model, ev, autocast)  # [k, 1, t, V]
            for i in range(k):
                if status[i] == "ok" and (note := did_not_learn_note(finals[i], mcfg.vocab_size, cfg.lr, logits[i])):
                    status[i], collapsed[i] = DID_NOT_LEARN, note
        threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(prev_threads)

    attempt_s = time.perf_counter() - t_start
    wall = run_wall(wall_before, attempt_s, resumed_from, steps_total)  # with the attempts before, as train_run
    peak, peak_src = peak_flops(device, cfg.num_threads, cfg.cache_dir, cfg.precision)
    tps = throughput(train_before, tok_trained, t_train)
    mfu = (k * Fpt * tps / peak) if (peak and math.isfinite(tps) and tps > 0) else None
    compile_note = compile_time_note(cfg, device, tps, tok_trained, t_train, t_first, B)  # per member, as train_run's
    out = []
    for i, mc in enumerate(member_cfgs):
        fv = finals[i]
        n_micro_done = (div_step[i] if div_step[i] is not None else steps_total) * n_micro
        res = make_result(
            mc,
            data,
            D=D,
            steps=steps_total,
            eval_tokens=int(ev_np.shape[0] * T),
            epochs=epochs,
            status=status[i],
            final_val=fv,
            best_val=best[i],
            diverged_step=div_step[i],
            curve=curves[i],
            wall=wall,
            tps=tps,
            mfu=mfu,
            peak=(peak, peak_src),
            times={**times, "total": attempt_s},
            threads=threads_used,
            device=device,
            assignment=assignment,
            micro_ids=micro_ids[:n_micro_done],
            digest=digests[i],
            resumed_from=resumed_from,
            warnings=[*run_warnings, *(n for n in (collapsed[i], compile_note) if n)],  # in train_run's order
        )
        out.append(res)
    return out
