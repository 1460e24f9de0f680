"""Storage URIs as a new user writes them: an HDFS storage on a machine without Hadoop, a refused ``--resume`` with a
relative storage, and ``file:`` without its ``//`` (cluster/options.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HDFS_ADVICE = (
    "pyarrow's HDFS needs Hadoop's libhdfs and a JVM on this machine (JAVA_HOME, HADOOP_HOME, and CLASSPATH from "
    "`hadoop classpath --glob`) and the namenode's host:port in the URI (hdfs://NAMENODE:8020/path)"
)
BUCKET_ADVICE = (
    "check the network, the bucket's name and this machine's credentials (instance role, AWS_*/GOOGLE_* variables)"
)


def test_an_hdfs_storage_pyarrow_cannot_load_is_one_line_with_hdfs_advice(monkeypatch, capfd):
    """`--storage hdfs://nn:8020/x` on a machine without a JVM printed ~90 lines (pyarrow's 'Unable to load libjvm'
    and every dlopen it tried, some written by its C++ side straight to file descriptor 2) and then advice about
    buckets and AWS_*/GOOGLE_* credentials. It is one line now: the first line of pyarrow's reason and what HDFS
    needs; what the C++ side writes to fd 2 during the probe is kept out of the terminal (fd 2 is restored)."""
    from loopscale.cluster import storage as st
    from loopscale.cluster.options import reachable_storage

    tried = "".join(f"dlopen(/usr/lib/jvm/j{i}/libjvm.so) failed: cannot open shared object file\n" for i in range(88))

    def no_jvm(uri, filesystem=None):
        os.write(2, tried.encode())  # as libhdfs does, past sys.stderr
        raise OSError("Unable to load libjvm\n" + tried)

    monkeypatch.setattr(st, "exists", no_jvm)
    with pytest.raises(ValueError) as e:
        reachable_storage("hdfs://nn:8020/x", write=True)
    assert str(e.value) == f"storage 'hdfs://nn:8020/x' cannot be reached: Unable to load libjvm; {HDFS_ADVICE}"
    os.write(2, b"after\n")  # fd 2 is the terminal again
    assert capfd.readouterr().err == "after\n"

    # s3:// / gs:// keep their advice; a reason only on fd 2 (an empty exception) is its first line
    def silent(uri, filesystem=None):
        os.write(2, b"\nconnect failed: timeout\nmore\n")
        raise OSError("")

    monkeypatch.setattr(st, "exists", silent)
    with pytest.raises(ValueError) as e:
        reachable_storage("s3://b/x")
    assert str(e.value) == f"storage 's3://b/x' cannot be reached: connect failed: timeout; {BUCKET_ADVICE}"
    assert capfd.readouterr().err == ""

    # a storage that answers: what its C++ side wrote is not hidden
    def answers(uri, filesystem=None):
        os.write(2, b"log4j:WARN no appenders\n")
        return True

    monkeypatch.setattr(st, "exists", answers)
    reachable_storage("hdfs://nn:8020/x")
    assert capfd.readouterr().err == "log4j:WARN no appenders\n"


def test_hdfs_without_a_jvm_from_the_command_line_is_one_line(tmp_path):
    """The user's command, end to end with the real pyarrow, where pyarrow finds no JVM (JAVA_HOME names an empty
    folder): one line, exit 2, and no --out folder."""
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no_java")}
    env.pop("ARROW_LIBHDFS_DIR", None)
    probe = "import pyarrow.fs as f\ntry: f.FileSystem.from_uri('hdfs://nn:8020/x')\nexcept OSError as e: print(e)"
    said = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    if not said.stdout.startswith("Unable to load libjvm\n"):
        pytest.skip(f"pyarrow finds a JVM on this machine without JAVA_HOME: {said.stdout[:100]!r}")
    loopscale = Path(sys.executable).with_name("loopscale")
    out = tmp_path / "out_h"
    res = subprocess.run([str(loopscale), "sweep", "smoke", "--out", str(out), "--storage", "hdfs://nn:8020/x"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    assert res.stderr == (
        f"error: storage 'hdfs://nn:8020/x' cannot be reached: Unable to load libjvm; {HDFS_ADVICE}\n"
    ), res.stderr
    assert not out.exists()


def _stopped_sweep(tmp_path, name: str = "smokest"):
    """A folder whose earlier `sweep` ran in ``tmp_path/trial`` with the spec's relative ``storage_path: st_spec``
    and was interrupted: its Tune experiment is in ``trial/st_spec``. Returns (spec file, out, that storage)."""
    trial = tmp_path / "trial"
    spec = yaml.safe_load((Path(__file__).parents[1] / "configs" / "smoke.yaml").read_text())
    spec.update(name=name, storage_path="st_spec")
    spec_file = trial / "smokest.yaml"
    trial.mkdir()
    spec_file.write_text(yaml.safe_dump(spec))
    out = trial / "out_st"
    (out / "logs").mkdir(parents=True)
    first = trial / "st_spec"
    (first / f"grid_{name}_001").mkdir(parents=True)
    record = {"kind": "sweep", "command": "loopscale sweep smokest.yaml --out out_st", "cwd": str(trial),
              "storage": str(first), "pid": -1, "host": "elsewhere", "started_at": 1.0, "recorded_at": 1.0}  # fmt: skip
    (out / "logs" / "command.json").write_text(json.dumps(record))
    return spec_file, out, first


@pytest.mark.parametrize("cmd", ["sweep", "run"])
def test_a_refused_resume_creates_no_storage_folder(tmp_path, monkeypatch, cmd):
    """`cd /tmp && loopscale sweep /tmp/trial4/smokest.yaml --out /tmp/trial4/out_st --resume` (a spec whose
    relative storage_path an earlier command in /tmp/trial4 used) was refused, rightly naming /tmp/trial4/st_spec,
    but the storage check before it had already created an empty /tmp/st_spec. The check now leaves nothing."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    spec_file, out, first = _stopped_sweep(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    def no_ray(*a, **k):
        raise AssertionError("Ray started")

    monkeypatch.setattr("loopscale.cluster.connect.ray_session", no_ray)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    res = CliRunner().invoke(app, [cmd, str(spec_file), "--out", str(out), "--resume"])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(
        f"error: --resume: the storage {elsewhere / 'st_spec'} holds no Tune experiment of this sweep, but {first}, "
        f"where an earlier command of {out} kept it, does (grid_smokest_001): its unfinished runs' checkpoints are "
        f"there; give --storage {first} to continue it"
    ), res.stderr
    assert not (elsewhere / "st_spec").exists()
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_the_local_storage_check_leaves_a_missing_storage_missing(tmp_path):
    """The write check of a local storage probes it in directories it removes again; an existing one keeps its
    content and gets no probe file; one that cannot be made is still one line."""
    from loopscale.cluster.options import reachable_storage

    reachable_storage(str(tmp_path / "a" / "b" / "st"), write=True)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "kept").write_text("x")
    reachable_storage(f"file://{tmp_path / 'st'}", write=True)
    assert [p.name for p in (tmp_path / "st").iterdir()] == ["kept"]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=r"cannot be written: .*afile is a file"):
        reachable_storage(str(tmp_path / "afile" / "sub" / "st"), write=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "st"]


