"""Results store: fixed schema with units, atomic idempotent writes, one row per run id."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loopscale.sweep.presets import preset_spec
from loopscale.sweep.store import (
    CURVES_SCHEMA,
    RUNS_SCHEMA,
    SCHEMA_VERSION,
    ResultsStore,
    curve_rows,
    run_record,
    to_table,
)


def _result(loss, status="ok", D=2048):
    return {
        "status": status,
        "final_val_loss": loss,
        "best_val_loss": loss,
        "N_once": 10,
        "N_rec": 20,
        "N_unique": 30,
        "flops_per_token": 1000,
        "D": D,
        "C": 1000.0 * D,
        "tokens_per_s": 5.0,
        "mfu": None if loss is None else 0.1,
        "wall_s": 1.0,
        "epochs": 0.01,
        "num_threads": 1,
        "versions": {"torch": "x"},
        "curve": [
            {"step": 1, "tokens": 256, "train_loss": 5.0, "val_loss": None, "lr": 0.01},
            {"step": 8, "tokens": 2048, "train_loss": 4.0, "val_loss": loss, "lr": 0.001},
        ],
    }


def test_schema_has_units_and_version():
    assert RUNS_SCHEMA.metadata[b"loopscale.schema_version"] == SCHEMA_VERSION.encode()
    for name, unit in [
        ("D", "tokens"),
        ("C", "FLOPs"),
        ("final_val_loss", "nats/token"),
        ("wall_s", "s"),
        ("N_once", "parameters"),
        ("flops_per_token", "FLOPs/token"),
    ]:
        assert RUNS_SCHEMA.field(name).metadata[b"unit"] == unit.encode()
    assert RUNS_SCHEMA.field("final_val_loss").type == pa.float64()
    assert RUNS_SCHEMA.field("final_val_loss").nullable
    assert CURVES_SCHEMA.field("val_loss").metadata[b"unit"] == b"nats/token"


def test_to_table_rejects_unknown_keys_and_missing_required():
    with pytest.raises(ValueError, match="not in the runs schema"):
        to_table([{"run_id": "a", "variant": "baseline", "r": 1, "status": "ok", "loss": 1.0}], RUNS_SCHEMA)
    with pytest.raises(ValueError, match="'status' must not be null"):
        to_table([{"run_id": "a", "variant": "baseline", "r": 1}], RUNS_SCHEMA)


def test_write_consolidate_idempotent_one_row_per_run(tmp_path):
    cells = preset_spec("smoke").cells()[:3]
    store = ResultsStore(tmp_path)
    for i, c in enumerate(cells):
        rec = run_record(
            c, _result(3.0 + i), trial_id=f"t{i}", host="h", started_at=0.0, finished_at=10.0 + i
        )
        store.write_run(rec, curve_rows(c.run_id, _result(3.0 + i)["curve"]))
    p = store.consolidate()
    t = pq.read_table(p)
    assert t.schema.equals(RUNS_SCHEMA, check_metadata=False)
    assert t.num_rows == 3 and sorted(t.column("run_id").to_pylist()) == sorted(c.run_id for c in cells)
    # the same run written again (a retried trial): still one row, the newer one wins
    rec = run_record(cells[0], _result(2.5), trial_id="t9", finished_at=99.0)
    store.write_run(rec, curve_rows(cells[0].run_id, _result(2.5)["curve"]))
    store.consolidate()
    store.consolidate()
    t = store.runs().to_pylist()
    assert len(t) == 3
    row = next(r for r in t if r["run_id"] == cells[0].run_id)
    assert row["final_val_loss"] == 2.5 and row["trial_id"] == "t9"
    assert row["finished_at"] == datetime.fromtimestamp(99.0, tz=UTC)
    assert store.curves().num_rows == 6
    assert store.completed_ids() == {c.run_id for c in cells}
    # no temporary files are left behind
    assert not [f for f in tmp_path.rglob(".*.tmp")]
    store.forget({cells[1].run_id})
    assert {r["run_id"] for r in store.runs().to_pylist()} == {cells[0].run_id, cells[2].run_id}


def test_record_fields_come_from_cell_and_result(tmp_path):
    c = preset_spec("smoke").cells()[5]
    rec = run_record(c, _result(3.3))
    m = c.run.model
    assert (rec.r, rec.d_model, rec.n_prelude, rec.n_recur_block, rec.n_coda) == (
        m.r,
        m.d_model,
        m.n_prelude,
        m.n_recur_block,
        m.n_coda,
    )
    assert rec.lr == c.lr and rec.target_tokens == c.run.tokens
    assert rec.D == 2048 and rec.C == 2048000.0 and rec.final_val_loss == 3.3
    nan = run_record(c, _result(float("nan"), status="diverged"))
    assert nan.final_val_loss is None and nan.status == "diverged"
    assert list(rec.to_row()) == RUNS_SCHEMA.names
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.lr = 1.0


def test_hc_lanes_is_recorded_only_for_runs_with_hyperconnections():
    """Every baseline and trunc_bptt row (r = 1 included) recorded hc_lanes = 2, the config's unused default, so
    `hc_lanes == 2` also picked runs without lanes; `loopscale model info` gives null there. Now so does the row."""
    spec = preset_spec("smoke").model_copy(update={"variants": ["baseline", "trunc_bptt", {"name": "hyperconnect", "hc_lanes": 3}]})
    lanes = {}
    for c in spec.cells():
        lanes.setdefault((c.variant, c.r > 1), set()).add(run_record(c, _result(3.3)).hc_lanes)
    assert lanes == {("baseline", False): {None}, ("baseline", True): {None}, ("trunc_bptt", True): {None},
                     ("hyperconnect", True): {3}}  # fmt: skip


def test_look_only_reads_an_orphan_runs_part_as_run_would(tmp_path):
    """A runs part without its curves part (a crash between the two writes) is moved aside by a real read, so its
    run counts as unfinished (or falls back to its consolidated record). Inside ``look_only`` (the dry run) the part
    was left in place but still read as a record, so the dry run counted a run as recorded that `run` retrains. It
    is now noted, left in place, and read exactly as `run` reads it."""
    from loopscale.sweep.store import look_only

    cells = preset_spec("smoke").cells()[:3]
    store = ResultsStore(tmp_path)
    for i, c in enumerate(cells):
        store.write_run(run_record(c, _result(3.0 + i), finished_at=10.0 + i), curve_rows(c.run_id, _result(3.0)["curve"]))
    store.consolidate()
    # cells[0]: a newer record torn after its runs part (falls back to the consolidated one, loss 3.0)
    store.write_run(run_record(cells[0], _result(2.5), finished_at=50.0), curve_rows(cells[0].run_id, _result(2.5)["curve"]))
    (store.curves_parts / f"{cells[0].run_id}.parquet").unlink()
    # a fourth cell known only from an orphan part: unfinished
    c4 = preset_spec("smoke").cells()[3]
    store.write_run(run_record(c4, _result(3.9), finished_at=60.0), curve_rows(c4.run_id, _result(3.9)["curve"]))
    (store.curves_parts / f"{c4.run_id}.parquet").unlink()
    before = sorted(p.name for p in store.runs_parts.glob("*.parquet"))
    with look_only() as seen:
        looked = store.recorded()
    assert sorted(p.name for p in store.runs_parts.glob("*.parquet")) == before  # nothing moved
    assert len(seen) == 2 and all("would move it aside" in s for s in seen)
    assert set(looked) == {c.run_id for c in cells}
    assert looked[cells[0].run_id]["final_val_loss"] == 3.0
    real = store.recorded()  # the command itself: moves the two orphans aside, then reads the same records
    assert set(real) == set(looked) and real[cells[0].run_id]["final_val_loss"] == 3.0
    assert len(list(store.runs_parts.glob("*.parquet"))) == len(before) - 2


def test_readme_results_schema_names_every_column():
    """The README's "Results schema" listed 37 of runs.parquet's 50 columns (``size``, ``seq_len``, ``optimizer``,
    ``data_seed``, ... were written to every row but named nowhere a reader looks); every column of both tables is
    now named there, and a column added later must be too."""
    from pathlib import Path

    from loopscale.sweep.store import CURVES_SCHEMA, RUNS_SCHEMA

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Results schema") : readme.index("## How the fit works")]
    missing = [f.name for f in (*RUNS_SCHEMA, *CURVES_SCHEMA) if f"`{f.name}`" not in section]
    assert missing == []


def test_a_runs_warnings_are_recorded_as_a_json_list(tmp_path):
    """The trainer's warnings about a run (data repeated, compilation in tokens/s, compile fallen back to eager)
    reached the run's stored result but no column of runs.parquet: a table read alone hid them. They are the
    ``warnings`` column now, a JSON list ([] for none; null for a failed run), and a table written before the column
    existed reads as null there."""
    import json

    from loopscale.sweep.store import failed_record

    cells = preset_spec("smoke").cells()[:3]
    said = ["training data repeated: D = 3.2 epochs of the training split", "torch.compile fell back to eager"]
    recs = [run_record(cells[0], {**_result(3.0), "warnings": said}, finished_at=1.0),
            run_record(cells[1], {**_result(3.1), "warnings": []}, finished_at=2.0),
            failed_record(cells[2], "RuntimeError: boom", finished_at=3.0)]  # fmt: skip
    assert [r.warnings for r in recs] == [json.dumps(said), "[]", None]
    store = ResultsStore(tmp_path / "new")
    for c, rec in zip(cells, recs, strict=True):
        store.write_run(rec, curve_rows(c.run_id, _result(3.0)["curve"]))
    rows = {r["run_id"]: r for r in pq.read_table(store.consolidate()).to_pylist()}
    assert json.loads(rows[cells[0].run_id]["warnings"]) == said and json.loads(rows[cells[1].run_id]["warnings"]) == []
    assert rows[cells[2].run_id]["warnings"] is None
    old = ResultsStore(tmp_path / "old")  # a runs.parquet written before the column: read with null there
    old.runs_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(to_table([recs[0].to_row()], RUNS_SCHEMA).drop_columns(["warnings"]), old.runs_path)
    (row,) = old.runs().to_pylist()
    assert row["warnings"] is None and row["final_val_loss"] == 3.0
