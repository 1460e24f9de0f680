"""Storage URIs for results, checkpoints and Tune state: one API over every filesystem pyarrow knows.

A *location* is either a URI string alone (a local path, relative or absolute, ``file://``, ``s3://``,
``gs://``, ``hdfs://``, anything ``pyarrow.fs.FileSystem.from_uri`` understands), or a path inside an
explicit ``pyarrow.fs.FileSystem`` passed as ``filesystem=`` (e.g. a ``SubTreeFileSystem``, or the
``storage_filesystem`` handed to Tune). Every function takes the same pair.

On a multi-node cluster the storage location must be shared (NFS mount, object store): a trial that
restarts on another node reads its checkpoint from there (``sync_dir`` / ``fetch_dir``). Cloud
credentials come from the environment (instance roles, ``AWS_*``/``GOOGLE_*`` variables); this module
never writes or logs them, and refuses URIs that carry them inline (``s3://KEY:SECRET@bucket``).
"""

from __future__ import annotations

import contextvars
import json
import os
import posixpath
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow.fs as pafs

__all__ = [
    "resolve_uri",
    "absolute_uri",
    "join",
    "write_bytes_atomic",
    "write_text_atomic",
    "move_aside",
    "read_json_or_aside",
    "read_bytes",
    "exists",
    "listdir",
    "makedirs",
    "remove",
    "sync_dir",
    "fetch_dir",
    "SYNC_MANIFEST",
]

#: Written last by ``sync_dir``; ``fetch_dir`` refuses a directory without it (a half-synced checkpoint).
SYNC_MANIFEST = ".loopscale_sync.json"

_RENAME_OK = {"local", "hdfs"}  # filesystems whose move() is an atomic rename

LOOK_ONLY: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("loopscale_look_only", default=None)
"""Inside :func:`loopscale.sweep.store.look_only` (this thread or task only): the list where unreadable files are
described instead of moved aside (:func:`move_aside` and the results store note them there and move nothing)."""


def _has_scheme(uri: str) -> bool:
    head, sep, _ = uri.partition("://")
    return bool(sep) and head.isidentifier()


