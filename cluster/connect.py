"""One place that decides how loopscale reaches Ray: start the embedded local Ray, or join a cluster.

``ray_session`` is the only function in loopscale that calls ``ray.init`` / ``ray.shutdown``. Every
Ray-using command (``tune-lr``, ``sweep``, ``fit --workers``, ``run``) enters it with the options from
``loopscale.cluster.options``.

Behaviour (Ray 2.60, checked against ``ray/_private/worker.py``):

* Ray already initialised in this process (e.g. a test built a ``ray.cluster_utils.Cluster`` and called
  ``ray.init(address=cluster.address)``): it is reused as is and never shut down by us.
* ``address=None`` and no ``RAY_ADDRESS`` in the environment: start a fresh embedded local Ray
  (``ray.init(address="local")``; a bare ``ray.init()`` would silently join any cluster registered in
  ``<temp>/ray/ray_current_cluster`` by ``ray start`` or another process) with the given
  CPUs/GPUs, session dir ``temp_dir`` (else Ray's default: ``$RAY_TMPDIR/ray``, else ``<system temp>/ray``),
  dashboard off. Shut down on exit.
* ``address=None`` with ``RAY_ADDRESS`` set (``ray job submit`` sets it for the job's entrypoint): join
  that cluster; never shut it down.
* ``address="auto"`` (the cluster started on this machine by ``ray start --head``), ``"host:port"`` (a
  GCS address) or ``"ray://host:port"`` (Ray Client): join; never shut it down.

Networking, as Ray 2.60 does it: the dashboard (when a user turns it on) binds to ``dashboard_host``,
whose default is the loopback address, and we keep that. The GCS, raylet and object-manager ports
cannot be bound to loopback: ``ray.init(_node_ip_address="127.0.0.1")`` is rewritten by
``services.resolve_ip_for_localhost`` to the machine's own non-loopback address, and the sockets listen on
all interfaces (``*:port``), so we do not pass ``_node_ip_address`` at all. The embedded Ray is therefore
reachable on the machine's own address while it runs; keep the machine behind a firewall (see the
README's cluster section: a Ray cluster must never be reachable from untrusted networks).

Authentication: Ray 2.60 turns token auth on by default; the first start writes ``~/.ray/auth_token``
and every worker/driver must present it. We leave that on. A user who wants it off (e.g. throwaway CI)
sets ``RAY_AUTH_MODE=disabled`` in the environment of every Ray process (head, workers and driver); we
never read, copy or log the token. With ``RAY_AUTH_MODE`` unset, Ray logs a WARNING on every start of a new local
cluster saying that it turned token auth on; the embedded start logs that notice at INFO instead (to ``OUT/logs``
under the console of ``loopscale run``), as it reports Ray's default, not a problem.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RayInfo", "ray_session", "validate_address", "check_reachable", "driver_thread_env", "no_node_fits"]

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d{1,5})$")

#: Thread-count variables set for the driver process (numpy/scipy/torch in the driver, e.g. the
#: bootstrap fits, would otherwise oversubscribe the cores the trials run on; measured 3-33x slower,
#: ``docs/ray_tune.md`` §3).
DRIVER_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True, kw_only=True)
class RayInfo:
    """What ``ray_session`` connected to.

    Attributes:
        address: the GCS address (``host:port``) of the cluster, or the ``ray://`` URL for Ray Client.
        started_by_us: True when ``ray_session`` started this Ray and will shut it down on exit.
        cpus: total ``CPU`` resource of the cluster (alive nodes) when the session was entered.
        gpus: total ``GPU`` resource of the cluster when the session was entered.
        nodes: number of alive nodes (head included) when the session was entered.
        temp_dir: the ``temp_dir`` we passed to Ray (None: Ray's default, ``$RAY_TMPDIR/ray`` or ``/tmp/ray``).
    """

    address: str
    started_by_us: bool
    cpus: float
    gpus: float
    nodes: int
    temp_dir: str | None = None


class ClusterUnreachable(ValueError):
    """Nothing answers at a Ray address (:func:`check_reachable`): ``address`` as resolved (``host:port``),
    ``why`` (e.g. ``Connection refused``). A command whose cluster answered earlier words it as a cluster that
    stopped answering, not as a mistyped address."""

    def __init__(self, message: str, address: str, why: str):
        super().__init__(message)
        self.address, self.why = address, why


def joins_a_cluster(address: str | None) -> bool:
    """Whether a session given ``address`` joins an existing cluster: an address, or ``RAY_ADDRESS`` set when
    there is none; else it starts the embedded local Ray (or uses the one this process's caller started)."""
    return address is not None or bool(os.environ.get("RAY_ADDRESS"))


def joined_line(info: RayInfo, address: str | None) -> str | None:
    """The console line that names the cluster a session joined (``address`` as given: a flag, ``"auto"`` or None
    for ``RAY_ADDRESS``), e.g. ``ray: joined the cluster at 10.0.0.5:6379 (from --address auto): 3 nodes, 48
    CPUs, 0 GPUs``; None for the embedded Ray this process started. ``--address auto`` joins whatever Ray runs on
    this machine (another process's embedded one included), and no line had said which. None too where nothing
    was asked to be joined (no ``address``, no ``RAY_ADDRESS``): a Ray this process's caller started is used as
    it is."""
    if info.started_by_us or not joins_a_cluster(address):
        return None
    src = " (from RAY_ADDRESS)" if address is None else (" (from --address auto)" if address.strip() == "auto" else "")
    return (f"ray: joined the cluster at {info.address}{src}: {info.nodes} node{'s' * (info.nodes != 1)}, "
            f"{info.cpus:g} CPUs, {info.gpus:g} GPUs")


def _ray_owner(gcs_address: str) -> tuple[int, str] | None:
    """The process that started the local Ray whose GCS is at ``gcs_address``, as ``(pid, command line)``: the
    parent of the raylet that names that GCS (``--gcs-address=``), read from ``/proc``. None where it cannot be
    told (no ``/proc``, no such raylet here), and for a Ray that ``ray start`` started (the raylet's parent is
    ``ray start --block``, or, once ``ray start`` has returned, init or a subreaper: not the process its session is
    named after): that cluster outlives any driver."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    import shlex

    want = f"--gcs-address={gcs_address}"
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            if not argv or not argv[0].endswith(b"raylet") or want.encode() not in argv:
                continue
            # the session is named after the process that started it (session_<date>_<time>_<pid>)
            named = next((a for a in argv if a.startswith(b"--session-name=")), b"").rsplit(b"_", 1)[-1]
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            words = [w.decode(errors="replace") for w in (proc / str(ppid) / "cmdline").read_bytes().split(b"\0") if w]
        except (OSError, ValueError, IndexError):
            continue
        cmd = shlex.join(words)
        # a raylet whose starter has gone (adopted by init or a subreaper) belongs to a `ray start` that returned
        if ppid <= 1 or (named.isdigit() and int(named) != ppid) or re.search(r"\bray\b\S*\s+start\b", cmd):
            return None
        return ppid, cmd
    return None


def auto_joined_owner(address: str | None) -> str | None:
    """Why ``--address auto`` is the wrong address, when it resolved to a Ray that no ``ray start`` registered on
    this machine but that another process started for itself (Ray's fallback: any Ray running here, found by its
    processes; :func:`_ray_owner`), e.g. another ``loopscale run``'s embedded Ray: that Ray stops when its process
    ends, and the runs of the command that joined it with it. None otherwise (another address, ``RAY_ADDRESS``
    set, a registered cluster, a Ray whose starter cannot be told)."""
    if address is None or address.strip() != "auto" or os.environ.get("RAY_ADDRESS"):
        return None
    from ray._private.services import find_bootstrap_address

    found = auto_address()
    if found is not None and find_bootstrap_address(None) == found:  # the cluster `ray start` registered here
        return None
    owner = _ray_owner(found) if found else None
    if owner is None or owner[0] == os.getpid():
        return None
    pid, cmd = owner
    cmd = cmd if len(cmd) <= 120 else cmd[:117] + "..."
    return (f"--address auto found no cluster that `ray start` registered on this machine and joined the Ray that "
            f"process {pid} (`{cmd}`) started for itself: this command's trials run in it and stop when that "
            "process ends; for a cluster of its own, start one with `ray start --head` and join it (or leave "
            "--address out for this command's own embedded Ray)")  # fmt: skip


def validate_address(address: str | None) -> str | None:
    """Check a Ray address before anything starts.

    Args:
        address: None (embedded local Ray, or ``RAY_ADDRESS`` if set), ``"auto"``, ``"host:port"`` or
            ``"ray://host:port"``.

    Returns:
        The address, stripped (None stays None; an empty string becomes None).

    Raises:
        ValueError: naming ``address`` and the valid forms when it is none of them.
    """
    if address is None:
        return None
    a = address.strip()
    if a == "":
        return None
    if a == "auto":
        return a
    rest = a[len("ray://") :] if a.startswith("ray://") else a
    m = _HOST_PORT.match(rest)
    if m is None or not (0 < int(m.group("port")) < 65536):
        raise ValueError(
            f"address={address!r} is not a Ray address; use 'auto' (a cluster started on this machine with "
            "`ray start --head`), 'host:port' (e.g. '10.0.0.5:6379') or 'ray://host:port' (Ray Client, e.g. "
            "'ray://head:10001'), or leave it unset for the embedded local Ray"
        )
    return a


#: Seconds a TCP connection to a cluster's ``host:port`` may take before :func:`check_reachable` gives up.
REACH_TIMEOUT_S = 5.0


def _embedded_hint(address: str | None) -> str:
    """How to get the embedded local Ray instead of joining: drop ``--address``, or, when the address came from the
    environment (``address`` None), unset ``RAY_ADDRESS``: "leave --address unset" misled whoever had not given
    one."""
    if address is None and os.environ.get("RAY_ADDRESS"):
        return "unset RAY_ADDRESS (set in this environment; --address was not given)"
    return "leave --address unset"


def auto_address() -> str | None:
    """The ``host:port`` that ``ray.init(address="auto")`` would join (Ray's own resolution: the cluster ``ray
    start`` last started on this machine, else any Ray running here, RAY_ADDRESS first), or None when there is
    none."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address("auto")
    except ConnectionError:
        return None


def check_reachable(
    address: str | None, timeout: float = REACH_TIMEOUT_S, *, hint: str = "leave --address unset"
) -> None:
    """Check that something accepts a TCP connection at a ``host:port`` (or ``ray://host:port``) address, answers
    HTTP/2's connection preface as a gRPC server does (:func:`_grpc_answer`; a web server there, e.g. a dashboard
    port given by mistake, is refused) and, at a GCS address (not ``ray://``), does not answer a Ray GCS call with
    UNIMPLEMENTED (:func:`_gcs_answer`: another gRPC service, or an HTTP/2 proxy's 404), without starting Ray:
    joining an address nobody serves, or a service other than Ray, made ``ray.init`` wait for ever (Ray 2.60
    retries the GCS every 30 s and says so only in its log) or fail only after the run had written its folder.
    ``"auto"`` is first resolved as ``ray.init`` resolves it (the cluster that ``ray start`` last started on this
    machine, else any running there): with none, a run failed only once Ray started, after it had written its
    folder's spec and logs, and its dry run said nothing. ``None`` and anything :func:`validate_address` refuses
    pass unchecked.

    Raises:
        ValueError: nothing answers there (connection refused, unknown host, or no answer within ``timeout`` s),
            a service that is not gRPC answers there, a gRPC or HTTP/2 service without Ray's GCS answers there,
            or ``"auto"`` finds no Ray cluster on this machine; nothing answering is :class:`ClusterUnreachable` (a
            ValueError). :class:`TokenAuthRefused` (a ValueError): the
            cluster there uses token authentication and this process is not in token mode.
    """
    if address is None:
        return
    a = address.strip()
    if a == "auto":
        a = auto_address() or ""
        if not a:
            raise ValueError(  # as ray_session words Ray's own error for it
                "address='auto': Could not find any running Ray instance; start one with `ray start --head`, give "
                f"its host:port, or {hint} for the embedded local Ray"
            ) from None
    m = _HOST_PORT.match(a[len("ray://") :] if a.startswith("ray://") else a)
    if m is None:
        return
    import socket

    host, port = m.group("host").strip("[]"), int(m.group("port"))
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            answer = _grpc_answer(conn, timeout)
    except OSError as e:
        why = f"no answer within {timeout:g} s" if isinstance(e, TimeoutError) else (e.strerror or str(e) or type(e).__name__)
        raise ClusterUnreachable(
            f"no Ray cluster answers at {a} ({why}); check the address (the head's `ray start --head` prints it), "
            f"that the cluster is running and that its port is open to this machine, or {hint} for the embedded "
            "local Ray",
            a,
            why,
        ) from None
    if answer is None and not a.startswith("ray://"):
        answer = _gcs_answer(f"{m.group('host')}:{port}", timeout)
    if answer is not None:
        raise ValueError(
            f"something listens at {a}, but not a Ray head: {answer}, where a Ray head's port (its GCS, 6379 by "
            "default, or the Ray Client's for ray://) answers in gRPC; check the port (the head's `ray start "
            f"--head` prints the address; 8265 is the dashboard's, for `ray job submit`), or {hint} for the "
            "embedded local Ray"
        )


#: A method of a Ray head's GCS (``ray/core/generated/gcs_service.proto``, served since Ray 2.7) that
#: :func:`_gcs_answer` calls: the GCS answers it (or refuses the caller's credentials); another gRPC service, or an
#: HTTP/2 server that is not gRPC (its 404), answers UNIMPLEMENTED.
_GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"


def _gcs_answer(host_port: str, timeout: float) -> str | None:
    """What a gRPC (or other HTTP/2) service at ``host_port`` that is not a Ray GCS answered to a call of
    :data:`_GCS_METHOD` with an empty request, as a short phrase; None when it answered as a GCS does (a reply, or
    a refusal of the caller's token: UNAUTHENTICATED, PERMISSION_DENIED), under ``RAY_USE_TLS``, and whenever the
    answer cannot tell (no answer within ``timeout`` s, a dropped connection: the join then says what Ray finds).
    Only UNIMPLEMENTED (gRPC's word for "no such method", also what an HTTP/2 404 becomes) gives a phrase; an
    UNAUTHENTICATED while this process is not in token mode (``RAY_AUTH_MODE`` other than ``token``) raises
    :class:`TokenAuthRefused`, as ``ray.init`` would refuse it later. Found by
    trying it: an HTTP/2 proxy's 404 passed the connection-preface check, and ``ray.init`` then failed 20 s later,
    after the run had written its folder."""
    if os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true", "yes"):
        return None
    import grpc

    channel = grpc.insecure_channel(host_port)
    try:
        channel.unary_unary(_GCS_METHOD)(b"", timeout=timeout)
    except grpc.RpcError as e:
        code = e.code() if callable(getattr(e, "code", None)) else None
        if code == grpc.StatusCode.UNAUTHENTICATED and os.environ.get("RAY_AUTH_MODE", "").strip().lower() != "token":
            # a GCS with token authentication, which this process cannot join: ray.init refused it only after the
            # run had written its folder (this probe sends no token, so with RAY_AUTH_MODE=token Ray decides)
            raise TokenAuthRefused(
                f"address={host_port!r}: the Ray cluster there uses token authentication (its GCS answered "
                "UNAUTHENTICATED), which this process is not set up for (RAY_AUTH_MODE "
                f"{os.environ.get('RAY_AUTH_MODE') or 'unset'}){_TOKEN_HINT}"
            ) from None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            said = (e.details() or "").strip() if callable(getattr(e, "details", None)) else ""
            return f"it answered gRPC's UNIMPLEMENTED to the Ray GCS call {_GCS_METHOD[1:]}" + (
                f" ({said})" if said else ""
            )
    finally:
        channel.close()
    return None


#: HTTP/2's client connection preface (RFC 9113 Sec. 3.4) and an empty SETTINGS frame: a gRPC server, as a Ray
#: head's GCS and Ray Client ports are, answers it with a SETTINGS frame of its own (frame type 0x4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0])


def _grpc_answer(conn, timeout: float) -> str | None:
    """What a non-gRPC service at the other end of the connected socket ``conn`` answered to HTTP/2's connection
    preface, as a short phrase (also: it closed or reset the connection, or said nothing within ``timeout`` s);
    None when it answered as gRPC (a SETTINGS frame), and under Ray over TLS (``RAY_USE_TLS``), whose port expects
    a TLS handshake first. Joining such a service made ``ray.init`` wait for ever (Ray retries its GCS
    every ~40 s and says so only in its log), with a signal held until Ray started."""
    if os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true", "yes"):
        return None
    data, ended = b"", None
    try:
        conn.settimeout(timeout)
        conn.sendall(_H2_PREFACE)
        while len(data) < 9:
            chunk = conn.recv(9 - len(data))
            if not chunk:
                ended = "it closed the connection without answering"
                break
            data += chunk
    except TimeoutError:  # a gRPC server answers at once (a Ray head in milliseconds)
        ended = f"it did not answer within {timeout:g} s"
    except OSError as e:  # e.g. reset: what came before it decides
        ended = f"it closed the connection without answering ({e.strerror or type(e).__name__})"
    if not data:
        return ended
    if len(data) >= 4 and data[3] == 0x4:
        return None
    if data.startswith(b"HTTP/") or data[:1] in (b"<", b"{"):
        return "it answered in HTTP/1 (a web server)"
    return f"it answered {data!r}"


def _validate_local_options(
    num_cpus: int | None, num_gpus: int | None, temp_dir: str | None, *, flags: bool = False
) -> None:
    """Check the embedded Ray's options; ``flags``: name them as the command line does (``--num-gpus 0``, not
    ``num_gpus=0``), for :meth:`loopscale.cluster.options.ClusterOptions.validate`."""
    gpus, tmp, addr = ("--num-gpus ", "--ray-temp-dir ", "--address") if flags else ("num_gpus=", "temp_dir=", "address=")
    if num_cpus is not None:
        if isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1:
            raise ValueError(f"num_cpus={num_cpus!r} must be a whole number >= 1 (e.g. num_cpus=2), or None")
    if num_gpus is not None:
        if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
            raise ValueError(f"num_gpus={num_gpus!r} must be a whole number >= 0 (e.g. num_gpus=0), or None")
        if num_gpus > 0:
            import torch  # lazy: only when GPUs are asked for

            if not torch.cuda.is_available():
                raise ValueError(
                    f"{gpus}{num_gpus} but torch.cuda.is_available() is False on this machine; "
                    f"use {gpus}0 (or leave it unset) here, or give {addr} to join a cluster with GPUs"
                )
            have = torch.cuda.device_count()
            if num_gpus > have:
                raise ValueError(
                    f"{gpus}{num_gpus} but this machine has {have} CUDA device(s); use <= {have}"
                )
    if temp_dir is not None and not os.path.isabs(temp_dir):
        raise ValueError(
            f"{tmp}{temp_dir!r} must be an absolute path (Ray requires it), e.g. {os.path.abspath(temp_dir)!r}"
        )
    if temp_dir is not None and len(temp_dir) > 60:
        # Ray's raylet/plasma UNIX socket paths live under it; AF_UNIX paths are limited to 107 bytes.
        raise ValueError(
            f"{tmp}{temp_dir!r} is {len(temp_dir)} characters; Ray puts UNIX sockets under it, whose "
            "paths are limited to 107 bytes: use a short absolute path (<= 60 characters), e.g. '/tmp/lsray'"
        )
    if temp_dir is not None:  # Ray creates it (and its session folders) when it starts: said before anything is written
        from loopscale.cluster.options import nearest_existing

        p = nearest_existing(Path(temp_dir))
        if not p.is_dir():
            raise ValueError(f"{tmp}{temp_dir!r} cannot be created: {p} is a file; give a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(f"{tmp}{temp_dir!r}: {p} is not writable (Ray writes its session files there); "
                             "give a directory you can write, e.g. '/tmp/lsray'")


@contextlib.contextmanager
def driver_thread_env(threads: int = 1) -> Iterator[None]:
    """Set ``OMP/OPENBLAS/MKL_NUM_THREADS`` for this (driver) process while the block runs, when unset.

    Variables the user already set are left alone. On exit the previous values are restored.
    Call it *after* Ray has started its processes: raylet and workers inherit the environment at
    start, and a preset ``OMP_NUM_THREADS`` would stop Ray from giving each trial as many threads as
    CPUs it holds (``ray/_private/utils.py: set_omp_num_threads_if_unset``). Libraries read these at
    load time (OpenBLAS) or on first use (torch intra-op pool), so it helps code that loads them later.
    """
    if threads < 1:
        raise ValueError(f"threads={threads} must be >= 1")
    saved = {k: os.environ.get(k) for k in DRIVER_THREAD_VARS}
    for k, v in saved.items():
        if v is None:
            os.environ[k] = str(threads)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


def _cluster_info(
    ray, started_by_us: bool, temp_dir: str | None, fallback_address: str | None = None
) -> RayInfo:
    res = ray.cluster_resources()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    try:
        ctx = ray.get_runtime_context()
        address = ctx.gcs_address
    except Exception:  # Ray Client contexts have no gcs_address
        address = fallback_address or os.environ.get("RAY_ADDRESS", "")
    return RayInfo(
        address=str(address),
        started_by_us=started_by_us,
        cpus=float(res.get("CPU", 0.0)),
        gpus=float(res.get("GPU", 0.0)),
        nodes=len(nodes),
        temp_dir=temp_dir,
    )


_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
_AUTH_DEFAULT_NOTICE = "Token authentication is enabled for this Ray cluster"


@contextlib.contextmanager
def warning_as_info(
    logger: str,
    match: Callable[[str], bool],
    level: int = logging.INFO,
    levels: tuple[int, ...] = (logging.WARNING,),
    one_line: bool = False,
) -> Iterator[None]:
    """While the block runs, WARNING records (or records of ``levels``) of ``logger`` whose message satisfies
    ``match`` are logged at INFO (so the console, which shows warnings, leaves them in ``OUT/logs/ray.log``), and
    kept only when ``level`` lets INFO through. A record with an exception gives ``match`` its message, a newline
    and ``<ExceptionType>: <exception>``; demoted, such a record keeps that exception on its message line, without
    the traceback (whose last line the console would show); with ``one_line`` a demoted message that spans lines
    (a traceback inside the message) keeps its first and last line, on one. Every other record of that logger is unchanged. For Ray's notices that
    are expected in loopscale's use and say nothing to act on."""

    def text(record: logging.LogRecord) -> str:
        exc = record.exc_info[1] if record.exc_info else None
        return record.getMessage() + (f"\n{type(exc).__name__}: {exc}" if exc is not None else "")

    def demote(record: logging.LogRecord) -> bool:
        if record.levelno in levels and match(text(record)):
            record.levelno, record.levelname = logging.INFO, "INFO"
            if record.exc_info:  # one line: a traceback's last line would still reach the console as a notice
                exc = record.exc_info[1]
                record.msg, record.args = f"{record.getMessage()} ({type(exc).__name__}: {exc})", None
                record.exc_info, record.exc_text = None, None
            lines = [ln for ln in record.getMessage().splitlines() if ln.strip()] if one_line else []
            if len(lines) > 1:
                record.msg, record.args = f"{lines[0]} ... {lines[-1]}", None
            return level <= logging.INFO
        return True

    with logger_filter(logger, demote):
        yield


@contextlib.contextmanager
def logger_filter(logger: str, fn: Callable[[logging.LogRecord], bool]) -> Iterator[None]:
    """While the block runs, ``fn`` filters the records of ``logger`` (the logging module's filter protocol: it may
    change a record, and False drops it)."""
    log = logging.getLogger(logger)
    log.addFilter(fn)
    try:
        yield
    finally:
        log.removeFilter(fn)


def _auth_default_notice_as_info(level: int = logging.INFO):
    """Ray's "token auth enabled by default" notice at INFO, shown only when ``level`` (the session's
    ``logging_level``) lets INFO through: it is Ray's default, which we keep. Other auth messages are unchanged."""
    return warning_as_info(_AUTH_LOGGER, lambda m: m.startswith(_AUTH_DEFAULT_NOTICE), level)


@contextlib.contextmanager
def ray_session(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    temp_dir: str | None = None,
    include_dashboard: bool = False,
    log_to_driver: bool = True,
    logging_level: int = logging.INFO,
) -> Iterator[RayInfo]:
    """Connect to Ray for the duration of a ``with`` block; shut down only what we started.

    Args:
        address: None → embedded local Ray (or ``RAY_ADDRESS`` if the environment sets it);
            ``"auto"`` / ``"host:port"`` / ``"ray://host:port"`` → join an existing cluster.
        num_cpus: CPUs the embedded Ray offers (default: all cores). Not allowed with an address.
        num_gpus: GPUs the embedded Ray offers (default: what Ray detects). Not allowed with an address.
        temp_dir: absolute, short path for Ray's session directory (``_temp_dir``); default (Ray's own)
            ``$RAY_TMPDIR/ray``, else ``<system temp>/ray``. Only for the embedded Ray.
        include_dashboard: start the dashboard (needs ``ray[default]``; binds to loopback).
        log_to_driver: forward worker stdout/stderr to this process.
        logging_level: level of Ray's own loggers in this process (``ray.init(logging_level=...)``); e.g.
            ``logging.WARNING`` keeps "Started a local Ray instance" and other start-up lines off the console.

    Yields:
        RayInfo: address, started_by_us, cpus, gpus, nodes.

    If Ray is already initialised in this process, it is used as it is: the resource options are still
    validated but not applied, and nothing is shut down on exit.

    Raises:
        ValueError: bad address; ``num_cpus``/``num_gpus``/``temp_dir`` given together with an address;
            ``num_gpus > 0`` where ``torch.cuda.is_available()`` is False; relative ``temp_dir``.
            All checked before Ray starts. Also an address (or ``RAY_ADDRESS``) where nothing answers
            (:func:`check_reachable`, before Ray starts) and ``"auto"`` with no cluster on this machine.
    """
    address = validate_address(address)
    joining = joins_a_cluster(address)
    if joining:
        given = [n for n, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("temp_dir", temp_dir)) if v]
        if given:
            raise ValueError(
                f"{', '.join(given)} cannot be set when joining an existing cluster "
                f"(address={address or os.environ.get('RAY_ADDRESS')!r}): the cluster's nodes decide their "
                f"resources; drop them, or {_embedded_hint(address)} to start the embedded local Ray"
            )
        check_reachable(address if address is not None else os.environ.get("RAY_ADDRESS"), hint=_embedded_hint(address))
    else:
        _validate_local_options(num_cpus, num_gpus, temp_dir)

    import ray  # lazy: importing loopscale.cluster must not import ray

    if ray.is_initialized():
        with driver_thread_env():
            yield _cluster_info(ray, started_by_us=False, temp_dir=None)
        return

    kwargs: dict = {
        "include_dashboard": include_dashboard,
        "log_to_driver": log_to_driver,
        "logging_level": logging_level,
    }
    stopped: list[bool] = []
    main = threading.current_thread() is threading.main_thread()
    term_before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        with _sigint_deferred(stopped), _sigterm_deferred(stopped, ray):
            _ray_init(ray, address, joining, kwargs, num_cpus, num_gpus, temp_dir, logging_level)
    except BaseException as e:
        # an error (or a second Ctrl-C) part-way through ray.init: stop what it had started now
        ray.shutdown()
        _restore_sigterm(term_before)
        if stopped and not isinstance(e, KeyboardInterrupt):
            # a held Ctrl-C or SIGTERM came first: a SIGTERM to the process group (SLURM's scancel, a pod deleted)
            # also stopped the Ray processes ray.init had started, and it then failed ("The current node timed out
            # during startup"): that is the interruption, not an error of its own; Ray's words are kept in one line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            sys.stderr.write(f"WARNING: Ray did not start after the interruption: {first}\n")
            raise KeyboardInterrupt from None
        raise
    if main:  # ray.init made SIGTERM a bare sys.exit(15): the driver stopped without saving Tune's state
        signal.signal(signal.SIGTERM, sigterm_as_ctrl_c)
    _SHUTTING_DOWN.clear()  # a head started now is watched after a SIGTERM until this session shuts it down
    body_raised = True  # (not sys.exc_info(): inside a generator it also sees an exception the caller is handling)
    try:
        if stopped:  # Ctrl-C or SIGTERM during ray.init, held until Ray was up: stop now, through the shutdown below
            raise KeyboardInterrupt
        info = _cluster_info(ray, started_by_us=not joining, temp_dir=temp_dir, fallback_address=address)
        watch_stop = threading.Event()
        if joining and not info.address.startswith("ray://"):  # said when the cluster stops answering
            threading.Thread(target=watch_joined_gcs, args=(info.address, watch_stop), name="loopscale-gcs-watch",
                             daemon=True).start()  # fmt: skip
        try:
            with driver_thread_env():
                yield info
        finally:
            watch_stop.set()
        body_raised = False
    finally:
        # Joining: ray.shutdown() only disconnects this driver; the cluster keeps running.
        # Started by us: it stops every process we started (so a SIGTERM's head watch stands down first).
        _SHUTTING_DOWN.append(True)
        try:
            held = _shutdown_holding_signals(ray)
        finally:
            _restore_sigterm(term_before)
        if held and not body_raised:  # a stop asked for while Ray shut down, once it has
            raise KeyboardInterrupt


def _shutdown_holding_signals(ray) -> bool:
    """``ray.shutdown()`` with a Ctrl-C or SIGTERM held until it has ended; returns whether one came (the caller
    then stops as a Ctrl-C stops). Without this, measured with Ray 2.60: a Ctrl-C during the second or so that Ray's shutdown takes
    raised its KeyboardInterrupt inside a garbage-collection callback, where Python discards it (the command went
    on and exited 0), and a SIGTERM killed the driver without its line, as the core worker's shutdown sets SIGTERM
    back to the default action while the head's processes are stopped. The SIGTERM handler is put back before they
    are (``Node.kill_all_processes``, Ray's private API: without it, only the short part before stays open). A
    second Ctrl-C is not held: it raises ``KeyboardInterrupt`` at once, for a shutdown that hangs (one who presses
    twice will not wait). In a thread other than the main one (no signal handlers there) it is a plain
    ``ray.shutdown()``."""
    if threading.current_thread() is not threading.main_thread():
        ray.shutdown()
        return False
    seen: list[int] = []

    def hold(signum, frame) -> None:
        if signum == signal.SIGTERM:
            _SIGTERM_SEEN.append(True)
        again = signum == signal.SIGINT and signal.SIGINT in seen
        seen.append(signum)
        if again:
            raise KeyboardInterrupt

    node = getattr(getattr(ray, "_private", None) and ray._private.worker, "_global_node", None)
    kill = getattr(node, "kill_all_processes", None)
    if callable(kill):

        def kill_holding_sigterm(*args, **kwargs):
            signal.signal(signal.SIGTERM, hold)  # the core worker's shutdown reset it
            return kill(*args, **kwargs)

        node.kill_all_processes = kill_holding_sigterm
    int_before = signal.getsignal(signal.SIGINT)
    held_int = callable(int_before)  # a SIGINT ignored (a background job) or handled outside Python stays so
    if held_int:
        signal.signal(signal.SIGINT, hold)
    signal.signal(signal.SIGTERM, hold)
    try:
        ray.shutdown()
    finally:
        if held_int:
            signal.signal(signal.SIGINT, int_before)
    return bool(seen)


_SIGTERM_SEEN: list[bool] = []


def sigterm_as_ctrl_c(signum, frame) -> None:
    """SIGTERM handler of a driver inside :func:`ray_session`: a SIGTERM (SLURM at the time limit or on preemption,
    Kubernetes deleting a pod, ``kill``) stops the driver as a Ctrl-C does, so Tune saves its state and ``--resume``
    continues. It calls the SIGINT handler in place (Tune's while an experiment runs, else Python's, which raises
    KeyboardInterrupt); with SIGINT ignored or not a Python handler it raises KeyboardInterrupt.
    :func:`stopped_by_sigterm` tells afterwards."""
    first = not _SIGTERM_SEEN
    _SIGTERM_SEEN.append(True)
    if first:
        threading.Thread(target=_exit_if_ray_head_lost, name="loopscale-sigterm-watch", daemon=True).start()
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


HEAD_LOST_WATCH_S = 30.0
"""Seconds after a SIGTERM during which :func:`_exit_if_ray_head_lost` watches the Ray head this driver started
(a raylet takes a few seconds to exit on SIGTERM)."""

_SHUTTING_DOWN: list[bool] = []  # set by ray_session before its ray.shutdown(), which stops the head itself


def _ray_head_lost() -> bool:
    """True when the local Ray head this driver started has lost its GCS server or raylet (exited); False when it
    has not, when this driver joined a cluster, or when Ray's node is not known."""
    try:
        import ray._private.worker as worker
        from ray._private import ray_constants

        node = worker._global_node
        if node is None or not getattr(node, "head", False):
            return False
        for kind in (ray_constants.PROCESS_TYPE_GCS_SERVER, ray_constants.PROCESS_TYPE_RAYLET):
            if any(info.process.poll() is not None for info in node.all_processes.get(kind) or []):
                return True
    except Exception:  # Ray's private API moved: the driver shuts down as usual
        return False
    return False


GCS_WATCH_PERIOD_S = 5.0
"""How often a driver that joined a cluster checks that the cluster's GCS port still accepts a connection
(:func:`watch_joined_gcs`)."""


def _gcs_port_answers(address: str, timeout: float = 2.0) -> bool:
    """Whether a TCP connection to ``address`` (``host:port``) is accepted within ``timeout`` s (an address that
    does not parse counts as answering: nothing is said of it)."""
    import socket

    m = _HOST_PORT.match(address)
    if m is None:
        return True
    try:
        with socket.create_connection((m.group("host").strip("[]"), int(m.group("port"))), timeout=timeout):
            return True
    except OSError:
        return False


def watch_joined_gcs(address: str, stop: threading.Event, *, period: float = GCS_WATCH_PERIOD_S, misses: int = 2,
                     probe: Callable[[], bool] | None = None) -> None:  # fmt: skip
    """While ``stop`` is not set, check every ``period`` s that the GCS of the cluster this driver joined
    (``address``, ``host:port``) accepts a connection (``probe``; default :func:`_gcs_port_answers`). After
    ``misses`` failed checks in a row, say once (:data:`say_stop`, else stderr) that it stopped answering and what
    follows; said again when it answers again. A head lost mid-sweep had ended the command 60 s later with exit 1
    and no line (Ray's core gives up on its GCS then and says why only in the head's own log); this driver does
    not exit itself, as Ray reconnects to a GCS that comes back within that minute."""
    probe = probe if probe is not None else (lambda: _gcs_port_answers(address))
    lost, said = 0, False
    while not stop.wait(period):  # (set by ray_session before its ray.shutdown())
        if probe():
            if said:
                _say(f"ray: the cluster at {address} answers again")
            lost, said = 0, False
            continue
        lost += 1
        if lost >= misses and not said:
            _say(f"warning: the Ray cluster at {address} stopped answering (no connection for {lost * period:g} s); "
                 "if it is not back within about a minute, Ray ends this command (exit 1): the runs finished so "
                 "far are recorded, and the same command with --resume, once a cluster is there, goes on without "
                 "training them again")  # fmt: skip
            said = True


def _say(msg: str) -> None:
    """One line on the command's error stream (:data:`say_stop`), else on stderr."""
    if say_stop is not None:
        say_stop(msg)
    else:
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()


def _exit_if_ray_head_lost(watch_s: float | None = None) -> None:
    """After a SIGTERM: when the same signal also stopped the Ray head this driver started (sent to the whole
    process group: SLURM's ``scancel``, ``kill -- -PGID``), the driver cannot stop Tune's trials in order: every
    call to the dead head blocks, and after 60 s Ray's core ends the process with exit 1 and no message. Tune saves
    its state at once when the signal arrives, so once the head is seen gone (watched for ``watch_s``,
    :data:`HEAD_LOST_WATCH_S`, and not by this driver's own ``ray.shutdown()``) the driver says so and exits with
    :data:`~loopscale.cluster.options.EXIT_TERMINATED`; ``--resume`` continues from that state."""
    import time

    from loopscale.cluster.options import EXIT_TERMINATED

    end = time.monotonic() + (HEAD_LOST_WATCH_S if watch_s is None else watch_s)
    while time.monotonic() < end:
        time.sleep(1.0)
        if _SHUTTING_DOWN:
            return
        if _ray_head_lost():
            time.sleep(1.0)  # Tune's last state write, begun when the signal arrived, has long ended
            if not _SHUTTING_DOWN:
                break
            return
    else:
        return
    msg = (
        "interrupted (SIGTERM): Ray's own processes were stopped by the same signal (sent to the whole process "
        "group), so the run could not end in order; the state Tune saved is kept, rerun the same command with "
        "--resume to continue"
    )
    try:
        _say(msg)
    finally:
        os._exit(EXIT_TERMINATED)


say_stop: Callable[[str], None] | None = None
"""Where :func:`_exit_if_ray_head_lost` says its line (a command's console sets it to its error stream, as fd 2 is
captured into the command's log while it runs); None: ``sys.stderr``."""


def stopped_by_sigterm() -> bool:
    """True once this process received a SIGTERM inside :func:`ray_session` or :func:`sigterm_interrupts`."""
    return bool(_SIGTERM_SEEN)


def _sigterm_raises(signum, frame) -> None:
    """SIGTERM handler of a command outside a Ray session: a KeyboardInterrupt, remembered as a SIGTERM."""
    _SIGTERM_SEEN.append(True)
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts():
    """While the block runs, a SIGTERM stops this process as a Ctrl-C does (a ``KeyboardInterrupt``, and
    :func:`stopped_by_sigterm` True), so a command without Ray (``train``, ``fit``, ``design``, a pipeline between
    its Ray sessions) ends with its "interrupted (SIGTERM)" line and exit code instead of dying without a word.
    Only where SIGTERM has Python's default action and only in the main thread; :func:`ray_session` puts its own
    handler in place for its block and this one back after it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    before = signal.signal(signal.SIGTERM, _sigterm_raises)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _restore_sigterm(handler) -> None:
    """Put back the SIGTERM handler from before the session (one set outside Python, None: the default action)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL if handler is None else handler)


