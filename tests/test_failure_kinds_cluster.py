"""Failure kind 9 (README "Reliability" table; ray-project/ray #46814): "restored from checkpoint" but training restarts at step 0.

Head with 0 CPU + 2 workers x 1 CPU (``ray.cluster_utils.Cluster``), one 20-step trial checkpointing every
step, its node removed after step 7, driven through the real ``loopscale.sweep.run_sweep``.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("ray")

STEPS = 20
KILL_AFTER = 7
SPEC = {
    "name": "elastic9",
    "model": {"preset": "cpu", "seq_len": 32},
    "r": [2],
    "sizes": [16],
    "tokens": [STEPS * 256],
    "training": {"batch_tokens": 256, "eval_tokens": 1024, "checkpoint_every_steps": 1},
    "lr": {"fixed": 0.02},
    "resources": {"cpus": 1},
    "max_failures": 2,
}


def training_rows(tap, run_id: str) -> list[dict]:
    """Per-step reports (not the final run_done report) of one run, in arrival order."""
    return [r for r in tap.rows if r["config"]["cells"][0]["run_id"] == run_id and not r.get("run_done")]


def test_restored_trial_does_not_restart_at_step_zero(sweep_on_cluster, tmp_path):
    """Node lost after step 7 ⇒ steps 1..20 contiguous, restart at last checkpoint + 1 on the other node,
    loss there ≈ the uninterrupted run's (not ≈ ln 256), same final loss, one ok row."""
    import pyarrow.parquet as pq

    from loopscale.cluster.simulate import simulated_cluster
    from loopscale.model.train import train_run
    from loopscale.sweep.spec import parse_spec

    spec = parse_spec(SPEC)
    (cell,) = spec.cells()
    # the uninterrupted reference, in this process (same RunConfig, same thread count)
    ref_events: list[dict] = []
    ref = train_run(cell.run_config(checkpoint_dir=str(tmp_path / "ref_ckpt")), callback=ref_events.append)
    ref_loss = {e["step"]: e["train_loss"] for e in ref_events}
    assert ref.status == "ok" and sorted(ref_loss) == list(range(1, STEPS + 1))

    removed: dict = {}
    with simulated_cluster(n_workers=2, cpus_per_worker=1) as sim:

        def remove_its_node(row):
            removed["worker"] = row["worker"]
            sim.remove_worker(row["worker"])

        tap, path = sweep_on_cluster(
            sim,
            spec,
            tmp_path / "out",
            pause_when=lambda row: row.get("step") == KILL_AFTER and not row.get("run_done"),
            on_pause=remove_its_node,
        )

    rows = training_rows(tap, cell.run_id)
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, STEPS + 1)), f"reported steps not contiguous: {steps}"
    assert removed["worker"] in (0, 1)
    before = [r for r in rows if r["step"] <= KILL_AFTER]
    after = [r for r in rows if r["step"] > KILL_AFTER]
    assert {r["worker"] for r in before} == {removed["worker"]}
    assert {r["worker"] for r in after} == {1 - removed["worker"]}, "trial did not move to the surviving node"
    # Tune restarted the trial (first report since its restore). Tune's training_iteration there may lag by
    # one (7, not 8): the step-7 checkpoint was reported but not yet registered when the node died, so Tune
    # restores its iteration count from checkpoint 6, while the trainer resumes from the newest checkpoint
    # on storage (step 7), which is what this test pins.
    assert after[0]["iterations_since_restore"] == 1
    assert after[0]["training_iteration"] in (KILL_AFTER, KILL_AFTER + 1)
    first = after[0]
    assert first["step"] == KILL_AFTER + 1  # = last checkpoint (step 7) + 1
    assert abs(first["train_loss"] - before[-1]["train_loss"]) < 0.5
    assert first["train_loss"] < math.log(256) - 1.0  # a restart from scratch would sit near ln 256 = 5.55
    assert first["train_loss"] == pytest.approx(ref_loss[KILL_AFTER + 1], abs=1e-5)
    t = pq.read_table(path).to_pylist()
    assert len(t) == 1 and t[0]["status"] == "ok" and t[0]["run_id"] == cell.run_id
    assert t[0]["final_val_loss"] == pytest.approx(ref.final_val_loss, abs=1e-6)
