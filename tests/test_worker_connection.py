"""A worker's kept-alive connection moves between the proxy's callbacks and its coroutine path request by request
(sim/proxy/worker_connection.py), and answers as if one path had served it all.

The plain spelling of a forwarded request takes the callbacks once a pod connection is parked; the same request
with bare LF line ends is not plain (h1plain refuses it, h11 reads it alike) and takes the coroutine path. A
sequence that mixes them on one connection, pipelined and split, hands the connection over and back several
times; sent again spelled for h11 throughout it never leaves the coroutine path. The worker must see the same
bytes (but the Date and the pod's service time), the access log the same lines (but times), the pod the same
requests.
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_wire import (
    ATTACH,
    POD,
    SNI,
    PodStandIn,
    connect,
    marked,
    pod_events,
    rebind,
    request,
    tls_context,
    up_with_stream_idle,
)
from stack_records import Records

from clusters.local import LocalStack
from scenarios.result import ScenarioResult
from sim.protocols.h1plain import head_end, plain_request

VOLATILE = re.compile(rb"(date|x-envoy-upstream-service-time): [^\r\n]*\r\n")


def get(rid: str) -> bytes:
    return request(f"GET http://{POD}:8443{ATTACH} HTTP/1.1", marked(rid))


def post(rid: str, body: bytes = b"{}") -> bytes:
    target = f"POST http://{POD}:8443{ATTACH} HTTP/1.1"
    return request(target, marked(rid), ("Content-Length", str(len(body))), body=body)


def h11_only(raw: bytes) -> bytes:
    end = head_end(raw)
    return raw[:end].replace(b"\r\n", b"\n") + raw[end:]


# (writes, each a list of (request, spelled for h11)), the pieces a write is cut into after its first n bytes
SEQUENCE: list[tuple[list[tuple[str, str]], int]] = [
    ([("get", "plain")], 0),
    ([("get", "h11")], 0),
    ([("post", "plain")], 0),
    ([("post", "plain")], -4),  # the body's last bytes later: the callbacks hand the request over
    ([("get", "plain")], 0),
    ([("post", "plain"), ("get", "h11"), ("post", "plain"), ("get", "plain")], 0),  # pipelined
    ([("get", "plain")], 20),  # a head in two pieces
    ([("post", "plain")], 0),
]


def exchange(stack: LocalStack, all_h11: bool, tag: str) -> tuple[list[bytes], list[str]]:
    """SEQUENCE on one connection: each write's responses, and the request ids sent."""
    ids: list[str] = []
    answers: list[bytes] = []
    with connect(stack) as tls:
        buffer = b""
        for n, (requests, cut) in enumerate(SEQUENCE):
            data = b""
            for i, (kind, spelling) in enumerate(requests):
                rid = f"wc-{tag}-{n}-{i}-{uuid.uuid4().hex[:6]}"
                ids.append(rid)
                raw = get(rid) if kind == "get" else post(rid)
                assert plain_request(raw[: head_end(raw)]) is not None  # the control: plain as spelled
                data += h11_only(raw) if all_h11 or spelling == "h11" else raw
            pieces = [data[:cut], data[cut:]] if cut else [data]
            for piece in pieces:
                tls.sendall(piece)
                time.sleep(0.05)
            out = b""
            for _ in requests:
                while (end := head_end(buffer)) < 0 or len(buffer) < end + length(buffer[:end]):
                    chunk = tls.recv(65536)
                    assert chunk, f"the proxy closed mid-response: {buffer!r}"
                    buffer += chunk
                size = end + length(buffer[:end])
                out, buffer = out + buffer[:size], buffer[size:]
            answers.append(out)
    return [VOLATILE.sub(b"", a) for a in answers], ids


def length(head: bytes) -> int:
    found = re.search(rb"(?im)^content-length: *([0-9]+)", head)
    assert found, head
    return int(found[1])


