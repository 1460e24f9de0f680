"""A corpus changed in place (same path, other content) since a folder's runs finished: refused before Ray.

Regenerating shards or editing a text at the same path used to be invisible: the run id and the folder's spec name
the path only, so finished runs were kept as runs of the new text, and a resumed sweep mixed runs on two texts (two
validation sets) in one grid. Every run record now carries the corpus content hash (``corpus_sha256``), and
``sweep``, ``run`` (also when every cell is done) and ``run --dry-run`` compare it with the corpus now there.
Also here, on such a folder of finished records: ``run`` names the folder by the spec's name.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from tiny_spec import tiny_spec

from loopscale.model.data import default_cache_dir, resolve_corpus
from loopscale.sweep.spec import check_folder_corpus, parse_spec, record_folder_spec
from loopscale.sweep.store import ResultsStore, failed_record, run_record

TINY = tiny_spec(training={"batch_tokens": 256, "eval_tokens": 1024})


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_TMPDIR="/tmp/lsray_t")
    return subprocess.run(
        [sys.executable, "-m", "loopscale.sweep.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def _spec_and_folder(tmp_path: Path, d: dict, file_name: str = "tiny.yaml"):
    """The spec of ``d``, its YAML file ``tmp_path/file_name`` and an empty output folder ``tmp_path/out``."""
    spec = parse_spec(d)
    spec_path = tmp_path / file_name
    spec_path.write_text(yaml.safe_dump(d))
    out = tmp_path / "out"
    out.mkdir()
    return spec, spec_path, out


@pytest.fixture
def folder(tmp_path):
    """A corpus folder of three text files, a spec on it, and an output folder whose 8 runs all finished on it
    (records written as the sweep writes them, with the hash the trainer reports: no training here)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"doc{i}.txt").write_text(f"The {i}th document of plain English prose. " * 400, encoding="utf-8")
    d = copy.deepcopy(TINY)
    d["corpus"] = str(corpus)
    spec, spec_path, out = _spec_and_folder(tmp_path, d)
    record_folder_spec(out, spec)
    h = resolve_corpus(str(corpus), "text", cache_dir=default_cache_dir()).corpus_hash
    store = ResultsStore(out)
    cells = spec.cells()
    for c in cells:
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0, "corpus_hash": h}))
    store.consolidate()
    return corpus, spec, spec_path, out, h


def test_records_carry_the_hash_and_an_unchanged_corpus_passes(folder):
    corpus, spec, _, out, h = folder
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    assert len(rows) == 8 and {r["corpus_sha256"] for r in rows} == {h}
    check_folder_corpus(out, spec)  # same content: passes
    (corpus / "doc1.txt").touch()  # a newer mtime, the same bytes: still the same text
    check_folder_corpus(out, spec)


def test_changed_corpus_is_refused_by_sweep_run_and_dry_run(folder):
    corpus, spec, spec_path, out, h = folder
    (corpus / "doc1.txt").write_text("Other words entirely, in another order. " * 400, encoding="utf-8")
    new = resolve_corpus(str(corpus), "text", cache_dir=default_cache_dir()).corpus_hash
    with pytest.raises(ValueError, match="8 of the 8 finished runs in .* read other content at the corpus path") as e:
        check_folder_corpus(out, spec)
    assert h[:12] in str(e.value) and new[:12] in str(e.value) and "another --out folder" in str(e.value)
    before = (out / "runs.parquet").read_bytes()
    for args in (["sweep", str(spec_path)], ["run", str(spec_path)]):  # run: every cell is done, sweep skipped
        p = _cli(*args, "--out", str(out))
        assert p.returncode == 2, (args, p.stderr[-2000:])
        assert "files' names or bytes changed since" in p.stderr and "Traceback" not in p.stderr
    p = _cli("run", str(spec_path), "--out", str(out), "--dry-run", "--json")
    assert p.returncode == 2 and "files' names or bytes changed since" in json.loads(p.stdout)["refused"]
    assert (out / "runs.parquet").read_bytes() == before and not (out / "logs" / "ray.log").exists()


