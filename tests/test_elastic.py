"""Elasticity on a simulated multi-node cluster, through the real ``loopscale.sweep.run_sweep``.

Head with 0 CPU (it runs no trials) + worker nodes with 1 CPU each (``ray.cluster_utils.Cluster``); the
driver runs the sweep in a background thread and nodes are removed/added from the main thread (Ray 2.60
cannot add nodes from another thread). Rows come from ``ResultTap``: every Tune result with the simulated
worker node whose raylet ran the reporting process.
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

STEPS = 12
CKPT_EVERY = 2
SPEC = {
    "name": "elastic",
    "model": {"preset": "cpu", "seq_len": 32},
    "r": [1, 2],
    "sizes": [16],
    "tokens": [STEPS * 256],
    "training": {"batch_tokens": 256, "eval_tokens": 1024, "checkpoint_every_steps": CKPT_EVERY},
    "lr": {"fixed": 0.02},
    "resources": {"cpus": 1},
    "max_failures": 2,
}


def _rows(tap, run_id: str) -> list[dict]:
    return [r for r in tap.rows if r["config"]["cells"][0]["run_id"] == run_id and not r.get("run_done")]


def _ok_rows(path) -> dict[str, str]:
    import pyarrow.parquet as pq

    return {r["run_id"]: r["status"] for r in pq.read_table(path).to_pylist()}


def test_node_loss_trial_resumes_on_other_node(sweep_on_cluster, tmp_path):
    """Remove the node running a trial at step 6 ⇒ it restarts on the other node from checkpoint 6 (next
    report: step 8, first iteration since restore) and the sweep ends with one ok row per cell."""
    from loopscale.cluster.simulate import simulated_cluster
    from loopscale.sweep.spec import parse_spec

    spec = parse_spec(SPEC)
    ids = [c.run_id for c in spec.cells()]
    removed: dict = {}
    with simulated_cluster(n_workers=2, cpus_per_worker=1) as sim:

        def remove_its_node(row):
            removed.update(worker=row["worker"], run_id=row["config"]["cells"][0]["run_id"])
            sim.remove_worker(row["worker"])

        tap, path = sweep_on_cluster(
            sim,
            spec,
            tmp_path / "out",
            pause_when=lambda row: row.get("step") == 6 and not row.get("run_done"),
            on_pause=remove_its_node,
        )
    assert _ok_rows(path) == {i: "ok" for i in ids}
    rows = _rows(tap, removed["run_id"])
    assert [r["step"] for r in rows] == list(range(CKPT_EVERY, STEPS + 1, CKPT_EVERY))
    before = [r for r in rows if r["step"] <= 6]
    after = [r for r in rows if r["step"] > 6]
    assert {r["worker"] for r in before} == {removed["worker"]}
    assert {r["worker"] for r in after} == {1 - removed["worker"]}
    assert after[0]["iterations_since_restore"] == 1 and after[0]["step"] == 6 + CKPT_EVERY
    # the other cell was not disturbed: it never changed node and was never restored
    (other,) = [i for i in ids if i != removed["run_id"]]
    orows = _rows(tap, other)
    assert len({r["worker"] for r in orows}) == 1
    assert [r["iterations_since_restore"] for r in orows] == list(range(1, len(orows) + 1))


def test_added_node_takes_pending_trials(sweep_on_cluster, tmp_path):
    """One 1-CPU worker, two cells: while the first trial runs (the second pending), add a node ⇒ the pending
    trial runs on the new node, and both cells end ok.

    Actor reuse is off here: with it on, Tune may hand the pending trial the first trial's cached actor
    when that one finishes before the new node's actor has started (seen here: the tiny first trial ends in
    about a second, a new actor takes several to import torch), which is correct behaviour but not the
    scheduling this test pins."""
    from loopscale.cluster.simulate import simulated_cluster
    from loopscale.sweep.spec import parse_spec

    spec = parse_spec(SPEC)
    ids = [c.run_id for c in spec.cells()]
    seen: dict = {}
    with simulated_cluster(n_workers=1, cpus_per_worker=1) as sim:

        def add_a_node(row):
            import ray

            seen["first"] = row["config"]["cells"][0]["run_id"]
            seen["cpus_before"] = ray.cluster_resources().get("CPU")
            seen["new"] = sim.add_worker()
            seen["cpus_after"] = ray.cluster_resources().get("CPU")

        tap, path = sweep_on_cluster(
            sim,
            spec,
            tmp_path / "out",
            pause_when=lambda row: not row.get("run_done"),
            on_pause=add_a_node,
            reuse_actors=False,
        )
    assert (seen["cpus_before"], seen["cpus_after"], seen["new"]) == (1.0, 2.0, 1)
    assert _ok_rows(path) == {i: "ok" for i in ids}
    (second,) = [i for i in ids if i != seen["first"]]
    assert {r["worker"] for r in _rows(tap, seen["first"])} == {0}
    assert {r["worker"] for r in _rows(tap, second)} == {1}, (
        "the pending trial did not start on the added node"
    )


def test_a_local_storage_some_node_cannot_see_is_refused_before_any_trial(tmp_path, monkeypatch):
    """A multi-node cluster with a ``--storage`` path that a node lacks (no shared mount): that node's trials wrote
    their checkpoints and results on its own disk, where the driver never read them (their runs counted as never
    finished and trained again), and nothing said so. Every node that can run a trial is asked (a marker file, a
    zero-CPU task pinned to each); here every node shares this machine's disk, so a node that does not see it is
    made by the check itself answering no there. The grid then refuses before any trial, naming the node, and
    `status` offers no `--resume` that would be refused the same way. The head (0 CPUs: it trains nothing) is not
    asked; a node that does not answer is named in a warning, not refused."""
    import ray

    from loopscale.cluster import connect
    from loopscale.cluster.simulate import simulated_cluster
    from loopscale.sweep import run_sweep
    from loopscale.sweep.spec import parse_spec

    store = tmp_path / "storage"
    with simulated_cluster(n_workers=2, cpus_per_worker=1):
        assert connect.nodes_without_storage(str(store)) == ([], [])  # both workers see this machine's disk
        assert connect.nodes_without_storage(f"file://{store}") == ([], [])
        three = connect.RayInfo(address="", started_by_us=False, cpus=2.0, gpus=0.0, nodes=3)
        assert connect.refuse_storage_some_nodes_miss(str(store), three) is None  # nothing to refuse or say
        w0, w1 = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU") == 1.0]

        def sees_unless_on(path, _no=w0["NodeID"]):
            import os

            import ray

            return os.path.exists(path) and ray.get_runtime_context().get_node_id() != _no

        monkeypatch.setattr(connect, "_sees_path", sees_unless_on)
        who = f"{w0['NodeManagerAddress']} (node {w0['NodeID'][:8]})"
        assert connect.nodes_without_storage(str(store)) == ([who], [])
        assert connect.nodes_without_storage("s3://a-bucket/loopscale") == ([], [])  # a bucket: every node reaches it
        spec = parse_spec({**SPEC, "storage_path": str(store)})
        with pytest.raises(connect.StorageNotShared) as e:
            run_sweep(spec, tmp_path / "out", quiet=True)
        # a node that does not answer in time: not known, said
        def mute_on_w1(path, _mute=w1["NodeID"]):
            import os
            import time

            import ray

            if ray.get_runtime_context().get_node_id() == _mute:
                time.sleep(30)
            return os.path.exists(path)

        monkeypatch.setattr(connect, "_sees_path", mute_on_w1)
        monkeypatch.setattr(connect, "STORAGE_CHECK_TIMEOUT_S", 3.0)
        said = connect.refuse_storage_some_nodes_miss(str(store), three)
    assert str(e.value).startswith(f"--storage {store} is a path that 1 of this Ray cluster's nodes cannot see "
                                   f"({who}): a trial that trains there would write")  # fmt: skip
    assert "a shared mount at the same path on every node" in str(e.value) and e.value.resumable is False
    # no trial started (no experiment of Tune's, no run's checkpoint), no marker left behind
    assert [str(p.relative_to(store)) for p in sorted(store.rglob("*")) if p.is_file()] == []
    assert said.startswith(f"--storage {store}: 1 node(s) of this Ray cluster did not answer whether they see it "
                           f"within 3 s ({w1['NodeManagerAddress']} (node {w1['NodeID'][:8]}))")  # fmt: skip
