"""How user corpora are read: defects a fresh-user trial met (token files read with a text tokenizer, text or
compressed files given as corpus files, Parquet nulls and corrupt shards, BPE asked for more tokens than the text
holds), each now refused naming the file and the fix, or said by a :class:`CorpusWarning`."""

from __future__ import annotations

import gzip
import re
import warnings

import numpy as np
import pytest

from loopscale.model import data as D

PROSE = (
    "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin nuzzled "
    "into his breast in an effort to escape the vile wind, slipped quickly through the glass doors.\n"
)


def _corpus_warnings(fn):
    """(result of ``fn()``, the messages of the CorpusWarnings it gave)."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in rec if issubclass(w.category, D.CorpusWarning)]


# --- a token file with a text tokenizer ------------------------------------------------------------------------


def test_token_file_with_the_byte_tokenizer_is_refused_naming_pretokenized(tmp_path):
    """Token ids below 256 in a .npy read with the default byte tokenizer were trained on and recorded as tokenizer
    'byte', with a bits-per-byte figure that meant nothing. Refused before any compute, by the pre-flight and the
    run, naming --tokenizer pretokenized; with 'pretokenized' the same file is read."""
    from loopscale.model.config import preset_config
    from loopscale.model.train import RunConfig, train_run

    f = tmp_path / "ids.npy"
    np.save(f, (np.arange(4000) % 200).astype(np.uint16))
    said = re.escape(f"token file {str(f)!r} holds token ids, not text, so tokenizer 'byte' cannot read it")
    fix = re.escape("give --tokenizer pretokenized (tokenizer: pretokenized in a spec)")
    for call in (
        lambda: D.load_tokens(str(f), "byte", cache_dir=tmp_path / "c"),
        lambda: D.check_corpus(str(f), "byte", 256),
        lambda: D.check_corpus(str(f), "bpe:512", 512),
    ):
        with pytest.raises(ValueError, match=said.replace("'byte'", "'(byte|bpe:512)'") + ".*" + fix):
            call()
    cfg = RunConfig(
        model=preset_config("cpu", r=1, d_model=16, seq_len=32),
        corpus=str(f),
        tokenizer="byte",
        tokens=256,
        batch_tokens=256,
        cache_dir=str(tmp_path / "c"),
    )
    with pytest.raises(ValueError, match=fix):
        train_run(cfg)
    td = D.load_tokens(str(f), "pretokenized")
    assert td.tokenizer_name == "pretokenized" and td.vocab_size == 200 and td.meta["val_bytes_per_token"] is None


# --- files that are not what their suffix says ------------------------------------------------------------------


def test_text_named_npy_is_refused_as_not_a_npy_file(tmp_path):
    """A text file named .npy gave numpy's "pickled (object) data ... allow_pickle=" without a file name."""
    f = tmp_path / "plain.npy"
    f.write_text(PROSE * 20, encoding="utf-8")
    for call in (lambda: D.load_tokens(str(f), "pretokenized"), lambda: D.check_corpus(str(f), "pretokenized", 512)):
        with pytest.raises(D.CorpusError, match=re.escape(f"{str(f)!r} is not a .npy array file (its bytes look like text)")):
            call()
    f.write_bytes(bytes(range(256)) * 4)  # neither numpy's header nor text
    with pytest.raises(D.CorpusError, match=re.escape("is not a .npy array file (it does not start with numpy's header)")):
        D.load_tokens(str(f), "pretokenized")
    np.save(f, np.arange(100, dtype=np.uint16))
    f.write_bytes(f.read_bytes()[:-20])  # torn: numpy's own error, with the file named
    with pytest.raises(D.CorpusError, match=re.escape(f"token file {str(f)!r} cannot be read as a .npy array")):
        D.load_tokens(str(f), "pretokenized")


