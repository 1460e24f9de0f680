"""The dry run's ``corpus_warning`` and the pre-flight say the corpus warnings the runs give.

A text file with a few invalid UTF-8 bytes, and ``bpe:600`` on a corpus that supports fewer tokens, made every run
warn (the invalid bytes replaced, the embedding rows never trained), while ``--dry-run`` (which tokenizes a corpus of
at most 1 MiB into the token cache) said ``corpus_warning: None``. NUL bytes under the refusal limit were dropped
without a word (100 NUL bytes, 100 fewer tokens): now counted in a warning, like invalid bytes.
"""

from __future__ import annotations

import json
import random
import warnings

import pytest
from typer.testing import CliRunner

from loopscale.model.data import CorpusWarning, load_tokens
from loopscale.sweep.cli import app
from loopscale.sweep.spec import parse_spec


@pytest.fixture
def cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("LOOPSCALE_CACHE", str(cache))
    return cache


def _words(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    vocab = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "lambda", "zeta"]
    return " ".join(rng.choice(vocab) for _ in range(n))


def _spec(corpus, tokenizer="byte"):
    return parse_spec({
        "name": "t", "corpus": str(corpus), "tokenizer": tokenizer, "model": {"preset": "cpu", "seq_len": 32},
        "r": [1, 2], "sizes": [16], "tokens": [2048, 4096, 8192, 16384],
        "training": {"batch_tokens": 256, "eval_tokens": 256}, "lr": {"fixed": 0.01}, "resources": {"cpus": 1},
    })  # fmt: skip


def _dry_run(tmp_path, spec) -> dict:
    from loopscale.sweep.spec import spec_to_yaml

    (tmp_path / "s.yaml").write_text(spec_to_yaml(spec))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "--dry-run", "--json", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_invalid_bytes_and_nul_bytes_are_said_by_the_dry_run_and_the_pre_flight(tmp_path, cache):
    f = tmp_path / "bad.txt"
    f.write_bytes(_words(4000).encode() + b"\xff\xfe" + b"x" * 10 + b"\xc3" + b" end" + b"\x00" * 100 + b"tail")
    p = _dry_run(tmp_path, _spec(f))
    note = p["corpus_warning"] or ""
    assert "not valid UTF-8: 3 invalid byte sequence(s)" in note, note
    assert "holds 100 NUL byte(s)" in note, note
    # the pre-flight says them as warnings, also on a second check (the file was checked in this process)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _spec(f).check_data()
        said = [str(w.message) for w in caught if issubclass(w.category, CorpusWarning)]
        assert any("3 invalid byte sequence(s)" in m for m in said), said
        assert any("100 NUL byte(s)" in m for m in said), said
    # and the runs give the same messages (kept in the token cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = load_tokens(str(f), "byte")
    assert any("100 NUL byte(s)" in str(w.message) for w in caught)
    assert any("100 NUL byte(s)" in m for m in data.meta["warnings"])


def test_bpe_that_learns_fewer_merges_is_said_by_the_dry_run(tmp_path, cache):
    f = tmp_path / "small.txt"
    f.write_text(_words(30000))
    spec = _spec(f, tokenizer="bpe:600")
    for _ in range(2):  # tokenized by the first dry run, read from the token cache by the second
        note = _dry_run(tmp_path, spec)["corpus_warning"] or ""
        assert "BPE (bpe:600) learned" in note and "embedding rows are never trained" in note, note


def test_a_vocabulary_far_above_a_token_files_ids_is_said_by_the_dry_run(tmp_path, cache):
    """A token file with ids up to 126 and the preset's vocab_size 256: every run recorded the warning in its
    `warnings`, but neither the dry run nor the pre-flight said it (the spec's check knew no largest id)."""
    import numpy as np

    f = tmp_path / "ids.npy"
    np.save(f, (np.arange(60000) % 127).astype(np.uint16))
    note = _dry_run(tmp_path, _spec(f, tokenizer="pretokenized"))["corpus_warning"] or ""
    assert "vocab_size=256 is 129 rows more than the token file needs (its largest id is 126)" in note, note
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _spec(f, tokenizer="pretokenized").check_data()
    assert any("129 rows more than the token file needs" in str(w.message) for w in caught)
    np.save(f, (np.arange(60000) % 250).astype(np.uint16))  # ids up to 249: the vocabulary fits, no note
    assert _dry_run(tmp_path, _spec(f, tokenizer="pretokenized"))["corpus_warning"] is None
