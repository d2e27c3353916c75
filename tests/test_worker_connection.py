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

import re
import time
import uuid

from proxy_wire import ATTACH, POD, connect, marked, pod_events, request
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
