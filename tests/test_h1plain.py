"""Plain HTTP/1.1 heads (sim/protocols/h1plain.py) read and written exactly as h11 reads and writes them.

The relay forwards a plain request without an h11 pass, so everything it takes from one must be what h11
would have given: the request (method, target, fields as decide() sees them), its body length and whether the
connection goes on; and every head it writes must be the bytes h11 would have written. Anything else must be
refused (None), so that h11 judges it. Checked from tables and against h11 itself on generated heads (the
policy properties' wire generator, which mangles bytes as a fuzzer would).
"""

from __future__ import annotations

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_policy_props import head_bytes

from sim.protocols.h1plain import (
    PlainRequest,
    PlainResponse,
    head_end,
    plain_request,
    plain_response,
    request_bytes,
    response_bytes,
)
from sim.protocols.reads import MAX_HEAD
from sim.proxy.http_front import request_head
from sim.proxy.policy import RequestHead

POD = "10-42-0-11.invocation.nvcf.svc.cluster.local:8443"
TARGET = f"http://{POD}/v2/nvcf/worker/request-attach"
WORKER_GET = (
    f"GET {TARGET} HTTP/1.1\r\nHost: {POD}\r\nUser-Agent: Go-http-client/1.1\r\n"
    "Authorization: Bearer abc\r\nAccept: application/octet-stream+h1\r\nAccept-Encoding: gzip\r\n\r\n"
).encode()


def head(line: str, *fields: str) -> bytes:
    return (line + "\r\n" + "".join(f + "\r\n" for f in fields) + "\r\n").encode("latin-1")


def get(*fields: str) -> bytes:
    return head(f"GET {TARGET} HTTP/1.1", f"Host: {POD}", *fields)


