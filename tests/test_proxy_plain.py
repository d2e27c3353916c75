"""The proxy's two HTTP/1.1 paths answer alike (issue 32 item 2).

A plain request the policy forwards is relayed as its bytes came (sim/proxy/plain_relay.py); every other
request is read and answered by h11 as before. The same request spelled with bare LF line ends is not plain
(h1plain refuses it; h11 reads it as the same request), so each case below is sent both ways on a running
stack, and the worker must see the same response, bytes and all (but the Date and the pod's service time),
the access log the same line (but times), and the pod the same request. The cases are the shapes the plain
path handles itself: keep-alive, Connection: close, a body sent with the head or after it, requests
pipelined in one write, a body cut short.
"""

from __future__ import annotations

import re
import socket
import ssl
import time
import uuid
from pathlib import Path

import pytest
from proxy_wire import ATTACH, POD, PodStandIn, connect, marked, pod_events, rebind, request
from stack_records import Records

from clusters.local import LocalStack
from scenarios.result import ScenarioResult
from sim.protocols.h1plain import head_end, plain_request

TARGET = f"POST http://{POD}:8443{ATTACH} HTTP/1.1"
VOLATILE = re.compile(
    rb"(date|x-envoy-upstream-service-time): [^\r\n]*\r\n"
)  # differ from one send to the next


def as_h11_only(raw: bytes) -> bytes:
    """The same request with bare LF line ends in its head: h11 reads it alike, the plain path does not."""
    end = head_end(raw)
    return raw[:end].replace(b"\r\n", b"\n") + raw[end:]


def send(stack: LocalStack, *parts: bytes, responses: int, gap: float = 0.0) -> bytes:
    """`parts` on one connection (`gap` seconds apart), then the bytes of `responses` whole responses."""
    with connect(stack) as tls:
        for i, part in enumerate(parts):
            if i and gap:
                time.sleep(gap)
            tls.sendall(part)
        buffer, out = b"", b""
        for _ in range(responses):
            while (end := head_end(buffer)) < 0 or len(buffer) < end + content_length(buffer[:end]):
                chunk = tls.recv(65536)
                assert chunk, f"the proxy closed mid-response: {buffer!r}"
                buffer += chunk
            size = end + content_length(buffer[:end])
            out, buffer = out + buffer[:size], buffer[size:]
        return VOLATILE.sub(b"", out)


def content_length(head: bytes) -> int:
    found = re.search(rb"(?im)^content-length: *([0-9]+)", head)
    assert found, head
    return int(found[1])


def logged(records: Records, request_id: str) -> dict[str, str]:
    line = records.access_line(request_id=request_id)
    return {k: v for k, v in line.items() if k not in ("start", "duration", "ust")}


def pod_saw(stack: LocalStack, request_id: str) -> list[tuple[str, str]]:
    return [
        (e["kind"], str(e.get("status")))
        for e in pod_events(stack)
        if e.get("requestId") == request_id and e["kind"] in ("pod.request", "attach.get", "attach.post")
    ]


def post(name: str, body: bytes = b"{}", *fields: tuple[str, str]) -> bytes:
    return request(TARGET, marked(name), ("Content-Length", str(len(body))), *fields, body=body)


