"""The results store: ``runs.parquet`` (one row per run) and ``curves.parquet`` (one row per evaluation).

Both tables have an explicit pyarrow schema fixed from the start (:data:`RUNS_SCHEMA`, :data:`CURVES_SCHEMA`),
so a first batch of diverged runs whose losses are all null can never fix a ``null`` column type (apache/arrow
#2782; ``test_all_null_first_batch_does_not_fix_a_null_column_type``). Units live in each field's metadata (key ``unit``), the schema version in the table
metadata (key ``loopscale.schema_version``).

Layouts (both with the same schema):

* parts: ``<root>/parts/runs/<run_id>.parquet`` and ``<root>/parts/curves/<run_id>.parquet``, one file per run,
  written by the driver as each trial finishes (a directory readable with ``pyarrow.dataset``/duckdb/polars);
* consolidated: ``<root>/runs.parquet`` and ``<root>/curves.parquet``, one row per run id (the newest
  ``finished_at`` wins), rebuilt from the parts.

Every file is written atomically (temporary name in the same directory, then rename) and idempotently (writing
the same run again replaces its part; consolidation keys rows by ``run_id``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import uuid
import zoneinfo  # noqa: F401  (for pyarrow's zoned timestamps: a Ctrl-C in its own import of it read as ArrowInvalid)
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loopscale.cluster.storage import LOOK_ONLY

SCHEMA_VERSION = "1"
"""Written into every table's metadata; raised only when a column changes meaning or type. Columns added since
version 1 (``lr_data_factor``, ``orthogonalization``, ``corpus_sha256``, ``ensemble_size``, ``compiled``, ``warnings``,
``error``) are read as null from an older table, so they left it at ``"1"``."""


def _f(name: str, typ: pa.DataType, unit: str, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable, metadata={"unit": unit, "doc": doc})


_TS = pa.timestamp("us", tz="UTC")

RUNS_SCHEMA = pa.schema(
    [
        _f(
            "run_id",
            pa.string(),
            "-",
            "stable hash of the run definition (loopscale.sweep.spec.run_id)",
            False,
        ),
        _f(
            "variant",
            pa.string(),
            "-",
            "baseline | trunc_bptt | hyperconnect (r = 1 runs are 'baseline')",
            False,
        ),
        _f("r", pa.int64(), "count", "recurrences of the shared block", False),
        _f("size", pa.int64(), "-", "grid size as written in the spec (d_model or width scale s)"),
        _f("d_model", pa.int64(), "count", "residual width d"),
        _f("n_prelude", pa.int64(), "layers", "unique layers before the loop"),
        _f("n_recur_block", pa.int64(), "layers", "layers in the shared block"),
        _f("n_coda", pa.int64(), "layers", "unique layers after the loop"),
        _f("effective_depth", pa.int64(), "layers", "n_prelude + r n_recur_block + n_coda"),
        _f("injection", pa.string(), "-", "linear | additive | passthrough | hyperconnect"),
        _f("bptt_k", pa.int64(), "count", "recurrences that carry gradient (= r for full BPTT)"),
        _f("hc_lanes", pa.int64(), "count", "hyperconnection lanes K (null for a run without hyperconnections)"),
        _f("seq_len", pa.int64(), "tokens", "context length T"),
        _f("vocab_size", pa.int64(), "tokens", "vocabulary size V"),
        _f("N_once", pa.int64(), "parameters", "unique non-embedding params run once (prelude, coda, norms)"),
        _f("N_rec", pa.int64(), "parameters", "unique params of the shared block plus injection"),
        _f("N_unique", pa.int64(), "parameters", "N_once + N_rec"),
        _f("flops_per_token", pa.float64(), "FLOPs/token", "training FLOPs per token (forward + backward)"),
        _f("D", pa.int64(), "tokens", "training tokens of the run (steps * batch_tokens, after the budget's "
           "rounding to whole steps; a diverged run keeps the D it was defined with)"),
        _f("C", pa.float64(), "FLOPs", "training FLOPs of the run, flops_per_token * D (a diverged run spent less)"),
        _f("budget", pa.float64(), "FLOPs", "the cell's iso-FLOP budget C (null in tokens mode)"),
        _f("target_tokens", pa.int64(), "tokens", "the cell's token budget (null in iso-FLOP mode)"),
        _f("lr", pa.float64(), "-", "peak learning rate"),
        _f("lr_data_factor", pa.float64(), "-", "muon / muonh: the matrix groups trained at lr * lr_data_factor "
           "(the spec's lr_data_exponent transfer to this D); 1 otherwise; null in tables written before it was "
           "recorded"),
        _f("optimizer", pa.string(), "-", "adamw | muon | muonh"),
        _f("orthogonalization", pa.string(), "-", "newton_schulz | polar_express: how muon / muonh orthogonalised "
           "the update; null for adamw and in tables written before it was recorded"),
        _f("schedule", pa.string(), "-", "LR schedule"),
        _f("batch_tokens", pa.int64(), "tokens", "tokens per optimizer step"),
        _f("seed", pa.int64(), "-", "model/init seed"),
        _f("data_seed", pa.int64(), "-", "data order seed"),
        _f("corpus", pa.string(), "-", "training corpus"),
        _f("corpus_sha256", pa.string(), "-", "content hash of the corpus the run read (its files, or the embedded manifest)"),
        _f("tokenizer", pa.string(), "-", "tokenizer"),
        _f("status", pa.string(), "-", "ok | diverged | did_not_learn (final loss not below ln V, or a model "
           "collapsed to one prediction; fits leave it out) | failed", False),
        _f("error", pa.string(), "-", "status failed: the trial's last error (it errored past max_failures)"),
        _f("final_val_loss", pa.float64(), "nats/token", "validation loss at the end (null if diverged)"),
        _f("best_val_loss", pa.float64(), "nats/token", "lowest validation loss seen (null if none)"),
        _f("tokens_per_s", pa.float64(), "tokens/s", "training throughput"),
        _f("mfu", pa.float64(), "fraction", "model FLOPs utilisation (null when the peak is unknown)"),
        _f("wall_s", pa.float64(), "s", "wall time of the run"),
        _f("epochs", pa.float64(), "epochs", "passes over the training tokens that D implies"),
        _f("num_threads", pa.int64(), "threads", "torch threads used (= CPUs given to the trial)"),
        _f("host", pa.string(), "-", "host that finished the run"),
        _f("trial_id", pa.string(), "-", "Ray Tune trial id (null outside Tune)"),
        _f("ensemble_size", pa.int64(), "count", "runs trained together as one seed ensemble, this one included "
           "(1: a single run; they share wall_s); null in tables written before it was recorded"),
        _f("compiled", pa.bool_(), "-", "training steps ran torch.compile-d (training.compile, not fallen back to eager "
           "for want of a C++ compiler); null in tables written before it was recorded"),
        _f("warnings", pa.string(), "JSON", "the trainer's warnings about the run as a JSON list of strings (data "
           "repeated, compilation counted in tokens_per_s, compile fallen back to eager, ...; [] for none); null for "
           "a failed run and in tables written before it was recorded"),
        _f("started_at", _TS, "UTC", "start of the (last) attempt"),
        _f("finished_at", _TS, "UTC", "end of the run"),
        _f("versions", pa.string(), "JSON", "library versions as a JSON object"),
    ],
    metadata={"loopscale.schema_version": SCHEMA_VERSION, "loopscale.table": "runs"},
)
"""Schema of ``runs.parquet`` (version :data:`SCHEMA_VERSION`); every loss/metric column is nullable."""


def _record_class() -> type:
    """:class:`RunRecord`, one field per column of :data:`RUNS_SCHEMA` (same names, same order; the Python type
    follows the Arrow type), so the schema stays the single declaration of what a run record holds."""
    py = {pa.string(): str, pa.int64(): int, pa.float64(): float, pa.bool_(): bool, _TS: datetime}

    def __post_init__(self) -> None:
        for f in RUNS_SCHEMA:
            if not f.nullable and getattr(self, f.name) is None:
                raise ValueError(f"RunRecord.{f.name} must not be null")

    def to_row(self) -> dict:
        """The ``runs.parquet`` row (column name -> value)."""
        return {f.name: getattr(self, f.name) for f in RUNS_SCHEMA}

    cls = dataclasses.make_dataclass(
        "RunRecord",
        [(f.name, py[f.type] | None, dataclasses.field(default=None)) for f in RUNS_SCHEMA],
        namespace={"__post_init__": __post_init__, "to_row": to_row},
        frozen=True,
        kw_only=True,
    )
    cls.__module__ = __name__
    cls.__doc__ = (
        "One finished (or failed) run as the sweep hands it on: a row of ``runs.parquet`` with the units of "
        ":data:`RUNS_SCHEMA`. Built only by :func:`run_record` / :func:`failed_record`; frozen."
    )
    return cls


RunRecord = _record_class()

CURVES_SCHEMA = pa.schema(
    [
        _f("run_id", pa.string(), "-", "run id", False),
        _f("step", pa.int64(), "steps", "optimizer step", False),
        _f("tokens", pa.int64(), "tokens", "tokens trained so far"),
        _f("train_loss", pa.float64(), "nats/token", "training loss at this step"),
        _f("val_loss", pa.float64(), "nats/token", "validation loss (null when not evaluated)"),
        _f("lr", pa.float64(), "-", "learning rate at this step: the run's lr times the schedule's multiplier "
           "(muon / muonh: the matrix groups train at this times the run's lr_data_factor)"),
    ],
    metadata={"loopscale.schema_version": SCHEMA_VERSION, "loopscale.table": "curves"},
)
"""Schema of ``curves.parquet``."""


def to_table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) → a table with exactly ``schema`` (missing keys become null).

    Raises:
        ValueError: a row has a key that is not in the schema, or a non-nullable field is missing.
    """
    names = set(schema.names)
    for i, row in enumerate(rows):
        extra = set(row) - names
        if extra:
            raise ValueError(
                f"row {i} has keys not in the {schema.metadata[b'loopscale.table'].decode()} schema: "
                f"{sorted(extra)}"
            )
        for f in schema:
            if not f.nullable and row.get(f.name) is None:
                raise ValueError(f"row {i}: field {f.name!r} must not be null")
    return pa.Table.from_pylist([{n: row.get(n) for n in schema.names} for row in rows], schema=schema)


