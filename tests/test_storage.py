"""loopscale.cluster.storage: the same API over a local path, file:// and a pyarrow SubTreeFileSystem."""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import pytest

from loopscale.cluster import storage as st


@pytest.fixture(params=["path", "file_uri", "subtree"])
def loc(request, tmp_path):
    """(base location, filesystem or None, real local directory behind it) for each access style."""
    real = tmp_path / "store"
    real.mkdir()
    if request.param == "path":
        return str(real), None, real
    if request.param == "file_uri":
        return f"file://{real}", None, real
    sub = pafs.SubTreeFileSystem(str(real), pafs.LocalFileSystem())
    return "runs", sub, real / "runs"


def test_resolve_uri_kinds(tmp_path, monkeypatch):
    """Local paths (relative → absolute), file:// and explicit filesystems resolve; bad input is refused."""
    monkeypatch.chdir(tmp_path)
    fs, p = st.resolve_uri("rel/dir")
    assert fs.type_name == "local" and p == str(tmp_path / "rel" / "dir")
    fs, p = st.resolve_uri(f"file://{tmp_path}/x/")
    assert fs.type_name == "local" and p == f"{tmp_path}/x"
    sub = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert st.resolve_uri("a/b/", sub) == (sub, "a/b")
    with pytest.raises(ValueError, match="not understood by pyarrow"):
        st.resolve_uri("nosuchscheme://bucket/x")
    with pytest.raises(ValueError, match="inline credentials"):
        st.resolve_uri("s3://AKIAEXAMPLE:secret@bucket/x")
    with pytest.raises(ValueError, match="non-empty"):
        st.resolve_uri("  ")


def test_resolve_uri_s3_without_network():
    """s3:// resolves to pyarrow's S3FileSystem with the bucket/key path (no request is made)."""
    fs, p = st.resolve_uri("s3://my-bucket/loopscale/run1?region=us-east-1")
    assert fs.type_name == "s3" and p == "my-bucket/loopscale/run1"


def test_join():
    """join keeps the scheme, uses '/', and refuses parts that escape the base."""
    assert st.join("s3://b/run", "trial_1", "ckpt") == "s3://b/run/trial_1/ckpt"
    assert st.join("/data/run", "a") == "/data/run/a"
    with pytest.raises(ValueError, match="must be relative"):
        st.join("/data/run", "../etc")
    with pytest.raises(ValueError, match="must be relative"):
        st.join("/data/run", "/abs")


def test_roundtrip_and_listing(loc):
    """write_bytes_atomic/read_bytes/exists/listdir/makedirs/remove agree with the real directory."""
    base, fs, real = loc
    st.makedirs(st.join(base, "empty"), fs)
    st.write_bytes_atomic(st.join(base, "a", "x.bin"), b"\x00\x01hello", fs)
    st.write_bytes_atomic(st.join(base, "a", "x.bin"), b"second", fs)  # overwrite
    assert st.read_bytes(st.join(base, "a", "x.bin"), fs) == b"second"
    assert (real / "a" / "x.bin").read_bytes() == b"second"
    assert st.exists(st.join(base, "a"), fs) and not st.exists(st.join(base, "nope"), fs)
    assert st.listdir(base, fs) == ["a", "empty"]
    assert st.listdir(st.join(base, "a"), fs) == ["x.bin"]  # no temp files left behind
    with pytest.raises(FileNotFoundError):
        st.read_bytes(st.join(base, "missing"), fs)
    with pytest.raises(FileNotFoundError):
        st.listdir(st.join(base, "missing"), fs)
    st.remove(st.join(base, "a"), fs)
    assert not (real / "a").exists()
    with pytest.raises(TypeError):
        st.write_bytes_atomic(st.join(base, "s"), "text", fs)


def test_sync_and_fetch_checkpoint_dir(loc, tmp_path):
    """A checkpoint dir synced from 'node 1' is fetched bit-identical on 'node 2'; stale files are dropped."""
    base, fs, real = loc
    node1 = tmp_path / "node1"
    (node1 / "sub").mkdir(parents=True)
    (node1 / "state.pt").write_bytes(os.urandom(5000))
    (node1 / "sub" / "meta.json").write_text('{"step": 7}')
    (node1 / "old.tmp").write_text("stale")
    target = st.join(base, "trial_0", "checkpoint_000007")
    st.sync_dir(str(node1), target, fs)
    (node1 / "old.tmp").unlink()
    manifest = st.sync_dir(str(node1), target, fs)
    assert manifest == {"state.pt": 5000, "sub/meta.json": 11}
    assert not (real / "trial_0" / "checkpoint_000007" / "old.tmp").exists()
    node2 = tmp_path / "node2"
    assert st.fetch_dir(target, str(node2), fs) == manifest
    assert (node2 / "state.pt").read_bytes() == (node1 / "state.pt").read_bytes()
    assert (node2 / "sub" / "meta.json").read_text() == '{"step": 7}'


def test_fetch_refuses_incomplete_upload(loc, tmp_path):
    """A directory without the manifest (upload interrupted) or with a truncated file is refused."""
    base, fs, real = loc
    src = tmp_path / "src"
    src.mkdir()
    (src / "state.pt").write_bytes(b"x" * 100)
    target = st.join(base, "ck")
    st.sync_dir(str(src), target, fs)
    (real / "ck" / "state.pt").write_bytes(b"x" * 10)  # truncated behind our back
    with pytest.raises(OSError, match="manifest says 100"):
        st.fetch_dir(target, str(tmp_path / "dst"), fs)
    st.remove(st.join(target, st.SYNC_MANIFEST), fs)
    with pytest.raises(FileNotFoundError, match="did not finish"):
        st.fetch_dir(target, str(tmp_path / "dst2"), fs)
    with pytest.raises(FileNotFoundError):
        st.fetch_dir(st.join(base, "none"), str(tmp_path / "dst3"), fs)
