"""Failure kinds, round 2: bad input caught before Ray, total failure never exits 0, torn files never block
recovery. One test per kind, named after it (the README's reliability table lists them with their sources)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from loopscale.model.config import preset_config
from loopscale.model.train import RunConfig, train_run
from loopscale.sweep._seams import COUNT_ENV, FAULT_ENV
from loopscale.sweep.spec import load_spec
from loopscale.sweep.store import (
    CURVES_SCHEMA,
    ResultsStore,
    curve_rows,
    run_record,
    to_table,
    write_table_atomic,
)

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "name": "tiny",
    "model": {"preset": "cpu", "seq_len": 32},
    "r": [1, 2],
    "sizes": [16],
    "tokens": [2048],
    "training": {"batch_tokens": 256, "eval_tokens": 1024, "checkpoint_every_steps": 4},
    "lr": {"fixed": 0.01},
    "resources": {"cpus": 1},
    "max_failures": 2,
}


def _write_spec(path: Path, text_or_dict) -> Path:
    text = text_or_dict if isinstance(text_or_dict, str) else yaml.safe_dump(text_or_dict, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def _cli(*args: str, env: dict | None = None, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``loopscale ARGS`` in a subprocess (Ray's session files under /tmp/lsray_t)."""
    e = dict(os.environ, RAY_TMPDIR="/tmp/lsray_t", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "loopscale.sweep.cli", *args],
        capture_output=True,
        text=True,
        env=e,
        cwd=cwd,
        timeout=600,
    )


# --- kind 4: numbers in YAML scientific notation ---------------------------------------------------------------


def test_yaml_scientific_notation_is_a_number_everywhere(tmp_path):
    """PyYAML (YAML 1.1) reads ``1e-2`` as a string; the spec loader reads every numeric key written in the
    notation people use as a number — floats (1e-2, 4.64e17) and integers written as 2e3 — one rule for the
    whole spec."""
    text = (
        "name: tiny\nmodel: {preset: cpu, seq_len: 3.2e1}\nr: [1, 2]\nsizes: [1.6e1]\ntokens: [2e3, 4.096e3]\n"
        "training: {batch_tokens: 2.56e2, eval_tokens: 1e3, checkpoint_every_steps: 4, weight_decay: 1e-1}\n"
        "lr: {fixed: 1e-2}\n"
        "tune: {lr_min: 1e-4, lr_max: 1E-1, tokens: 2e4, lr_values: [1e-3, 2e-3]}\nresources: {cpus: 1}\n"
    )
    spec = load_spec(_write_spec(tmp_path / "s.yaml", text))
    assert spec.lr == {"fixed": 0.01}
    assert spec.model.seq_len == 32 and spec.sizes == [16] and spec.tokens == [2000, 4096]
    assert spec.training.batch_tokens == 256 and spec.training.eval_tokens == 1000
    assert spec.training.weight_decay == pytest.approx(0.1)
    assert spec.tune.lr_min == pytest.approx(1e-4) and spec.tune.lr_max == pytest.approx(0.1)
    assert spec.tune.tokens == 20000 and spec.tune.lr_values == [1e-3, 2e-3]
    cell = spec.cells()[0]
    assert (
        cell.lr == 0.01 and cell.run.tokens == 2000 and isinstance(cell.run.tokens, int)
    )
    # iso-FLOP budgets and LR tables in the same notation
    budgets = "name: b\nmodel: {preset: cpu, seq_len: 32}\nr: [1, 2]\nbudgets: {4.64e17: [16], 2e12: [16]}\n"
    spec = load_spec(_write_spec(tmp_path / "b.yaml", budgets + "lr: {table: {16: 3e-3}}\n"))
    assert sorted(spec.budgets) == [2e12, 4.64e17]
    assert {c.lr for c in spec.cells()} == {0.003}
    # strings that are not numbers stay strings; plain integers stay integers
    spec = load_spec(_write_spec(tmp_path / "n.yaml", dict(TINY, name="1e")))
    assert spec.name == "1e" and spec.max_failures == 2 and isinstance(spec.max_failures, int)
    # a fractional value where an integer is meant is still refused, naming the key
    with pytest.raises(ValueError, match="tokens"):
        load_spec(_write_spec(tmp_path / "f.yaml", text.replace("2e3, 4.096e3", "2.5e0")))
    # YAML 1.1's base-60 and leading-zero octal integers: data_seed 1:30 was read as 90 without a word, 010 as 8
    with pytest.raises(ValueError, match="data_seed: Input should be a valid integer"):
        load_spec(_write_spec(tmp_path / "s60.yaml", text + "data_seed: 1:30\n"))
    assert load_spec(_write_spec(tmp_path / "o.yaml", text + "data_seed: 010\n")).data_seed == 10
    assert load_spec(_write_spec(tmp_path / "u.yaml", text + "data_seed: 1_000\n")).data_seed == 1000
    # a !!binary value: `name: !!binary aGVsbG8=` was read as the name 'hello'
    with pytest.raises(ValueError, match=r"line \d+: a !!binary value is not a spec value"):
        load_spec(_write_spec(tmp_path / "bin.yaml", text + "data_seed: !!binary aGVsbG8=\n"))


