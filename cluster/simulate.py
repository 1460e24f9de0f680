"""A multi-node Ray cluster simulated on one machine (``ray.cluster_utils.Cluster``), for elasticity tests.

Each simulated node is a separate raylet with its own logical resources; all share this machine's
filesystem (so a checkpoint written on one node is visible on another, as with NFS on a real cluster).

Ray 2.60 facts this relies on (``docs/ray_tune.md`` §4):

* ``Cluster.add_node`` must run in the main thread (it installs a SIGTERM handler; from another thread it
  raises ``ValueError: signal only works in main thread``). Run ``Tuner.fit()`` / ``run_sweep`` in a
  background thread and add or remove nodes from the main thread.
* Removing a node kills its raylet and workers; Tune sees ``ActorDiedError`` and, with
  ``FailureConfig(max_failures >= 1)``, restarts the trial where resources are free.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["SimCluster", "simulated_cluster", "ResultTap"]

MiB = 1024 * 1024


@dataclass
class SimCluster:
    """Handle on a simulated cluster.

    Attributes:
        cluster: the ``ray.cluster_utils.Cluster``.
        workers: worker ``Node`` objects by index (a removed worker becomes None; indices never shift).
    """

    cluster: object
    workers: list = field(default_factory=list)
    cpus_per_worker: int = 1
    object_store_bytes: int = 100 * MiB

    def add_worker(self, num_cpus: int | None = None) -> int:
        """Start one more worker node (main thread only); returns its index."""
        node = self.cluster.add_node(
            num_cpus=self.cpus_per_worker if num_cpus is None else num_cpus,
            object_store_memory=self.object_store_bytes,
        )
        self.cluster.wait_for_nodes()
        self.workers.append(node)
        return len(self.workers) - 1

    def remove_worker(self, index: int) -> None:
        """Take worker node ``index`` away as a machine loss would: its raylet and, at the same moment,
        every process that raylet started (trial actors included) are killed with SIGKILL.

        ``Cluster.remove_node`` alone kills the raylet but leaves its worker processes to notice on their
        own; meanwhile an orphaned trial actor keeps training and reporting to the driver (seen here), which
        no real node loss allows.

        Raises:
            ValueError: no live worker with that index.
        """
        import signal

        if not (0 <= index < len(self.workers)) or self.workers[index] is None:
            raise ValueError(f"no live worker node with index {index}; live: {self.live_workers()}")
        node = self.workers[index]
        raylet = {pid for pid, i in self._raylet_pids().items() if i == index}
        doomed = _descendants(raylet)
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers[index] = None

    def live_workers(self) -> list[int]:
        """Indices of worker nodes that were not removed."""
        return [i for i, n in enumerate(self.workers) if n is not None]

    def _raylet_pids(self) -> dict[int, int]:
        out = {}
        for i, node in enumerate(self.workers):
            if node is None:
                continue
            procs = node.all_processes.get("raylet") or []
            if procs:
                out[procs[0].process.pid] = i
        return out

    def worker_of_pid(self, pid: int) -> int | None:
        """Index of the worker node whose raylet started process ``pid`` (a Ray worker), or None.

        Walks the parent chain through ``/proc`` (Linux), so the process must be alive.
        """
        raylets = self._raylet_pids()
        p = int(pid)
        for _ in range(8):
            if p in raylets:
                return raylets[p]
            try:
                with open(f"/proc/{p}/stat") as f:
                    stat = f.read()
            except OSError:
                return None
            # fields after the ')' that closes the command name: state, ppid, ...
            p = int(stat.rsplit(")", 1)[1].split()[1])
            if p <= 1:
                return None
        return None


def _parent_pids() -> dict[int, int]:
    """{pid: parent pid} of every process visible in /proc (Linux)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                out[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def _descendants(roots: set[int]) -> list[int]:
    """Every live descendant process of ``roots`` (not the roots themselves)."""
    parents = _parent_pids()
    found: list[int] = []
    frontier = set(roots)
    while frontier:
        kids = {pid for pid, pp in parents.items() if pp in frontier and pid not in found}
        found.extend(sorted(kids))
        frontier = kids
    return found


@contextlib.contextmanager
def simulated_cluster(
    n_workers: int = 2,
    *,
    cpus_per_worker: int = 1,
    head_cpus: int = 0,
    object_store_mb: int = 100,
    connect: bool = True,
) -> Iterator[SimCluster]:
    """Start a head (``head_cpus`` logical CPUs, default 0: it runs no trials) and ``n_workers`` worker nodes.

    With ``connect`` the calling process joins it (``ray.init(address=...)``), so code that calls
    ``loopscale.cluster.connect.ray_session`` reuses it. Everything is shut down on exit.

    Raises:
        RuntimeError: Ray is already initialised in this process.
        ValueError: n_workers < 0, cpus_per_worker < 1, object_store_mb < 80 (Ray's minimum is 75 MiB).
    """
    if n_workers < 0 or cpus_per_worker < 1 or head_cpus < 0:
        raise ValueError(
            f"n_workers={n_workers} must be >= 0, cpus_per_worker={cpus_per_worker} >= 1, head_cpus={head_cpus} >= 0"
        )
    if object_store_mb < 80:
        raise ValueError(
            f"object_store_mb={object_store_mb} must be >= 80 (Ray's minimum object store is 75 MiB)"
        )
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise RuntimeError("Ray is already initialised in this process; call ray.shutdown() first")
    store = object_store_mb * MiB
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": head_cpus, "object_store_memory": store, "include_dashboard": False},
    )
    sim = SimCluster(cluster=cluster, cpus_per_worker=cpus_per_worker, object_store_bytes=store)
    try:
        for _ in range(n_workers):
            sim.workers.append(cluster.add_node(num_cpus=cpus_per_worker, object_store_memory=store))
        cluster.wait_for_nodes()
        if connect:
            ray.init(address=cluster.address, log_to_driver=False)
        yield sim
    finally:
        if connect and ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


