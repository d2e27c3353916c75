"""A client's exchange and the echo function read a plain message without h11, and give what h11 gives.

`exchange` (every HTTP/1.1 client in ncpsim: the worker's callback legs, the bench's load) reads a plain
response (sim.protocols.h1plain) itself and hands anything else to h11 with the bytes read so far; the echo
function answers a plain request without an h11 pass. Each is run here both ways on the same bytes (the
plain path switched off is the old code, h11 throughout) and must give the same response or the same error,
leave the connection reusable or not alike, and read the next response on it alike.
"""

from __future__ import annotations

import asyncio

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_h1plain import RESPONSES
from test_policy_props import head_bytes

from sim.protocols import http1, request_attach
from sim.protocols.http1 import H11Stream, decode_headers, exchange, read_body, respond
from sim.protocols.request_attach import parse_inner_response, request_h1
from sim.worker.http_callback import _echo_h11, echo_function

NEXT = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"


class Wire:
    """A writer that keeps what it is given."""

    def __init__(self) -> None:
        self.sent = bytearray()

    def write(self, data: bytes) -> None:
        self.sent += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


def _run(
    pieces: list[bytes], eof: bool, method: str, fields: list[tuple[str, str]] | None, body: bytes
) -> list[object]:
    """Two exchanges on one stream over `pieces` (arriving one read each): what each gave, or its error,
    and the bytes the stream wrote (the first request with `fields`, default a Host, and `body`)."""

    async def go() -> list[object]:
        reader = asyncio.StreamReader()
        for piece in pieces:
            reader.feed_data(piece)
        if eof:
            reader.feed_eof()
        stream = H11Stream(h11.CLIENT, reader, Wire())  # type: ignore[arg-type]
        seen: list[object] = []
        for first in (True, False):
            asked = (fields if first and fields is not None else [("host", "pod")], body if first else b"")
            try:
                got = await exchange(stream, method, "/x", *asked, timeout=0.2)
                seen.append((got.status, got.headers, got.body, stream.reusable()))
            except (h11.ProtocolError, http1.PeerClosed, TimeoutError, UnicodeError) as exc:
                seen.append((type(exc).__name__, str(exc)))
                break
        seen.append(bytes(stream.writer.sent))  # type: ignore[attr-defined]
        return seen

    return asyncio.run(go())


async def _h11_reads(self: H11Stream, method: str, timeout: float | None) -> None:
    return None  # the plain path switched off: every byte read by h11, as before it


async def _h11_writes(self: H11Stream, *request: object) -> bool:
    return False  # and every request written by h11


def both_ways(
    pieces: list[bytes],
    eof: bool = True,
    method: str = "GET",
    fields: list[tuple[str, str]] | None = None,
    body: bytes = b"",
) -> tuple[list[object], list[object]]:
    """`_run` as it is, and with h11 reading and writing everything (the old code); and, with h11 writing
    only, the plain reading still gives the same: each half of the plain path stands on its own."""
    plain = _run(pieces, eof, method, fields, body)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(H11Stream, "send_plain_request", _h11_writes)
        assert _run(pieces, eof, method, fields, body) == plain
        patch.setattr(H11Stream, "plain_response", _h11_reads)
        old = _run(pieces, eof, method, fields, body)
    return plain, old


