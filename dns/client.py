"""The stub resolver simulated workers use: one A lookup against their cluster's DNS view.

Like glibc's stub it asks over UDP, retries on silence, and repeats the question over TCP when
the answer comes back truncated. A reply only counts when its id and question match what was
asked; anything else on the socket is ignored, as a real stub ignores spoofed datagrams.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct

from dnslib import CLASS, QTYPE, RCODE, DNSError, DNSHeader, DNSQuestion, DNSRecord
from dnslib.label import DNSLabelError

__all__ = ["NameNotResolved", "resolve_a"]

_SYSTEM_RANDOM = random.SystemRandom()


class NameNotResolved(Exception):
    """`name` did not resolve; `rcode` is "NXDOMAIN", "NODATA" (NOERROR without an A record),
    "SERVFAIL", another server rcode such as "REFUSED", or "TIMEOUT" when nothing answered."""

    def __init__(self, name: str, rcode: str, detail: str = "") -> None:
        message = f"{name} did not resolve: {rcode}" + (f" ({detail})" if detail else "")
        super().__init__(message)
        self.name = name
        self.rcode = rcode


def _matching_reply(query: DNSRecord, data: bytes) -> DNSRecord | None:
    try:
        reply = DNSRecord.parse(data)
    except Exception:  # noqa: BLE001 - garbage on the socket is ignored, like any non-matching reply
        return None
    if reply.header.id != query.header.id or not reply.header.qr or len(reply.questions) != 1:
        return None
    asked, got = query.q, reply.q
    if (got.qname, got.qtype, got.qclass) != (asked.qname, asked.qtype, asked.qclass):
        return None
    return reply


async def resolve_a(
    name: str,
    server: tuple[str, int],
    timeout: float = 1.0,
    attempts: int = 2,
    *,
    rng: random.Random | None = None,
) -> list[str]:
    """The IPv4 addresses of `name` from the DNS server at `server`, in answer order.

    `timeout` is per attempt; `attempts` is how many UDP queries to send before giving up with
    rcode "TIMEOUT". `rng` picks the query id (unpredictable by default; pass a seeded one to
    make a replay repeat byte for byte). Raises `NameNotResolved`.
    """
    query = _build_query(name, rng or _SYSTEM_RANDOM)
    reply = await _ask_udp(name, query, server, timeout, attempts)
    if reply.header.tc:
        reply = await _ask_tcp(name, query, server, timeout)
    return _addresses(name, query, reply)


def _build_query(name: str, rng: random.Random) -> DNSRecord:
    # The id is set here, not left to dnslib, which would draw it from the global `random`.
    header = DNSHeader(id=rng.randrange(0x10000), bitmap=0, rd=1)
    try:
        query = DNSRecord(header, q=DNSQuestion(name, QTYPE.A, CLASS.IN))
        query.pack()
    except (DNSError, DNSLabelError, UnicodeError, ValueError) as exc:  # empty or overlong labels
        raise ValueError(f"{name!r} is not a DNS name: {exc}") from None
    return query


async def _ask_udp(
    name: str, query: DNSRecord, server: tuple[str, int], timeout: float, attempts: int
) -> DNSRecord:
    loop = asyncio.get_running_loop()
    packet = query.pack()
    last_error = "no answer"
    family = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
    for _ in range(max(1, attempts)):
        # A plain connected socket, a new one per attempt as glibc's stub has; cheaper than an asyncio
        # transport and protocol per query (worker hosts in the scale benchmark: 73.6 -> 71.4 CPU-s).
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            try:
                sock.connect(server)
                await loop.sock_sendall(sock, packet)
                async with asyncio.timeout(timeout):
                    while (reply := _matching_reply(query, await loop.sock_recv(sock, 65535))) is None:
                        pass  # not the answer to this question: ignored, as a real stub does
                    return reply
            except TimeoutError:
                last_error = f"no answer within {timeout}s"
            except OSError as exc:  # ICMP port unreachable: no server there, no point waiting it out
                last_error = f"{exc.strerror or exc}"
    raise NameNotResolved(
        name, "TIMEOUT", f"{last_error} from {server[0]}:{server[1]} after {attempts} attempts"
    )


async def _ask_tcp(name: str, query: DNSRecord, server: tuple[str, int], timeout: float) -> DNSRecord:
    """Repeat the question over TCP (2-byte length prefix, RFC 1035 4.2.2) after a truncated reply."""
    packet = query.pack()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(*server)
            writer.write(struct.pack("!H", len(packet)) + packet)
            await writer.drain()
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            reply = _matching_reply(query, await reader.readexactly(length))
    except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
        raise NameNotResolved(name, "TIMEOUT", f"TCP retry after truncation failed: {exc!r}") from None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    if reply is None:
        raise NameNotResolved(name, "TIMEOUT", "TCP reply did not match the question")
    return reply


def _addresses(name: str, query: DNSRecord, reply: DNSRecord) -> list[str]:
    rcode = RCODE[reply.header.rcode]
    if rcode != "NOERROR":
        raise NameNotResolved(name, rcode)
    # Follow a CNAME chain inside the answer, in case a real DNS server is asked.
    wanted = {query.q.qname}
    addresses = []
    for rr in reply.rr:
        if rr.rname not in wanted:
            continue
        if rr.rtype == QTYPE.CNAME:
            wanted.add(rr.rdata.label)
        elif rr.rtype == QTYPE.A:
            addresses.append(str(rr.rdata))
    if not addresses:
        raise NameNotResolved(name, "NODATA")
    return addresses
