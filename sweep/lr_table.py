"""The LR table of stage 1 (``lr_table.parquet``): its schema, the smoothing of the best LR across sizes, the
loss-vs-LR plots, and reading it back as {(size, r): lr} for the grid."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

DIVERGED_LOSS = 1e9
"""The loss an LR trial reports at its last milestone when its run ended without a finite validation loss (a
finite stand-in, so that ASHA and Optuna rank it last); never drawn or chosen as a loss."""

LR_TABLE_COLUMNS = (
    "size",
    "r",
    "tuned_r",
    "N_unique",
    "N_usage",
    "lr_best",
    "best_val_loss",
    "lr_smoothed",
    "lr",
    "n_trials",
    "n_pruned",
    "budget_tokens",
    "study_name",
    "storage",
)


def _lr_table_schema():
    import pyarrow as pa

    def f(n, t, unit):
        return pa.field(n, t, metadata={"unit": unit})

    return pa.schema(
        [
            f("size", pa.int64(), "-"),
            f("r", pa.int64(), "count"),
            f("tuned_r", pa.int64(), "count (the r the study ran at; N_unique/N_usage are that model's)"),
            f("N_unique", pa.int64(), "parameters"),
            f("N_usage", pa.int64(), "parameters (N_once + r N_rec, applications per token)"),
            f("lr_best", pa.float64(), "-"),
            f("best_val_loss", pa.float64(), "nats/token"),
            f("lr_smoothed", pa.float64(), "-"),
            f("lr", pa.float64(), "-"),
            f("n_trials", pa.int64(), "count"),
            f("n_pruned", pa.int64(), "count"),
            f("budget_tokens", pa.int64(), "tokens"),
            f("study_name", pa.string(), "-"),
            f("storage", pa.string(), "-"),
            f("notes", pa.string(), "JSON list of what tune-lr said of the study: its chosen LR at the edge of the "
                                    "LRs tried, its rejected trials ([] for none; null in older tables)"),
        ],
        metadata={"loopscale.table": "lr_table", "loopscale.schema_version": "1"},
    )


def _smooth(rows: list[dict]) -> None:
    """Fill ``lr_smoothed`` per r with the least-squares line log LR* = a + b log N_unique across sizes
    (needs >= 2 sizes with a best LR; otherwise lr_smoothed = lr_best)."""
    import numpy as np

    for r in sorted({row["r"] for row in rows}):
        pts = [row for row in rows if row["r"] == r and row["lr_best"] is not None]
        if len({row["N_unique"] for row in pts}) >= 2:
            x = np.log([row["N_unique"] for row in pts])
            y = np.log([row["lr_best"] for row in pts])
            b, a = np.polyfit(x, y, 1)
            for row in rows:
                if row["r"] == r:
                    row["lr_smoothed"] = float(np.exp(a + b * np.log(row["N_unique"])))
        else:
            for row in rows:
                if row["r"] == r:
                    row["lr_smoothed"] = row["lr_best"]


def lr_figure(size: int, series: dict[int, list[tuple]]) -> Any:
    """Val loss against LR for one size, one line per r, with at most 5 labelled LR ticks
    (:func:`loopscale.fit.plots.log_ticks`). ``series``: {r: [(lr, loss) or (lr, loss, finished), ...]}; a point
    with ``finished`` False (a trial ASHA stopped before its last milestone, so its loss is from an earlier
    milestone and not comparable with the finished trials' final loss) is drawn as a hollow marker off the line;
    one with ``finished`` ``"failed"`` (a trial that raised, diverged or did not learn: rejected, whatever its
    loss) as a hollow square off the line; a loss that is None or not finite (the trial diverged before any
    finite validation loss) is an x at the top of the axes, so that it does not stretch the loss axis. A
    matplotlib Figure; the caller saves and closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from loopscale.fit.plots import log_ticks

    def finite(v) -> bool:
        return v is not None and math.isfinite(v)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    any_stopped = any_failed = any_diverged = False
    for r, pts in series.items():
        pts = [(p[0], p[1], True if len(p) < 3 else p[2]) for p in pts]  # (lr, loss, finished / "failed")
        done = sorted((x, y) for x, y, st in pts if st is True and finite(y))
        stopped = sorted((x, y) for x, y, st in pts if st is False and finite(y))
        failed = sorted((x, y) for x, y, st in pts if st == "failed" and finite(y))
        diverged = sorted(p[0] for p in pts if not finite(p[1]))
        if not (done or stopped or failed or diverged):
            continue
        (line,) = ax.plot([p[0] for p in done], [p[1] for p in done], "o-", label=f"r={r}")
        if stopped:
            any_stopped = True
            ax.plot([p[0] for p in stopped], [p[1] for p in stopped], "o", mfc="none", color=line.get_color())
        if failed:
            any_failed = True
            ax.plot([p[0] for p in failed], [p[1] for p in failed], "s", mfc="none", color=line.get_color())
        if diverged:
            any_diverged = True
            ax.plot(diverged, [0.97] * len(diverged), "x", color=line.get_color(), transform=ax.get_xaxis_transform())
    ax.set_xscale("log")
    log_ticks(ax.xaxis)
    ax.set_xlabel("learning rate")
    ax.set_ylabel("val loss, last milestone (nats/token)")
    ax.set_title(f"LR tuning, size {size}")
    if any_stopped:
        ax.plot([], [], "o", mfc="none", color="0.4", label="stopped early (loss at\nthe milestone reached)")
    if any_failed:
        ax.plot([], [], "s", mfc="none", color="0.4", label="failed (raised, diverged or\ndid not learn), rejected")
    if any_diverged:
        ax.plot([], [], "x", color="0.4", label="no finite loss (diverged)")
    if any(series.values()):
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _last_real_loss(values: dict[int, float]) -> float | None:
    """The loss at the last milestone with a real one: a diverged trial reports a stand-in loss of 1e9 (a finite
    number for the scheduler) at its end, which is not a loss; None when no milestone has a real one."""
    real = [values[m] for m in sorted(values) if math.isfinite(values[m]) and values[m] < DIVERGED_LOSS]
    return real[-1] if real else None


def _plot(tune_dir: Path, storage_url: str, rows: list[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna

    out = []
    for size in sorted({row["size"] for row in rows}):
        series: dict[Any, list[tuple[float, float, bool]]] = {}
        by_study: dict[str, list[int]] = {}
        for row in [x for x in rows if x["size"] == size]:
            by_study.setdefault(row["study_name"], []).append(int(row["r"]))
        for name, rs in by_study.items():
            study = optuna.load_study(study_name=name, storage=storage_url)
            # one line per study: with tune_per_r false one study (at the largest r) gives every r its LR
            key = rs[0] if len(rs) == 1 else f"{max(rs)} (its LR used for r = {', '.join(map(str, sorted(rs)))})"
            state = {optuna.trial.TrialState.COMPLETE: True, optuna.trial.TrialState.PRUNED: False}
            series[key] = [
                (t.params["lr"], _last_real_loss(t.intermediate_values), state.get(t.state, "failed"))
                for t in study.get_trials(deepcopy=False)
                if t.intermediate_values
            ]
        fig = lr_figure(size, series)
        p = tune_dir / f"loss_vs_lr_size{size}.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        out.append(p)
    return out


def _read_lr_rows(path: Path) -> list[dict]:
    from loopscale.sweep.store import read_table

    return read_table(path, _lr_table_schema()).to_pylist()


def lr_table_present(path: str | Path) -> bool:
    """True when a readable ``lr_table.parquet`` is at ``path``; an unreadable one (torn, 0 bytes) is moved aside
    with a warning and counts as absent, so stage 1 rebuilds it from its finished studies."""
    p = Path(path)
    if p.exists():
        _read_lr_rows(p)
    return p.exists()


def read_lr_table(path: str | Path) -> dict[tuple[int, int], float]:
    """{(size, r): lr} from an ``lr_table.parquet``.

    Raises:
        FileNotFoundError: no table at ``path``, or an unreadable one (moved aside; run ``loopscale tune-lr``:
            it rebuilds the table from the finished studies without training again).
        ValueError: a row without a chosen LR (every trial of that study failed or was pruned).
    """
    p = Path(path)
    if not lr_table_present(p):
        raise FileNotFoundError(f"no LR table at {p}: run `loopscale tune-lr SPEC --out {shlex.quote(str(p.parent))}` first")
    out: dict[tuple[int, int], float] = {}
    for row in _read_lr_rows(p):
        if row["lr"] is None:
            raise ValueError(
                f"lr_table: no LR chosen for size {row['size']}, r {row['r']} (no complete trial)"
            )
        out[(int(row["size"]), int(row["r"]))] = float(row["lr"])
    return out
