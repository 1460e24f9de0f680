"""loopscale.cluster.connect / options: how commands reach Ray, validated before anything starts."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from loopscale.cluster.connect import DRIVER_THREAD_VARS, ray_session, validate_address
from loopscale.cluster.options import (
    CLUSTER_FLAGS,
    AddressOpt,
    ClusterOptions,
    NumCpusOpt,
    NumGpusOpt,
    RayTempDirOpt,
)


def test_import_is_lazy():
    """Importing loopscale.cluster (and its options module) imports neither ray, pyarrow nor torch."""
    code = (
        "import sys, loopscale.cluster, loopscale.cluster.options, loopscale.cluster.connect;"
        "print(sorted(m for m in ('ray', 'pyarrow', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "addr, expected",
    [(None, None), ("", None), ("auto", "auto"), ("10.0.0.5:6379", "10.0.0.5:6379"),
     ("ray://head-svc:10001", "ray://head-svc:10001"), (" auto ", "auto"), ("[::1]:6379", "[::1]:6379")],
)  # fmt: skip
def test_validate_address_accepts(addr, expected):
    """The documented address forms pass unchanged (stripped)."""
    assert validate_address(addr) == expected


@pytest.mark.parametrize("addr", ["localhost", "http://h:8265", "h:0", "h:70000", "ray://h", "a b:1"])
def test_validate_address_rejects(addr):
    """Anything else is a ValueError that names the field and the valid forms."""
    with pytest.raises(ValueError, match=r"address=.*'auto'.*host:port.*ray://host:port"):
        validate_address(addr)


def _ray_initialized() -> bool:
    import ray

    return ray.is_initialized()


def test_bad_options_fail_before_ray_starts(monkeypatch):
    """num_gpus without CUDA, resources with an address, relative temp dir: ValueError, Ray never started."""
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"num_gpus=1 .*torch.cuda.is_available\(\) is False"):
        with ray_session(num_gpus=1):
            pass
    with pytest.raises(ValueError, match="num_cpus cannot be set when joining"):
        with ray_session("auto", num_cpus=2):
            pass
    with pytest.raises(ValueError, match="must be an absolute path"):
        with ray_session(temp_dir="relative/ray"):
            pass
    with pytest.raises(ValueError, match="num_cpus=0 must be a whole number >= 1"):
        with ray_session(num_cpus=0):
            pass
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # e.g. set by `ray job submit`
    with pytest.raises(ValueError, match="temp_dir cannot be set when joining"):
        with ray_session(temp_dir="/tmp/x"):
            pass
    assert not _ray_initialized()


def test_cluster_options_validate(monkeypatch):
    """ClusterOptions.validate names the CLI flags in its errors. 'auto' is resolved as ray.init resolves it: with
    no Ray on this machine it is refused here, before a command writes anything (a run wrote its folder's spec and
    logs, then failed in ray.init; its dry run passed); with one, its address must answer."""

    from loopscale.cluster import connect

    ClusterOptions().validate()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(connect, "auto_address", lambda: None)
    with pytest.raises(ValueError, match=r"^address='auto': Could not find any running Ray instance; start one"):
        ClusterOptions(address="auto").validate()
    from test_address_probe import _serve_once

    # a gRPC server where 'auto' resolves (it answers HTTP/2's preface as a Ray head does)
    addr, t = _serve_once(bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0]))
    monkeypatch.setattr(connect, "auto_address", lambda: addr)
    ClusterOptions(address="auto").validate()
    t.join(5)
    ClusterOptions(num_cpus=1, ray_temp_dir="/tmp/lsray").validate()
    with pytest.raises(ValueError, match="--num-cpus, --ray-temp-dir cannot be combined with --address .*: the "
                                         "cluster.s nodes decide their resources and where Ray keeps its session "
                                         "files"):  # fmt: skip
        ClusterOptions(address="auto", num_cpus=1, ray_temp_dir="/tmp/x").validate()
    with pytest.raises(ValueError, match="address='nope'"):
        ClusterOptions(address="nope").validate()
    # a resource given as 0 is given too (`--num-gpus 0 --address auto` passed: `if v` skipped it)
    with pytest.raises(ValueError, match="^--num-gpus cannot be combined with --address 'auto'"):
        ClusterOptions(address="auto", num_gpus=0).validate()
    assert CLUSTER_FLAGS == ("--address", "--num-cpus", "--num-gpus", "--ray-temp-dir")


def _unserved_port() -> int:
    """A local TCP port that nothing listens on (bound once to find a free one, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_nobody_serves_is_one_error_before_ray_starts(monkeypatch, tmp_path):
    """--address host:port where nothing listens: one line and exit 2 at once. ray.init used to wait for ever
    (retrying the GCS every 30 s, said only in Ray's log), e.g. `loopscale fit ... --bootstrap 2 --address` and
    `loopscale sweep --address` with a mistyped port."""
    import ray
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    def no_init(*a, **k):  # the refusal must come before Ray is asked to connect (ray.init waited for ever)
        raise AssertionError(f"ray.init was called with {a} {k}")

    monkeypatch.setattr(ray, "init", no_init)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    addr = f"127.0.0.1:{_unserved_port()}"
    with pytest.raises(ValueError, match=rf"no Ray cluster answers at {addr} \(.*\).*leave --address unset"):
        ClusterOptions(address=addr).validate()
    for a in (addr, f"ray://{addr}"):
        with pytest.raises(ValueError, match="no Ray cluster answers at"):
            with ray_session(a):
                pass
    monkeypatch.setenv("RAY_ADDRESS", addr)  # as `ray job submit` sets it, here stale
    with pytest.raises(ValueError, match=f"no Ray cluster answers at {addr}"):
        with ray_session():
            pass
    monkeypatch.delenv("RAY_ADDRESS")
    assert not _ray_initialized()
    table = tmp_path / "runs.csv"
    table.write_text("N,D,loss\n" + "".join(f"{n},{d},{2 + 1e3 / n + 1e2 / d}\n" for n in (1e4, 3e4, 1e5)
                                            for d in (1e5, 3e5, 1e6)))  # fmt: skip
    res = CliRunner().invoke(app, ["fit", str(table), "--law", "chinchilla", "--bootstrap", "2", "--starts", "5",
                                   "--address", addr])  # fmt: skip
    assert res.exit_code == 2, res.output
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: no Ray cluster answers at {addr}"), res.stderr


def test_auto_without_a_cluster_is_one_error(monkeypatch):
    """--address auto with no cluster on this machine: Ray's ConnectionError (a traceback, exit 1) becomes one
    line naming what to do (a ValueError, exit 2 from the console script)."""
    import ray

    def no_cluster(*a, **k):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to by "
                              "setting `--address` flag or `RAY_ADDRESS` environment variable.")  # fmt: skip

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "init", no_cluster)
    with pytest.raises(ValueError) as e:
        with ray_session("auto"):
            pass
    msg = str(e.value)
    assert msg.startswith("address='auto': Could not find any running Ray instance; start one with `ray start")
    assert "\n" not in msg


