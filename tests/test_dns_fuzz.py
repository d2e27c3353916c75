"""Hypothesis against the pure packet handler: no input makes it raise, every reply parses."""

from __future__ import annotations

import struct

from dnslib import EDNS0, QTYPE, RCODE, DNSRecord
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dns.rule import View, wildcard
from dns.server import handle_packet

VIEW = View(
    "ncpsim-compute-1",
    hosts=(("10-52-0-5.worker.nvcf.svc.cluster.local", "10.52.0.5"),),
    records=(wildcard("grpc-worker.example.com", "10.100.0.10"),),
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid_queries() -> list[bytes]:
    packets = []
    for i, (name, qtype) in enumerate(
        [
            ("invocation.grpc-worker.example.com", "A"),
            ("10-52-0-5.worker.nvcf.svc.cluster.local", "AAAA"),
            ("x.test", "MX"),
        ]
    ):
        record = DNSRecord.question(name, qtype)
        record.header.id = i
        if i == 1:
            record.add_ar(EDNS0(udp_len=1232))
        packets.append(record.pack())
    return packets


SEEDS = _valid_queries()


def check(data: bytes, transport: str) -> None:
    reply, event = handle_packet(VIEW, data, transport)
    if reply is None:
        # only what cannot be answered is dropped: under a header, or a response
        assert event is None
        assert len(data) < 12 or data[2] & 0x80
        return
    parsed = DNSRecord.parse(reply)
    assert parsed.header.id == struct.unpack("!H", data[:2])[0]
    assert parsed.header.qr == 1
    assert event is not None and event.transport == transport
    if transport == "udp":
        assert len(reply) <= 1232
    assert all(rr.rtype == QTYPE.A for rr in parsed.rr)  # the only records this server makes


@FUZZ
@given(data=st.binary(max_size=600), transport=st.sampled_from(["udp", "tcp"]))
@example(data=b"", transport="udp")
@example(data=b"\x00" * 12, transport="udp")
def test_random_bytes_never_raise_and_replies_parse(data: bytes, transport: str) -> None:
    check(data, transport)


@st.composite
def mutated_queries(draw: st.DrawFn) -> bytes:
    """Valid queries with a few bytes flipped, cut short or extended: random bytes rarely get past
    the header, these reach the question, label and EDNS parsing."""
    packet = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        packet[draw(st.integers(2, len(packet) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.integers(12, len(packet)))
    return bytes(packet[:cut]) + draw(st.binary(max_size=8))


@FUZZ
@given(data=mutated_queries(), transport=st.sampled_from(["udp", "tcp"]))
def test_mutated_queries_never_raise_and_replies_parse(data: bytes, transport: str) -> None:
    check(data, transport)


def test_every_prefix_of_a_query_and_trailing_data() -> None:
    """Fed whole, byte by byte, and with trailing data: a prefix is dropped (no header) or FORMERR,
    the whole query is answered, and bytes past its end make it FORMERR again."""
    for packet in SEEDS:
        for cut in range(len(packet) + 1):
            reply, _ = handle_packet(VIEW, packet[:cut])
            if cut < 12:
                assert reply is None
            else:
                formerr = DNSRecord.parse(reply).header.rcode == RCODE.FORMERR
                assert formerr is (cut < len(packet)), cut
        reply, _ = handle_packet(VIEW, packet + b"\x00")
        assert reply is not None and DNSRecord.parse(reply).header.rcode == RCODE.FORMERR
