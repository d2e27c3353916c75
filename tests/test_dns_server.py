"""The resolver on real loopback sockets (dns.server) and the workers' stub client (dns.client)."""

from __future__ import annotations

import asyncio
import random
import shutil
import socket
import struct
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import pytest
from dnslib import CLASS, EDNS0, QTYPE, RCODE, DNSRecord

import dns.server
from dns.client import NameNotResolved, resolve_a
from dns.rule import Answer, DnsRecord, View, wildcard
from dns.server import QueryEvent, Resolver

T = TypeVar("T")

SHORT = 3.0  # seconds: a loopback exchange takes milliseconds; only a hang ever reaches this
WORKER_DOMAIN = "grpc-worker.example.com"
PROXY_LB_IP = "10.100.0.10"
CP, COMPUTE = "ncpsim-cp", "ncpsim-compute-1"
INVOCATION_POD = "10-42-0-11.invocation.nvcf.svc.cluster.local"
PROBE = "probe.example.test"  # asked after each UDP exchange to prove what went before was handled
FANOUT = "fanout.nvcf.svc.cluster.local"  # 60 A records: over 512 bytes, under 1232
FANOUT_IPS = tuple(f"10.42.1.{i}" for i in range(1, 61))

VIEWS = {
    CP: View(CP, hosts=((INVOCATION_POD, "10.42.0.11"), *((FANOUT, ip) for ip in FANOUT_IPS))),
    COMPUTE: View(COMPUTE, records=(wildcard(WORKER_DOMAIN, PROXY_LB_IP),)),
}


@dataclass
class Running:
    loop: asyncio.AbstractEventLoop
    resolver: Resolver
    events: list[QueryEvent]

    def run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(awaitable, SHORT))

    def addr(self, view: str) -> tuple[str, int]:
        return ("127.0.0.1", self.resolver.ports[view])


@pytest.fixture
def running() -> Iterator[Running]:
    loop = asyncio.new_event_loop()
    events: list[QueryEvent] = []
    resolver = Resolver(VIEWS, on_query=events.append)
    try:
        loop.run_until_complete(resolver.start())
        yield Running(loop, resolver, events)
    finally:
        loop.run_until_complete(resolver.close())
        leftover = [task for task in asyncio.all_tasks(loop) if not task.done()]
        loop.close()
    assert not leftover, f"tasks still running after close(): {leftover}"


def query(name: str, qtype: str = "A", *, msg_id: int = 0x1234, edns: int | None = None) -> DNSRecord:
    record = DNSRecord.question(name, qtype)
    record.header.id = msg_id
    if edns is not None:
        record.add_ar(EDNS0(udp_len=edns))
    return record


async def udp_exchange(addr: tuple[str, int], *payloads: bytes) -> list[DNSRecord]:
    """Send each payload in order from one socket, then a probe query, and return every reply that
    came back before the probe's. The server handles datagrams in order, so a payload with no
    reply there was dropped, and no test has to wait to find that out."""
    probe = query(PROBE, msg_id=0xFFFF).pack()
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        sock.connect(addr)
        for payload in (*payloads, probe):
            await loop.sock_sendall(sock, payload)
        replies = []
        while True:
            reply = DNSRecord.parse(await loop.sock_recv(sock, 65535))
            if reply.header.id == 0xFFFF and str(reply.q.qname) == PROBE + ".":
                return replies
            replies.append(reply)


async def tcp_exchange(addr: tuple[str, int], *frames: bytes, replies: int) -> list[DNSRecord]:
    """Write length-prefixed frames back to back on one connection and read `replies` answers."""
    reader, writer = await asyncio.open_connection(*addr)
    try:
        writer.write(b"".join(struct.pack("!H", len(frame)) + frame for frame in frames))
        await writer.drain()
        answers = []
        for _ in range(replies):
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            answers.append(DNSRecord.parse(await reader.readexactly(length)))
        return answers
    finally:
        writer.close()
        await writer.wait_closed()


def addresses(reply: DNSRecord) -> list[str]:
    return [str(rr.rdata) for rr in reply.rr if rr.rtype == QTYPE.A]