def test_a_renamed_file_is_refused_as_names_or_bytes_changed(folder):
    """A file renamed with the same bytes changes the hash (its name decides the split): refused, as before, but the
    message said only that the files' bytes had changed, which they had not."""
    corpus, spec, _, out, _ = folder
    (corpus / "doc1.txt").rename(corpus / "doc9.txt")
    with pytest.raises(ValueError, match=r"its files' names or bytes changed since \(the hash covers both: a file's "
                       r"name decides whether it is validation text\), and new runs"):  # fmt: skip
        check_folder_corpus(out, spec)


def test_a_left_out_file_is_said_once_on_a_folder_with_finished_runs(folder):
    """Comparing the corpus with a folder's runs hashes it again; the files a directory corpus leaves out are said
    once all the same (they were said twice on any folder with earlier results)."""
    corpus, _, spec_path, out, _ = folder
    (corpus / "notes.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    p = _cli("sweep", str(spec_path), "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.count("ignored 1 file (.csv)") == 1, p.stderr


def test_a_corpus_changed_while_the_grid_trained_is_not_returned_as_one_grid(folder, monkeypatch):
    """The corpus is compared with the folder's runs when a command starts; one changed while the sweep trained left
    runs of two texts (two validation sets) in runs.parquet, which `run` then fitted as one grid without a word."""
    import loopscale.sweep.spec as spec_mod
    from loopscale.sweep.commands import run_sweep

    _, spec, _, out, _ = folder
    store = ResultsStore(out)
    for c in spec.cells()[:4]:  # these trained after the corpus was regenerated in place
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.1, "corpus_hash": "f" * 64}))
    monkeypatch.setattr(spec_mod, "check_folder_corpus", lambda out, spec: None)  # the change came after the start
    with pytest.raises(ValueError, match="changed while the grid trained: .* 2 different contents .*4 runs ffffffffffff"):
        run_sweep(spec, out, quiet=True)


def test_an_out_folder_inside_the_corpus_directory_is_refused_before_anything_is_written(folder):
    """runs.parquet's parts written inside a directory corpus made every run that started after them fail ("mixes
    file kinds ['parquet', 'text']"), and report.md would have become corpus text: refused, nothing written."""
    corpus, spec, spec_path, _, _ = folder
    for args in (["sweep", str(spec_path)], ["run", str(spec_path)], ["run", str(spec_path), "--dry-run"]):
        p = _cli(*args, "--out", str(corpus / "out"))
        assert p.returncode == 2 and "is inside the corpus directory" in p.stderr, (args, p.stderr[-2000:])
    assert sorted(f.name for f in corpus.iterdir()) == ["doc0.txt", "doc1.txt", "doc2.txt"]


def test_records_without_a_hash_and_failed_records_are_not_compared(folder, tmp_path):
    """A folder written before the column existed, or a failed run (it trained nothing), is not refused."""
    corpus, spec, _, _, _ = folder
    out = tmp_path / "old"
    out.mkdir()
    store = ResultsStore(out)
    cells = spec.cells()
    store.write_run(run_record(cells[0], {"status": "ok", "final_val_loss": 3.0}))  # no corpus_hash
    store.write_run(failed_record(cells[1], "RuntimeError: x"))
    assert store.corpus_hashes() == {}
    (corpus / "doc0.txt").write_text("Changed. " * 100, encoding="utf-8")
    check_folder_corpus(out, spec)
    check_folder_corpus(tmp_path / "missing", spec)  # no folder: nothing to compare


def test_corpus_sha256_is_in_the_schema_doc():
    from loopscale.sweep.store import RUNS_SCHEMA

    assert b"content hash" in RUNS_SCHEMA.field("corpus_sha256").metadata[b"doc"]
    assert Path(__file__).resolve().parents[1].joinpath("README.md").read_text().count("corpus_sha256") >= 1