def no_node_fits(cpus: float, gpus: float = 0.0) -> str | None:
    """Why no trial can start, when no alive node of the connected Ray cluster has ``cpus`` CPUs and ``gpus`` GPUs
    (one trial's resources: Tune places a trial on one node); None when one has. Needs an initialised Ray.

    Tune does not refuse such a trial: it waits for a node that fits (an autoscaling cluster adds one; any other
    waits for ever, with one notice a minute), so a command says this up front."""
    import ray

    nodes = [n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")]
    if any(n.get("CPU", 0.0) >= cpus and n.get("GPU", 0.0) >= gpus for n in nodes):
        return None
    have = ", ".join(f"{n.get('CPU', 0.0):g} CPUs / {n.get('GPU', 0.0):g} GPUs" for n in nodes) or "none alive"
    return (
        f"each trial asks for {cpus:g} CPUs and {gpus:g} GPUs on one node (the spec's resources), and no node of "
        f"this Ray cluster has them ({len(nodes)} node(s): {have}); Tune waits for a node that has them: an "
        "autoscaling cluster adds one, any other waits for ever (stop with Ctrl-C, then add such a node and rerun "
        "with --resume, or lower resources.cpus / resources.gpus in the spec and rerun with another --out folder: "
        "a folder keeps the spec it was started with, resources included)"
    )


#: How long :func:`nodes_without_storage` waits for every node's answer (s).
STORAGE_CHECK_TIMEOUT_S = 60.0


def _sees_path(path: str) -> bool:
    """Whether ``path`` exists on the node this runs on (a Ray task of :func:`nodes_without_storage`)."""
    return os.path.exists(path)


def nodes_without_storage(storage: str, timeout: float | None = None) -> tuple[list[str], list[str]]:
    """Which alive nodes of the connected Ray cluster that can run a trial (a CPU or more: a head started with
    ``--num-cpus 0`` trains nothing) cannot see a local ``storage`` (a path or ``file://`` URI): ``(blind,
    unasked)``, each node as ``"HOST (node NODE_ID[:8])"``; ``blind`` answered that the path is not there,
    ``unasked`` did not answer within ``timeout`` s (default :data:`STORAGE_CHECK_TIMEOUT_S`; or its task failed,
    e.g. a node without this loopscale).
    ([], []) for a bucket URI (``s3://`` ..., reached from every node) and for fewer than two such nodes. Needs an
    initialised Ray.

    A marker file is written into ``storage`` here (at the path as given, symlinks not resolved: the path the trials
    write to) and one zero-CPU task per node, pinned there (``NodeAffinitySchedulingStrategy``), asks whether that
    file exists at the same path. A trial trains on any node and writes its checkpoints and result there
    (``loopscale.cluster.storage``); on a node without that path (no shared mount) they land on its own disk, where
    this command never reads them: its runs count as never finished and a trial restored on another node starts
    over.

    Raises:
        OSError: the marker cannot be written into ``storage``.
    """
    from loopscale.cluster.storage import is_local_uri

    if not is_local_uri(storage):
        return [], []
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive") and (n.get("Resources") or {}).get("CPU", 0.0) >= 1.0]
    if len(nodes) < 2:
        return [], []
    where = Path(os.path.abspath(storage[len("file://") :] if storage.startswith("file://") else storage))
    where.mkdir(parents=True, exist_ok=True)
    marker = where / f".loopscale-node-check-{uuid.uuid4().hex[:12]}"
    marker.write_text("written by the driver: every node of the cluster must see this file at this path\n")
    try:
        task = ray.remote(num_cpus=0, max_retries=0)(_sees_path)
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(marker)) for n in nodes]  # fmt: skip
        wait_s = STORAGE_CHECK_TIMEOUT_S if timeout is None else timeout
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        answers: list[bool | None] = []
        for ref in refs:
            try:
                answers.append(bool(ray.get(ref)) if ref in ready else None)
            except Exception:  # the task failed there (the node died, or cannot import this loopscale): not known
                answers.append(None)
    finally:
        marker.unlink(missing_ok=True)
    name = [f"{n.get('NodeManagerAddress', '?')} (node {str(n['NodeID'])[:8]})" for n in nodes]
    return ([w for w, ok in zip(name, answers, strict=True) if ok is False],
            [w for w, ok in zip(name, answers, strict=True) if ok is None])  # fmt: skip