# What h11 makes of the same bytes --------------------------------------------------------------------
def h11_request(data: bytes) -> tuple[RequestHead, int, bool] | None:
    """(what decide() sees, body length, keep-alive) from an h11 server fed `data`, None if h11 refuses it."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(data)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return None
    if not isinstance(event, h11.Request):
        return None
    length = body_length(conn)
    conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
    conn.send(h11.EndOfMessage())
    return request_head(event, data[: head_end(data)]), length, conn.our_state is h11.DONE


def body_length(conn: h11.Connection) -> int:
    """The bytes of the body h11 frames after the head it has read (fed filler as it asks for more)."""
    length = 0
    while not isinstance(body := conn.next_event(), h11.EndOfMessage):
        if body is h11.NEED_DATA:
            conn.receive_data(b"x" * 65536)
            continue
        assert isinstance(body, h11.Data)
        length += len(body.data)
    return length


def same_as_h11(data: bytes, plain: PlainRequest) -> None:
    theirs = h11_request(data)
    assert theirs is not None, f"h11 refuses what was taken as plain: {data!r}"
    seen, length, keep_alive = theirs
    ours = RequestHead(plain.method, plain.target, "1.1", plain.headers, plain.content_lengths)
    assert (ours, plain.length, plain.keep_alive) == (seen, length, keep_alive)
    assert plain.size == head_end(data)


def h11_response(data: bytes, method: str = "GET") -> tuple[int, list[tuple[str, str]], int, bool]:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=method, target="/", headers=[("host", "pod")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    event = conn.next_event()
    assert isinstance(event, h11.Response), event
    length = body_length(conn)
    fields = [(k.decode().lower(), v.decode()) for k, v in event.headers]
    return event.status_code, fields, length, conn.their_state is h11.DONE


# Tables ---------------------------------------------------------------------------------------------
PLAIN = [
    ("worker GET", WORKER_GET),
    ("POST with a body", get("Content-Length: 5") + b"hello"),
    ("close", get("Connection: close")),
    ("keep-alive, close", get("Connection: keep-alive, Close")),
    ("OWS around values", get("X-A:   b c \t", "Content-Length:\t2 ") + b"ok"),
    ("empty value", get("X-Empty:")),
    ("origin form", head("GET /x HTTP/1.1", "Host: a")),
    ("lower-case token method", head("PATCH http://a/ HTTP/1.1", "Host: a")),
]


@pytest.mark.parametrize("data", [d for _, d in PLAIN], ids=[n for n, _ in PLAIN])
def test_plain_requests_are_read_as_h11_reads_them(data: bytes) -> None:
    plain = plain_request(data[: head_end(data)])
    assert plain is not None
    same_as_h11(data, plain)


NOT_PLAIN = [
    ("HTTP/1.0", head(f"GET {TARGET} HTTP/1.0", f"Host: {POD}")),
    ("HTTP/1.2", head(f"GET {TARGET} HTTP/1.2", f"Host: {POD}")),
    ("lower-case method", head(f"get {TARGET} HTTP/1.1", f"Host: {POD}")),
    ("CONNECT", head(f"CONNECT {POD} HTTP/1.1", f"Host: {POD}")),
    ("HEAD", head(f"HEAD {TARGET} HTTP/1.1", f"Host: {POD}")),
    ("no Host", head(f"GET {TARGET} HTTP/1.1")),
    ("two Hosts", get(f"Host: {POD}")),
    ("chunked", get("Transfer-Encoding: chunked")),
    ("Expect", get("Expect: 100-continue")),
    ("Upgrade", get("Connection: upgrade", "Upgrade: h2c")),
    ("Connection: other token", get("Connection: foo")),
    ("two Content-Lengths", get("Content-Length: 1", "Content-Length: 1")),
    ("Content-Length list", get("Content-Length: 1, 1")),
    ("Content-Length sign", get("Content-Length: +1")),
    ("Content-Length of 21 digits", get("Content-Length: " + "1" * 21)),
    ("bare LF", get().replace(b"\r\n", b"\n")),
    ("obs-fold", get("X-A: b", " c")),
    ("space before colon", get("X-A : b")),
    ("no colon", get("X-A b")),
    ("NUL in a value", get("X-A: b\0c")),
    ("obs-text in a value", get("X-A: caf\xe9")),
    ("tab after method", get().replace(b"GET ", b"GET\t", 1)),
    ("two spaces", get().replace(b"GET ", b"GET  ", 1)),
    ("UTF-8 in the target", get().replace(b"attach", "attach\u00e9".encode(), 1)),
]


@pytest.mark.parametrize("data", [d for _, d in NOT_PLAIN], ids=[n for n, _ in NOT_PLAIN])
def test_anything_else_is_left_to_h11(data: bytes) -> None:
    end = head_end(data)
    assert end > 0 and plain_request(data[:end]) is None


def test_head_end_is_where_h11_ends_a_head() -> None:
    assert head_end(WORKER_GET + b"next") == len(WORKER_GET)
    assert head_end(b"GET / HTTP/1.1\nHost: a\n\nrest") == len(b"GET / HTTP/1.1\nHost: a\n\n")
    assert head_end(WORKER_GET[:-1]) == -1
    # Searching on from where a head arriving in pieces was left: the blank line across the two pieces.
    assert head_end(WORKER_GET, len(WORKER_GET) - 1) == len(WORKER_GET)


RESPONSES = [
    ("pod 200", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello", True),
    ("pod 401", b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\nno", True),
    ("close", b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", True),
    ("no reason", b"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n", True),
    ("no space, no reason", b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", False),
    ("read to the close", b"HTTP/1.1 200 OK\r\n\r\n", False),
    ("chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", False),
    ("204", b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", False),
    ("interim", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", False),
    ("HTTP/1.0", b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
]


@pytest.mark.parametrize(("data", "plain"), [r[1:] for r in RESPONSES], ids=[r[0] for r in RESPONSES])
def test_plain_responses_are_read_as_h11_reads_them(data: bytes, plain: bool) -> None:
    ours = plain_response(data[: head_end(data)])
    assert (ours is not None) is plain
    if isinstance(ours, PlainResponse):
        assert (ours.status, list(ours.headers), ours.length, ours.keep_alive) == h11_response(data)


# Writing -------------------------------------------------------------------------------------------
token = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz-0123456789"), min_size=1, max_size=12)
value = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=20)
fields = st.lists(st.tuples(st.one_of(token, st.just("host")), value), max_size=8)


def h11_bytes(conn: h11.Connection, event: h11.Event) -> bytes:
    return conn.send(event) or b""


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["GET", "POST"]), fields)
def test_request_heads_are_written_as_h11_writes_them(method: str, fs: list[tuple[str, str]]) -> None:
    fs = [(k, v) for k, v in fs if k not in ("content-length", "transfer-encoding")]
    if not any(k == "host" for k, _ in fs) or sum(k == "host" for k, _ in fs) > 1:
        fs = [("host", POD), *((k, v) for k, v in fs if k != "host")]
    ours = request_bytes(method, "/v2/nvcf/worker/request-attach", fs)
    theirs = h11_bytes(
        h11.Connection(h11.CLIENT),
        h11.Request(method=method, target="/v2/nvcf/worker/request-attach", headers=fs),
    )
    assert ours == theirs


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([200, 401, 404, 500]), fields, st.booleans())
def test_response_heads_are_written_as_h11_writes_them(
    status: int, fs: list[tuple[str, str]], keep_alive: bool
) -> None:
    fs = [(k, v) for k, v in fs if k not in ("content-length", "transfer-encoding", "connection")]
    fs.append(("content-length", "0"))
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(get() if keep_alive else get("Connection: close"))
    conn.next_event()
    conn.next_event()
    theirs = h11_bytes(conn, h11.Response(status_code=status, headers=fs, reason=b"Reason"))
    ours = response_bytes(status, b"Reason", fs if keep_alive else [*fs, ("Connection", "close")])
    assert ours == theirs


# Against h11, on generated bytes -------------------------------------------------------------------
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head_bytes(), st.sampled_from([b"", b"Content-Length: 3\r\n", b"Connection: close\r\n"]))
def test_whatever_is_taken_as_plain_is_what_h11_reads(data: bytes, extra: bytes) -> None:
    line_end = data.find(b"\r\n")
    if line_end > 0:  # an extra field after the request line, so framing fields come up often
        data = data[: line_end + 2] + extra + data[line_end + 2 :]
    end = head_end(data)
    plain = plain_request(data[:end]) if end > 0 else None
    if plain is not None:
        same_as_h11(data + b"abc", plain)


def test_a_difference_from_h11_is_caught() -> None:
    """Negative control: the comparison above fails on a reading that differs from h11's in any part."""
    data = get("Connection: close")
    plain = plain_request(data)
    assert plain is not None
    same_as_h11(data, plain)
    for wrong in (
        plain._replace(keep_alive=True),
        plain._replace(length=1),
        plain._replace(headers=plain.headers[:-1]),
        plain._replace(target="/"),
    ):
        with pytest.raises(AssertionError):
            same_as_h11(data, wrong)