def test_text_named_u16_bin_is_refused_as_text_not_token_ids(tmp_path):
    """A text file named .u16.bin was told "set vocab_size to 31330"; doing so trained on text bytes read as uint16
    ids. Now it is refused as text; real uint16 ids, small (every second byte NUL) or large (BPE-like), are read."""
    f = tmp_path / "plain.u16.bin"
    f.write_text(PROSE * 20, encoding="utf-8")
    for call in (lambda: D.load_tokens(str(f), "pretokenized"), lambda: D.check_corpus(str(f), "pretokenized", 65536)):
        with pytest.raises(D.CorpusError, match=re.escape(f"token file {str(f)!r} looks like text, not token ids")):
            call()
    rng = np.random.default_rng(0)
    for ids in (rng.integers(0, 256, 5000), rng.integers(0, 50_000, 5000)):
        ids.astype(np.uint16).tofile(f)
        td = D.load_tokens(str(f), "pretokenized")
        assert np.array_equal(np.concatenate([td.train, td.val]), ids)


def test_compressed_files_are_refused_saying_to_decompress(tmp_path):
    """A gzip file was "most likely a binary file ... not text"; a folder of .gz files was told to "name them in a
    glob to read them as text", which only led to that refusal. Both now say the files are compressed and how to
    decompress them; the decompressed text is read."""
    f = tmp_path / "plain.txt.gz"
    f.write_bytes(gzip.compress((PROSE * 40).encode()))
    said = re.escape(f"corpus file {str(f)!r} is gzip-compressed: decompress it first (gzip -dc {f} > {f.with_suffix('')})")
    for call in (lambda: D.check_corpus(str(f), "byte", 256), lambda: D.load_tokens(str(f), "byte", cache_dir=tmp_path / "c")):
        with pytest.raises(D.CorpusError, match=said):
            call()
    d = tmp_path / "gz"
    d.mkdir()
    for i in range(3):
        (d / f"a{i}.txt.gz").write_bytes(gzip.compress((PROSE * (i + 5)).encode()))
    with pytest.raises(D.CorpusError, match=re.escape("they are compressed (.gz): decompress them to read them as text")) as e:
        D.resolve_corpus(str(d))
    assert f"find '{d}' -name '*.gz' -execdir gunzip -k {{}} \\;" in str(e.value) and "glob" not in str(e.value)
    with pytest.raises(D.CorpusError, match="is gzip-compressed"):  # a glob of them: the same refusal, not "binary"
        D.check_corpus(str(d / "*.gz"), "byte", 256)
    (d / "a0.txt").write_bytes(gzip.decompress((d / "a0.txt.gz").read_bytes()))  # one decompressed beside them
    _, said = _corpus_warnings(lambda: D.resolve_corpus(str(d)))
    assert len(said) == 1 and said[0].startswith("ignored 3 files (.gz)") and "decompress them" in said[0], said
    for name in ("x.u16.bin", "x.npy"):  # a compressed token file
        (tmp_path / name).write_bytes(gzip.compress(np.arange(500, dtype=np.uint16).tobytes()))
        with pytest.raises(D.CorpusError, match=re.escape(f"{name}' is gzip-compressed")):
            D.load_tokens(str(tmp_path / name), "pretokenized")


# --- Parquet ----------------------------------------------------------------------------------------------------