def resolve_uri(uri: str, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """Turn a location into ``(pyarrow.fs.FileSystem, path)``.

    Args:
        uri: local path (relative paths are made absolute against the current directory), ``file://``,
            ``s3://bucket/key``, ``gs://bucket/key``, ``hdfs://host:port/path``, ... If ``filesystem`` is
            given, ``uri`` is a path inside it and is returned unchanged (trailing ``/`` stripped).
        filesystem: optional explicit filesystem.

    Returns:
        (filesystem, path) usable with pyarrow's filesystem methods.

    Raises:
        ValueError: empty uri; a URI with inline credentials (``user:secret@``); a scheme pyarrow does
            not understand (names the scheme and lists the usual ones).
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(
            f"uri={uri!r} must be a non-empty path or URI, e.g. './results' or 's3://bucket/run'"
        )
    if filesystem is not None:
        path = uri.rstrip("/") or "/"
        return filesystem, path
    if _has_scheme(uri):
        netloc = uri.split("://", 1)[1].split("/", 1)[0]
        if "@" in netloc and ":" in netloc.split("@", 1)[0]:
            raise ValueError(
                f"uri for scheme {uri.split('://', 1)[0]!r} carries inline credentials (user:secret@); "
                "never put keys in URIs: use the environment (instance role, AWS_*/GOOGLE_* variables)"
            )
    else:
        uri = os.path.abspath(os.path.expanduser(uri))
    import pyarrow.fs as pafs
    from pyarrow.lib import ArrowInvalid

    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except ArrowInvalid as e:
        raise ValueError(
            f"uri={uri!r} is not understood by pyarrow ({e}); use a local path, file://, s3://, gs:// or hdfs://"
        ) from e
    return fs, (path.rstrip("/") or "/")


def absolute_uri(uri: str) -> str:
    """``uri`` with a relative local path made absolute against the current working directory (``~`` expanded);
    URIs with a scheme (``file://``, ``s3://``, ...) are returned unchanged. Ray Tune and pyarrow read a relative
    path as a URI without a scheme ("URI has empty scheme"), so every storage location we accept goes through
    this first."""
    if not isinstance(uri, str) or not uri.strip() or _has_scheme(uri):
        return uri
    return os.path.abspath(os.path.expanduser(uri))


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI or path with ``/`` (POSIX rules, also for ``s3://`` keys).

    Raises:
        ValueError: a part that is absolute or contains ``..`` (would escape the base location).
    """
    for p in parts:
        if p.startswith("/") or ".." in p.split("/"):
            raise ValueError(f"join part {p!r} must be relative and must not contain '..' (got base {uri!r})")
    if _has_scheme(uri):
        scheme, rest = uri.split("://", 1)
        return f"{scheme}://{posixpath.join(rest, *parts)}" if rest else f"{scheme}://{'/'.join(parts)}"
    return posixpath.join(uri, *parts)


def _type_name(fs) -> str:
    import pyarrow.fs as pafs

    while isinstance(fs, pafs.SubTreeFileSystem):
        fs = fs.base_fs
    return fs.type_name


def makedirs(uri: str, filesystem: pafs.FileSystem | None = None) -> None:
    """Create a directory and its parents (no error if it exists; a no-op on object stores)."""
    fs, path = resolve_uri(uri, filesystem)
    fs.create_dir(path, recursive=True)


def exists(uri: str, filesystem: pafs.FileSystem | None = None) -> bool:
    """True if a file or directory exists at the location."""
    import pyarrow.fs as pafs

    fs, path = resolve_uri(uri, filesystem)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def listdir(uri: str, filesystem: pafs.FileSystem | None = None) -> list[str]:
    """Sorted base names of the entries directly inside a directory.

    Raises:
        FileNotFoundError: the directory does not exist.
    """
    import pyarrow.fs as pafs

    fs, path = resolve_uri(uri, filesystem)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    if not infos and fs.get_file_info(path).type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no directory at {uri!r}")
    return sorted(posixpath.basename(i.path.rstrip("/")) for i in infos)


def read_bytes(uri: str, filesystem: pafs.FileSystem | None = None) -> bytes:
    """Read a whole file.

    Raises:
        FileNotFoundError: no file at the location.
    """
    import pyarrow.fs as pafs

    fs, path = resolve_uri(uri, filesystem)
    if fs.get_file_info(path).type != pafs.FileType.File:
        raise FileNotFoundError(f"no file at {uri!r}")
    with fs.open_input_stream(path) as f:
        return f.read()


def write_bytes_atomic(uri: str, data: bytes, filesystem: pafs.FileSystem | None = None) -> None:
    """Write ``data`` so that readers see either the old file or the complete new one.

    On filesystems with an atomic rename (local, NFS, HDFS; also through ``SubTreeFileSystem``) the bytes
    go to a hidden temp file in the same directory, which is then renamed over the target. Object stores
    (S3, GCS) publish an object only when its upload completes, so the data is written in place; the
    size is then read back and compared.

    Raises:
        TypeError: data is not bytes-like.
        OSError: the read-back size differs (object stores).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    fs, path = resolve_uri(uri, filesystem)
    parent = posixpath.dirname(path)
    if parent:
        fs.create_dir(parent, recursive=True)
    if _type_name(fs) in _RENAME_OK:
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.tmp-{uuid.uuid4().hex[:12]}")
        try:
            with fs.open_output_stream(tmp) as f:
                f.write(data)
            fs.move(tmp, path)
        except BaseException:
            try:
                fs.delete_file(tmp)
            except Exception:
                pass
            raise
        return
    with fs.open_output_stream(path) as f:
        f.write(data)
    size = fs.get_file_info(path).size
    if size != len(data):
        raise OSError(f"write to {uri!r} incomplete: {size} of {len(data)} bytes visible after upload")


def write_text_atomic(uri: str, text: str, filesystem: pafs.FileSystem | None = None) -> None:
    """Write ``text`` as UTF-8, whatever the locale's codec, with :func:`write_bytes_atomic` (readers see the old
    file or the complete new one; a failed write leaves no temporary file behind)."""
    write_bytes_atomic(uri, text.encode("utf-8"), filesystem)


def aside_path(parent: str | os.PathLike, prefix: str, sep: str = "_") -> Path:
    """``parent/<prefix><sep><UTC time>``, a path nothing holds yet (``_2``, ``_3``, ... appended when that exists:
    two commands in one second keep both), where a command keeps what it replaces. Creates nothing."""
    import time

    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    name, k = f"{prefix}{sep}{stamp}", 1
    while (Path(parent) / name).exists():
        k += 1
        name = f"{prefix}{sep}{stamp}_{k}"
    return Path(parent) / name


def new_aside_folder(parent: str | os.PathLike, prefix: str) -> Path:
    """Create and return ``parent/<prefix>_<UTC time>`` (:func:`aside_path`), where a command keeps the files it
    replaces."""
    aside = aside_path(parent, prefix)
    aside.mkdir(parents=True)
    return aside


def move_aside(uri: str, reason: str, filesystem: pafs.FileSystem | None = None, *, warn: bool = True) -> str:
    """Rename an unreadable file (torn by a crash, truncated, corrupt) to ``<name>.unreadable-<id>`` next to it,
    so that nothing globbing the original names reads it again, and warn (``UserWarning``) with ``reason`` (unless
    ``warn`` is False: the caller says it once for several files). Returns the new location. Nothing is deleted:
    the file stays there for inspection. Inside :func:`loopscale.sweep.store.look_only` (``loopscale status``, a
    dry run) nothing is moved: the file is described in its list and ``uri`` is returned."""
    import warnings

    if (seen := LOOK_ONLY.get()) is not None:
        seen.append(f"{uri} is unreadable ({reason}): the command would move it aside and treat it as missing")
        return uri
    fs, path = resolve_uri(uri, filesystem)
    dest = f"{path}.unreadable-{uuid.uuid4().hex[:8]}"
    fs.move(path, dest)
    new = dest if filesystem is not None or not _has_scheme(uri) else f"{uri}.unreadable-{dest.rsplit('-', 1)[1]}"
    if warn:
        warnings.warn(f"{uri} is unreadable ({reason}); moved aside to {new} and treated as missing", stacklevel=2)
    return new


def read_json_or_aside(uri: str, filesystem: pafs.FileSystem | None = None) -> dict | None:
    """The JSON object at ``uri`` (every file loopscale writes as JSON holds one); None when there is no file, or
    when it is not one: a torn or empty file, or valid JSON of another kind (a list, a number) is moved aside with
    :func:`move_aside`, so the caller treats it as never written and redoes that work (a ``run_meta.json``
    holding a list had crashed ``run`` and ``status`` with a bare TypeError / AttributeError)."""
    try:
        data = read_bytes(uri, filesystem)
    except FileNotFoundError:
        return None
    value, why = json_object(data)
    if why is not None:
        move_aside(uri, why, filesystem)
    return value


def json_object(data: bytes) -> tuple[dict | None, str | None]:
    """``(the JSON object in data, None)``, or ``(None, why not)`` for bytes that are not one: empty (``"0 bytes"``,
    ``"whitespace only"``), not UTF-8 JSON (``"not valid JSON: ..."``), or valid JSON of another kind (``"not a JSON object (a JSON
    list)"``). How :func:`read_json_or_aside` and ``loopscale status`` (which moves nothing) tell a torn file."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return None, (f"not valid JSON: {e}" if data.strip() else "0 bytes" if not data else "whitespace only")
    except RecursionError:
        return None, "not valid JSON: nested too deeply to read"
    if not isinstance(value, dict):
        kind = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "null")
        return None, f"not a JSON object (a JSON {kind})"
    return value, None