def test_file_without_its_slashes_is_answered_with_the_path_meant(tmp_path, monkeypatch):
    """`--storage file:st_rel3` was answered "write 'file:///st_rel3' or the plain path": file:///st_rel3 is
    /st_rel3 at the file system's root, not ./st_rel3. The advice is now the plain path as given (read as written,
    where a URI would need its spaces and '%' escaped); `file:` alone names no path; a file:/// URI pyarrow cannot
    parse (a space) or decodes to another folder (a '%' escape) is said before anything is written."""
    from loopscale.cluster.options import validate_storage

    monkeypatch.chdir(tmp_path)
    head = "starts with the scheme 'file' but not its '//': it would be read as a local folder named 'file:' under " \
           "the current directory; write the plain path"  # fmt: skip
    for typo, path in (("file:st_rel3", "st_rel3"), ("file:runs/st", "runs/st"), ("file:/abs/x", "/abs/x"),
                       ("file:my runs", "my runs")):  # fmt: skip
        with pytest.raises(ValueError) as e:
            validate_storage(typo)
        assert str(e.value) == f"storage={typo!r} {head} {path!r}"
    with pytest.raises(ValueError, match=r"^storage='file:' names no path"):
        validate_storage("file:")
    with pytest.raises(ValueError) as e:
        validate_storage("S3:/b/x")
    assert str(e.value).endswith("named 'S3:' under the current directory; write 's3://b/x'")
    with pytest.raises(ValueError, match=r"^storage='file:///tmp/my runs' is not a URI pyarrow reads \(Cannot parse "
                                         r"URI.*\): give the plain path '/tmp/my runs' instead$"):  # fmt: skip
        validate_storage("file:///tmp/my runs")
    with pytest.raises(ValueError, match=r"^storage='file:///tmp/rel%20x' is read as the folder '/tmp/rel x'"):
        validate_storage("file:///tmp/rel%20x")
    # the plain paths the advice names are accepted, as is a URI pyarrow reads as written
    assert validate_storage(f"file://{tmp_path}/st_rel3") == f"file://{tmp_path}/st_rel3"
    assert validate_storage("st_rel3") == str(tmp_path / "st_rel3")
    assert validate_storage("my runs") == str(tmp_path / "my runs")