def test_a_connection_handed_between_the_paths_answers_as_one_path_would(
    http_stack: tuple[LocalStack, ScenarioResult],
) -> None:
    stack, _ = http_stack
    seen = []
    for all_h11 in (False, True):
        tag = "h11" if all_h11 else "mixed"
        records = Records(stack.state_dir)
        answers, ids = exchange(stack, all_h11, tag)
        lines, pod = [], []
        for rid in ids:
            line = records.access_line(request_id=f"ef-{rid}")
            lines.append(
                {k: v for k, v in line.items() if k not in ("start", "duration", "ust", "request_id")}
            )
            pod.append(
                [
                    e["kind"]
                    for e in pod_events(stack)
                    if e.get("requestId") == f"ef-{rid}"
                    and e["kind"] in ("pod.request", "attach.get", "attach.post")
                ]
            )
        for rid in ids:
            answers = [a.replace(rid.encode(), b"ID") for a in answers]
        seen.append((answers, lines, pod))
    (mixed_answers, mixed_lines, mixed_pod), (h11_answers, h11_lines, h11_pod) = seen
    assert mixed_answers == h11_answers
    assert mixed_lines == h11_lines
    assert mixed_pod == h11_pod and all(mixed_pod), "the pod saw none: the comparison would prove nothing"


# A pod that misbehaves on a parked connection: the callbacks hand the exchange over, and the worker, the access
# log and the events read as when the coroutine path met the same pod ---------------------------------------
IDLE = 0.6  # NCPSIM_PROXY_STREAM_IDLE for this module's second stack (Envoy's 300 s, scaled down)
POD2 = "10-42-0-12.invocation.nvcf.svc.cluster.local"
BODY_8K = bytes(range(256)) * 32
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
# What the stand-in does with a request that asks for it (X-Behave), on a connection the proxy had parked.
BEHAVIOURS = {
    "silent": [],  # no answer: the stream idle timeout (408 SI)
    "cut": [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part", None],  # then the close (UC)
    "close": [None],  # closed before any byte of a response
    "split-head": [OK[:12], OK[12:]],  # a head in two pieces: the coroutine path reads the rest
    "split-body": [OK[:-1], OK[-1:]],
    "past-the-end": [OK + b"HTTP/1.1 200 OK\r\n"],  # bytes past the response: the connection is not reused
    "chunked": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"],
    "8k": [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY_8K), BODY_8K)],  # one TLS record
}


class ScriptedPod(PodStandIn):
    """Stands in for pod 10.42.0.12: answers OK to every request but one carrying X-Behave, which gets
    BEHAVIOURS[its value] (each piece a write 0.1 s apart; None: the close)."""

    def __init__(self, secret: Path):
        self.seen: list[str] = []
        super().__init__(secret, "scripted-pod")

    def answer(self, tls: ssl.SSLSocket) -> None:
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
            while (end := head_end(data)) >= 0:  # the proxy's requests here have no body
                head, data = data[:end], data[end:]
                found = re.search(rb"(?im)^x-behave: *([-a-z0-9]+)", head)
                self.seen.append(found[1].decode() if found else "ok")
                for i, piece in enumerate(BEHAVIOURS[found[1].decode()] if found else [OK]):
                    time.sleep(0.1 if i else 0)
                    if piece is None:
                        return
                    tls.sendall(piece)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, ScriptedPod]]:
    """A stack whose proxy has a short stream idle timeout, pod .12 replaced by a ScriptedPod."""
    stack = LocalStack("wc-scripted", root=tmp_path_factory.mktemp("ncpsim-wc"))
    pod = None
    try:
        up_with_stream_idle(stack, IDLE)
        stack.components.kill("invocation-service-1")
        pod = ScriptedPod(stack.state_dir / "certs" / "secrets" / "invocation-service-worker-tls")
        rebind(stack.state_dir, "10.42.0.12:8443/tcp", pod.port)
        yield stack, pod
    finally:
        if pod is not None:
            pod.stop()
        stack.down()
        assert not stack.launcher.running(), "components still running after down"


def misbehaved(stack: LocalStack, behaviour: str, spelling: str, rid: str) -> bytes:
    """On one connection: an OK request (so a connection to the stand-in is parked), then one asking for
    `behaviour` and to close; everything the worker gets. Parked connections to the killed pod are spent
    first (503): the first request is sent until the stand-in answers it."""
    target = f"GET http://{POD2}:8443{ATTACH} HTTP/1.1"
    first = request(target, marked(f"{rid}-warm"), host=f"{POD2}:8443")
    second = request(
        target, marked(rid), ("X-Behave", behaviour), ("Connection", "close"), host=f"{POD2}:8443"
    )
    if spelling == "h11":
        second = h11_only(second)
    for _ in range(10):
        with connect(stack) as tls:
            tls.settimeout(5.0)
            tls.sendall(first)
            buffer = b""
            while (end := head_end(buffer)) < 0 or len(buffer) < end + length(buffer[:end]):
                chunk = tls.recv(65536)
                assert chunk, f"the proxy closed mid-response: {buffer!r}"
                buffer += chunk
            if not buffer.startswith(b"HTTP/1.1 200"):
                continue
            tls.sendall(second)
            out = buffer[end + length(buffer[:end]) :]
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                while chunk := tls.recv(65536):
                    out += chunk
            return VOLATILE.sub(b"", out)
    raise AssertionError("the proxy never reached the stand-in pod")