def test_a_folder_with_no_finished_run_remembers_the_corpus_it_started_on(tmp_path, monkeypatch):
    """An interrupted sweep with no finished run, then a changed corpus: its checkpoints are of the old text, and
    every resumed trial failed after training ("checkpoint ... differs in ['corpus_hash']"). The folder's first
    command records the hash (corpus.json); a later command on other content is refused before Ray."""
    import loopscale.model.data as D
    import loopscale.sweep.spec as S

    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("Plain English prose for a test corpus. " * 300, encoding="utf-8")
    d = copy.deepcopy(TINY)
    d["corpus"] = str(corpus)
    spec, spec_path, out = _spec_and_folder(tmp_path, d)
    calls = []
    real = D.resolve_corpus
    monkeypatch.setattr(D, "resolve_corpus", lambda *a, **k: calls.append(a) or real(*a, **k))
    record_folder_spec(out, spec)  # what tune-lr, sweep and run do first
    doc = json.loads((out / "corpus.json").read_text())
    assert doc["corpus"] == str(corpus) and doc["corpus_sha256"] == real(str(corpus)).corpus_hash
    check_folder_corpus(out, spec)
    record_folder_spec(out, spec)  # a second command: the record is kept, not rewritten
    assert json.loads((out / "corpus.json").read_text()) == doc
    assert len(calls) == 1  # one hash for the unchanged files in this process
    ck = out / "tune" / "checkpoints" / spec.cells()[0].run_id
    ck.mkdir(parents=True)
    (ck / "ckpt_000016.pt").write_bytes(b"x")  # an unfinished run's checkpoint, of the old text
    (corpus / "a.txt").write_text("Another text altogether, longer than before. " * 300, encoding="utf-8")
    with pytest.raises(ValueError, match=r"is not the one .* was started on \(content hash .* in corpus.json.*"
                       r"holds what was trained on the old text \(checkpoints in "):  # fmt: skip
        check_folder_corpus(out, spec)
    assert json.loads((out / "corpus.json").read_text()) == doc and S.FOLDER_CORPUS == "corpus.json"
    tune = dict(d, lr="tune", tune={"num_samples": 2, "tokens": 1024, "num_milestones": 2})
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(tune))
    for args in (["sweep", str(spec_path), "--resume"], ["tune-lr", str(tmp_path / "tune.yaml")]):
        target = out if args[0] == "sweep" else tmp_path / "out_tune"
        if args[0] == "tune-lr":  # a tune-lr folder started on the old text (its LR table would be of it)
            target.mkdir()
            (target / "corpus.json").write_text(json.dumps(doc))
            (target / "lr_table.parquet").write_bytes(b"x")
        p = _cli(*args, "--out", str(target))
        assert p.returncode == 2 and "was started on" in p.stderr, (args, p.stderr[-2000:])


def test_run_names_its_folder_by_the_specs_name_not_its_file(tmp_path):
    """run_meta.json's spec_name (the report's title; status's key to the grid's Tune experiments, grid_<name>_NNN)
    was the spec file's stem ("mygrid" for mygrid.yaml) while the experiments carried the spec's name."""
    from loopscale.model.accounting import flops_per_token, n_once, n_rec

    d = copy.deepcopy(TINY)
    d["name"] = "tinyname"
    d["sizes"] = [16, 32]
    spec, spec_path, out = _spec_and_folder(tmp_path, d, "mygrid.yaml")
    record_folder_spec(out, spec)
    store = ResultsStore(out)
    h = resolve_corpus("embedded", cache_dir=default_cache_dir()).corpus_hash
    for i, c in enumerate(spec.cells()):  # finished runs whose losses follow the joint law: the run only fits them
        m, D = c.run.model, c.run.tokens
        N = n_once(m) + c.r**0.5 * n_rec(m)
        loss = 1.5 + 40 * N**-0.3 + 300 * D**-0.35 + 0.002 * ((i * 7) % 5 - 2)
        store.write_run(
            run_record(c, {"status": "ok", "final_val_loss": loss, "N_once": n_once(m), "N_rec": n_rec(m),
                           "N_unique": n_once(m) + n_rec(m), "D": D, "C": flops_per_token(m) * D,
                           "flops_per_token": flops_per_token(m), "corpus_hash": h})  # fmt: skip
        )
    store.consolidate()
    p = _cli("run", str(spec_path), "--out", str(out), "--bootstrap", "0", "--starts", "5")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((out / "run_meta.json").read_text())["spec_name"] == "tinyname"
    assert (out / "report.md").read_text().startswith("# loopscale report: tinyname")


