"""The resolver's UDP batches (dns.datagrams) on real loopback sockets, both ways a platform may have them,
and its reply cache (a reply kept as bytes, the query's id patched in, the question as it was asked)."""

from __future__ import annotations

import select
import socket
from collections.abc import Callable, Iterator

import pytest
from dnslib import EDNS0, DNSRecord

from dns import datagrams
from dns.rule import View, wildcard
from dns.server import Resolver, handle_packet

SHORT = 3.0  # seconds: a loopback exchange takes milliseconds; only a hang ever reaches this
VIEW = View("ncpsim-compute-1", records=(wildcard("grpc-worker.example.com", "10.100.0.10"),))
NAME = "invocation.grpc-worker.example.com"

BATCHED = pytest.param(
    datagrams.Batched,
    id="recvmmsg",
    marks=pytest.mark.skipif(datagrams._CALLS is None, reason="no recvmmsg/sendmmsg on this platform"),
)


def query(name: str, msg_id: int, qtype: str = "A", edns: bool = False) -> bytes:
    record = DNSRecord.question(name, qtype)
    record.header.id = msg_id
    if edns:
        record.add_ar(EDNS0(udp_len=1232))
    return bytes(record.pack())


def answer(data: bytes) -> bytes | None:
    return handle_packet(VIEW, data)[0]


@pytest.fixture
def server() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        yield sock


def client(server: socket.socket) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(SHORT)
    sock.connect(server.getsockname())
    return sock


def received(sock: socket.socket) -> list[bytes]:
    """Every datagram waiting on `sock` now (the replies of one batch were sent before it returned)."""
    got = []
    while select.select([sock], [], [], 0)[0]:
        got.append(sock.recv(65535))
    return got


# Queries from two clients, interleaved; the server drops the two it must not answer (a response, a datagram
# shorter than a header), so a reply sent to the sender of the wrong datagram would reach the wrong client.
MIXED: list[tuple[int, bytes]] = [
    (0, query(NAME, 1)),
    (1, b"\x12\x34\x81\x80" + bytes(8)),  # a response: dropped
    (1, query("10-42-0-7.GRPC-Worker.example.com", 2)),  # 0x20 case: echoed as asked
    (0, b"\x00\x05"),  # shorter than a header: dropped
    (1, query(NAME, 3, "AAAA", edns=True)),
    (0, query("missing.example.org", 4)),
    (0, b"\x00\x06\x00\x00\x00\x02" + bytes(6)),  # two questions, none there: FORMERR
    (1, query(NAME, 5)),
]


@pytest.mark.parametrize("kind", [BATCHED, datagrams.OneByOne])
def test_one_wakeup_answers_the_batch_each_reply_to_its_sender(
    server: socket.socket, kind: Callable[[socket.socket, int, int], datagrams.Datagrams]
) -> None:
    clients = [client(server), client(server)]
    try:
        for who, data in MIXED:
            clients[who].send(data)
        kind(server, 64, 1232).serve(answer)  # one call: everything sent is answered
        for who, sock in enumerate(clients):
            expected = [reply for w, data in MIXED if w == who and (reply := answer(data)) is not None]
            assert received(sock) == expected
    finally:
        for sock in clients:
            sock.close()


@pytest.mark.parametrize("kind", [BATCHED, datagrams.OneByOne])
def test_a_batch_stops_at_its_size_and_the_rest_waits(
    server: socket.socket, kind: Callable[[socket.socket, int, int], datagrams.Datagrams]
) -> None:
    with client(server) as sock:
        for msg_id in range(5):
            sock.send(query(NAME, msg_id))
        batch = kind(server, 3, 1232)
        batch.serve(answer)
        assert [DNSRecord.parse(r).header.id for r in received(sock)] == [0, 1, 2]
        batch.serve(answer)
        assert [DNSRecord.parse(r).header.id for r in received(sock)] == [3, 4]
        batch.serve(answer)  # nothing waiting: nothing sent, nothing raised
        assert received(sock) == []


@pytest.mark.skipif(datagrams._CALLS is None, reason="no recvmmsg/sendmmsg on this platform")
def test_a_reply_that_cannot_be_sent_is_dropped_and_the_rest_go(server: socket.socket) -> None:
    batch = datagrams.Batched(server, 8, 1232)
    real = batch._sendmmsg
    calls: list[int] = []

    def first_fails(fd: int, messages: int, count: int, flags: int) -> int:
        calls.append(count)
        return -1 if len(calls) == 1 else int(real(fd, messages, count, flags))

    batch._sendmmsg = first_fails
    with client(server) as sock:
        for msg_id in range(3):
            sock.send(query(NAME, msg_id))
        batch.serve(answer)
        assert [DNSRecord.parse(r).header.id for r in received(sock)] == [1, 2]
    assert calls == [3, 2]


def test_a_cached_reply_keeps_the_question_as_asked_under_the_querys_id() -> None:
    """The cache is keyed by the whole query but its id: a name asked again in other letters (0x20) is
    answered in those letters, and the same query under another id gets that id."""
    resolver = Resolver({VIEW.cluster: VIEW})
    cache = resolver._cache(VIEW.cluster, "udp")
    first = query(NAME.upper(), 7)
    served = [
        resolver._serve(VIEW.cluster, cache, "udp", data) for data in (first, query(NAME, 7), query(NAME, 9))
    ]
    assert served == [answer(first), answer(query(NAME, 7)), answer(query(NAME, 9))]
    assert [str(DNSRecord.parse(r).q.qname) for r in served if r] == [
        NAME.upper() + ".",
        NAME + ".",
        NAME + ".",
    ]
    assert len(cache) == 2  # the two spellings; the other id is the same entry


@pytest.mark.parametrize("kind", [BATCHED, datagrams.OneByOne])
def test_a_reply_over_the_limit_is_not_sent_and_says_so(
    server: socket.socket,
    kind: Callable[[socket.socket, int, int], datagrams.Datagrams],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with client(server) as sock:
        sock.send(b"long")
        sock.send(b"short")
        kind(server, 8, 100).serve(lambda data: data * 50)  # 200 bytes, then 250: both over 100
        assert received(sock) == []
        sock.send(b"short")
        kind(server, 8, 250).serve(lambda data: data * 50)
        assert received(sock) == [b"short" * 50]
    assert "a 200-byte UDP reply is over the 100-byte limit; not sent" in caplog.text
