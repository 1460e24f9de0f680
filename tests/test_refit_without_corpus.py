"""A fit-only rerun of a finished folder does not need the corpus: ``run --resume`` on a folder where every run is
recorded (and, for ``lr: tune``, the LR table is there) refits it, training nothing, also when the corpus was moved
away since (it stopped with "corpus ... does not exist"); it says that the corpus is absent and was not checked. A
folder with runs still to train keeps refusing a missing corpus.
"""

from __future__ import annotations

import pytest
from tiny_spec import tiny_spec

from loopscale.model.data import default_cache_dir, resolve_corpus
from loopscale.sweep.run import run_pipeline
from loopscale.sweep.spec import SpecError, parse_spec, record_folder_spec
from loopscale.sweep.store import ResultsStore, run_record


@pytest.fixture
def finished(tmp_path, monkeypatch):
    """A folder whose runs are all recorded on a text corpus, and a stub fit and report (no Ray, no fitting)."""
    import loopscale.fit.analysis as analysis
    import loopscale.fit.run_report as run_report

    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "bad.txt"
    corpus.write_text("Plain English prose for a tiny corpus. " * 300, encoding="utf-8")
    spec = parse_spec(tiny_spec(corpus=str(corpus)))
    out = tmp_path / "out"
    out.mkdir()
    record_folder_spec(out, spec)
    h = resolve_corpus(str(corpus), "text", cache_dir=default_cache_dir()).corpus_hash
    store = ResultsStore(out)
    for c in spec.cells():
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0, "corpus_hash": h}))
    store.consolidate()
    fitted = []

    def fake_analyze(runs, fit_dir, **kw):
        fit_dir.mkdir(parents=True, exist_ok=True)
        (fit_dir / "analysis.json").write_text("{}")
        fitted.append(kw)

    monkeypatch.setattr(analysis, "analyze", fake_analyze)
    monkeypatch.setattr(run_report, "build_report", lambda out: out / "report.md")
    return spec, corpus, out, fitted


def test_a_finished_folder_is_refitted_without_its_corpus(finished):
    spec, corpus, out, fitted = finished
    corpus.rename(corpus.with_suffix(".moved"))
    said: list[str] = []
    meta = run_pipeline(spec, out, resume=True, bootstrap=12, starts=3, log=said.append)
    assert fitted and fitted[0]["B"] == 12
    assert "sweep" in meta["skipped"]
    assert any("is absent: not checked" in line for line in said), said


def test_a_folder_with_runs_left_to_train_still_refuses_a_missing_corpus(finished):
    spec, corpus, out, fitted = finished
    corpus.rename(corpus.with_suffix(".moved"))
    bigger = spec.model_copy(update={"seeds": [0, 1]})  # more runs than the folder holds
    with pytest.raises(SpecError, match="does not exist"):
        run_pipeline(bigger, out, resume=True, bootstrap=12, starts=3, log=lambda s: None)
    assert not fitted


def test_the_dry_run_and_the_command_agree_on_a_refit_without_the_corpus(finished):
    """`run --dry-run` on that folder stopped with "corpus ... does not exist" (its plan read the corpus) while
    `run` refits it: the dry run now plans it as `run` does, saying the corpus is absent and not checked."""
    import json

    from typer.testing import CliRunner

    from loopscale.sweep.cli import app
    from loopscale.sweep.spec import spec_to_yaml

    spec, corpus, out, fitted = finished
    path = out.parent / "tiny.yaml"
    path.write_text(spec_to_yaml(spec))
    corpus.rename(corpus.with_suffix(".moved"))
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--resume", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    p = json.loads(res.stdout.splitlines()[0])
    assert p["refused"] is None and p["runs"] == len(spec.cells())
    assert p["corpus_warning"].startswith(f"corpus {str(corpus)!r} is absent: not checked")
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--resume", "--bootstrap", "12"])
    assert res.exit_code == 0, res.output
    assert fitted and fitted[0]["B"] == 12


def test_the_dry_run_of_a_refit_without_the_corpus_moves_nothing(finished):
    """The dry run's check for a refit without the corpus read the folder's runs as `run` does and moved a runs
    part without its curves part aside (a dry run writes nothing in DIR). It now reads them changing nothing, and
    names the file under `unreadable`."""
    import json

    from typer.testing import CliRunner

    from loopscale.sweep.cli import app
    from loopscale.sweep.spec import spec_to_yaml

    spec, corpus, out, fitted = finished
    path = out.parent / "tiny.yaml"
    path.write_text(spec_to_yaml(spec))
    store = ResultsStore(out)
    rid = spec.cells()[0].run_id
    store.write_run(run_record(spec.cells()[0], {"status": "ok", "final_val_loss": 2.9}), [])
    (out / "parts" / "curves" / f"{rid}.parquet").unlink(missing_ok=True)
    corpus.rename(corpus.with_suffix(".moved"))
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--resume", "--dry-run", "--json"])
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    p = json.loads(res.stdout.splitlines()[0])
    assert p["unreadable"] and any(f"{rid}.parquet" in u for u in p["unreadable"]), p["unreadable"]
