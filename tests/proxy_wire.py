"""A worker's side of the proxy's HTTP/1.1 front, byte by byte: raw TLS connections, requests as sent, responses
as framed; stand-in pods that answer as the real ones never do; a stack whose proxy has a short stream idle
timeout. Shared by the Envoy-fidelity tests."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import threading
from pathlib import Path

from clusters.local import LocalBackend, LocalStack
from scenarios.engine import run_scenario
from scenarios.load import load_scenario

WD = "grpc-worker.example.com"
SNI = f"invocation.{WD}"
POD = "10-42-0-11.invocation.nvcf.svc.cluster.local"
NO_POD = "10-42-0-99.invocation.nvcf.svc.cluster.local"  # a well-formed pod name no DNS knows
ATTACH = "/v2/nvcf/worker/request-attach"
SHORT = 5.0  # a local reply or a pod's 401 takes milliseconds; this only bounds a broken proxy


def tls_context(stack: LocalStack) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=stack.status()["ca"]["stack"])
    return ctx


def connect(stack: LocalStack) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", stack.status()["proxy"]["http"]["port"]), timeout=SHORT)
    return tls_context(stack).wrap_socket(sock, server_hostname=SNI)


class Wire:
    """A worker's connection to the proxy, read response by response (Content-Length framing)."""

    def __init__(self, tls: ssl.SSLSocket):
        self.tls, self.buffer = tls, b""

    def send(self, data: bytes) -> None:
        self.tls.sendall(data)

    def _fill(self) -> bool:
        chunk = self.tls.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def head(self) -> tuple[bytes, dict[str, str]]:
        """The next response head: its status line and headers."""
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"the proxy closed without a response head: {self.buffer!r}"
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        line, *fields = head.decode("latin-1").split("\r\n")
        return line.encode(), {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}

    def response(self, head_request: bool = False) -> tuple[bytes, dict[str, str], bytes]:
        line, headers = self.head()
        length = 0 if head_request else int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            assert self._fill(), "the proxy closed mid-body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return line, headers, body

    def closed_within(self, seconds: float) -> bool:
        """True if the proxy closes the connection within `seconds` (reading and dropping what it sends)."""
        self.tls.settimeout(seconds)
        try:
            while self._fill():
                pass
        except TimeoutError:
            return False
        except (ConnectionError, ssl.SSLError):
            pass
        return True


def request(
    line: str, *headers: tuple[str, str], body: bytes = b"", host: str | None = f"{POD}:8443"
) -> bytes:
    fields = ([("Host", host)] if host else []) + list(headers)
    return (line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "\r\n").encode("latin-1") + body


def marked(name: str) -> tuple[str, str]:
    return ("X-Request-Id", f"ef-{name}")


def pod_events(stack: LocalStack) -> list[dict]:
    events = []
    for path in sorted((stack.state_dir / "events").glob("invocation-service-*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return events


def reached_pod(stack: LocalStack, request_id: str) -> bool:
    return any(e.get("requestId") == request_id for e in pod_events(stack) if e["kind"] == "pod.request")


def up_with_stream_idle(stack: LocalStack, idle: float) -> None:
    """`stack` up on http-callback, its proxy's stream idle timeout `idle` seconds (the proxy reads
    NCPSIM_PROXY_STREAM_IDLE from the environment it inherits from this process at spawn)."""
    saved = os.environ.get("NCPSIM_PROXY_STREAM_IDLE")
    os.environ["NCPSIM_PROXY_STREAM_IDLE"] = str(idle)
    try:
        result = run_scenario(load_scenario("http-callback"), LocalBackend(stack.root), stack.name, keep=True)
    finally:
        if saved is None:
            os.environ.pop("NCPSIM_PROXY_STREAM_IDLE", None)
        else:
            os.environ["NCPSIM_PROXY_STREAM_IDLE"] = saved
    assert result.ok, result.failures


class PodStandIn:
    """Stands in for a pod's TLS listener with the stack's own pod certificate, a thread a connection; a
    subclass answers each in `answer`. `stop()` ends the listener (connections end with their peers)."""

    def __init__(self, secret: Path, name: str):
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(secret / "tls.crt", secret / "tls.key")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with (
            contextlib.suppress(OSError, ssl.SSLError),
            conn,
            self.tls.wrap_socket(conn, server_side=True) as tls,
        ):
            self.answer(tls)

    def answer(self, tls: ssl.SSLSocket) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        # close() alone leaves the thread blocked in accept() on Linux: shutdown() wakes it.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(SHORT)


class DyingPod:
    """Stands in for pod 10.42.0.12's TLS listener (the stack's own pod certificate): reads a request head,
    writes the start of a 200 whose body never completes, and drops the connection."""

    PARTIAL = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: text/plain\r\n\r\nonly part"

    def __init__(self, secret: Path):
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(secret / "tls.crt", secret / "tls.key")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.served = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="dying-pod", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                with (
                    contextlib.suppress(OSError, ssl.SSLError),
                    conn,
                    self.tls.wrap_socket(conn, server_side=True) as tls,
                ):
                    data = b""
                    while b"\r\n\r\n" not in data and (chunk := tls.recv(65536)):
                        data += chunk
                    tls.sendall(self.PARTIAL)
                self.served.set()

    def close(self) -> None:
        # close() alone leaves the thread blocked in accept() on Linux (the join then waited its whole 5 s):
        # shutdown() wakes it, as the listener's end.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(SHORT)
        assert not self.thread.is_alive(), "the dying pod's thread did not end"


def rebind(state: Path, address: str, port: int) -> dict:
    """Point a virtual address at another real port in the stack's network map (components re-read it)."""
    path = state / "netmap.json"
    original = json.loads(path.read_text())
    changed = {**original, "bindings": {**original["bindings"], address: port}}
    tmp = path.with_suffix(".test")
    tmp.write_text(json.dumps(changed))
    tmp.replace(path)  # a new inode: readers notice the change
    return original