def write_table_atomic(table: pa.Table, path: str | Path) -> Path:
    """Write ``table`` to ``path`` as Parquet (zstd) via a temporary file in the same folder and a rename."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return p


def read_table(path: str | Path, schema: pa.Schema, *, skip: frozenset[Path] | set[Path] = frozenset()) -> pa.Table:
    """Read a file or a directory of parts with ``schema`` (an empty table when nothing is there); the parts in
    ``skip`` are not read.

    A file that cannot be read (0 bytes or torn by a crash, not Parquet, a foreign schema) is moved aside with a
    warning (:func:`loopscale.cluster.storage.move_aside`) and read as absent, so the runs it held count as
    unfinished and are re-recorded or retrained instead of blocking the command."""
    p = Path(path)
    if not p.exists():
        return schema.empty_table()
    files = [f for f in sorted(p.glob("*.parquet")) if f not in skip] if p.is_dir() else [p]
    tables = [t for t in (_read_or_aside(f, schema) for f in files) if t is not None]
    return pa.concat_tables(tables) if tables else schema.empty_table()


_LOOK_ONLY = LOOK_ONLY  # inside look_only (this thread or task only): the list where unreadable files are noted

@contextlib.contextmanager
def look_only() -> Iterator[list[str]]:
    """While the block runs, reading the folder's files moves nothing: an unreadable results table, LR table or JSON
    file (:func:`loopscale.cluster.storage.move_aside`) is read as absent and described in the list yielded (what
    ``loopscale run --dry-run`` and ``loopscale status`` report; the command itself would move it aside). A foreign
    table is still refused (:class:`ForeignTableError`)."""
    seen: list[str] = []
    token = _LOOK_ONLY.set(seen)
    try:
        yield seen
    finally:
        _LOOK_ONLY.reset(token)


class ForeignTableError(ValueError):
    """A Parquet file under a loopscale results name (runs.parquet, curves.parquet, their parts: a schema with
    ``run_id``) that is readable but lacks a column every such table has (:data:`RESULTS_TABLE_KEYS`): someone
    else's table, which is neither read as runs nor moved aside. ``path``, ``lacks`` (the missing columns) and
    ``columns`` (the file's) say which."""

    def __init__(self, path: Path, lacks: list[str], columns: list[str]):
        self.path, self.lacks, self.columns = Path(path), list(lacks), list(columns)
        super().__init__(
            f"{path} is not a loopscale results table (no {' or '.join(lacks)} column; its columns: "
            f"{self.shown_columns}): it is not from a loopscale command; give another --out, or move it away "
            "(nothing was changed)"
        )

    @property
    def shown_columns(self) -> str:
        """The file's first 10 columns, comma-separated (``...`` when there are more; ``none`` without any)."""
        return (", ".join(self.columns[:10]) + (", ..." if len(self.columns) > 10 else "")) or "none"


RESULTS_TABLE_KEYS = ("run_id", "status", "step")
"""The columns a results table has when its schema has them: ``run_id`` and ``status`` (runs), ``run_id`` and
``step`` (curves); a file without them is not a loopscale results table (:class:`ForeignTableError`)."""


def _read_or_aside(path: Path, schema: pa.Schema, *, footer_only: bool = False) -> pa.Table | None:
    """``path`` read with ``schema``; None when unreadable (moved aside with a warning, or only noted inside
    :func:`look_only`). ``footer_only``: only its schema and footer are read (a truncated file has none) and an empty
    table is returned: a cheap check that the file is there and whole.

    Raises:
        ForeignTableError: the file reads as Parquet but lacks a column every results table of its kind has
            (:data:`RESULTS_TABLE_KEYS`; reading it with ``schema`` gave rows of nulls, taken for one run with no
            id)."""
    from loopscale.cluster.storage import move_aside

    try:
        names = pq.read_schema(path).names
        if "run_id" in schema.names:  # a results table (not e.g. the LR table)
            lacks = [c for c in RESULTS_TABLE_KEYS if c in schema.names and c not in names]
            if lacks:
                raise ForeignTableError(path, lacks, names)
        if footer_only:
            pq.read_metadata(path)
            return schema.empty_table()
        return pq.read_table(path, schema=schema)
    except ForeignTableError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if (seen := _LOOK_ONLY.get()) is not None:
            then = ("count its runs as unfinished" if "run_id" in schema.names else
                    "read it as absent (tune-lr rebuilds the LR table from its finished studies)")  # fmt: skip
            seen.append(f"{path} is unreadable ({reason}): the command would move it aside and {then}")
        else:
            move_aside(str(path), reason)
        return None


def _utc(x: Any) -> datetime | None:
    if x is None:
        return None
    if isinstance(x, datetime):
        return x if x.tzinfo else x.replace(tzinfo=UTC)
    if isinstance(x, int | float):
        return datetime.fromtimestamp(float(x), tz=UTC)
    return datetime.fromisoformat(str(x))


def _num(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if x == x and abs(x) != float("inf") else None


FAILED = "failed"
"""Status of a run whose trial errored past ``max_failures`` (its row carries the error, no measurements)."""


def failed_record(cell, error: str, *, trial_id: str | None = None, finished_at: Any = None) -> RunRecord:
    """The ``runs.parquet`` row of a cell whose trial errored past its retries: the cell's coordinates and
    configuration, status ``failed`` and ``error`` (the last error's text), no losses or counts."""
    return run_record(cell, {"status": FAILED, "error": error}, trial_id=trial_id, finished_at=finished_at)


def run_record(
    cell,
    result: dict,
    *,
    trial_id: str | None = None,
    host: str | None = None,
    started_at: Any = None,
    finished_at: Any = None,
) -> RunRecord:
    """The record of one run, from its grid cell and its ``RunResult.to_dict()`` (the one place a trainer result
    becomes a run record).

    Model fields come from the cell's config; counts (N_once, N_rec, N_unique, flops_per_token, D, C), losses
    and timings from the result. Non-finite losses are stored as null. A result that names the attempt which
    trained it (``result["attempt"]``: ``trial_id``, ``host``, ``started_at``, ``finished_at``, written by the grid
    trainable) is recorded with those, over the arguments: a run re-recorded from its stored result keeps them.
    """
    attempt = result.get("attempt") or {}
    trial_id = attempt.get("trial_id") or trial_id
    host = attempt.get("host") or host
    started_at = attempt.get("started_at") or started_at
    finished_at = attempt.get("finished_at") or finished_at
    run = cell.run
    md = run.model.to_dict()
    versions = result.get("versions")
    rid = cell.run_id
    row = {
        "run_id": rid,
        "variant": cell.variant,
        "r": int(md["r"]),
        "size": int(cell.size),
        "d_model": int(md["d_model"]),
        "n_prelude": int(md["n_prelude"]),
        "n_recur_block": int(md["n_recur_block"]),
        "n_coda": int(md["n_coda"]),
        "effective_depth": int(md["n_prelude"] + md["r"] * md["n_recur_block"] + md["n_coda"]),
        "injection": md.get("injection"),
        "bptt_k": md.get("bptt_k"),
        "hc_lanes": md.get("hc_lanes") if md.get("injection") == "hyperconnect" else None,  # no lanes: null
        "seq_len": md.get("seq_len"),
        "vocab_size": md.get("vocab_size"),
        "N_once": result.get("N_once"),
        "N_rec": result.get("N_rec"),
        "N_unique": result.get("N_unique"),
        "flops_per_token": _num(result.get("flops_per_token")),
        "D": result.get("D"),
        "C": _num(result.get("C")),
        "budget": cell.budget,
        "target_tokens": run.tokens,
        "lr": float(run.lr),
        "lr_data_factor": float(run.lr_data_factor),
        "optimizer": run.optimizer,
        "orthogonalization": None if run.optimizer == "adamw" else run.orthogonalization,
        "schedule": run.schedule,
        "batch_tokens": run.batch_tokens,
        "seed": run.seed,
        "data_seed": run.data_seed,
        "corpus": run.corpus,
        "corpus_sha256": result.get("corpus_hash"),
        "tokenizer": run.tokenizer,
        "status": result.get("status", "ok"),
        "error": result.get("error"),
        "final_val_loss": _num(result.get("final_val_loss")),
        "best_val_loss": _num(result.get("best_val_loss")),
        "tokens_per_s": _num(result.get("tokens_per_s")),
        "mfu": _num(result.get("mfu")),
        "wall_s": _num(result.get("wall_s")),
        "epochs": _num(result.get("epochs")),
        "num_threads": result.get("num_threads"),
        "host": host,
        "trial_id": trial_id,
        # a seed-ensemble trial adds {"group_id", "members"} to each member's result (loopscale.sweep.grid)
        "ensemble_size": None if "D" not in result else int((result.get("ensemble") or {}).get("members", 1)),
        "compiled": None if result.get("compiled") is None else bool(result["compiled"]),
        "warnings": None if result.get("warnings") is None else json.dumps([str(w) for w in result["warnings"]]),
        "started_at": _utc(started_at),
        "finished_at": _utc(finished_at) or datetime.now(UTC),
        "versions": json.dumps(versions, sort_keys=True) if versions is not None else None,
    }
    return RunRecord(**row)


def curve_rows(rid: str, curve: list[dict] | None) -> list[dict]:
    """``curves.parquet`` rows of one run from ``RunResult.curve`` (dicts with step/tokens/train_loss/val_loss/lr):
    exactly one row per step, in step order. A step listed twice (e.g. logged, then evaluated; or replayed after
    a resume) becomes one row: later values win, a null never replaces a value."""
    rows = [
        {
            "run_id": rid,
            "step": int(pt["step"]),
            "tokens": None if pt.get("tokens") is None else int(pt["tokens"]),
            "train_loss": _num(pt.get("train_loss")),
            "val_loss": _num(pt.get("val_loss")),
            "lr": _num(pt.get("lr")),
        }
        for pt in curve or []
    ]
    return one_row_per_step(rows)


def one_row_per_step(rows: list[dict]) -> list[dict]:
    """Curve rows merged to one per (run_id, step), sorted by (run_id, step): later rows win, but a null never
    replaces a value (a step logged without validation and then evaluated keeps its val_loss)."""
    by_key: dict[tuple[str, int], dict] = {}
    for row in rows:
        key = (row["run_id"], int(row["step"]))
        prev = by_key.get(key)
        if prev is not None:
            row = {k: prev.get(k) if v is None else v for k, v in row.items()}
        by_key[key] = row
    return [by_key[k] for k in sorted(by_key)]


class ResultsStore:
    """The Parquet results of one sweep output directory (see the module docstring for the layouts).

    Args:
        root: output directory (created on first write).

    Raises:
        ValueError: ``root`` is an existing file (e.g. the folder's ``runs.parquet`` itself, where a store read
            nothing and said so nowhere): give its folder.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        if self.root.is_file():
            hint = (f"; give its folder, ResultsStore({str(self.root.parent)!r})"
                    if self.root.name in ("runs.parquet", "curves.parquet") else "")
            raise ValueError(f"ResultsStore: {str(self.root)!r} is a file, not a run folder{hint}")

    @property
    def runs_path(self) -> Path:
        return self.root / "runs.parquet"

    @property
    def curves_path(self) -> Path:
        return self.root / "curves.parquet"

    @property
    def runs_parts(self) -> Path:
        return self.root / "parts" / "runs"

    @property
    def curves_parts(self) -> Path:
        return self.root / "parts" / "curves"

    def write_run(self, record: RunRecord, curve: list[dict] | None = None) -> None:
        """Write (or replace) the part files of one run: its ``runs`` row and its curve rows."""
        rid = record.run_id
        # the runs part is written last: it marks the run as recorded (see _drop_orphan_parts)
        write_table_atomic(to_table(curve or [], CURVES_SCHEMA), self.curves_parts / f"{rid}.parquet")
        write_table_atomic(to_table([record.to_row()], RUNS_SCHEMA), self.runs_parts / f"{rid}.parquet")

    def completed_ids(self) -> set[str]:
        """Run ids with a finished record (status ok, diverged or did_not_learn) in the parts or the consolidated
        file; a ``failed`` record does not count (a later sweep retries the cell and replaces it)."""
        return {row["run_id"] for row in self._latest().values() if row["status"] != FAILED}

    def recorded(self) -> dict[str, dict]:
        """{run id: its newest record} of every run with a record (ok, diverged or failed)."""
        return self._latest()

    def corpus_hashes(self) -> dict[str, int]:
        """{corpus content hash: number of runs} over the finished (ok or diverged) records that name one (records
        written before the ``corpus_sha256`` column existed name none)."""
        out: dict[str, int] = {}
        for row in self._latest().values():
            if row["status"] != FAILED and row.get("corpus_sha256"):
                out[row["corpus_sha256"]] = out.get(row["corpus_sha256"], 0) + 1
        return out

    def _latest(self) -> dict[str, dict]:
        """{run id: its newest record (largest ``finished_at``)} over the parts and the consolidated file (parts
        without their curves are dropped first: see :meth:`_drop_orphan_parts`)."""
        orphans = self._drop_orphan_parts()
        runs = pa.concat_tables(
            [read_table(self.runs_path, RUNS_SCHEMA), read_table(self.runs_parts, RUNS_SCHEMA, skip=orphans)]
        )
        best: dict[str, dict] = {}
        for row in runs.to_pylist():
            cur = best.get(row["run_id"])
            if cur is None or (row["finished_at"] or datetime.min.replace(tzinfo=UTC)) >= (
                cur["finished_at"] or datetime.min.replace(tzinfo=UTC)
            ):
                best[row["run_id"]] = row
        return best

    def _drop_orphan_parts(self) -> set[Path]:
        """A runs part whose curves part is missing or unreadable (a crash between the two writes, a torn file)
        is moved aside: its run then counts as unfinished and is re-recorded from its stored result. Inside
        :func:`look_only` such a part is only noted and left in place, and a curves part counts as readable when its
        footer is (it is not read in full: ``loopscale status`` on thousands of runs). Returns the orphan runs parts
        (moved aside, or left in place inside :func:`look_only`), which the caller must not read as records."""
        from loopscale.cluster.storage import move_aside

        orphans: set[Path] = set()
        if not self.runs_parts.is_dir():
            return orphans
        look = _LOOK_ONLY.get() is not None  # status and the dry run: the footer says the part is there and whole
        for part in sorted(self.runs_parts.glob("*.parquet")):
            cpart = self.curves_parts / part.name
            if cpart.exists() and _read_or_aside(cpart, CURVES_SCHEMA, footer_only=look) is not None:
                continue
            why = f"its curves part {cpart} is missing or unreadable"
            orphans.add(part)
            if (seen := _LOOK_ONLY.get()) is not None:
                seen.append(f"{part}: {why}: the command would move it aside and count its run as unfinished")
            else:
                move_aside(str(part), why)
        return orphans

    def forget(self, run_ids: set[str]) -> None:
        """Drop the records of ``run_ids`` (used by ``--force``) from the parts and the consolidated files."""
        for rid in run_ids:
            for d in (self.runs_parts, self.curves_parts):
                (d / f"{rid}.parquet").unlink(missing_ok=True)
        for path, schema in ((self.runs_path, RUNS_SCHEMA), (self.curves_path, CURVES_SCHEMA)):
            if path.exists():
                t = read_table(path, schema)
                keep = [rid not in run_ids for rid in t.column("run_id").to_pylist()]
                write_table_atomic(t.filter(pa.array(keep, pa.bool_())), path)

    def set_aside(self, run_ids: set[str], dest: Path) -> None:
        """``--force``: copy the records files (``runs.parquet``, ``curves.parquet``, ``parts/``) into ``dest``, then
        drop the records of ``run_ids`` here (:meth:`forget`); the earlier records stay whole in ``dest``."""
        import shutil

        dest.mkdir(parents=True, exist_ok=True)
        for path in (self.runs_path, self.curves_path):
            if path.exists():
                shutil.copy2(path, dest / path.name)
        if (self.root / "parts").is_dir():
            shutil.copytree(self.root / "parts", dest / "parts", dirs_exist_ok=True)
        self.forget(run_ids)

    def consolidate(self) -> Path:
        """Rebuild ``runs.parquet`` and ``curves.parquet`` from the parts and the existing files: one row per
        run id (the newest ``finished_at`` wins), sorted by (variant, budget, size, r, seed). Returns the
        path of ``runs.parquet``."""
        best = self._latest()
        ordered = sorted(
            best.values(),
            key=lambda x: (
                x["variant"],
                x["budget"] or 0.0,
                x["target_tokens"] or 0,
                x["size"] or 0,
                x["r"],
                x["seed"] or 0,
            ),
        )
        write_table_atomic(to_table(ordered, RUNS_SCHEMA), self.runs_path)
        # curves: parts win over the old consolidated file for a run id
        old = read_table(self.curves_path, CURVES_SCHEMA)
        parts = read_table(self.curves_parts, CURVES_SCHEMA)
        part_ids = set(parts.column("run_id").to_pylist())
        keep_ids = set(best)
        old_rows = [r for r in old.to_pylist() if r["run_id"] not in part_ids and r["run_id"] in keep_ids]
        new_rows = [r for r in parts.to_pylist() if r["run_id"] in keep_ids]
        crow = one_row_per_step(old_rows + new_rows)
        write_table_atomic(to_table(crow, CURVES_SCHEMA), self.curves_path)
        return self.runs_path

    def is_consolidated(self) -> bool:
        """True when ``runs.parquet`` exists and holds the newest record of every run (no part is newer): a stop
        between a run's part and :meth:`consolidate` (a SIGKILL, or a Ctrl-C just after the grid's last run) leaves
        records in the parts only."""
        return self.runs_path.exists() and not self.in_parts_only()

    def in_parts_only(self, latest: dict[str, dict] | None = None) -> set[str]:
        """Run ids whose newest record (``latest``, :meth:`recorded` when None) is not in ``runs.parquet``: missing
        there, or newer than its row there (:meth:`consolidate` writes them)."""
        have = {row["run_id"]: row["finished_at"] for row in self.runs().to_pylist()}
        latest = self._latest() if latest is None else latest
        return {rid for rid, row in latest.items() if rid not in have or have[rid] != row["finished_at"]}

    def runs(self) -> pa.Table:
        """The consolidated runs table (empty with the fixed schema when there is none yet)."""
        return read_table(self.runs_path, RUNS_SCHEMA)

    def curves(self) -> pa.Table:
        """The consolidated curves table."""
        return read_table(self.curves_path, CURVES_SCHEMA)


REPORT_OUTPUTS = ("fit", "report.md", "loss_vs_compute.png")
"""The fit and report outputs of a run folder that describe its runs (moved aside with them by ``--force``, and by
a ``run`` that refits a finished fit)."""


def move_report_outputs(out: Path, aside: Path) -> list[str]:
    """Move the :data:`REPORT_OUTPUTS` that ``out`` holds into the folder ``aside`` (one folder below ``out``), with
    the edited reports kept beside report.md (:data:`loopscale.fit.run_report.KEPT_REPORTS`: notes on the fit that
    moves, whose figures they show), and relink the moved reports' figures that stayed behind
    (:func:`relink_moved_report`); returns the names moved."""
    import shutil

    from loopscale.fit.run_report import KEPT_REPORTS

    kept = sorted(p.name for prefix in KEPT_REPORTS for p in out.glob(f"{prefix}_*.md"))
    moved = [n for n in REPORT_OUTPUTS if (out / n).exists()] + kept
    for n in moved:
        shutil.move(str(out / n), str(aside / n))
    for n in ("report.md", *kept):
        relink_moved_report(aside / n, moved)
    return moved


def relink_moved_report(report: Path, moved: list[str]) -> None:
    """A report moved one folder down with the files in ``moved`` (``earlier_fit_<time>/``, ``earlier_<time>/``): its figure links to
    files that stayed behind (``tune_lr/loss_vs_lr_size*.png``) get a ``../`` so that the kept report still shows
    them; links into what moved with it are left as they are. No-op without ``report``."""
    import re

    if not report.is_file():
        return
    own = tuple(n.rstrip("/") for n in moved)

    def fix(m: re.Match) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("/", "../")) or target.split("/", 1)[0] in own:
            return m.group(0)
        return f"{m.group(1)}../{target})"

    try:
        text = report.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # an edited report in an editor's own encoding: left byte for byte
        return
    report.write_text(re.sub(r"(!\[[^\]]*\]\()([^)\s]+)\)", fix, text), encoding="utf-8")


def set_aside_forced(out: str | Path, storage_uri: str, run_ids: set[str], workspace_ids: set[str]) -> str | None:
    """``sweep --force``: move what the earlier runs ``run_ids`` wrote into ``<out>/earlier_<UTC time>/`` instead of
    deleting it — their records (a copy of ``runs.parquet``, ``curves.parquet`` and ``parts/`` as they were, then
    dropped here), their stored checkpoints and ``result.json`` (``workspace_ids``: the run ids and ensemble group
    ids; into ``checkpoints/`` there, or ``<storage>/earlier_<UTC time>/checkpoints/`` for a remote storage) and the
    fit and report outputs that describe them (:data:`REPORT_OUTPUTS`). Returns the line to print (how many finished
    runs' records went where), or None when none of them had written anything."""

    from loopscale.cluster import storage
    from loopscale.sweep.workspace import RunWorkspace

    out = Path(out)
    store = ResultsStore(out)
    recorded = set(store.recorded()) & run_ids
    spaces = {wid: RunWorkspace(storage_uri, wid) for wid in sorted(workspace_ids)}
    finished = (store.completed_ids() & run_ids) | {w for w in run_ids if w in spaces and spaces[w].result()}
    aside = storage.new_aside_folder(out, "earlier")
    name = aside.name
    if recorded:
        store.set_aside(run_ids, aside)
    moved = 0
    for wid, ws in spaces.items():
        dest = str(aside / "checkpoints" / wid) if ws.local else storage.join(storage_uri, name, "checkpoints", wid)
        moved += ws.move_to(dest)
    if not recorded and not moved:
        aside.rmdir()
        return None
    reports = move_report_outputs(out, aside)
    where = str(aside)
    if not all(ws.local for ws in spaces.values()):
        where += f" (checkpoints: {storage.join(storage_uri, name)})"
    also = f" and the fit/report outputs that describe them ({', '.join(reports)})" if reports else ""
    return (
        f"--force: the records of {len(finished)} finished run{'s' if len(finished) != 1 else ''} (runs.parquet, "
        f"curves.parquet, parts/, checkpoints, result.json){also} were moved to {where}; nothing was deleted"
    )