# --- both transports, both views, on one port number each -------------------------------------

LOOKUPS = [
    (COMPUTE, f"invocation.{WORKER_DOMAIN}", "NOERROR", [PROXY_LB_IP]),
    (COMPUTE, f"10-42-0-17.{WORKER_DOMAIN}", "NOERROR", [PROXY_LB_IP]),
    (COMPUTE, WORKER_DOMAIN, "NXDOMAIN", []),
    (COMPUTE, INVOCATION_POD, "NXDOMAIN", []),
    (CP, INVOCATION_POD, "NOERROR", ["10.42.0.11"]),
    (CP, "10-42-0-99.invocation.nvcf.svc.cluster.local", "NXDOMAIN", []),
    (CP, f"10-42-0-17.{WORKER_DOMAIN}", "NXDOMAIN", []),
]


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_each_view_answers_on_its_port(running: Running, transport: str) -> None:
    ports = running.resolver.ports
    assert set(ports) == {CP, COMPUTE} and len(set(ports.values())) == 2
    for view, name, rcode, expected in LOOKUPS:
        packet = query(name).pack()
        if transport == "udp":
            (reply,) = running.run(udp_exchange(running.addr(view), packet))
        else:
            (reply,) = running.run(tcp_exchange(running.addr(view), packet, replies=1))
        assert (RCODE[reply.header.rcode], addresses(reply)) == (rcode, expected), (view, name)
    assert [(e.view, e.qname, e.rcode, e.transport) for e in running.events if e.qname != PROBE] == [
        (view, name, rcode, transport) for view, name, rcode, _ in LOOKUPS
    ]


def test_reply_echoes_the_question_and_sets_flags(running: Running) -> None:
    asked = f"10-42-0-17.GRPC-Worker.{WORKER_DOMAIN}"  # mixed case, as 0x20-randomising stubs ask
    (reply,) = running.run(udp_exchange(running.addr(COMPUTE), query(asked, msg_id=4242).pack()))
    header = reply.header
    assert (header.id, header.qr, header.aa, header.rd, header.ra, header.tc) == (4242, 1, 1, 1, 0, 0)
    assert (str(reply.q.qname), reply.q.qtype, reply.q.qclass) == (asked + ".", QTYPE.A, CLASS.IN)
    assert [(str(rr.rname), rr.ttl) for rr in reply.rr] == [(asked + ".", 5)]


def test_known_name_of_another_type_is_nodata(running: Running) -> None:
    packets = [
        query(f"invocation.{WORKER_DOMAIN}", qtype, msg_id=i).pack()
        for i, qtype in enumerate(["AAAA", "TXT", "MX"])
    ]
    replies = running.run(udp_exchange(running.addr(COMPUTE), *packets))
    assert [(r.header.id, RCODE[r.header.rcode], r.rr) for r in replies] == [
        (i, "NOERROR", []) for i in range(3)
    ]


def test_tcp_connection_serves_pipelined_queries(running: Running) -> None:
    frames = [query(INVOCATION_POD, msg_id=1).pack(), query("nope.nvcf", msg_id=2).pack()]
    replies = running.run(tcp_exchange(running.addr(CP), *frames, replies=2))
    assert [(r.header.id, RCODE[r.header.rcode]) for r in replies] == [(1, "NOERROR"), (2, "NXDOMAIN")]


def test_large_answer_is_truncated_over_udp_and_whole_over_tcp(running: Running) -> None:
    addr = running.addr(CP)
    plain, edns = running.run(
        udp_exchange(addr, query(FANOUT, msg_id=1).pack(), query(FANOUT, msg_id=2, edns=4096).pack())
    )
    assert (plain.header.tc, plain.rr, str(plain.q.qname)) == (1, [], FANOUT + ".")
    assert (edns.header.tc, addresses(edns)) == (0, list(FANOUT_IPS))  # fits the 1232 bytes we offer
    assert [rr.rtype for rr in edns.ar] == [QTYPE.OPT]
    (whole,) = running.run(tcp_exchange(addr, query(FANOUT).pack(), replies=1))
    assert (whole.header.tc, addresses(whole)) == (0, list(FANOUT_IPS))


