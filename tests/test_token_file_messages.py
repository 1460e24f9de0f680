"""Messages about a token file name what was given: a text tokenizer other than the default is named without "the
byte tokenizer is the default" (which read as if ``--tokenizer`` had been ignored), and a ``.npy`` of dtype object
(a list of lists saved by numpy.save) is said to be one, not "truncated or not saved by numpy.save"."""

from __future__ import annotations

import numpy as np
import pytest

from loopscale.model import data as D


def test_a_text_tokenizer_on_a_token_file_is_named(tmp_path):
    f = tmp_path / "ids.npy"
    np.save(f, np.arange(300, dtype=np.uint16))
    with pytest.raises(ValueError, match=r"tokenizer 'bpe:512' cannot read it: give --tokenizer pretokenized") as e:
        D.check_corpus(str(f), "bpe:512", 512)
    assert "default" not in str(e.value)
    with pytest.raises(ValueError, match=r"tokenizer 'byte' cannot read it \(the byte tokenizer is the default\)"):
        D.check_corpus(str(f), "byte", 512)


def test_an_object_npy_is_said_to_be_of_dtype_object(tmp_path):
    f = tmp_path / "ids.npy"
    np.save(f, np.array([[1, 2], [3]], dtype=object), allow_pickle=True)
    with pytest.raises(D.CorpusError, match="is a .npy array of dtype object") as e:
        D.check_corpus(str(f), "pretokenized", 512)
    assert "truncated" not in str(e.value)


@pytest.mark.parametrize(
    "arr, fix",
    [(np.arange(300, dtype=np.int32), "convert it once: np.save(path, np.load(path).astype(np.uint32))"),
     (np.arange(300, dtype=np.int64), "convert it once: np.save(path, np.load(path).astype(np.uint32))"),
     (np.arange(300, dtype=np.int32).reshape(3, 100), "flatten its documents into one array first"),
     (np.arange(300, dtype=np.float32), None)],
)  # fmt: skip
def test_a_token_npy_of_other_whole_numbers_gets_the_conversion(tmp_path, arr, fix):
    """An int32 or int64 array of ids (what np.array(list_of_ints) gives) was refused as not uint16/uint32 without
    saying how to convert it; floats are not ids and get no such line."""
    f = tmp_path / "ids.npy"
    np.save(f, arr)
    with pytest.raises(D.CorpusError, match="must be a 1-D uint16/uint32 array") as e:
        D.check_corpus(str(f), "pretokenized", 512)
    assert (fix in str(e.value)) if fix else ("convert" not in str(e.value) and "flatten" not in str(e.value))