def test_parquet_rows_with_a_null_text_are_counted_in_a_warning(tmp_path):
    """10 of 20 rows with a null text were dropped without a word; the run now says how many, and so does every
    later run on the cached tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [None if i % 2 else f"row {i}: " + PROSE for i in range(20)]
    f = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": texts}), f, row_group_size=7)
    want = f"Parquet file {str(f)!r}: 10 of 20 rows have a null 'text' and are left out"
    td, said = _corpus_warnings(lambda: D.load_tokens(str(f), "byte", cache_dir=tmp_path / "c"))
    assert [m for m in said if m.startswith(want)] == [said[0]] and len(said) == 1, said
    assert td.meta["n_train_docs"] + td.meta["n_val_docs"] == 10 and td.meta["warnings"] == said
    again, said_again = _corpus_warnings(lambda: D.load_tokens(str(f), "byte", cache_dir=tmp_path / "c"))
    assert not again.built and said_again == said


def test_the_preflight_and_dry_run_count_null_text_rows_from_the_footer(tmp_path, monkeypatch):
    """The runs said how many rows had a null text, but the pre-flight check and `run --dry-run` did not (a small
    corpus tokenized by the pre-flight had its warnings set aside for the runs). The Parquet footers' null counts
    now give the runs' warning, word for word, before anything trains; a file without nulls says nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopscale.sweep.presets import preset_spec

    texts = [None if i % 4 == 0 else f"row {i}: " + PROSE for i in range(20)]
    f = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": texts}), f, row_group_size=7)
    want = f"Parquet file {str(f)!r}: 5 of 20 rows have a null 'text' and are left out"
    _, said = _corpus_warnings(lambda: D.check_corpus(str(f), "byte", 256, seq_len=32, cache_dir=tmp_path / "c"))
    assert len(said) == 1 and said[0].startswith(want), said
    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "c"))  # the runs' default token cache
    spec = preset_spec("smoke").model_copy(update={"corpus": str(f)})
    corpus_notes, _ = spec._data_notes()
    assert corpus_notes == said
    _, built = _corpus_warnings(lambda: D.load_tokens(str(f), "byte", cache_dir=tmp_path / "c2"))
    assert built == said  # the runs' own words
    clean = tmp_path / "clean.parquet"
    pq.write_table(pa.table({"text": [f"row {i}: " + PROSE for i in range(20)]}), clean)
    _, said = _corpus_warnings(lambda: D.check_corpus(str(clean), "byte", 256, seq_len=32, cache_dir=tmp_path / "c"))
    assert said == []
    # a nested column before the text (two Parquet leaf columns, one Arrow field): the text's own statistics are
    # read, not those of the nested column's second leaf (its 15 nulls were counted as null texts)
    nested = tmp_path / "nested.parquet"
    meta = [{"a": 1, "b": None if i % 4 else 2} for i in range(20)]
    pq.write_table(pa.table({"meta": meta, "text": texts}), nested, row_group_size=7)
    _, said = _corpus_warnings(lambda: D.check_corpus(str(nested), "byte", 256, seq_len=32, cache_dir=tmp_path / "c"))
    assert len(said) == 1 and said[0].startswith(f"Parquet file {str(nested)!r}: 5 of 20 rows have a null 'text'"), said


