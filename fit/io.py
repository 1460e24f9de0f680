"""Read and validate fit tables (Parquet, CSV, pandas DataFrame or pyarrow Table).

Input contract (from the sweep's ``runs.parquet``): columns ``loss`` (nats/token; ``final_val_loss`` is accepted when
``loss`` is absent), ``D`` (training tokens), and ``N`` (Chinchilla law; ``N_unique`` accepted when ``N`` is absent) or
``N_once``, ``N_rec``, ``r`` (joint law). Optional: ``C`` (training FLOPs), ``budget``, ``variant``, ``status``,
``d_model``. A table with a ``run_id`` column holds one row per run: of rows that share a run id only the newest is
kept (largest ``finished_at``, else the last row, as the results store consolidates its parts), and the others are
excluded and listed (``duplicate_run_ids``). Rows whose ``status`` is not ``"ok"`` (e.g. ``"diverged"`` with a null
loss) are excluded *before* validation and counted (``n_excluded``, ``excluded_by_status``). Ok runs that read
different corpus contents (two values of ``corpus_sha256``) are not one grid and are refused (:func:`one_corpus`).
Everything else that is wrong raises ``ValueError`` before any compute is spent.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loopscale.fit.laws import Law

LOSS_ALIASES = ("loss", "final_val_loss")
N_ALIASES = ("N", "N_unique")


class TooFewRunsError(ValueError):
    """A fit refused because the ok runs left (or, for seeds fitted as cell means, the cells) are fewer than the
    law's free parameters (:func:`prepare`, :func:`loopscale.fit.table_fit.fit_table`)."""


def read_table(table: Any) -> pd.DataFrame:
    """Return a pandas DataFrame from a path (``.parquet``/``.pq``/``.csv``, a folder of Parquet files, or the
    output folder of ``loopscale run`` / ``sweep``: its ``runs.parquet``), a pandas or polars DataFrame or a pyarrow
    Table. In a
    ``variant`` column that names variants on some rows, an empty cell is ``baseline`` (as a table without the
    column is all ``baseline``: e.g. r = 1 runs left blank because every variant shares them).

    Raises:
        ValueError: unknown file type, missing file, a folder without runs.parquet or any Parquet file (a run
            folder's message says what rebuilds its table), or unsupported object.
    """
    df = _read_table(table)
    if "variant" in df.columns and (blank := df["variant"].isna()).any() and not blank.all():
        df["variant"] = df["variant"].astype(object).where(~blank, "baseline")
    return df


_COLUMN_SYNONYMS = {
    "loss": ("val_loss", "validation_loss", "eval_loss", "valid_loss", "test_loss", "loss_val", "final_loss",
             "ce", "cross_entropy", "nll"),
    "D": ("tokens", "n_tokens", "num_tokens", "train_tokens", "training_tokens", "tokens_seen", "dataset_size"),
    "N": ("params", "n_params", "num_params", "parameters", "n_parameters", "param_count", "model_size"),
    "r": ("recurrence", "recurrences", "loops", "n_loops", "num_loops", "recur"),
}
"""Other tools' names for the columns a fit needs (said as likely renames when a column is missing). Not ``size``
(in loopscale's own tables the width d) nor ``data`` (a corpus's name as often as a token count)."""


def _near_names(missing: list[str], have: list[str]) -> dict[str, str]:
    """{missing column: a column of the table that likely means it}: another case of its name (``Loss``, ``n_once``),
    one of :data:`_COLUMN_SYNONYMS` (``val_loss``, ``tokens``, ``params``), each table column named once."""
    out: dict[str, str] = {}
    for want in missing:
        for col in have:
            if col in out.values():
                continue
            low = col.strip().lower()
            if low == want.lower() or low in _COLUMN_SYNONYMS.get(want, ()):
                out[want] = col
                break
    return out


_OTHER_FORMATS = {
    ".tsv": "pd.read_csv(path, sep='\\t')",
    ".txt": "pd.read_csv(path, sep=None, engine='python'), which guesses the separator",
    ".csv.gz": "pd.read_csv(path), which reads it compressed",
    ".gz": "pd.read_csv(path), which reads a compressed CSV",
    ".json": "pd.read_json(path)",
    ".jsonl": "pd.read_json(path, lines=True)",
    ".xlsx": "pd.read_excel(path)",
    ".xls": "pd.read_excel(path)",
    ".feather": "pd.read_feather(path)",
}
"""Table formats ``fit`` does not read, with the pandas call that does (said in the unknown-suffix error)."""


def _no_comment_lines(path: Path) -> None:
    """Refuse a CSV with a line starting with ``#`` (a comment, which pandas reads as a row of one field: a parser
    error at the top, a row of NaN further down, each said in words that never named the comment).

    Raises:
        ValueError: naming the first such line and how to drop them.
    """
    with open(path, encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh, start=1):
            if line.lstrip("\ufeff ").startswith("#"):
                raise ValueError(f"line {i} of table {str(path)!r} starts with '#': a comment line, which a CSV table "
                                 "cannot hold; remove the comment lines (pandas drops them: pd.read_csv(path, "
                                 "comment='#').to_csv(new_path, index=False))")  # fmt: skip


