"""``loopscale status OUT``: what a run or sweep has done and is doing, read from its files only.

Sources (nothing is trained, started or changed; files are only read):

* ``OUT/logs/command.json`` (:func:`mark_started`): written by ``loopscale run``, ``sweep`` and ``tune-lr`` when they
  start, before Ray starts: the command line, its kind (run | sweep | tune-lr), pid, host and start time;
* ``OUT/spec.yaml`` (written by ``loopscale run``, ``sweep`` and ``tune-lr``; not by older versions' ``sweep``):
  the planned cells, hence the number of runs;
* ``OUT/runs.parquet``, ``OUT/parts/runs/*.parquet`` and the footers of ``OUT/parts/curves/*.parquet``
  (:mod:`loopscale.sweep.store`, read as ``run`` and ``sweep`` read them, in its look-only mode): one record per
  finished or failed run, the newest ``finished_at`` per run id (a runs part without its curves part is no record);
* ``OUT/logs/progress.json`` (:mod:`loopscale.sweep.console`): the stage a progress display shows, its counts (of
  runs), Tune trials, tokens/s and ETA, its pid and host;
* Tune's experiment state under the storage (``--storage``; default ``OUT/tune``): the trials of the newest grid
  experiment and their status (``ray.tune.ExperimentAnalysis``);
* ``OUT/run_meta.json`` (stage wall times; ``fit_unfinished`` while a fit stage runs or after it was stopped,
  ``report_unfinished`` while the report is written or after the command stopped there),
  ``OUT/lr_table.parquet`` and ``OUT/tune_lr/`` (LR tuning),
  ``OUT/fit/analysis.json`` (the fit headline, as ``loopscale run`` prints it).

Kind of folder: ``run`` (``run_meta.json``, or the record of a ``run`` command), ``sweep`` (run records or grid
experiments), ``tune-lr`` (``tune_lr/`` or ``lr_table.parquet`` only). A folder with none of these files (nor logs of a command) is not a
loopscale output: :class:`NotAnOutput` (``loopscale status`` exits 2).

States: ``running`` while a command works in OUT: the pid of ``command.json`` is alive on this host (from the
command's start, before its first progress display); with a record of another host or a dead pid, while the
command's newest file (``command.json`` or ``progress.json`` of an unfinished display) is younger than
:data:`STALE_S`, or, without ``command.json``, while the pid of ``progress.json`` is alive (same host) or the file
is younger than :data:`STALE_S` (other host). Otherwise ``finished`` when every stage of the kind is done (run:
the report is written and the last fit stage ended: one stopped midway leaves the stage at ``fit``; sweep: every
run has a record; tune-lr:
``lr_table.parquet`` is written), ``empty`` when nothing was planned or done yet, else ``stopped``.

Run counts (training runs: one per cell and seed; an ensemble trial of Tune trains several): ``ok``,
``diverged`` and ``failed`` from the records; ``running``: runs of the live command's running trials without a
record (from its progress display, else Tune's saved state); ``pending``: the planned runs left (a stopped
command's unfinished runs are pending: ``--resume`` continues them). Tune's own ``trials`` counts are trials. A
tune-lr folder with a spec counts its grid's runs pending, as the JSON has them; the printed status says instead
that tune-lr trains none of them (``loopscale sweep`` or ``run`` of the spec with that ``--out`` does).

Time: ``command_s`` counts from the start of the running command (its process); ``running_stage_s`` from the
start of the current stage's progress display; ``stage_wall_s`` are the stage wall times ``loopscale run`` recorded.
A stopped command's ``ran_s`` counts from its start to its last sign of work its files show (its progress file's
last write, the stages it finished). ``total_s`` adds earlier commands of the folder: the stage wall times
``run_meta.json`` recorded and the time each earlier command ran outside those (a stage killed outright records no
wall time; carried from record to record by :func:`mark_started`).

Tune trial counts of the grid (``tune``): Tune's saved experiment state, written now and then (a running trial is
saved as PENDING); while the grid runs, the command's progress display (which the console shows).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path

import typer

STALE_S = 600.0
"""A status file of another host (or of a dead pid) older than this (s) means the command is no longer running."""
COMMAND_NAME = "command.json"
"""The command record in ``OUT/logs/`` (:func:`mark_started`)."""


class NotAnOutput(ValueError):
    """The folder holds no loopscale output (``loopscale status`` says so and exits 2)."""


def _proc_start(pid: int) -> int | None:
    """Start of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat``, field 22), None where unknown: it
    tells a live command from another process that got its pid later."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError, TypeError):
        return None


def _proc_state(pid: int) -> str | None:
    """State letter of process ``pid`` (``/proc/<pid>/stat``, field 3: R, S, D, Z, ...), None where unknown."""
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError, TypeError):
        return None


