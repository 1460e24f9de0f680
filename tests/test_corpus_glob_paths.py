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