def test_cluster_flags_parse_in_a_typer_command():
    """The Annotated option aliases give every command the same four flags."""
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    seen = {}

    @app.command()
    def cmd(
        address: AddressOpt = None,
        num_cpus: NumCpusOpt = None,
        num_gpus: NumGpusOpt = None,
        ray_temp_dir: RayTempDirOpt = None,
    ) -> None:
        seen.update(address=address, num_cpus=num_cpus, num_gpus=num_gpus, ray_temp_dir=ray_temp_dir)

    r = CliRunner().invoke(
        app, ["--address", "auto", "--num-cpus", "3", "--num-gpus", "0", "--ray-temp-dir", "/t"]
    )
    assert r.exit_code == 0, r.output
    assert seen == {"address": "auto", "num_cpus": 3, "num_gpus": 0, "ray_temp_dir": "/t"}
    assert CliRunner().invoke(app, ["--num-cpus", "0"]).exit_code == 2  # min=1


def test_every_ray_command_takes_the_cluster_flags():
    """tune-lr, sweep, fit and run of the console script all accept --address/--num-cpus/--num-gpus/--ray-temp-dir."""
    import typer

    from loopscale.sweep.cli import app

    group = typer.main.get_command(app)
    missing = {}
    for name in ("tune-lr", "sweep", "fit", "run"):
        opts = {o for p in group.commands[name].params for o in p.opts}
        lacking = [f for f in CLUSTER_FLAGS if f not in opts]
        if lacking:
            missing[name] = lacking
    assert not missing, f"Ray-using commands without the shared cluster flags: {missing}"


def test_embedded_session_lifecycle(monkeypatch):
    """Embedded Ray: our resources and session dir, reuse when nested, driver threads capped, shut down on exit."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    for k in DRIVER_THREAD_VARS:
        monkeypatch.delenv(k, raising=False)
    assert not ray.is_initialized()
    # Ray's token-auth set-up warns on every start of a local cluster whose RAY_AUTH_MODE is unset
    auth_log, said = logging.getLogger("ray._private.authentication.authentication_token_setup"), []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: said.append((record.levelname, record.getMessage()))
    auth_log.addHandler(handler)
    tmp = tempfile.mkdtemp(prefix="lsr", dir="/tmp")
    try:
        with ray_session(num_cpus=1, temp_dir=tmp, log_to_driver=False) as info:
            # said, but as INFO (it is Ray's default, which we keep: token auth on); nothing at WARNING
            assert any(m.startswith("Token authentication is enabled") for lvl, m in said if lvl == "INFO"), said
            assert not [m for lvl, m in said if lvl != "INFO"], said
            assert os.environ["RAY_AUTH_MODE"] == "token"
            assert info.started_by_us and info.cpus == 1.0 and info.gpus == 0.0 and info.nodes == 1
            assert info.temp_dir == tmp and ":" in info.address
            assert os.path.isdir(os.path.join(tmp, "session_latest"))
            assert all(os.environ[k] == "1" for k in DRIVER_THREAD_VARS)

            @ray.remote(num_cpus=1)
            def where() -> str:
                return ray.get_runtime_context().get_node_id()

            assert ray.get(where.remote()) == ray.get_runtime_context().get_node_id()
            with ray_session() as inner:  # already initialised: reused, not shut down
                assert not inner.started_by_us and inner.address == info.address
            assert ray.is_initialized()
        assert not ray.is_initialized()
        assert all(k not in os.environ for k in DRIVER_THREAD_VARS)
    finally:
        auth_log.removeHandler(handler)
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def test_caller_initialised_ray_is_left_running():
    """When the caller started Ray, ray_session neither restarts nor stops it."""
    import ray

    from loopscale.cluster.connect import ray_session as rs

    tmp = tempfile.mkdtemp(prefix="lsr", dir="/tmp")
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    try:
        with rs() as info:
            assert not info.started_by_us and info.cpus == 1.0
        assert ray.is_initialized()
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


#: The joining driver of test_join_auto_leaves_ray_start_cluster_running, in a process of its own: Ray reads
#: RAY_AUTH_MODE when it is imported, so this process (whose Ray mode depends on which tests ran before) cannot
#: be put in token mode for one test.
_JOIN_AUTO_CHILD = """
import json, logging
import ray
from loopscale.cluster.connect import joined_line, ray_session
said = []
handler = logging.Handler(logging.DEBUG)
handler.emit = lambda record: said.append((record.levelname, record.getMessage()))
logging.getLogger("ray._private.authentication.authentication_token_setup").addHandler(handler)
out = {}
with ray_session("auto", log_to_driver=False) as info:
    out["first"] = [info.started_by_us, info.cpus, info.nodes, info.address, joined_line(info, "auto")]
with ray_session("auto", log_to_driver=False) as info:
    out["second"] = [info.started_by_us, info.cpus, info.nodes, info.address]
out["after_join"] = ray.is_initialized()
with ray_session(num_cpus=2, log_to_driver=False) as own:
    out["own"] = [own.started_by_us, own.cpus, own.address]