class StorageNotShared(ValueError):
    """A local ``--storage`` that some node of the cluster cannot see (:func:`refuse_storage_some_nodes_miss`);
    ``resumable`` False: the same command with ``--resume`` is refused the same way (``status`` says so)."""

    resumable = False


def refuse_storage_some_nodes_miss(storage: str, info: RayInfo) -> str | None:
    """Refuse a local ``storage`` that some node of the connected multi-node cluster able to run a trial cannot see
    (:func:`nodes_without_storage`), before any trial starts. ``info``: the session's :class:`RayInfo`; a cluster
    of one node at its start (the embedded Ray) is not asked. Returns a warning naming the nodes that did not
    answer in time (whether they see it is not known), else None.

    Raises:
        StorageNotShared: (a ValueError) naming the storage, the nodes that cannot see it, and what to give instead.
    """
    if info.nodes < 2:
        return None
    blind, unasked = nodes_without_storage(storage)
    if blind:
        raise StorageNotShared(
            f"--storage {storage} is a path that {len(blind)} of this Ray cluster's nodes cannot see "
            f"({', '.join(blind)}): a trial that trains there would write its checkpoints and result on that node's "
            "own disk, where this command never reads them (its run counted as never finished, and trained again); "
            "give storage every node reaches: a bucket (s3://..., gs://...) or a shared mount at the same path on "
            "every node"
        )
    if unasked:
        return (f"--storage {storage}: {len(unasked)} node(s) of this Ray cluster did not answer whether they see it "
                f"within {STORAGE_CHECK_TIMEOUT_S:g} s ({', '.join(unasked)}); a trial there writes to that node's "
                "own disk unless the path is shared")  # fmt: skip
    return None