@pytest.mark.parametrize("behaviour", list(BEHAVIOURS))
def test_a_pod_misbehaving_on_a_parked_connection_reads_as_on_the_coroutine_path(
    scripted: tuple[LocalStack, ScriptedPod], behaviour: str
) -> None:
    stack, pod = scripted
    seen = []
    for spelling in ("plain", "h11"):
        rid = f"wc-{behaviour}-{spelling}-{uuid.uuid4().hex[:6]}"
        records = Records(stack.state_dir)
        answer = misbehaved(stack, behaviour, spelling, rid).replace(rid.encode(), b"ID")
        line = records.access_line(request_id=f"ef-{rid}")
        failed = [
            {k: v for k, v in e.items() if k not in ("ts", "requestId")}
            for e in events(stack)
            if e.get("requestId") == f"ef-{rid}"
        ]
        seen.append(
            (
                answer,
                {k: v for k, v in line.items() if k not in ("start", "duration", "ust", "request_id")},
                failed,
            )
        )
    assert seen[0] == seen[1]
    assert behaviour in pod.seen, "the stand-in never saw the request: the comparison would prove nothing"


def events(stack: LocalStack) -> list[dict]:
    path = stack.state_dir / "events" / "worker-callback-proxy.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_pipelining_worker_that_reads_late_gets_every_response_in_order(
    scripted: tuple[LocalStack, ScriptedPod],
) -> None:
    """Requests pipelined faster than the proxy answers them, to a worker that reads late through a small
    receive buffer: the proxy stops reading the worker past a StreamReader's limit, and its writes back wait
    for the worker (the callbacks hand the exchange over to drain). Every request is answered once, in
    order, and logged."""
    stack, _ = scripted
    tag = uuid.uuid4().hex[:6]
    target = f"GET http://{POD2}:8443{ATTACH} HTTP/1.1"
    count = 1500
    batch = b"".join(
        request(target, marked(f"wc-pipe-{tag}-{i}"), ("X-Behave", "8k"), host=f"{POD2}:8443")
        for i in range(count)
    )
    assert len(batch) > 2 * 65536  # past the limit at which the proxy stops reading the worker
    records = Records(stack.state_dir)
    misbehaved(stack, "split-body", "plain", f"wc-pipe-{tag}-warm")  # a connection to the stand-in parked
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", stack.status()["proxy"]["http"]["port"]))
    with tls_context(stack).wrap_socket(sock, server_hostname=SNI) as tls:
        out = pipelined(tls, batch, late=1.0, responses=count)
    assert out == [(200, BODY_8K)] * count
    lines = [records.access_line(request_id=f"ef-wc-pipe-{tag}-{i}") for i in range(count)]
    assert [line["status"] for line in lines] == ["200"] * count


def pipelined(tls: ssl.SSLSocket, batch: bytes, late: float, responses: int) -> list[tuple[int, bytes]]:
    """`batch` written as fast as the proxy takes it, its responses read only after `late` seconds, on one
    thread (an SSLSocket is not to be used from two at once); each response's status and body."""
    tls.setblocking(False)
    sent, buffer, out = 0, b"", []
    reading_from = time.monotonic() + late
    deadline = time.monotonic() + 60.0
    while len(out) < responses:
        assert time.monotonic() < deadline, (
            f"{len(out)} of {responses} responses, {sent} of {len(batch)} sent"
        )
        reading = time.monotonic() >= reading_from
        readable, writable, _ = select.select(
            [tls] if reading else [], [tls] if sent < len(batch) else [], [], 0.1
        )
        if writable:
            with contextlib.suppress(ssl.SSLWantWriteError, ssl.SSLWantReadError):
                sent += tls.send(batch[sent : sent + 16384])
        if readable or (reading and tls.pending()):
            with contextlib.suppress(ssl.SSLWantReadError):
                while chunk := tls.recv(65536):
                    buffer += chunk
        while (end := head_end(buffer)) >= 0 and len(buffer) >= end + length(buffer[:end]):
            size = end + length(buffer[:end])
            out.append((int(buffer[9:12]), buffer[end:size]))
            buffer = buffer[size:]
    return out