def _proc_started_at(ticks: int | None) -> float | None:
    """The wall time (s since the epoch) of a process start given in clock ticks since boot, None where unknown."""
    if ticks is None:
        return None
    try:
        btime = next(
            float(ln.split()[1])
            for ln in Path("/proc/stat").read_text().splitlines()
            if ln.startswith("btime ")
        )
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def mark_started(out_dir: str | Path, kind: str, storage: str | None = None) -> None:
    """Write ``OUT/logs/command.json``: the command line, ``kind`` (run | sweep | tune-lr), pid, host and start time
    of this process, so that ``loopscale status`` calls the command running from its start (before Ray starts and
    before its first progress display). Call it once the command has checked its input and created ``out_dir``.

    Only a command writes it: a process with a console session on ``out_dir`` open
    (:func:`loopscale.sweep.console.session`); library calls (``run_sweep`` from Python, tests) write nothing, as
    their process lives on after the call. A record of this same process is kept (``run`` calling its stages), so
    the start stays the command's. ``stage_wall_s_at_start``: the stage wall times ``run_meta.json`` held then
    (earlier commands' work); ``earlier_unrecorded_s``: the time earlier commands of the folder ran outside those
    stage wall times (a stage killed outright records none; a finished command's start-up and the gaps between its
    stages are counted too), carried on from the record this one replaces when that command has stopped;
    ``earlier_commands``: the earlier commands of the folder, oldest first, each with its ``kind``, ``command``,
    ``cwd`` (its working directory, where a relative ``--storage`` is), ``storage``, ``started_at`` (s since the
    epoch) and ``ran_s`` (s from its start to its last sign of work); ``storage``: where the command keeps Tune's
    state of the grid when it is not ``OUT/tune`` (``--storage``, or the spec's ``storage_path``, which the folder's
    spec.yaml does not keep), as the caller gives it; None for the default, so that a folder moved since is read
    in its own ``tune/``. A failed write is ignored (status is informative)."""
    from loopscale.sweep import console

    out = Path(out_dir).resolve()
    con = console._CURRENT
    if con is None or con.out_dir != out:
        return
    path = out / "logs" / COMMAND_NAME
    pid, host, ticks = os.getpid(), socket.gethostname(), _proc_start(os.getpid())
    cur = _read_json(path)
    if _of_this_process(cur):
        return
    from loopscale.cluster.storage import write_text_atomic

    now = time.time()
    meta = _read_json(out / "run_meta.json") or {}
    walls = dict(meta.get("stage_wall_s") or {})
    earlier = 0.0
    history: list = []
    if cur and not _liveness(cur, _read_json(out / "logs" / "progress.json"))[0]:
        # the previous command of this folder stopped: its time outside the stage wall times run_meta.json holds
        # (a stage killed outright records none) is carried on, so that total_s counts every command's work
        prev: dict = {"total_s": 0.0}
        _stopped_time(cur, _read_json(out / "logs" / "progress.json"), walls, prev)
        at_start = cur.get("stage_wall_s_at_start") or {}
        finished = sum(max(0.0, float(v) - float(at_start.get(k) or 0.0)) for k, v in walls.items())
        earlier = float(cur.get("earlier_unrecorded_s") or 0.0) + max(0.0, prev.get("ran_s", 0.0) - finished)
        history = list(cur.get("earlier_commands") or [])
        if "ran_s" in prev:
            history.append({"kind": cur.get("kind"), "command": cur.get("command"), "cwd": cur.get("cwd"),
                            "storage": cur.get("storage"), "started_at": prev["started_at"],
                            "ran_s": prev["ran_s"]})  # fmt: skip
    doc = {
        "kind": kind,
        "command": "loopscale " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "cwd": os.getcwd(),  # where a relative --storage of the command line is
        "storage": storage,
        "pid": pid,
        "host": host,
        "proc_start": ticks,
        "started_at": min(now, _proc_started_at(ticks) or now),
        "recorded_at": now,
        "stage_wall_s_at_start": walls,
        "earlier_unrecorded_s": earlier,
        "earlier_commands": history,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(str(path), json.dumps(doc))
    except OSError:
        pass
    if storage:
        _claim_storage(storage, out)


#: A file in a local ``--storage`` naming the output folder of the command that last started with that storage:
#: :func:`refuse_busy_storage` asks that folder's command record whether the command still runs.
STORAGE_CLAIM = ".loopscale_folder.json"


def _storage_claim_path(storage: str | None) -> Path | None:
    """The claim file of a local storage (a path or ``file://`` URI), else None (a bucket: not claimed)."""
    from loopscale.cluster.storage import is_local_uri, local_path

    if not storage or not is_local_uri(storage):
        return None
    return Path(local_path(storage)) / STORAGE_CLAIM


def _claim_storage(storage: str, out: Path) -> None:
    """Record in a local ``storage`` that the command of folder ``out`` uses it (a failed write is ignored)."""
    from loopscale.cluster.storage import write_text_atomic

    path = _storage_claim_path(storage)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(str(path), json.dumps({"out": str(out), "pid": os.getpid(), "host": socket.gethostname()}))
    except OSError:
        pass


def _same_storage(a: str | None, b: str | None) -> bool:
    """Whether two local storages (paths or ``file://`` URIs) are one folder (symlinks and ``file://`` resolved)."""
    from loopscale.cluster.storage import is_local_uri, local_path

    if not a or not b:
        return False
    if not (is_local_uri(a) and is_local_uri(b)):
        return a == b
    return Path(local_path(a)).resolve() == Path(local_path(b)).resolve()


def _default_storage(folder: Path, kind: str | None) -> str:
    """Where a command of ``kind`` in ``folder`` keeps its Tune state without ``--storage``: ``OUT/tune_lr/ray``
    for ``tune-lr``, ``OUT/tune`` for ``run`` and ``sweep`` (``run``'s LR stage uses the former too)."""
    return str(folder / ("tune_lr/ray" if kind == "tune-lr" else "tune"))


def _default_storage_home(local: Path) -> Path | None:
    """The output folder whose default storage (:func:`_default_storage`: ``OUT/tune``, ``OUT/tune_lr/ray``) the
    local path ``local`` is, resolved; None for any other path."""
    local = local.resolve()
    if local.name == "tune":
        return local.parent
    if local.name == "ray" and local.parent.name == "tune_lr":
        return local.parent.parent
    return None


def refuse_busy_storage(storage: str | None, out_dir: str | Path, what: str) -> None:
    """Refuse to start ``what`` with a local ``storage`` (Tune's state and the runs' checkpoints) that a live command
    of another output folder uses: two folders given one ``--storage`` at once each trained every run, into the same
    checkpoint files, and a fresh LR study removes an experiment of its name there. The folders asked are the one
    the storage's claim file names (:data:`STORAGE_CLAIM`, written by :func:`mark_started`) and, for a storage
    that is another folder's default one (``OUT/tune``, ``OUT/tune_lr/ray``), that folder; one's command record
    says whether its command still runs (:func:`refuse_busy_folder`'s test) and which storage it uses (its
    ``--storage``, else its default). A storage used one command after another, or a bucket, is not refused; two
    commands started within the same moment can both pass (each checks before the other has written its claim).

    Raises:
        ValueError: naming the storage, the other command, its pid and host and its folder."""
    from loopscale.cluster.storage import local_path

    path = _storage_claim_path(storage)
    if path is None:
        return
    mine = Path(out_dir).resolve()
    folders: list[Path] = []
    claim = _read_json(path)
    if claim and claim.get("out"):
        folders.append(Path(claim["out"]))
    if (home := _default_storage_home(Path(local_path(storage)))) is not None:
        folders.append(home)
    for other in dict.fromkeys(f.resolve() for f in folders):
        if other == mine:
            continue
        cmd = _other_live_command(other)
        if cmd is None:
            continue
        uses = [cmd["storage"]] if cmd.get("storage") else [_default_storage(other, k) for k in
                                                             ({cmd.get("kind")} | ({"tune-lr"} if cmd.get("kind") == "run" else set()))]  # fmt: skip
        if not any(_same_storage(u, storage) for u in uses):
            continue
        raise ValueError(
            f"storage {storage} is in use: `{cmd.get('command')}` (pid {cmd.get('pid')} on {cmd.get('host')}) keeps "
            f"the runs of {other} there; {what} would run beside it (two commands sharing one storage train the "
            "same runs twice, into the same checkpoint files): wait until it ends, or give another --storage"
        )


def _of_this_process(rec: dict | None) -> bool:
    """Whether the command record ``rec`` (:func:`mark_started`) is this process's: its pid, host and process start
    (a pid reused by a later process is not this one)."""
    me = (os.getpid(), socket.gethostname(), _proc_start(os.getpid()))
    return bool(rec) and (rec.get("pid"), rec.get("host"), rec.get("proc_start")) == me


def mark_ended(out_dir: str | Path, exc: BaseException) -> None:
    """Add to ``OUT/logs/command.json`` how this process's command ended when it ended by ``exc``: ``ended`` =
    ``{"how": "interrupted" | "error", "message": its first line, "at": s since the epoch}``, so that ``loopscale
    status`` of the stopped folder says why it stopped (a command that failed read as any stopped one, and the
    ``--resume`` status offered could fail the same way). Only this process's own record is changed (a record of
    another command, or none, is left as it is); a failed write is ignored (status is informative). An error that
    carries ``resume_env`` (e.g. a token-auth refusal: ``RAY_AUTH_MODE=token``) has it recorded as ``ended["resume_env"]``,
    which status puts in front of its ``--resume`` line."""
    from loopscale.cluster.options import Interrupted

    out = Path(out_dir).resolve()
    path = out / "logs" / COMMAND_NAME
    rec = _read_json(path)
    if not _of_this_process(rec):
        return
    how = "interrupted" if isinstance(exc, KeyboardInterrupt | Interrupted) else "error"
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    if how == "error" and not isinstance(exc, ValueError | FileNotFoundError | OSError):
        line = f"{type(exc).__name__}: {line}"  # a bug's exception: its type says what broke
    from loopscale.cluster.storage import write_text_atomic

    try:
        ended = {"how": how, "message": line, "at": time.time()}
        if how == "error" and getattr(exc, "resumable", True) is False:
            ended["resumable"] = False  # its --resume would end the same way (the message says what to change)
        env = getattr(exc, "resume_env", None) if how == "error" else None
        if isinstance(env, dict) and env:  # what the environment of the command that continues needs
            ended["resume_env"] = {str(k): str(v) for k, v in env.items()}
        write_text_atomic(str(path), json.dumps({**rec, "ended": ended}))
    except OSError:
        pass


def _other_live_command(folder: Path) -> dict | None:
    """The command record (:func:`mark_started`) of a command other than this process that works in ``folder``
    now (:func:`_liveness`), else None."""
    rec = _read_json(folder / "logs" / COMMAND_NAME)
    if not rec or (rec.get("pid"), rec.get("host")) == (os.getpid(), socket.gethostname()):
        return None
    alive, cmd, _ = _liveness(rec, _read_json(folder / "logs" / "progress.json"))
    return cmd if alive else None


def refuse_busy_folder(out_dir: str | Path, what: str, why: str | None = None) -> None:
    """Refuse to start ``what`` (a command about to write into ``out_dir``) while another command works there: the
    folder's command record (:func:`mark_started`) names a live process (this host: its pid lives; another host: its
    files are fresh, :func:`_liveness`). Two commands in one folder trained every run twice (two Tune experiments
    sharing the runs' checkpoints), a second ``tune-lr`` deleted the live study of a running ``run``, and a short
    second command replaced the record, so that ``status`` called the running one stopped. A record of this same
    process (``run`` calling its stages) is not another command. ``why``: why ``what`` must wait (default: two
    commands in one folder train every run twice and replace each other's files).

    Raises:
        ValueError: another command is working in ``out_dir`` (the message names it, its pid and host).
    """
    out = Path(out_dir).resolve()
    cmd = _other_live_command(out)
    if cmd is None:
        return
    raise ValueError(
        f"{out} is in use: `{cmd.get('command')}` (pid {cmd.get('pid')} on {cmd.get('host')}) is working there; "
        f"{what} would run beside it ("
        + (why or "two commands in one folder train every run twice and replace each other's files")
        + f"): wait until it ends (`loopscale status {shlex.quote(str(out))}` shows its progress), or stop it first"
    )


def _joined_a_cluster(record: dict | None) -> bool:
    """Whether the folder's last command (``record``: its ``logs/command.json``) joined a Ray cluster: its command
    line has ``--address`` (the estimate of the training left on this machine's CPUs is then no estimate, as the
    dry run says)."""
    return _flag_value(_split_command((record or {}).get("command")), "--address") is not None


#: How long ``status`` waits for the cluster a stopped folder's command joined before calling it gone (s).
CLUSTER_PROBE_TIMEOUT_S = 2.0


def _cluster_gone(line: str | None) -> dict | None:
    """Whether the Ray cluster that a resume command ``line`` joins (its ``--address``) no longer answers as a Ray
    head, asked as the commands ask before joining (:func:`loopscale.cluster.connect.check_reachable`, at most
    :data:`CLUSTER_PROBE_TIMEOUT_S` s): ``{"address", "why"}`` when it does not, else None (no ``--address``, or a
    Ray head answers there). After a head was lost, the ``--resume`` line status offered repeated the dead address,
    and that line was refused at once ("no Ray cluster answers")."""
    from loopscale.cluster.connect import ClusterUnreachable, TokenAuthRefused, check_reachable

    found = _flag_value(_split_command(line), "--address")
    if found is None:
        return None
    try:
        check_reachable(found[2], timeout=CLUSTER_PROBE_TIMEOUT_S)
    except ClusterUnreachable as e:
        return {"address": e.address, "why": e.why}
    except TokenAuthRefused:
        return None  # a head answers there (this shell is not in token mode: the resume line's env says so)
    except ValueError:  # "auto" that finds no Ray here; else something other than a Ray head answers there
        if found[2].strip() == "auto":
            return {"address": "auto", "why": "no Ray cluster runs on this machine"}
        return {"address": found[2], "why": "something answers there, but not a Ray head"}
    return None


def _without_address(line: str) -> str:
    """``line`` (a resume command, its ``NAME=value`` prefixes included) without its ``--address`` flag."""
    argv = _split_command(line)
    found = _flag_value(argv, "--address")
    while found is not None:
        i, width, _ = found
        del argv[i : i + width]
        found = _flag_value(argv, "--address")
    return shlex.join(argv)


def _train_left(spec, cells, recs: dict, stored: set[str]) -> dict | None:
    """The training the pending runs of a stopped folder need on this machine's CPUs, at the FLOP/s of the folder's
    own ok records (:func:`loopscale.sweep.design_cmd.training_time_left`: ``seconds``, ``runs``, ``trials``,
    ``slots``, ``measured_runs``, ``rate_runs``, and ``cpus``); None when no record gives a rate. Runs already
    finished but not yet recorded (``stored``: their result.json in the storage) are not counted: the next command
    records them without training."""
    import pandas as pd

    from loopscale.sweep.design_cmd import training_time_left

    todo = [c for c in cells if recs.get(c.run_id, {}).get("status") in (None, "failed") and c.run_id not in stored]
    cpus = os.cpu_count() or 1
    got = training_time_left(spec, pd.DataFrame(list(recs.values())), todo, cpus)
    return None if got is None else {**got, "cpus": cpus}


def _fit_caveats(out: Path, ana: dict, meta: dict, pending: int = 0) -> list[str]:
    """What the report says above the fit it shows, in one line each: the fit was made from another runs table
    than today's ``runs.parquet`` (the sha256 ``run_meta.json`` records; also when runs.parquet is gone or
    unreadable), or under other fit rules than this loopscale's (``analysis.json``'s ``fit_rules``, version 1 when
    none), or missing files it lists (:func:`loopscale.fit.analysis.missing_fit_files`), with the command that
    refits it: ``loopscale run ... --resume`` where the folder's spec.yaml is readable
    and ``run`` accepts the folder, else ``loopscale fit`` of the recorded runs into a new folder. ``pending``: the
    spec's runs not yet recorded, which that ``run`` trains first (so it is said to train nothing only at 0)."""
    from loopscale.fit.analysis import FIT_RULES_VERSION, file_digest, missing_fit_files
    from loopscale.sweep.spec import RunsDefinedOtherwise, check_folder_runs, load_spec, refit_command

    caveats = []
    rerun = f"`loopscale run {shlex.quote(str(out / 'spec.yaml'))} --out {shlex.quote(str(out))} --resume`"
    first = (f"first training the {pending} run{'s' if pending != 1 else ''} of its spec not in the table"
             if pending else "training nothing")  # fmt: skip
    try:  # runs that are no cells of the folder's spec as this loopscale defines runs: `run` refuses the folder
        spec = load_spec(out / "spec.yaml")
    except Exception:  # noqa: BLE001  no readable spec.yaml: `run` cannot rerun the folder; `fit` refits its runs
        looped = [v for v, d in (ana.get("variants") or {}).items() if (d.get("joint") or {}).get("params")]
        rerun = refit_command(out, looped)
        first = "the recorded runs, into a new folder: this one has no readable spec.yaml to rerun"
    else:
        from loopscale.sweep.store import look_only

        try:
            with look_only():  # status changes nothing: an unreadable runs.parquet stays where it is
                check_folder_runs(out, spec, same_spec=True)
        except RunsDefinedOtherwise as e:
            rerun = e.refit  # `loopscale fit` of the recorded runs, into a folder beside this one
            first = "the recorded runs, into a new folder: `loopscale run` refuses this one, " + (
                "whose runs trained at other LRs than its LR table gives now"
                if e.other_lrs
                else "whose runs an older loopscale defined otherwise"
            )
        except Exception:  # noqa: BLE001  another refusal of the folder: `run` says what it is
            pass
    fitted = (meta.get("fit_input") or {}).get("runs_sha256")
    runs = out / "runs.parquet"
    if fitted and not runs.is_file():
        caveats.append(f"stale: made from a runs table that is no longer there (runs.parquet is missing, or was moved "
                       f"aside as unreadable); {rerun} refits the runs recorded now ({first})")
    elif fitted and file_digest(runs) != fitted:
        caveats.append(f"stale: made from another runs table, runs.parquet changed since the fit; {rerun} refits it "
                       f"({first})")
    import pandas as pd

    from loopscale.fit.analysis import fit_rules_in_effect

    try:  # a change of the rules that does not alter this design's analysis is no caveat
        table = pd.read_parquet(runs) if runs.is_file() else None
    except Exception:  # noqa: BLE001  an unreadable runs.parquet: said as unreadable elsewhere
        table = None
    made = fit_rules_in_effect(int(ana.get("fit_rules", 1)), table)
    if made != FIT_RULES_VERSION:
        caveats.append(f"made under fit rules version {made}, this loopscale applies version {FIT_RULES_VERSION}, "
                       f"whose intervals and verdicts may differ; {rerun} refits it ({first})")
    if lost := missing_fit_files(out, ana):
        caveats.append(f"its files {', '.join(lost)} are missing (the report shows analysis.json's "
                       f"numbers without the figures drawn from them); {rerun} refits it ({first})")
    if table is not None:
        from loopscale.fit.run_report import data_caveat

        if small := data_caveat(table):  # the report's "Small data" note
            caveats.append(f"small data: {small}")
        from loopscale.fit.run_report import training_caveat

        if short := training_caveat(table):  # the report's "Short training" note
            caveats.append(f"short training: {short}")
    return caveats


def runs_caveats(out: Path) -> tuple[str | None, str | None]:
    """:func:`loopscale.fit.run_report.data_caveat` and :func:`~loopscale.fit.run_report.training_caveat` of the
    runs in ``out/runs.parquet``, read once (``(None, None)`` when it does not read): what ``loopscale run`` prints
    under its headline when the losses fitted measure a small corpus, or runs trained on few tokens per parameter."""
    import pyarrow.parquet as pq

    from loopscale.fit.run_report import data_caveat, training_caveat

    try:
        t = pq.read_table(Path(out) / "runs.parquet")
    except Exception:  # noqa: BLE001  unreadable: the fit stage has said so
        return None, None
    cols = [c for c in ("status", "warnings", "epochs", "D", "N_unique", "N_once", "N_rec") if c in t.column_names]
    runs = t.select(cols).to_pandas()
    return data_caveat(runs), training_caveat(runs)


def fit_headlines(ana: dict) -> list[str]:
    """The last lines ``loopscale run`` prints: per variant with a joint fit, the identification headline (when the
    identification rule gave one, it decides what may be claimed) or phi with its 95 % bootstrap CI, and R^2 with
    what was fitted (runs, or cell means of runs: :func:`loopscale.fit.run_report.fitted_points`); a variant whose
    joint fit was skipped gets why (e.g. its only runs with status ok are of one r), not nothing. A joint fit whose
    interval rests on fewer than ``FEW_RESAMPLES`` refits says so on its line (the report warns of it)."""
    from loopscale.fit.bootstrapping import FEW_RESAMPLES, few_resamples_note
    from loopscale.fit.run_report import fitted_points

    same = {n: c.get("same_losses_as_baseline_r") for n, c in
            ((ana.get("variant_comparison") or {}).get("comparisons") or {}).items()}  # fmt: skip
    lines = []
    for vname, v in (ana.get("variants") or {}).items():
        # a variant that trained the baseline's models at some r: its phi is theirs there
        theirs = (f" (its runs at r = {', '.join(map(str, same[vname]))} ended at the baseline's losses: there it "
                  "trained the baseline's models, and this phi is theirs)") if same.get(vname) else ""  # fmt: skip
        j = v.get("joint") or {}
        if "params" not in j:
            if j.get("skipped"):
                lines.append(f"{vname}: no joint fit, so no phi: {j['skipped']} ({v.get('n', '?')} runs with status "
                             f"ok){theirs}")  # fmt: skip
            continue
        ident = v.get("identification") or {}
        # intervals from few refits: the report warns of them; the headline, which weighs them, said nothing
        n_ok = (j.get("bootstrap") or {}).get("n_ok")
        few = (f" (its interval rests on {n_ok} bootstrap refits, fewer than {FEW_RESAMPLES}: it and any verdict move "
               "with the bootstrap seed; --bootstrap 200)") if few_resamples_note(n_ok) else ""
        if ident.get("headline"):
            from loopscale.fit.identify import stored_headline

            lines.append(f"{vname}: {stored_headline(ident)}; R^2 = {j['r2']:.4f} ({fitted_points(v, j)}){few}{theirs}")
            continue
        lo, hi = (j.get("ci") or {}).get("phi") or (float("nan"), float("nan"))
        lines.append(
            f"{vname}: phi = {j['params']['phi']:.3f}, 95 % CI [{lo:.3f}, {hi:.3f}], "
            f"R^2 = {j['r2']:.4f} ({fitted_points(v, j)}){few}{theirs}"
        )
    return lines + delta_phi_lines(ana)


def delta_phi_lines(ana: dict) -> list[str]:
    """One line per variant compared with the baseline (``analysis.json``'s ``variant_comparison``): Δφ with its
    paired-bootstrap 95 % CI, and what keeps it from being a result (a φ the identification rule did not accept,
    no interval, or runs that ended at the baseline's losses); the comparison's reason when it was skipped."""
    comp = ana.get("variant_comparison") or {}
    if comp.get("skipped"):  # the fitter's reason opens with "no Δφ: " (said once)
        return [f"no delta phi: {str(comp['skipped']).removeprefix('no Δφ: ')}"]
    base = comp.get("baseline", "baseline")

    def num(x: object) -> str:  # a value of an older or hand-edited file may be null
        return f"{x:.3f}" if isinstance(x, int | float) else "nan"

    lines = []
    for name, c in (comp.get("comparisons") or {}).items():
        ci = c.get("ci") or [float("nan"), float("nan")]
        notes = []
        if c.get("not_identified"):
            notes.append(f"not a result: phi not identified ({', '.join(c['not_identified'])})")
        if c.get("no_interval"):
            notes.append(f"no interval: {c['no_interval']}")
        if c.get("same_losses_as_baseline_r"):
            notes.append(f"its runs at r = {', '.join(map(str, c['same_losses_as_baseline_r']))} ended at the "
                         f"baseline's losses")
        line = f"{name} - {base}: delta phi = {num(c.get('delta_phi'))}"
        if not c.get("no_interval"):
            line += f", 95 % CI [{num(ci[0])}, {num(ci[1])}]"
        lines.append(line + (f" ({'; '.join(notes)})" if notes else ""))
    return lines


def _read_json(path: Path, problems: list[str] | None = None) -> dict | None:
    """The JSON object in ``path``; None when there is none: no file, or one that is not a JSON object (torn,
    empty, another kind of JSON value), which is then described in ``problems`` (when given) and read as absent."""
    from loopscale.cluster.storage import json_object

    try:
        value, why = json_object(path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as e:
        value, why = None, f"{type(e).__name__}: {e}"
    if why is not None and problems is not None:
        problems.append(f"{path} ({why})")
    return value


def _records(out: Path, unreadable: list[str] | None = None) -> dict[str, dict]:
    """{run id: newest record} of the folder's runs, read as the commands that write there read them
    (:meth:`loopscale.sweep.store.ResultsStore.recorded`) but changing nothing (:func:`loopscale.sweep.store.look_only`):
    an unreadable file, or a runs part without its curves part, is read as no record and described in ``unreadable``
    when a list is given (the next command there moves it aside).

    Raises:
        NotAnOutput: a readable file there without the columns of a loopscale runs table (``run_id``, ``status``;
            e.g. a table another program wrote as ``runs.parquet``) or curves table (``run_id``, ``step``): its rows
            are no runs.
    """
    from loopscale.sweep.store import ForeignTableError, ResultsStore, look_only

    try:
        with look_only() as seen:
            recs = ResultsStore(out).recorded()
    except ForeignTableError as e:
        what = "curves" if "step" in e.lacks else "runs"
        raise NotAnOutput(
            f"{e.path} is not a loopscale {what} table: it has no {' or '.join(e.lacks)} column (its columns: "
            f"{e.shown_columns}); give the --out folder of a `loopscale run`, `sweep` or `tune-lr`, or move that file "
            "out of the folder"
        ) from None
    if unreadable is not None:
        unreadable.extend(seen)
    return recs


def _not_consolidated(out: Path, recs: dict[str, dict]) -> int:
    """How many of the records ``recs`` (:func:`_records`) are in ``parts/`` only: missing from ``runs.parquet``, or
    newer there than its row. A command stopped between its runs' records and the consolidation that writes
    ``runs.parquet`` (a SIGKILL, a cluster's head lost as the grid ended) leaves them so; ``fit DIR`` reads
    ``runs.parquet`` only. 0 when ``runs.parquet`` cannot be read (it is described as unreadable then)."""
    from loopscale.sweep.store import ResultsStore, look_only

    if not recs:
        return 0
    with look_only() as unreadable:
        n = len(ResultsStore(out).in_parts_only(recs))
    return 0 if unreadable else n


def _lr_rows(out: Path, unreadable: list[str]) -> list[dict] | None:
    """The rows of ``OUT/lr_table.parquet`` read changing nothing (:func:`loopscale.sweep.store.look_only`); None
    without one, or with one that cannot be read, which is described in ``unreadable`` (the next command there moves
    it aside)."""
    from loopscale.sweep.lr_table import _read_lr_rows
    from loopscale.sweep.store import look_only

    path = out / "lr_table.parquet"
    if not path.is_file():
        return None
    try:
        with look_only() as seen:
            rows = _read_lr_rows(path)
    except Exception:  # e.g. another program's table under that name: not an LR table status can show
        return None
    unreadable.extend(seen)
    return None if seen else rows


def _tabled_studies(lr_rows: list[dict] | None) -> set[tuple[int, int]]:
    """(size, r) of the LR studies whose results the LR table holds (:func:`_lr_rows`): tune-lr writes the table
    once every study has finished, a row per size and r naming the study it came from (``tuned_r``, the r the study
    ran at; a table written before that column existed names it by its ``study_name``, ``<spec>_size<s>_r<r>``).
    A study's done marker (``tune_lr/done/``) may be missing where the table is (e.g. a folder kept without
    ``tune_lr/done/``, as ``docs/example_cpu_previous_default/``)."""
    import re

    found = set()
    for row in lr_rows or []:
        if row.get("tuned_r") is not None:
            found.add((int(row["size"]), int(row["tuned_r"])))
        elif m := re.search(r"_size(\d+)_r(\d+)$", str(row.get("study_name") or "")):
            found.add((int(m.group(1)), int(m.group(2))))
        else:
            found.add((int(row["size"]), int(row["r"])))
    return found


def _planned(out: Path, lr_rows: list[dict] | None, problems: list[str] | None = None):
    """(spec, planned cells) from ``OUT/spec.yaml``, or (None, None) without one or with one that does not read
    as a spec (described in ``problems`` when given); ``lr_rows``: the folder's LR table (:func:`_lr_rows`), which
    gives the cells' LRs when the spec tunes them."""
    from loopscale.sweep.spec import load_spec

    path = out / "spec.yaml"
    if not path.is_file():
        return None, None
    try:
        spec = load_spec(path)
    except Exception as e:  # torn, hand-edited, or another tool's spec.yaml: said in status's ``unreadable_own``
        if problems is not None:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            problems.append(f"{path} (not a spec this loopscale reads: {first}; `loopscale run SPEC --out "
                            f"{shlex.quote(str(out))}` sets it aside and writes its own)")  # fmt: skip
        return None, None
    table = None
    if spec.lr == "tune":
        table = {(int(x["size"]), int(x["r"])): float(x["lr"] or 1.0) for x in lr_rows or []} or {
            (s, None): 1.0 for s in spec.all_sizes()
        }
    try:
        return spec, spec.cells(lr_table=table)
    except Exception:
        return spec, None


def _studies_best(out: Path, spec_name: str, keys: list[tuple[int, int]]) -> list[dict]:
    """The best healthy trial (lowest validation loss) of each finished LR study ``keys`` in the folder's Optuna
    storage (``tune_lr/optuna.db``), as ``{size, r, lr, val_loss, trials}``: what a folder whose tuning stopped
    part-way has found (its LR table, smoothed over sizes with ``tune.smooth``, is written once every study has
    ended). Empty when the storage does not read. Reads only."""
    from loopscale.sweep.lr_search import best_trials, study_name

    db = out / "tune_lr" / "optuna.db"
    if not db.is_file():
        return []
    try:
        best = best_trials(f"sqlite:///{db.resolve()}", [study_name(spec_name, s, r) for s, r in keys])
    except Exception:  # noqa: BLE001  a torn or locked storage: status says what it can without it
        return []
    return [{"size": s, "r": r, "lr": b[0], "val_loss": b[1], "trials": b[2]} for s, r in keys
            if (b := best.get(study_name(spec_name, s, r)))]  # fmt: skip


def _pid_alive(pid, proc_start=None) -> bool:
    """Process ``pid`` of this host is alive (and, when ``proc_start`` is known on both sides, is the same process)."""
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        pass  # alive, another user's
    except (OSError, ValueError, TypeError, OverflowError):
        return False
    if _proc_state(pid) == "Z":  # a zombie (killed, not yet reaped by its parent) does no more work
        return False
    now = _proc_start(pid)
    return proc_start is None or now is None or int(proc_start) == now


def _alive(progress: dict | None) -> bool:
    """A progress file of a display still open: its pid alive (same host) or the file fresh (other host)."""
    if not progress or progress.get("finished"):
        return False
    if progress.get("host") == socket.gethostname():
        return _pid_alive(progress.get("pid"))
    return time.time() - float(progress.get("updated_at") or 0) < STALE_S


def _liveness(cmd: dict | None, progress: dict | None) -> tuple[bool, dict | None, dict | None]:
    """(alive, the live command record or None, the live command's open progress display or None).

    With a command record: alive while its pid lives on this host; a record of another host or of a dead pid is
    judged by its files: the newest of the record and the command's progress file younger than :data:`STALE_S`
    (a closed display counts as not running). Without one: by the progress file alone, as before records existed.
    """
    here = socket.gethostname()
    if not cmd or "pid" not in cmd:
        return (True, None, progress) if _alive(progress) else (False, None, None)
    mine = (
        progress is not None
        and (progress.get("pid"), progress.get("host")) == (cmd.get("pid"), cmd.get("host"))
        and float(progress.get("updated_at") or 0) >= float(cmd.get("started_at") or 0) - 1.0
    )
    open_progress = progress if mine and not progress.get("finished") else None
    if cmd.get("host") == here and _pid_alive(cmd["pid"], cmd.get("proc_start")):
        return True, cmd, open_progress
    if cmd.get("host") == here:  # the command's process is gone
        return False, None, None
    if mine:
        fresh = open_progress is not None and time.time() - float(progress.get("updated_at") or 0) < STALE_S
    else:
        fresh = time.time() - float(cmd.get("recorded_at") or cmd.get("started_at") or 0) < STALE_S
    return (True, cmd, open_progress) if fresh else (False, None, None)


RUN_WRITES = ("report.md", "loss_vs_compute.png", "fit/fit.json", "fit/analysis.json", "curves.parquet", "fit.partial")
"""Files of a run folder that ``loopscale run`` replaces whole (its report and fit outputs, and the folder its fit stage
writes into first)."""

OWN_MARKS = ("spec.yaml", "run_meta.json", f"logs/{COMMAND_NAME}", "logs/progress.json", "parts/runs")
"""Files only a loopscale command writes (with its ``tune/`` folder): a folder holding one is a loopscale folder."""


def refuse_foreign_files(out_dir: str | Path) -> None:
    """Refuse to start ``loopscale run`` in a folder that holds files it would replace (:data:`RUN_WRITES`, e.g. a
    ``report.md``) but nothing only loopscale writes (:data:`OWN_MARKS`): they are someone else's, and a run
    overwrote a user's own ``report.md`` without a word. A missing or empty folder, and loopscale's own, pass.

    In a loopscale folder, a ``fit.partial`` the fit stage did not leave is refused too.

    Raises:
        ValueError: such files, named, with what to do.
    """
    out = Path(out_dir)
    if not out.is_dir():
        return
    if any((out / m).exists() for m in (*OWN_MARKS, "tune")):
        _refuse_foreign_staging(out)
        return
    theirs = [m for m in RUN_WRITES if (out / m).exists()]
    if theirs:
        raise ValueError(
            f"--out {out} holds {', '.join(theirs)}, which `loopscale run` writes, but no loopscale output (no "
            f"{', '.join(OWN_MARKS[:3])}): they are not from a run and would be replaced; give another --out, or "
            "move them away"
        )


def _refuse_foreign_staging(out: Path) -> None:
    """In a loopscale folder, refuse a ``fit.partial/`` that the fit stage did not leave (no mark file inside, and
    ``run_meta.json`` records no fit stopped part-way): ``loopscale run`` removes its own before it refits, and
    removed a user's folder of that name without a word.

    Raises:
        ValueError: naming the folder, with what to do.
    """
    from loopscale.sweep.run import FIT_STAGING, FIT_STAGING_MARK

    staging = out / FIT_STAGING
    if not staging.exists() or (staging / FIT_STAGING_MARK).is_file():
        return
    if (_read_json(out / "run_meta.json") or {}).get("fit_unfinished") is not None:  # stopped before the mark
        return
    raise ValueError(
        f"--out {out} holds {FIT_STAGING}{'/' if staging.is_dir() else ''}, which `loopscale run`'s fit stage writes "
        "and removes, but no fit stage of this folder left it (it has no "
        f"{FIT_STAGING_MARK} and run_meta.json records no fit stopped part-way): move it away, or give another --out"
    )


def _is_output(out: Path) -> bool:
    """Whether ``out`` holds any file a loopscale command writes (it may be a run, sweep or tune-lr folder)."""
    marks = [*OWN_MARKS, "runs.parquet", "lr_table.parquet", "tune_lr", "fit/analysis.json", "report.md", "logs/ray.log"]
    if any((out / m).exists() for m in marks):
        return True
    try:
        return any(p.name.startswith("grid_") for p in (out / "tune").iterdir())
    except OSError:
        return False


def _tune_state(storage: str, spec_name: str | None) -> dict | None:
    """{"experiment", "trials": {status: count}, "updated_at" (when Tune saved that state, s since the epoch, or
    None), "runs", "runs_per_trial", "running_ids", "run_ids"} of the newest grid experiment (``grid_<spec
    name>_NNN``; any spec name when None) under ``storage``, or None when there is none."""
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
    sizes: list[int] = []
    for t in ea.trials:
        trials[t.status] = trials.get(t.status, 0) + 1
        ids = [c["run_id"] for c in trial_cells(t.config) if "run_id" in c]
        every += ids
        sizes.append(len(ids))
        if t.status == "RUNNING":
            running += ids
    return {
        "experiment": newest,
        "trials": trials,  # Tune trials by status (a trial may train several runs)
        "updated_at": _state_mtime(storage, newest),
        "runs": len(every),
        "runs_per_trial": [min(sizes), max(sizes)] if sizes else None,
        "running_ids": running,
        "run_ids": every,
    }


def _state_mtime(storage: str, experiment: str) -> float | None:
    """When Tune last saved the state of ``experiment`` under ``storage`` (s since the epoch: the newest
    ``experiment_state-*.json``), None where unknown."""
    import pyarrow.fs as pafs

    from loopscale.cluster import storage as st

    try:
        fs, path = st.resolve_uri(st.join(storage, experiment))
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except Exception:
        return None
    times = [
        i.mtime.timestamp()
        for i in infos
        if i.base_name.startswith("experiment_state")
        and i.base_name.endswith(".json")
        and i.mtime is not None
    ]
    return max(times, default=None)


def _live_tune(progress: dict | None, tune_info: dict | None) -> dict | None:
    """``tune`` of :func:`collect_status` while the grid runs (``progress``: the running command's open progress
    display, stage ``grid``): the display's trial counts (``source`` ``progress``), else those of Tune's saved
    experiment state ``tune_info`` (:func:`_tune_state`, ``source`` ``tune``); None for another stage.

    The display wins even when Tune saved its state later: Tune saves a running trial as PENDING (so that a restore
    restarts it), so its state never shows what runs now."""
    if (progress or {}).get("stage") != "grid":
        return None
    live = progress.get("trials") or None
    base = {k: v for k, v in (tune_info or {}).items() if k not in ("running_ids", "run_ids")}
    base["stage"] = "sweep"
    if live:
        return {**base, "trials": live, "source": "progress", "updated_at": float(progress.get("updated_at") or 0)}
    if base.get("trials"):
        return {**base, "source": "tune"}
    return None


def _stopped_time(record: dict | None, progress: dict | None, walls: dict, tm: dict) -> None:
    """Add to ``tm`` the time of a stopped command from its record (``command.json``): ``started_at``,
    ``last_progress_at`` (its progress file's last write, None without one), ``stopped_at`` (its last sign of
    work: that write, its record, or its start plus the stage wall times it recorded) and ``ran_s`` (from its
    start to ``stopped_at``); ``total_s`` counts earlier commands (their recorded stages and the time of
    interrupted ones, ``earlier_unrecorded_s`` of the record) and ``ran_s``. No-op without a
    record."""
    if not record or record.get("started_at") is None:
        return
    t0 = float(record["started_at"])
    at_start = record.get("stage_wall_s_at_start") or {}
    mine = (
        progress is not None
        and (progress.get("pid"), progress.get("host")) == (record.get("pid"), record.get("host"))
        and float(progress.get("updated_at") or 0) >= t0 - 1.0
    )
    last_progress = float(progress["updated_at"]) if mine else None
    finished_stages = sum(max(0.0, float(v) - float(at_start.get(k) or 0.0)) for k, v in walls.items())
    stopped = max(t0, float(record.get("recorded_at") or t0), last_progress or t0, t0 + finished_stages)
    tm.update(started_at=t0, last_progress_at=last_progress, stopped_at=stopped, ran_s=stopped - t0)
    earlier = sum(float(v) for v in at_start.values()) + float(record.get("earlier_unrecorded_s") or 0.0)
    tm["total_s"] = max(tm["total_s"], earlier + tm["ran_s"])


_ASIDE_NAME = re.compile(r"earlier_(?:fit_|design_)?\d{8}T\d{6}(?:_\d+)?")
"""Names of the folders commands set aside (``loopscale.cluster.storage.new_aside_folder``: prefix, UTC time)."""


def set_aside_folders(out: Path) -> list[dict]:
    """The folders earlier commands moved aside in ``out`` and kept (never read again by loopscale, never deleted
    by it): ``earlier_<UTC time>/`` of ``sweep --force`` (earlier runs' records, checkpoints, fit and report),
    ``earlier_fit_<UTC time>/`` of a ``run`` that refitted a finished fit (its ``fit/`` and report) and
    ``<fit folder>/earlier_fit_<UTC time>/`` of a ``fit --out`` (an earlier fit's files); then the files moved aside
    as unreadable (``<name>.unreadable-<id>``, anywhere below ``out`` but inside those folders: a torn runs.parquet,
    analysis.json, LR table, runs part or Tune state file). Each: ``path`` (relative to ``out``), ``bytes`` (on disk, files only), ``runs`` (rows of its
    runs.parquet; None without one) and ``file`` (True for a file moved aside), folders oldest first."""
    import pyarrow.parquet as pq

    def made_at(d: Path) -> tuple[str, str]:  # the UTC time in the name (earlier_fit_... sorted after earlier_2...)
        m = re.search(r"(\d{8}T\d{6})(?:_(\d+))?$", d.name)
        return (m.group(1), f"{int(m.group(2) or 1):06d}") if m else ("", d.name)

    found = sorted([*out.glob("earlier_*/"), *out.glob("*/earlier_fit_*/")], key=lambda d: (made_at(d), str(d)))
    rows = []
    for d in found:
        if not d.is_dir() or d.is_symlink() or not _ASIDE_NAME.fullmatch(d.name):
            continue  # not one a command made (its names: new_aside_folder's): a folder of the user's own
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
        try:
            runs = pq.read_metadata(d / "runs.parquet").num_rows if (d / "runs.parquet").is_file() else None
        except (OSError, ValueError):
            runs = None
        rows.append({"path": str(d.relative_to(out)), "bytes": size, "runs": runs, "file": False})
    for f in sorted(out.rglob("*.unreadable-*")):  # torn parts and Tune state lie deeper than the folder's top
        rel = f.relative_to(out)
        if any(_ASIDE_NAME.fullmatch(p) for p in rel.parts[:-1]):
            continue  # inside a folder set aside: counted in that folder's line
        if f.is_file() and not f.is_symlink():
            rows.append({"path": str(rel), "bytes": f.stat().st_size, "runs": None, "file": True})
    return rows


def collect_status(out_dir: str | Path, storage: str | None = None) -> dict:
    """The status of the run directory ``out_dir`` as a dict (what ``loopscale status --json`` prints).

    Keys: ``out``, ``spec``, ``kind`` (run | sweep | tune-lr | None), ``state`` (running | stopped | finished |
    empty), ``stage``, ``last_command_finished`` (``sweep`` or ``tune-lr`` when a ``run`` folder is stopped only
    because its last command was that stage's own and did its part, else None), ``runs`` (total, ok, diverged, did_not_learn, failed, running, unrecorded: finished with no
    driver to record them, their ``result.json`` in a local storage, pending: training runs),
    ``failures`` ([{run_id, error}]), ``time`` (``stage_wall_s`` recorded per stage (s), ``total_s`` (s, with earlier
    commands: their recorded stages and the time interrupted ones ran); ``earlier_commands`` (the folder's earlier
    commands as the newest record lists them, oldest first: ``kind``, ``command``, ``started_at``, ``ran_s``); of a running command also ``command_s`` (s) since it started and ``started_at`` (s since
    the epoch); ``running_stage_s`` (s) since the current progress display started, ``eta_s`` (s); of a stopped
    command with a record (``command.json``) ``started_at``, ``last_progress_at`` (its progress file's last write,
    None without one), ``stopped_at`` (its last sign of work: that write, or its start plus the stage wall times
    it recorded; times in s since the epoch) and ``ran_s`` (s from its start to ``stopped_at``); of a stopped folder
    with pending runs ``train_left``: the training they need on this machine's CPUs at the FLOP/s of the folder's
    own ok records, :func:`_train_left`, None when no record gives a rate; instead ``train_left_note``, why there
    is no figure, when its last command joined a cluster with ``--address``), ``command`` (the
    running command's record: command line, kind, pid, host, started_at; None when none runs), ``last_command``
    (when none runs: the command line of the folder's newest command record, else None), ``last_command_error``
    (of a stopped folder, or of a finished ``sweep`` / ``tune-lr`` folder whose own command ended on an error, e.g.
    no run ok: the error line its last command ended with, :func:`mark_ended`; None when it was interrupted or
    killed), ``resume_with`` (of a stopped folder: that command line with ``--resume``, which
    continues it, after the environment assignments its error recorded, e.g. ``RAY_AUTH_MODE=token``; else None), ``nothing_to_fit`` (of a
    stopped folder whose runs all finished with none ok, or with fewer ok than the joint law's 6 parameters over two r
    or more: why ``--resume`` cannot help, and then ``resume_with`` is None; of a finished ``sweep`` folder whose
    command ended on an error, every run finished and none ok: why ``run`` and ``loopscale fit`` have nothing to
    fit; else None), ``cannot_resume`` (of a folder whose last command ended on an error that ``--resume`` would
    meet again, e.g. no LR of the range learned: why, and then ``resume_with`` is None; else None), ``cluster_gone``
    (of a stopped folder whose last command joined a Ray cluster that does not answer now (:func:`_cluster_gone`):
    ``address``, ``why``, ``resume_here`` (``resume_with`` without ``--address``: the rest on this machine) and
    ``runs_left`` (runs it would train); else None), ``progress`` (the running command's open
    progress file; its ``counts`` are runs, its ``trials`` Tune trials, or LR trials by Optuna state for tune-lr),
    ``tune`` (the grid's Tune trial counts: ``trials`` by status, ``source`` where they come from (``tune``:
    Tune's saved experiment state, where a running trial is PENDING; ``progress``: the running command's progress
    display, used while the grid runs, as the console shows it), ``updated_at`` (s since the epoch: when that source
    was written), ``stage`` (sweep), ``experiment``, ``runs``/``runs_per_trial``), ``lr`` (LR studies done, with
    ``best``: each finished study's best trial while there is no LR table yet, and the LR table rows), ``fit`` (headline lines), ``fit_caveats`` (the report's notes above that fit, a line each: stale, or made
    under other fit rules), ``fit_earlier`` (True when they are an earlier fit's: a fit stage started
    since has not ended), ``set_aside`` (:func:`set_aside_folders`), ``runs_in_parts_only`` (finished runs whose records are in ``parts/``
    only, not yet in ``runs.parquet``: the command stopped before writing it), ``design`` (``design_prediction.json`` when ``loopscale design
    --out`` wrote one here, else None), ``unreadable`` (results files that could not be
    read and runs parts without their curves part, with why: read as no records; an LR table that could not be
    read: read as none), ``unreadable_own`` (the folder's own files that do not read, with why, each read as absent:
a spec.yaml that is not a spec this loopscale reads, a run_meta.json, command record, progress file or
fit/analysis.json that is not a JSON object), ``storage_error`` (why the Tune state's storage could not be read, else None),
    ``disk_free`` (of a stopped folder whose disk has less than :data:`DISK_SHORT_BYTES` free: those bytes, else None;
    a full disk stops a command before it can record why) and ``counts`` (what each count counts).

    Raises:
        FileNotFoundError: ``out_dir`` is not a directory.
        NotAnOutput: ``out_dir`` holds no loopscale output.
    """
    from loopscale.sweep.grid import error_line

    out = Path(out_dir).resolve()
    if not out.exists():
        raise FileNotFoundError(f"{out} does not exist: give the --out folder of a run or sweep")
    if not out.is_dir():
        raise FileNotFoundError(f"{out} is not a directory: give the --out folder of a run or sweep")
    if not _is_output(out):  # what the folder is instead, checked in this order
        above = next((p for p in (out.parent, out.parent.parent) if p != out and _is_output(p)), None)
        if above is not None:
            raise NotAnOutput(f"{out} is inside the loopscale output folder {above} (its {out.relative_to(above)}/): "
                              f"give that folder, `loopscale status {shlex.quote(str(above))}`")  # fmt: skip
        if (out / "fit.json").is_file():
            raise NotAnOutput(
                f"{out} holds a `loopscale fit` output (fit.json), not the folder of a run or sweep: status follows "
                f"the commands that train runs; this fit's numbers are in {out / 'fit.json'} and its figures are the "
                "PNGs there"
            )
        if not (storage and _tune_state(storage, None)):
            raise NotAnOutput(
                f"{out} is not a loopscale output folder (no spec.yaml, runs.parquet, tune_lr/, lr_table.parquet or "
                "logs/ of a command): give the --out folder of a `loopscale run`, `sweep` or `tune-lr`"
            )
    now = time.time()
    own_unreadable: list[str] = []  # the folder's own files that do not read: said, and read as absent
    meta = _read_json(out / "run_meta.json", own_unreadable) or {}
    record = _read_json(out / "logs" / COMMAND_NAME, own_unreadable)
    progress_file = _read_json(out / "logs" / "progress.json", own_unreadable)
    alive, cmd, progress = _liveness(record, progress_file)
    lr_unreadable: list[str] = []
    lr_rows = _lr_rows(out, lr_unreadable)
    spec, cells = _planned(out, lr_rows, own_unreadable)
    unreadable: list[str] = []
    recs = _records(out, unreadable)
    unreadable += lr_unreadable
    if cells is not None and {c.run_id for c in cells} & set(recs):
        want = {c.run_id for c in cells}
        recs = {k: v for k, v in recs.items() if k in want}
    by = {"ok": 0, "diverged": 0, "did_not_learn": 0, "failed": 0}
    for r in recs.values():
        by[r["status"]] = by.get(r["status"], 0) + 1
    name = (spec.name if spec is not None else None) or meta.get("spec_name")
    store = (
        storage
        or (spec.storage_path if spec is not None and spec.storage_path else None)
        or recorded_storage(record)
        or str(out / "tune")
    )
    from loopscale.cluster.options import reachable_storage

    storage_error = None
    try:  # a remote storage out of reach: said, not a silent gap (a gs:// one hung for 15 minutes)
        reachable_storage(store)
        tune_info = _tune_state(store, name)
    except ValueError as e:
        tune_info, storage_error = None, str(e)
    if name is None and tune_info:
        name = tune_info["experiment"][len("grid_") :].rsplit("_", 1)[0]
    # the kind of folder: run (run_meta.json, or a `run` command's record), sweep (records or a grid experiment),
    # tune-lr (LR tuning only); every kind has a spec.yaml
    live_kind = (cmd or {}).get("kind") or {"grid": "sweep"}.get((progress or {}).get("stage"))
    if (out / "run_meta.json").is_file() or (record or {}).get("kind") == "run":
        kind = "run"
    elif recs or tune_info or live_kind == "sweep":
        kind = "sweep"
    elif live_kind == "tune-lr" or (out / "tune_lr").is_dir() or (out / "lr_table.parquet").is_file():
        kind = "tune-lr"
    else:  # only the logs of a command that stopped before writing anything else
        kind = (
            (record or {}).get("kind") if (record or {}).get("kind") in ("run", "sweep", "tune-lr") else None
        )
    # without a spec (a `loopscale sweep` folder): the runs recorded and those of the newest Tune experiment
    total = len(cells) if cells is not None else len(set(recs) | set((tune_info or {}).get("run_ids") or []))
    left = max(0, total - sum(by.values()))
    live_counts = (progress or {}).get("counts") if (progress or {}).get("stage") == "grid" else None
    if not alive:
        n_running = 0
    elif isinstance(live_counts, dict) and "running" in live_counts:  # the driver's own view: the freshest
        n_running = min(left, int(live_counts.get("running") or 0))
    else:  # Tune's saved experiment state
        n_running = len(set((tune_info or {}).get("running_ids") or []) - set(recs))
    # runs that finished with no driver there to record them (their result.json in the storage): the next command
    # records them without training
    from loopscale.sweep.workspace import stored_result_ids

    # (failed ones too: stored once here, their retraining counted in the time left below)
    stored = stored_result_ids(store, [c.run_id for c in cells or [] if recs.get(c.run_id, {}).get("status") in
                                       (None, "failed")])  # fmt: skip
    unrecorded = sum(rid not in recs for rid in stored)
    runs = {"total": total, **by, "running": n_running, "unrecorded": min(unrecorded, max(0, left - n_running))}
    runs["pending"] = max(0, left - n_running - runs["unrecorded"])
    failures = [
        {"run_id": k, "error": error_line(v.get("error") or "failed")}
        for k, v in recs.items()
        if v["status"] == "failed"
    ]
    # LR tuning
    lr: dict = {}
    if spec is not None and spec.lr == "tune":
        from loopscale.sweep.lr_search import done_marker, study_keys

        keys = study_keys(spec)
        tabled = _tabled_studies(lr_rows)
        done_keys = [(s, r) for s, r in keys if done_marker(out, s, r).is_file() or (s, r) in tabled]
        lr["studies"] = {"done": len(done_keys), "total": len(keys)}
        if "table" not in lr and lr_rows is None and done_keys:  # tuning stopped part-way: what the studies chose
            lr["studies"]["best"] = _studies_best(out, spec.name, done_keys)
    elif kind == "tune-lr":  # no spec here: the studies finished, out of a total only the command knew
        marked = {p.stem for p in (out / "tune_lr" / "done").glob("*.json")}
        lr["studies"] = {"done": len(marked | {f"size{s}_r{r}" for s, r in _tabled_studies(lr_rows)}), "total": None}
    if (out / "lr_table.parquet").is_file():
        keep = ("size", "r", "tuned_r", "lr", "lr_best", "lr_smoothed", "best_val_loss", "n_trials", "n_pruned")
        if lr_rows is not None:  # an unreadable one is described under unreadable
            lr["table"] = [{k: row.get(k) for k in keep} for row in lr_rows]
            import pandas as pd

            from loopscale.fit.run_report import lr_study_notes, study_r

            for t, row in zip(lr["table"], lr_rows, strict=True):  # a table from before tuned_r: its study's name
                if t["tuned_r"] is None:
                    t["tuned_r"] = study_r(row.get("study_name"))

            if notes := lr_study_notes(pd.DataFrame(lr_rows)):  # what tune-lr said of its studies, recorded
                lr["notes"] = notes
        if spec is not None and spec.lr != "tune":  # tune-lr on a spec that fixes the LR: the runs do not use it
            lr["table_used"] = False
    ana = _read_json(out / "fit" / "analysis.json", own_unreadable)
    fit = fit_headlines(ana) if ana else []
    fit_caveats = _fit_caveats(out, ana, meta, pending=runs["pending"] + runs["running"]) if fit else []
    # stage and state: a folder no command has worked in (only `loopscale design --out` wrote its spec and
    # prediction there) is empty, not a sweep stopped with every run pending
    in_parts_only = 0 if alive else _not_consolidated(out, recs)
    never_ran = not (record or meta or recs or tune_info or progress or "table" in lr or (out / "tune_lr").is_dir())
    if progress:
        stage = {"grid": "sweep"}.get(progress.get("stage"), progress.get("stage"))
    elif never_ran:
        stage = "none"
    elif kind == "tune-lr":
        stage = "done" if "table" in lr and not alive else "tune-lr"
    elif spec is not None and spec.lr == "tune" and "table" not in lr:
        stage = "tune-lr"
    elif by["ok"] + by["diverged"] + by["did_not_learn"] < total:
        stage = "sweep"
    elif in_parts_only:
        # every run trained, but the command stopped before runs.parquet held them: its sweep stage did not end
        stage = "sweep"
    elif not recs and cells is None:
        stage = "sweep" if alive and kind == "sweep" else "none"
    elif kind == "sweep":  # a `loopscale sweep` folder: its work ends with the runs
        stage = "done"
    elif ana is None or meta.get("fit_unfinished") is not None:  # no fit yet, or one started that never ended
        stage = "fit"
    elif not (out / "report.md").is_file() or meta.get("report_unfinished"):  # (being) rewritten: not done yet
        stage = "report"
    else:
        stage = "done"
    state = (
        "running"
        if alive
        else ("finished" if stage == "done" else ("empty" if stage == "none" else "stopped"))
    )
    # a `run` folder whose last command was a stage's own (`sweep`, `tune-lr`) that did its part: nothing was
    # interrupted, the next stage is simply not made yet (it read "stopped ... before it stopped")
    last_kind = (record or {}).get("kind")
    done_part = state == "stopped" and kind == "run" and (
        (last_kind == "sweep" and stage in ("fit", "report")) or (last_kind == "tune-lr" and stage != "tune-lr"))
    finished_part = last_kind if done_part else None
    walls = dict(meta.get("stage_wall_s") or {})
    # earlier interrupted commands' time outside the recorded stage wall times (see mark_started)
    tm: dict = {"stage_wall_s": walls, "total_s": sum(walls.values()) + float((record or {}).get("earlier_unrecorded_s") or 0.0)}
    if cmd is not None:  # running: the command's time counts from its start
        tm["started_at"] = float(cmd.get("started_at") or now)
        tm["command_s"] = max(0.0, now - tm["started_at"])
        tm["total_s"] = (
            sum((cmd.get("stage_wall_s_at_start") or {}).values())
            + float(cmd.get("earlier_unrecorded_s") or 0.0)
            + tm["command_s"]
        )
    if progress is not None:
        tm["running_stage_s"] = max(0.0, now - float(progress.get("started_at") or now))
        if cmd is None:  # a command without a record (an older loopscale): its stage time is what is known
            tm["total_s"] += tm["running_stage_s"]
        tm["eta_s"] = progress.get("eta_s")
        if alive and tm["eta_s"] is not None and progress.get("updated_at") is not None:
            # written at the display's last update (a trial's report or end): counted down to now
            tm["eta_s"] = max(0.0, float(tm["eta_s"]) - max(0.0, now - float(progress["updated_at"])))
    if (record or {}).get("earlier_commands"):
        tm["earlier_commands"] = [
            {k: c.get(k) for k in ("kind", "command", "started_at", "ran_s")} for c in record["earlier_commands"]
        ]
    if state == "stopped":  # how long the stopped command ran, from what its files show
        _stopped_time(record, progress_file, walls, tm)
        if runs["pending"] and cells is not None and spec is not None:
            if _joined_a_cluster(record):  # its runs trained on the cluster's nodes: this machine's CPUs say nothing
                tm["train_left_note"] = ("not estimated: the runs train on the cluster (`--address`), not on this "
                                         "machine's CPUs")  # fmt: skip
            else:
                tm["train_left"] = _train_left(spec, cells, recs, stored)
    elif state == "finished" and (record or {}).get("kind") in ("sweep", "tune-lr"):
        # a finished sweep or tune-lr command records no stage wall time (only `run` writes run_meta.json's): its
        # time is its start to its progress display's last write, when that display was its own
        found = {"total_s": tm["total_s"]}
        _stopped_time(record, progress_file, walls, found)
        if found.get("last_progress_at") is not None:
            tm.update(found)
    resume_with = nothing_to_fit = cannot_resume = None
    ended = (record or {}).get("ended")  # how the folder's last command ended, as recorded (mark_ended)
    ended_on_error = isinstance(ended, dict) and ended.get("how") == "error"
    if state == "stopped":  # the line that continues it, its relative paths read where that command ran
        line, line_cwd = _resumable_command(record, stage, out)
        env = ended.get("resume_env") if ended_on_error else None
        resume_with = resume_command(line, out, line_cwd, env if isinstance(env, dict) else None)
        if cells:  # every run finished, none ok: --resume trains nothing and its fit fails (`run` refuses it)
            from loopscale.sweep.run import nothing_to_fit_in

            if nothing_to_fit := nothing_to_fit_in(out, cells, recs):
                resume_with = None
        if resume_with and ended_on_error and ended.get("resumable") is False:
            resume_with = None
            cannot_resume = ("--resume would end the same way: the last command's error, above, says what to change "
                             "and where to run again")  # fmt: skip
    cluster_gone = None
    if resume_with and (gone := _cluster_gone(resume_with)) is not None:  # the address of the line offered
        # the line above needs that cluster back; without --address the rest runs on this machine
        cluster_gone = {**gone, "resume_here": _without_address(resume_with), "runs_left": runs["pending"]}
    # a `sweep` / `tune-lr` folder whose command did all its part and still ended on an error (e.g. every run of the
    # grid diverged: nothing left to train, so "finished"): that error, and why `loopscale fit` has nothing to fit
    own_end = state == "finished" and kind in ("sweep", "tune-lr") and (record or {}).get("kind") == kind
    if own_end and kind == "sweep" and cells and ended_on_error:  # a sweep that ended well has what it trained
        from loopscale.sweep.run import nothing_to_fit_in

        nothing_to_fit = nothing_to_fit_in(out, cells, recs)
    tune_out = {k: v for k, v in (tune_info or {}).items() if k not in ("running_ids", "run_ids")} or None
    if tune_out and "trials" in tune_out:
        tune_out = {**tune_out, "stage": "sweep", "source": "tune"}
    if alive:
        tune_out = _live_tune(progress, tune_info) or tune_out
    from loopscale.sweep.spec import DESIGN_PREDICTION

    return {
        "out": str(out),
        "spec": name,
        "kind": kind,
        "state": state,
        "stage": stage,
        "last_command_finished": finished_part,
        "runs": runs,
        "failures": failures,
        "time": tm,
        "command": {k: cmd.get(k) for k in ("command", "kind", "pid", "host", "started_at")} if cmd else None,
        "last_command": None if cmd else (record or {}).get("command"),
        "last_command_error": _ended_with_error(record) if state == "stopped" or own_end else None,
        "resume_with": resume_with,
        "cannot_resume": cannot_resume,
        "cluster_gone": cluster_gone,
        "nothing_to_fit": nothing_to_fit,
        "progress": progress,
        "tune": tune_out,
        "storage_error": storage_error,
        "disk_free": _disk_short(out) if state == "stopped" else None,
        "lr": lr or None,
        "fit": fit,
        "fit_earlier": bool(fit) and meta.get("fit_unfinished") is not None,
        "fit_caveats": fit_caveats,
        "set_aside": set_aside_folders(out),
        "runs_in_parts_only": in_parts_only,
        "design": DESIGN_PREDICTION if (out / DESIGN_PREDICTION).is_file() else None,
        "unreadable": unreadable,
        "unreadable_own": own_unreadable,
        "counts": {
            "runs": "training runs (one per grid cell and seed); running: "
            + (
                "from the command's progress display"
                if live_counts is not None and alive
                else "from Tune's saved state"
            ),
            "progress.counts": "training runs, as the command's progress display counts them (live)",
            "progress.trials": "Ray Tune trials by status, live (one trial may train several runs as an ensemble)",
            "tune.trials": "Ray Tune trials of the grid by status; tune.source says from where: Tune's saved "
            "experiment state (tune; written now and then, running trials saved as PENDING) or, while the grid runs, "
            "the progress display (progress)",
            "tune.runs": "training runs in the grid's Tune trials (its saved experiment state)",
            "tune.runs_per_trial": "[fewest, most] training runs in one Tune trial of the grid (more than 1: that "
            "trial trains a cell's seeds together as a seed ensemble)",
        },
    }


def _flag_value(argv: list[str], flag: str) -> tuple[int, int, str] | None:
    """The last ``flag VALUE`` or ``flag=VALUE`` of a split command line (the one Typer reads), as (index, number of
    words it takes, value); None without one."""
    found = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            found = (i, 2, argv[i + 1])
        elif a.startswith(f"{flag}="):
            found = (i, 1, a.split("=", 1)[1])
    return found


def _split_command(command: str | None) -> list[str]:
    """``command`` split as a shell would; [] for none or one shlex cannot split."""
    try:
        return shlex.split(command or "")
    except ValueError:
        return []


def earlier_storages(out: Path) -> list[str]:
    """Where the folder's earlier commands kept Tune's state, newest first, each once: the storage of the command
    ``OUT/logs/command.json`` records (unless it is this process: ``run`` calling its sweep stage) and of each
    earlier command it lists (:func:`recorded_storage`), else ``OUT/tune``."""
    record = _read_json(Path(out) / "logs" / COMMAND_NAME)
    record = record if isinstance(record, dict) else {}
    # this process's own record: pid, host and process start alike (a restarted container keeps pid and host)
    own = (record.get("pid"), record.get("host"), record.get("proc_start")) == (
        os.getpid(), socket.gethostname(), _proc_start(os.getpid()))  # fmt: skip
    cmds = [c for c in reversed(record.get("earlier_commands") or []) if isinstance(c, dict)]
    if record.get("command") and not own:
        cmds.insert(0, record)
    seen: list[str] = []
    for cmd in cmds:
        where = recorded_storage(cmd) or str(Path(out).resolve() / "tune")
        if where not in seen:
            seen.append(where)
    return seen


def recorded_storage(record: dict | None) -> str | None:
    """The ``--storage`` of the command line a folder's ``command.json`` records (the Tune state of a sweep run
    with ``--storage`` is not under ``OUT/tune``, and the folder's spec.yaml does not keep it): a URI as given, a
    local path made absolute against the command's working directory; the storage the record names (``storage``:
    also a spec's ``storage_path``) first; None without either."""
    if (record or {}).get("storage"):
        return str(record["storage"])
    found = _flag_value(_split_command((record or {}).get("command")), "--storage")
    value = found[2] if found else None
    if not value:
        return None
    if "://" in value or Path(value).expanduser().is_absolute():
        return str(Path(value).expanduser()) if "://" not in value else value
    cwd = (record or {}).get("cwd")
    return str(Path(cwd) / value) if cwd else None


def _resumable_command(record: dict | None, stage: str, out: Path) -> tuple[str | None, str | None]:
    """The command line whose ``--resume`` continues a folder stopped at ``stage``, with the working directory it
    ran in (its relative paths are read there): the newest command's, unless the stage left is the fit or report
    and that command was not ``run`` (a ``sweep``, e.g. ``--force``, which moves the earlier fit aside, ends with
    its runs: its ``--resume`` would not fit); then the folder's newest ``run`` command, or ``loopscale run
    OUT/spec.yaml --out OUT``."""
    command = (record or {}).get("command")
    if stage not in ("fit", "report") or not record or record.get("kind") == "run":
        return command, (record or {}).get("cwd")
    runs = [c for c in record.get("earlier_commands") or [] if c.get("kind") == "run" and c.get("command")]
    if runs:
        return runs[-1]["command"], runs[-1].get("cwd") or record.get("cwd")
    return f"loopscale run {shlex.quote(str(out / 'spec.yaml'))} --out {shlex.quote(str(out))}", None


def resume_command(
    command: str | None, folder: Path | None = None, cwd: str | None = None, env: dict | None = None
) -> str | None:
    """The command line that continues a stopped ``command`` (``loopscale run|sweep|tune-lr ...``): the same line
    with ``--resume`` (added once) and without ``--force`` (which would retrain the runs already redone); None
    without a command line. When its ``--out`` (read against the command's
    working directory ``cwd``) is not ``folder`` (the folder was moved or copied since), or was given relative,
    ``folder`` (absolute) replaces it, and is added when the line has none (the default ``runs/NAME`` is relative);
    a relative local ``--storage`` and a relative SPEC file (a ``.yaml`` / ``.yml``
    found under ``cwd``) are made absolute against ``cwd``: the line run from another directory started a new run
    there ("nothing to resume") or found no spec. A SPEC file whose ``corpus`` is a relative path (read against the
    working directory) is replaced by ``folder/spec.yaml``, the same spec with its corpus made absolute (and the
    spec's ``storage_path``, which that file does not record, given as ``--storage``); a relative ``storage_path``
    of a spec kept on the line is given as ``--storage``, made absolute against ``cwd``. ``env`` (the environment the command's error recorded it needs,
    :func:`mark_ended`, e.g. ``{"RAY_AUTH_MODE": "token"}``) goes in front as ``NAME=value`` assignments."""
    if not command:
        return None
    argv = _split_command(command)
    if "--force" in argv:
        argv = [a for a in argv if a != "--force"]
        command = shlex.join(argv)
    stored = _flag_value(argv, "--storage") if cwd else None
    if stored and "://" not in stored[2] and not Path(stored[2]).expanduser().is_absolute():
        # a relative --storage was read against the command's working directory: the line run from elsewhere
        # made a second, empty storage there and restored nothing (the checkpoints stayed in the first)
        i, width, value = stored
        argv[i : i + width] = ["--storage", str(Path(cwd) / value)]
        command = shlex.join(argv)
    found = _flag_value(argv, "--out") if folder is not None else None
    if found:
        i, width, value = found
        was = Path(value).expanduser()
        was = was if was.is_absolute() or not cwd else Path(cwd) / was
        here = Path(folder).resolve()
        if was.resolve() != here or not Path(value).expanduser().is_absolute():
            argv[i : i + width] = ["--out", str(here)]
            command = shlex.join(argv)
    elif folder is not None and len(argv) > 1:  # the default --out (runs/NAME) is relative too: named
        argv += ["--out", str(Path(folder).resolve())]
        command = shlex.join(argv)
    if cwd:
        for j, a in enumerate(argv[2:], start=2):
            if a.startswith("-") or not a.lower().endswith((".yaml", ".yml")):
                continue
            given = Path(a).expanduser()
            given = given if given.is_absolute() else Path(cwd) / given
            if not given.is_file():
                continue
            data = _spec_mapping(given)
            store = data.get("storage_path") if isinstance(data.get("storage_path"), str) else None
            relative_store = bool(store) and "://" not in store and not Path(store).expanduser().is_absolute()
            swap = folder is not None and _corpus_relative(data) and (Path(folder) / "spec.yaml").is_file()
            if swap:
                # its corpus is read against the working directory: from elsewhere the line found no corpus; the
                # folder's spec.yaml (the same spec, its corpus made absolute) reads the same text from anywhere
                argv[j] = str(Path(folder).resolve() / "spec.yaml")
            elif given != Path(a).expanduser():
                argv[j] = str(given)
            if store and (swap or relative_store) and _flag_value(argv, "--storage") is None:
                # the folder's spec.yaml records no storage_path (else `run` looked for the Tune state in OUT/tune,
                # and on a bucket started a new experiment); a relative one is read against the working directory
                argv += ["--storage", str(Path(cwd) / store) if relative_store else store]
            if argv != _split_command(command):
                command = shlex.join(argv)
    command = command if "--resume" in command.split() else f"{command} --resume"
    return "".join(f"{k}={shlex.quote(str(v))} " for k, v in (env or {}).items()) + command


def _spec_mapping(spec_file: Path) -> dict:
    """The YAML mapping of a spec file as written ({} for a file that is not a readable mapping)."""
    import yaml

    try:
        data = yaml.safe_load(spec_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _corpus_relative(data: dict) -> bool:
    """Whether a spec mapping (:func:`_spec_mapping`) names its corpus by a relative path or glob (read against the
    working directory); False for ``embedded``, an absolute or ``~`` path, or none."""
    corpus = data.get("corpus")
    return isinstance(corpus, str) and corpus not in ("", "embedded") and not os.path.isabs(os.path.expanduser(corpus))


def format_status(st: dict) -> list[str]:
    """The lines ``loopscale status`` prints for :func:`collect_status`'s dict."""
    import datetime
    from collections import Counter

    from loopscale.sweep.console import _fmt_s

    r = st["runs"]
    kind = st.get("kind")
    what = {"tune-lr": " (tune-lr output)", "sweep": " (sweep output)"}.get(kind, "")
    lines = [f"{st['out']}: {st['spec'] or '?'}{what} — {st['state']}, stage {st['stage']}"]
    if st.get("last_command_finished"):  # (a `sweep` or `tune-lr` in a run folder did its part; nothing was stopped)
        lines[0] = (f"{st['out']}: {st['spec'] or '?'}{what} — stage {st['stage']} next: the last command, "
                    f"`loopscale {st['last_command_finished']}`, finished its part")  # fmt: skip
    cmd = st.get("command")
    if cmd:
        lines.append(f"command: {cmd.get('command')} (pid {cmd.get('pid')} on {cmd.get('host')})")
    if kind == "tune-lr":  # tune-lr trains no run of the grid: "N pending" read as runs it left undone
        if r["total"]:  # a folder with a spec.yaml: the grid it plans
            lr = st.get("lr") or {}
            if (lr.get("studies") or {}).get("total") is None:  # the spec (whose grid gave the total) fixes the LR
                how = "at the spec's fixed LR: lr_table.parquet is not read"
            elif "table" in lr:
                how = "with the LRs of its lr_table.parquet"
            else:
                how = "with the LRs of the lr_table.parquet tune-lr writes here when its studies end"
            lines.append(
                f"runs: the spec's grid plans {r['total']} runs; tune-lr trains none of them (`loopscale sweep` or "
                f"`loopscale run` of the same spec with --out this folder trains them, {how})"
            )
    else:
        lines.append(
            f"runs: {r['total']} planned — {r['ok']} ok, {r['diverged']} diverged, "
            + (f"{r['did_not_learn']} did not learn, " if r.get("did_not_learn") else "")
            + f"{r['failed']} failed, {r['running']} running, {r['pending']} pending"
            + (f" ({r['unrecorded']} more finished, recorded when the sweep continues, training none of them)"
               if r.get("unrecorded") else "")  # fmt: skip
        )
    if st["failures"]:
        for err, k in Counter(f["error"] for f in st["failures"]).most_common(5):
            lines.append(f"  failed ({k}): {err}")
    tm = st["time"]
    walls = ", ".join(f"{k} {_fmt_s(v)}" for k, v in tm["stage_wall_s"].items())
    eta = f", ETA {_fmt_s(tm['eta_s'])}" if tm.get("eta_s") is not None else ""
    stage_s = (
        f"; current stage {st['stage']}: {_fmt_s(tm['running_stage_s'])} since its progress display started"
        if "running_stage_s" in tm
        else ""
    )
    if "ran_s" in tm:
        start = datetime.datetime.fromtimestamp(tm["started_at"])
        last = tm.get("last_progress_at")
        if last is not None:
            last_dt = datetime.datetime.fromtimestamp(last)
            last_s = last_dt.strftime("%H:%M:%S" if last_dt.date() == start.date() else "%Y-%m-%d %H:%M:%S")
        earlier = tm["total_s"] - tm["ran_s"]
        ended = "before it stopped" if st["state"] == "stopped" and not st.get("last_command_finished") else "to finish"
        lines.append(
            f"time: {_fmt_s(tm['ran_s'])} {ended} (started {start.strftime('%Y-%m-%d %H:%M:%S')}"
            + (f"; last progress {last_s}" if last is not None else "")
            + ")"
            + (f", {_fmt_s(tm['total_s'])} with earlier commands" if earlier >= 0.5 else "")
        )
        if walls:
            lines.append(f"  stage wall times recorded: {walls}")
    elif "command_s" in tm:
        since = datetime.datetime.fromtimestamp(tm["started_at"]).strftime("%Y-%m-%d %H:%M:%S")
        earlier = tm["total_s"] - tm["command_s"]
        lines.append(
            f"time: {_fmt_s(tm['command_s'])} since the command started ({since})"
            + (f", {_fmt_s(tm['total_s'])} with earlier commands" if earlier >= 0.5 else "")
            + stage_s
            + eta
        )
        if walls:
            lines.append(f"  stage wall times recorded: {walls}")
    elif tm["total_s"]:
        # earlier commands that stopped ran partly outside the stage wall times recorded (earlier_unrecorded_s)
        outside = tm["total_s"] - sum(tm["stage_wall_s"].values())
        lines.append(
            f"time: {_fmt_s(tm['total_s'])}"
            # the stages' own clocks: a command's start-up (imports, Ray) and closing lines are not in them
            + ((f", its stages' wall times summed ({walls})" if outside < 0.5 else
                f", its stages' wall times ({walls}) and {_fmt_s(outside)} that earlier commands ran before they "
                "stopped, summed") if walls else "")  # fmt: skip
            + stage_s
            + eta
        )
    if tm.get("train_left"):
        t = tm["train_left"]
        lines.append(
            f"  training left: about {_fmt_s(t['seconds'])} for its {t['runs']} runs on this machine's {t['cpus']} "
            f"CPU{'s' * (t['cpus'] != 1)}, at the FLOP/s of the {t['rate_runs']} ok run"
            f"{'s' * (t['rate_runs'] != 1)} recorded here (the sweep stage alone; `run --dry-run` says what it "
            "assumes)"
        )
    if tm.get("train_left_note"):
        lines.append(f"  training left: {tm['train_left_note']}")
    if tm.get("earlier_commands"):
        runs_of = [f"{c.get('kind') or '?'} {_fmt_s(float(c.get('ran_s') or 0.0))}" for c in tm["earlier_commands"]]
        lines.append(f"  earlier commands in this folder, oldest first: {', '.join(runs_of)}")
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
    if p and p.get("stage") == "bootstrap":  # which call of the fit's several, as the console shows it
        call = f" ({p['call']})" if p.get("call") else ""
        before = (f"; {p['calls_ended']} bootstrap{'s' * (p['calls_ended'] != 1)} of {p.get('refits_ended')} refits "
                  "ended before it" if p.get("calls_ended") else "")  # fmt: skip
        lines.append(f"bootstrap: {p.get('done')} of {p.get('total')} refits{call}{before}")
    tune = st.get("tune") or {}
    if "source" in tune:
        trials = tune.get("trials")
        src = ", live" if tune["source"] == "progress" else ""
    else:
        trials = (p.get("trials") if p and p.get("stage") == "grid" else None) or tune.get("trials")
        src = "" if trials is tune.get("trials") else ", live"
    if trials:
        n = sum(trials.values())
        tr = ", ".join(f"{k.lower()} {v}" for k, v in sorted(trials.items()))
        lo, hi = tune.get("runs_per_trial") or (None, None)
        each = (
            ""
            if hi is None or hi <= 1
            else f", {lo if lo == hi else f'{lo}-{hi}'} runs each (seeds trained together as an ensemble)"
        )
        lines.append(f"tune trials ({tune.get('experiment', 'grid')}{src}): {n}{each}: {tr}")
    if st.get("storage_error"):
        lines.append(f"tune state: not read: {st['storage_error']}")
    lr = st.get("lr") or {}
    if "studies" in lr:
        tot = lr["studies"]["total"]
        chose = "; ".join(f"size {b['size']} r {b['r']}: lr {b['lr']:.4g} (val {b['val_loss']:.4f}, {b['trials']} "
                          "trials)" for b in lr["studies"].get("best") or [])  # fmt: skip
        lines.append(
            f"LR studies: {lr['studies']['done']}" + (f" of {tot}" if tot is not None else "") + " done"
            + (f"; best so far: {chose} (the LR table is written when every study has ended)" if chose else "")
        )
    if lr.get("table") and lr.get("table_used") is False:
        lines.append("LR table (tuned, not used: the spec fixes the LR of every run):")
    for row in lr.get("table") or []:
        val = f"{row['best_val_loss']:.4f}" if row.get("best_val_loss") is not None else "?"
        lr_s = f"{row['lr']:.4g}" if row.get("lr") is not None else "-"
        best, smooth, chosen = row.get("lr_best"), row.get("lr_smoothed"), row.get("lr")
        # a smoothed LR was not trained by any trial: the loss is the best trial's, at its own LR; an LR that is
        # neither (the table edited by hand) is said as such, not called smoothed
        at = ""
        if best is not None and chosen is not None and not math.isclose(best, chosen, rel_tol=1e-9):
            how = ("lr is smoothed" if smooth is None or math.isclose(smooth, chosen, rel_tol=1e-9) else
                   f"lr is neither it nor the smoothed {smooth:.4g}: the table was edited")  # fmt: skip
            at = f" at lr {best:.4g}, the best trial's; {how}"
        # tune_per_r: false: one study per size, its LR shared by every r (its trials are counted once, there)
        shared = row.get("tuned_r") is not None and row["tuned_r"] != row["r"]
        lines.append(
            f"  size {row['size']} r {row['r']}: lr {lr_s} ("
            + (f"the r {row['tuned_r']} study's: " if shared else "")
            + f"val {val}{at}, {row['n_trials']} trials, {row['n_pruned']} pruned)"
        )
    lines += [f"  tune-lr said: {n}" for n in lr.get("notes") or []]
    head = "fit (an earlier fit's; the fit stage started since has not ended)" if st.get("fit_earlier") else "fit"
    # a headline of a stale fit, or of other fit rules than this loopscale's, is not today's result: said on its line
    flags = [w for w, key in (("stale", "stale:"), ("other fit rules", "made under fit rules"),
                              ("files missing", "its files "), ("small data", "small data:")) if
             any(c.startswith(key) for c in st.get("fit_caveats") or [])]  # fmt: skip
    if flags:
        head += f" ({' and '.join(flags)}: see below)"
    lines += [f"{head}: {h}" for h in st["fit"]]
    lines += [f"  ({c})" for c in st.get("fit_caveats") or []]
    if st.get("runs_in_parts_only"):
        n = st["runs_in_parts_only"]
        how = ("the command to continue, below, writes it" if st.get("resume_with")
               else "`loopscale sweep SPEC --out DIR --resume` with the folder's spec writes it")  # fmt: skip
        whose = "runs'" if n != 1 else "run's"
        lines.append(f"runs.parquet lacks {n} finished {whose} records (they are in parts/; "
                     f"`loopscale fit` reads runs.parquet): {how}, training none of them again")
    if st.get("design"):
        lines.append(f"design prediction (`loopscale design --out`): {st['design']}")
    lr_table = f"{Path(st['out']) / 'lr_table.parquet'} "
    runs_bad = [u for u in st.get("unreadable") or [] if not u.startswith(lr_table)]
    lr_bad = [u for u in st.get("unreadable") or [] if u.startswith(lr_table)]
    if runs_bad:
        lines.append(f"unreadable, read as no runs: {'; '.join(runs_bad)}")
    if lr_bad:
        lines.append(f"unreadable, read as no LR table: {'; '.join(lr_bad)}")
    if st.get("unreadable_own"):
        lines.append(f"unreadable, read as absent: {'; '.join(st['unreadable_own'])}")
    if st.get("set_aside"):
        kept = "; ".join(_set_aside_line(a) for a in st["set_aside"])
        lines.append(f"set aside by earlier commands, kept but not read (delete them when no longer needed): {kept}")
    if st.get("last_command_error"):
        how = "stopped" if st.get("state") == "stopped" else "ended"
        lines.append(f"the last command {how} on an error: {st['last_command_error']}")
    if st.get("disk_free") is not None:
        lines.append(f"disk: only {_fmt_bytes(st['disk_free'])} free where {st['out']} is; a full disk stops a command "
                     "before it can record why: free space there (`df -h`), then continue")  # fmt: skip
    if st.get("resume_with"):
        lines.append(f"to continue (finished runs are kept): {st['resume_with']}")
        if gone := st.get("cluster_gone"):
            n = gone.get("runs_left") or 0
            rest = (f"its {n} run{'s' * (n != 1)} left then train on this machine" if n
                    else "the fit needs no cluster and trains nothing")  # fmt: skip
            lines.append(f"  the Ray cluster at {gone['address']} does not answer now ({gone['why']}): that line "
                         f"needs it back; or continue without --address ({rest}): {gone['resume_here']}")
    if st.get("nothing_to_fit"):
        lines.append(f"cannot continue: {st['nothing_to_fit']}")
    if st.get("cannot_resume"):
        lines.append(f"cannot continue: {st['cannot_resume']}")
    return lines


#: Free space below which ``status`` of a stopped folder names its disk as the likely cause (bytes): a sweep's
#: next write (a run's results part, Tune's state, a checkpoint) needs more than a full disk has.
DISK_SHORT_BYTES = 256 * 2**20


def _disk_short(out: Path) -> int | None:
    """The free bytes of the disk holding ``out`` when fewer than :data:`DISK_SHORT_BYTES` (a command stopped by a
    full disk could not write the error that stopped it), else None (also where the disk cannot be asked)."""
    import shutil

    try:
        free = shutil.disk_usage(out).free
    except OSError:
        return None
    return int(free) if free < DISK_SHORT_BYTES else None


def _ended_with_error(record: dict | None) -> str | None:
    """The error line a stopped folder's last command ended with (:func:`mark_ended`), or None (it was interrupted,
    killed, or wrote no record of its end)."""
    ended = (record or {}).get("ended")
    if isinstance(ended, dict) and ended.get("how") == "error" and ended.get("message"):
        return str(ended["message"])
    return None


def _set_aside_line(a: dict) -> str:
    runs = "" if a["runs"] is None else f"{a['runs']} runs, "
    kind = " (unreadable)" if a.get("file") else "/"
    return f"{a['path']}{kind} ({runs}{_fmt_bytes(a['bytes'])})"


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def refuse_foreign_storage(storage: str | None, out: str | Path) -> None:
    """Refuse a local ``--storage`` given to ``loopscale status OUT`` that cannot hold OUT's Tune state: nothing
    there (a typo), a file, or a storage whose claim file (:data:`STORAGE_CLAIM`) names another output folder, or
    that is another output folder's default one (``X/tune``, ``X/tune_lr/ray``, X holding a loopscale spec or
    command record), while none of OUT's recorded commands used it (:func:`earlier_storages`). Either read as
    OUT's grid would show no trials, or the other folder's trials as OUT's. A storage OUT's commands used, a bucket, or one with no claim passes. Reads only.

    Raises:
        ValueError: naming the storage, what it is, and the folder to ask instead."""
    from loopscale.cluster.storage import is_local_uri, local_path

    if not storage or not is_local_uri(storage):
        return
    where = Path(local_path(storage))
    if not where.exists():
        raise ValueError(f"--storage {storage}: nothing is there; give the storage the folder's commands used, or "
                         "leave --storage out (the folder's logs/command.json names it)")
    if not where.is_dir():
        raise ValueError(f"--storage {storage} is a file, not a folder: Tune keeps its state in a folder; give the "
                         "storage the folder's commands used, or leave --storage out (the folder's "
                         "logs/command.json names it)")  # fmt: skip
    claim = _read_json(where / STORAGE_CLAIM)
    other = claim.get("out") if isinstance(claim, dict) else None
    if not other:  # no claim (written for a --storage only): another output folder's default OUT/tune, OUT/tune_lr/ray
        home = _default_storage_home(where)
        if home is not None and any((home / n).is_file() for n in ("spec.yaml", "run_meta.json", "logs/command.json")):
            other = str(home)
    if not other or Path(other).resolve() == Path(out).resolve():
        return
    if any(_same_storage(used, storage) for used in earlier_storages(Path(out).resolve())):
        return
    raise ValueError(f"--storage {storage} holds the Tune state of {other} (its commands last used it), and no "
                     f"command of {Path(out).resolve()} used it: read as this folder's, its trials would be that "
                     f"folder's; `loopscale status {shlex.quote(str(other))}`, or leave --storage out (the folder's logs/command.json "
                     "names its own)")  # fmt: skip


def status_cmd(
    out: Path = typer.Argument(..., metavar="DIR", help="The --out folder of a `loopscale run`, `sweep` or `tune-lr`."),
    storage: str | None = typer.Option(
        None, "--storage", help="Where the Tune state lives when not in OUT/tune (default: the --storage of the folder's last command, from logs/command.json)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """What a run or sweep has done and is doing: stage, runs per status, failures, time and ETA, LR table, fit."""
    from loopscale.cluster.options import reachable_storage, validate_storage

    storage = validate_storage(storage)
    reachable_storage(storage)  # else an unreadable --storage would read as a sweep with no Tune state
    refuse_foreign_storage(storage, out)  # else a typo, a file or another folder's storage reads as this one's
    st = collect_status(out, storage)
    if as_json:
        json.dump(st, sys.stdout, default=str)
        sys.stdout.write("\n")
        return
    for line in format_status(st):
        typer.echo(line)
