"""The console of the Ray-using commands (``tune-lr``, ``sweep``, ``run``): stage lines, one progress display per
stage, and Ray's own output kept out of the way.

* :func:`session` opens a command's console. Everything written to the process's stdout and stderr file
  descriptors while it is open — Ray's and Tune's log lines, the lines Ray forwards from trial processes, Python
  warnings — goes through a pipe into ``OUT/logs/ray.log`` (escape codes removed). Without ``verbose`` only
  warnings and errors from it reach the console, one line each, each distinct message once (run ids and numbers
  do not make a message distinct); with ``verbose`` every line does. The command's own lines
  (:meth:`Console.say`) go to the terminal the command was started from.
* Progress displays: :class:`GridView` (runs done/running/pending/failed, tokens/s smoothed over a window, ETA from
  the planned FLOPs and the measured FLOP rate), :class:`LRView` (trials done/pruned/failed, best LR so far per
  size), :class:`BootstrapView` (refits done of B). On a terminal they are ``rich`` progress bars; when the
  output is piped or ``--json`` is given, a view prints a plain line at most every :data:`PLAIN_EVERY_S` seconds
  and one at its end (no bars, no colour codes).
* Each view also writes ``OUT/logs/progress.json`` (stage, counts — of runs, and the grid's Tune trials by status
  under ``trials`` —, rate, ETA, pid, host, time) at most every
  :data:`HEARTBEAT_S` seconds, at once when the grid's counts change or an LR trial ends, and at its end:
  ``loopscale status`` reads it to tell a running command from a stopped one.

Tune callbacks run in the driver process; they reach the active display through the module functions
(:func:`grid_observe`, :func:`lr_trial_finished`), so nothing unpicklable is stored in a callback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from loopscale.sweep.grid import trial_cells
from loopscale.sweep.workspace import DONE_KEY

PLAIN_EVERY_S = 60.0
"""Seconds between two plain (non-terminal) progress lines of one view."""
HEARTBEAT_S = 5.0
"""Seconds between two writes of ``OUT/logs/progress.json``."""
NOTICE_MAX = 800
"""Longest notice line (characters). Tune's notice that no trial could start (about 560 characters) names the
resources asked and the cluster's in its middle: at 400 that part was cut out."""
LOG_NAME = "ray.log"
PROGRESS_NAME = "progress.json"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\r")
_PREFIX = re.compile(r"^\((?:[^()]|\([^()]*\))*?pid=\d+[^)]*\)\s*")  # "(loopscale_grid pid=123, ip=...) "
_LOGHEAD = re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:,.]+\s+")  # "2026-11-30 17:00:00,123\t"
_LEVEL = re.compile(r"\b(WARNING|ERROR|CRITICAL|FATAL)\b")
_EXC = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Warning)\b:")
_PYWARN = re.compile(r": ([A-Z]\w*Warning): ")
_IDS = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{8,}(?![0-9A-Za-z])|\d+")
"""Run ids, hashes and numbers: not what makes a notice distinct (an id may follow '_', as in ``run_<hex>``)."""
_RAY_DEDUP = re.compile(r"\s*\[repeated \d+x across cluster\](?:\s*\(Ray deduplicates logs by default\..*)?$")
"""The suffix Ray's log deduplication appends to a line repeated by several processes (the first time with an
explanation of RAY_DEDUP_LOGS)."""
_WARN_HEAD = re.compile(r"^(?:warning(?: \([A-Z]\w*Warning\))?|[A-Z]\w*Warning): ")
"""The head of a warning: ``warning: `` as the console script prints this process's own and :func:`notice_of` a
trial's, ``warning (FutureWarning): `` for another class, ``CorpusWarning: `` in Python's own format; the same
message either way."""


TUNE_ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"


def tune_metrics_never_written(message: str) -> bool:
    """Whether Tune's "Failed to fetch metrics for N trial(s)" warning (logged when ``Tuner.fit`` builds its
    ResultGrid) only lists trials whose result files were never written to the experiment folder — trials stopped
    by Ctrl-C before their first sync. loopscale records results in its own store, not from those files, so the
    warning is noise on the console (it stays in ``OUT/logs/ray.log``); any other failure to read them is not."""
    head, _, rest = message.partition("\n")
    items = [ln for ln in rest.splitlines() if ln.strip()]
    return (
        head.startswith("Failed to fetch metrics for")
        and bool(items)
        and all("FileNotFoundError" in ln and "were not found" in ln for ln in items)
    )


TUNE_LOGGER = "ray.tune.tune"


def tune_stop_signal(message: str) -> bool:
    """Whether the message is one of Tune's two warnings on a Ctrl-C or SIGTERM of the driver: "Stop signal received
    (e.g. via SIGINT/Ctrl+C), ending Ray Tune run ..." and "Experiment has been interrupted, but the most recent state
    was saved ...". The command's own ``interrupted: ...`` line says the same and what to run next (``--resume``),
    so they stay in ``OUT/logs/ray.log``; the first is said on the console in the command's words
    (:data:`STOPPING_LINE`, by :func:`_say_stopping`), as Tune saves its state before that line comes."""
    return message.startswith(("Stop signal received", "Experiment has been interrupted, but the most recent state"))


STOPPING_LINE = "stopping: Tune saves its state first (a second Ctrl-C or SIGTERM skips that)"
"""The console's line when Tune takes a Ctrl-C or SIGTERM of the driver (its "Stop signal received" warning, kept in
``OUT/logs/ray.log``): the state is saved before the command's ``interrupted: ...`` line, which can take seconds."""


