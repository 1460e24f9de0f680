"""``loopscale status OUT``: what a run or sweep has done and is doing, read from its files only.

Sources (nothing is trained, started or changed; files are only read):

* ``OUT/spec.yaml`` (written by ``loopscale run``): the planned cells, hence the number of runs;
* ``OUT/runs.parquet`` and ``OUT/parts/runs/*.parquet`` (:mod:`loopscale.sweep.store`): one record per finished or
  failed run, the newest ``finished_at`` per run id;
* ``OUT/logs/progress.json`` (:mod:`loopscale.sweep.console`): the stage a command is in, its counts, tokens/s and ETA,
  its pid and host. A command counts as running while that pid is alive (same host), or, from another host, while
  the file is younger than :data:`STALE_S`;
* Tune's experiment state under the storage (``--storage``; default ``OUT/tune``): the trials of the newest grid
  experiment and their status (``ray.tune.ExperimentAnalysis``);
* ``OUT/run_meta.json`` (stage wall times), ``OUT/lr_table.parquet`` and ``OUT/tune_lr/done/`` (LR tuning),
  ``OUT/fit/analysis.json`` (the fit headline, as ``loopscale run`` prints it).

Run counts: ``ok``, ``diverged`` and ``failed`` from the records; ``running``: runs of RUNNING trials of a live
command without a record; ``pending``: the planned runs left (a stopped command's unfinished runs are pending:
``--resume`` continues them).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import typer

STALE_S = 600.0
"""A progress file of another host older than this (s) means the command is no longer running."""


def fit_headlines(ana: dict) -> list[str]:
    """The last lines ``loopscale run`` prints: per variant with a joint fit, the identification headline (when the
    identification rule gave one, it decides what may be claimed) or phi with its 95 % bootstrap CI, and R^2 with
    what was fitted (runs, or cell means of runs: :func:`loopscale.fit.run_report.fitted_points`)."""
    from loopscale.fit.run_report import fitted_points

    lines = []
    for vname, v in (ana.get("variants") or {}).items():
        j = v.get("joint") or {}
        if "params" not in j:
            continue
        ident = v.get("identification") or {}
        if ident.get("headline"):
            lines.append(f"{vname}: {ident['headline']}; R^2 = {j['r2']:.4f} ({fitted_points(v, j)})")
            continue
        lo, hi = (j.get("ci") or {}).get("phi") or (float("nan"), float("nan"))
        lines.append(
            f"{vname}: phi = {j['params']['phi']:.3f}, 95 % CI [{lo:.3f}, {hi:.3f}], "
            f"R^2 = {j['r2']:.4f} ({fitted_points(v, j)})"
        )
    return lines


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _records(out: Path) -> dict[str, dict]:
    """{run id: newest record} over ``runs.parquet`` and the part files (unreadable files are skipped, not moved)."""
    import pyarrow.parquet as pq

    files = [out / "runs.parquet", *sorted((out / "parts" / "runs").glob("*.parquet"))]
    best: dict[str, dict] = {}
    for f in files:
        if not f.is_file():
            continue
        try:
            rows = pq.read_table(f).to_pylist()
        except Exception:  # a torn file: the writing command moves it aside itself
            continue
        for row in rows:
            cur = best.get(row["run_id"])
            t = row.get("finished_at")
            if cur is None or (t is not None and (cur.get("finished_at") is None or t >= cur["finished_at"])):
                best[row["run_id"]] = row
    return best


def _planned(out: Path):
    """(spec, planned cells) from ``OUT/spec.yaml``, or (None, None) without one."""
    from loopscale.sweep.lr_table import _read_lr_rows
    from loopscale.sweep.spec import load_spec

    path = out / "spec.yaml"
    if not path.is_file():
        return None, None
    try:
        spec = load_spec(path)
    except Exception:
        return None, None
    table = None
    if spec.lr == "tune":
        rows = (out / "lr_table.parquet").is_file() and _read_lr_rows(out / "lr_table.parquet")
        table = {(int(x["size"]), int(x["r"])): float(x["lr"] or 1.0) for x in rows or []} or {
            (s, None): 1.0 for s in spec.all_sizes()
        }
    try:
        return spec, spec.cells(lr_table=table)
    except Exception:
        return spec, None


def _alive(progress: dict | None) -> bool:
    if not progress or progress.get("finished"):
        return False
    if progress.get("host") == socket.gethostname():
        try:
            os.kill(int(progress["pid"]), 0)
            return True
        except (OSError, ValueError, TypeError, KeyError):
            return False
    return time.time() - float(progress.get("updated_at") or 0) < STALE_S


def _tune_state(storage: str, spec_name: str | None) -> dict | None:
    """{"experiment", "trials": {status: count}, "running_ids", "run_ids"} of the newest grid experiment
    (``grid_<spec name>_NNN``; any spec name when None) under ``storage``, or None when there is none."""
    import re

    from loopscale.cluster import storage as st

    pat = re.compile(r"^grid_(?P<name>.+)_(?P<n>\d+)$")
    try:
        if not st.exists(storage):
            return None
        found = [
            (m.group("n"), m.group(0)) for m in (pat.match(Path(x).name) for x in st.listdir(storage)) if m
        ]
    except Exception:
        return None
    found = [(n, x) for n, x in found if spec_name is None or x == f"grid_{spec_name}_{n}"]
    if not found:
        return None
    newest = max(found, key=lambda nx: (int(nx[0]), nx[1]))[1]
    import logging

    from ray import tune

    from loopscale.sweep.grid import trial_cells

    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    try:
        ea = tune.ExperimentAnalysis(st.join(storage, newest))
    except Exception as e:  # no state written yet, or unreadable
        return {"experiment": newest, "error": str(e).splitlines()[0] if str(e) else type(e).__name__}
    trials: dict[str, int] = {}
    running: list[str] = []
    every: list[str] = []
    for t in ea.trials:
        trials[t.status] = trials.get(t.status, 0) + 1
        ids = [c["run_id"] for c in trial_cells(t.config) if "run_id" in c]
        every += ids
        if t.status == "RUNNING":
            running += ids
    return {"experiment": newest, "trials": trials, "running_ids": running, "run_ids": every}


def collect_status(out_dir: str | Path, storage: str | None = None) -> dict:
    """The status of the run directory ``out_dir`` as a dict (what ``loopscale status --json`` prints).

    Keys: ``out``, ``spec``, ``state`` (running | stopped | finished | empty), ``stage``, ``runs`` (total, ok,
    diverged, failed, running, pending), ``failures`` ([{run_id, error}]), ``time`` (stage wall times in s, elapsed
    of the running stage, ``eta_s``), ``progress`` (the live command's progress file), ``tune`` (Tune's trial
    counts), ``lr`` (LR studies done and the LR table rows) and ``fit`` (headline lines).

    Raises:
        FileNotFoundError: ``out_dir`` is not a directory.
    """
    from loopscale.sweep.grid import error_line

    out = Path(out_dir).resolve()
    if not out.is_dir():
        raise FileNotFoundError(f"{out} is not a directory: give the --out folder of a run or sweep")
    meta = _read_json(out / "run_meta.json") or {}
    progress = _read_json(out / "logs" / "progress.json")
    alive = _alive(progress)
    spec, cells = _planned(out)
    recs = _records(out)
    if cells is not None and {c.run_id for c in cells} & set(recs):
        want = {c.run_id for c in cells}
        recs = {k: v for k, v in recs.items() if k in want}
    by = {"ok": 0, "diverged": 0, "failed": 0}
    for r in recs.values():
        by[r["status"]] = by.get(r["status"], 0) + 1
    name = (spec.name if spec is not None else None) or meta.get("spec_name")
    store = (
        storage
        or (spec.storage_path if spec is not None and spec.storage_path else None)
        or str(out / "tune")
    )
    tune_info = _tune_state(store, name)
    running_ids = set((tune_info or {}).get("running_ids") or []) - set(recs) if alive else set()
    if name is None and tune_info:
        name = tune_info["experiment"][len("grid_") :].rsplit("_", 1)[0]
    # without a spec (a `loopscale sweep` folder): the runs recorded and those of the newest Tune experiment
    total = len(cells) if cells is not None else len(set(recs) | set((tune_info or {}).get("run_ids") or []))
    runs = {"total": total, **by, "running": len(running_ids)}
    runs["pending"] = max(0, total - sum(by.values()) - len(running_ids))
    failures = [
        {"run_id": k, "error": error_line(v.get("error") or "failed")}
        for k, v in recs.items()
        if v["status"] == "failed"
    ]
    # LR tuning
    lr: dict = {}
    if spec is not None and spec.lr == "tune":
        rs = sorted(spec.r) if spec.tune.tune_per_r else [max(spec.r)]
        n_done = sum(
            (out / "tune_lr" / "done" / f"size{s}_r{r}.json").is_file() for s in spec.all_sizes() for r in rs
        )
        lr["studies"] = {"done": n_done, "total": len(spec.all_sizes()) * len(rs)}
    if (out / "lr_table.parquet").is_file():
        from loopscale.sweep.lr_table import _read_lr_rows

        keep = ("size", "r", "lr", "best_val_loss", "n_trials", "n_pruned")
        lr["table"] = [{k: row.get(k) for k in keep} for row in _read_lr_rows(out / "lr_table.parquet")]
    ana = _read_json(out / "fit" / "analysis.json")
    fit = fit_headlines(ana) if ana else []
    # stage and state
    if alive:
        stage = {"grid": "sweep"}.get(progress.get("stage"), progress.get("stage"))
    elif spec is not None and spec.lr == "tune" and "table" not in lr:
        stage = "tune-lr"
    elif by["ok"] + by["diverged"] < total:
        stage = "sweep"
    elif not recs and cells is None:
        stage = "none"
    elif spec is None and not meta:  # a `loopscale sweep` / `tune-lr` folder: its work ends with the runs
        stage = "done"
    elif ana is None:
        stage = "fit"
    elif not (out / "report.md").is_file():
        stage = "report"
    else:
        stage = "done"
    state = (
        "running"
        if alive
        else ("finished" if stage == "done" else ("empty" if stage == "none" else "stopped"))
    )
    walls = dict(meta.get("stage_wall_s") or {})
    tm: dict = {"stage_wall_s": walls, "total_s": sum(walls.values())}
    if alive:
        tm["running_stage_s"] = time.time() - float(progress.get("started_at") or time.time())
        tm["total_s"] += tm["running_stage_s"]
        tm["eta_s"] = progress.get("eta_s")
    return {
        "out": str(out),
        "spec": name,
        "state": state,
        "stage": stage,
        "runs": runs,
        "failures": failures,
        "time": tm,
        "progress": progress if alive else None,
        "tune": {k: v for k, v in (tune_info or {}).items() if k not in ("running_ids", "run_ids")} or None,
        "lr": lr or None,
        "fit": fit,
    }


def format_status(st: dict) -> list[str]:
    """The lines ``loopscale status`` prints for :func:`collect_status`'s dict."""
    from collections import Counter

    from loopscale.sweep.console import _fmt_s

    r = st["runs"]
    lines = [f"{st['out']}: {st['spec'] or '?'} — {st['state']}, stage {st['stage']}"]
    lines.append(
        f"runs: {r['total']} planned — {r['ok']} ok, {r['diverged']} diverged, {r['failed']} failed, "
        f"{r['running']} running, {r['pending']} pending"
    )
    if st["failures"]:
        for err, k in Counter(f["error"] for f in st["failures"]).most_common(5):
            lines.append(f"  failed ({k}): {err}")
    tm = st["time"]
    if tm["total_s"]:
        parts = ", ".join(f"{k} {_fmt_s(v)}" for k, v in tm["stage_wall_s"].items())
        eta = f", ETA {_fmt_s(tm['eta_s'])}" if tm.get("eta_s") is not None else ""
        run_s = f", current stage {_fmt_s(tm['running_stage_s'])}" if "running_stage_s" in tm else ""
        lines.append(f"time: {_fmt_s(tm['total_s'])}" + (f" ({parts})" if parts else "") + run_s + eta)
    p = st.get("progress")
    if p and p.get("tokens_per_s"):
        lines.append(f"throughput: {p['tokens_per_s']:,.0f} tokens/s ({p.get('host')}, pid {p.get('pid')})")
    if p and p.get("stage") == "tune-lr":
        tr = p.get("trials") or {}
        best = "; ".join(f"size {s} r {r}: lr {lr:.3g} ({v:.3f})" for s, r, lr, v in p.get("best") or [])
        lines.append(
            f"LR trials: {sum(tr.values())} of {p.get('total')} ({tr.get('PRUNED', 0)} pruned, "
            f"{tr.get('FAIL', 0)} failed)" + (f"; best so far {best}" if best else "")
        )
    if p and p.get("stage") == "bootstrap":
        lines.append(f"bootstrap: {p.get('done')} of {p.get('total')} refits")
    if st.get("tune") and st["tune"].get("trials"):
        tr = ", ".join(f"{k.lower()} {v}" for k, v in sorted(st["tune"]["trials"].items()))
        lines.append(f"tune: {st['tune']['experiment']}: {tr}")
    lr = st.get("lr") or {}
    if "studies" in lr:
        lines.append(f"LR studies: {lr['studies']['done']} of {lr['studies']['total']} done")
    for row in lr.get("table") or []:
        val = f"{row['best_val_loss']:.4f}" if row.get("best_val_loss") is not None else "?"
        lines.append(
            f"  size {row['size']} r {row['r']}: lr {row['lr']} (val {val}, {row['n_trials']} trials, "
            f"{row['n_pruned']} pruned)"
        )
    lines += [f"fit: {h}" for h in st["fit"]]
    return lines


def status_cmd(
    out: Path = typer.Argument(..., help="The --out folder of a `loopscale run`, `sweep` or `tune-lr`."),
    storage: str | None = typer.Option(
        None, "--storage", help="Where the Tune state lives when not in OUT/tune (the run's --storage)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """What a run or sweep has done and is doing: stage, runs per status, failures, time and ETA, LR table, fit."""
    from loopscale.cluster.options import validate_storage

    st = collect_status(out, validate_storage(storage))
    if as_json:
        json.dump(st, sys.stdout, default=str)
        sys.stdout.write("\n")
        return
    for line in format_status(st):
        typer.echo(line)
