"""The cluster DNS views served over real UDP and TCP on loopback.

`handle_packet` is the whole DNS server as a function (bytes in, reply bytes out, given a
`View`); `Resolver` only binds sockets, moves bytes and reports `QueryEvent`s. dnslib is used to
parse and pack, never its threaded DNSServer, and nothing is ever forwarded upstream.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Self

from dnslib import CLASS, EDNS0, OPCODE, QTYPE, RCODE, RR, A, DNSHeader, DNSQuestion, DNSRecord
from dnslib.label import DNSBuffer

from dns import datagrams
from dns.rule import View, answer

__all__ = ["QueryEvent", "Resolver", "handle_packet"]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!HHHHHH")
_QR, _OPCODE_SHIFT, _RD = 0x8000, 11, 0x0100
_UDP_PLAIN_LIMIT = 512  # RFC 1035 limit for a client that sent no EDNS OPT record
_UDP_EDNS_LIMIT = 1232  # the DNS flag day 2020 payload size: no IP fragmentation anywhere
_CLASS_ANY = 255  # dnslib spells it "*", so name it here
_BADVERS = 16  # RFC 6891 extended RCODE: 4 bits in the header, the rest in the OPT record
_BIND_ATTEMPTS = 8
UDP_BATCH = 64  # datagrams answered per event-loop wakeup
REPLY_CACHE_SIZE = 4096  # distinct questions remembered per view and transport; past it, answers are computed
TCP_IDLE_TIMEOUT = 10.0  # seconds a TCP client may sit idle before the connection is closed


@dataclass(frozen=True)
class QueryEvent:
    view: str
    qname: str
    qtype: str
    rcode: str
    addresses: tuple[str, ...]
    transport: str  # "udp" | "tcp"


class _Malformed(Exception):
    """The query cannot be answered as asked; `rcode` is what to send back."""

    def __init__(self, rcode: int, question: DNSQuestion | None = None) -> None:
        super().__init__(RCODE[rcode])
        self.rcode = rcode
        self.question = question


def handle_packet(view: View, data: bytes, transport: str = "udp") -> tuple[bytes | None, QueryEvent | None]:
    """Answer one DNS message for `view`; (None, None) means drop it silently.

    Never raises for any input: a header that can be read gets a reply with its id (FORMERR for
    garbage, SERVFAIL when the rule itself fails), anything shorter is dropped, and so are
    responses, so two servers can never bounce packets off each other.
    """
    if len(data) < _HEADER.size:
        return None, None
    msg_id, flags = _HEADER.unpack_from(data)[:2]
    if flags & _QR:
        return None, None
    try:
        question, opt = _parse_query(data)
    except _Malformed as exc:
        return _error_reply(view, msg_id, flags, exc, transport)
    except Exception:  # noqa: BLE001 - dnslib raises more than DNSError on hostile input
        return _error_reply(view, msg_id, flags, _Malformed(RCODE.FORMERR), transport)
    if opt is not None and opt.edns_ver != 0:
        return _badvers_reply(view, msg_id, flags, question, transport)
    try:
        return _answer_reply(view, msg_id, flags, question, opt, transport)
    except Exception:
        # Belt and braces: whatever went wrong, the client hears SERVFAIL rather than nothing.
        log.exception("DNS view %s failed to answer", view.cluster)
        return _error_reply(view, msg_id, flags, _Malformed(RCODE.SERVFAIL, question), transport)


def _parse_query(data: bytes) -> tuple[DNSQuestion, RR | None]:
    """Parse a standard query strictly: one question, nothing left over, sane name lengths."""
    buffer = DNSBuffer(data)
    header = DNSHeader.parse(buffer)
    if header.opcode != OPCODE.QUERY:
        raise _Malformed(RCODE.NOTIMP)
    if header.q != 1:
        raise _Malformed(RCODE.FORMERR)
    question = DNSQuestion.parse(buffer)
    if len(question.qname) > 253 or any(len(label) > 63 for label in question.qname.label):
        raise _Malformed(RCODE.FORMERR)  # could not be packed back into the reply
    records = [RR.parse(buffer) for _ in range(header.a + header.auth + header.ar)]
    if buffer.remaining():
        raise _Malformed(RCODE.FORMERR, question)  # trailing bytes: the counts lie
    opts = [rr for rr in records if rr.rtype == QTYPE.OPT]
    if len(opts) > 1:
        raise _Malformed(RCODE.FORMERR, question)  # RFC 6891 6.1.1
    return question, (opts[0] if opts else None)


def _reply_header(msg_id: int, flags: int, rcode: int) -> DNSHeader:
    # AA: each view is the authority for everything it answers. RA stays 0 because nothing here
    # recurses; dig says so in a warning, which is the truth about this server.
    opcode = (flags >> _OPCODE_SHIFT) & 0xF
    return DNSHeader(id=msg_id, bitmap=0, qr=1, opcode=opcode, aa=1, rd=int(bool(flags & _RD)), rcode=rcode)


def _error_reply(
    view: View, msg_id: int, flags: int, exc: _Malformed, transport: str
) -> tuple[bytes, QueryEvent]:
    reply = DNSRecord(_reply_header(msg_id, flags, exc.rcode))
    reply.header.aa = 0
    if exc.question is not None:
        reply.add_question(exc.question)
    qname, qtype = _describe(exc.question)
    event = QueryEvent(view.cluster, qname, qtype, RCODE[exc.rcode], (), transport)
    return _pack_or_bare(reply), event


def _badvers_reply(
    view: View, msg_id: int, flags: int, question: DNSQuestion, transport: str
) -> tuple[bytes, QueryEvent]:
    """RFC 6891 6.1.3, as CoreDNS answers an EDNS version it does not speak: BADVERS, the version it does
    speak (0) in its OPT record, and nothing else (CoreDNS leaves even the question out)."""
    reply = DNSRecord(_reply_header(msg_id, flags, _BADVERS & 0xF))
    reply.header.aa = 0
    reply.add_ar(EDNS0(udp_len=_UDP_EDNS_LIMIT, version=0, ext_rcode=_BADVERS >> 4))
    qname, qtype = _describe(question)
    return _pack_or_bare(reply), QueryEvent(view.cluster, qname, qtype, "BADVERS", (), transport)


def _answer_reply(
    view: View, msg_id: int, flags: int, question: DNSQuestion, opt: RR | None, transport: str
) -> tuple[bytes, QueryEvent]:
    qname, qtype = _describe(question)
    reply = DNSRecord(_reply_header(msg_id, flags, RCODE.NOERROR), q=question)
    addresses: tuple[str, ...] = ()
    if question.qclass not in (CLASS.IN, _CLASS_ANY):
        reply.header.rcode, reply.header.aa = RCODE.REFUSED, 0  # e.g. CH version.bind: not ours
    else:
        try:
            result = answer(view, qname, qtype)
            rcode = getattr(RCODE, result.rcode)
            records = [RR(question.qname, QTYPE.A, CLASS.IN, view.ttl, A(ip)) for ip in result.addresses]
        except Exception:
            log.exception("DNS rule failed for %s %s in view %s", qname, qtype, view.cluster)
            reply.header.rcode, reply.header.aa = RCODE.SERVFAIL, 0
        else:
            reply.header.rcode, addresses = rcode, result.addresses
            reply.add_answer(*records)
    if opt is not None:
        # RFC 6891: answer an EDNS query with EDNS, advertising what we will send over UDP.
        reply.add_ar(EDNS0(udp_len=_UDP_EDNS_LIMIT))
    event = QueryEvent(view.cluster, qname, qtype, RCODE[reply.header.rcode], addresses, transport)
    return _fit(reply, opt, transport), event


def _fit(reply: DNSRecord, opt: RR | None, transport: str) -> bytes:
    """Pack `reply`; when it does not fit, answer with TC and no records, so a UDP client retries
    over TCP (RFC 1035 4.2.1, RFC 7766)."""
    packed = _pack_or_bare(reply)
    if transport != "udp":
        limit = 0xFFFF  # the TCP length prefix is 16 bits
    elif opt is None:
        limit = _UDP_PLAIN_LIMIT
    else:
        limit = max(_UDP_PLAIN_LIMIT, min(opt.edns_len, _UDP_EDNS_LIMIT))
    if len(packed) <= limit:
        return packed
    reply.rr = []
    reply.header.tc = 1
    return _pack_or_bare(reply)


def _pack_or_bare(reply: DNSRecord) -> bytes:
    try:
        return reply.pack()
    except Exception:  # noqa: BLE001 - a reply must go out whatever dnslib thinks of it
        # Last resort so a reply always goes out: the header alone, with no sections.
        header = reply.header
        return _HEADER.pack(header.id, header.bitmap, 0, 0, 0, 0)


def _describe(question: DNSQuestion | None) -> tuple[str, str]:
    """The question as events show it: the name as asked, without the root dot (as in `View`)."""
    if question is None:
        return "", ""
    name = str(question.qname)
    return (name if name == "." else name.removesuffix(".")), QTYPE[question.qtype]


OnQuery = Callable[[QueryEvent], None]
_Cached = tuple[bytes | None, QueryEvent | None]  # a reply without its id (None: dropped), and its event


class _UdpBatch:
    """The UDP side of a view: the datagrams waiting answered together, up to UDP_BATCH per wakeup of the
    event loop (dns.datagrams: one recvmmsg and one sendmmsg on Linux).

    asyncio's datagram transport reads one datagram per readiness event, so each query costs a trip
    through epoll; under load the queue is drained in batches here instead.
    """

    def __init__(self, resolver: Resolver, name: str, sock: socket.socket) -> None:
        self._sock, self._datagrams = sock, datagrams.for_socket(sock, UDP_BATCH, _UDP_EDNS_LIMIT)
        # A datagram's reply, in one Python call: partial binds the view's name and cache in C.
        answer = functools.partial(resolver._serve, name, resolver._cache(name, "udp"), "udp")
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._datagrams.serve, answer)

    def close(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


@dataclass
class _Listener:
    port: int
    tcp: asyncio.Server
    udp: _UdpBatch


class Resolver:
    """Serves each `View` on its own loopback port, UDP and TCP on the same port number.

    `views` maps a view name (normally the cluster name) to its `View`; `on_query` sees one
    `QueryEvent` per answered query, with `view` set to that name.
    """

    def __init__(
        self, views: Mapping[str, View], host: str = "127.0.0.1", on_query: OnQuery | None = None
    ) -> None:
        self._views: dict[str, View] = dict(views)
        self._host = host
        self._on_query = on_query
        self._listeners: dict[str, _Listener] = {}
        self._connections: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}
        self._started = False
        self._closing = False
        self._replies: dict[tuple[str, str], dict[bytes, _Cached]] = {}  # see _cache

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def host(self) -> str:
        return self._host

    @property
    def ports(self) -> dict[str, int]:
        """View name -> the real port serving it (UDP and TCP); empty before `start`."""
        return {name: listener.port for name, listener in self._listeners.items()}

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("Resolver already started")
        self._started = True
        try:
            for name in self._views:
                self._listeners[name] = await self._listen(name)
        except BaseException:
            await self.close()
            raise

    def update(self, views: Mapping[str, View]) -> None:
        """Replace the views' data live; each name keeps its port. Once started the names must not
        change, because a new name would need a port nobody has been told about."""
        new = dict(views)
        if self._listeners and new.keys() != self._views.keys():
            added, removed = sorted(new.keys() - self._views.keys()), sorted(self._views.keys() - new.keys())
            raise ValueError(f"update() cannot add views {added} or remove views {removed} once started")
        self._views = new
        for replies in self._replies.values():
            replies.clear()  # answers from the old data must not outlive it

    async def close(self) -> None:
        self._closing = True
        listeners, self._listeners = list(self._listeners.values()), {}
        for listener in listeners:
            listener.udp.close()
            listener.tcp.close()
        connections, self._connections = dict(self._connections), {}
        for writer in connections:
            writer.close()  # 3.11's Server.close() leaves accepted connections open
        # Each handler sees its stream closed and returns; waiting for them leaves no task behind.
        await asyncio.gather(*connections.values(), return_exceptions=True)
        for listener in listeners:
            await listener.tcp.wait_closed()

    async def _listen(self, name: str) -> _Listener:
        """Bind TCP on port 0, then UDP on the same number; another process may hold that UDP
        port, so try again with a fresh TCP port."""
        for _ in range(_BIND_ATTEMPTS):
            tcp = await asyncio.start_server(lambda r, w: self._tcp_client(name, r, w), self._host, 0)
            port = tcp.sockets[0].getsockname()[1]
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.bind((self._host, port))
                sock.setblocking(False)
            except OSError as exc:
                sock.close()
                tcp.close()
                await tcp.wait_closed()
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue
            return _Listener(port, tcp, _UdpBatch(self, name, sock))
        raise OSError(errno.EADDRINUSE, f"no port free for both UDP and TCP for DNS view {name}")

    def _cache(self, name: str, transport: str) -> dict[bytes, _Cached]:
        """The answers view `name` gave over `transport`, by query without its id: an answer depends on
        nothing else (the question as asked, 0x20 case included, its flags and EDNS are all in the key)."""
        return self._replies.setdefault((name, transport), {})

    def _serve(self, name: str, replies: dict[bytes, _Cached], transport: str, data: bytes) -> bytes | None:
        """The reply to `data`, from `replies` (its view's and transport's cache) when asked before."""
        cached = replies.get(data[2:])
        if cached is None:
            cached = self._answer(name, data, transport)
            if len(replies) < REPLY_CACHE_SIZE:
                replies[data[2:]] = cached
        tail, event = cached
        if event is not None and self._on_query is not None:
            try:
                self._on_query(event)
            except Exception:
                # A broken observer must not take cluster DNS down with it.
                log.exception("on_query callback failed for DNS view %s", name)
        return None if tail is None else data[:2] + tail  # the same answer, under this query's id

    def _answer(self, name: str, data: bytes, transport: str) -> _Cached:
        view = self._views.get(name)
        if view is None:
            return None, None
        reply, event = handle_packet(view, data, transport)
        # The event carries its view from the start: made once per cached answer, not once per query.
        return (None if reply is None else reply[2:]), (None if event is None else replace(event, view=name))

    async def _tcp_client(
        self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is None or self._closing:
            writer.close()  # accepted while closing: refuse rather than outlive close()
            return
        task.set_name(f"dns-tcp-{name}")
        self._connections[writer] = task
        replies = self._cache(name, "tcp")
        try:
            while True:
                async with asyncio.timeout(TCP_IDLE_TIMEOUT):
                    (length,) = struct.unpack("!H", await reader.readexactly(2))
                    data = await reader.readexactly(length)
                reply = self._serve(name, replies, "tcp", data)
                if reply is not None:
                    writer.write(struct.pack("!H", len(reply)) + reply)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # the client left, sent half a frame, or idled out: just close
        finally:
            self._connections.pop(writer, None)
            writer.close()