def remove(uri: str, filesystem: pafs.FileSystem | None = None) -> None:
    """Delete a file or a directory tree; no error if nothing is there."""
    import pyarrow.fs as pafs

    fs, path = resolve_uri(uri, filesystem)
    t = fs.get_file_info(path).type
    if t == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif t == pafs.FileType.File:
        fs.delete_file(path)


def _local_files(local_dir: str) -> dict[str, int]:
    out = {}
    for root, _dirs, files in os.walk(local_dir):
        for name in files:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, local_dir).replace(os.sep, "/")
            if rel != SYNC_MANIFEST:
                out[rel] = os.path.getsize(full)
    return dict(sorted(out.items()))


def sync_dir(local_dir: str, uri: str, filesystem: pafs.FileSystem | None = None) -> dict[str, int]:
    """Upload a local directory (e.g. a checkpoint) to a location, then publish a manifest.

    Every file is written with ``write_bytes_atomic``; files at the destination that are not in
    ``local_dir`` are removed; the manifest ``SYNC_MANIFEST`` (relative path → size in bytes) is written
    last, so ``fetch_dir`` can tell a complete copy from one interrupted mid-way.

    Returns:
        The manifest: {relative path: size in bytes}.

    Raises:
        FileNotFoundError: ``local_dir`` is not a directory.
    """
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"local_dir {local_dir!r} is not a directory")
    fs, path = resolve_uri(uri, filesystem)
    manifest = _local_files(local_dir)
    if exists(path, fs):
        # withdraw the old manifest first: from here until the new one lands the copy reads as incomplete
        remove(join(path, SYNC_MANIFEST), fs)
    fs.create_dir(path, recursive=True)
    for rel in manifest:
        with open(os.path.join(local_dir, *rel.split("/")), "rb") as f:
            write_bytes_atomic(join(path, rel), f.read(), fs)
    import pyarrow.fs as pafs

    for info in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        rel = posixpath.relpath(info.path, path)
        if info.type == pafs.FileType.File and rel not in manifest and rel != SYNC_MANIFEST:
            fs.delete_file(info.path)
    write_bytes_atomic(join(path, SYNC_MANIFEST), json.dumps(manifest, sort_keys=True).encode(), fs)
    return manifest


