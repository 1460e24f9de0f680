"""The command a compressed corpus file's refusal names works whatever the file's suffix: ``gunzip -k gz.txt``
refused the file ("unknown suffix -- ignored") and ``bunzip2 -k x.txt`` wrote ``x.txt.out``. Each suggested command
is run here, and the file it writes is read as the text that was compressed. A directory's ``find`` command
decompresses each file beside itself (``unzip`` under ``-exec`` wrote into the working directory).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import shutil
import subprocess
import zipfile

import pytest

from loopscale.model import data as D

TEXT = "Plain English prose, compressed by mistake. " * 40

COMPRESS = {
    "gzip": lambda b, p: p.write_bytes(gzip.compress(b)),
    "bzip2": lambda b, p: p.write_bytes(bz2.compress(b)),
    "xz": lambda b, p: p.write_bytes(lzma.compress(b)),
    "zstd": lambda b, p: subprocess.run(["zstd", "-q", "-o", str(p), "-"], input=b, check=True),
    "zip": lambda b, p: zipfile.ZipFile(p, "w").writestr("inner.txt", b),
}
TOOL = {"gzip": "gzip", "bzip2": "bzip2", "xz": "xz", "zstd": "zstd", "zip": "unzip"}


@pytest.mark.parametrize("name", ["data file.txt", "x.txt"])
@pytest.mark.parametrize("fmt", list(COMPRESS))
def test_the_suggested_command_decompresses_a_file_with_a_text_suffix(tmp_path, fmt, name):
    if shutil.which(TOOL[fmt]) is None or (fmt == "zstd" and shutil.which("zstd") is None):
        pytest.skip(f"{TOOL[fmt]} is not installed")
    f = tmp_path / name
    COMPRESS[fmt](TEXT.encode(), f)
    with pytest.raises(D.CorpusError, match=f"is {fmt}-compressed") as e:
        D.check_corpus(str(f), "byte", 256)
    cmd = re.search(r"decompress it first \((.*)\) and give the decompressed", str(e.value)).group(1)
    out = D._decompressed_path(f, fmt)  # before the command: then it is a name that exists
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, (cmd, r.stderr)
    got = (out / "inner.txt").read_text() if fmt == "zip" else out.read_text()
    assert got == TEXT and out != f and f.exists()
    # the original stays beside the new file: a folder or glob corpus would read it and refuse it again
    assert "in a folder or glob corpus, also move the compressed file out of it" in str(e.value)


def test_a_directory_of_zip_files_is_decompressed_beside_them(tmp_path):
    if shutil.which("unzip") is None:
        pytest.skip("unzip is not installed")
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    COMPRESS["zip"](TEXT.encode(), d / "sub" / "a.zip")
    with pytest.raises(D.CorpusError, match="they are compressed") as e:
        D.resolve_corpus(str(d))
    cmd = re.search(r"\((find .*?\\;)\)", str(e.value)).group(1)
    assert subprocess.run(cmd, shell=True, cwd=tmp_path, capture_output=True).returncode == 0
    assert (d / "sub" / "inner.txt").read_text() == TEXT and not (tmp_path / "inner.txt").exists()


@pytest.mark.parametrize("fmt", ["gzip", "bzip2", "xz", "zip"])
def test_the_suggested_command_never_replaces_a_file_beside_it(tmp_path, fmt):
    """``notes.txt.gz`` beside the user's own ``notes.txt``: the advice was ``gzip -dc notes.txt.gz > notes.txt``,
    which replaced it. The command now writes a name that is free (``notes.plain.txt``), and leaves both alone."""
    if shutil.which(TOOL[fmt]) is None:
        pytest.skip(f"{TOOL[fmt]} is not installed")
    own = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz", "zip": ".zip"}[fmt]
    mine = tmp_path / ("notes" if fmt == "zip" else "notes.txt")
    if fmt == "zip":
        mine.mkdir()
        (mine / "inner.txt").write_text("my precious notes")
    else:
        mine.write_text("my precious notes")
    f = tmp_path / f"{mine.name}{own}"
    COMPRESS[fmt](TEXT.encode(), f)
    with pytest.raises(D.CorpusError, match=f"is {fmt}-compressed") as e:
        D.check_corpus(str(f), "byte", 256)
    cmd = re.search(r"decompress it first \((.*)\) and give the decompressed", str(e.value)).group(1)
    out = D._decompressed_path(f, fmt)
    assert str(out) in cmd and not out.exists()
    assert subprocess.run(cmd, shell=True, capture_output=True, cwd="/").returncode == 0, cmd
    assert out != mine and out.exists() and f.exists()
    assert ((mine / "inner.txt") if fmt == "zip" else mine).read_text() == "my precious notes"
    got = (out / "inner.txt").read_text() if fmt == "zip" else out.read_text()
    assert got == TEXT
