"""The console script on a full disk, an unwritable Ray temp dir and an empty path argument: one `error:` line
each, nothing written by a refusal."""

from __future__ import annotations

import errno
import os

import pytest
import typer


def test_an_empty_out_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """`loopscale run smoke --out ''` (a script's `--out "$OUT"` with OUT unset) wrote a whole run into the
    current directory, since Path('') is '.'."""
    from loopscale.sweep.cli import empty_path_argument, main

    monkeypatch.chdir(tmp_path)
    for argv in (["run", "smoke", "--out", ""], ["run", "smoke", "--out="], ["sweep", "--out", "", "smoke"]):
        assert "--out is empty" in empty_path_argument(argv)
    assert "TABLE is empty" in empty_path_argument(["fit", ""])
    assert "DIR is empty" in empty_path_argument(["status", ""])  # its usage line names it DIR
    assert "--pilot is empty" in empty_path_argument(["design", "smoke", "--pilot", ""])
    # train's folder options are str-typed: --cache-dir '' wrote the token cache into the current directory
    assert "--cache-dir is empty" in empty_path_argument(["train", "--d-model", "16", "--cache-dir", ""])
    assert "--checkpoint-dir is empty" in empty_path_argument(["train", "--checkpoint-dir="])
    # after a flag (which takes no value) or `--`, an empty argument is still the positional's
    assert "DIR is empty" in empty_path_argument(["status", "--json", ""])
    assert "TABLE is empty" in empty_path_argument(["fit", "--per-run", ""])
    assert "TABLE is empty" in empty_path_argument(["fit", "--", ""])
    assert empty_path_argument(["fit", "t.csv", "--out", "x", ""]) is None  # a second positional: Click's to refuse
    # '.' is a path given on purpose; a str option's empty value is its own command's to judge; no command: none
    for argv in (["run", "smoke", "--out", "."], ["fit", "t.csv", "--block-by", ""], ["fit", "t.csv", "--variant", ""],
                 ["model", "info"], [], ["nope", ""]):
        assert empty_path_argument(argv) is None, argv
    monkeypatch.setattr("sys.argv", ["loopscale", "run", "smoke", "--out", ""])
    with pytest.raises(SystemExit) as ex:
        main()
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out is empty") and str(tmp_path) in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_ray_temp_dir_that_cannot_be_written_is_refused_before_ray_starts(monkeypatch):
    """--ray-temp-dir on a read-only file system gave a 71-line traceback after spec.yaml and logs/ were written."""
    import shutil
    import tempfile
    from pathlib import Path

    from loopscale.cluster.options import ClusterOptions

    tmp_path = Path(tempfile.mkdtemp(prefix="lsrt", dir="/tmp"))  # short: Ray's limit is 60 characters
    try:
        _check_ray_temp_dir(tmp_path, monkeypatch, ClusterOptions)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _check_ray_temp_dir(tmp_path, monkeypatch, ClusterOptions):

    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=r"--ray-temp-dir '.*/f/rt' cannot be created: .*/f is a file"):
        ClusterOptions(ray_temp_dir=str(tmp_path / "f" / "rt")).validate()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if str(p) == str(tmp_path) else real(p, mode))
    with pytest.raises(ValueError, match=r"--ray-temp-dir '.*/rt/x': .* is not writable"):
        ClusterOptions(ray_temp_dir=str(tmp_path / "rt" / "x")).validate()
    monkeypatch.setattr(os, "access", real)
    ClusterOptions(ray_temp_dir=str(tmp_path / "rt" / "x")).validate()  # a writable parent: accepted, not created
    assert not (tmp_path / "rt").exists()