# --- hostile input -----------------------------------------------------------------------------


def _header(
    msg_id: int = 0xBEEF, flags: int = 0x0100, qd: int = 1, an: int = 0, ns: int = 0, ar: int = 0
) -> bytes:
    return struct.pack("!HHHHHH", msg_id, flags, qd, an, ns, ar)


_GOOD = query(INVOCATION_POD, msg_id=0xBEEF).pack()
MALFORMED = [
    # payload, expected: None = dropped, else the rcode answered with id 0xBEEF
    pytest.param(b"", None, id="empty"),
    pytest.param(b"\xbe", None, id="one-byte"),
    pytest.param(_GOOD[:11], None, id="eleven-bytes"),
    pytest.param(_header(), "FORMERR", id="header-only-claims-a-question"),
    pytest.param(_header() + b"\xff\x00garbage\x13\x37", "FORMERR", id="header-and-garbage"),
    pytest.param(_GOOD[:-2], "FORMERR", id="truncated-question"),
    pytest.param(_GOOD[:20], "FORMERR", id="truncated-label"),
    pytest.param(_GOOD + b"\x00", "FORMERR", id="trailing-byte"),
    pytest.param(_header(qd=0), "FORMERR", id="no-question"),
    pytest.param(_header(qd=2) + _GOOD[12:] * 2, "FORMERR", id="two-questions"),
    pytest.param(_header(ar=1) + _GOOD[12:], "FORMERR", id="missing-additional"),
    pytest.param(_header() + b"\xc0\x0c\x00\x01\x00\x01", "FORMERR", id="pointer-to-itself"),
    pytest.param(_header() + b"\x40" + b"a" * 64 + b"\x00\x00\x01\x00\x01", "FORMERR", id="64-byte-label"),
    pytest.param(_header() + b"\x02\xff\xfe\x00\x00\x01\x00\x01", "FORMERR", id="label-not-utf8"),
    pytest.param(
        _header() + (b"\x3c" + b"a" * 60) * 5 + b"\x00\x00\x01\x00\x01", "FORMERR", id="305-byte-name"
    ),
    pytest.param(_GOOD + b"\x00" * 60_000, "FORMERR", id="oversized-datagram"),
    pytest.param(_header(flags=0x8100) + _GOOD[12:], None, id="a-response-is-never-answered"),
    pytest.param(_header(flags=0x1100) + _GOOD[12:], "NOTIMP", id="opcode-status"),
    pytest.param(_header() + _GOOD[12:-2] + b"\x00\x03", "REFUSED", id="class-chaos"),
]


@pytest.mark.parametrize(("payload", "expected"), MALFORMED)
def test_malformed_udp_never_kills_the_server(running: Running, payload: bytes, expected: str | None) -> None:
    replies = running.run(udp_exchange(running.addr(CP), payload))
    assert [(r.header.id, r.header.qr, RCODE[r.header.rcode]) for r in replies] == (
        [] if expected is None else [(0xBEEF, 1, expected)]
    )
    (after,) = running.run(udp_exchange(running.addr(CP), _GOOD))
    assert addresses(after) == ["10.42.0.11"]


def test_random_bytes_never_kill_the_server(running: Running) -> None:
    rng = random.Random(20240611)
    payloads = [rng.randbytes(rng.randrange(0, 80)) for _ in range(200)]
    replies = running.run(udp_exchange(running.addr(COMPUTE), *payloads))
    answered_ids = {struct.unpack("!H", p[:2])[0] for p in payloads if len(p) >= 12}
    assert all(r.header.qr and r.header.id in answered_ids for r in replies)
    (after,) = running.run(udp_exchange(running.addr(COMPUTE), query(f"invocation.{WORKER_DOMAIN}").pack()))
    assert addresses(after) == [PROXY_LB_IP]


def test_malformed_tcp_frames_keep_the_connection_usable(running: Running) -> None:
    frames = [b"", b"\x01\x02", _header() + b"garbage", query(INVOCATION_POD, msg_id=7).pack()]
    formerr, good = running.run(tcp_exchange(running.addr(CP), *frames, replies=2))
    assert (formerr.header.id, RCODE[formerr.header.rcode]) == (0xBEEF, "FORMERR")
    assert (good.header.id, addresses(good)) == (7, ["10.42.0.11"])