def test_a_corrupt_parquet_shard_is_named(tmp_path):
    """A truncated Parquet file, alone or one shard among good ones, gave pyarrow's "Parquet magic bytes not found
    in footer" without the file's name; the message now names it and says what to do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "shards"
    d.mkdir()
    for i in range(4):
        pq.write_table(pa.table({"text": [f"shard {i} row {j}. " + PROSE for j in range(30)]}), d / f"part{i}.parquet")
    bad = d / "part2.parquet"
    bad.write_bytes(bad.read_bytes()[:-100])
    said = re.escape(f"Parquet file {str(bad)!r} cannot be read: ") + ".*" + re.escape("truncated or corrupt")
    for corpus in (str(d), str(bad), str(d / "*.parquet")):
        with pytest.raises(D.CorpusError, match=said):
            D.resolve_corpus(corpus)
        with pytest.raises(D.CorpusError, match=said):
            D.check_corpus(corpus, "byte", 256)


# --- BPE asked for more tokens than the text holds --------------------------------------------------------------


def test_bpe_on_few_distinct_words_says_the_vocabulary_it_supports(tmp_path):
    """bpe:100000 on a corpus of a few distinct words learned 69 merges without a word, and the model carried ~100k
    unused embedding rows. The build now warns with the merges learned and the vocabulary the text supports, and
    every later run on the cached tokens says it too; a vocabulary the text fills gives no such warning."""
    f = tmp_path / "few_words.txt"
    f.write_text("the cat sat on the mat and the dog ran to the cat\n" * 200, encoding="utf-8")
    td, said = _corpus_warnings(lambda: D.load_tokens(str(f), "bpe:5000", cache_dir=tmp_path / "c"))
    learned = td.tokenizer._tok.get_vocab_size()
    merges = td.meta["bpe_training"]["merges"]
    assert learned == merges + 257 and 257 < learned < 400 and td.vocab_size == 5000
    want = (
        f"BPE (bpe:5000) learned {merges} merges from the training text ({td.meta['bpe_training']['bytes']} bytes): "
        f"it supports a vocabulary of {learned} tokens, not 5000, so {5000 - learned} of the model's 5000 embedding "
        f"rows are never trained"
    )
    assert len(said) == 1 and said[0].startswith(want) and said[0].endswith(f"give tokenizer bpe:{learned} (or a larger corpus)")
    assert td.meta["warnings"] == said
    again, said_again = _corpus_warnings(lambda: D.load_tokens(str(f), "bpe:5000", cache_dir=tmp_path / "c"))
    assert not again.built and said_again == said
    _, said_fits = _corpus_warnings(lambda: D.load_tokens(str(f), f"bpe:{learned}", cache_dir=tmp_path / "c"))
    assert said_fits == []


# --- a document split that holds out most of the corpus -----------------------------------------------------------


def _folder(path, files: dict[str, str]):
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text, encoding="utf-8")
    return path


def test_a_document_split_holding_out_too_much_falls_back_to_the_token_tail(tmp_path, monkeypatch):
    """A folder of a 113 kB book whose name hashes to validation and a 4.6 kB note was split by document: 96 % of
    its tokens held out, 4604 left to train on, with only an epochs warning. A document split whose validation
    documents hold more than twice the intended 5 % of the bytes now falls back to the token tail (as a corpus of one
    file is split), says so in every run's warnings, and BPE learns only from the text before that tail. The rule is
    in the corpus hash: a token cache or output folder of the earlier document split is never taken for this one,
    while a folder whose document split is balanced keeps its hash and split."""
    from loopscale.sweep.presets import preset_spec
    from loopscale.sweep.spec import FOLDER_CORPUS, check_folder_corpus

    assert D.is_validation_doc("book41.txt") and not D.is_validation_doc("notes.txt")
    c = _folder(tmp_path / "c", {"book41.txt": PROSE * 530, "notes.txt": PROSE[:230] * 20})
    files = sorted(c.iterdir())
    share = (c / "book41.txt").stat().st_size / sum(f.stat().st_size for f in files)
    assert share > 0.95
    td, said = _corpus_warnings(lambda: D.load_tokens(str(c), "byte", cache_dir=tmp_path / "cache"))
    n = len(td.train) + len(td.val)
    assert td.meta["split_rule"] == "token tail 0.05" and len(td.val) == round(0.05 * n) == td.meta["n_val_tokens"]
    assert td.meta["n_train_docs"] == 2 and td.meta["n_val_docs"] == 0
    assert said == td.meta["warnings"] and len(said) == 1
    assert said[0].startswith(
        f"corpus {str(c)!r}: its 1 validation-named document of 2 holds {share:.0%} of its bytes (more than 10%"
    ) and "the last 5% of the tokens are validation" in said[0] and "use a new --out folder" in said[0]
    bpe = D.load_tokens(str(c), "bpe:300", cache_dir=tmp_path / "cache")
    assert bpe.meta["bpe_training"]["split"] == "position" and bpe.meta["split_rule"] == "token tail 0.05"
    assert bpe.meta["bpe_training"]["bytes"] < 0.96 * n  # not the validation tail
    # the hash an earlier loopscale recorded for this corpus (split by document) is not this one's: refused
    earlier = D._hash_files(files, "text|text")
    assert td.meta["corpus_hash"] != earlier
    out = tmp_path / "out"
    out.mkdir()
    (out / FOLDER_CORPUS).write_text(f'{{"corpus_sha256": "{earlier}"}}')
    (out / "lr_table.parquet").write_bytes(b"x")  # tuned on the old text
    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="is not the one"):
        check_folder_corpus(out, preset_spec("smoke").model_copy(update={"corpus": str(c)}))
    # a balanced folder (2 of 40 equal files are validation-named: 5 %) is split by document, its hash unchanged
    names = [f"d{i}.txt" for i in range(40)]
    assert sum(D.is_validation_doc(x) for x in names) == 2
    b = _folder(tmp_path / "b", {x: PROSE for x in names})
    src = D.resolve_corpus(str(b))
    assert src.skewed_val_share is None and src.corpus_hash == D._hash_files(src.files, "text|text")
    tb, said_b = _corpus_warnings(lambda: D.load_tokens(str(b), "byte", cache_dir=tmp_path / "cache"))
    assert tb.meta["split_rule"] == "document" and tb.meta["n_val_docs"] == 2 and said_b == []
    # a third file on the training side brings the held-out share under 10 %: split by document again
    (c / "essay.txt").write_text(PROSE * 5000, encoding="utf-8")
    assert not D.is_validation_doc("essay.txt")
    tc = D.load_tokens(str(c), "byte", cache_dir=tmp_path / "cache")
    assert tc.meta["split_rule"] == "document" and tc.meta["n_val_docs"] == 1 and tc.meta["warnings"] == []


def test_a_folder_whose_validation_documents_hold_too_little_is_split_by_position(tmp_path):
    """Nine chapters and one short validation-named note: the document split validated on the note alone (67
    tokens, the loss measuring a blurb), or, for a 17-byte note, refused every run with "the validation token stream
    (17 tokens) is shorter than one window ... use a shorter seq_len or a larger corpus", neither of which was the
    cause. Under 1 % of the bytes is now split by position, with the warning saying why."""
    assert D.is_validation_doc("about.md") and not any(D.is_validation_doc(f"chapter{i:02d}.txt") for i in range(1, 10))
    files = {f"chapter{i:02d}.txt": PROSE * 40 for i in range(1, 10)}
    c = _folder(tmp_path / "c", {**files, "about.md": "About this book."})
    share = len("About this book.") / sum(f.stat().st_size for f in c.iterdir())
    assert share < 0.01
    td, said = _corpus_warnings(lambda: D.load_tokens(str(c), "byte", cache_dir=tmp_path / "cache"))
    n = len(td.train) + len(td.val)
    assert td.meta["split_rule"] == "token tail 0.05" and len(td.val) == round(0.05 * n)
    assert len(said) == 1 and said[0].startswith(
        f"corpus {str(c)!r}: its 1 validation-named document of 10 holds {share:.2%} of its bytes (less than 1%; the "
        "document split holds out about 5%): split by position instead"
    ) and said[0].endswith("(or add files so the document split holds out more)"), said
    # a validation note of 2 % of the bytes stays a document split
    (c / "about.md").write_text(PROSE * 7, encoding="utf-8")
    share = (c / "about.md").stat().st_size / sum(f.stat().st_size for f in c.iterdir())
    assert 0.01 < share < 0.1
    assert D.load_tokens(str(c), "byte", cache_dir=tmp_path / "cache").meta["split_rule"] == "document"


def test_a_parquet_corpus_of_few_rows_is_weighed_by_its_rows_text(tmp_path):
    """Parquet rows are documents: a few rows whose validation-named ones hold most of the text are split by
    position too; the row sizes are read from the text column (a null row weighs nothing)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "few.parquet"
    names = [f"few.parquet:{i}" for i in range(6)]
    val = [D.is_validation_doc(x) for x in names]
    assert any(val) and not all(val)
    texts = [PROSE * (40 if v else 1) for v in val]
    texts[next(i for i, v in enumerate(val) if not v)] = None
    pq.write_table(pa.table({"text": texts}), f)
    src = D.resolve_corpus(str(f))
    sizes = src.doc_bytes()
    assert sizes == [len(t.encode()) if t else 0 for t in texts]
    assert src.skewed_val_share == pytest.approx(sum(s for s, v in zip(sizes, val, strict=True) if v) / sum(sizes))
    td = D.load_tokens(str(f), "byte", cache_dir=tmp_path / "cache")
    assert td.meta["split_rule"] == "token tail 0.05"


