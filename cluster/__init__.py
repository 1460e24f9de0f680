"""How loopscale reaches Ray and storage: connect, storage URIs, shared CLI options, cluster recipes.

Public names (imported lazily: ``import loopscale.cluster`` imports neither ray nor pyarrow)::

    ray_session, RayInfo, validate_address        # loopscale.cluster.connect
    resolve_uri, join, write_bytes_atomic, read_bytes, exists, listdir, makedirs, remove,
    sync_dir, fetch_dir                           # loopscale.cluster.storage
    ClusterOptions, AddressOpt, TuneAddressOpt, NumCpusOpt, NumGpusOpt, RayTempDirOpt, StorageOpt   # .options
    recipe_path                                   # path of a file in loopscale/cluster/recipes
    simulated_cluster, SimCluster                 # loopscale.cluster.simulate (multi-node Ray on one machine)

This package imports nothing else of loopscale's.
"""

from __future__ import annotations

import importlib

__all__ = [
    "ray_session",
    "RayInfo",
    "validate_address",
    "resolve_uri",
    "join",
    "write_bytes_atomic",
    "read_bytes",
    "exists",
    "listdir",
    "makedirs",
    "remove",
    "sync_dir",
    "fetch_dir",
    "ClusterOptions",
    "AddressOpt",
    "TuneAddressOpt",
    "NumCpusOpt",
    "NumGpusOpt",
    "RayTempDirOpt",
    "StorageOpt",
    "recipe_path",
    "simulated_cluster",
    "SimCluster",
]

_WHERE = {
    "ray_session": "connect",
    "RayInfo": "connect",
    "validate_address": "connect",
    "resolve_uri": "storage",
    "join": "storage",
    "write_bytes_atomic": "storage",
    "read_bytes": "storage",
    "exists": "storage",
    "listdir": "storage",
    "makedirs": "storage",
    "remove": "storage",
    "sync_dir": "storage",
    "fetch_dir": "storage",
    "ClusterOptions": "options",
    "AddressOpt": "options",
    "TuneAddressOpt": "options",
    "NumCpusOpt": "options",
    "NumGpusOpt": "options",
    "RayTempDirOpt": "options",
    "StorageOpt": "options",
    "simulated_cluster": "simulate",
    "SimCluster": "simulate",
}


def recipe_path(name: str) -> str:
    """Absolute path of a shipped cluster recipe, e.g. ``recipe_path("slurm-sbatch.sh")``.

    Raises:
        ValueError: no such recipe (lists the ones that exist).
    """
    import os

    d = os.path.join(os.path.dirname(__file__), "recipes")
    have = sorted(os.listdir(d)) if os.path.isdir(d) else []
    if name not in have:
        raise ValueError(f"no recipe {name!r}; available: {', '.join(have) or '(none)'}")
    return os.path.join(d, name)


def __getattr__(name: str):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'loopscale.cluster' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"loopscale.cluster.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
