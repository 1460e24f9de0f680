"""Shared pytest fixtures. Each helper adds fixtures in its own clearly named block; never remove others'."""

from __future__ import annotations

import pytest

# ---- trainer fixtures (helper "trainer": model/data.py, model/train.py) ------------------------------------


def _trainer_words_text(seed: int, n_words: int) -> str:
    """Deterministic pseudo-English: sentences over a small word list with a fixed bigram habit."""
    import random

    words = (
        "the state of union is strong and the people of this nation shall hold fast to liberty while congress "
        "works to pass laws for trade peace war and the common good of every citizen in every land"
    ).split()
    rng = random.Random(seed)
    out, w = [], rng.choice(words)
    for i in range(n_words):
        out.append(w)
        w = words[(words.index(w) + 1) % len(words)] if rng.random() < 0.6 else rng.choice(words)
        if i % 13 == 12:
            out[-1] += "."
    return " ".join(out)


@pytest.fixture(scope="session")
def trainer_corpus_dir(tmp_path_factory):
    """A folder of 24 small text documents (~3 KB each, deterministic) for fast trainer tests."""
    d = tmp_path_factory.mktemp("trainer_corpus")
    for i in range(24):
        (d / f"doc{i:02d}.txt").write_text(_trainer_words_text(i, 500))
    return d


@pytest.fixture(scope="session")
def trainer_cache_dir(tmp_path_factory):
    """A token cache folder shared by the trainer tests of one session."""
    return tmp_path_factory.mktemp("trainer_cache")


# ---- end trainer fixtures -----------------------------------------------------------------------------------


# ---- cluster fixtures (helper "cluster": cluster/, tests/test_elastic.py, tests/test_failure_kinds_cluster.py) --


@pytest.fixture
def sweep_on_cluster(monkeypatch):
    """``run(sim, spec, out_dir, pause_when, on_pause, timeout_s=240, **run_sweep_kwargs) -> (tap, runs_parquet_path)``.

    Runs the real ``loopscale.sweep.run_sweep(spec, out_dir)`` in a background thread on a simulated cluster
    (``loopscale.cluster.simulate.simulated_cluster``), recording every Tune result with the worker node that
    produced it (``ResultTap``). When ``pause_when(row)`` first holds, the trial is held inside ``tune.report``
    and ``on_pause(row)`` runs in the main thread (the only thread where Ray 2.60 can add nodes); then the
    sweep finishes. Errors of the sweep are re-raised here.
    """
    import threading
    import time

    def run(sim, spec, out_dir, pause_when, on_pause, timeout_s: float = 240.0, **run_sweep_kwargs):
        import loopscale.sweep.callbacks as callbacks
        from loopscale.cluster.simulate import ResultTap
        from loopscale.sweep import run_sweep

        tap = ResultTap(sim, pause_when=pause_when)
        real = callbacks._recorder_cls
        monkeypatch.setattr(callbacks, "_recorder_cls", lambda: tap.wrap(real()))
        box: dict = {}

        def target():
            try:
                box["path"] = run_sweep(spec, out_dir, quiet=True, **run_sweep_kwargs)
            except BaseException as e:  # re-raised in the main thread
                box["error"] = e

        th = threading.Thread(target=target, daemon=True)
        th.start()
        try:
            deadline = time.monotonic() + timeout_s
            while not tap.paused.wait(0.2):
                if not th.is_alive():
                    raise AssertionError(
                        f"run_sweep ended before the pause point: {box}; results: {len(tap.rows)}"
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"the sweep never reached the pause point; results seen: {len(tap.rows)}"
                    )
            on_pause(tap.paused_row)
        finally:
            tap.resume()
            th.join(timeout_s)
            tap.close()
        assert not th.is_alive(), "run_sweep did not finish in time"
        if "error" in box:
            raise box["error"]
        return tap, box["path"]

    return run


@pytest.fixture
def s3_offline(monkeypatch):
    """``s3://`` storage out of reach (no network): resolving an s3 URI raises pyarrow's offline OSError; other URIs
    resolve as usual."""
    from loopscale.cluster import storage as st

    real = st.resolve_uri

    def offline(uri, filesystem=None):
        if filesystem is None and uri.startswith("s3://"):
            raise OSError("When resolving region for bucket 'b': AWS Error NETWORK_CONNECTION during HeadBucket")
        return real(uri, filesystem)

    monkeypatch.setattr(st, "resolve_uri", offline)


# ---- sweep-folder fixtures (status and dry-run tests) ---------------------------------------------------------


@pytest.fixture
def half_done(tmp_path):
    """(out, cells): a smoke run directory: spec.yaml, 5 ok runs (2 consolidated, 3 in parts), 1 diverged, 2 failed,
    8 untouched, and a run_meta.json."""
    import json
    import time

    from loopscale.sweep.presets import preset_spec
    from loopscale.sweep.spec import spec_to_yaml
    from loopscale.sweep.store import ResultsStore, failed_record, run_record

    spec = preset_spec("smoke")
    out = tmp_path / "run"
    out.mkdir()
    (out / "spec.yaml").write_text(spec_to_yaml(spec))
    cells = spec.cells()
    store = ResultsStore(out)
    for c in cells[:2]:
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}, finished_at=time.time() - 60))
    store.consolidate()
    for c in cells[2:5]:
        store.write_run(run_record(c, {"status": "ok", "final_val_loss": 3.0}))
    store.write_run(run_record(cells[5], {"status": "diverged"}))
    store.write_run(
        failed_record(cells[6], "Traceback ...\nRuntimeError: out of memory in run 0123456789abcdef")
    )
    store.write_run(failed_record(cells[7], "RuntimeError: out of memory in run fedcba9876543210"))
    (out / "run_meta.json").write_text(json.dumps({"spec_name": "smoke", "stage_wall_s": {"sweep": 125.0}}))
    return out, cells