def test_a_folder_started_before_the_position_split_names_that_rule_when_refused(tmp_path, monkeypatch):
    """An output folder started on a corpus that this loopscale splits by position (its validation-named file holds
    96 % of the text) recorded the hash of the document split: refused, naming the split rule as a cause beside
    changed names or bytes; a balanced corpus's refusal does not name it."""
    from loopscale.sweep.presets import preset_spec
    from loopscale.sweep.spec import FOLDER_CORPUS, check_folder_corpus

    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "cache"))
    c = _folder(tmp_path / "c", {"book41.txt": PROSE * 530, "notes.txt": PROSE[:230] * 20})
    b = _folder(tmp_path / "b", {f"d{i}.txt": PROSE for i in range(40)})
    for corpus, named in ((c, True), (b, False)):
        out = tmp_path / f"out_{corpus.name}"
        out.mkdir()
        (out / FOLDER_CORPUS).write_text(f'{{"corpus_sha256": "{D._hash_files(sorted(corpus.iterdir()), "x")}"}}')
        (out / "lr_table.parquet").write_bytes(b"x")  # tuned on the old text
        with pytest.raises(ValueError, match="its files' names or bytes changed since") as e:
            check_folder_corpus(out, preset_spec("smoke").model_copy(update={"corpus": str(corpus)}))
        assert ("split this corpus by document; this one splits it by position" in str(e.value)) == named