CASES = [(name, data) for name, data, _ in RESPONSES] + [
    ("cut short", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhalf"),
    ("nothing", b""),
    ("not HTTP", b"SSH-2.0-OpenSSH\r\n\r\n"),
    ("bare LF", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"),
    ("bytes past it", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"),
    ("head without end", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"),
    ("obs-text", b"HTTP/1.1 200 OK\r\nX-A: caf\xe9\r\nContent-Length: 0\r\n\r\n"),
]


@pytest.mark.parametrize("then_next", [False, True])
@pytest.mark.parametrize("data", [d for _, d in CASES], ids=[n for n, _ in CASES])
def test_a_response_is_read_as_h11_reads_it(data: bytes, then_next: bool) -> None:
    pieces = [data, NEXT] if then_next else [data]
    plain, old = both_ways(pieces)
    assert plain == old


@pytest.mark.parametrize("at", [1, 5, 17, 30, 38])
def test_a_response_in_pieces_is_read_as_h11_reads_it(at: int) -> None:
    data = RESPONSES[0][1] + NEXT
    plain, old = both_ways([data[:at], data[at:]])
    assert plain == old
    assert plain[0][:3] == (200, [("content-type", "text/plain"), ("content-length", "5")], b"hello")


def test_a_plain_response_keeps_the_connection_for_the_next_request() -> None:
    plain, old = both_ways([RESPONSES[0][1], NEXT])
    assert plain[1] == (200, [("content-length", "4")], b"next", True) and plain == old
    assert plain[2] == old[2] and bytes(plain[2]).count(b"GET /x HTTP/1.1\r\n") == 2  # type: ignore[arg-type]


def test_a_difference_from_h11_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a plain reading that differs from h11's (its status off by one) is seen, so the
    plain path is the one taken for a plain response and the comparison can fail."""
    real = http1.plain_response
    monkeypatch.setattr(
        http1, "plain_response", lambda head: (r := real(head)) and r._replace(status=r.status + 1)
    )
    plain, old = both_ways([RESPONSES[0][1]])
    assert plain != old and (plain[0][0], old[0][0]) == (201, 200)


def test_a_head_request_and_a_request_that_closes_stay_with_h11() -> None:
    plain, old = both_ways([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", NEXT], method="HEAD")
    assert plain == old and plain[0][:3] == (200, [("content-length", "5")], b"")


def test_a_timeout_is_h11s_timeout() -> None:
    plain, old = both_ways([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhe"], eof=False)
    assert plain == old and plain[0][0] == "TimeoutError"


@settings(max_examples=100, deadline=None)
@given(head_bytes(), st.sampled_from([b"", b"ok", b"okEXTRA"]))
def test_generated_responses_are_read_as_h11_reads_them(request_head: bytes, body: bytes) -> None:
    """The wire generator's heads turned into responses (a status line instead of the request line)."""
    _, _, rest = request_head.partition(b"\r\n")
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + rest + body
    plain, old = both_ways([data])
    assert plain == old


field_name = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=10)
field_value = st.text(st.characters(min_codepoint=0x09, max_codepoint=0xFF), max_size=12)
some_fields = st.lists(
    st.tuples(
        st.one_of(field_name, st.sampled_from(["host", "Host", "content-length", "connection", "accept"])),
        st.one_of(field_value, st.sampled_from(["pod", "5", "close"])),
    ),
    max_size=5,
)


@settings(max_examples=100, deadline=None)
@given(some_fields, st.sampled_from(["GET", "POST", "get", "HEAD"]), st.sampled_from([b"", b"hello"]))
def test_a_request_is_written_as_h11_writes_it(
    fields: list[tuple[str, str]], method: str, body: bytes
) -> None:
    plain, old = both_ways([NEXT, NEXT], method=method, fields=fields, body=body)
    assert plain == old


def test_a_request_while_one_is_unanswered_is_refused_as_h11_refuses_it() -> None:
    async def go() -> list[str]:
        refused = []
        for plain in (True, False):
            stream = H11Stream(h11.CLIENT, asyncio.StreamReader(), Wire())  # type: ignore[arg-type]
            with pytest.MonkeyPatch.context() as patch:
                if not plain:
                    patch.setattr(H11Stream, "send_plain_request", _h11_writes)
                for _ in range(2):
                    try:
                        await exchange(stream, "GET", "/x", [("host", "pod")], timeout=0.01)
                    except (TimeoutError, h11.LocalProtocolError) as exc:
                        refused.append(f"{type(exc).__name__}: {exc}")
        return refused

    plain_twice, old_twice = (got := asyncio.run(go()))[:2], got[2:]
    assert plain_twice == old_twice and plain_twice[1].startswith("LocalProtocolError")


def test_a_difference_in_writing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a plain request written differently from h11 (its method in lower case) is seen."""
    real = http1.request_bytes
    monkeypatch.setattr(http1, "request_bytes", lambda method, *rest: real(method.lower(), *rest))
    plain = _run([NEXT, NEXT], True, "GET", None, b"")
    monkeypatch.setattr(H11Stream, "send_plain_request", _h11_writes)
    old = _run([NEXT, NEXT], True, "GET", None, b"")
    assert plain != old and bytes(plain[2]).startswith(b"get /x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "body"),
    [
        ([("host", "pod"), ("content-length", "5")], b""),  # declared, not sent: h11 refuses it
        ([("host", "pod"), ("content-length", "05")], b"hello"),
        ([("host", "pod"), ("Content-Length", "5")], b"hello"),
        ([("Host", "pod")], b""),
        ([("host", "pod"), ("host", "pod")], b""),
        ([], b""),
    ],
)
def test_a_request_h11_would_refuse_or_write_otherwise_is_h11s(
    fields: list[tuple[str, str]], body: bytes
) -> None:
    # GET: exchange adds no Content-Length of its own, so the one given is the only one
    plain, old = both_ways([NEXT, NEXT], method="GET", fields=fields, body=body)
    assert plain == old


def test_a_written_request_h11_did_not_see_is_told_when_h11_reads_the_response() -> None:
    """A plain request, then a response only h11 reads (chunked): h11 is given the request first, and reads
    the response as if it had sent it; the next request goes out plain again."""
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
    plain, old = both_ways([chunked, NEXT], method="POST", body=b"hello")
    assert plain == old and plain[0] == (200, [("transfer-encoding", "chunked")], b"hi", True)
    assert bytes(plain[2]).startswith(b"POST /x HTTP/1.1\r\nhost: pod\r\ncontent-length: 5\r\n\r\nhello")  # type: ignore[arg-type]


# The echo function ---------------------------------------------------------------------------------
REQUEST = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: text/x\r\nContent-Length: 5\r\n\r\nhello"
ECHOES = [
    ("plain", REQUEST),
    ("no content type", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi"),
    ("no body", b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("two content types", REQUEST.replace(b"Host: a\r\n", b"Host: a\r\nContent-Type: a/b\r\n")),
    ("pipelined", REQUEST + REQUEST),
    ("close", REQUEST.replace(b"Host: a\r\n", b"Host: a\r\nConnection: close\r\n")),
    ("chunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
]


@pytest.mark.parametrize("raw", [r for _, r in ECHOES], ids=[n for n, _ in ECHOES])
def test_the_echo_answers_as_h11_would(raw: bytes) -> None:
    assert echo_function(raw) == _echo_h11(raw)


def test_a_cut_request_is_h11s_error() -> None:
    with pytest.raises(h11.RemoteProtocolError):
        echo_function(REQUEST[:-1])


@settings(max_examples=100, deadline=None)
@given(head_bytes(), st.sampled_from([b"", b"Content-Length: 2\r\n", b"Content-Type: t/x\r\n"]))
def test_generated_requests_are_echoed_as_h11_echoes_them(request_head: bytes, field: bytes) -> None:
    raw = request_head.replace(b"\r\n", b"\r\n" + field, 1) + b"ok"
    try:
        expected: object = _echo_h11(raw)
    except h11.ProtocolError as exc:
        expected = type(exc)
    try:
        got: object = echo_function(raw)
    except h11.ProtocolError as exc:
        got = type(exc)
    assert got == expected


# A server: the request read, and the answer written --------------------------------------------------
def _serve(pieces: list[bytes], answers: list[tuple[int, list[tuple[str, str]], bool]]) -> list[object]:
    """A server loop as the invocation pod's: each request read (plain, else by h11) and answered with the
    next of `answers` (status, fields, close); what it read, whether it went on, and the bytes it wrote."""

    async def go() -> list[object]:
        reader = asyncio.StreamReader()
        for piece in pieces:
            reader.feed_data(piece)
        reader.feed_eof()
        stream = H11Stream(h11.SERVER, reader, Wire())  # type: ignore[arg-type]
        seen: list[object] = []
        try:
            for status, fields, close in answers:
                if (plain := await stream.plain_request()) is not None:
                    request, body = plain
                    seen.append((request.method, request.target, list(request.headers), body))
                else:
                    event = await stream.next_event()
                    if not isinstance(event, h11.Request):
                        seen.append(type(event).__name__)
                        break
                    body = await read_body(stream)
                    seen.append(
                        (event.method.decode(), event.target.decode(), decode_headers(event.headers), body)
                    )
                await respond(stream, status, b"echo:" + body, fields, close=close)
                seen.append(stream.reusable())
                if not stream.reusable():
                    break
                stream.next_cycle()
        except (h11.ProtocolError, UnicodeError) as exc:  # UnicodeError: h11 takes str fields as ASCII only
            seen.append((type(exc).__name__, str(exc)))
        seen.append(bytes(stream.writer.sent))  # type: ignore[attr-defined]
        return seen

    return asyncio.run(go())


async def _no_plain_request(self: H11Stream) -> None:
    return None


def served_both_ways(
    pieces: list[bytes], answers: list[tuple[int, list[tuple[str, str]], bool]]
) -> tuple[list[object], list[object]]:
    plain = _serve(pieces, answers)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(H11Stream, "plain_request", _no_plain_request)
        old = _serve(pieces, answers)
    return plain, old


OK = (200, [("content-type", "text/plain")], False)
GET = b"GET /x HTTP/1.1\r\nHost: pod\r\nAuthorization: Bearer t\r\n\r\n"
POST = b"POST /x HTTP/1.1\r\nHost: pod\r\nContent-Length: 5\r\n\r\nhello"
SERVED = [
    ("two plain", [GET + POST], [OK, OK]),
    ("plain in pieces", [GET[:7], GET[7:] + POST[:30], POST[30:]], [OK, OK]),
    ("body later", [POST[:-2], POST[-2:]], [OK]),
    ("pipelined", [GET + GET], [OK, OK]),
    ("close", [GET.replace(b"Host", b"Connection: close\r\nHost"), GET], [OK, OK]),
    ("answer closes", [GET + GET], [(200, [], True), OK]),
    ("field h11 must write", [GET + GET], [(200, [("x-a", " padded ")], False), OK]),
    ("framing field", [GET + GET], [(200, [("connection", "keep-alive")], False), OK]),
    ("obs-text answer", [GET + GET], [(200, [("x-a", "caf\xe9")], False), OK]),
    ("bad name", [GET + GET], [(200, [("x a", "b")], False), OK]),
    (
        "chunked",
        [b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"],
        [OK],
    ),
    ("HTTP/1.0", [b"GET / HTTP/1.0\r\n\r\n"], [OK]),
    ("garbage", [b"\x16\x03\x01\x00"], [OK]),
    ("leading CRLF", [b"\r\n" + GET], [OK]),
    ("cut body", [POST[:-1]], [OK]),
    ("nothing", [], [OK]),
]


@pytest.mark.parametrize(("pieces", "answers"), [c[1:] for c in SERVED], ids=[c[0] for c in SERVED])
def test_a_request_is_read_and_answered_as_h11_would(
    pieces: list[bytes], answers: list[tuple[int, list[tuple[str, str]], bool]]
) -> None:
    plain, old = served_both_ways(pieces, answers)
    assert plain == old


def test_a_plain_answer_is_written_without_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a plain answer that differs from h11's (a status off by one) is seen, so the plain
    path writes the common answer and the comparison above can fail."""
    real = http1.response_bytes
    monkeypatch.setattr(http1, "response_bytes", lambda status, *rest: real(status + 1, *rest))
    plain, old = served_both_ways([GET], [OK])
    assert plain != old and b"HTTP/1.1 201 OK\r\n" in plain[-1]  # type: ignore[operator]


@settings(max_examples=100, deadline=None)
@given(head_bytes(), st.sampled_from([b"", b"Content-Length: 2\r\n", b"Connection: close\r\n"]))
def test_generated_requests_are_read_as_h11_reads_them(request_head: bytes, field: bytes) -> None:
    raw = request_head.replace(b"\r\n", b"\r\n" + field, 1) + b"ok"
    plain, old = served_both_ways([raw], [OK, OK])
    assert plain == old


value = st.text(st.characters(min_codepoint=0x09, max_codepoint=0xFF), max_size=12)
name = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=10)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(name, st.sampled_from(["host", "connection", "content-type"])), value), max_size=5
    )
)
def test_an_answer_is_written_as_h11_writes_it(fields: list[tuple[str, str]]) -> None:
    plain, old = served_both_ways([GET + GET], [(200, fields, False), OK])
    assert plain == old


# The +h1 framing the pod and the worker exchange (sim.protocols.request_attach) ----------------------
@settings(max_examples=100, deadline=None)
@given(some_fields, st.sampled_from([b"", b"{}"]))
def test_the_client_request_is_framed_as_h11_frames_it(fields: list[tuple[str, str]], body: bytes) -> None:
    def framed() -> object:
        try:
            return request_h1("POST", "/", fields, body)
        except (h11.ProtocolError, UnicodeError) as exc:
            return type(exc)

    plain = framed()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(request_attach, "plain_request_out", lambda *request: False)
        assert framed() == plain


@pytest.mark.parametrize("data", [d for _, d in CASES], ids=[n for n, _ in CASES])
def test_the_inner_response_is_read_as_h11_reads_it(data: bytes) -> None:
    plain = parse_inner_response(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(request_attach, "plain_response", lambda head: None)
        assert parse_inner_response(data) == plain