def session_notes(info: RayInfo, address: str | None, storage: str, cpus: float, gpus: float) -> Iterator[str]:
    """What a Tune command (``tune-lr``, the grid) says on entering its Ray session, before any trial, each line
    yielded as soon as it is known (the storage check can take a minute): the cluster it joined
    (:func:`joined_line`), then as ``warning: ...`` lines the process whose own Ray ``--address auto`` joined
    (:func:`auto_joined_owner`), nodes that did not say whether they see a local ``storage``
    (:func:`refuse_storage_some_nodes_miss`) and a trial (``cpus`` CPUs, ``gpus`` GPUs) that no node fits
    (:func:`no_node_fits`).

    Raises:
        StorageNotShared: a local ``storage`` that some node cannot see (after the joined line).
    """
    if joined := joined_line(info, address):
        yield joined
    if borrowed := auto_joined_owner(address):
        yield f"warning: {borrowed}"
    if unasked := refuse_storage_some_nodes_miss(storage, info):
        yield f"warning: {unasked}"
    if why := no_node_fits(cpus, gpus):
        yield f"warning: {why}"


#: What a driver joining a cluster with token authentication (Ray 2.60's default) needs, said when it is refused.
_TOKEN_HINT = (
    "; a cluster with token authentication (Ray 2.60's default) needs RAY_AUTH_MODE=token in this environment too, "
    "and the cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN)"
)