def test_a_cached_corpus_warning_is_said_once_under_the_name_given_now(tmp_path, monkeypatch):
    """The token cache is keyed by content and recorded its warnings with the name of the run that built it
    (``fewbad.txt``, relative); a spec naming the same file as ``/abs/fewbad.txt`` then got every warning twice,
    once under each name. The cached warnings now name the file as given now, and each is said once."""
    text = ("Plain English prose about looped models. " * 200).encode()
    (tmp_path / "fewbad.txt").write_bytes(text + b"\xff\xfe more text \x00 end")
    cache = tmp_path / "cache"
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        D.check_corpus("fewbad.txt", "byte", 256, seq_len=32, cache_dir=cache)
    assert any("corpus file 'fewbad.txt' is not valid UTF-8" in str(w.message) for w in first)
    absolute = str(tmp_path / "fewbad.txt")
    with warnings.catch_warnings(record=True) as second:
        warnings.simplefilter("always")
        D.check_corpus(absolute, "byte", 256, seq_len=32, cache_dir=cache)
    said = [str(w.message) for w in second if issubclass(w.category, D.CorpusWarning)]
    assert len(said) == 2 and len(set(said)) == 2, said  # invalid UTF-8, NUL: once each
    assert all(f"corpus file {absolute!r}" in m for m in said) and not any("'fewbad.txt'" in m for m in said), said


