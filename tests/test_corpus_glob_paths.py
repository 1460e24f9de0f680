"""A corpus path holding glob characters: a path that exists is read as that file or directory even when its name
holds ``[``, ``]`` or ``?`` (it used to be taken as a pattern: ``notes[v2].txt`` "matched no file", ``what?.txt`` also
read ``whatX.txt``); a glob that matches nothing says how to escape them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopscale.model.data import CorpusNotFoundError, _expand, glob_root, is_corpus_glob, resolve_corpus

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def test_an_existing_path_with_glob_characters_is_that_file(tmp_path):
    (tmp_path / "notes[v2].txt").write_text(TEXT)
    (tmp_path / "whatX.txt").write_text("other text " * 50)
    (tmp_path / "what?.txt").write_text(TEXT)
    assert _expand(str(tmp_path / "notes[v2].txt")) == [tmp_path / "notes[v2].txt"]
    assert _expand(str(tmp_path / "what?.txt")) == [tmp_path / "what?.txt"]  # not whatX.txt too
    assert not is_corpus_glob(str(tmp_path / "what?.txt"))
    assert resolve_corpus(str(tmp_path / "notes[v2].txt")).files == [tmp_path / "notes[v2].txt"]
    # a pattern that exists nowhere is still a glob
    assert is_corpus_glob(str(tmp_path / "wha?X.txt"))
    assert _expand(str(tmp_path / "wha?X.txt")) == [tmp_path / "whatX.txt"]


def test_a_glob_that_matches_nothing_says_how_to_escape_brackets(tmp_path):
    with pytest.raises(CorpusNotFoundError, match=r"matches no file \(in a glob, '\[' starts .*'\[\[\]'") as e:
        _expand(str(tmp_path / "notes[v3].txt"))
    assert repr(str(tmp_path / "notes[[]v3].txt")) in str(e.value)
    # the example escapes '[' and '?' only: a '*' the user meant as a wildcard stays one
    with pytest.raises(CorpusNotFoundError) as e:
        _expand(str(tmp_path / "v[2]" / "*.txt"))
    assert repr(str(tmp_path / "v[[]2]" / "*.txt")) in str(e.value)
    with pytest.raises(CorpusNotFoundError, match="matches no file$"):
        _expand(str(tmp_path / "*.nothing"))


def test_glob_root():
    assert glob_root("/a/b/**/*.md") == Path("/a/b")
    assert glob_root("/a/b/*") == Path("/a/b")
    assert glob_root("/a/b[0]/c/*.txt") == Path("/a")
    assert glob_root("*.txt") == Path(".")


def test_a_folder_of_parquet_shards_and_a_readme_names_the_glob_that_reads_the_shards(tmp_path):
    """A downloaded dataset folder holds its Parquet shards and a README.txt: "mixes file kinds" said to give one
    kind, not how; the message names the glob of its shards (top level, or below it)."""
    import pandas as pd

    from loopscale.model.data import CorpusError

    top = tmp_path / "ds"
    top.mkdir()
    pd.DataFrame({"text": ["some text " * 50] * 4}).to_parquet(top / "train-0.parquet")
    (top / "README.txt").write_text("a dataset card")
    with pytest.raises(CorpusError, match=r"give one kind per corpus, e\.g\. '.*ds/\*\.parquet' for its Parquet files"):
        resolve_corpus(str(top))
    resolve_corpus(str(top / "*.parquet"))  # the glob it names reads the shards
    (top / "data").mkdir()
    (top / "train-0.parquet").rename(top / "data" / "train-0.parquet")
    with pytest.raises(CorpusError, match=r"e\.g\. '.*ds/\*\*/\*\.parquet' for its Parquet files"):
        resolve_corpus(str(top))
    resolve_corpus(str(top / "**" / "*.parquet"))