def test_a_folder_where_nothing_trained_takes_the_new_corpus(tmp_path):
    """Every trial of a first sweep failed on a corpus error (no finished run, no checkpoint, no LR table); the user
    fixed the file, and `run` and even `sweep --force` refused the folder as started on the old text, naming
    checkpoints and an LR table it did not have. Such a folder now takes the new corpus, saying so; one with a
    finished run, a checkpoint or an LR table is still refused, naming which."""
    from loopscale.sweep.spec import trained_in_folder
    from loopscale.sweep.store import failed_record

    corpus = tmp_path / "c.txt"
    corpus.write_text(" \n" * 600, encoding="utf-8")  # whitespace only: every run fails
    d = copy.deepcopy(TINY)
    d["corpus"] = str(corpus)
    spec, _, out = _spec_and_folder(tmp_path, d)
    record_folder_spec(out, spec)
    store = ResultsStore(out)
    for c in spec.cells():
        store.write_run(failed_record(c, "CorpusError: corpus contains no text"))
    old = json.loads((out / "corpus.json").read_text())["corpus_sha256"]
    corpus.write_text("Plain English prose, fixed by the user. " * 300, encoding="utf-8")
    assert trained_in_folder(out, spec) == []
    # checkpoints an earlier command left in its own --storage hold the folder too
    ck = tmp_path / "st_earlier" / "checkpoints" / "r1"
    ck.mkdir(parents=True)
    (ck / "ckpt.pt").write_bytes(b"w")
    (out / "logs").mkdir(exist_ok=True)
    earlier = {"kind": "sweep", "command": f"loopscale sweep x --out {out} --storage {tmp_path / 'st_earlier'}",
               "cwd": str(tmp_path), "pid": -1, "host": "elsewhere"}  # fmt: skip
    (out / "logs" / "command.json").write_text(json.dumps(earlier))
    assert trained_in_folder(out, spec) == [f"checkpoints in {tmp_path / 'st_earlier' / 'checkpoints'}"]
    (out / "logs" / "command.json").unlink()
    check_folder_corpus(out, spec)
    with pytest.warns(UserWarning, match=r"nothing there was trained on the old text, so the folder takes the new"):
        record_folder_spec(out, spec)
    new = json.loads((out / "corpus.json").read_text())["corpus_sha256"]
    assert new != old and new == resolve_corpus(str(corpus)).corpus_hash
    # a checkpoint, an LR table or a finished run holds the folder to the text it was trained on
    corpus.write_text("A third text, changed once more. " * 300, encoding="utf-8")
    (out / "lr_table.parquet").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"holds what was trained on the old text \(an LR table\)"):
        check_folder_corpus(out, spec)
    assert json.loads((out / "corpus.json").read_text())["corpus_sha256"] == new
    (out / "lr_table.parquet").unlink()
    store.write_run(run_record(spec.cells()[0], {"status": "ok", "final_val_loss": 3.0}))
    assert trained_in_folder(out, spec) == ["1 finished run"]
    with pytest.raises(ValueError, match=r"holds what was trained on the old text \(1 finished run\)"):
        check_folder_corpus(out, spec)