def test_a_large_corpus_of_only_whitespace_is_refused_before_any_run(tmp_path):
    """A text corpus over the size the dry run tokenizes (1 MiB) that held only whitespace passed `run --dry-run`;
    the real run then started Ray and failed every run. The UTF-8 check, which reads every byte anyway, now sees
    that no file holds text; a folder where one file holds text is read (its blank files are no documents)."""
    d = tmp_path / "c"
    d.mkdir()
    (d / "a.txt").write_bytes(b" \n\t\r " * (1 << 18) + b"\x00")  # 1.25 MiB, one NUL (dropped, warned)
    (d / "b.txt").write_bytes(b"")
    assert (d / "a.txt").stat().st_size > D.TOKENIZE_TO_CHECK_BYTES
    with pytest.raises(D.CorpusContentError, match=r"holds no text: each of its 2 files is empty or only whitespace"):
        D.check_corpus(str(d), "byte", 256)
    with pytest.raises(D.CorpusContentError, match="its file is empty or only whitespace"):
        D.check_corpus(str(d / "a.txt"), "byte", 256)
    (d / "c.txt").write_text("One short document of real prose. " * 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        D.check_corpus(str(d), "byte", 256)
    # the blank files are said, not left out without a word
    blank = [str(w.message) for w in seen if "no text (empty" in str(w.message)]
    assert len(blank) == 1 and "2 of its 3 text files hold no text" in blank[0], blank
    assert repr(str(d / "a.txt")) in blank[0] and repr(str(d / "b.txt")) in blank[0] and "c.txt" not in blank[0]
    # blank as the reader sees it: a BOM alone, or Unicode spaces (no-break, ideographic), are no text either
    for name, raw in (("bom.txt", b"\xef\xbb\xbf \n"), ("nbsp.txt", "\u00a0\u3000\n".encode() * 1000)):
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(D.CorpusContentError, match="its file is empty or only whitespace"):
            D.check_corpus(str(tmp_path / name), "byte", 256)


def test_cached_warnings_rename_each_file_once():
    """The old -> new names were applied one after another: a file named now as another file was named before got
    renamed twice ('x/a.txt' -> 'x/b.txt' -> 'x/c.txt')."""
    meta = {"warnings": ["corpus file 'x/a.txt' is bad", "corpus file 'x/b.txt' too"], "files": ["x/a.txt", "x/b.txt"]}
    assert D._cached_warnings(meta, ["x/b.txt", "x/c.txt"]) == ["corpus file 'x/b.txt' is bad",
                                                                 "corpus file 'x/c.txt' too"]  # fmt: skip


def test_a_missing_relative_corpus_names_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    """'corpus file 'txtdir' does not exist' did not say from where a relative path is taken; a spec (which makes
    its corpus absolute) did not say that it is the working directory, not the spec's folder. A glob matching only
    folders said it 'matches no file' with no hint that a folder is a corpus of its own."""
    from loopscale.sweep.spec import SpecError, parse_spec

    (tmp_path / "txtdir").mkdir()
    (tmp_path / "txtdir" / "a.txt").write_text("Prose. " * 100)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(D.CorpusNotFoundError, match=f"taken from the working directory, {elsewhere}"):
        D.check_corpus("txtdir", "byte", 256)
    with pytest.raises(D.CorpusNotFoundError) as e:
        D.check_corpus(str(tmp_path / "txtdir" / "nothere.txt"), "byte", 256)
    assert "working directory" not in str(e.value)  # an absolute path needs no such note
    spec = parse_spec({"name": "s", "model": {"preset": "cpu", "seq_len": 32}, "r": [1, 2], "sizes": [16],
                       "tokens": [2048], "corpus": "txtdir"})  # fmt: skip
    with pytest.raises(SpecError, match=f"in a spec, 'txtdir', is taken from the working directory, {elsewhere}, not "
                                        "from the spec's folder"):  # fmt: skip
        spec.check_data()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(D.CorpusNotFoundError, match=r"matches only folders \('txtdir'\): give a folder itself"):
        D.check_corpus("txtd*", "byte", 256)


def test_a_parquet_corpus_of_empty_or_null_text_is_refused_from_its_footers(tmp_path):
    """A Parquet corpus whose text column held only empty strings passed `run --dry-run` (over 1 MiB it is not
    tokenized there) and every run failed; the footers' statistics (max value '', or every value null) tell it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [""] * 3000, "blob": ["x" * 400] * 3000}), tmp_path / "empty.parquet")
    pq.write_table(pa.table({"text": pa.array([None] * 50, pa.string())}), tmp_path / "null.parquet")
    for name in ("empty.parquet", "null.parquet"):
        with pytest.raises(D.CorpusContentError, match="holds no text: every value of its text column 'text' is "
                                                       "null or the empty string"):  # fmt: skip
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                D.check_corpus(str(tmp_path / name), "byte", 256)
    pq.write_table(pa.table({"text": [""] * 2999 + ["One document of prose. " * 20]}), tmp_path / "one.parquet")
    D.check_corpus(str(tmp_path / "one.parquet"), "byte", 256)  # one row of text: read
    with pytest.raises(D.CorpusError, match="holds no text"):  # a folder of them: refused only when every file is
        D.check_corpus(str(tmp_path / "*mpty.parquet"), "byte", 256)


def test_a_parquet_file_large_for_another_column_is_checked_by_its_text_columns_size(tmp_path):
    """A 1.8 MB Parquet file whose text column held 60 short titles (about 1.5 KB) was too large for the cheap
    pre-flight (it weighed the file), so `run --dry-run` said nothing and every trial later warned that 96 of its
    2,048 eval tokens were there. The pre-flight now weighs the text column (from the footer): it counts the
    tokens of such a file, and still leaves a large text column to the runs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    titles = [f"A short title number {i} about trade and peace." for i in range(60)]
    blobs = [rng.bytes(40_000).hex() for _ in range(60)]  # 80 KB of hex text per row: 4.8 MB, little compression
    f = tmp_path / "content.parquet"
    pq.write_table(pa.table({"title": titles, "content": blobs}), f)
    assert f.stat().st_size > D.TOKENIZE_TO_CHECK_BYTES
    assert D._parquet_text_bytes([f], "title", -1) < 5_000
    split = D.split_tokens_if_cheap(str(f), "byte", text_column="title", cache_dir=tmp_path / "cache")
    assert split is not None and split.train + split.val == sum(len(t) + 1 for t in titles)
    assert D.split_tokens_if_cheap(str(f), "byte", text_column="content", cache_dir=tmp_path / "cache") is None


def test_a_symlinked_folder_in_a_corpus_directory_is_said_not_followed(tmp_path):
    """A symbolic link to a folder inside a corpus directory was skipped without a word (a linked file is read):
    its files are not part of the corpus (following links would change existing corpora's content hash), and a
    warning now names it with the glob that does read it."""
    words = "the people of this nation shall hold fast to liberty and the common good. " * 400
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text(words)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "b.txt").write_text(words)
    (tmp_path / "c" / "more").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = D._expand(str(tmp_path / "c"), warn=True)
    assert files == [tmp_path / "c" / "a.txt"]
    said = [str(w.message) for w in caught if "symbolic link" in str(w.message)]
    assert said == [f"corpus directory {str(tmp_path / 'c')!r} holds 1 symbolic link to a folder (more), not "
                    f"followed: the files there are not read (a glob follows them, e.g. '{tmp_path / 'c' / 'more'}/**/*.txt'; "
                    "or copy the folder in)"]  # fmt: skip
    import glob

    assert str(tmp_path / "c" / "more" / "b.txt") in glob.glob(f"{tmp_path / 'c' / 'more'}/**/*.txt", recursive=True)
    (tmp_path / "c" / "more").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        D._expand(str(tmp_path / "c"), warn=True)
    assert not [w for w in caught if "symbolic link" in str(w.message)]


def test_a_broken_symbolic_link_in_a_corpus_is_said(tmp_path):
    """A symbolic link whose target does not exist, in a corpus directory or matched by a glob, was left out
    without a word (the corpus had one document fewer). It is named, with its target; a corpus without one says
    nothing of links."""
    words = "the people of this nation shall hold fast to liberty and the common good. " * 400
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text(words)
    (tmp_path / "c" / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    for corpus in (str(tmp_path / "c"), str(tmp_path / "c" / "*.txt")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert D._expand(corpus, warn=True) == [tmp_path / "c" / "a.txt"]
        said = [str(w.message) for w in caught if "symbolic link" in str(w.message)]
        assert said == [f"corpus {corpus!r} holds 1 symbolic link whose target does not exist (gone.txt -> "
                        f"{tmp_path / 'nowhere.txt'}): not read; fix or remove it"], said  # fmt: skip
    (tmp_path / "c" / "gone.txt").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        D._expand(str(tmp_path / "c"), warn=True)
    assert not [w for w in caught if "symbolic link" in str(w.message)]