def test_a_full_disk_anywhere_in_the_chain_is_one_error_line(capsys):
    """A full disk during a sweep ended in 740 lines of tracebacks (Tune's TuneError around pyarrow's OSError),
    or in nothing at all; it is one line naming the disk's error and --resume, exit 1."""
    from loopscale.cluster.options import EXIT_FAILED, disk_error, present_errors

    def cmd(resume: bool = False):
        try:
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        except OSError as e:
            raise RuntimeError("TuneError: trial failed") from e

    with pytest.raises(typer.Exit) as ex:
        present_errors(cmd)()
    assert ex.value.exit_code == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: [Errno 28] Error writing bytes to file")
    assert "free space there" in err and "--resume" in err

    def bug():
        raise OSError(errno.EBADF, "Bad file descriptor")  # not a disk's state: a bug keeps its traceback

    with pytest.raises(OSError):
        present_errors(bug)()

    def denied(resume: bool = False):  # e.g. --out under /sys as root: os.access said yes, mkdir said no
        raise PermissionError(errno.EPERM, "Operation not permitted", "/sys/x")

    with pytest.raises(typer.Exit) as ex:
        present_errors(denied)()
    assert ex.value.exit_code == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: [Errno 1] Operation not permitted: '/sys/x'")
    assert "this user may not use that path" in err and "free space" not in err and "--resume" in err
    assert disk_error(OSError(errno.EROFS, "Read-only file system", "/ro/x")).filename == "/ro/x"
    assert disk_error(RuntimeError("x")) is None
    from loopscale.cluster.options import disk_error_message

    ro = disk_error_message(OSError(errno.EROFS, "Read-only file system", "/ro/x"), True)
    assert ro.count("/ro/x") == 1 and "mounted read-only" in ro and "free space" not in ro
    try:  # an error raised `from None` does not carry the disk error it replaced
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise ValueError("unrelated") from None
    except ValueError as e:
        assert disk_error(e) is None

    def exits():  # typer.Exit raised while handling a full disk keeps its own exit code
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise typer.Exit(code=7)  # noqa: B904 (the disk error stays its context, as in the case guarded)

    with pytest.raises(typer.Exit) as ex:
        present_errors(exits)()
    assert ex.value.exit_code == 7


def test_a_storage_that_is_a_file_is_called_a_file(tmp_path):
    """--storage afile said "cannot be written: File exists", which reads as a clash, not as a file given."""
    from loopscale.cluster.options import _writable_local_storage, validate_storage

    (tmp_path / "afile").write_text("x")
    for given in ("afile", "afile/sub"):
        with pytest.raises(ValueError, match=r"cannot be written: .*/afile is a file; give a writable directory"):
            _writable_local_storage(validate_storage(str(tmp_path / given)))
    assert (tmp_path / "afile").read_text() == "x"


def test_status_with_a_storage_where_nothing_is_says_so(tmp_path):
    """`status DIR --storage /nonexistent/st` exited 0 and read as a folder without Tune trials."""
    import subprocess
    import sys

    (tmp_path / "o").mkdir()
    p = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "status", str(tmp_path / "o"), "--storage",
                        str(tmp_path / "nothing")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 2 and p.stderr.startswith(f"error: --storage {tmp_path / 'nothing'}: nothing is there")
    (tmp_path / "st").mkdir()
    from pathlib import Path

    (tmp_path / "o" / "spec.yaml").write_text((Path(__file__).parents[1] / "configs" / "smoke.yaml").read_text())
    p = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "status", str(tmp_path / "o"), "--storage",
                        str(tmp_path / "st")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr


def test_a_cache_dir_that_is_a_file_is_one_error_line(tmp_path, monkeypatch):
    """`train --cache-dir F` and `LOOPSCALE_CACHE=F` with F a file gave a traceback (NotADirectoryError from the
    token cache's mkdir), also from `run --dry-run`; now one error naming it, before any corpus is read."""
    from typer.testing import CliRunner

    from loopscale.model.data import default_cache_dir
    from loopscale.sweep.cli import app

    f = tmp_path / "cachefile"
    f.write_text("")
    monkeypatch.chdir(tmp_path)
    args = ["train", "--d-model", "16", "--r", "2", "--tokens", "1024", "--batch-tokens", "256", "--eval-tokens",
            "256", "--seq-len", "32", "--corpus", "embedded"]  # fmt: skip
    for cache, said in (("cachefile", "--cache-dir 'cachefile' is a file"),
                        ("cachefile/sub", "--cache-dir 'cachefile/sub' cannot be created: cachefile is a file")):  # fmt: skip
        res = CliRunner().invoke(app, [*args, "--cache-dir", cache])
        assert res.exit_code == 2 and f"error: {said}; give a folder for the token cache" in res.output, res.output
    monkeypatch.setenv("LOOPSCALE_CACHE", str(f))
    with pytest.raises(ValueError, match=f"LOOPSCALE_CACHE '{f}' is a file"):
        default_cache_dir()
    res = CliRunner().invoke(app, ["run", "smoke", "--out", str(tmp_path / "out"), "--dry-run"])
    assert res.exit_code == 2 and f"LOOPSCALE_CACHE '{f}' is a file" in res.output, res.output
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("LOOPSCALE_CACHE", str(tmp_path / "new" / "cache"))
    assert default_cache_dir() == tmp_path / "new" / "cache" and not (tmp_path / "new").exists()  # made when written