def _read_table(table: Any) -> pd.DataFrame:
    """:func:`read_table` as the table holds it."""
    if isinstance(table, pd.DataFrame):
        return table.copy()
    if isinstance(table, str | Path):
        p = Path(table)
        if not p.exists():
            raise ValueError(f"table {str(p)!r} does not exist; pass a .parquet or .csv file")
        if p.is_dir() and (p / "runs.parquet").is_file():  # the folder of a `loopscale run` / `sweep`
            p = p / "runs.parquet"
        elif p.is_dir():  # a run folder without its table: said as such (its parts/ are no table to read whole)
            from loopscale.fit.run_report import is_loopscale_folder, no_runs_table_message

            if is_loopscale_folder(p):
                raise ValueError(no_runs_table_message(p, torn=False))
        if p.suffix.lower() in (".parquet", ".pq") or p.is_dir():
            import pyarrow as pa
            import pyarrow.parquet as pq

            # a folder is read as a Parquet dataset (every file not named .* or _*, any suffix); one that yields no
            # table and holds no *.parquet / *.pq file (a Tune folder of checkpoints, an empty folder) is said to
            # hold none, rather than pyarrow's words on some checkpoint file or a list of missing columns
            no_parquet = (f"table {str(p)!r} is a folder without runs.parquet or any Parquet file: give a runs table "
                          "(.parquet or .csv) or the output folder of `loopscale run` / `sweep`")  # fmt: skip

            def holds_parquet() -> bool:
                return any(f.suffix.lower() in (".parquet", ".pq") and f.is_file() for f in p.rglob("*"))

            try:
                got = pq.read_table(p)
                if p.is_dir() and not got.num_columns and not holds_parquet():
                    raise ValueError(no_parquet)
                return got.to_pandas()
            except (pa.ArrowInvalid, OSError) as e:  # torn or not Parquet: said as such, not pyarrow's bare words
                if p.is_dir() and not holds_parquet():
                    raise ValueError(no_parquet) from None
                first = " ".join(str(e).split())
                raise ValueError(
                    f"table {str(p)!r} is not a readable Parquet table ({first}): torn, half-written or another "
                    "format; for a run folder's runs.parquet, `loopscale status DIR` says what its next command "
                    "does with it (its runs' records in parts/ and their results are kept)"
                ) from None
        if p.suffix.lower() == ".csv":
            _no_comment_lines(p)
            try:
                df = pd.read_csv(p)
            except pd.errors.EmptyDataError:
                raise ValueError(f"table {str(p)!r} is empty (no header row): a runs table needs columns such as "
                                 "loss or final_val_loss, D, N_once, N_rec, r") from None
            except pd.errors.ParserError as e:  # rows of other lengths than the header's
                raise ValueError(f"table {str(p)!r} is not a readable CSV table ({' '.join(str(e).split())}): "
                                 "every line must hold the header's fields, comma-separated") from None
            sep = next((c for c in (";", "\t", "|") if len(df.columns) == 1 and c in str(df.columns[0])), None)
            if sep is not None:
                # Excel's European CSV: ';' between fields and a decimal comma ("2,89"), which to_csv would keep
                # as text unless read with decimal=','
                cells = pd.read_csv(p, sep=sep, dtype=str, nrows=50).to_numpy().ravel()
                comma = any(isinstance(v, str) and re.fullmatch(r"\s*[-+]?\d+,\d+([eE][-+]?\d+)?\s*", v)
                            for v in cells)  # fmt: skip
                how = f"sep={sep!r}, decimal=','" if comma else f"sep={sep!r}"
                raise ValueError(
                    f"table {str(p)!r} reads as one column {str(df.columns[0])!r}: its fields look separated by "
                    f"{sep!r}" + (" with decimal commas (2,89 for 2.89)" if comma else "") + ", and a .csv table is "
                    f"read comma-separated with decimal points; write it so (pandas: pd.read_csv(path, {how})"
                    ".to_csv(new_path, index=False)) or as Parquet"
                )
            return df
        hint = _OTHER_FORMATS.get("".join(s.lower() for s in p.suffixes[-2:])) or _OTHER_FORMATS.get(p.suffix.lower())
        raise ValueError(f"table {str(p)!r}: unknown suffix {p.suffix!r}; valid: .parquet, .pq, .csv"
                         + (f"; read it with pandas ({hint}) and write it with .to_csv(new_path, index=False) (from "
                            "Python, the DataFrame itself can be passed)" if hint else ""))  # fmt: skip
    try:
        import pyarrow as pa

        if isinstance(table, pa.Table):
            return table.to_pandas()
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        pass
    if type(table).__module__.split(".")[0] == "polars" and callable(getattr(table, "to_pandas", None)):
        return table.to_pandas()  # a polars DataFrame: its own conversion (through pyarrow)
    raise ValueError(
        f"cannot read a table from {type(table).__name__}; pass a path, a pandas or polars DataFrame or a pyarrow "
        "Table"
    )


@dataclass(frozen=True)
class FitData:
    """Validated arrays for one fit (all float64, shape ``(n,)``).

    Attributes:
        cols: law columns plus ``loss`` (nats/token) and ``D`` (tokens); optional ``C`` (FLOPs), ``r``.
        frame: the kept rows as a DataFrame (original columns, aliases resolved), index reset.
        n_excluded: rows dropped because ``status != "ok"`` or because a newer row has the same ``run_id``.
        excluded_by_status: ``{status: count}`` of the rows dropped for their status.
        duplicate_run_ids: the ``run_id`` of each row dropped for a newer row of the same run (one entry per row).
        source_names: the table's own name of each column that ``frame`` names otherwise (e.g. ``{"loss":
            "final_val_loss"}``), for messages.
        near_duplicates: for a table without ``run_id``, a sentence naming rows that equal an earlier kept row in
            every column to :data:`NEAR_DUPLICATE_DIGITS` significant digits, or that are such a row rounded to
            the decimals they are written with (:func:`_rounded_copies`) (the same run listed twice, rounded
            otherwise, would count twice in the fit); None when there are none.
        status_note: a sentence naming rows left out for a status spelt otherwise than ``ok`` (``'OK'``,
            ``' ok'``), or with no status (null) or one that is none of loopscale's (``'completed'``), beside rows
            that are ``ok``; None when there are none.
    """

    cols: dict[str, np.ndarray]
    frame: pd.DataFrame
    n_excluded: int = 0
    excluded_by_status: dict[str, int] = field(default_factory=dict)
    duplicate_run_ids: tuple[str, ...] = ()
    source_names: dict[str, str] = field(default_factory=dict)
    near_duplicates: str | None = None
    status_note: str | None = None

    def table_columns(self) -> list[str]:
        """The columns of ``frame`` as the user's table names them (``final_val_loss``, not ``loss``)."""
        return [self.source_names.get(c, c) for c in self.frame.columns]

    @property
    def n(self) -> int:
        """Number of runs kept."""
        return int(self.cols["loss"].shape[0])


def _resolve_alias(df: pd.DataFrame, target: str, aliases: tuple[str, ...]) -> pd.DataFrame:
    if target not in df.columns:
        for a in aliases:
            if a in df.columns:
                return df.rename(columns={a: target})
    return df


DUPLICATE_RUN_ID = "duplicate_run_id"
"""The reason given for a row dropped because a newer row has the same ``run_id``."""


def _dropped(by_status: dict, n_dups: int) -> str:
    """What was left out before a fit, in words: each status other than 'ok' with its count, and older rows of a
    run id listed twice."""
    parts = [f"{v} {k}" for k, v in sorted(by_status.items())]
    if n_dups:
        parts.append(f"{n_dups} older row(s) of a run id listed twice")
    return "left out: " + ", ".join(parts)


