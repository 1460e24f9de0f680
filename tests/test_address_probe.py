"""--address where something other than a Ray head listens: refused in one line before Ray starts (ray.init waited
for ever on it, and a Ctrl-C or SIGTERM was held until Ray had started)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from loopscale.cluster.connect import check_reachable


def _serve_once(answer: bytes | None, *, at_once: bool = False, hold: float = 0.0) -> tuple[str, threading.Thread]:
    """A one-connection TCP server on 127.0.0.1 that reads the client's first bytes (``at_once``: closes before
    reading them), then writes ``answer`` (None: nothing), waits ``hold`` s and closes. Returns its ``host:port``
    and its thread."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def run() -> None:
        with srv:
            conn, _ = srv.accept()
            with conn:
                if at_once:
                    return
                conn.recv(64)
                if answer:
                    conn.sendall(answer)
                time.sleep(hold)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return f"127.0.0.1:{port}", t


@pytest.mark.parametrize(
    "answer, said",
    [
        (b"HTTP/1.0 400 Bad request\r\n\r\n", "it answered in HTTP/1 (a web server)"),
        (b"<!DOCTYPE HTML>\n<html>", "it answered in HTTP/1 (a web server)"),
        (b"-ERR unknown command\r\n", r"it answered b'-ERR unkn'"),
        (None, "it closed the connection without answering"),
    ],
)
def test_a_service_that_is_not_a_ray_head_is_refused(answer, said, monkeypatch):
    """A web server (e.g. the dashboard's port typed for the GCS's), another protocol, or a port that closes at
    once: one error naming what answered; Ray is not started."""
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    addr, t = _serve_once(answer)
    with pytest.raises(ValueError) as e:
        check_reachable(addr, timeout=5)
    t.join(5)
    msg = str(e.value)
    assert msg.startswith(f"something listens at {addr}, but not a Ray head: {said.replace(chr(92), '')}"), msg
    assert "8265 is the dashboard's" in msg and "\n" not in msg


def test_a_port_that_closes_at_once_or_says_nothing_is_refused(monkeypatch):
    """A server that accepts and closes before reading (the client then sees a reset, which passed as 'cannot be
    told') or accepts and says nothing: Ray's start hung on both, holding Ctrl-C; both are refused."""
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    addr, t = _serve_once(None, at_once=True)
    with pytest.raises(ValueError, match=rf"^something listens at {addr}, but not a Ray head: it closed the "
                                         r"connection without answering"):  # fmt: skip
        check_reachable(addr, timeout=5)
    t.join(5)
    addr, t = _serve_once(None, hold=3.0)
    with pytest.raises(ValueError, match=rf"^something listens at {addr}, but not a Ray head: it did not answer "
                                         r"within 1 s"):  # fmt: skip
        check_reachable(addr, timeout=1)
    t.join(5)


def test_a_grpc_server_passes_and_tls_is_not_probed(monkeypatch):
    """A server that answers HTTP/2's preface with a SETTINGS frame, as a Ray head's GCS and Ray Client ports do
    (checked against `ray start --head` of Ray 2.60: b'\\x00\\x00\\x18\\x04...'), passes; so does anything under
    RAY_USE_TLS, whose port expects a TLS handshake first."""
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    addr, t = _serve_once(bytes([0, 0, 0x18, 0x4, 0, 0, 0, 0, 0]) + bytes(24))
    check_reachable(addr, timeout=5)
    t.join(5)
    addr2, t2 = _serve_once(bytes([0, 0, 0x18, 0x4, 0, 0, 0, 0, 0]))
    check_reachable(f"ray://{addr2}", timeout=5)
    t2.join(5)
    monkeypatch.setenv("RAY_USE_TLS", "1")
    addr3, t3 = _serve_once(b"HTTP/1.0 400 Bad request\r\n\r\n")
    check_reachable(addr3, timeout=5)  # not told apart from a TLS head: passes, as before
    t3.join(5)