def test_status_refuses_a_storage_file_and_another_folders_storage(tmp_path):
    """`status O --storage afile` and `status O --storage S` where S holds folder A's Tune state (A's commands
    claimed it; none of O's used it) both exited 0: the first read as a grid without trials, the second could show
    A's trials as O's. Both are refused; a storage O's own command used passes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from loopscale.sweep.status import STORAGE_CLAIM, refuse_foreign_storage

    spec = (Path(__file__).parents[1] / "configs" / "smoke.yaml").read_text()
    o, a, s = tmp_path / "o", tmp_path / "a", tmp_path / "s"
    for d in (o, a, s):
        d.mkdir()
    (o / "spec.yaml").write_text(spec)
    (tmp_path / "afile").write_text("x")
    p = subprocess.run([sys.executable, "-m", "loopscale.sweep.cli", "status", str(o), "--storage",
                        str(tmp_path / "afile")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 2 and p.stderr.startswith(f"error: --storage {tmp_path / 'afile'} is a file, not a folder")
    assert (tmp_path / "afile").read_text() == "x"
    refuse_foreign_storage(str(s), o)  # no claim: nothing says whose it is
    (s / STORAGE_CLAIM).write_text(json.dumps({"out": str(a), "pid": 1, "host": "h"}))
    with pytest.raises(ValueError, match=rf"--storage {s} holds the Tune state of {a} .* no command of {o.resolve()} "
                                         rf"used it: .*`loopscale status {a}`"):  # fmt: skip
        refuse_foreign_storage(str(s), o)
    refuse_foreign_storage(str(s), a)  # the claimant's own status
    refuse_foreign_storage("gs://bucket/tune", o)  # a bucket is not claimed
    (o / "logs").mkdir()
    (o / "logs" / "command.json").write_text(json.dumps(
        {"command": f"loopscale sweep x --out {o} --storage {s}", "kind": "sweep", "pid": 1, "host": "h",
         "cwd": str(tmp_path), "storage": str(s), "started_at": 1.0}))  # fmt: skip
    refuse_foreign_storage(str(s), o)  # O's command used it too (A used it after): O's trials may be there
    # another folder's default storage (B/tune, B/tune_lr/ray) has no claim file: B's spec says whose it is
    b = tmp_path / "b"
    (b / "tune").mkdir(parents=True)
    (b / "tune_lr" / "ray").mkdir(parents=True)
    refuse_foreign_storage(str(b / "tune"), o)  # nothing of a loopscale folder there yet
    (b / "spec.yaml").write_text(spec)
    for default in (b / "tune", b / "tune_lr" / "ray"):
        with pytest.raises(ValueError, match=rf"--storage {default} holds the Tune state of {b} "):
            refuse_foreign_storage(str(default), o)
        refuse_foreign_storage(str(default), b)  # B's own
    (o / "logs" / "command.json").write_text(json.dumps(
        {"command": f"loopscale sweep x --out {o} --storage {b / 'tune'}", "kind": "sweep", "pid": 1, "host": "h",
         "cwd": str(tmp_path), "storage": str(b / "tune"), "started_at": 2.0}))  # fmt: skip
    refuse_foreign_storage(str(b / "tune"), o)  # O's command used B's default storage: allowed