def test_yaml_scientific_notation_from_the_cli(tmp_path):
    """The reported input: ``lr: {fixed: 1e-2}`` is accepted by ``run --dry-run`` (on a grid ``run`` accepts)."""
    grid = dict(TINY, sizes=[16, 32], tokens=["TOK1", "TOK2"])
    text = yaml.safe_dump(grid).replace("0.01", "1e-2").replace("TOK1", "1.024e3").replace("TOK2", "2.048e3")
    spec = _write_spec(tmp_path / "tiny.yaml", text)
    assert "1e-2" in spec.read_text() and "'1.024e3'" not in spec.read_text()
    p = _cli("run", str(spec), "--dry-run", "--json", cwd=tmp_path)  # its default --out runs/tiny: not the repo's
    assert p.returncode == 0, p.stderr
    assert '"runs": 8' in p.stdout and '"refused": null' in p.stdout


# --- kind 8: every run's last step appears twice in curves.parquet ---------------------------------------------


def _curve_run(corpus: str, cache: str, **kw) -> dict:
    cfg = RunConfig(
        model=preset_config("cpu", r=2, d_model=16, seq_len=32),
        corpus=corpus,
        cache_dir=cache,
        batch_tokens=256,
        tokens=8 * 256,
        eval_tokens=256,
        lr=1e-2,
        **kw,
    )
    return train_run(cfg).to_dict()


def test_last_step_appears_once_in_the_curve(trainer_corpus_dir, trainer_cache_dir, tmp_path):
    """The trainer logs every step of a short run and then evaluates the last one: the curve holds one point per
    step, the last with its validation loss; the same after a resume from a mid-run checkpoint and from the final
    one; the store never writes two rows for one (run_id, step)."""
    c, k = str(trainer_corpus_dir), str(trainer_cache_dir)
    res = _curve_run(c, k)
    steps = [pt["step"] for pt in res["curve"]]
    assert steps == list(range(1, 9))
    assert res["curve"][-1]["val_loss"] == pytest.approx(res["final_val_loss"])
    # interrupted at step 4 (checkpoint), then resumed; then resumed again from the final checkpoint
    ck = tmp_path / "ck"
    first = _curve_run(c, k, checkpoint_dir=str(ck), checkpoint_every_steps=4)
    again = _curve_run(c, k, checkpoint_dir=str(ck), checkpoint_every_steps=4)
    assert again["resumed_from_step"] == 8
    for r in (first, again):
        assert [pt["step"] for pt in r["curve"]] == list(range(1, 9))
        assert r["curve"][-1]["val_loss"] == pytest.approx(res["final_val_loss"])
    (ck / "ckpt-00000008.pt").unlink()
    resumed = _curve_run(c, k, checkpoint_dir=str(ck), checkpoint_every_steps=4)
    assert resumed["resumed_from_step"] == 4
    assert [pt["step"] for pt in resumed["curve"]] == list(range(1, 9))
    # the store: a curve listing a step twice (as older results do) becomes one row with the value
    dup = res["curve"] + [{**res["curve"][-1], "val_loss": None}]
    rows = curve_rows("abc", dup)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert rows[-1]["val_loss"] == pytest.approx(res["final_val_loss"])
    # a consolidated curves.parquet written before the fix (last step twice) is repaired on consolidation
    cell = load_spec(_write_spec(tmp_path / "tiny.yaml", TINY)).cells()[0]
    store = ResultsStore(tmp_path / "out")
    store.write_run(run_record(cell, res), [])
    old = [dict(r, run_id=cell.run_id) for r in rows] + [dict(rows[-1], run_id=cell.run_id, val_loss=None)]
    write_table_atomic(to_table(old, CURVES_SCHEMA), store.curves_path)
    store.consolidate()
    got = store.curves().to_pylist()
    assert [r["step"] for r in got] == list(range(1, 9))
    assert got[-1]["val_loss"] == pytest.approx(res["final_val_loss"])


# --- kind 12: the report depends on the locale's codec ---------------------------------------------------------