CASES = {
    "get": ([request(f"GET http://{POD}:8443{ATTACH} HTTP/1.1", marked("{id}"))], 1, 0.0),
    "post": ([post("{id}")], 1, 0.0),
    "close": ([post("{id}", b"{}", ("Connection", "close"))], 1, 0.0),
    "body-later": ([post("{id}", b"0123456789")[:-10], b"0123456789"], 1, 0.05),
    "pipelined": ([post("{id}") + post("{id}-2", b"[]")], 2, 0.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_plain_path_answers_as_h11s(http_stack: tuple[LocalStack, ScenarioResult], case: str) -> None:
    stack, _ = http_stack
    parts, responses, gap = CASES[case]
    seen = []
    for spelling in ("plain", "h11"):
        rid = f"ef-plain-{case}-{spelling}-{uuid.uuid4().hex[:6]}"
        raw = [p.replace(b"{id}", rid.removeprefix("ef-").encode()) for p in parts]
        if spelling == "h11":
            raw = [as_h11_only(raw[0]), *raw[1:]]
        # The path each takes is h1plain's choice: the control that the two sends differ where it matters.
        assert (plain_request(raw[0][: head_end(raw[0])]) is not None) is (spelling == "plain")
        records = Records(stack.state_dir)
        answer = send(stack, *raw, responses=responses, gap=gap)
        line = logged(records, rid)
        seen.append((answer.replace(rid.encode(), b"ID"), {**line, "request_id": "ID"}, pod_saw(stack, rid)))
    (plain_answer, plain_line, plain_pod), (h11_answer, h11_line, h11_pod) = seen
    assert plain_answer == h11_answer
    assert plain_line == h11_line
    assert plain_pod == h11_pod and plain_pod, "the pod saw neither: the comparison would prove nothing"


def test_a_body_cut_short_is_answered_as_h11_answers_it(
    http_stack: tuple[LocalStack, ScenarioResult],
) -> None:
    """The worker closes its side with half the body sent: both paths log the codec's 400 DPE."""
    stack, _ = http_stack
    flags = []
    for spelling in ("plain", "h11"):
        rid = f"plain-cut-{spelling}-{uuid.uuid4().hex[:6]}"
        raw = post(rid, b"0123456789")[:-5]
        if spelling == "h11":
            raw = as_h11_only(raw)
        records = Records(stack.state_dir)
        tls = connect(stack)
        with tls:
            tls.sendall(raw)
            tls.unwrap().shutdown(socket.SHUT_WR)  # close_notify, then the end of what the worker sends
        line = records.access_line(request_id=f"ef-{rid}")
        flags.append((line["status"], line["flags"], line["rx"]))
    assert flags[0] == flags[1] == ("400", "DPE", "5")


def test_a_field_with_obs_text_is_passed_on_as_it_came(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    """HTTP/1.1 allows bytes 0x80-0xff in a field value (obs-text), and Envoy relays them. Not plain, so h11
    reads it; the proxy used to end the connection without an answer when it sent the value on as ASCII."""
    stack, _ = http_stack
    rid = f"plain-obs-text-{uuid.uuid4().hex[:6]}"
    records = Records(stack.state_dir)
    raw = request(f"GET http://{POD}:8443{ATTACH} HTTP/1.1", marked(rid), ("X-Note", "caf\xe9"))
    assert plain_request(raw[: head_end(raw)]) is None
    answer = send(stack, raw, responses=1)
    assert answer.startswith(b"HTTP/1.1 401 ")  # the pod's own answer: the request reached it
    assert logged(records, f"ef-{rid}")["status"] == "401"
    assert pod_saw(stack, f"ef-{rid}")


class StandInPod(PodStandIn):
    """Stands in for pod 10.42.0.12 and answers every request with `self.response`, closing the connection
    after it when `self.close`: responses the pods never send."""

    def __init__(self, secret: Path):
        self.response, self.close = b"", False
        super().__init__(secret, "stand-in-pod")

    def answer(self, tls: ssl.SSLSocket) -> None:
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
            while (end := head_end(data)) >= 0:  # the proxy's requests here have no body
                data = data[end:]
                tls.sendall(self.response)
                if self.close:
                    return


NOT_PLAIN_RESPONSES = {
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", False),
    "interim-then-200": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        False,
    ),
    "no-content": (b"HTTP/1.1 204 No Content\r\n\r\n", False),
    "read-to-the-close": (b"HTTP/1.1 200 OK\r\n\r\nuntil the close", True),
    "bare-lf": (b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", False),
    "obs-text": (b"HTTP/1.1 200 OK\r\nX-A: caf\xe9\r\nContent-Length: 2\r\n\r\nok", False),
    "plain-close": (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", True),
}


def test_responses_h11_must_frame_reach_the_worker_as_h11_frames_them(
    http_stack: tuple[LocalStack, ScenarioResult],
) -> None:
    """A plain request whose response is not plain is answered through h11 (plain_relay's hand-over), as the
    h11-only spelling of the same request is. (Runs last: it takes pod .12 away.)"""
    stack, _ = http_stack
    pod2 = "10-42-0-12.invocation.nvcf.svc.cluster.local"
    stack.components.kill("invocation-service-1")
    stand_in = StandInPod(stack.state_dir / "certs" / "secrets" / "invocation-service-worker-tls")
    original = rebind(stack.state_dir, "10.42.0.12:8443/tcp", stand_in.port)
    try:
        for name, (response, close) in NOT_PLAIN_RESPONSES.items():
            stand_in.response, stand_in.close = response, close
            answers = []
            for spelling in ("plain", "h11"):
                raw = request(
                    f"GET http://{pod2}:8443{ATTACH} HTTP/1.1",
                    marked(f"plain-{name}-{spelling}"),
                    ("Connection", "close"),
                    host=f"{pod2}:8443",
                )
                raw = raw if spelling == "plain" else as_h11_only(raw)
                answers.append(everything(stack, raw).replace(spelling.encode(), b"X"))
            # Parked connections to the killed pod are spent first (503): send until the stand-in answers.
            assert answers[0] == answers[1], name
            assert answers[0].startswith(b"HTTP/1.1 200 OK") or name == "no-content", (name, answers[0][:200])
    finally:
        rebind(stack.state_dir, "10.42.0.12:8443/tcp", original["bindings"]["10.42.0.12:8443/tcp"])
        stand_in.stop()


def everything(stack: LocalStack, raw: bytes) -> bytes:
    """`raw` on a new connection (asking to close), and all the proxy sends until it closes; a 503 from a
    connection parked to the killed pod is sent again (each is spent once)."""
    for _ in range(10):
        with connect(stack) as tls:
            tls.sendall(raw)
            out = b""
            while chunk := tls.recv(65536):
                out += chunk
        if not out.startswith(b"HTTP/1.1 503"):
            return VOLATILE.sub(b"", out)
    raise AssertionError(f"the proxy never reached the stand-in pod: {out[:200]!r}")