class TokenAuthRefused(ValueError):
    """A Ray cluster with token authentication refused this process's token (or its lack of one).

    ``resume_env`` holds what the environment of the command that continues needs (``RAY_AUTH_MODE=token``):
    ``loopscale status`` puts it in front of its ``--resume`` line."""

    resume_env = {"RAY_AUTH_MODE": "token"}


def _ray_init(ray, address, joining, kwargs, num_cpus, num_gpus, temp_dir, logging_level) -> None:
    """``ray.init`` for :func:`ray_session`: Ray Client, joining, or the embedded local Ray."""
    where = f"address={address or os.environ.get('RAY_ADDRESS')!r}"
    if address is not None and address.startswith("ray://"):
        # Ray Client forwards extra ray.init arguments to the server's ray.init; pass none.
        try:
            ray.init(address=address)
        except ConnectionError as e:  # e.g. "ray client connection timeout", after 30 s: one line, not a traceback
            raise ValueError(
                f"{where}: the Ray Client did not connect ({e}); check that the head runs a Ray Client server "
                f"there (port 10001 by default){_TOKEN_HINT}"
            ) from None
    elif joining:
        with _auth_default_notice_as_info(logging_level):  # joining a token-auth cluster says it too
            try:
                ray.init(address=address, **kwargs)
            except ConnectionError as e:  # 'auto' with no cluster on this machine: Ray's own words, one line
                first = str(e).split(". ")[0].strip() or type(e).__name__
                if "InvalidAuthToken" in str(e.__cause__ or ""):  # a cluster is there: it wants the token
                    raise TokenAuthRefused(
                        f"{where}: {first}: the cluster refused this process's Ray auth token{_TOKEN_HINT}"
                    ) from None
                raise ValueError(
                    f"{where}: {first}; start one with `ray start "
                    f"--head`, give its host:port, or {_embedded_hint(address)} for the embedded local Ray"
                ) from None
    else:
        if temp_dir is not None:
            os.makedirs(temp_dir, exist_ok=True)
            kwargs["_temp_dir"] = temp_dir
        with _auth_default_notice_as_info(logging_level):
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, **kwargs)