def drop_duplicate_runs(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per run: of the rows that share a ``run_id`` keep the newest, as the results store does when it
    consolidates (largest ``finished_at``, a null or unparsable time counting as oldest; among equal times, and
    without a ``finished_at`` column, the last row).

    Args:
        df: a runs table (any columns). Without a ``run_id`` column (e.g. a user's CSV) it is returned unchanged;
            rows with a null ``run_id`` are always kept.
    Returns:
        ``(kept, dropped)``: the kept rows (index reset), each run at the place of its first row, and the dropped
        rows (original index); ``len(kept) + len(dropped) == len(df)``.
    """
    if "run_id" not in df.columns:
        return df, df.iloc[:0]
    ids = df["run_id"]
    has_id = ids.notna().to_numpy()
    if not ids[has_id].duplicated().any():
        return df, df.iloc[:0]
    pos = np.arange(len(df))
    if "finished_at" in df.columns:
        t = pd.to_datetime(df["finished_at"], utc=True, errors="coerce")
    else:
        t = pd.Series(pd.NaT, index=df.index, dtype="datetime64[ns, UTC]")
    key = pd.DataFrame({"id": ids.to_numpy(), "t": t.to_numpy(), "pos": pos})[has_id]
    newest = key.sort_values(["t", "pos"], na_position="first", kind="stable").drop_duplicates("id", keep="last")
    keep = ~has_id
    keep[newest["pos"].to_numpy()] = True
    # a run's row stands where the run first appears: the table without its extra rows, in its own order
    slot = pos.copy()
    slot[newest["pos"].to_numpy()] = key.groupby("id")["pos"].min().loc[newest["id"]].to_numpy()
    kept = np.flatnonzero(keep)
    return df.iloc[kept[np.argsort(slot[kept], kind="stable")]].reset_index(drop=True), df.loc[~keep]


def _most_runs_first(counts: pd.Series) -> list[tuple[Any, int]]:
    """``(value, runs)`` pairs of a ``value_counts`` result, most runs first, ties by the value's text: the order
    in which :func:`one_tokenizer` and :func:`one_corpus` name the values they refuse."""
    return [(k, int(n)) for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))]


def one_tokenizer(runs: pd.DataFrame, what: str = "the table") -> None:
    """Refuse runs whose losses count different tokens: a loss in nats per token of one tokenizer (``tokenizer``,
    ``vocab_size`` columns, as loopscale's results name them) is not on the scale of another's (a byte-level model's
    token is a byte, a BPE model's several), so one law fitted to both reads the tokenizer's difference as the
    law's. Each column is compared on its own, over the runs where it is not null (``vocab_size`` as a number:
    256 and 256.0 are one); an absent column is not compared.

    Raises:
        ValueError: two or more values in either column, each with its number of runs.
    """
    for col in ("tokenizer", "vocab_size"):
        if col not in runs.columns:
            continue
        vals = runs[col].dropna()
        if col == "vocab_size":
            num = pd.to_numeric(vals, errors="coerce")
            vals = vals.where(num.isna(), num).map(lambda v: int(v) if isinstance(v, float) and v.is_integer() else v)
        else:
            vals = vals.astype(str)
        counts = vals.value_counts()
        if len(counts) <= 1:
            continue
        said = ", ".join(f"{n} runs {col}={k!r}" for k, n in _most_runs_first(counts))
        raise ValueError(
            f"{what}'s ok runs count their loss in the tokens of {len(counts)} tokenizers ({said}): a loss in nats "
            "per token of one is not on the scale of another's, so they are not one grid and are not fitted; "
            f"filter the table to the runs of one tokenizer (one value of {col})"
        )


def one_corpus(runs: pd.DataFrame, what: str = "the table") -> None:
    """Refuse runs that read different corpus contents: two texts, two validation sets, so not one grid to fit;
    and runs of two tokenizers (:func:`one_tokenizer`).

    Args:
        runs: the runs to be fitted (already left to the ok ones). Without a ``corpus_sha256`` column, or with one
            value in it (null values, from records that name no hash, are not compared), nothing is checked.
        what: the table's name in the message.
    Raises:
        ValueError: two or more hashes, each with its number of runs (hash shortened to 12 characters); two or
            more tokenizers (:func:`one_tokenizer`).
    """
    one_tokenizer(runs, what)
    if "corpus_sha256" not in runs.columns:
        return
    counts = runs["corpus_sha256"].dropna().astype(str)
    counts = counts[counts != ""].value_counts()
    if len(counts) > 1:
        said = ", ".join(f"{n} runs {h[:12]}" for h, n in _most_runs_first(counts))
        raise ValueError(
            f"{what}'s ok runs read {len(counts)} different corpus contents (corpus_sha256: {said}), i.e. two texts "
            "with two validation sets, so they are not one grid and are not fitted; filter the table to the runs "
            "of one corpus (one corpus_sha256 value)"
        )


def csv_record_lines(path: str | Path) -> list[int] | None:
    """The line of a CSV file (header = line 1) on which each data row starts, in the order ``pandas.read_csv``
    reads them: blank lines skipped, a quoted field spanning lines counted. None when ``path`` is not a ``.csv``
    file or the file does not parse as comma-separated UTF-8."""
    import csv

    p = Path(path)
    if p.suffix.lower() != ".csv" or not p.is_file():
        return None
    out: list[int] = []
    try:
        with open(p, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            end = 0  # the last line of the record before
            header = True
            for rec in reader:
                start, end = end + 1, reader.line_num
                if not rec or (len(rec) == 1 and not rec[0].strip()):  # a blank line: pandas skips it
                    continue
                if header:
                    header = False
                    continue
                out.append(start)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return out


def _hashable(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (index reset to 0..n-1, the rows' places in the table) with each cell that cannot be hashed (a list,
    dict or array: a Parquet list or struct column) replaced by its ``repr``, so that rows can be compared whole
    (``DataFrame.duplicated`` hashes every cell)."""
    df = df.reset_index(drop=True)
    for c in df.columns:
        if df[c].dtype == object and df[c].map(lambda v: isinstance(v, list | dict | set | np.ndarray)).any():
            df[c] = df[c].map(lambda v: repr(v.tolist() if isinstance(v, np.ndarray) else v) if v is not None else v)
    return df


#: The values a law is defined at, per column: (the rule in words, a test of a float array). :func:`prepare` (which
#: first refuses NaN and inf), ``FitResult.predict`` and :func:`loopscale.fit.derived.isoflop_parabolas` read it.
VALUE_RULES: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "loss": ("> 0 (nats/token)", lambda x: x > 0),
    "D": ("> 0 (tokens)", lambda x: x > 0),
    "N": ("> 0 (parameters)", lambda x: x > 0),
    "N_once": (">= 0 (parameters)", lambda x: x >= 0),
    "N_rec": (">= 0 (parameters)", lambda x: x >= 0),
    "r": ("a whole number >= 1 (recurrences of the shared block)", lambda x: (x >= 1) & (x == np.round(x))),
    "C": ("> 0 (FLOPs)", lambda x: x > 0),
}


def breaking(column: str, values: np.ndarray, *, nan_ok: bool = False) -> np.ndarray:
    """Boolean mask ``(n,)`` of the ``values`` of ``column`` that break its :data:`VALUE_RULES` rule; an infinite
    value always does, a NaN does unless ``nan_ok`` (a failed run's row, which a prediction passes through as NaN).
    Raises KeyError for a column without a rule."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        ok = VALUE_RULES[column][1](v) & np.isfinite(v)
    return ~(ok | (np.isnan(v) if nan_ok else False))


def first_breaking(column: str, values: np.ndarray, *, nan_ok: bool = False) -> int | None:
    """Index of the first value :func:`breaking` marks, or None when every value keeps the rule."""
    bad = breaking(column, values, nan_ok=nan_ok)
    return int(np.argmax(bad)) if bad.any() else None


def prepare(table: Any, law: Law, *, block_by: tuple[str, ...] | None = None,
            lines: list[int] | None = None) -> FitData:  # fmt: skip
    """Load, filter by ``status`` and validate a table for ``law``.

    Args:
        table: path, DataFrame or pyarrow Table (see module docstring for columns).
        law: the law object (its ``columns`` are required).
        block_by: optional block-bootstrap columns that must exist.
        lines: the line in a CSV file of each row of ``table`` (messages name rows by it); None: computed when
            ``table`` is a path to a ``.csv`` file (:func:`csv_record_lines`), else rows are named by number.
    Returns:
        :class:`FitData`: one row per ``run_id`` (:func:`drop_duplicate_runs`), rows with ``status != "ok"`` left
        out; both kinds of dropped rows count in ``n_excluded``.
    Raises:
        ValueError: ok runs of two corpus contents (:func:`one_corpus`), missing columns (lists those present),
            NaN/inf, ``loss <= 0``, ``N``/``D`` ``<= 0``, ``N_once < 0``, ``N_rec < 0``, ``r < 1``, fewer runs than
            parameters, a joint fit with phi free on a single ``r``, a ``block_by`` column that does not exist, or
            (a table without ``run_id``, or a row whose ``run_id`` is empty) a row equal in every column to an
            earlier one (empty cells equal empty cells). Rows are named by their
            line in a CSV file (header = line 1), else by their 0-based row number.
    """
    raw = read_table(table)
    if lines is None and isinstance(table, str | Path):
        lines = csv_record_lines(table)
    if lines is not None and len(lines) != len(raw):
        lines = None

    index = None  # a DataFrame's own row labels, where they are not its positions (a filtered frame: df.loc[...])
    if isinstance(table, pd.DataFrame) and len(table) == len(raw) and not table.index.equals(pd.RangeIndex(len(table))):
        index = table.index

    def row_name(k: int) -> str:
        """Row ``k`` (0-based, of the table as read) as the user finds it: a CSV's line (its header is line 1), or a
        DataFrame's position with its index label where the two differ."""
        if lines is not None:
            return f"line {lines[k]} of the CSV"
        if index is None:
            return f"row {k}"
        label = index[k].item() if isinstance(index[k], np.generic) else index[k]  # 10, not np.int64(10)
        return f"row {k} = index label {label!r}"

    labels = row_label_columns(raw)
    beside = ""  # what the repeated-run checks leave out, said in their messages
    if labels:
        names, many = ", ".join(map(repr, labels)), len(labels) > 1
        beside = (f" (column{'s' * many} {names} aside: {'they number' if many else 'it numbers'} the rows, as "
                  "pandas' to_csv writes its index unless index=False)")  # fmt: skip
    compared = _hashable(raw.drop(columns=labels))
    if "run_id" in raw.columns:  # rows without a run_id name no run: they are compared as a table without one is
        compared = compared[raw["run_id"].isna().to_numpy()]
    if len(compared) and (rep := compared.duplicated(keep="first").to_numpy()).any():
        # an outside table names no run: a row repeated in every column is the same run listed twice (e.g. a table
        # concatenated with itself), which the fit would count twice, narrowing its intervals
        i = int(np.argmax(rep))
        head, row = compared.iloc[:i], compared.iloc[i]
        equal = ((head == row) | (head.isna() & row.isna())).all(axis=1).to_numpy()  # NaN equals NaN here
        k, same = int(compared.index[i]), int(compared.index[int(np.flatnonzero(equal)[0])])
        raise ValueError(
            f"{int(rep.sum())} row(s) repeat an earlier row in every column{beside} (the first: {row_name(k)}, equal "
            f"to {row_name(same)}); a run listed twice counts twice in the fit and narrows its intervals: drop the "
            "repeats (pandas: df.drop_duplicates()) or add a column that tells the runs apart (run_id or seed)"
        )
    pos = "__row_in_table__"  # each row's place in the table as read, carried through the dropping of old rows
    df, dups = drop_duplicate_runs(raw.assign(**{pos: np.arange(len(raw))}))
    rows, dups = df.pop(pos).to_numpy(), dups.drop(columns=pos)
    given = {c: c for c in df.columns}  # the table's own name of each column, for error messages
    for target, aliases in (("loss", LOSS_ALIASES), ("N", N_ALIASES if law.name == "chinchilla" else ())):
        renamed = _resolve_alias(df, target, aliases)
        if renamed is not df:
            given[target] = next(a for a in aliases if a in df.columns)
        df = renamed

    def where(i: int) -> str:
        """Row ``i`` of the rows left, named as the user finds it: its row in the table and its run_id."""
        return row_name(int(rows[i])) + (f" (run_id {df['run_id'].iloc[i]!r})" if "run_id" in df.columns else "")

    def numeric(c: str, what: str) -> pd.Series:
        """Column ``c`` as numbers; a value that is not one is named with its row (ValueError, ``what`` the
        column as the message names it). True / false values are no numbers (read as 1 / 0 they gave e.g. "every
        run has r = 1")."""
        boolean = (df[c].map(lambda x: isinstance(x, bool | np.bool_)).to_numpy(bool) if df[c].dtype == object
                   else df[c].notna().to_numpy(bool) & pd.api.types.is_bool_dtype(df[c]))  # fmt: skip
        if boolean.any():
            i = int(np.argmax(boolean))
            raise ValueError(f"{what} must be numeric: {str(bool(df[c].iloc[i])).lower()} (a boolean) at {where(i)}")
        try:
            return pd.to_numeric(df[c])
        except (TypeError, ValueError) as exc:
            try:
                odd = pd.to_numeric(df[c], errors="coerce").isna() & df[c].notna()
            except (TypeError, ValueError):  # values no coercion reads (e.g. lists): pandas' own words
                raise ValueError(f"{what} must be numeric: {exc}") from exc
            i = int(np.argmax(odd.to_numpy())) if odd.any() else None
            at = f"{df[c].iloc[i]!r} at {where(i)}" if i is not None else str(exc)
            raise ValueError(f"{what} must be numeric: {at}") from exc

    n_excluded, by_status = 0, {}

    if "status" in df.columns:
        st = df["status"].astype("string").fillna("<null>")
        bad = st != "ok"
        n_excluded = int(bad.sum())
        by_status = dict(Counter(st[bad].tolist()))
        rows = rows[~bad.to_numpy()]
        df = df.loc[~bad.to_numpy()].reset_index(drop=True)
    if law.name == "chinchilla" and "N" not in df.columns and {"N_once", "N_rec"} <= set(df.columns):
        # a looped table without N: one architecture's law on its unique parameters, as `loopscale run`'s per-r
        # Chinchilla fits take them (N_unique = N_once + N_rec)
        n_unique = (numeric("N_once", "column 'N_once' (N = N_once + N_rec)")
                    + numeric("N_rec", "column 'N_rec' (N = N_once + N_rec)"))  # fmt: skip
        df = df.assign(N=n_unique)
        given["N"] = "N_once + N_rec"
    one_corpus(df)
    need = ("loss", "D", *law.columns)
    missing = [c for c in need if c not in df.columns]
    if missing:
        hint = " (loss may be named final_val_loss)" if "loss" in missing else ""
        if "N" in missing:
            hint += " (N may be named N_unique)"
        alias = {a: t for t, names in (("loss", LOSS_ALIASES), ("N", N_ALIASES)) for a in names}
        spaced = {c: str(given.get(c, c)) for c in df.columns
                  if str(given.get(c, c)) != str(given.get(c, c)).strip()
                  and alias.get(str(given.get(c, c)).strip(), str(given.get(c, c)).strip()) in missing}  # fmt: skip
        if spaced:  # ' loss', 'D ': a header written with spaces around its names
            hint += (f"; {', '.join(repr(v) for v in spaced.values())} "
                     f"{'has' if len(spaced) == 1 else 'have'} spaces around the name: remove them from the header")  # fmt: skip
        if near := _near_names(missing, [str(given.get(c, c)) for c in df.columns if c not in spaced]):
            hint += ("; if they are those, rename " + ", ".join(f"{have!r} to {want}" for want, have in near.items())
                     + " (loss in nats/token, D in tokens, N in parameters)")  # fmt: skip
        raise ValueError(
            f"law {law.name!r} needs columns {list(need)}; missing {missing}{hint}; table has "
            f"{[given.get(c, c) for c in df.columns]}"
        )
    if block_by:
        bmiss = [c for c in block_by if c not in df.columns]
        if bmiss:
            import difflib

            names = [given.get(c, c) for c in df.columns]
            close = {c: difflib.get_close_matches(c, names, n=1, cutoff=0.6) for c in bmiss}
            hint = "; ".join(f"did you mean {m[0]!r} for {c!r}?" for c, m in close.items() if m)
            raise ValueError(
                f"block_by column(s) {bmiss} do not exist" + (f" ({hint})" if hint else "") + f"; table has {names}"
            )
    cols: dict[str, np.ndarray] = {}
    extra = [c for c in ("C", "r") if c in df.columns and c not in need]
    for c in (*need, *extra):
        arr = numeric(c, f"column {given.get(c, c)!r}").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isfinite(arr)
        if bad.any():
            how = ("give those runs a status other than 'ok' (e.g. 'diverged'), which the fits leave out before "
                   "this check, or remove them" if "status" in df.columns else
                   "remove those rows, or add a status column and mark them other than 'ok' (e.g. 'diverged'): the "
                   "fits take the rows whose status is 'ok'")  # fmt: skip
            raise ValueError(
                f"column {given.get(c, c)!r} has {int(bad.sum())} NaN/inf value(s) (first at "
                f"{where(int(np.argmax(bad)))}); {how}"
            )
        cols[c] = arr
    for c in VALUE_RULES:
        if c in cols and (i := first_breaking(c, cols[c])) is not None:
            raise ValueError(f"column {given.get(c, c)!r} must be {VALUE_RULES[c][0]}; {where(i)} has "
                             f"{float(cols[c][i])!r}")
    if "N_once" in cols and not np.all(cols["N_once"] + cols["N_rec"] > 0):
        raise ValueError("N_once + N_rec must be > 0 (parameters) on every row")
    n = cols["loss"].shape[0]
    if n == 0 and not (n_excluded or len(dups)):
        raise ValueError(f"the table holds no runs (no rows); law {law.name!r} needs at least {law.n_params}")
    near = sorted(k for k in by_status if str(k).strip().lower() == "ok")
    if n == 0 and near:  # 'OK', ' ok': the runs are there, their status is spelled otherwise
        raise ValueError(
            f"no row has status 'ok' ({_dropped(by_status, len(dups))}); the fits take the rows whose status is "
            f"exactly 'ok' (lower case, no spaces): write {', '.join(repr(k) for k in near)} as 'ok'"
        )
    status_note = None
    if n and near:  # some rows 'ok', others 'OK' / ' ok': those were left out without a word
        import warnings

        k = sum(by_status[s] for s in near)
        status_note = (f"{k} row{'s' if k > 1 else ''} with status {', '.join(repr(s) for s in near)} left out: the "
                       "fits take the rows whose status is exactly 'ok' (lower case, no spaces); write them as 'ok' to "
                       "fit them")  # fmt: skip
        warnings.warn(f"table: {status_note}", UserWarning, stacklevel=3)
    other = sorted(str(k) for k in by_status if str(k) not in ("diverged", "did_not_learn", "failed", *near))
    if n and other:  # some rows 'ok', others without a status (a merge) or in another tool's words: said too
        import warnings

        k = sum(by_status[s] for s in other)
        words = [repr(s) for s in other if s != "<null>"]
        named = ("no status (null)" if not words else
                 "status " + ", ".join(words) + (" or none (null)" if "<null>" in other else ""))  # fmt: skip
        note = (f"{k} row{'s' if k > 1 else ''} with {named} left out beside the {n} with status 'ok': the fits take "
                "only 'ok' rows (loopscale's runs are ok, diverged, did_not_learn or failed); give finished runs "
                "status 'ok' to fit them")  # fmt: skip
        status_note = f"{status_note}; {note}" if status_note else note
        warnings.warn(f"table: {note}", UserWarning, stacklevel=3)
    foreign = sorted(str(k) for k in by_status if str(k) not in ("diverged", "did_not_learn", "failed"))
    if n == 0 and foreign:  # 'completed', 'done': the runs are there, their status named in another tool's words
        raise ValueError(
            f"no row has status 'ok' ({_dropped(by_status, len(dups))}); the fits take only the rows whose status is "
            "'ok' (loopscale's runs are ok, diverged, did_not_learn or failed): write your finished runs' status "
            f"({', '.join(repr(k) for k in foreign)}) as 'ok', or drop the status column"
        )
    if n < law.n_params:
        fix = (" or fix phi (--phi 0.5 on the command line, phi=0.5 in Python)"  # enough only one short of it
               if "phi" in law.extra_names and n >= law.n_params - 1 else "")  # fmt: skip
        left = f" of {n + n_excluded + len(dups)} ({_dropped(by_status, len(dups))})" if n_excluded or len(dups) else ""
        raise TooFewRunsError(
            f"{n} run(s) left{left} is fewer than the {law.n_params} parameters of law {law.name!r}; add runs{fix}"
        )
    if law.name == "joint" and law.extra_names and np.unique(cols["r"]).size < 2:
        only = ", ".join(f"{v:g}" for v in np.unique(cols["r"]))
        fix = (" (phi has no effect on runs of r = 1: r^phi = 1)" if only == "1" else
               " or fix phi (--phi 0.5; phi=0.5 in Python)")  # fmt: skip
        raise ValueError(
            f"a joint fit with phi free needs at least 2 distinct r values; every run has r = {only}; fit one "
            f"architecture's law instead (--law chinchilla; law='chinchilla' in Python){fix}"
        )
    near = None
    unlabelled = df.drop(columns=labels, errors="ignore")
    if "run_id" not in df.columns and len(df) > 1 and (pair := _near_duplicate(unlabelled)) is not None:
        n_rep, k, same = pair
        near = (f"{n_rep} row(s) equal another row in every column{beside} to {NEAR_DUPLICATE_DIGITS} significant "
                f"digits or to the decimals they are written with (the first: {where(k)}, as {where(same)}), though "
                "not exactly: the same run listed twice, rounded "
                "otherwise, counts twice in the fit and narrows its intervals; drop the repeats, or add a column "
                "that tells the runs apart (run_id or seed) if they are different runs")  # fmt: skip
    return FitData(
        cols=cols,
        frame=df,
        n_excluded=n_excluded + len(dups),
        excluded_by_status=by_status,
        duplicate_run_ids=tuple(str(v) for v in dups["run_id"]) if len(dups) else (),
        source_names={k: v for k, v in given.items() if k != v},
        near_duplicates=near,
        status_note=status_note,
    )


ROW_LABEL_NAMES = ("Unnamed: 0", "index")
"""Names of a column that only numbers a table's rows: pandas' ``to_csv`` writes the index as an unnamed first column
(read back as ``Unnamed: 0``), ``reset_index`` names it ``index``."""


def row_label_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``df`` that only label its rows (:data:`ROW_LABEL_NAMES`, holding distinct whole numbers, as a
    DataFrame's index does): a run listed twice differs from itself there, so the checks for repeated runs leave them
    out."""
    out = []
    for c in ROW_LABEL_NAMES:
        if c in df.columns:
            x = pd.to_numeric(df[c], errors="coerce")
            if x.notna().all() and (x == x.round()).all() and x.is_unique:
                out.append(c)
    return out


NEAR_DUPLICATE_DIGITS = 6
"""Significant digits to which two rows of a table without ``run_id`` that agree in every column are named as one
run listed twice (:attr:`FitData.near_duplicates`): two seeds' losses differ by far more (their spread is ~1 %).
Two numbers agree when they differ by at most half a unit in this digit of the larger: ``|a - b| <= 5e-6 max(|a|,
|b|)``, so a pair on either side of a rounding boundary (2.7456749996 and 2.745675) agrees too."""


ROUNDED_MAX_DECIMALS = 6
"""Most decimals of a value read as rounded by an export (``round(loss, 4)``), for :func:`_rounded_copies`."""


def _rounded_copies(X: np.ndarray, group: np.ndarray, earliest: np.ndarray) -> None:
    """Mark in ``earliest`` (in place: of each row, the earliest row it equals, here the row it rounds, which may
    come after it; ``len(X)`` for none) the rows that are another row of their ``group`` rounded: a row with values of 1 to :data:`ROUNDED_MAX_DECIMALS` decimals
    whose other row has more decimals there and, rounded to the row's decimals, is the row (its other values equal):
    a loss re-exported as 3.1235 beside the run's 3.123456789. Two rows both rounded (a table exported at 4 decimals,
    where 3.123 and 3.1234 may be two seeds) are not matched. Rows of one rounding (the decimals of each column) are
    matched with every row rounded so through pandas' grouping, not pair by pair.

    ``X``: float64 ``(n, columns)`` numeric values (NaN allowed); ``group``: int ``(n,)`` ids of the other values."""
    n = len(X)
    if n < 2 or X.shape[1] == 0:
        return
    exact = ROUNDED_MAX_DECIMALS + 1
    dec = np.full(X.shape, exact)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(ROUNDED_MAX_DECIMALS, -1, -1):  # the fewest decimals that give the value back
            dec[np.round(X, k) == X] = k
    with np.errstate(divide="ignore", invalid="ignore"):  # a value at float64's last decimals is not rounded
        mag = np.where(np.isfinite(X) & (X != 0), np.floor(np.log10(np.abs(X))), 0.0)  # (5.4e9 has ~6 decimals)
    dec[(dec >= 1) & (dec >= 12 - mag)] = exact
    dec[~np.isfinite(X)] = 0  # NaN and inf: compared as they are
    # only columns of full-precision values (most rows, e.g. a loss) can hold a rounded copy; a column of short
    # values (warmup_frac 0.5, 0.25) is compared as it is, which also keeps the roundings to match few
    full = (dec == exact).mean(axis=0) >= 0.5
    dec[:, ~full] = exact
    rounded = ((dec >= 1) & (dec < exact)).any(axis=1)
    if not rounded.any():
        return
    profiles, which = np.unique(dec[rounded], axis=0, return_inverse=True)
    rows, which = np.flatnonzero(rounded), which.ravel()
    for p, prof in enumerate(profiles):
        cut = (prof >= 1) & (prof < exact)  # the columns this rounding cut
        # what was rounded: rows with more decimals in some cut column, and in each the same or fewer decimals
        # than the rounded row's (a value both hold, 0.5, is compared as it is)
        d = dec[:, cut]
        eligible = ((d == exact) | (d <= prof[cut])).all(axis=1) & (d == exact).any(axis=1)
        if not eligible.any():
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            R = np.column_stack([np.round(X[:, c], int(prof[c])) if cut[c] else X[:, c] for c in range(X.shape[1])])
        kid = pd.DataFrame(R).assign(_g=group).groupby(list(range(X.shape[1])) + ["_g"], dropna=False,
                                                        sort=False).ngroup().to_numpy()  # fmt: skip
        first = np.full(int(kid.max()) + 1, n)
        np.minimum.at(first, kid[eligible], np.flatnonzero(eligible))  # of each rounded key, its first original
        for i in rows[which == p]:
            j = int(first[kid[i]])
            if j < n and earliest[j] != i:  # the rounded row is the copy (unless the pair is named already)
                earliest[i] = min(earliest[i], j)


def _near_duplicate(df: pd.DataFrame) -> tuple[int, int, int] | None:
    """Rows of ``df`` equal to an earlier row in every column, numbers to :data:`NEAR_DUPLICATE_DIGITS` significant
    digits (NaN equal to NaN), other values exactly: ``(how many, the first such row, the earliest row it equals)``
    (0-based positions), or None (also for a table whose cells do not compare, e.g. lists). Rows are sorted by their
    other values and then by the numeric column with the most distinct values; each is compared with the rows after
    it that are still within the tolerance in that column (vectorised over rows, one offset at a time), so every
    pair is found without comparing all pairs. Infinite values equal only the same infinity."""
    rtol = 0.5 * 10.0 ** (1 - NEAR_DUPLICATE_DIGITS)
    num, other = [], []
    for c in df.columns:
        x = pd.to_numeric(df[c], errors="coerce")
        if x.notna().sum() == df[c].notna().sum():  # every value a number, nulls aside
            num.append(x.to_numpy(dtype=np.float64))
        else:
            other.append(c)
    n = len(df)
    try:
        group = (df.groupby(other, dropna=False, sort=False).ngroup().to_numpy() if other
                 else np.zeros(n, dtype=np.int64))  # fmt: skip
    except TypeError:  # unhashable cells
        return None
    X = np.column_stack(num) if num else np.zeros((n, 0))
    pivot = X[:, int(np.argmax([len(np.unique(col)) for col in num]))] if num else np.zeros(n)

    def close(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise: equal, both NaN, or both finite and within ``rtol`` of the larger (inf equals only inf)."""
        with np.errstate(invalid="ignore", over="ignore"):
            near = np.isfinite(a) & np.isfinite(b) & (np.abs(a - b) <= rtol * np.maximum(np.abs(a), np.abs(b)))
        return (a == b) | (np.isnan(a) & np.isnan(b)) | near

    order = np.lexsort((np.nan_to_num(pivot, nan=0.0), np.isnan(pivot), group))  # NaNs after every number, inf
    Xs, ps, gs = X[order], pivot[order], group[order]
    earliest = np.full(n, n)  # of each row (0-based position), the earliest row it equals; n: none
    alive = np.ones(max(n - 1, 0), dtype=bool)  # rows whose window (same group, pivot within rtol) goes on
    for k in range(1, n):  # the rows k places apart in the sorted order, all at once
        alive = alive[: n - k] & (gs[: n - k] == gs[k:]) & close(ps[: n - k], ps[k:])
        if not alive.any():
            break
        same = alive & close(Xs[: n - k], Xs[k:]).all(axis=1)
        i, j = order[: n - k][same], order[k:][same]
        np.minimum.at(earliest, np.maximum(i, j), np.minimum(i, j))
    _rounded_copies(X, group, earliest)
    rep = np.flatnonzero(earliest < n)
    if not len(rep):
        return None
    return len(rep), int(rep[0]), int(earliest[rep[0]])


LOSS_PLAUSIBLE_MAX = 15.0
"""Nats/token above which a loss is flagged as not a cross-entropy: a uniform guess over 3 million tokens is 14.9
nats/token, so no language model's loss, trained or not, reaches it; a perplexity column easily does."""


def unit_warnings(data: FitData) -> list[str]:
    """Values that read as another unit than the fit's (loss in nats/token, D in tokens, N / N_once / N_rec in
    parameters), one sentence each; empty when none. The fit runs either way: a D in millions of tokens or N in
    millions of parameters changes only B or A (E, alpha, beta and phi are the same; for D only with three D or more:
    with fewer, E, B and beta are not pinned down and the fit can land elsewhere), a perplexity changes every
    parameter. Loss in bits (nats / ln 2) cannot be told from its values: the units are said in ``--help``.

    Flags: a loss above :data:`LOSS_PLAUSIBLE_MAX`; every D below 1,000 tokens (less than one batch of the ``cpu``
    preset); every N (or N_once + N_rec) below 1,000 parameters; D below 0.1 tokens per parameter on every row (a
    run trains on at least that many in any published scaling grid; the paper's on 20 and more, the ``smoke``
    preset's on 0.2 and more); D above 100,000 tokens per parameter on every row (N in millions, or D in a smaller unit or scaled up: heavily
    over-trained models reach a few thousand); D below 1,000 tokens or N below 1,000 parameters on some rows but not
    all (units mixed within the table). A loopscale results table (``run_id``, ``flops_per_token``,
    ``tokenizer`` and ``vocab_size`` columns: units set by the trainer that wrote it) gets none. A perplexity
    below 15 cannot be told from a loss by its values either."""
    if {"run_id", "flops_per_token", "tokenizer", "vocab_size"} <= set(data.frame.columns):
        return []
    c = data.cols
    out = []
    loss = c["loss"]
    if loss.size and float(loss.max()) > LOSS_PLAUSIBLE_MAX:
        n = int((loss > LOSS_PLAUSIBLE_MAX).sum())
        # a few rows (one, or at most a tenth): outliers to check; more: a perplexity column, whose smaller values
        # can be below 15 too (a perplexity of 10-20)
        fix = ("a perplexity is exp of it: fit its natural log (np.log)" if n == loss.size or (n > 1 and 10 * n > loss.size) else
               "the others are below, so check those rows (a diverged run, or a value in another unit) and give "
               "them a status other than 'ok' or remove them")  # fmt: skip
        out.append(
            f"loss reaches {float(loss.max()):.4g} ({n} of {loss.size} rows above {LOSS_PLAUSIBLE_MAX:g}): the fit "
            f"reads the loss as cross-entropy in nats/token, which no language model's loss exceeds there; {fix}"
        )
    n_par = c["N"] if "N" in c else (c["N_once"] + c["N_rec"] if "N_once" in c else None)
    what = "N" if "N" in c else "N_once + N_rec"
    d = c["D"]
    # another unit of D scales B alone only where E, B and beta are pinned down: three D or more
    n_d = np.unique(d).size
    d_same = ("the other parameters are the same" if n_d >= 3 else
              f"with {n_d} value(s) of D, E, B and beta are not pinned down and may move too")  # fmt: skip
    if d.size and float(d.max()) < 1e3:
        out.append(f"D is below 1,000 tokens on every row (largest {float(d.max()):.4g}): the fit reads D in "
                   f"tokens; a D in millions or billions of tokens fits another B ({d_same})")  # fmt: skip
    if n_par is not None and n_par.size and float(n_par.max()) < 1e3:
        out.append(f"{what} is below 1,000 parameters on every row (largest {float(n_par.max()):.4g}): the fit reads "
                   "parameters; a count in millions fits another A (the other parameters are the same)")  # fmt: skip
    if n_par is not None and d.size and float(d.max()) >= 1e3 and float((d / n_par).max()) < 0.1:
        out.append(f"D is below 0.1 tokens per parameter on every row (D / ({what}) at most "
                   f"{float((d / n_par).max()):.3g}): the fit reads D in tokens; a D in millions or billions of "
                   f"tokens fits another B ({d_same})")  # fmt: skip
    # some rows only (a table joined from two sources, one column scaled on some rows): each row read in its own unit
    # (the absolute bounds only: a small grid's largest model on its smallest D can train on < 0.1 tokens/parameter)
    low_d = d < 1e3
    if d.size and low_d.any() and not low_d.all():
        out.append(f"D is below 1,000 tokens on {int(low_d.sum())} of {d.size} rows (e.g. "
                   f"{float(d[np.flatnonzero(low_d)[0]]):.4g}; the others reach more): the fit reads every D in "
                   "tokens, and no training run is that short; D in millions or billions on those rows (units mixed "
                   "within the table) fits a wrong law: write them in tokens, or give those rows a status other than "
                   "'ok'")  # fmt: skip
    if n_par is not None and n_par.size and (n_par < 1e3).any() and not (n_par < 1e3).all():
        low = n_par < 1e3
        out.append(f"{what} is below 1,000 parameters on {int(low.sum())} of {n_par.size} rows (e.g. "
                   f"{float(n_par[np.flatnonzero(low)[0]]):.4g}; the others count more): the fit reads parameters, and "
                   "no language model is that small; counts in thousands or millions (on those rows, or on every "
                   "row) fit a wrong law: write them in parameters, or give those rows a status other than 'ok'")  # fmt: skip
    if n_par is not None and d.size and float(n_par.max()) >= 1e3 and float((d / n_par).min()) > 1e5:
        out.append(f"D is above 100,000 tokens per parameter on every row (D / ({what}) at least "
                   f"{float((d / n_par).min()):.3g}): the fit reads N in parameters and D in tokens; a count of "
                   "parameters in millions or billions fits another A, a D counted in a smaller unit than tokens "
                   f"(bytes, characters) or scaled up fits another B ({d_same})")  # fmt: skip
    return out


def default_block_by(frame: pd.DataFrame, law: Law) -> tuple[str, ...] | None:
    """Default bootstrap blocks (paper §4.3: whole (budget, architecture) cells are resampled): joint law ->
    ``(budget, r)`` if ``budget`` holds values (the sweep's iso-FLOP grids), else ``(D, r)``, or ``(C, r)`` where
    that groups the runs into fewer cells: on an iso-FLOP table every run of a (C, r) cell has its own D, so
    ``(D, r)`` would resample run by run; on a token-budget grid every size at one budget shares D while C differs
    per run (with one size the two make the same cells, and D is kept). Chinchilla law -> ``None`` (iid over runs). ``frame`` needs an ``r`` column for a
    blocking; without ``budget``, ``C`` and ``D`` values -> ``None``. A ``budget`` column empty on some runs only
    is not used (its empty rows would form one block per r, mixing budgets): ``(D, r)`` / ``(C, r)`` instead, with a
    ``UserWarning`` saying so."""
    if law.name != "joint":
        return None
    if "budget" in frame.columns and frame["budget"].notna().all():
        return ("budget", "r")
    best: tuple[str, ...] | None = None
    n_best = None
    for c in ("D", "C"):  # C only where strictly fewer cells
        if c in frame.columns and "r" in frame.columns and frame[c].notna().all():
            n = len(frame.groupby([c, "r"], sort=False, dropna=False))
            if n_best is None or n < n_best:
                best, n_best = (c, "r"), n
    if "budget" in frame.columns and frame["budget"].notna().any():
        import warnings

        k = int(frame["budget"].isna().sum())
        warnings.warn(f"bootstrap: the budget column is empty on {k} of {len(frame)} runs, so its blocks would put "
                      f"those runs together whatever their budget; blocks by "
                      f"{'(' + ', '.join(best) + ')' if best else 'run (iid)'} instead (fill in budget on every "
                      "run to block by it)", UserWarning, stacklevel=3)  # fmt: skip
    return best


def with_layers_unique(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``layers_unique`` (unique layers of a run: ``n_prelude + n_recur_block + n_coda``) when it has no
    such column and has those three (the sweep's results schema), so that a ladder's plain models of different
    depth are different cells; ``df`` unchanged otherwise."""
    if "layers_unique" not in df.columns and {"n_prelude", "n_recur_block", "n_coda"} <= set(df.columns):
        return df.assign(layers_unique=df["n_prelude"] + df["n_recur_block"] + df["n_coda"])
    return df


def shared_r1(df: pd.DataFrame, base: str) -> tuple[str, pd.DataFrame]:
    """The r = 1 runs that every variant's fit borrows (the paper reuses them for all variants), and the variant
    that holds them: ``base``'s own; without any, those of the one variant that has no looped runs (r = 1 runs
    labelled otherwise, e.g. ``plain``). ``df`` has the columns ``variant`` and ``r``; returns ``(name, rows)``."""
    v = df["variant"].astype(str)
    r1 = df[(v == base) & (df["r"] == 1)]
    if r1.empty:
        plain = [n for n in sorted(v.unique()) if not (df.loc[v == n, "r"] > 1).any()]
        if len(plain) == 1:
            return plain[0], df[(v == plain[0]) & (df["r"] == 1)]
    return base, r1


def cell_means(frame: pd.DataFrame, keys: tuple[str, ...], *, constant: tuple[str, ...] = ("N_once", "N_rec", "D", "r")) -> pd.DataFrame:
    """Seeds as replicates: one row per cell (rows with equal ``keys``), ``loss`` the mean over the cell's runs.

    The law describes a cell's expected loss; a cell's seeds only differ by run-to-run noise, so a design with
    replicates is fitted to its cell means (every cell one point, whatever its number of seeds).

    Args:
        frame: runs with ``loss`` (nats/token) and ``keys``.
        keys: the columns that identify a cell, e.g. ``("d_model", "r", "layers_unique", "D")``.
        constant: columns that must not vary within a cell (the law's inputs).
    Returns:
        DataFrame, one row per cell in the order of ``frame.groupby(list(keys), sort=True)``: the first row's
        values, ``loss`` = the cell mean, ``n_seeds`` = runs in the cell, ``loss_sd`` = their standard deviation
        (ddof 1; NaN for one run).
    Raises:
        ValueError: a missing key column, a key column with null values (:func:`no_null_cells`; a cell of such
            runs would be left out), or a ``constant`` column that varies within a cell.
    """
    miss = [c for c in (*keys, "loss") if c not in frame.columns]
    if miss:
        raise ValueError(f"cell_means: column(s) {miss} do not exist; table has {list(frame.columns)}")
    no_null_cells(frame, keys, "cell_means")
    g = frame.groupby(list(keys), sort=True)
    for c in constant:
        if c in frame.columns and int(g[c].nunique(dropna=False).max()) > 1:
            raise ValueError(f"cell_means: {c} varies within a cell of {list(keys)}; these keys do not identify cells")
    out = g.first().reset_index()
    out["loss"] = g["loss"].mean().to_numpy()
    out["n_seeds"] = g.size().to_numpy()
    out["loss_sd"] = g["loss"].std(ddof=1).to_numpy()
    return out[[c for c in frame.columns if c in out.columns] + ["n_seeds", "loss_sd"]]


def no_null_cells(frame: pd.DataFrame, keys: tuple[str, ...], what: str) -> None:
    """Refuse null values in the columns that tell a fit's cells apart (``keys``): a run whose cell is unknown would
    otherwise be left out of the cell means (pandas' groupby drops null keys) while the bootstrap kept it.

    Args:
        frame: the runs (one row per run). keys: the cell columns (those absent from ``frame`` are not checked).
        what: who asks, for the message.
    Raises:
        ValueError: naming the first such column, its number of null rows and the first of them (by ``run_id``
            when the table has one, else by row number of the runs fitted, 0-based).
    """
    for c in keys:
        if c not in frame.columns:
            continue
        null = frame[c].isna().to_numpy()
        if not null.any():
            continue
        at = np.flatnonzero(null)
        if "run_id" in frame.columns:
            names = [f"run_id {frame['run_id'].iloc[i]!r}" for i in at[:3]]
        else:
            names = [f"row {int(i)}" for i in at[:3]]
        more = f" and {len(at) - 3} more" if len(at) > 3 else ""
        raise ValueError(
            f"{what}: column {c!r} is null on {len(at)} of {len(frame)} runs ({', '.join(names)}{more}), and it is one "
            f"of the columns {list(keys)} that tell the runs' cells apart (seeds of one cell are averaged); a run "
            f"without one belongs to no cell: fill in {c!r} on those rows, or drop the rows (or the column, when "
            "the others tell the cells apart)"
        )
