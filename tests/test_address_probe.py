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


def _serve_h2_404() -> tuple[str, threading.Thread]:
    """A two-connection HTTP/2 server in clear text (as a proxy or ingress can be) that answers every request with
    ``:status 404`` and no body, as such a server answers a path it does not route. Returns its ``host:port`` and
    its thread."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    def read(conn, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError
            data += chunk
        return data

    def serve(conn) -> None:
        with conn:
            conn.settimeout(10)
            try:
                read(conn, 24)  # the client's connection preface
                conn.sendall(frame(0x4, 0, 0))  # our SETTINGS (empty)
                while True:
                    head = read(conn, 9)
                    kind, flags, stream = head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                    read(conn, int.from_bytes(head[:3], "big"))
                    if kind == 0x4 and not flags & 0x1:
                        conn.sendall(frame(0x4, 0x1, 0))  # ACK the client's SETTINGS
                    elif kind == 0x1:  # HEADERS of a request: ':status 404' (HPACK static index 13), ended
                        conn.sendall(frame(0x1, 0x4 | 0x1, stream, bytes([0x80 | 13])))
                        time.sleep(0.5)
                        return
            except (ConnectionError, OSError):
                return

    def run() -> None:  # two connections: the preface check's, then the call's
        with srv:
            for _ in range(2):
                serve(srv.accept()[0])

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return f"127.0.0.1:{port}", t


def test_a_grpc_or_http2_service_without_rays_gcs_is_refused(monkeypatch):
    """An HTTP/2 server that is not Ray (a proxy's 404) and a gRPC server without Ray's GCS both answer the
    connection preface as a Ray head does; both passed, and `ray.init` then failed 20 s later, after the run had
    written its folder. A call of a GCS method tells them apart: both answer UNIMPLEMENTED, and are refused before
    Ray starts. A real Ray head passing is checked with `ray start` in test_cluster_connect.py."""
    import grpc

    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    addr, t = _serve_h2_404()
    with pytest.raises(ValueError) as e:
        check_reachable(addr, timeout=5)
    t.join(5)
    msg = str(e.value)
    assert msg.startswith(f"something listens at {addr}, but not a Ray head: it answered gRPC's UNIMPLEMENTED to "
                          "the Ray GCS call ray.rpc.NodeInfoGcsService/GetClusterId"), msg  # fmt: skip
    assert "\n" not in msg

    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(ValueError, match=rf"^something listens at 127\.0\.0\.1:{port}, but not a Ray head: it "
                                             r"answered gRPC's UNIMPLEMENTED to the Ray GCS call "):  # fmt: skip
            check_reachable(f"127.0.0.1:{port}", timeout=5)
        monkeypatch.setenv("RAY_USE_TLS", "1")  # a TLS head is not called in clear text: passes, as before
        check_reachable(f"127.0.0.1:{port}", timeout=5)
    finally:
        server.stop(None)


def test_a_token_auth_head_is_refused_before_anything_when_this_process_is_not_in_token_mode(monkeypatch):
    """A driver without RAY_AUTH_MODE=token joining a token-auth cluster (Ray 2.60's default) passed the probe
    (its GCS answers UNAUTHENTICATED, as a GCS does), wrote the run's folder and was refused by ``ray.init`` 23 s
    later. The probe now refuses it at once, naming what the driver needs; in token mode the probe, which sends
    no token, leaves the decision to Ray."""
    from concurrent import futures

    import grpc

    from loopscale.cluster.connect import TokenAuthRefused

    class Unauthenticated(grpc.GenericRpcHandler):
        def service(self, details):
            def refuse(request, context):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: Authentication token is missing")

            return grpc.unary_unary_rpc_method_handler(refuse)

    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), handlers=[Unauthenticated()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        for mode in (None, "disabled"):
            if mode is None:
                monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
            else:
                monkeypatch.setenv("RAY_AUTH_MODE", mode)
            with pytest.raises(TokenAuthRefused, match=rf"^address='127\.0\.0\.1:{port}': the Ray cluster there uses "
                                                       rf"token authentication .*\(RAY_AUTH_MODE {mode or 'unset'}\); a "
                                                       r"cluster with token authentication .* needs RAY_AUTH_MODE=token"):  # fmt: skip
                check_reachable(f"127.0.0.1:{port}", timeout=5)
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        check_reachable(f"127.0.0.1:{port}", timeout=5)  # with a token: Ray's join decides
    finally:
        server.stop(None)