@contextlib.contextmanager
def _sigterm_deferred(stopped: list, ray) -> Iterator[None]:
    """Hold a SIGTERM while the block (``ray.init``) runs, as :func:`_sigint_deferred` holds a Ctrl-C: the first
    is recorded in ``stopped`` (and for :func:`stopped_by_sigterm`) and acknowledged on stderr, and the session
    stops as soon as Ray is up, as after a Ctrl-C; a second raises KeyboardInterrupt at once. ``ray.init`` sets
    its own SIGTERM handler part-way (``sys.exit(15)``: the driver stopped silently with exit 15, whatever the
    command was doing); it is not set while the block runs (``ray._private.utils.set_sigterm_handler`` is a no-op
    there; without that function in this Ray, Ray's handler is set as before). Outside the main thread, or with
    SIGTERM ignored or handled outside Python, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN or previous is None:
        yield
        return

    def hold(signum, frame):
        _SIGTERM_SEEN.append(True)
        if stopped:
            raise KeyboardInterrupt
        stopped.append(True)
        sys.stderr.write("WARNING: SIGTERM: stopping as soon as Ray has started (a second SIGTERM stops at once)\n")
        sys.stderr.flush()

    utils = getattr(getattr(ray, "_private", None), "utils", None)
    ray_sets = getattr(utils, "set_sigterm_handler", None)
    signal.signal(signal.SIGTERM, hold)
    if ray_sets is not None:
        utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if ray_sets is not None:
            utils.set_sigterm_handler = ray_sets
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _sigint_deferred(stopped: list) -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) while the block runs: the first one is recorded in ``stopped`` and the block goes on;
    a second one raises KeyboardInterrupt at once. ``ray.init`` runs under it: a KeyboardInterrupt raised inside
    the core worker's constructor left a half-built Ray that crashed the process at exit (SIGSEGV, not exit 130).
    The first Ctrl-C is acknowledged on stderr. Outside the main thread (where handlers cannot be set), with SIGINT
    ignored, or with a handler installed outside Python, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN or previous is None:  # Ctrl-C ignored (nohup, `&`), or a handler set outside
        yield  # Python that could not be put back: left as it is
        return

    def hold(signum, frame):
        if stopped:
            raise KeyboardInterrupt
        stopped.append(True)
        sys.stderr.write("WARNING: Ctrl-C: stopping as soon as Ray has started (Ctrl-C again stops at once)\n")
        sys.stderr.flush()

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