out["after_own"] = ray.is_initialized()
out["said"] = said
print(json.dumps(out))
"""


def test_join_auto_leaves_ray_start_cluster_running():
    """address='auto' joins a `ray start --head` cluster (found through RAY_TMPDIR) and leaves it up on exit;
    no address starts our own embedded Ray even while that cluster is registered. The head has token
    authentication (Ray 2.60's default) and the driver runs in token mode, as a joining driver must."""
    import json
    import signal
    import time

    tmp = tempfile.mkdtemp(prefix="lsj", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": tmp, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats", "--block"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        addr_file = os.path.join(tmp, "ray", "ray_current_cluster")
        deadline = time.monotonic() + 90
        while not (os.path.exists(addr_file) and os.path.getsize(addr_file) > 0):
            assert head.poll() is None, "ray start --head exited"
            assert time.monotonic() < deadline, "ray start --head did not come up in 90 s"
            time.sleep(0.25)
        with open(addr_file) as f:
            registered = f.read().strip()
        child = subprocess.run([sys.executable, "-c", _JOIN_AUTO_CHILD], env=env, capture_output=True, text=True,
                               timeout=240)  # fmt: skip
        assert child.returncode == 0, child.stderr[-3000:]
        got = json.loads(child.stdout.strip().splitlines()[-1])
        # joined, not started: the head's 1 CPU, 1 node, at the address `ray start` registered; the console names
        # the cluster `auto` found (it joins any Ray on this machine)
        assert got["first"] == [False, 1.0, 1, registered, f"ray: joined the cluster at {registered} (from --address "
                                                             "auto): 1 node, 1 CPUs, 0 GPUs"]  # fmt: skip
        assert got["second"] == [False, 1.0, 1, registered] and got["after_join"] is False
        # No address while that cluster is registered: still a fresh embedded Ray (ray.init(address=None)
        # would silently connect to the registered one; ray_session uses address="local").
        assert got["own"][:2] == [True, 2.0] and got["own"][2] != registered and got["after_own"] is False
        # joining says Ray's token-auth default too: at INFO, as for the embedded Ray, not as a console WARNING
        assert not [m for lvl, m in got["said"] if lvl != "INFO"], got["said"]
        time.sleep(1.0)
        assert head.poll() is None, "leaving the sessions stopped a cluster we only joined"
        from loopscale.cluster.connect import _ray_owner

        assert _ray_owner(registered) is None  # started by `ray start`: no process's own Ray
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops every process it started
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(tmp, ignore_errors=True)

def test_auto_that_finds_another_processs_own_ray_names_that_process(monkeypatch):
    """``--address auto`` with no cluster registered by ``ray start`` falls back (in Ray) to any Ray running on the
    machine, e.g. another ``loopscale run``'s embedded Ray, which stops when that command ends, its joiners' trials
    with it; the joined line named only the address. The process that owns it is named in a warning."""
    import time

    from loopscale.cluster import connect

    tmp = tempfile.mkdtemp(prefix="lso", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_TMPDIR": tmp}
    env.pop("RAY_ADDRESS", None)
    own = ("import ray, sys, time; ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False); "
           "print(ray.get_runtime_context().gcs_address, flush=True); sys.stdin.read()")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", own], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        gcs = child.stdout.readline().strip()
        assert ":" in gcs, "the child's Ray did not start"
        pid, cmd = connect._ray_owner(gcs)
        assert pid == child.pid and cmd.startswith(sys.executable) and "ray.init(num_cpus=1" in cmd
        monkeypatch.setenv("RAY_TMPDIR", tmp)  # nothing `ray start` registered there
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        monkeypatch.setattr(connect, "auto_address", lambda: gcs)  # Ray's fallback found that Ray (of several here)
        said = connect.auto_joined_owner(" auto ")
        assert said.startswith(f"--address auto found no cluster that `ray start` registered on this machine and "
                               f"joined the Ray that process {pid} (`{sys.executable} -c 'import ray")  # fmt: skip
        assert said.endswith("...`) started for itself: this command's trials run in it and stop when that process "
                             "ends; for a cluster of its own, start one with `ray start --head` and join it (or leave "
                             "--address out for this command's own embedded Ray)")  # fmt: skip
        assert connect.auto_joined_owner(gcs) is None and connect.auto_joined_owner(None) is None  # no auto
        # a registration `ray start` left behind (its cluster gone) names another address: still said
        os.makedirs(os.path.join(tmp, "ray"), exist_ok=True)
        with open(os.path.join(tmp, "ray", "ray_current_cluster"), "w") as f:
            f.write("127.0.0.1:1")
        assert connect.auto_joined_owner("auto") == said
        monkeypatch.setenv("RAY_ADDRESS", gcs)  # an address given through the environment is what was asked for
        assert connect.auto_joined_owner("auto") is None
    finally:
        child.stdin.close()
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    time.sleep(0.5)
    assert connect._ray_owner(gcs) is None  # its Ray ended with it
    shutil.rmtree(tmp, ignore_errors=True)


def test_driver_thread_env_keeps_user_values(monkeypatch):
    """Unset thread variables become 1 inside the block and vanish after; a user's own value is untouched."""
    from loopscale.cluster.connect import driver_thread_env

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with driver_thread_env():
        assert os.environ["OMP_NUM_THREADS"] == "3" and os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert os.environ["OMP_NUM_THREADS"] == "3" and "OPENBLAS_NUM_THREADS" not in os.environ
    with pytest.raises(ValueError, match="threads=0"):
        with driver_thread_env(0):
            pass


def test_recipe_path_and_simulated_cluster_validation():
    """recipe_path finds shipped recipes and lists them on a miss; simulated_cluster rejects bad sizes early."""
    from loopscale.cluster import recipe_path
    from loopscale.cluster.simulate import simulated_cluster

    assert recipe_path("slurm-sbatch.sh").endswith(os.path.join("recipes", "slurm-sbatch.sh"))
    with pytest.raises(ValueError, match="available: .*kuberay-rayjob.yaml"):
        recipe_path("nope.yaml")
    with pytest.raises(ValueError, match="object_store_mb=10 must be >= 80"):
        with simulated_cluster(object_store_mb=10):
            pass
    with pytest.raises(ValueError, match="cpus_per_worker=0"):
        with simulated_cluster(cpus_per_worker=0):
            pass


def test_storage_option_validation():
    """--storage accepts pyarrow URIs and refuses unknown schemes and inline keys before anything runs."""
    from loopscale.cluster.options import validate_storage

    assert validate_storage(None) is None
    assert (
        validate_storage("s3://bucket/loopscale?region=us-east-1") == "s3://bucket/loopscale?region=us-east-1"
    )
    assert validate_storage("/shared/runs") == "/shared/runs"
    with pytest.raises(ValueError, match="not understood by pyarrow.*s3://"):
        validate_storage("nosuch://x/y")
    with pytest.raises(ValueError, match="non-empty"):
        validate_storage(" ")
    with pytest.raises(ValueError, match="inline credentials"):
        validate_storage("s3://AKIAEXAMPLE:secret@bucket/x")
    # a known scheme without its '//' was a local folder named 's3:' under the current directory, trained into
    # without a word (unshared checkpoints on a cluster)
    for typo, fix in (("s3:/bucket/x", "'s3://bucket/x'"), ("gs:b/x", "'gs://b/x'"), ("file:/abs/x", "the plain path '/abs/x'")):
        with pytest.raises(ValueError, match=f"not its '//'.*write {fix}"):
            validate_storage(typo)
    assert validate_storage("S3://Bucket/X") == "s3://Bucket/X"  # pyarrow knows lower-case schemes only


def test_logging_level_warning_keeps_ray_start_up_lines_off_the_console(monkeypatch, capfd):
    """ray_session(logging_level=WARNING) (the bootstrap of `loopscale fit` starts Ray so): neither "Started a
    local Ray instance" nor Ray's token-auth notice reaches stderr/stdout."""
    import logging

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    tmp = tempfile.mkdtemp(prefix="lsq", dir="/tmp")
    try:
        with ray_session(num_cpus=1, temp_dir=tmp, log_to_driver=False, logging_level=logging.WARNING):
            pass
        said = capfd.readouterr()
        shown = said.out + said.err
        assert "Started a local Ray instance" not in shown and "Token authentication" not in shown, shown
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def interactive_sigint():
    """Python's default SIGINT handler for the test, as in an interactive process: a suite started in the
    background by a non-interactive shell ignores SIGINT (ray_session then leaves it alone, as it should)."""
    import signal

    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, outer)


def test_ctrl_c_during_ray_init_is_held_until_ray_is_up(monkeypatch, interactive_sigint):
    """A Ctrl-C while ray.init runs is held: init completes, then KeyboardInterrupt is raised and Ray is shut down
    (a KeyboardInterrupt inside the core worker's constructor left a half-built Ray that crashed at exit with
    SIGSEGV); the SIGINT handler is put back. A second Ctrl-C raises at once."""
    import signal
    import time

    import ray

    calls: list[str] = []
    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))

    def init_interrupted_once(**kw):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs here
        calls.append("init done")

    monkeypatch.setattr(ray, "init", init_interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        with ray_session():
            pytest.fail("the block must not run after a Ctrl-C")
    assert calls == ["init done", "shutdown"]
    assert signal.getsignal(signal.SIGINT) is before

    calls.clear()

    def init_interrupted_twice(**kw):
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        calls.append("init done")

    monkeypatch.setattr(ray, "init", init_interrupted_twice)
    with pytest.raises(KeyboardInterrupt):
        with ray_session():
            pytest.fail("the block must not run after a Ctrl-C")
    assert calls == ["shutdown"] and signal.getsignal(signal.SIGINT) is before


def test_sigterm_in_a_ray_session_stops_the_driver_as_a_ctrl_c(monkeypatch, interactive_sigint):
    """ray.init makes SIGTERM a bare sys.exit(15): `kill`, SLURM at its time limit or Kubernetes deleting a pod
    stopped the driver with exit 15, no message and no last save of Tune's state. Inside ray_session a SIGTERM now
    goes to the SIGINT handler (Tune's while an experiment runs; here Python's: KeyboardInterrupt), the command
    presenter says "interrupted (SIGTERM)" with the resume hint and exits 143, and the SIGTERM handler from before
    the session is put back."""
    import signal
    import sys
    import time

    import ray
    import typer

    from loopscale.cluster import connect
    from loopscale.cluster.options import EXIT_TERMINATED, present_errors

    monkeypatch.setattr(connect, "_SIGTERM_SEEN", [])
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray, "init", lambda **kw: signal.signal(signal.SIGTERM, lambda s, f: sys.exit(s)))
    monkeypatch.setattr(connect, "_cluster_info", lambda *a, **kw: None)
    outer = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:

        def sweep(resume: bool = False):
            with ray_session():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.5)  # the handler runs here
                pytest.fail("the block must not go on after a SIGTERM")

        with pytest.raises(typer.Exit) as exc:
            present_errors(sweep)()
        assert exc.value.exit_code == EXIT_TERMINATED == 143
        assert connect.stopped_by_sigterm()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, outer)