@contextlib.contextmanager
def _say_stopping(con: Console) -> Iterator[None]:
    """While the block runs, Tune's "Stop signal received" record (demoted to INFO by :func:`tune_stop_signal`'s
    filter, which runs first) makes ``con`` say :data:`STOPPING_LINE` once on its error stream."""
    said = []

    def say(record: logging.LogRecord) -> bool:
        if not said and record.getMessage().startswith("Stop signal received"):
            said.append(True)
            con.say(STOPPING_LINE, err=True)
        return True

    from loopscale.cluster.connect import logger_filter

    with logger_filter(TUNE_LOGGER, say):
        yield


TUNE_SYNC_LOGGER = "ray.tune.execution.experiment_state"
SYNCER_LOGGER = "ray.train._internal.syncer"


def tune_sync_met_a_renamed_temp_file(message: str) -> bool:
    """Whether Tune's report of a failed background copy of its state only says that the copy listed the temporary
    file of an atomic save (``driver_artifacts/.<uuid>-tmp-<name>``) that the save renamed before the copy reached
    it (``FileNotFoundError``): the ERROR "Saving experiment state to storage at ... failed" (a forced snapshot
    waiting for the copy) or the syncer's WARNING "Last sync command failed" (the next copy finding the last one
    failed). Tune copies the state again at the next snapshot and at the end of the experiment, so nothing is lost
    (if the driver dies first, ``--resume`` finds the state torn or mixed and goes on in a new experiment): noise on
    the console, kept in ``OUT/logs/ray.log``. ``message``: the record's message, with its exception as a last line
    ``<Type>: <text>`` when it has one (:func:`loopscale.cluster.connect.warning_as_info`)."""
    lines = [ln for ln in message.splitlines() if ln.strip()]
    return (
        bool(lines)
        and lines[0].startswith(("Saving experiment state to storage at", "Last sync command failed"))
        and lines[-1].startswith("FileNotFoundError:")
        and "driver_artifacts/" in lines[-1]
        and "-tmp-" in lines[-1]
    )


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves) and carriage returns."""
    return _ANSI.sub("", text)


def notice_of(line: str) -> str | None:
    """The one-line notice a captured output line deserves on the console, or None.

    A line is a notice when it carries a log level WARNING/ERROR/CRITICAL/FATAL, is the last line of a traceback
    (``SomeError: message``) or a Python warning (``file.py:12: UserWarning: message``, said ``warning: message``
    as the console script says its own, ``warning (FutureWarning): message`` for another class than
    ``UserWarning`` and loopscale's ``CorpusWarning``; or ``warning: message`` as the console script formats them).
    The notice is the line
    without escape codes, worker prefix (``(trainable pid=..)``), timestamp and the suffix of Ray's log
    deduplication (``[repeated 3x across cluster]``), at most :data:`NOTICE_MAX` characters (a longer one keeps its
    start and its end). Traceback bodies (indented lines) are never notices."""
    text = strip_ansi(line).rstrip()
    if not text or text[0].isspace():
        return None
    text = _PREFIX.sub("", text)
    text = _LOGHEAD.sub("", text)
    text = _RAY_DEDUP.sub("", text)  # a repeat: the same notice as the line Ray forwarded first
    m = _PYWARN.search(text)
    if m:  # said as the console script says this process's own warnings: "warning: ..." (another class named)
        kind = m.group(1)
        text = ("warning: " if kind in ("UserWarning", "CorpusWarning") else f"warning ({kind}): ") + text[m.end():]
    elif not (_LEVEL.search(text) or _EXC.match(text) or text.startswith("warning: ")):
        return None  # "warning: ..." is a Python warning as the console script formats it (loopscale.sweep.cli)
    return (
        text
        if len(text) <= NOTICE_MAX
        else text[: NOTICE_MAX // 2 - 2] + " … " + text[-(NOTICE_MAX // 2 - 1) :]
    )


def _fmt_s(s: float | None) -> str:
    if s is None or s != s or s == float("inf"):
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


class Console:
    """Where a command's own lines go: the terminal (or pipe) the command was started from.

    Args:
        stream: a text stream (the command's original stdout, or stderr with ``--json``).
        err: where notices (warnings and errors of captured output) go when no progress bar is on screen
            (default: ``stream``; a session passes the original stderr).
        interactive: draw progress bars (default: ``stream.isatty()``).
        verbose: also show every line of Ray's captured output.
    """

    def __init__(self, stream, *, interactive: bool | None = None, verbose: bool = False, err=None):
        self.stream = stream
        self.err = err or stream
        self.interactive = bool(stream.isatty()) if interactive is None else interactive
        self.verbose = verbose
        self.log_path: Path | None = None
        self._seen: set[str] = set()
        self._lock = threading.RLock()
        self._live = None  # the rich Progress on screen, if any
        self.hidden_notices = 0
        self.out_dir: Path | None = None
        self.text_width: int | None = None  # characters left for a progress bar's text (set by progress())

    def say(self, msg: str, *, err: bool = False) -> None:
        """Print one line (above a progress bar on screen); ``err``: to the error stream."""
        with self._lock:
            if self._live is not None:
                self._live.console.print(msg, markup=False, highlight=False, soft_wrap=True)
            else:
                f = self.err if err else self.stream
                f.write(strip_ansi(msg) + "\n")
                f.flush()

    def captured_line(self, line: str) -> None:
        """Handle one line of captured (Ray) output: every line with ``verbose``, else warnings/errors once."""
        if self.verbose:
            self.say(strip_ansi(line.rstrip("\n")), err=True)
            return
        note = notice_of(line)
        if note is None:
            return
        key = _IDS.sub("#", _WARN_HEAD.sub("", note))  # this process's warning and a trial's are one message
        with self._lock:
            if key in self._seen:
                self.hidden_notices += 1
                return
            self._seen.add(key)
        self.say(note, err=True)

    def progress(self):
        """A ``rich.progress.Progress`` drawn on this console (interactive consoles only)."""
        from rich.console import Console as RichConsole
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Column

        rc = RichConsole(file=self.stream, force_terminal=True, highlight=False)
        # a terminal under 100 columns gets a bar of 10 cells, leaving the text 42 on 80 columns; the views give
        # shorter texts that fit it (see _View.show), so the counts are not cut
        bar = 20 if rc.width >= 100 else 10
        self.text_width = max(rc.width - _BAR_RESERVE - bar, 12)
        return Progress(
            TextColumn("{task.fields[stage]:<9}"),
            BarColumn(bar_width=bar),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn(
                "{task.description}",
                table_column=Column(no_wrap=True, overflow="ellipsis", max_width=self.text_width),
            ),
            console=rc,
            refresh_per_second=4,
            transient=False,
            # sys.stdout/sys.stderr stay on the captured descriptors: Ray's prints must not reach the screen
            redirect_stdout=False,
            redirect_stderr=False,
        )


_CURRENT: Console | None = None
_VIEW = None  # the active progress view (GridView, LRView or BootstrapView)


def current() -> Console:
    """The console of the open :func:`session`, or a plain console on stderr outside one (library use)."""
    return _CURRENT or Console(sys.stderr, interactive=False)


@contextlib.contextmanager
def _capture(log_path: Path, con: Console) -> Iterator[None]:
    """Send file descriptors 1 and 2 through a pipe: a reader thread writes each line to ``log_path`` (escape codes
    removed) and hands it to ``con.captured_line``. The descriptors are restored on exit (also on Ctrl-C)."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    saved = (os.dup(1), os.dup(2))
    head = f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {' '.join(sys.argv)}\n"

    log = None  # opened at the first output: a command refused before any output leaves no folder behind
    log_failed = False  # a log that cannot be written (a full disk) is given up, never the drain

    def to_log(text: str) -> None:
        nonlocal log, log_failed
        if log_failed:
            return
        try:
            if log is None:
                log_path.parent.mkdir(parents=True, exist_ok=True)
                log = open(log_path, "a", encoding="utf-8", errors="replace")
                log.write(head)
            log.write(text)
            log.flush()
        except OSError as e:  # e.g. ENOSPC: the pipe must still be drained, or every print of the driver fails
            log_failed = True
            try:
                con.say(f"warning: Ray's output can no longer be written to {log_path} ({e.strerror or e}); "
                        "the command goes on, its output from here on is not kept", err=True)
            except Exception:
                pass

    def reader() -> None:
        buf = b""
        with os.fdopen(r, "rb", buffering=0) as src:
            while True:
                chunk = src.read(65536)
                if not chunk:
                    break
                buf += chunk
                *raw_lines, buf = buf.split(b"\n")
                lines = [raw.decode("utf-8", errors="replace") for raw in raw_lines]
                if lines:  # one write and flush per chunk
                    to_log("".join(strip_ansi(line) + "\n" for line in lines))
                for line in lines:
                    try:
                        con.captured_line(line)
                    except Exception:  # the console must never stop the drain (writers would block)
                        pass
        if buf:
            to_log(strip_ansi(buf.decode("utf-8", errors="replace")) + "\n")
        if log is not None:
            try:
                log.close()
            except OSError:
                pass

    th = threading.Thread(target=reader, name="loopscale-console-capture", daemon=True)
    th.start()
    os.dup2(w, 1)
    os.dup2(w, 2)
    os.close(w)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        # processes Ray started may still hold the pipe; the reader drains it for as long as they live
        th.join(timeout=2.0)


@contextlib.contextmanager
def session(
    out_dir: str | Path | None, *, verbose: bool = False, json_mode: bool = False
) -> Iterator[Console]:
    """Open the console of one command writing into ``out_dir``.

    Lines of the command (:meth:`Console.say`) go to the original stdout (stderr with ``json_mode``), notices from
    the captured output to the original stderr; Ray's output goes to ``out_dir/logs/ray.log`` (created at its first
    line; see the module docstring). With ``out_dir`` None nothing is captured.
    Progress bars are drawn only when that stream is a terminal and ``json_mode`` is off.
    """
    global _CURRENT
    fd = 2 if json_mode else 1
    sys.stdout.flush()
    stream = os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")
    err = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    con = Console(stream, interactive=stream.isatty() and not json_mode, verbose=verbose, err=err)
    prev = _CURRENT
    _CURRENT = con
    try:
        if out_dir is None:
            yield con
        else:
            from loopscale.cluster.connect import warning_as_info

            con.out_dir = Path(out_dir).resolve()
            con.log_path = con.out_dir / "logs" / LOG_NAME
            with (
                _stop_notices_to(con),
                _capture(con.log_path, con),
                warning_as_info(TUNE_ANALYSIS_LOGGER, tune_metrics_never_written),
                warning_as_info(TUNE_LOGGER, tune_stop_signal),
                _say_stopping(con),
                warning_as_info(TUNE_SYNC_LOGGER, tune_sync_met_a_renamed_temp_file, levels=(logging.ERROR,)),
                warning_as_info(SYNCER_LOGGER, tune_sync_met_a_renamed_temp_file, one_line=True),
            ):
                yield con
            if con.hidden_notices and not verbose:
                con.say(
                    f"({con.hidden_notices} repeated warnings/errors not shown; all output: {con.log_path})",
                    err=True,
                )
    except BaseException as e:  # the command's record says how it ended (status of the folder then says why)
        from click.exceptions import Exit

        if con.out_dir is not None and not isinstance(e, GeneratorExit | SystemExit | Exit):
            from loopscale.sweep.status import mark_ended

            mark_ended(con.out_dir, e)
        raise
    finally:
        end_view()
        _CURRENT = prev
        stream.close()
        err.close()


@contextlib.contextmanager
def _stop_notices_to(con: Console) -> Iterator[None]:
    """While the block runs, the driver's last line after a SIGTERM that also stopped Ray
    (:data:`loopscale.cluster.connect.say_stop`) goes to ``con``'s error stream, not to the captured fd 2."""
    from loopscale.cluster import connect

    saved, connect.say_stop = connect.say_stop, (lambda msg: con.say(msg, err=True))
    try:
        yield
    finally:
        connect.say_stop = saved


# --- progress views ------------------------------------------------------------------------------------------


_BAR_RESERVE = 28
"""Columns of a progress line besides the bar and the text: the stage (9), ``M/N`` (up to 9 for 4-digit
totals), the elapsed time (7) and the separators."""


def _fitting(texts: str | tuple[str, ...], width: int | None) -> str:
    """The first of ``texts`` (longest first) of at most ``width`` characters; the last when none fits."""
    if isinstance(texts, str):
        return texts
    if width is not None:
        for t in texts:
            if len(t) <= width:
                return t
    return texts[-1] if width is not None else texts[0]


class _View:
    """A progress display of one stage: a rich bar on a terminal, else a plain line now and then."""

    stage = "?"

    def __init__(self, con: Console, total: int):
        self.con = con
        self.total = int(total)
        self.t0 = time.time()
        self._plain_last = self.t0
        self._beat = 0.0
        self._urgent = False  # write progress.json at the next show, not HEARTBEAT_S after the last write
        self._progress = None
        self._task = None
        if con.interactive:
            self._progress = con.progress()
            self._task = self._progress.add_task("", total=max(self.total, 1), stage=self.stage)
            self._progress.start()
            con._live = self._progress

    def show(
        self, completed: int, text: str, force: bool = False, short: str | tuple[str, ...] | None = None
    ) -> None:
        """Show ``completed`` of ``total`` with ``text``. ``short``: the text next to a bar (default ``text``), or
        alternatives from the longest to the shortest, of which the first that fits the terminal is shown (the last
        one, cut, when none fits)."""
        now = time.time()
        if self._urgent or now - self._beat >= HEARTBEAT_S:
            self._beat, self._urgent = now, False
            self.heartbeat()
        if self._progress is not None:
            desc = _fitting(short or text, self.con.text_width)
            self._progress.update(self._task, completed=completed, total=max(self.total, 1), description=desc)
            return
        if force or now - self._plain_last >= PLAIN_EVERY_S:
            self._plain_last = now
            self.con.say(f"{self.stage}: {completed}/{self.total} {text}")

    def summary(self) -> str | None:
        return None

    def state(self) -> dict:
        """What ``progress.json`` records of this stage (besides the stage, the times, pid and host)."""
        return {}

    def heartbeat(self, finished: bool = False) -> None:
        """Write ``OUT/logs/progress.json`` (what ``loopscale status`` shows of a running command)."""
        out = self.con.out_dir
        if out is None:
            return
        from loopscale.cluster.storage import write_text_atomic

        doc = {
            "stage": self.stage,
            "finished": finished,
            "total": self.total,
            **self.state(),
            "started_at": self.t0,
            "updated_at": time.time(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        try:
            (out / "logs").mkdir(parents=True, exist_ok=True)
            write_text_atomic(str(out / "logs" / PROGRESS_NAME), json.dumps(doc))
        except OSError:
            pass

    def close(self) -> None:
        self.heartbeat(finished=True)
        if self._progress is not None:
            self._progress.stop()
            self.con._live = None
            self._progress = None
        line = self.summary()
        if line:
            self.con.say(line)


def planned_flops(cell: dict) -> float:
    """Training FLOPs a grid cell will spend: ``C = F * D`` (F: training FLOPs/token of the model accounting,
    paper Sec. 3.2; D: the tokens the trainer will run)."""
    from loopscale.model.accounting import flops_per_token
    from loopscale.model.train import resolve_tokens
    from loopscale.sweep.spec import Cell

    c = Cell.from_dict(cell)
    return float(flops_per_token(c.run.model)) * float(resolve_tokens(c.run))


class GridView(_View):
    """Progress of the grid: runs done/running/pending/failed, tokens/s of all running trials (each trial's tokens
    since its previous report over the time since then, summed; at the first report of an attempt, its tokens over
    the trainer's ``attempt_s``, so that the trial's start-up (Ray worker, imports, data) is not counted; a running
    trial that has not reported yet counts at the mean FLOP rate of those that have), and an ETA = (planned FLOPs of unfinished runs -
    FLOPs their trials already spent) / measured FLOP rate. Both are computed at each report of a trial; between
    reports the rate is kept and the ETA counts down. (A fixed 60 s window read the default job 25 % high: its
    trials report every ~75 s, so each window held both trials' reports, the same 136,533 tokens/s all sweep long.)

    Processed tokens of a trial are ``members * tokens`` (``members``: runs trained together by an ensemble trial,
    1 otherwise; ``tokens``: tokens per run so far, as reported)."""

    stage = "grid"

    def __init__(self, con: Console, total: int, done_before: set[str] | frozenset[str] = frozenset(),
                 before_command: set[str] | frozenset[str] | None = None):
        super().__init__(con, total)
        # of done_before, the runs finished before this command started (the closing line's "before this command")
        self.before_command = frozenset(done_before if before_command is None else before_command)
        # run ids of this sweep finished before this experiment (by an earlier command, or by the experiment a
        # --resume restored first): counted as done, so that a rerun shows the whole grid (32/352), not what is
        # left (0/320)
        self.done_before = frozenset(done_before)
        self.prior = 0  # how many of done_before are outside this experiment's trials (set at each observe)
        self._flops: dict[str, float] = {}
        self._seen: dict[str, float] = {}  # trial id -> tokens per member last reported
        self._spent: dict[str, float] = {}  # trial id -> FLOPs spent by its current attempt
        self._last_report: dict[str, float] = {}  # trial id -> time of its last report with new tokens
        self._first_seen: dict[str, float] = {}  # trial id -> when this display first saw it RUNNING
        self._rate: dict[str, tuple[float, float]] = {}  # trial id -> (tokens/s, FLOP/s) at its last report
        self.counts = {"done": 0, "running": 0, "pending": 0, "failed": 0}  # of runs
        # run ids whose final report this display saw (the results store records a run at that report): done even
        # while Tune does not call their trial done, e.g. one stopped by Ctrl-C between that report and its end
        self._runs_done: set[str] = set()
        self._runs_failed: set[str] = set()  # run ids whose final report said status failed
        self.trials: dict[str, int] = {}  # Tune trials by status (an ensemble trial trains several runs)
        self._trials_before: dict[str, int] = {}  # self.trials at the previous observe
        self.tokens_per_s: float | None = None
        self.eta_s: float | None = None
        self._eta_at = 0.0  # when eta_s was last set

    def _cell_flops(self, cell: dict) -> float:
        rid = cell.get("run_id", "")
        if rid not in self._flops:
            try:
                self._flops[rid] = planned_flops(cell)
            except Exception:  # a cell the accounting cannot price: no ETA contribution
                self._flops[rid] = 0.0
        return self._flops[rid]

    def _flops_per_token(self, runs: list[dict]) -> float:
        from loopscale.model.accounting import flops_per_token
        from loopscale.sweep.spec import Cell

        try:
            return sum(float(flops_per_token(Cell.from_dict(c).run.model)) for c in runs) / max(len(runs), 1)
        except Exception:
            return 0.0

    def observe(self, trials, trial=None, result: dict | None = None) -> None:
        now = time.time()
        if result and result.get(DONE_KEY) and result.get("run_id"):
            # a run the trial reports failed (a corpus error, not retried) ends its trial normally: failed, not done
            (self._runs_failed if result.get("status") == "failed" else self._runs_done).add(str(result["run_id"]))
        reported = bool(trial is not None and result and "tokens" in result and not result.get("replayed"))
        if reported:
            tok = float(result["tokens"])
            members = int(result.get("members") or 1)
            last = self._seen.get(trial.trial_id)
            first = last is None or tok < last
            if first:  # first report here, or a restart: this attempt began at start_tokens
                last = min(tok, float(result.get("start_tokens") or 0.0))
            delta = tok - last
            self._seen[trial.trial_id] = tok
            fpt = self._flops_per_token(trial_cells(trial.config))
            self._spent[trial.trial_id] = tok * members * fpt
            if delta > 0:
                tid = trial.trial_id
                since = self._last_report.get(tid, self._first_seen.get(tid, self.t0))
                attempt_s = result.get("attempt_s")
                if first and isinstance(attempt_s, int | float) and attempt_s > 0:
                    since = now - float(attempt_s)  # from its first step: the trial's start-up is not training
                if now - since > 0:
                    self._rate[tid] = (delta * members / (now - since), delta * members * fpt / (now - since))
                self._last_report[tid] = now
        counts = {"done": 0, "running": 0, "pending": 0, "failed": 0}
        remaining = 0.0
        self.trials = {}
        in_trials: set[str] = set()
        running: set[str] = set()
        finished = self.done_before | self._runs_done
        for t in trials:
            if t.status == "RUNNING":
                running.add(t.trial_id)
                self._first_seen.setdefault(t.trial_id, now)
            self.trials[t.status] = self.trials.get(t.status, 0) + 1
            runs = trial_cells(t.config)
            in_trials.update(c.get("run_id", "") for c in runs)
            key = {"TERMINATED": "done", "RUNNING": "running", "ERROR": "failed"}.get(t.status, "pending")
            if key == "done" and not (getattr(t, "last_result", None) or {}).get("done"):
                key = "pending"  # stopped by Ctrl-C before its runs finished: TERMINATED too, but not done
            if key != "done":  # its runs recorded already (this command's reports, or before it) are done
                ended = [c for c in runs if c.get("run_id", "") in finished]
                counts["done"] += len(ended)
                runs = [c for c in runs if c.get("run_id", "") not in finished]
            failed = [c for c in runs if c.get("run_id", "") in self._runs_failed]
            if failed:
                counts["failed"] += len(failed)
                runs = [c for c in runs if c.get("run_id", "") not in self._runs_failed]
            counts[key] += len(runs)
            if key in ("running", "pending"):
                want = sum(self._cell_flops(c) for c in runs)
                remaining += max(0.0, want - (self._spent.get(t.trial_id, 0.0) if key == "running" else 0.0))
        self.prior = len(self.done_before - in_trials)
        counts["done"] += self.prior
        # a run finished or a trial changed state: progress.json says so now, so that `loopscale status` does not
        # set up to HEARTBEAT_S old trial counts beside the run records written since
        self._urgent = self._urgent or (counts, self.trials) != (self.counts, self._trials_before)
        self._trials_before = dict(self.trials)
        self.counts = counts
        self.total = max(self.total, sum(counts.values()))
        rates = [v for tid, v in self._rate.items() if tid in running]
        if rates:
            # a trial that started since and has not reported yet trains too: counted at the mean FLOP rate of the
            # running trials that reported (trials share the workers alike); left out, it made the rate halve and
            # the ETA double for a report's time after each new trial started
            fps_mean = sum(v[1] for v in rates) / len(rates)
            for t in trials:
                if t.trial_id in running and t.trial_id not in self._rate:
                    fpt = self._flops_per_token(trial_cells(t.config))
                    rates.append((fps_mean / fpt if fpt > 0 else 0.0, fps_mean))
        if reported and rates:
            self.tokens_per_s = sum(v[0] for v in rates)
            fps = sum(v[1] for v in rates)
            self.eta_s = remaining / fps if fps > 0 else None
            self._eta_at = now
        elif self.eta_s is not None:
            # between reports (trials of the default job report about once a minute, so a window may hold none):
            # the rate stays that of the last report and the ETA counts down, instead of "0 tokens/s, ETA ?"
            self.eta_s = max(0.0, self.eta_s - (now - self._eta_at))
            self._eta_at = now
        rate = f"{self.tokens_per_s:,.0f}" if self.tokens_per_s is not None else "?"
        eta = _fmt_s(self.eta_s) if counts["running"] + counts["pending"] else "0s"
        tail = f"running {counts['running']} · pending {counts['pending']} · failed {counts['failed']} · "
        self.show(
            counts["done"] + counts["failed"],
            f"done {counts['done']} · {tail}{rate} tokens/s · ETA {eta}",
            short=self._short(eta, rate, counts),
        )

    @staticmethod
    def _short(eta: str, rate: str, c: dict) -> tuple[str, ...]:
        """Texts next to the bar, longest first: the ETA and the failed count stay on any terminal; the rate goes
        first, then the words shrink (80 columns show ``ETA 25m · run 32 · wait 320 · failed 0``)."""
        run, wait, fail = c["running"], c["pending"], c["failed"]
        return (
            f"ETA {eta} · {rate} tok/s · {run} running · {wait} pending · {fail} failed",
            f"ETA {eta} · {run} running · {wait} pending · {fail} failed",
            f"ETA {eta} · run {run} · wait {wait} · failed {fail}",
            f"ETA {eta} · failed {fail} · run {run}",
            f"ETA {eta} · failed {fail}",
        )

    def state(self) -> dict:
        return {
            "counts": self.counts,
            "counts_of": "runs",
            "trials": self.trials,
            "tokens_per_s": self.tokens_per_s,
            "eta_s": self.eta_s,
        }

    def summary(self) -> str:
        c = self.counts
        # the rate of all running trials together at their last reports, not a run's own tokens_per_s (the report's)
        rate = (
            f", last rate {self.tokens_per_s:,.0f} tokens/s (the trials running at the last reports, together)"
            if self.tokens_per_s
            else ""
        )
        # a resumed grid counts the runs finished before this command (by an earlier one, or by the experiment it
        # restored before that stopped): the line said "12 runs done" of a command that trained 8
        b = len(self.before_command)
        before = f" ({b} of them before this command, {c['done'] - b} by it)" if b else ""
        return (
            f"grid: {c['done']} runs done{before}, {c['failed']} failed, {c['running'] + c['pending']} unfinished "
            f"in {_fmt_s(time.time() - self.t0)}{rate}"
        )


class LRView(_View):
    """Progress of LR tuning: trials done/pruned/failed over all studies, the best LR so far per (size, r), and an
    ETA = time so far x trials left / trials finished in this command (pruned trials end early, so it is an
    estimate from the mix seen so far; none before the first trial ends). Between trials the ETA counts down.
    Trials the studies held before this command (an interrupted study that ``--resume`` goes on with) count as
    finished, so the counts reach the total when the last study ends and the ETA is of the trials left.

    Args:
        studies: {study name: (size, r)} of the studies this command runs.
        per_study: trials per study (``tune.num_samples``, or the number of ``lr_values``).
        before: (study name, lr, Optuna state, value) of each trial those studies held before this command.
    """

    stage = "tune-lr"

    def __init__(
        self,
        con: Console,
        studies: dict[str, tuple[int, int]],
        per_study: int,
        before: list[tuple[str, float, str, float | None]] | tuple = (),
    ):
        super().__init__(con, len(studies) * per_study)
        self.studies = studies
        self.states = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
        self.best: dict[tuple[int, int], tuple[float, float]] = {}  # (size, r) -> (value, lr)
        self._eta: float | None = None
        self._eta_at = self.t0
        for trial in before:
            self._count(*trial)
        self.prior = sum(self.states.values())  # trials finished before this command
        self.total = max(self.total, self.prior)

    def _count(self, study_name: str, lr: float, state: str, value: float | None) -> None:
        self.states[state] = self.states.get(state, 0) + 1
        key = self.studies.get(study_name)
        if key is not None and state == "COMPLETE" and value is not None:
            if key not in self.best or (value, lr) < self.best[key]:
                self.best[key] = (float(value), float(lr))

    def record(self, study_name: str, lr: float, state: str, value: float | None) -> None:
        self._count(study_name, lr, state, value)
        n = sum(self.states.values())
        # a study that had finished trials before this command may try other LRs than it would have (its sampler
        # past its random start): more trials than planned
        self.total = max(self.total, n)
        now = time.time()
        self._eta, self._eta_at = (now - self.t0) * (self.total - n) / (n - self.prior), now
        # a trial ended: progress.json says so now, as the grid's display does when its counts change (nothing
        # writes it between trials, so a write left to the heartbeat would wait for the next trial to end, and
        # `loopscale status` would show the counts, best LR and ETA of a trial ago)
        self._urgent = True
        self.show(n, self._text(), short=self._short())

    @property
    def eta_s(self) -> float | None:
        """Seconds left (estimate), counted down since the last trial ended; None before the first."""
        return None if self._eta is None else max(0.0, self._eta - (time.time() - self._eta_at))

    def state(self) -> dict:
        """Trials by Optuna state (COMPLETE / PRUNED / FAIL), [size, r, lr, val] of the best LR per (size, r) and
        ``eta_s``."""
        best = [[s, r, lr, v] for (s, r), (v, lr) in sorted(self.best.items())]
        return {"trials": dict(self.states), "best": best, "eta_s": self.eta_s}

    def _counts(self) -> str:
        return f"done {self.states['COMPLETE']} · pruned {self.states['PRUNED']} · failed {self.states['FAIL']}"

    def _eta_text(self) -> str | None:
        """``ETA 1m10s`` while trials are left and an estimate exists, else None."""
        left = self.total - sum(self.states.values())
        return f"ETA {_fmt_s(self.eta_s)}" if self.eta_s is not None and left > 0 else None

    def _text(self, with_eta: bool = True) -> str:
        best = "; ".join(
            f"size {s} r {r}: lr {lr:.3g} ({v:.3f})" for (s, r), (v, lr) in sorted(self.best.items())
        )
        eta = self._eta_text() if with_eta else None
        return self._counts() + (f" · {eta}" if eta else "") + (f" · best {best}" if best else "")

    def _short(self) -> tuple[str, str]:
        """Texts next to a progress bar, longest first: the ETA and the counts, or on a narrow terminal (under 80
        columns) the ETA and the failed count."""
        eta = f"{self._eta_text()} · " if self._eta_text() else ""
        return eta + self._counts(), f"{eta}failed {self.states['FAIL']}"

    def summary(self) -> str:
        n = sum(self.states.values())
        before = f" ({self.prior} of them before this command)" if self.prior else ""
        return f"tune-lr: {n} trials{before} in {_fmt_s(time.time() - self.t0)}: {self._text(with_eta=False)}"


class BootstrapView(_View):
    """Progress of a bootstrap: refits done of B (one display per bootstrap call of the fit). The summary line
    counts the refits each bootstrap planned (its B) and, when some failed, how many were ok (the bootstraps'
    results, :meth:`result`); without results, the refits run."""

    stage = "bootstrap"

    _PHASES = {
        "per_r": "for the intervals of phi per r, the identification check's",
        "variants": "for the variant comparison",
    }
    """What the bootstraps of a phase (``progress_listener``'s ``phase``) were for, as the summary says."""

    def __init__(self, con: Console, total: int = 0, B: int | None = None):
        super().__init__(con, total)
        self.done = 0
        self.B = B  # the joint fit's resamples (``loopscale run``'s --bootstrap), to name the calls in the summary
        self.calls: list[int] = []  # refits of each bootstrap call so far
        self.calls_done: list[int] = []  # of them done (less than planned when the fit was stopped)
        self.results: list[tuple[int, int, str | None]] = []  # (planned, ok, phase) of each ended bootstrap

    def step(self, done: int, total: int) -> None:
        if done == 0 or not self.calls:  # a new bootstrap call started (run_chunks reports (0, total) first)
            self.calls.append(int(total))
            self.calls_done.append(0)
            self._urgent = True  # status read the last call's "200 of 200" for seconds into the next one
        self.total, self.done = int(total), int(done)
        self.calls_done[-1] = self.done
        # which bootstrap the count is of: a run's analysis runs several in a row (each variant's joint fit, of B
        # refits, then the per-r intervals'), and '12/194' after '176/200' read as a count gone backwards
        self.show(self.done, f"refits ({self._call_label()})")

    _CALL_NAMES = {"per_r": "phi per r", "variants": "variant comparison"}
    """A running bootstrap's name by its phase (:func:`loopscale.fit.bootstrapping.current_phase`)."""

    def _call_label(self) -> str:
        """Which bootstrap call the count is of: 'bootstrap 3, joint fit' (by the phase the fit is in; a call of
        B refits outside a phase is a joint fit; the variant comparison's calls have B refits too)."""
        from loopscale.fit.bootstrapping import current_phase

        what = self._CALL_NAMES.get(current_phase() or "")
        if what is None and self.B:
            what = "joint fit" if self.total == self.B else "phi per r or variant comparison"
        return f"bootstrap {len(self.calls)}{f', {what}' if what else ''}"

    def result(self, planned: int, ok: int, phase: str | None = None) -> None:
        """A bootstrap ended: ``planned`` resamples, ``ok`` of them refitted (``progress_listener``'s)."""
        self.results.append((int(planned), int(ok), phase))

    def state(self) -> dict:
        """``done`` of ``total`` refits of the current bootstrap call, ``call`` (its label, as the console shows
        it) and ``calls_ended`` (the calls before it, with their refits)."""
        return {"done": self.done, "call": self._call_label() if self.calls else None,
                "calls_ended": len(self.calls) - 1 if self.calls else 0,
                "refits_ended": sum(self.calls_done[:-1])}  # fmt: skip

    def _named_calls(self) -> str:
        """The refit calls by their sizes: each variant's joint fit (B), then the per-r phi intervals."""
        n = " + ".join(str(k) for k in self.calls)
        what = f"{len(self.calls)} bootstraps: {n}" if len(self.calls) > 1 else n
        joint = [k for k in self.calls if k == self.B]
        if self.B and joint:  # a run's analysis: each variant's joint fit (B), then the per-r phi intervals
            rest = sum(self.calls) - sum(joint)
            what = (f"joint fit B = {self.B}" if len(joint) == 1 else f"{len(joint)} joint fits, B = {self.B} each") + (
                f"; {rest} {self._PHASES['per_r']}" if rest else "")
        return what

    def _named_results(self) -> str:
        """The ended bootstraps by what they were for, each with its failed refits if any: the joint fits
        (bootstraps of their own; without ``B``, "bootstraps"), the per-r intervals, the variants'."""
        parts = []
        own = [(p, k) for p, k, ph in self.results if ph not in self._PHASES]
        if own:
            sizes = {p for p, _ in own}
            name = "joint fit" if self.B else "bootstrap"
            if len(own) == 1:
                text = f"{name} B = {own[0][0]}"
            elif len(sizes) == 1:
                text = f"{len(own)} {name}s, B = {own[0][0]} each"
            else:
                text = f"{len(own)} {name}s: " + " + ".join(str(p) for p, _ in own)
            parts.append((text, sum(p - k for p, k in own)))
        for phase, words in self._PHASES.items():
            group = [(p, k) for p, k, ph in self.results if ph == phase]
            if group:
                parts.append((f"{sum(p for p, _ in group)} {words}", sum(p - k for p, k in group)))
        return "; ".join(text + (f": {failed} failed" if failed else "") for text, failed in parts)

    def summary(self) -> str | None:
        if not self.calls and not self.results:
            return None
        took = _fmt_s(time.time() - self.t0)
        done, run = sum(self.calls_done), sum(self.calls)
        if done < run:  # stopped (Ctrl-C) before the last call ended: what was done, not what was planned
            return f"bootstrap: stopped after {done} of {run} refits ({self._named_calls()}) in {took}"
        if not self.results:  # refits without their bootstraps' results (run_chunks alone)
            return f"bootstrap: {run} refits ({self._named_calls()}) in {took}"
        planned, ok = sum(p for p, _, _ in self.results), sum(k for _, k, _ in self.results)
        if ok < planned:  # no non-degenerate draw, or a non-finite refit: dropped from the CIs
            what = self._named_results()
            return f"bootstrap: {ok} of {planned} refits ok, {planned - ok} failed ({what}) in {took}"
        return f"bootstrap: {planned} refits ({self._named_results()}) in {took}"


def start_view(view: _View) -> _View:
    """Make ``view`` the active display (closing the previous one)."""
    global _VIEW
    end_view()
    _VIEW = view
    return view


def end_view() -> None:
    """Close the active display (its summary line is printed)."""
    global _VIEW
    v, _VIEW = _VIEW, None
    if v is not None:
        v.close()


@contextlib.contextmanager
def ending_view() -> Iterator[None]:
    """Close the active display when the block ends (also on an error)."""
    try:
        yield
    finally:
        end_view()


_GRID_DONE_BEFORE: frozenset[str] = frozenset()  # see grid_done_before
_GRID_DONE_BEFORE_COMMAND: frozenset[str] = frozenset()  # see grid_done_before


@contextlib.contextmanager
def grid_done_before(run_ids, before_command=None) -> Iterator[None]:
    """While the block runs, a grid display started by :func:`grid_observe` counts ``run_ids`` (runs of this sweep
    already finished) as done: a resumed sweep shows its progress over the whole grid. ``before_command``: those
    of them finished before this command started (default ``run_ids``), which its closing line tells apart from
    the runs this command trained."""
    global _GRID_DONE_BEFORE, _GRID_DONE_BEFORE_COMMAND
    saved = _GRID_DONE_BEFORE, _GRID_DONE_BEFORE_COMMAND
    _GRID_DONE_BEFORE = frozenset(run_ids)
    _GRID_DONE_BEFORE_COMMAND = _GRID_DONE_BEFORE if before_command is None else frozenset(before_command)
    try:
        yield
    finally:
        _GRID_DONE_BEFORE, _GRID_DONE_BEFORE_COMMAND = saved


def grid_observe(trials, trial=None, result: dict | None = None) -> None:
    """Update the grid display from a Tune callback (starts one when none is active)."""
    v = _VIEW
    if not isinstance(v, GridView):
        cells = {c.get("run_id", "") for t in trials for c in trial_cells(t.config)}
        total = len(cells) + len(_GRID_DONE_BEFORE - cells)
        v = start_view(GridView(current(), total, done_before=_GRID_DONE_BEFORE,
                                before_command=_GRID_DONE_BEFORE_COMMAND & _GRID_DONE_BEFORE))  # fmt: skip
    v.observe(trials, trial, result)


def lr_trial_finished(study_name: str, lr: float, state: str, value: float | None) -> None:
    """Record one finished LR trial on the active LR display (no-op without one)."""
    if isinstance(_VIEW, LRView):
        _VIEW.record(study_name, lr, state, value)


@contextlib.contextmanager
def bootstrap_view(B: int | None = None) -> Iterator[None]:
    """Show bootstrap progress (refits done of B) while the block runs (``loopscale.fit.bootstrapping`` reports
    it, and each bootstrap's planned and ok refits, through
    :func:`loopscale.fit.bootstrapping.progress_listener`); ``B``, the joint fit's resamples, names the calls
    in the summary line (joint fits, then the per-r intervals), which says how many refits failed, if any."""
    from loopscale.fit.bootstrapping import progress_listener

    view = start_view(BootstrapView(current(), B=B))
    with progress_listener(view.step, view.result):
        try:
            yield
        finally:
            end_view()
