"""Hostile DNS messages tried in issue 31's third round, answered as CoreDNS answers them (pure: handle_packet).

The EDNS version row is the fix: CoreDNS answers a version it does not speak with BADVERS (RFC 6891
6.1.3), the version it speaks (0) in its OPT record and no question or answer; ncpsim answered the name.
The version-0 row beside it is the negative control: the same query otherwise is answered.
"""

from __future__ import annotations

import struct

import pytest
from dnslib import RCODE, DNSRecord

from dns.rule import View, wildcard
from dns.server import handle_packet

WD = "grpc-worker.example.com"
VIEW = View("ncpsim-compute-1", records=(wildcard(WD, "10.100.0.10"),))
NAME = f"10-42-0-41.{WD}"


def header(*, flags: int = 0x0100, qd: int = 1, an: int = 0, ar: int = 0) -> bytes:
    return struct.pack("!HHHHHH", 0x1234, flags, qd, an, 0, ar)


def qname(name: str) -> bytes:
    return b"".join(bytes([len(part)]) + part.encode() for part in name.split(".")) + b"\0"


QUESTION = qname(NAME) + struct.pack("!HH", 1, 1)


def opt(*, payload: int = 4096, version: int = 0, rdata: bytes = b"", rdlen: int | None = None) -> bytes:
    ttl = version << 16  # extended RCODE 0, version, DO clear
    return b"\0" + struct.pack("!HHIH", 41, payload, ttl, len(rdata) if rdlen is None else rdlen) + rdata


# (case, message, rcode as CoreDNS sends it (None: dropped), answers, OPT version in the reply or None)
ROWS = [
    ("edns-v0-control", header(ar=1) + QUESTION + opt(), "NOERROR", 1, 0),
    ("edns-v1", header(ar=1) + QUESTION + opt(version=1), "BADVERS", 0, 0),
    ("edns-v255", header(ar=1) + QUESTION + opt(version=255), "BADVERS", 0, 0),
    ("edns-payload-65535", header(ar=1) + QUESTION + opt(payload=65535), "NOERROR", 1, 0),
    ("edns-payload-0", header(ar=1) + QUESTION + opt(payload=0), "NOERROR", 1, 0),
    ("edns-two-opts", header(ar=2) + QUESTION + opt() + opt(), "FORMERR", 0, None),
    (
        "edns-option-length-lies",
        header(ar=1) + QUESTION + opt(rdata=b"\0\x0a\0\x08abc", rdlen=100),
        "FORMERR",
        0,
        None,
    ),
    ("qdcount-0", header(qd=0), "FORMERR", 0, None),
    ("qdcount-2", header(qd=2) + QUESTION + QUESTION, "FORMERR", 0, None),
    ("qdcount-2-one-sent", header(qd=2) + QUESTION, "FORMERR", 0, None),
    ("qdcount-65535", header(qd=65535) + QUESTION, "FORMERR", 0, None),
    ("pointer-to-itself", header() + b"\xc0\x0c" + struct.pack("!HH", 1, 1), "FORMERR", 0, None),
    (
        "pointer-loop-of-two",
        header() + b"\x01a\xc0\x0e\xc0\x0c" + struct.pack("!HH", 1, 1),
        "FORMERR",
        0,
        None,
    ),
    ("pointer-forward", header() + b"\xc0\x20" + struct.pack("!HH", 1, 1) + b"\0" * 30, "FORMERR", 0, None),
    ("extended-label-type", header() + b"\x41\x00" + struct.pack("!HH", 1, 1), "FORMERR", 0, None),
    ("label-of-64", header() + b"\x40" + b"a" * 64 + b"\0" + struct.pack("!HH", 1, 1), "FORMERR", 0, None),
    (
        "name-over-255",
        header() + (b"\x3f" + b"a" * 63) * 5 + b"\0" + struct.pack("!HH", 1, 1),
        "FORMERR",
        0,
        None,
    ),
    ("opcode-update", header(flags=0x2800) + QUESTION, "NOTIMP", 0, None),
    ("a-response", header(flags=0x8100) + QUESTION, None, 0, None),
    ("one-byte", b"\0", None, 0, None),
]


@pytest.mark.parametrize(("case", "message", "rcode", "answers", "version"), ROWS, ids=[r[0] for r in ROWS])
def test_a_hostile_message_is_answered_as_coredns_answers_it(
    case: str, message: bytes, rcode: str | None, answers: int, version: int | None
) -> None:
    for transport in ("udp", "tcp"):
        wire, event = handle_packet(VIEW, message, transport)
        if rcode is None:
            assert (wire, event) == (None, None)
            continue
        assert wire is not None and event is not None
        reply = DNSRecord.parse(wire)
        opts = [rr for rr in reply.ar if rr.rtype == 41]
        extended = reply.header.rcode | ((opts[0].edns_rcode << 4) if opts else 0)
        want = 16 if rcode == "BADVERS" else getattr(RCODE, rcode)
        assert (event.rcode, extended, len(reply.rr)) == (rcode, want, answers)
        assert [rr.edns_ver for rr in opts] == ([] if version is None else [version])
        if rcode == "BADVERS":
            assert (
                reply.questions == [] and reply.header.aa == 0
            )  # as CoreDNS: no question, not authoritative