def test_half_a_tcp_frame_then_hang_up_is_harmless(running: Running) -> None:
    async def hang_up_mid_frame() -> None:
        _, writer = await asyncio.open_connection(*running.addr(CP))
        writer.write(struct.pack("!H", 200) + b"\x12\x34 only part of it")
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    running.run(hang_up_mid_frame())
    (good,) = running.run(tcp_exchange(running.addr(CP), _GOOD, replies=1))
    assert addresses(good) == ["10.42.0.11"]


def test_rule_exception_is_servfail(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_rule(view: View, qname: str, qtype: str) -> Answer:
        raise RuntimeError("injected failure in the DNS rule")

    monkeypatch.setattr(dns.server, "answer", broken_rule)
    (reply,) = running.run(udp_exchange(running.addr(COMPUTE), query(f"invocation.{WORKER_DOMAIN}").pack()))
    assert (RCODE[reply.header.rcode], reply.rr, str(reply.q.qname)) == (
        "SERVFAIL",
        [],
        f"invocation.{WORKER_DOMAIN}.",
    )
    with pytest.raises(NameNotResolved) as caught:
        running.run(resolve_a(f"invocation.{WORKER_DOMAIN}", running.addr(COMPUTE)))
    assert caught.value.rcode == "SERVFAIL"
    assert running.events[-1].rcode == "SERVFAIL"


def test_failing_on_query_observer_does_not_stop_answers() -> None:
    def observer(event: QueryEvent) -> None:
        raise RuntimeError("injected failure in the observer")

    async def scenario() -> list[str]:
        resolver = Resolver({CP: VIEWS[CP]}, on_query=observer)
        try:
            await resolver.start()
            return await resolve_a(INVOCATION_POD, ("127.0.0.1", resolver.ports[CP]))
        finally:
            await resolver.close()

    assert asyncio.run(asyncio.wait_for(scenario(), SHORT)) == ["10.42.0.11"]


# --- live updates and lifecycle ----------------------------------------------------------------


def test_update_changes_answers_live_on_the_same_ports(running: Running) -> None:
    name, ports = f"10-42-0-17.{WORKER_DOMAIN}", dict(running.resolver.ports)
    assert running.run(resolve_a(name, running.addr(COMPUTE))) == [PROXY_LB_IP]

    running.resolver.update({**VIEWS, COMPUTE: View(COMPUTE)})  # the rewrite is gone
    with pytest.raises(NameNotResolved) as caught:
        running.run(resolve_a(name, running.addr(COMPUTE)))
    assert caught.value.rcode == "NXDOMAIN"

    moved = wildcard(WORKER_DOMAIN, "10.100.0.77")
    running.resolver.update({**VIEWS, COMPUTE: View(COMPUTE, records=(moved,))})
    assert running.run(resolve_a(name, running.addr(COMPUTE))) == ["10.100.0.77"]
    assert running.resolver.ports == ports


@pytest.mark.parametrize("views", [{CP: VIEWS[CP]}, {**VIEWS, "ncpsim-compute-2": VIEWS[COMPUTE]}])
def test_update_cannot_add_or_remove_views_once_started(running: Running, views: dict[str, View]) -> None:
    with pytest.raises(ValueError, match="cannot add views"):
        running.resolver.update(views)


def test_close_releases_both_ports() -> None:
    async def scenario() -> int:
        resolver = Resolver({COMPUTE: VIEWS[COMPUTE]})
        try:
            await resolver.start()
            port = resolver.ports[COMPUTE]
            # an open TCP client must not keep close() waiting or leave its handler behind
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            await tcp_exchange(("127.0.0.1", port), _GOOD, replies=1)
        finally:
            await resolver.close()
        writer.close()
        return port

    port = asyncio.run(asyncio.wait_for(scenario(), SHORT))
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))  # would raise EADDRINUSE if the resolver still held it


# --- the workers' stub client ------------------------------------------------------------------


