"""The workers' stub resolver (dns.client) against fake servers that misbehave on purpose.

Lookups through the real resolver are in test_dns_server.py.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time

import pytest
from dnslib import DNSHeader, DNSQuestion, DNSRecord

from dns.client import NameNotResolved, resolve_a

SHORT = 3.0  # seconds: a loopback exchange takes milliseconds; only a hang ever reaches this
NAME = "10-42-0-11.invocation.nvcf.svc.cluster.local"


def test_client_times_out_against_a_silent_server() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))  # bound, so no ICMP refusal; never read, so never answers
        started = time.monotonic()
        with pytest.raises(NameNotResolved) as caught:
            asyncio.run(resolve_a(NAME, silent.getsockname(), timeout=0.05, attempts=2))
        elapsed = time.monotonic() - started
    assert caught.value.rcode == "TIMEOUT"
    assert 0.1 <= elapsed < SHORT  # both attempts waited out, nothing more


def test_client_ignores_a_reply_to_another_question() -> None:
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as fake:
            fake.setblocking(False)
            fake.bind(("127.0.0.1", 0))
            rng = random.Random(5)
            lookup = asyncio.create_task(
                resolve_a("a.test", fake.getsockname(), timeout=SHORT, rng=rng), name="lookup"
            )
            data, client = await loop.sock_recvfrom(fake, 512)
            asked = DNSRecord.parse(data)
            assert asked.header.id == random.Random(5).randrange(0x10000)  # ids come from the rng given
            spoof = DNSRecord(DNSHeader(id=asked.header.id, qr=1), q=DNSQuestion("b.test")).pack()
            wrong_id = asked.reply()
            wrong_id.header.id ^= 1
            right = asked.reply()
            right.add_answer(*DNSRecord.question("a.test").replyZone("a.test 5 A 192.0.2.1").rr)
            for reply in (b"junk", spoof, wrong_id.pack(), right.pack()):
                await loop.sock_sendto(fake, reply, client)
            return await lookup

    assert asyncio.run(asyncio.wait_for(scenario(), SHORT)) == ["192.0.2.1"]


@pytest.mark.parametrize("name", ["a..b.test", "x" * 64 + ".test"])
def test_client_refuses_names_that_cannot_be_asked(name: str) -> None:
    with pytest.raises(ValueError, match="not a DNS name"):
        asyncio.run(resolve_a(name, ("127.0.0.1", 9)))


def test_client_gives_up_at_once_on_a_closed_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()
    # the port is free now: the kernel answers with ICMP port unreachable, no timeout is waited
    started = time.monotonic()
    with pytest.raises(NameNotResolved) as caught:
        asyncio.run(resolve_a(NAME, closed, timeout=SHORT, attempts=2))
    assert caught.value.rcode == "TIMEOUT"
    assert time.monotonic() - started < SHORT