def _stand_in_shutdown(monkeypatch, kill):
    """ray.init / ray.shutdown stand-ins: the shutdown resets SIGTERM as the core worker's does, then runs ``kill``
    as the node's process kill."""
    import signal

    import ray
    import ray._private.worker as worker

    from loopscale.cluster import connect

    class Node:
        def kill_all_processes(self, *a, **k):
            kill()

    def shutdown():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        worker._global_node.kill_all_processes()

    monkeypatch.setattr(connect, "_SIGTERM_SEEN", [])
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: None)
    monkeypatch.setattr(ray, "shutdown", shutdown)
    monkeypatch.setattr(worker, "_global_node", Node())
    monkeypatch.setattr(connect, "_cluster_info", lambda *a, **kw: None)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGINT ignored"])
def test_a_stop_while_ray_shuts_down_is_held_until_it_has(monkeypatch, interactive_sigint, sig):
    """Measured with Ray 2.60: a Ctrl-C during the second or so that ray.shutdown() takes at the end of a session raised its
    KeyboardInterrupt in a garbage-collection callback, where Python drops it (`run` went on and exited 0), and a
    SIGTERM then killed the driver without its line, as the core worker's shutdown sets SIGTERM back to the default
    action before the head's processes are stopped. Here a stand-in shutdown does the same: it resets SIGTERM, then
    the node's process kill gets the signal part-way. The kill runs to its end, and then the session stops as a
    Ctrl-C stops (a SIGTERM remembered as one); a SIGINT the process ignores stays ignored."""
    import signal
    import time

    from loopscale.cluster import connect

    signum = signal.SIGTERM if sig == "SIGTERM" else signal.SIGINT
    if sig == "SIGINT ignored":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    done: list[str] = []

    def kill():
        os.kill(os.getpid(), signum)
        time.sleep(0.3)  # a handler that raised would end the kill here
        done.append("killed")

    _stand_in_shutdown(monkeypatch, kill)
    outer = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    int_before = signal.getsignal(signal.SIGINT)
    try:
        if sig == "SIGINT ignored":
            with ray_session():
                pass
        else:
            with pytest.raises(KeyboardInterrupt):
                with ray_session():
                    pass
        assert done == ["killed"]  # the shutdown ran to its end first
        assert connect.stopped_by_sigterm() is (sig == "SIGTERM")
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.getsignal(signal.SIGINT) is int_before
    finally:
        signal.signal(signal.SIGTERM, outer)