def test_client_resolves_through_each_view(running: Running) -> None:
    assert running.run(resolve_a(f"invocation.{WORKER_DOMAIN}", running.addr(COMPUTE))) == [PROXY_LB_IP]
    assert running.run(resolve_a(f"10-42-0-21.{WORKER_DOMAIN}", running.addr(COMPUTE))) == [PROXY_LB_IP]
    assert running.run(resolve_a(INVOCATION_POD, running.addr(CP))) == ["10.42.0.11"]


def test_client_falls_back_to_tcp_on_truncation(running: Running) -> None:
    assert running.run(resolve_a(FANOUT, running.addr(CP))) == list(FANOUT_IPS)
    assert [(e.qname, e.transport) for e in running.events] == [(FANOUT, "udp"), (FANOUT, "tcp")]


@pytest.mark.parametrize(
    ("view", "name", "answer_override", "rcode"),
    [
        (CP, "10-42-0-99.invocation.nvcf.svc.cluster.local", None, "NXDOMAIN"),
        (COMPUTE, WORKER_DOMAIN, None, "NXDOMAIN"),
        (CP, INVOCATION_POD, Answer("NOERROR", (), "host"), "NODATA"),
    ],
)
def test_client_rcodes(
    running: Running,
    monkeypatch: pytest.MonkeyPatch,
    view: str,
    name: str,
    answer_override: Answer | None,
    rcode: str,
) -> None:
    if answer_override is not None:
        monkeypatch.setattr(dns.server, "answer", lambda *_: answer_override)
    with pytest.raises(NameNotResolved) as caught:
        running.run(resolve_a(name, running.addr(view)))
    assert (caught.value.name, caught.value.rcode) == (name, rcode)


# --- a real client ------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_dig_resolves_through_the_compute_view(running: Running, transport: str) -> None:
    dig = shutil.which("dig")
    if dig is None:
        pytest.skip(
            "dig is not installed (Debian/Ubuntu: bind9-dnsutils, macOS: bind); the other tests cover DNS"
        )

    async def run_dig(*args: str) -> str:
        host, port = running.addr(COMPUTE)
        proc = await asyncio.create_subprocess_exec(
            dig,
            f"@{host}",
            "-p",
            str(port),
            "+tries=1",
            "+time=2",
            *(["+tcp"] if transport == "tcp" else []),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return out.decode()

    short = running.run(run_dig("+short", f"10-42-0-17.{WORKER_DOMAIN}", "A"))
    assert [line for line in short.splitlines() if line and not line.startswith(";")] == [PROXY_LB_IP]
    assert "status: NXDOMAIN" in running.run(run_dig(WORKER_DOMAIN, "A"))
    assert {e.transport for e in running.events} == {transport}


# --- a rewrite on the wire: answered as CoreDNS's `answer auto` answers ---------------------------
def test_a_rewrite_is_answered_under_the_name_asked_without_a_cname() -> None:
    service = "worker-callback-proxy.nvcf.svc.cluster.local"
    make_target = wildcard(WORKER_DOMAIN, service)
    exposed = View(COMPUTE, records=(make_target, DnsRecord("exact", service, PROXY_LB_IP)))
    asked = f"10-42-0-41.{WORKER_DOMAIN}"
    reply, event = dns.server.handle_packet(exposed, DNSRecord.question(asked, "A").pack())
    assert reply is not None and event is not None
    parsed = DNSRecord.parse(reply)
    assert [(str(rr.rname), QTYPE[rr.rtype], str(rr.rdata)) for rr in parsed.rr] == [
        (f"{asked}.", "A", PROXY_LB_IP)
    ]
    assert (event.rcode, event.addresses) == ("NOERROR", (PROXY_LB_IP,))
    # negative control: without the record for the Service's name the same rewrite finds nothing
    unresolved, _ = dns.server.handle_packet(
        View(COMPUTE, records=(make_target,)), DNSRecord.question(asked).pack()
    )
    assert unresolved is not None
    parsed = DNSRecord.parse(unresolved)
    assert RCODE[parsed.header.rcode] == "NXDOMAIN" and not parsed.rr
    assert str(parsed.q.qname) == f"{asked}."  # the question as asked, not the rewritten name