def fetch_dir(uri: str, local_dir: str, filesystem: pafs.FileSystem | None = None) -> dict[str, int]:
    """Download a directory written by ``sync_dir`` into ``local_dir`` (created if missing).

    Returns:
        The manifest: {relative path: size in bytes}.

    Raises:
        FileNotFoundError: nothing at ``uri``, or no manifest there (sync never finished).
        OSError: a file's size differs from the manifest.
    """
    fs, path = resolve_uri(uri, filesystem)
    if not exists(path, fs):
        raise FileNotFoundError(f"no directory at {uri!r}")
    try:
        manifest = json.loads(read_bytes(join(path, SYNC_MANIFEST), fs))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{uri!r} has no {SYNC_MANIFEST}: the upload did not finish (or it was not written by sync_dir)"
        ) from None
    os.makedirs(local_dir, exist_ok=True)
    for rel, size in manifest.items():
        data = read_bytes(join(path, rel), fs)
        if len(data) != size:
            raise OSError(f"{join(uri, rel)!r} is {len(data)} bytes, manifest says {size}")
        dest = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.tmp-{uuid.uuid4().hex[:12]}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    return manifest


# --- local URIs and JSON documents (trial workspaces, finished results) --------------------------------------


def is_local_uri(uri: str) -> bool:
    """True for plain paths and ``file://`` URIs (checkpoints can then be used in place)."""
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> Path:
    """Local path of a local URI."""
    return Path(uri[len("file://") :] if uri.startswith("file://") else uri).resolve()


def read_json_uri(uri: str) -> dict | None:
    """JSON at ``uri`` or None when there is no such file, or an unreadable one (torn or empty: moved aside with a
    warning by :func:`read_json_or_aside`, so a torn ``result.json`` makes its run count as unfinished and never
    blocks a sweep)."""
    return read_json_or_aside(uri)


def write_json_uri(uri: str, obj: Any) -> None:
    """Write JSON atomically at ``uri`` (local or any pyarrow filesystem)."""
    write_bytes_atomic(uri, json.dumps(obj, sort_keys=True).encode())