def test_a_held_ctrl_c_is_not_dropped_when_the_session_runs_inside_an_except_clause(monkeypatch, interactive_sigint):
    """The held Ctrl-C was raised only when ``sys.exc_info()`` was empty; inside the session's generator that also
    sees an exception its caller is handling, so a session opened in an ``except`` clause dropped it (the command
    went on and exited 0)."""
    import signal

    _stand_in_shutdown(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGINT))
    outer = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        try:
            raise FileNotFoundError("a caller handling its own error")
        except FileNotFoundError:
            with pytest.raises(KeyboardInterrupt):
                with ray_session():
                    pass
    finally:
        signal.signal(signal.SIGTERM, outer)


def test_a_second_ctrl_c_stops_a_shutdown_that_hangs(monkeypatch, interactive_sigint):
    """Every Ctrl-C during Ray's shutdown was held: one that hung could not be stopped from the keyboard. The first
    is held; a second raises at once, part-way through the shutdown."""
    import signal
    import time

    done: list[str] = []

    def kill():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        done.append("first held")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        done.append("the shutdown went on")

    _stand_in_shutdown(monkeypatch, kill)
    outer = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    int_before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            with ray_session():
                pass
        assert done == ["first held"]
        assert signal.getsignal(signal.SIGINT) is int_before and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, outer)


def test_sigterm_during_ray_init_is_held_until_ray_is_up(monkeypatch, interactive_sigint):
    """A SIGTERM while ray.init runs (before it, ray.init's own handler made it a silent sys.exit(15)) is held as a
    Ctrl-C is: init completes, Ray is shut down, the command presenter says "interrupted (SIGTERM)" and exits 143;
    Ray's set_sigterm_handler and the SIGTERM handler from before the session are put back."""
    import signal
    import sys
    import time

    import ray
    import ray._private.utils as ray_utils

    from loopscale.cluster import connect
    from loopscale.cluster.options import EXIT_TERMINATED

    calls: list[str] = []
    ray_sets = ray_utils.set_sigterm_handler
    monkeypatch.setattr(connect, "_SIGTERM_SEEN", [])
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(connect, "_cluster_info", lambda *a, **kw: None)

    def init_terminated(**kw):
        ray._private.utils.set_sigterm_handler(lambda s, f: sys.exit(s))  # as ray.init does part-way
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs here
        calls.append("init done")

    code, after = _session_exit_code(monkeypatch, init_terminated)
    assert code == EXIT_TERMINATED
    assert calls == ["init done", "shutdown"]
    assert connect.stopped_by_sigterm()
    assert after is signal.SIG_DFL  # the handler from before the session
    assert ray_utils.set_sigterm_handler is ray_sets


def _session_exit_code(monkeypatch, init) -> tuple[int, object]:
    """The exit code of a command whose ``ray_session`` calls ``init`` as ``ray.init`` (with SIGTERM's default
    handler outside the session), and the SIGTERM handler left after it."""
    import signal

    import ray
    import typer

    from loopscale.cluster.options import present_errors

    monkeypatch.setattr(ray, "init", init)
    outer = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:

        def sweep(resume: bool = False):
            with ray_session():
                pytest.fail("the block must not run after a SIGTERM")

        with pytest.raises(typer.Exit) as exc:
            present_errors(sweep)()
        return exc.value.exit_code, signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, outer)


def test_a_sigterm_to_the_group_during_ray_init_is_an_interruption_not_an_error(monkeypatch, interactive_sigint,
                                                                                capsys):
    """`timeout -s TERM 3 loopscale run ...` (a SIGTERM to the whole group, as SLURM's scancel sends): the held
    SIGTERM also stopped the Ray processes ray.init had started, ray.init then failed ("The current node timed out
    during startup") and the command showed a traceback and exited 1. It is the interruption: exit 143."""
    import signal

    import ray

    from loopscale.cluster import connect
    from loopscale.cluster.options import EXIT_TERMINATED

    monkeypatch.setattr(connect, "_SIGTERM_SEEN", [])
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)

    def init_whose_processes_died(**kw):
        os.kill(os.getpid(), signal.SIGTERM)  # held by the session
        raise Exception("The current node timed out during startup.")  # Ray's, after its GCS was killed

    code, _ = _session_exit_code(monkeypatch, init_whose_processes_died)
    assert code == EXIT_TERMINATED and connect.stopped_by_sigterm()
    assert "Ray did not start after the interruption: The current node timed out" in capsys.readouterr().err
    monkeypatch.setattr(connect, "_SIGTERM_SEEN", [])

    def init_failing(**kw):  # no signal: Ray's own error stays an error
        raise Exception("The current node timed out during startup.")

    monkeypatch.setattr(ray, "init", init_failing)
    with pytest.raises(Exception, match="timed out during startup"):
        with ray_session():
            pass