class ResultTap:
    """Driver-side record of every Tune result, with the simulated worker node that produced it.

    Wrap a Tune ``Callback`` class with :meth:`wrap` (the wrapped class calls :meth:`observe` first, then the
    original ``on_trial_result``). With ``pause_when`` the first result that satisfies it blocks the Tune
    driver loop until :meth:`resume` is called (or ``pause_timeout_s`` passes). A function trainable
    reports synchronously (Ray 2.60: ``synchronous_result_reporting=True``), so the trial stays blocked in
    ``tune.report`` at exactly that result while the test removes or adds nodes from the main thread.

    Rows: ``{"trial_id", "config", "pid", "worker", **result}`` (result keys as reported).
    """

    def __init__(self, sim: SimCluster, pause_when=None, pause_timeout_s: float = 180.0):
        import threading

        self.sim = sim
        self.rows: list[dict] = []
        self.pause_when = pause_when
        self.pause_timeout_s = pause_timeout_s
        self.paused = threading.Event()
        self._resume = threading.Event()
        self.paused_row: dict | None = None

    def observe(self, trial, result: dict) -> None:
        """Record one result (called in the Tune driver thread); pause if ``pause_when`` first matches."""
        pid = result.get("pid")
        row = {
            **result,
            "trial_id": trial.trial_id,
            "config": trial.config,
            "pid": pid,
            "worker": self.sim.worker_of_pid(pid) if pid else None,
        }
        self.rows.append(row)
        if self.pause_when is not None and self.paused_row is None and self.pause_when(row):
            self.paused_row = row
            self.paused.set()
            self._resume.wait(self.pause_timeout_s)

    def resume(self) -> None:
        """Let the paused driver loop continue."""
        self._resume.set()

    def wrap(self, callback_cls):
        """A subclass of the Tune ``Callback`` class ``callback_cls`` that feeds this tap.

        Tune pickles its callbacks with the experiment state; the subclass therefore holds only a key into
        a module-level registry (looked up at call time), never the tap with its locks and cluster handle.
        """
        key = id(self)
        _TAPS[key] = self

        class Tapped(callback_cls):
            def on_trial_result(self, iteration, trials, trial, result, **info):
                from loopscale.cluster import simulate

                tap = simulate._TAPS.get(key)
                if tap is not None:
                    tap.observe(trial, result)
                return super().on_trial_result(iteration, trials, trial, result, **info)

        Tapped.__name__ = f"Tapped{callback_cls.__name__}"
        return Tapped

    def close(self) -> None:
        """Drop this tap from the registry (wrapped callbacks then stop feeding it)."""
        _TAPS.pop(id(self), None)
        self.resume()


#: live taps by key (see ResultTap.wrap)
_TAPS: dict[int, ResultTap] = {}
