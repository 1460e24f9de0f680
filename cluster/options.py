"""The Ray options every Ray-using command takes: ``--address``, ``--num-cpus``, ``--num-gpus``, ``--ray-temp-dir``.

Use the ``Annotated`` aliases in a Typer command's signature, then open the session with
``session_from_options``; ``tune-lr``, ``sweep``, ``fit --workers`` and ``run`` thereby accept the same
flags with the same meaning::

    from loopscale.cluster.options import AddressOpt, NumCpusOpt, NumGpusOpt, RayTempDirOpt, ClusterOptions

    def sweep_cmd(spec: str, address: AddressOpt = None, num_cpus: NumCpusOpt = None,
                  num_gpus: NumGpusOpt = None, ray_temp_dir: RayTempDirOpt = None) -> None:
        opts = ClusterOptions(address=address, num_cpus=num_cpus, num_gpus=num_gpus, ray_temp_dir=ray_temp_dir)
        opts.validate()                      # ValueError before anything starts
        with opts.session() as info:         # loopscale.cluster.connect.ray_session
            ...
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "AddressOpt",
    "TuneAddressOpt",
    "NumCpusOpt",
    "NumGpusOpt",
    "RayTempDirOpt",
    "StorageOpt",
    "validate_storage",
    "STORAGE_SCHEMES",
    "ClusterOptions",
    "CLUSTER_FLAGS",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "Interrupted",
    "present_errors",
]

ADDRESS_HELP = (
    "Ray cluster to join: 'auto' (started on this machine with `ray start --head`), 'host:port' or "
    "'ray://host:port'. Unset: start an embedded local Ray (or join RAY_ADDRESS if set, as `ray job submit` does)."
)
TUNE_ADDRESS_HELP = (
    "Ray cluster to join: 'auto' (started on this machine with `ray start --head`) or 'host:port' (its GCS "
    "address; Ray Client's 'ray://' is refused here: submit the command to the cluster with `ray job submit`). "
    "Unset: start an embedded local Ray (or join RAY_ADDRESS if set, as `ray job submit` does)."
)
NUM_CPUS_HELP = "CPUs the embedded local Ray may use (default: all cores). Not with --address."
NUM_GPUS_HELP = "GPUs the embedded local Ray may use (default: all it detects). Not with --address."
RAY_TEMP_DIR_HELP = (
    "Absolute, short path for Ray's session directory of the embedded Ray (default: RAY_TMPDIR or "
    "<system temp>/ray). Not with --address."
)

AddressOpt = Annotated[str | None, typer.Option("--address", help=ADDRESS_HELP, rich_help_panel="Ray")]
#: ``--address`` of the commands that run a Ray Tune experiment (``tune-lr``, ``sweep``, ``run``): no Ray Client
TuneAddressOpt = Annotated[str | None, typer.Option("--address", help=TUNE_ADDRESS_HELP, rich_help_panel="Ray")]
NumCpusOpt = Annotated[
    int | None, typer.Option("--num-cpus", min=1, help=NUM_CPUS_HELP, rich_help_panel="Ray")
]
NumGpusOpt = Annotated[
    int | None, typer.Option("--num-gpus", min=0, help=NUM_GPUS_HELP, rich_help_panel="Ray")
]
RayTempDirOpt = Annotated[
    str | None, typer.Option("--ray-temp-dir", help=RAY_TEMP_DIR_HELP, rich_help_panel="Ray")
]

STORAGE_HELP = (
    "Where Tune state and trial checkpoints live: any pyarrow URI (local or NFS path, file://, s3://, gs://, "
    "hdfs://). On a multi-node cluster it must be shared by every node. Default: the spec's storage_path, "
    "else OUT/tune."
)
StorageOpt = Annotated[str | None, typer.Option("--storage", help=STORAGE_HELP, rich_help_panel="Ray")]

#: The flag names, in order; a test pins that every Ray-using command has all of them.
CLUSTER_FLAGS = ("--address", "--num-cpus", "--num-gpus", "--ray-temp-dir")


#: Why a Ray Tune command refuses a Ray Client (``ray://``) address, and what to do instead.
RAY_CLIENT_TUNE = (
    "over Ray Client, Ray Tune runs its experiment driver inside the cluster, so the folder's records (runs.parquet, "
    "the progress display, the LR studies) would be written on the head node's disk instead of here, and a "
    "finished experiment reads as interrupted; run the command on the cluster (`RAY_AUTH_MODE=token ray job submit "
    "--address http://HEAD:8265 --working-dir . -- loopscale run SPEC --out OUT`, whose job client needs "
    "ray[default]: loopscale's `cluster` extra; or a shell on the head node with "
    "--address auto), or join with --address HOST:PORT from a machine in the cluster's network (`loopscale fit "
    "--workers` does take a ray:// address)"
)


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    """How a command reaches Ray (the values of the four flags above).

    Attributes:
        address: None (embedded local Ray), 'auto', 'host:port' or 'ray://host:port'.
        num_cpus: CPUs for the embedded Ray (None: all cores).
        num_gpus: GPUs for the embedded Ray (None: what Ray detects).
        ray_temp_dir: Ray session directory for the embedded Ray (absolute path).
    """

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    ray_temp_dir: str | None = None

    def validate(self, *, tune: str | None = None) -> None:
        """Check the combination without starting Ray.

        Args:
            tune: the command, when it runs a Ray Tune experiment (``"loopscale sweep"``, ...): it cannot join
                through Ray Client (see :data:`RAY_CLIENT_TUNE`).
        Raises:
            ValueError: bad address, or a ``host:port`` where nothing answers (a TCP connection, no Ray);
                num_cpus/num_gpus/ray_temp_dir together with an address (``--address``, or ``RAY_ADDRESS`` in the
                environment, which Ray joins when ``--address`` is not given; a malformed one is named as such);
                num_gpus > 0 without CUDA; relative or overlong ray_temp_dir; a Tune command given a ``ray://``
                address (``--address`` or RAY_ADDRESS).
        """
        import os

        from loopscale.cluster.connect import _validate_local_options, check_reachable, validate_address

        env = (os.environ.get("RAY_ADDRESS") or "").strip() or None
        client = next(
            (f"{how} {a!r}" for how, a in (("--address", self.address), ("RAY_ADDRESS", env))
             if a and a.strip().startswith("ray://")),
            None,
        )  # fmt: skip
        if tune and client and (self.address is None or self.address.strip().startswith("ray://")):
            raise ValueError(f"{client} (Ray Client) cannot run `{tune}`: {RAY_CLIENT_TUNE}")
        try:
            address = validate_address(self.address)
        except ValueError as e:  # a Tune command cannot use the Ray Client form the message offers
            if tune:
                raise ValueError(str(e).replace(" or 'ray://host:port' (Ray Client, e.g. 'ray://head:10001')",
                                                "", 1)) from None  # fmt: skip
            raise
        joined = f"--address {address!r}"
        if address is None and env is not None:  # Ray joins RAY_ADDRESS (as under `ray job submit`): name it
            try:
                address = validate_address(env)
            except ValueError:
                raise ValueError(
                    f"RAY_ADDRESS={env!r} (set in this environment; --address was not given) is not a Ray address; "
                    f"set it to 'auto', 'host:port'{'' if tune else ' or ray://host:port'}, or unset it for the "
                    "embedded local Ray"
                ) from None
            joined = f"RAY_ADDRESS={env!r} (set in this environment: the command joins that cluster)"
        if address is not None:
            given = [
                flag
                for flag, v in (
                    ("--num-cpus", self.num_cpus),
                    ("--num-gpus", self.num_gpus),
                    ("--ray-temp-dir", self.ray_temp_dir),
                )
                if v is not None and v is not False
            ]
            if given:
                drop = "drop --address" if self.address else "unset RAY_ADDRESS"
                raise ValueError(
                    f"{', '.join(given)} cannot be combined with {joined}: the cluster's nodes decide their "
                    f"resources and where Ray keeps its session files; drop them, or {drop} to use the embedded "
                    "local Ray"
                )
            if self.address is not None:
                check_reachable(address)
            elif tune:  # RAY_ADDRESS, for a command that joins it for sure: a join that fails later left spec.yaml
                # and logs/ behind (a fit may never start Ray: ray_session checks it if it does)
                check_reachable(address, hint=f"unset RAY_ADDRESS (now {env!r})")
        else:
            _validate_local_options(self.num_cpus, self.num_gpus, self.ray_temp_dir, flags=True)

    def session(self, **kwargs):
        """``ray_session(...)`` with these options (extra keyword arguments are passed through)."""
        from loopscale.cluster.connect import ray_session

        return ray_session(
            self.address,
            num_cpus=self.num_cpus,
            num_gpus=self.num_gpus,
            temp_dir=self.ray_temp_dir,
            **kwargs,
        )


#: URI schemes pyarrow 26's ``FileSystem.from_uri`` knows (plus plain local paths).
STORAGE_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")


def validate_storage(storage: str | None) -> str | None:
    """Check a ``--storage`` value before anything starts, without touching the network; returns it with a relative
    local path made absolute against the current working directory (:func:`loopscale.cluster.storage.absolute_uri`)
    and a URI's scheme in lower case (``S3://b`` is ``s3://b``: pyarrow knows no other), anything else unchanged.

    Only the form is checked (a local path, or a scheme in ``STORAGE_SCHEMES``, and no inline
    credentials); reachability is left to the first use (``s3://`` without ``?region=`` would otherwise
    make pyarrow query the bucket's region here).

    Raises:
        ValueError: empty, an unknown scheme (the message lists the known ones), a known scheme without its ``//``
            (``s3:/bucket``, ``file:/abs``: a local folder named ``s3:`` otherwise; for ``file:`` the plain path is
            advised), ``user:secret@`` in it, or a ``file:///`` URI pyarrow cannot parse (a space) or decodes to
            another folder than written (a ``%`` escape).
    """
    if storage is None:
        return None
    if not storage.strip():
        raise ValueError("storage must be a non-empty path or URI, e.g. '/shared/runs' or 's3://bucket/runs'")
    import re

    if (m := re.match(r"([A-Za-z][A-Za-z0-9+.-]*):(?!//)", storage)) and m.group(1).lower() in STORAGE_SCHEMES:
        # `s3:/bucket` or `file:/abs` would be a local folder named `s3:` under the current directory
        scheme, rest = m.group(1).lower(), storage[m.end():]
        if scheme == "file":  # `file:/abs` meant /abs; `file:rel` the path rel under the current directory
            if not rest.strip():
                raise ValueError(f"storage={storage!r} names no path: give a directory, e.g. '/shared/runs'")
            fix = f"the plain path {rest!r}"  # a URI would need its spaces and '%' escaped; a path is read as written
        else:
            fix = repr(f"{scheme}://{rest.lstrip('/')}")
        raise ValueError(
            f"storage={storage!r} starts with the scheme {m.group(1)!r} but not its '//': it would be read as a local "
            f"folder named {m.group(0)!r} under the current directory; write {fix}"
        )
    if "://" in storage:
        scheme, rest = storage.split("://", 1)
        if scheme.lower() != scheme and scheme.lower() in STORAGE_SCHEMES:
            scheme = scheme.lower()  # pyarrow knows lower-case schemes only ('S3://' is "unrecognized")
            storage = f"{scheme}://{rest}"
        if scheme.lower() not in STORAGE_SCHEMES:
            raise ValueError(
                f"storage={storage!r}: scheme {scheme!r} is not understood by pyarrow; use a local path or one of "
                + ", ".join(f"{x}://" for x in STORAGE_SCHEMES)
            )
        netloc = rest.split("/", 1)[0]
        if scheme.lower() == "file" and netloc == "localhost":
            # file://localhost/abs is file:///abs (RFC 8089); pyarrow refuses the host, and a path read from it
            # would be relative ('localhost/abs' under the current directory)
            rest = rest[len("localhost"):]
            storage, netloc = f"{scheme}://{rest}", ""
        if scheme.lower() == "file" and netloc == "":  # what pyarrow reads, or why it cannot: said now, not in Tune
            import pyarrow as pa
            import pyarrow.fs as pafs

            try:
                _, meant = pafs.FileSystem.from_uri(storage)
            except (pa.ArrowInvalid, ValueError) as e:
                raise ValueError(
                    f"storage={storage!r} is not a URI pyarrow reads ({' '.join(str(e).split())}): give the plain "
                    f"path {rest!r} instead"
                ) from None
            if "%" in rest and meant != rest.split("?", 1)[0]:  # rel%20x: a URI decodes it, a path would not
                raise ValueError(
                    f"storage={storage!r} is read as the folder {meant!r} (a URI decodes '%' escapes); give the "
                    f"plain path {meant!r} if that is the folder meant"
                )
        if scheme.lower() == "file" and netloc != "":
            raise ValueError(
                f"storage={storage!r}: a file:// URI takes an absolute path after its two slashes (file:///abs/dir, "
                f"three slashes); {netloc!r} is read as a host name. Write file:///abs/dir, or give a plain path "
                "(a relative one is taken from the current directory)"
            )
        if "@" in netloc and ":" in netloc.split("@", 1)[0]:
            raise ValueError(
                f"storage for scheme {scheme!r} carries inline credentials (user:secret@); never put keys in URIs: "
                "use the environment (instance role, AWS_*/GOOGLE_* variables)"
            )
    from loopscale.cluster.storage import absolute_uri

    return absolute_uri(storage)


def reachable_storage(storage: str | None, *, write: bool = False) -> None:
    """Check that a remote storage location (``s3://``, ``gs://``, ``hdfs://``, ...) answers, once, before anything
    is written or Ray starts: without this a bucket that cannot be reached (no network, a mistyped name, no
    credentials) stops the command at its first read with pyarrow's traceback (``s3://``), or after Google's
    15-minute retry policy (``gs://``, probed here with a 20 s one). A local path or ``file://`` URI is read only
    with ``write`` (a command that writes there): a probe file is written and removed in it (in the directories
    made for it where it is missing, removed again: a command refused after this check leaves nothing there), so a
    path under a file or on a read-only file system is one line, not a traceback from Tune.

    Raises:
        ValueError: the location cannot be reached, in one line: the first line of pyarrow's reason (what its C++
            side writes to file descriptor 2 meanwhile, e.g. HDFS's search for a JVM, is kept out of the terminal)
            and what to check for that scheme; or (``write``) the local directory cannot be created or written.
    """
    if storage is None:
        return
    if "://" not in storage or storage.lower().startswith("file://"):
        if write:
            _writable_local_storage(storage)
        return
    import pyarrow as pa

    from loopscale.cluster import storage as st

    scheme = storage.split("://", 1)[0].lower()
    probe = storage
    if scheme in ("gs", "gcs") and "retry_limit_seconds=" not in storage:
        probe += ("&" if "?" in storage else "?") + "retry_limit_seconds=20"
    said: list[str] = []
    try:
        with _fd2_captured() as said:  # what pyarrow's C++ side (libhdfs, the JVM) writes straight to fd 2
            st.exists(probe)
    except (OSError, ValueError, pa.ArrowException) as e:  # abfs:// without credentials: ArrowException
        # the first line is the reason; HDFS without a JVM appends the ~90 places it looked for libjvm
        reason = next((ln.strip() for ln in [*str(e).splitlines(), *said] if ln.strip()), type(e).__name__)
        raise ValueError(f"storage {storage!r} cannot be reached: {reason}; {_storage_advice(scheme)}") from None
    if said:  # reached: what it wrote is not hidden
        sys.stderr.write("".join(said))
        sys.stderr.flush()


def _storage_advice(scheme: str) -> str:
    """What to check when a storage of ``scheme`` cannot be reached (the end of :func:`reachable_storage`'s
    message)."""
    if scheme in ("hdfs", "viewfs"):
        return (
            "pyarrow's HDFS needs Hadoop's libhdfs and a JVM on this machine (JAVA_HOME, HADOOP_HOME, and CLASSPATH "
            "from `hadoop classpath --glob`) and the namenode's host:port in the URI (hdfs://NAMENODE:8020/path)"
        )
    if scheme in ("abfs", "abfss"):
        return (
            "check the network, the storage account's and container's names and this machine's Azure credentials "
            "(managed identity, AZURE_* variables)"
        )
    return (
        "check the network, the bucket's name and this machine's credentials (instance role, AWS_*/GOOGLE_* "
        "variables)"
    )


@contextlib.contextmanager
def _fd2_captured():
    """Send what is written to file descriptor 2 (C/C++ code's stderr, which ``sys.stderr`` does not see) to a
    temporary file while the block runs; yields a list that holds its lines afterwards (also when the block
    raises). fd 2 is restored in any case; where it cannot be duplicated (closed), nothing is captured."""
    import tempfile

    lines: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:
        yield lines
        return
    try:
        with tempfile.TemporaryFile(mode="w+b") as tmp:
            sys.stderr.flush()
            os.dup2(tmp.fileno(), 2)
            try:
                yield lines
            finally:
                os.dup2(saved, 2)
                tmp.seek(0)
                lines += tmp.read().decode(errors="replace").splitlines(keepends=True)
    finally:
        os.close(saved)


def _writable_local_storage(storage: str) -> None:
    """Write and remove a probe file in the local storage directory ``storage`` (a path or ``file://`` URI; a
    permission check alone passes for root on a read-only file system such as /sys). Where it is missing, it and
    its missing parents are created for the probe and removed again, so that the check leaves the file system as
    it was (Tune creates the storage when it starts).

    Raises:
        ValueError: it cannot be created or written, with the system's reason.
    """
    import tempfile

    from loopscale.cluster.storage import local_path

    path = local_path(storage)
    made: list[Path] = []  # the missing directories, deepest first: removed again after the probe
    p = path
    while not os.path.lexists(p) and p.parent != p:
        made.append(p)
        p = p.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".loopscale_probe_"):
            pass
    except OSError as e:
        what = e.strerror or type(e).__name__
        if path.is_file() or (p.is_file() and p != path):  # mkdir says "File exists" / "Not a directory"
            what = f"{path} is a file" if path.is_file() else f"{p} is a file"
        raise ValueError(
            f"storage {storage!r} (--storage, or the spec's storage_path) cannot be written: {what}"
            + (f" ({e.filename})" if e.filename and str(e.filename) != str(path) else "")
            + "; give a writable directory (on a multi-node cluster, one every node shares), or leave it unset for "
            "OUT/tune"
        ) from None
    finally:
        for d in made:
            try:
                d.rmdir()
            except OSError:  # not made (mkdir failed above it), or not empty (written meanwhile): left as it is
                pass


def nearest_existing(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest existing ancestor (the filesystem root at the latest): where a
    folder that does not exist yet would be created, and what decides whether it can be."""
    p = Path(path)
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def usable_out_dir(out: Path, what: str = "--out") -> Path:
    """Check that ``out`` can be the command's output directory before any work starts: it is a directory or can
    be created as one (every existing ancestor a directory) and is writable where it exists. Leaves nothing behind:
    where ``out`` is still to be created, a probe folder is made in its nearest existing ancestor and removed at once
    (root passes the permission check on ``/proc`` or ``/sys``, where making a folder still fails). ``what`` names
    it in the message (``--out``; a dry run checks a local storage so too).

    Raises:
        ValueError: ``out`` or one of its ancestors is a file, the nearest existing directory is not writable, or
            a folder cannot be made there (the system's reason).
    """
    import tempfile

    out = Path(out)
    p = nearest_existing(out)
    if p.exists() and not p.is_dir():
        problem = "is a file" if p == out else f"cannot be created: {p} is a file"
        raise ValueError(f"{what} {out} {problem}; give a directory (new or existing)")
    if p.exists() and not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {out}: {p} is not writable")
    if p.exists() and p != out:
        try:
            probe = tempfile.mkdtemp(prefix=".loopscale-probe-", dir=p)
        except OSError as e:
            raise ValueError(f"{what} {out} cannot be created: no folder can be made in {p} ({e.strerror or e})") from None
        os.rmdir(probe)
    return out


# --- the one error presenter of the console script ----------------------------------------------------------

EXIT_USAGE = 2
"""Exit code of a command refused before or while running: bad input (``ValueError``, e.g. a spec error) or a
missing file."""
EXIT_FAILED = 1
"""Exit code of a command that ran but produced nothing usable (:class:`CommandFailed`, e.g. not one run finished)."""
EXIT_INTERRUPTED = 130
"""Exit code of a driver stopped by SIGINT with its state saved (128 + SIGINT, the shell's convention)."""
EXIT_TERMINATED = 143
"""Exit code of a driver stopped by SIGTERM, which it handles as a Ctrl-C (128 + SIGTERM)."""


class CommandFailed(RuntimeError):
    """A command ran but nothing it produced is usable (e.g. "0 of N runs finished ok: <most common error>")."""


class Interrupted(RuntimeError):
    """A driver was stopped (SIGINT) before its work finished; its state is saved and ``--resume`` continues it."""


def interrupt_message(exc: BaseException, resumable: bool, kwargs: dict | None = None) -> str:
    """The line a stopped command prints. :class:`Interrupted` (a Tune experiment saved its state) and a plain
    Ctrl-C of a command with ``--resume`` (its finished stages and runs are kept; unless its ``--out`` folder does
    not exist, as before its first write, which is said instead) name ``--resume`` (and, for a
    ``--force`` one, a rerun without ``--force``: it would retrain the runs already redone); a command
    without it says what is kept: ``train`` with ``--checkpoint-dir`` and ``--checkpoint-every-steps`` resumes from
    its newest checkpoint when rerun, other commands (fit, report, design, ...) keep nothing partial and are simply
    rerun."""
    what = str(exc) or "stopped"
    # --force again would set aside and retrain the runs it already redid: the rerun drops it
    same = "the same command without --force," if (kwargs or {}).get("force") else "the same command"
    if isinstance(exc, Interrupted):
        return f"interrupted: {what}; the state is saved, rerun {same} with --resume to continue"
    out = (kwargs or {}).get("out")
    if resumable and isinstance(out, str | os.PathLike) and not os.path.lexists(out):
        # stopped before its first write (Ctrl-C during imports or Ray's start): there is nothing to resume
        return f"interrupted: {what} before anything was written to {os.fspath(out)}; rerun the command to start"
    if resumable:
        return f"interrupted: {what}; what had finished is kept, rerun {same} with --resume to continue"
    if (kwargs or {}).get("checkpoint_dir") and (kwargs or {}).get("checkpoint_every_steps"):
        return (f"interrupted: {what}; rerun the same command to continue from the newest checkpoint in "
                "--checkpoint-dir (if one was due: every --checkpoint-every-steps steps)")
    return f"interrupted: {what}; nothing partial was kept, rerun the command to start again"


#: errno values of a disk that cannot take what a command writes: full, over quota, mounted read-only.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


ACCESS_ERRNOS = (errno.EACCES, errno.EPERM)
"""errno values of a path this user may not use (permission denied, operation not permitted)."""


def disk_error(exc: BaseException, errnos: tuple[int, ...] = DISK_ERRNOS) -> OSError | None:
    """The ``OSError`` of a full, over-quota or read-only disk (:data:`DISK_ERRNOS`; another tuple of ``errnos``,
    e.g. :data:`ACCESS_ERRNOS`) that ``exc`` is, or that caused it (its ``__cause__`` / ``__context__`` chain:
    Tune and pyarrow wrap it), else None."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in errnos:
            return e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return None


def click_exceptions() -> tuple[type, ...]:
    """The exceptions Typer (its Click) ends a command with on purpose (exit codes, usage errors): never rewritten."""
    try:
        import typer.exceptions as te
    except ImportError:  # a Typer that raises Click's own
        import click.exceptions as te
    return tuple(getattr(te, n) for n in ("Exit", "Abort", "TyperException", "ClickException") if hasattr(te, n))


def disk_error_message(err: OSError, resumable: bool) -> str:
    """The one line for :func:`disk_error`'s error: what the disk said, where, and how to go on."""
    name = os.strerror(err.errno) if err.errno else ""
    said = str(err) if name.lower() in str(err).lower() else f"{name} ({err})"
    if err.filename and str(err.filename) not in said:
        said += f" writing {err.filename}"
    then = ("rerun the same command with --resume: what had finished is kept" if resumable
            else "rerun the command")  # fmt: skip
    if err.errno in ACCESS_ERRNOS:
        fix = ("this user may not use that path (its permissions, or a file system such as /sys that takes no new "
               "files): give a path it may use")
    elif err.errno == errno.EROFS:
        fix = "make it writable (it is mounted read-only) or choose another folder"
    else:
        fix = "free space there (`df -h` shows where it is short) or choose another folder"
    return f"{said}; {fix}, then {then}"


def present_errors(command):
    """Wrap a Typer command so that its errors reach the user as one line on stderr and an exit code:
    :class:`Interrupted` or ``KeyboardInterrupt`` -> "interrupted: ..." and :data:`EXIT_INTERRUPTED` (a SIGTERM
    is handled as a Ctrl-C, by :func:`loopscale.cluster.connect.sigterm_interrupts` or inside a Ray session:
    "interrupted (SIGTERM): ..." and :data:`EXIT_TERMINATED`);
    :class:`CommandFailed` -> "error: <message>" and :data:`EXIT_FAILED`;
    ``ValueError`` / ``FileNotFoundError`` -> "error: <message>" and :data:`EXIT_USAGE`; a full, over-quota or
    read-only disk anywhere in the error's chain (:func:`disk_error`), or a path this user may not use
    (:data:`ACCESS_ERRNOS`), -> "error: ..." and :data:`EXIT_FAILED`.
    Anything else is a bug and keeps its traceback. The console script registers every command through it; where
    SIGINT or SIGTERM has the console script's start-up handler (:func:`loopscale.sweep.entry.startup_sigint`),
    the wrapper gives it back to its default handler first."""

    resumable = "resume" in inspect.signature(command).parameters

    @functools.wraps(command)
    def presented(*args, **kwargs):
        import signal

        # the console script's start-up handlers (loopscale.sweep.entry): from here the signals are this command's
        if getattr(signal.getsignal(signal.SIGINT), "loopscale_startup", False):
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if getattr(signal.getsignal(signal.SIGTERM), "loopscale_startup", False):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            from loopscale.cluster.connect import sigterm_interrupts

            with sigterm_interrupts():
                return command(*args, **kwargs)
        except (Interrupted, KeyboardInterrupt) as e:
            from loopscale.cluster.connect import stopped_by_sigterm

            term = stopped_by_sigterm()
            msg = interrupt_message(e, resumable, kwargs)
            typer.echo(msg.replace("interrupted: ", "interrupted (SIGTERM): ", 1) if term else msg, err=True)
            raise typer.Exit(code=EXIT_TERMINATED if term else EXIT_INTERRUPTED) from None
        except CommandFailed as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(code=EXIT_FAILED) from None
        except (ValueError, FileNotFoundError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(code=EXIT_USAGE) from None
        except Exception as e:  # a full or read-only disk, or a path this user may not use, is the machine's state,
            # not a bug: one line, no traceback
            if isinstance(e, (typer.Exit, *click_exceptions())):
                raise
            if (err := disk_error(e) or disk_error(e, ACCESS_ERRNOS)) is None:
                raise
            typer.echo(f"error: {disk_error_message(err, resumable)}", err=True)
            raise typer.Exit(code=EXIT_FAILED) from None

    return presented