def test_unreachable_storage_is_one_line_before_anything_is_written(tmp_path, s3_offline):
    """sweep / run / tune-lr / status with a --storage bucket that cannot be reached (no network, a mistyped bucket)
    say so in one line and exit 2 before the --out folder is written (sweep died at its first read of the storage
    with pyarrow's OSError traceback, exit 1, after writing the folder's spec, corpus and logs)."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    for cmd in (["sweep", "smoke"], ["run", "smoke"], ["tune-lr", "smoke"]):
        out = tmp_path / cmd[0]
        res = CliRunner().invoke(app, [*cmd, "--out", str(out), "--storage", "s3://b/x"])
        assert res.exit_code == 2, res.output
        assert "storage 's3://b/x' cannot be reached: When resolving region" in res.output
        assert "Traceback" not in res.output and not out.exists()
    res = CliRunner().invoke(app, ["status", str(tmp_path), "--storage", "s3://b/x"])
    assert res.exit_code == 2 and "storage 's3://b/x' cannot be reached" in res.output


def test_a_stale_ray_address_in_the_environment_is_named_as_such(monkeypatch):
    """With RAY_ADDRESS set and no --address, the refusals say to unset RAY_ADDRESS for the embedded Ray: they said
    'leave --address unset', which it already was."""
    addr = f"127.0.0.1:{_unserved_port()}"
    monkeypatch.setenv("RAY_ADDRESS", addr)
    for kw in ({}, {"num_cpus": 2}):
        with pytest.raises(ValueError, match="unset RAY_ADDRESS") as e:
            with ray_session(**kw):
                pass
        assert "leave --address unset" not in str(e.value)
    assert not _ray_initialized()


def test_a_cluster_that_refuses_the_auth_token_is_said_so():
    """Joining a token-auth cluster (Ray 2.60's default) without RAY_AUTH_MODE=token: host:port said 'Failed to
    connect ...; start one with `ray start --head`' of a cluster that was running, and ray:// ended in the Ray
    Client's ConnectionError traceback after 30 s. Both now say what a joining driver needs."""
    from loopscale.cluster import connect

    class FakeRay:
        def __init__(self, exc):
            self.exc = exc

        def init(self, **kw):
            raise self.exc

    refused = ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")
    refused.__cause__ = RuntimeError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect.")
    with pytest.raises(ValueError, match="refused this process's Ray auth token.*RAY_AUTH_MODE=token") as e:
        connect._ray_init(FakeRay(refused), "10.0.0.5:6379", True, {}, None, None, None, logging.WARNING)
    assert "ray start --head" not in str(e.value)
    timeout = ConnectionError("ray client connection timeout")
    with pytest.raises(ValueError, match=r"Ray Client did not connect \(ray client connection timeout\).*RAY_AUTH"):
        connect._ray_init(FakeRay(timeout), "ray://10.0.0.5:10001", True, {}, None, None, None, logging.WARNING)


def test_the_command_line_is_told_its_own_flags(monkeypatch):
    """The embedded Ray's option errors, through the commands' ClusterOptions, name the flags (--ray-temp-dir,
    --num-gpus, --address); they said temp_dir=..., num_gpus=... and 'pass address=', the Python keywords."""
    import torch

    with pytest.raises(ValueError, match=r"^--ray-temp-dir 'rel/x' must be an absolute path"):
        ClusterOptions(ray_temp_dir="rel/x").validate()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^--num-gpus 1 but .*use --num-gpus 0 .*give --address to join") as e:
        ClusterOptions(num_gpus=1).validate()
    assert "=" not in str(e.value).split("is False")[1]
    with pytest.raises(ValueError, match=r"^temp_dir='rel' must be"):  # Python callers keep the keywords
        with ray_session(temp_dir="rel"):
            pass


@pytest.mark.parametrize("cmd", [["sweep", "--preset", "smoke"], ["tune-lr", "--preset", "smoke"],
                                 ["run", "--preset", "smoke"]])  # fmt: skip
@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_ray_client_address_is_refused_by_the_tune_commands_before_anything_is_written(cmd, how, monkeypatch,
                                                                                         tmp_path):  # fmt: skip
    """Over Ray Client, Tune runs its experiment driver in the cluster: loopscale's callbacks wrote the folder's
    records on the head node's disk (the same disk only on one machine), no progress showed, a finished sweep exited
    130 as "interrupted" (Tune's Ctrl-C handler was never installed here) and tune-lr could never finish. `sweep`,
    `tune-lr` and `run` refuse a ray:// address (flag or RAY_ADDRESS) at once, naming what to do; nothing is written
    and nothing is dialled (no server listens there)."""
    from typer.testing import CliRunner

    from loopscale.sweep.cli import app

    addr = f"ray://127.0.0.1:{_unserved_port()}"
    out = tmp_path / "out"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if how == "env":
        monkeypatch.setenv("RAY_ADDRESS", addr)
    args = [*cmd, "--out", str(out)] + (["--address", addr] if how == "flag" else [])
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    said = "--address" if how == "flag" else "RAY_ADDRESS"
    assert res.stderr.startswith(f"error: {said} {addr!r} (Ray Client) cannot run `loopscale {cmd[0]}`: over Ray "
                                 "Client, Ray Tune runs its experiment driver inside the cluster"), res.stderr  # fmt: skip
    assert "ray job submit" in res.stderr and "--address HOST:PORT" in res.stderr
    assert not out.exists()
    # a host:port address given with RAY_ADDRESS=ray:// in the environment is the one joined: not refused for it
    if how == "env":
        with pytest.raises(ValueError, match="no Ray cluster answers"):
            ClusterOptions(address=f"127.0.0.1:{_unserved_port()}").validate(tune="loopscale sweep")


def test_tune_under_a_ray_client_connection_is_refused_in_python_too(monkeypatch):
    """The Python API (run_sweep / run_tune_lr) reaches fit_tuner, which refuses a Ray Client connection."""
    import ray

    from loopscale.sweep.grid import fit_tuner

    monkeypatch.setattr(ray.util.client.ray, "is_connected", lambda: True)
    with pytest.raises(ValueError, match=r"connected through Ray Client \(ray://\): over Ray Client, Ray Tune runs"):
        fit_tuner(object())


def test_options_name_ray_address_when_the_environment_sets_it(monkeypatch):
    """RAY_ADDRESS=garbage said only Ray's 'Invalid address format: garbage', and RAY_ADDRESS with --num-cpus said
    Ray's 'num_cpus, temp_dir cannot be set ...' after the folder was written: both now name RAY_ADDRESS and the
    flags, before anything starts."""
    monkeypatch.setenv("RAY_ADDRESS", "garbage")
    with pytest.raises(ValueError, match=r"RAY_ADDRESS='garbage' \(set in this environment; --address was not given\) "
                       r"is not a Ray address; .* or unset it"):  # fmt: skip
        ClusterOptions().validate()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    with pytest.raises(ValueError, match=r"^--num-cpus, --ray-temp-dir cannot be combined with RAY_ADDRESS="
                       r"'10.0.0.5:6379' \(set in this environment: the command joins that cluster\).*unset "
                       r"RAY_ADDRESS to use the embedded local Ray$"):  # fmt: skip
        ClusterOptions(num_cpus=1, ray_temp_dir="/tmp/x").validate()
    # an --address given wins over the environment, as in ray.init: its flags are refused naming --address
    with pytest.raises(ValueError, match=r"^--num-cpus cannot be combined with --address 'auto'.*drop --address"):
        ClusterOptions(address="auto", num_cpus=1).validate()
    monkeypatch.delenv("RAY_ADDRESS")
    ClusterOptions(num_cpus=1).validate()


def test_a_local_storage_that_cannot_be_written_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    """--storage under a file ended in a 72-line NotADirectoryError traceback (exit 1), and one on a read-only file
    system (/sys) in a PermissionError traceback; file://rel_x (two slashes) made a folder ./rel_x and then said to
    use file://. Each is now one line, exit 2, before the --out folder is written; a writable storage is probed in
    directories made for the probe and removed again (Tune creates it when it starts), leaving nothing."""
    from typer.testing import CliRunner

    from loopscale.cluster.options import reachable_storage, validate_storage
    from loopscale.sweep.cli import app

    blocker = tmp_path / "afile"
    blocker.write_text("x")
    cases = [(str(blocker / "sub"), r"storage '.*afile/sub' \(--storage, or the spec's storage_path\) cannot be "
                                    r"written: .*afile is a file; give a writable directory")]  # fmt: skip
    if os.path.isdir("/sys"):  # sysfs refuses new entries, also to root (a permission check alone passes for root)
        cases.append(("/sys/loopscale_probe_dir", r"storage '/sys/loopscale_probe_dir' .* cannot be written: "))
    for storage, msg in cases:
        for cmd in (["sweep", "smoke"], ["run", "smoke"]):
            out = tmp_path / f"out_{cmd[0]}"
            res = CliRunner().invoke(app, [*cmd, "--out", str(out), "--storage", storage])
            assert res.exit_code == 2, res.output
            assert len(res.stderr.strip().splitlines()) == 1 and re.search(msg, res.stderr), res.stderr
            assert not out.exists()
    with pytest.raises(ValueError, match=r"file:// URI takes an absolute path .*'rel_x' is read as a host name"):
        validate_storage("file://rel_x/runs")
    assert validate_storage("file:///abs/runs") == "file:///abs/runs"
    # file://localhost/abs is file:///abs: it was accepted as written, then pyarrow refused the host and the
    # reachability check created ./localhost/abs under the current directory
    assert validate_storage("file://localhost/abs/runs") == "file:///abs/runs"
    assert validate_storage("FILE://localhost/abs/runs") == "file:///abs/runs"
    good = tmp_path / "shared" / "runs"
    reachable_storage(f"file://{good}", write=True)
    assert not (tmp_path / "shared").exists()
    reachable_storage(str(tmp_path / "never"), write=False)  # read-only commands (status) create nothing
    assert not (tmp_path / "never").exists()


def test_a_storage_whose_filesystem_raises_an_arrow_error_is_one_line(monkeypatch):
    """abfs:// without credentials: pyarrow raised ArrowException (not an OSError), which escaped as a traceback."""
    import pyarrow as pa

    from loopscale.cluster import storage as st
    from loopscale.cluster.options import reachable_storage

    def refused(uri):
        raise pa.ArrowException("Unknown error: AuthenticationException")

    monkeypatch.setattr(st, "exists", refused)
    with pytest.raises(ValueError, match=r"storage 'abfs://c@acct.dfs.core.windows.net/x' cannot be reached: Unknown "
                       r"error: AuthenticationException; check the network"):  # fmt: skip
        reachable_storage("abfs://c@acct.dfs.core.windows.net/x")


def test_no_node_fits_names_what_a_trial_asks_and_what_each_node_has(monkeypatch):
    """A spec asking for a GPU (or more CPUs than any node has) on a cluster without one waited for ever, saying
    only Tune's notice once a minute (cut in the middle, where it named the resources). sweep and tune-lr now say
    up front what one trial asks and what each alive node has; a node that fits says nothing."""
    import ray

    from loopscale.cluster.connect import no_node_fits
    from loopscale.sweep import console

    nodes = [{"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},
             {"Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0}}]  # fmt: skip
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    assert no_node_fits(1, 1) is None and no_node_fits(4, 0) is None
    why = no_node_fits(8, 0)
    assert why.startswith("each trial asks for 8 CPUs and 0 GPUs on one node (the spec's resources), and no node of "
                          "this Ray cluster has them (2 node(s): 2 CPUs / 0 GPUs, 4 CPUs / 1 GPUs)")  # fmt: skip
    assert "waits for ever" in why and "add such a node and rerun with --resume" in why
    # lowering the spec's resources is another spec: its folder refuses it (with --resume too), so another --out
    assert "lower resources.cpus / resources.gpus in the spec and rerun with another --out folder" in why
    assert "1 CPUs and 2 GPUs" in no_node_fits(1, 2)
    tune_line = ("No trial is running and no new trial has been started within the last 60 seconds. This could be "
                 "due to the cluster not having enough resources available. You asked for 1.0 CPUs and 1.0 GPUs per "
                 "trial, but the cluster only has 2.0 CPUs and 0 GPUs available. Stop the tuning and adjust the "
                 "required resources (e.g. via the `ScalingConfig` or `resources_per_trial`, or `num_workers` for "
                 "rllib), or add more resources to your cluster.")  # fmt: skip
    note = console.notice_of(f"(TunerInternal pid=1) WARNING insufficient_resources_manager.py:163 -- {tune_line}")
    assert note is not None and "You asked for 1.0 CPUs and 1.0 GPUs per trial, but the cluster only has" in note


def test_ray_address_from_the_environment_is_checked_as_the_flag_is(monkeypatch):
    """RAY_ADDRESS=127.0.0.1:1 (nothing there) passed the checks that --address 127.0.0.1:1 fails, so `run` wrote
    spec.yaml, corpus.json and logs/ before Ray failed to join; it is refused the same way, naming the variable."""
    import socket

    from loopscale.cluster.options import ClusterOptions

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ValueError, match=rf"no Ray cluster answers at 127.0.0.1:{port} .* unset RAY_ADDRESS "
                                         rf"\(now '127.0.0.1:{port}'\)"):  # fmt: skip
        ClusterOptions().validate(tune="loopscale run")
    ClusterOptions().validate()  # `fit` without a bootstrap never joins it: not probed (Ray's start would be)


def test_a_tune_commands_bad_address_message_offers_no_ray_client_form():
    """`run --address nope` listed 'ray://host:port' among the forms to use, which every Tune command refuses."""
    from loopscale.cluster.options import ClusterOptions

    with pytest.raises(ValueError) as e:
        ClusterOptions(address="nope").validate(tune="loopscale run")
    assert "'host:port'" in str(e.value) and "ray://" not in str(e.value)
    with pytest.raises(ValueError, match=r"'ray://host:port' \(Ray Client"):  # fit's bootstrap can use it
        ClusterOptions(address="nope").validate()


def test_the_joined_line_names_the_cluster_and_where_its_address_came_from(monkeypatch):
    """`--address auto` joined whatever Ray ran on the machine (another process's embedded one included) and no
    console line said which; the grid and tune-lr now print the cluster joined, its nodes and resources."""
    from loopscale.cluster.connect import RayInfo, joined_line

    info = RayInfo(address="10.0.0.5:6379", started_by_us=False, cpus=48.0, gpus=2.0, nodes=3)
    assert joined_line(info, "10.0.0.5:6379") == "ray: joined the cluster at 10.0.0.5:6379: 3 nodes, 48 CPUs, 2 GPUs"
    assert joined_line(info, " auto ").startswith("ray: joined the cluster at 10.0.0.5:6379 (from --address auto): ")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert joined_line(info, None) is None  # a Ray the caller started, used as it is
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert joined_line(info, None).startswith("ray: joined the cluster at 10.0.0.5:6379 (from RAY_ADDRESS): ")
    own = RayInfo(address="127.0.0.1:6379", started_by_us=True, cpus=2.0, gpus=0.0, nodes=1)
    assert joined_line(own, None) is None  # the embedded Ray: nothing to say


def test_a_cluster_that_stops_answering_before_the_fit_is_said_so(monkeypatch):
    """The head stopped between `run`'s sweep and its fit: the bootstrap's address check said "no Ray cluster
    answers at ...; check the address", as for a mistyped address, of the cluster the command had just trained on.
    The fit stage says that the cluster stopped answering, that the runs are recorded and how to fit them."""
    from loopscale.cluster.connect import ClusterUnreachable, check_reachable
    from loopscale.sweep.run import _cluster_lost_before_fit

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    addr = f"127.0.0.1:{_unserved_port()}"
    with pytest.raises(ValueError) as e:
        with _cluster_lost_before_fit(addr):
            check_reachable(addr)
    msg = str(e.value)
    assert not isinstance(e.value, ClusterUnreachable)
    assert msg.startswith(f"the Ray cluster at {addr} stopped answering before the fit (")
    assert "every finished run is recorded in runs.parquet" in msg and "without --address" in msg
    assert "check the address" not in msg
    # no cluster asked for (an embedded run): the error is left as it is
    with pytest.raises(ClusterUnreachable, match="no Ray cluster answers at"):
        with _cluster_lost_before_fit(None):
            check_reachable(addr)


def test_a_joined_cluster_that_stops_answering_is_said_while_the_command_runs(monkeypatch):
    """A head lost mid-sweep ended the command 60 s later with exit 1 and not a line (Ray's core gave up on its
    GCS and said why only in the head's log). The joined session's watch says it after two failed checks, once,
    and says it again when the cluster answers again; a single missed check says nothing."""
    import threading

    from loopscale.cluster import connect

    said: list[str] = []
    monkeypatch.setattr(connect, "say_stop", said.append)
    answers = iter([True, False, True, False, False, False, False, True, True])
    stop = threading.Event()

    def probe() -> bool:
        try:
            return next(answers)
        except StopIteration:
            stop.set()
            return True

    connect.watch_joined_gcs("10.0.0.5:6379", stop, period=0.001, probe=probe)
    assert said == [
        "warning: the Ray cluster at 10.0.0.5:6379 stopped answering (no connection for 0.002 s); if it is not back "
        "within about a minute, Ray ends this command (exit 1): the runs finished so far are recorded, and the same "
        "command with --resume, once a cluster is there, goes on without training them again",
        "ray: the cluster at 10.0.0.5:6379 answers again",
    ]
    # the default probe: a port nobody serves does not answer, a listening one does
    assert connect._gcs_port_answers(f"127.0.0.1:{_unserved_port()}") is False
    import socket

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        assert connect._gcs_port_answers(f"127.0.0.1:{srv.getsockname()[1]}") is True
