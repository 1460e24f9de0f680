"""Process helpers for tests that stop a driver subprocess (SIGINT/SIGKILL) and clean up what it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def end_processes(pids: set[int]) -> None:
    """SIGTERM processes this test started (Ray agents survive a SIGKILLed driver), then SIGKILL leftovers."""
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 10
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_driver(command: str, spec: Path, out: Path, *extra: str) -> subprocess.Popen:
    """Start ``python -m loopscale.sweep.commands COMMAND SPEC --out OUT --num-cpus 2 *extra`` in its own process
    session (so a signal reaches the driver alone), with Ray's session files under /tmp/lsray_t."""
    env = dict(os.environ, RAY_TMPDIR="/tmp/lsray_t")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loopscale.sweep.commands",
            command,
            str(spec),
            "--out",
            str(out),
            "--num-cpus",
            "2",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )


def run_to_end(proc: subprocess.Popen, timeout: float | None = 600) -> tuple[int, bytes, bytes]:
    """Wait for ``proc``, then end every process it started (Ray agents can outlive their driver);
    returns (exit code, stdout, stderr). A driver still running after ``timeout`` (s; None: no limit) is killed
    and the test fails with the end of its stderr (a hung driver must fail the test, not the CI job)."""
    seen: set[int] = set()
    deadline = None if timeout is None else time.time() + timeout
    try:
        while proc.poll() is None:
            seen |= descendants(proc.pid)
            if deadline is not None and time.time() > deadline:
                proc.kill()
                _, err = proc.communicate()
                raise AssertionError(f"driver still running after {timeout:.0f} s; stderr: {err.decode()[-3000:]}")
            time.sleep(0.3)
        out, err = proc.communicate()
    finally:
        end_processes(seen)
    return proc.returncode, out, err