def test_report_does_not_depend_on_the_locale_codec(tmp_path):
    """``loopscale report DIR`` under a non-UTF-8 locale (``LC_ALL=C``, UTF-8 mode off) writes report.md as
    UTF-8 (it holds "–" and "φ"); a failed write leaves no temporary file behind."""
    run_dir = tmp_path / "run"
    shutil.copytree(ROOT / "docs" / "example_cpu_previous_default", run_dir)
    (run_dir / "report.md").unlink()
    p = _cli(
        "report", str(run_dir), env={"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
    )
    assert p.returncode == 0, p.stderr[-2000:]
    text = (run_dir / "report.md").read_bytes().decode("utf-8")
    assert "φ" in text and "–" in text
    assert not [f.name for f in run_dir.rglob("*") if ".tmp" in f.name]


# --- kinds 3, 7 and 8 through the CLI (one Ray-using test) -----------------------------------------------------


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_relative_storage_and_torn_parts_from_the_cli(tmp_path):
    """Kind 3: ``--storage tune_rel`` (relative) is made absolute against the command's working directory and
    the sweep finishes there. Kind 7: after a finished sweep, a part truncated to 0 bytes (and a torn
    consolidated table and curves part) never blocks the rerun, with or without ``--resume``: unreadable files
    are moved aside with a warning and the runs are re-recorded, every row comes back. Kind 8 end to end: one
    curves row per (run_id, step)."""
    spec = _write_spec(tmp_path / "tiny.yaml", TINY)
    out = tmp_path / "OUT"
    p = _cli("sweep", "tiny.yaml", "--out", "OUT", "--storage", "tune_rel", "--num-cpus", "2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert spec.exists() and any(n.name.startswith("grid_tiny_") for n in (tmp_path / "tune_rel").iterdir())
    assert len(list((tmp_path / "tune_rel" / "checkpoints").iterdir())) == 2
    runs = _rows(out / "runs.parquet")
    assert len(runs) == 2 and {r["status"] for r in runs} == {"ok"}
    curves = _rows(out / "curves.parquet")
    keys = [(r["run_id"], r["step"]) for r in curves]
    assert len(keys) == len(set(keys)) == 16
    last = {r["run_id"]: r["val_loss"] for r in curves if r["step"] == 8}
    assert last == {r["run_id"]: pytest.approx(r["final_val_loss"]) for r in runs}
    # a crash left one runs part at 0 bytes: the rerun completes with every row
    parts = sorted((out / "parts" / "runs").glob("*.parquet"))
    parts[0].write_bytes(b"")
    p = _cli("sweep", "tiny.yaml", "--out", "OUT", "--storage", "tune_rel", "--num-cpus", "2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "moved aside" in p.stderr
    assert sorted(r["run_id"] for r in _rows(out / "runs.parquet")) == sorted(r["run_id"] for r in runs)
    # worse: the consolidated tables and the other run's curves part are torn too; --resume re-records both runs
    (out / "runs.parquet").write_bytes(b"PAR1")
    (out / "curves.parquet").write_bytes(b"")
    (out / "parts" / "curves" / parts[1].name).write_bytes(b"")
    p = _cli(
        "sweep",
        "tiny.yaml",
        "--out",
        "OUT",
        "--resume",
        "--storage",
        "tune_rel",
        "--num-cpus",
        "2",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    again = {r["run_id"]: r["final_val_loss"] for r in _rows(out / "runs.parquet")}
    assert again == {r["run_id"]: pytest.approx(r["final_val_loss"]) for r in runs}
    curves = _rows(out / "curves.parquet")
    assert len({(r["run_id"], r["step"]) for r in curves}) == len(curves) == 16
    assert list((out / "parts" / "runs").glob("*.unreadable-*"))


def test_torn_files_never_block_recovery(trainer_corpus_dir, trainer_cache_dir, tmp_path):
    """Kind 7 without Ray, file by file: a 0-byte or truncated results part, consolidated table, result.json,
    trainer checkpoint, LR table, or analysis.json is moved aside with a warning and read as missing; the work it
    stood for is redone (re-recorded, resumed from the previous checkpoint, rebuilt) instead of failing."""
    from loopscale.cluster.storage import read_json_or_aside, write_text_atomic
    from loopscale.fit.run_report import build_report
    from loopscale.sweep.lr_table import lr_table_present, read_lr_table
    from loopscale.sweep.workspace import RunWorkspace

    c, k = str(trainer_corpus_dir), str(trainer_cache_dir)
    res = _curve_run(c, k)
    cells = load_spec(_write_spec(tmp_path / "tiny.yaml", TINY)).cells()
    store = ResultsStore(tmp_path / "out")
    for cell in cells:
        store.write_run(run_record(cell, res), curve_rows(cell.run_id, res["curve"]))
    store.consolidate()
    ids = {cell.run_id for cell in cells}
    # a 0-byte runs part: that run still counts through the consolidated table
    (store.runs_parts / f"{cells[0].run_id}.parquet").write_bytes(b"")
    with pytest.warns(UserWarning, match="Parquet file size is 0 bytes"):
        assert store.completed_ids() == ids
    # a torn curves part and consolidated table: the run counts as unfinished, the other run stays
    (store.curves_parts / f"{cells[1].run_id}.parquet").write_bytes(b"PAR1\x00")
    store.runs_path.write_bytes(b"")
    with pytest.warns(UserWarning, match="moved aside"):
        assert store.completed_ids() == set()
    store.write_run(run_record(cells[0], res), curve_rows(cells[0].run_id, res["curve"]))
    store.consolidate()
    assert [r["run_id"] for r in store.runs().to_pylist()] == [cells[0].run_id]
    # result.json torn: the run is unfinished (trained again), not an error
    ws = RunWorkspace(str(tmp_path / "tune"), cells[0].run_id)
    ws.save_result({"status": "ok"})
    (ws.dir / "result.json").write_bytes(b'{"status": "o')
    with pytest.warns(UserWarning, match="not valid JSON"):
        assert ws.result() is None
    assert not (ws.dir / "result.json").exists()
    # the newest trainer checkpoint is torn: the run resumes from the one before and ends where it would have
    ck = tmp_path / "ck"
    _curve_run(c, k, checkpoint_dir=str(ck), checkpoint_every_steps=2)
    data = (ck / "ckpt-00000008.pt").read_bytes()
    (ck / "ckpt-00000008.pt").write_bytes(data[: len(data) // 2])
    with pytest.warns(UserWarning, match="resuming from an older one"):
        resumed = _curve_run(c, k, checkpoint_dir=str(ck), checkpoint_every_steps=2)
    assert resumed["resumed_from_step"] == 6
    assert (ck / "ckpt-00000008.pt.unreadable").exists()
    assert resumed["final_val_loss"] == pytest.approx(res["final_val_loss"], rel=1e-5)
    # the only checkpoint torn: said as training from step 0 (it said "resuming from an older one")
    from loopscale.model.train import _newest_readable_checkpoint

    only = tmp_path / "only"
    only.mkdir()
    (only / "ckpt-00000010.pt").write_bytes(data[: len(data) // 2])
    with pytest.warns(UserWarning, match="no older one is left: training from step 0"):
        assert _newest_readable_checkpoint(only) == (None, None)
    # a token cache whose meta.json is torn: moved aside and built again
    from loopscale.model.data import load_tokens

    td = load_tokens(c, "byte", cache_dir=k)
    (td.cache_path / "meta.json").write_bytes(b"")
    with pytest.warns(UserWarning, match="unreadable meta.json"):
        again = load_tokens(c, "byte", cache_dir=k)
    assert again.built and len(again.train) == len(td.train)
    # an LR table torn: absent (stage 1 rebuilds it from its finished studies)
    lr = tmp_path / "lr_table.parquet"
    lr.write_bytes(b"")
    with pytest.warns(UserWarning, match="moved aside"):
        assert not lr_table_present(lr)
    with pytest.raises(FileNotFoundError, match="tune-lr"):
        read_lr_table(lr)
    # a torn analysis.json: the report says to run the fit stage (exit 2 from the CLI), no JSON traceback
    run_dir = tmp_path / "run"
    shutil.copytree(ROOT / "docs" / "example_cpu_previous_default", run_dir)
    (run_dir / "fit" / "analysis.json").write_text('{"variants": ', encoding="utf-8")
    with pytest.warns(UserWarning), pytest.raises(FileNotFoundError, match="fit stage"):
        build_report(run_dir)
    write_text_atomic(str(tmp_path / "ok.json"), '{"a": 1}')
    assert read_json_or_aside(str(tmp_path / "ok.json")) == {"a": 1}


# --- kind 11: a token file's dtype is guessed ------------------------------------------------------------------


def test_token_file_dtype_is_never_guessed_silently(tmp_path):
    """200,000 uint32 ids < 70,000 in a plain ``tokens.bin`` were read as 400,000 uint16 tokens with vocab 65,536.
    Now: a plain .bin that looks like uint32 is refused with the fix; ``.u32.bin``/``.npy`` carry the dtype; a
    plain .bin of real uint16 ids is read with a warning; an odd byte count is refused; an explicit vocabulary
    is never replaced by the corpus's."""
    import numpy as np

    from loopscale.model.data import CorpusError, load_tokens

    ids = np.random.default_rng(0).integers(0, 70000, 200_000)
    ids.astype(np.uint32).tofile(tmp_path / "tokens.bin")
    with pytest.raises(CorpusError, match=r"looks like uint32.*tokens\.u32\.bin"):
        load_tokens(str(tmp_path / "tokens.bin"), "pretokenized")
    p = _cli(
        "train", "--corpus", "tokens.bin", "--tokenizer", "pretokenized", "--vocab-size", "70000",
        "--d-model", "16", "--seq-len", "32", "--tokens", "512", "--batch-tokens", "256", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 2 and "name it tokens.u32.bin" in p.stderr and "tokens.u16.bin" not in p.stderr and not p.stdout
    shutil.copy(tmp_path / "tokens.bin", tmp_path / "tokens.u32.bin")
    np.save(tmp_path / "tokens.npy", ids.astype(np.uint32))
    for name in ("tokens.u32.bin", "tokens.npy"):
        td = load_tokens(str(tmp_path / name), "pretokenized")
        assert len(td.train) + len(td.val) == 200_000 and td.vocab_size == int(ids.max()) + 1
        assert td.meta["dtype"] == "uint32"
    cfg = RunConfig(
        model=preset_config("cpu", r=1, d_model=16, seq_len=32, vocab_size=70000),
        corpus=str(tmp_path / "tokens.u32.bin"),
        tokenizer="pretokenized",
        batch_tokens=256,
        tokens=512,
        eval_tokens=256,
    )
    res = train_run(cfg)
    assert res.vocab_size == 70000 and res.corpus_vocab_size == int(ids.max()) + 1
    # real uint16 ids in a plain .bin: read, but never silently
    small = np.random.default_rng(1).integers(0, 5000, 10_000).astype(np.uint16)
    small.tofile(tmp_path / "u16.bin")
    with pytest.warns(UserWarning, match="no dtype suffix: read as uint16"):
        td = load_tokens(str(tmp_path / "u16.bin"), "pretokenized")
    assert len(td.train) + len(td.val) == 10_000 and td.meta["dtype"] == "uint16"
    (tmp_path / "odd.bin").write_bytes(small.tobytes()[:-1])
    with pytest.raises(CorpusError, match="not a multiple of 2"):
        load_tokens(str(tmp_path / "odd.bin"), "pretokenized")


# --- kind 10: the tokenizer is trained on nothing --------------------------------------------------------------


def test_tokenizer_is_never_trained_on_nothing(tmp_path):
    """A corpus of one ``corpus.txt`` (its name lands in the validation split) trained BPE on 0 documents: 0
    merges, 1.00 bytes/token. Now such a corpus is split by position (BPE learns from the text before the
    validation tail), a corpus too small for BPE is refused with the minimum, and the run's data summary states
    the train/validation sizes."""
    from conftest import _trainer_words_text

    from loopscale.model.data import MIN_BPE_TRAIN_BYTES, CorpusError, is_validation_doc, load_tokens

    assert is_validation_doc("corpus.txt")
    text = " ".join(_trainer_words_text(i, 500) for i in range(6))
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    cache = str(tmp_path / "cache")
    td = load_tokens(str(tmp_path / "corpus.txt"), "bpe:512", cache_dir=cache)
    bt = td.meta["bpe_training"]
    assert bt["split"] == "position" and bt["docs"] == 1 and bt["merges"] > 50
    assert len(text) * 0.9 < bt["bytes"] < len(text)  # the validation tail is not trained on
    assert td.bytes_per_token_val > 2.0 and td.meta["n_val_tokens"] > 0 and td.meta["n_train_tokens"] > 0
    # too small to learn from: refused, the minimum is stated
    (tmp_path / "tiny.txt").write_text("hello world " * 20, encoding="utf-8")
    with pytest.raises(CorpusError, match=f"at least {MIN_BPE_TRAIN_BYTES} bytes"):
        load_tokens(str(tmp_path / "tiny.txt"), "bpe:512", cache_dir=cache)
    # the run reports what it trained and validated on, from the CLI too
    p = _cli(
        "train", "--corpus", "corpus.txt", "--tokenizer", "bpe:512", "--d-model", "16", "--seq-len", "32",
        "--tokens", "512", "--batch-tokens", "256", "--eval-tokens", "256", "--cache-dir", cache, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    n_tr, n_val = td.meta["n_train_tokens"], td.meta["n_val_tokens"]
    assert f"{n_tr} train / {n_val} validation tokens" in p.stdout
    assert f"BPE trained on 1 document, {bt['bytes']} bytes, {bt['merges']} merges" in p.stdout


# --- kind 1: a value that every run will reject is found only inside Ray trials --------------------------------


def test_value_every_run_rejects_is_caught_before_ray(tmp_path):
    """``tokenizer: bpe:512`` with an explicit ``model.vocab_size: 256`` made every trial fail 3 times inside Ray.
    Now every cell's full RunConfig is built while the spec is validated: ``run --dry-run`` and ``sweep`` exit 2
    naming the key and the fix, before Ray starts. Without an explicit vocabulary it is sized from the tokenizer.
    A corpus that every run would reject (missing; token ids beyond the vocabulary) is refused the same way."""
    import numpy as np

    from loopscale.sweep.spec import SpecError, parse_spec

    bad = dict(TINY, tokenizer="bpe:512", model={"preset": "cpu", "seq_len": 32, "vocab_size": 256})
    spec_path = _write_spec(tmp_path / "bad.yaml", bad)
    for args in (
        ["run", str(spec_path), "--dry-run"],
        ["sweep", str(spec_path), "--out", str(tmp_path / "o")],
    ):
        p = _cli(*args, cwd=tmp_path)
        assert p.returncode == 2, p.stderr[-2000:]
        assert "model.vocab_size" in p.stderr and "at least 512" in p.stderr
        assert "ray" not in p.stderr.lower().replace("every trial", "")
    assert not (tmp_path / "o").exists()
    # sized from the tokenizer when not given (and the preset's V kept when it is larger)
    cells = parse_spec(dict(TINY, tokenizer="bpe:512")).cells()
    assert {c.run.model.vocab_size for c in cells} == {512}
    paper = parse_spec(
        dict(
            TINY,
            tokenizer="bpe:4096",
            model={"preset": "paper", "seq_len": 32, "size_unit": "width_scale"},
            sizes=[6],
        )
    )
    assert paper.cells()[0].run.model.vocab_size == 32064
    # any trainer-level rejection, e.g. a batch that is not a multiple of seq_len
    with pytest.raises(SpecError, match="would fail in every trial: batch_tokens"):
        parse_spec(dict(TINY, training={"batch_tokens": 250}))
    # the corpus: missing, or token ids beyond the vocabulary
    p = _cli("run", str(_write_spec(tmp_path / "nc.yaml", dict(TINY, corpus="nothere.txt"))), "--dry-run", cwd=tmp_path)
    assert p.returncode == 2 and "nothere.txt" in p.stderr and "does not exist" in p.stderr
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "t.u16.bin")
    spec = parse_spec(dict(TINY, corpus=str(tmp_path / "t.u16.bin"), tokenizer="pretokenized"))
    with pytest.raises(SpecError, match="ids up to 999.*vocab_size is 256"):
        spec.check_data()


# --- kind 2: a sweep or run in which no run succeeded exits 0 --------------------------------------------------


def test_no_run_finished_never_exits_zero(tmp_path, monkeypatch):
    """Every trial fails (an injected error, no retries): ``sweep`` and ``run`` exit non-zero with one line
    "0 of N runs finished ok: <most common error>" instead of exit 0 with zero rows."""
    failing = dict(TINY, max_failures=0)
    p = _cli(
        "sweep",
        str(_write_spec(tmp_path / "f.yaml", failing)),
        "--out",
        str(tmp_path / "s"),
        "--num-cpus",
        "2",
        env={FAULT_ENV: "1"},
    )
    assert p.returncode == 1, p.stderr[-3000:]
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert line == ["error: 0 of 2 runs finished ok: RuntimeError: injected failure at step 4 "
                    f"({FAULT_ENV}=1, run …) (2 of 2 failures)"]  # fmt: skip
    # run: the same line and exit code when its sweep stage raises it (run_pipeline calls run_sweep)
    from typer.testing import CliRunner

    import loopscale.sweep.commands as commands
    from loopscale.sweep.cli import app
    from loopscale.sweep.grid import no_run_finished

    def all_fail(spec, out, **kw):
        raise no_run_finished(8, ["RuntimeError: injected failure"] * 8)

    grid = dict(TINY, sizes=[16, 32], tokens=[1024, 2048])  # 8 runs: enough for the joint law's plan
    monkeypatch.setattr(commands, "run_sweep", all_fail)
    res = CliRunner().invoke(
        app, ["run", str(_write_spec(tmp_path / "g.yaml", grid)), "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 1, res.output
    assert "error: 0 of 8 runs finished ok: RuntimeError: injected failure (8 of 8 failures)" in res.output
    assert not (tmp_path / "r" / "report.md").exists()


# --- kind 9: degenerate bootstrap is silent and then crashes the report ----------------------------------------


def test_degenerate_bootstrap_says_why_and_report_renders_it(tmp_path):
    """12 runs (r in {1,2,4,8} x 3 widths) at one token budget D: every block draw over (D, r) holds a single
    budget, so 0 of B refits were ok, every interval was [null, null] without a word, and the report raised
    TypeError. Now the fit says why no interval exists and which blocking would work; the report renders the
    missing intervals as "–" with the reason; ``run`` refuses such a grid in its plan."""
    import json

    import pyarrow.compute as pc

    from loopscale.fit.analysis import analyze
    from loopscale.fit.run_report import build_report

    t = pq.read_table(ROOT / "docs" / "example_cpu_previous_default" / "runs.parquet")
    one_d = t.filter(pc.equal(t["D"], max(t["D"].to_pylist())))
    assert one_d.num_rows == 12 and len(set(one_d["r"].to_pylist())) == 4
    table = tmp_path / "run" / "runs.parquet"
    table.parent.mkdir()
    pq.write_table(one_d, table)
    p = _cli("fit", str(table), "--law", "joint", "--bootstrap", "20", "--starts", "20", "--identify", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    boot = json.loads(p.stdout)["bootstrap"]
    assert boot["n_ok"] == 0
    # a point with no interval is not a result, and --identify --json printed strict JSON (a per-r phi's NaN ends
    # made it exit 2: "Out of range float values are not JSON compliant")
    ident = json.loads(p.stdout)["identification"]
    assert ident["identified"] is False and "no_interval" in ident["causes"], ident
    assert ident["reasons"]["no_interval"].startswith("no interval: the bootstrap gave none (every run has the same D")
    assert "every run has the same D" in boot["no_interval_reason"]
    assert "--block-by r" in boot["no_interval_reason"]
    # the suggested blocking gives intervals
    p = _cli(
        "fit", str(table), "--law", "joint", "--bootstrap", "8", "--starts", "20", "--block-by", "r", "--json"
    )
    assert p.returncode == 0 and json.loads(p.stdout)["bootstrap"]["n_ok"] > 0
    # the report: "–" and the reason, no TypeError
    with pytest.warns(UserWarning, match="no interval"):
        analyze(table, tmp_path / "run" / "fit", B=4, starts=20, workers=1, plots=False)
    text = build_report(tmp_path / "run").read_text(encoding="utf-8")
    identified = json.loads((tmp_path / "run" / "fit" / "analysis.json").read_text())["variants"]["baseline"][
        "identification"]["identified"]  # fmt: skip
    assert identified is False and "bootstrap 95 % CI –: not a result" in text
    assert "**No interval**" in text and "every run has the same D" in text
    # run refuses the grid before training anything, and its --dry-run plan says so
    grid = dict(TINY, r=[1, 2, 4, 8], sizes=[16, 32, 48])
    spec = _write_spec(tmp_path / "one_d.yaml", grid)
    p = _cli("run", str(spec), "--dry-run")
    assert (
        p.returncode == 2
        and "refused: yes: the error below says why" in p.stdout
        and "error: run would refuse this spec: " in p.stderr
        and "every run has the same budget (tokens: 2048)" in p.stderr
    )
    p = _cli("run", str(spec), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "add a second budget to 'tokens'" in p.stderr
    assert not (tmp_path / "out" / "runs.parquet").exists()


# --- kind 6: a diverged or collapsed LR is chosen (and kind 2 for tune-lr) -------------------------------------


def test_diverged_or_collapsed_lr_is_never_chosen(tmp_path):
    """LR in [10, 100]: every trial collapses to the same flat loss; it used to be stored COMPLETE and LR 26.5
    chosen (LR in [100, 1000]: NaN stored at 1e9, LR 354 chosen). Now such trials are Optuna FAIL with the
    reason, and with no healthy trial ``tune-lr`` exits 1 with "all N trials diverged or did not learn at LR in
    [a, b]" and writes no LR table. When every trial raises, the line is "0 of N runs finished ok: <error>"."""
    import optuna

    from loopscale.sweep.lr_search import unhealthy_reason

    flat = dict(TINY, lr="tune")
    # grace = all milestones: ASHA prunes nobody, so both trials reach the health check whatever their timing
    flat["tune"] = {"num_samples": 2, "lr_min": 10, "lr_max": 100, "tokens": 2048, "num_milestones": 2,
                    "grace_milestones": 2, "max_concurrent": 2, "tune_per_r": False}  # fmt: skip
    out = tmp_path / "flat"
    p = _cli("tune-lr", str(_write_spec(tmp_path / "flat.yaml", flat)), "--out", str(out), "--num-cpus", "2")
    assert p.returncode == 1, p.stderr[-3000:]
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(line) == 1 and "all 2 trials diverged or did not learn at LR in [10, 100]" in line[0]
    assert "did not learn" in line[0] and not (out / "lr_table.parquet").exists()
    assert "Next: move the LR range" in line[0] and "another --out folder" in line[0]
    png = out / "tune_lr" / "loss_vs_lr_size16.png"  # what the failed trials did, to choose the next range from
    assert f"loss by LR: {png}" in line[0] and png.read_bytes()[:4] == b"\x89PNG"
    study = optuna.load_study(
        study_name="tiny_size16_r2", storage=f"sqlite:///{out / 'tune_lr' / 'optuna.db'}"
    )
    assert [t.state.name for t in study.trials] == ["FAIL"] * 2
    assert all("did not learn" in t.user_attrs["fail_reason"] for t in study.trials)
    # every trial raises: kind 2's line for tune-lr
    failing = dict(flat, max_failures=0)
    failing["tune"] = dict(flat["tune"], lr_min=1e-3, lr_max=1e-2)
    p = _cli("tune-lr", str(_write_spec(tmp_path / "err.yaml", failing)), "--out", str(tmp_path / "err"),
             "--no-plot", "--num-cpus", "2", env={FAULT_ENV: "1"})  # fmt: skip
    assert p.returncode == 1, p.stderr[-3000:]
    assert "error: 0 of 2 runs finished ok: RuntimeError: injected failure at step" in p.stderr
    # the rule itself: diverged, NaN, at the start level, flat; a decreasing curve is healthy
    curve = [{"step": 4, "val_loss": 4.73}, {"step": 8, "val_loss": 4.37}]
    ok = {"status": "ok", "final_val_loss": 4.37, "vocab_size": 256, "curve": curve}
    assert unhealthy_reason(ok) is None
    assert "diverged at step 3" in unhealthy_reason(dict(ok, status="diverged", diverged_step=3))
    assert "non-finite" in unhealthy_reason(dict(ok, final_val_loss=float("nan")))
    assert "start level" in unhealthy_reason(dict(ok, final_val_loss=5.6, curve=[]))
    assert "flat curve" in unhealthy_reason(
        dict(ok, final_val_loss=4.73, curve=[curve[0], dict(curve[1], val_loss=4.73)])
    )
    # a curve that rose after the first milestone is named as such (it read "a flat curve" at 3.2006 vs 3.1663)
    rose = unhealthy_reason(dict(ok, final_val_loss=4.9, curve=[curve[0], dict(curve[1], val_loss=4.9)]))
    assert rose.endswith("(a rising curve: the loss got worse after the first milestone, training is unstable at "
                         "this LR)")  # fmt: skip
    # the trainer's own verdict: a collapsed model's loss can be below ln V and its curve falling
    said = "the model collapsed: ... (status did_not_learn: fits leave it out); lr=50 is likely too high"
    assert unhealthy_reason(dict(ok, status="did_not_learn", warnings=["x", said])) == f"did not learn: {said}"


# --- kind 5: a finite LR set is not fully tried ----------------------------------------------------------------

PAPER_LRS = [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128]


def test_finite_lr_set_is_fully_tried(tmp_path):
    """``num_samples: 8`` over 8 ``lr_values`` tried 6 distinct LRs, two twice (TPE on a categorical). Now every
    listed value is tried exactly once when the budget covers the set, and a listed duplicate is never trained
    twice."""
    import optuna
    from ray import tune

    from loopscale.sweep._seams import trained_counts
    from loopscale.sweep.lr_search import check_tune_samples, done_marker, study_keys, study_plan

    spec = dict(TINY, lr="tune", tokens=[1024])
    spec["tune"] = {"num_samples": 8, "lr_values": PAPER_LRS, "tokens": 1024, "num_milestones": 2,
                    "max_concurrent": 2, "tune_per_r": False}  # fmt: skip
    out = tmp_path / "out"
    p = _cli("tune-lr", str(_write_spec(tmp_path / "s.yaml", spec)), "--out", str(out), "--no-plot",
             "--num-cpus", "2", env={COUNT_ENV: "1"})  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    study = optuna.load_study(
        study_name="tiny_size16_r2", storage=f"sqlite:///{out / 'tune_lr' / 'optuna.db'}"
    )
    assert sorted(t.params["lr"] for t in study.trials) == PAPER_LRS
    # every trial ASHA did not stop trained to the end exactly once (a stopped one never finishes)
    counts = trained_counts(str(out / "tune_lr" / "ray"))
    finished = [t for t in study.trials if t.state.name != "PRUNED"]
    assert len(counts) == len(finished) >= 1 and set(counts.values()) == {1}
    # a duplicate in the list is one grid point; a budget below the set size grids over an evenly spread subset
    # (TPE on the set tried 0.003 and 3.0 twice each in 5 samples of 7 values, and 4 values never)
    s = load_spec(
        _write_spec(
            tmp_path / "d.yaml",
            dict(spec, tune=dict(spec["tune"], lr_values=[0.01, 0.02, 0.01], num_samples=3)),
        )
    )
    plan = study_plan(s, 16, 2, tmp_path / "t", str(tmp_path / "st"), experiment="e")
    assert plan["param_space"]["lr"] == tune.grid_search([0.01, 0.02])
    s = load_spec(_write_spec(tmp_path / "f.yaml", dict(spec, tune=dict(spec["tune"], num_samples=4))))
    got = study_plan(s, 16, 2, tmp_path / "t", str(tmp_path / "st"), experiment="e")
    lrs = sorted(PAPER_LRS)
    assert got["param_space"]["lr"] == tune.grid_search([lrs[0], lrs[2], lrs[5], lrs[7]])  # 8 values, 4 samples
    assert got["tune_config"].num_samples == 1 and got["tune_config"].search_alg is None
    # one sample per study tries one LR (the middle of the set): nothing to tune, refused before a study starts as
    # one lr_values entry is; the spec itself still loads (a folder tuned so keeps reading its spec.yaml)
    s = load_spec(_write_spec(tmp_path / "g.yaml", dict(spec, tune=dict(spec["tune"], num_samples=1))))
    assert study_plan(s, 16, 2, tmp_path / "t", str(tmp_path / "st"), experiment="e")["param_space"]["lr"] == (
        tune.grid_search([lrs[4]]))
    with pytest.raises(ValueError, match=r"tune.num_samples 1 tries one LR per study: there is nothing to tune"):
        check_tune_samples(s, tmp_path / "new")
    for key in study_keys(s):  # every study done (its marker written): nothing would be tuned, nothing refused
        done_marker(tmp_path / "done", *key).parent.mkdir(parents=True, exist_ok=True)
        done_marker(tmp_path / "done", *key).write_text("{}")
    check_tune_samples(s, tmp_path / "done")
    check_tune_samples(s.model_copy(update={"lr": {"fixed": 0.01}}), tmp_path / "new")  # no tuning: no refusal
