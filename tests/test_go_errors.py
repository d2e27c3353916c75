"""The Go worker's words (sim.protocols.go_errors): tables for the pure mapping, then real TLS handshakes on
loopback whose failures must come out as crypto/x509 words, with the peer's chain as what makes the names
and dates in them possible (without it, the negative control, they cannot be said)."""

from __future__ import annotations

import asyncio
import ssl
from datetime import UTC, datetime, timedelta

import pytest
import trustme
from cryptography import x509

from dns.client import NameNotResolved
from sim.model.netmap import Refused, Unreachable
from sim.protocols.go_errors import (
    NO_PROXY_CA,
    QUIC_IDLE,
    Dial,
    Leaf,
    connect_status_line,
    dns_error,
    hostname_error,
    http_dial_line,
    leg_broken_line,
    leg_status_line,
    matches_hostname,
    proxy_ca_certs,
    quic_dial_line,
    quic_status_line,
    x509_reason,
    zap_error,
)
from sim.protocols.tls import client_context

NOW = datetime(2026, 5, 1, 10, 0, 0, tzinfo=UTC)
HOST = "invocation.grpc-worker.example.com"
TARGET = "http://10-42-0-11.invocation.nvcf.svc.cluster.local:8443/v2/nvcf/worker/request-attach"
DNS = "10.53.0.10:53"
GET = Dial(HOST, DNS, addr="10.100.0.10:10084", method="GET", url=TARGET, proxied=True)
QUIC = Dial("10-42-0-41.grpc-worker.example.com", DNS, quic=True)
VALID = Leaf(("*.grpc-worker.example.com",), (), "", True, NOW - timedelta(days=1), NOW + timedelta(days=1))


@pytest.mark.parametrize(
    ("pattern", "host", "matches"),
    [
        ("*.grpc-worker.example.com", HOST, True),
        ("*.GRPC-worker.example.com", HOST + ".", True),  # case and one trailing dot, as Go compares
        ("*.example.com", HOST, False),  # a wildcard stands for exactly one label
        ("invocation.*.example.com", HOST, False),
        ("*.com", "example.com", True),  # Go, unlike OpenSSL, takes a wildcard over one label
        ("", HOST, False),
    ],
)
def test_go_matches_host_names_as_crypto_x509(pattern: str, host: str, matches: bool) -> None:
    assert matches_hostname(pattern, host) is matches


@pytest.mark.parametrize(
    ("leaf", "host", "said"),
    [
        (
            Leaf(("*.other.example.com", "other.example.com")),
            HOST,
            f"x509: certificate is valid for *.other.example.com, other.example.com, not {HOST}",
        ),
        (
            Leaf((), (), "", True),
            HOST,
            f"x509: certificate is not valid for any names, but wanted to match {HOST}",
        ),
        (
            Leaf((), (), HOST, False),
            HOST,
            "x509: certificate relies on legacy Common Name field, use SANs instead",
        ),
        (
            Leaf((HOST,)),
            "10.100.0.10",
            "x509: cannot validate certificate for 10.100.0.10 because it doesn't contain any IP SANs",
        ),
    ],
)
def test_hostname_errors_say_what_the_certificate_is_valid_for(leaf: Leaf, host: str, said: str) -> None:
    assert hostname_error(host, leaf) == said


@pytest.mark.parametrize(
    ("leaf", "said"),
    [
        (VALID, "x509: certificate signed by unknown authority"),  # the leaf passes: the chain's verdict
        (
            Leaf(("other.example.com",), (), "", True, VALID.not_before, NOW - timedelta(hours=1)),
            # expired and for another name: Go checks the validity period first
            (
                "x509: certificate has expired or is not yet valid: current time 2026-05-01T10:00:00Z "
                "is after 2026-05-01T09:00:00Z"
            ),
        ),
        (
            Leaf(VALID.dns_names, (), "", True, NOW + timedelta(hours=2), None),
            (
                "x509: certificate has expired or is not yet valid: current time 2026-05-01T10:00:00Z "
                "is before 2026-05-01T12:00:00Z"
            ),
        ),
        (Leaf(("other.example.com",)), f"x509: certificate is valid for other.example.com, not {HOST}"),
        (None, "x509: certificate signed by unknown authority"),
    ],
)
def test_x509_reasons_come_in_gos_order(leaf: Leaf | None, said: str) -> None:
    assert x509_reason(HOST, leaf, NOW) == said


PROXY = 'failed to send GET request: Get "' + TARGET + '": proxyconnect tcp: '


def ssl_error(reason: str) -> ssl.SSLError:
    """An ssl.SSLError as Python's ssl raises it for an alert or a record that is not TLS."""
    exc = ssl.SSLError(1, f"[SSL: {reason}] ...")
    exc.reason = reason  # type: ignore[misc]
    return exc


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (NameNotResolved(HOST, "NXDOMAIN"), PROXY + f"dial tcp: lookup {HOST} on {DNS}: no such host"),
        (NameNotResolved(HOST, "SERVFAIL"), PROXY + f"dial tcp: lookup {HOST} on {DNS}: server misbehaving"),
        (NameNotResolved(HOST, "TIMEOUT"), PROXY + f"dial tcp: lookup {HOST} on {DNS}: i/o timeout"),
        (
            Refused("connection refused: 10.100.0.10:10084/tcp"),
            PROXY + "dial tcp 10.100.0.10:10084: connect: connection refused",
        ),
        # a pod killed under its binding: the loopback port in Python's words never reaches the line
        (
            ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 41441)"),
            PROXY + "dial tcp 10.100.0.10:10084: connect: connection refused",
        ),
        (Unreachable("no route"), PROXY + "dial tcp 10.100.0.10:10084: connect: no route to host"),
        (TimeoutError(), 'failed to send GET request: Get "' + TARGET + '": context canceled'),
        (ssl_error("TLSV1_UNRECOGNIZED_NAME"), PROXY + "remote error: tls: unrecognized name"),
        (ssl_error("WRONG_VERSION_NUMBER"), PROXY + "tls: first record does not look like a TLS handshake"),
    ],
)
def test_http_dial_failures_in_net_http_words(exc: BaseException, said: str) -> None:
    line = http_dial_line(GET, exc, NOW)
    assert line == said
    assert "127.0.0.1" not in line and "Errno" not in line


def test_http_lines_for_answers_and_broken_legs() -> None:
    assert leg_status_line("GET", 503, "x" * 2000) == "GET request failed with status code 503: " + "x" * 1024
    assert leg_broken_line("POST", TARGET, "closed") == f'failed to send POST request: Post "{TARGET}": EOF'
    assert leg_broken_line("GET", TARGET, "cut").endswith(": unexpected EOF")
    assert connect_status_line("GET", TARGET, 404) == f'failed to send GET request: Get "{TARGET}": Not Found'
    assert dns_error("a.b", DNS, "REFUSED") == f"lookup a.b on {DNS}: server misbehaving"


@pytest.mark.parametrize(
    ("exc", "kwargs", "said"),
    [
        (NameNotResolved(QUIC.host, "NXDOMAIN"), {}, f"lookup {QUIC.host} on {DNS}: no such host"),
        (
            ConnectionError("handshake"),
            {"leaf": Leaf(("10-42-0-41.grpc-worker.example.com.evil",))},
            (
                "CRYPTO_ERROR 0x12a (local): tls: failed to verify certificate: x509: certificate is valid for "
                f"10-42-0-41.grpc-worker.example.com.evil, not {QUIC.host}"
            ),
        ),
        (
            ConnectionError("refused"),
            {"alert": 112},
            "CRYPTO_ERROR 0x170 (remote): TLS handshake failure (ENCRYPTION_INITIAL) 112: unrecognized name",
        ),
        (Refused("refused"), {}, QUIC_IDLE),
        (TimeoutError(), {}, QUIC_IDLE),
    ],
)
def test_quic_dial_failures_in_quic_go_words(exc: BaseException, kwargs: dict, said: str) -> None:
    assert quic_dial_line(QUIC, exc, NOW, **kwargs) == said


def test_quic_status_and_the_log_line() -> None:
    assert quic_status_line(403, "denied") == "unexpected status 403 from CONNECT proxy: denied"
    line = zap_error(1.5, "failed to handle request", "EOF", "r1", "worker-1-0")
    assert (
        line
        == '{"level": "error", "ts": 1.5, "msg": "failed to handle request", "error": "EOF", "req id": "r1", "worker": "worker-1-0"}'
    )


def test_proxy_ca_pem_is_read_as_gos_cert_pool_reads_it() -> None:
    pem = trustme.CA().cert_pem.bytes().decode()
    assert proxy_ca_certs("not a certificate") == "" and NO_PROXY_CA.endswith("$NVCF_PROXY_CA_PEM")
    # garbage and a broken block beside a good certificate: the good one is kept, the rest skipped
    broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    kept = proxy_ca_certs("junk\n" + broken + pem)
    assert x509.load_pem_x509_certificate(kept.encode()) == x509.load_pem_x509_certificate(pem.encode())


# Real handshakes: what Python's ssl refuses, said as Go says it ----------------------------------
async def _refusal(
    server: ssl.SSLContext, trust: trustme.CA, name: str, keep: bool
) -> ssl.SSLCertVerificationError:
    listener = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=server)
    port = listener.sockets[0].getsockname()[1]
    client = client_context([], trust.cert_pem.bytes().decode(), keep_peer_chain=keep)
    try:
        with pytest.raises(ssl.SSLCertVerificationError) as failed:
            await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=name)
    finally:
        listener.close()
        await listener.wait_closed()
    return failed.value


def _server(ca: trustme.CA, *names: str, **times: datetime) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(*names, **times).configure_cert(context)
    return context


@pytest.mark.parametrize("keep", [True, False], ids=["peer-chain", "negative-control"])
def test_a_handshake_refused_for_its_name_says_what_the_certificate_covers(keep: bool) -> None:
    ca = trustme.CA()
    exc = asyncio.run(_refusal(_server(ca, "*.other.example.com"), ca, HOST, keep))
    line = http_dial_line(GET, exc, datetime.now(UTC))
    named = (
        f"tls: failed to verify certificate: x509: certificate is valid for *.other.example.com, not {HOST}"
    )
    assert (named in line) is keep  # without the peer's chain the names cannot be said


def test_an_unknown_authority_and_an_expired_certificate() -> None:
    ca, other = trustme.CA(), trustme.CA()
    unknown = asyncio.run(_refusal(_server(other, HOST), ca, HOST, True))
    assert http_dial_line(GET, unknown, datetime.now(UTC)).endswith(
        "proxyconnect tcp: tls: failed to verify certificate: x509: certificate signed by unknown authority"
    )
    ended = datetime.now(UTC) - timedelta(days=1)
    expired = asyncio.run(
        _refusal(_server(ca, HOST, not_before=ended - timedelta(days=30), not_after=ended), ca, HOST, True)
    )
    line = http_dial_line(GET, expired, datetime.now(UTC))
    assert "x509: certificate has expired or is not yet valid: current time " in line
    assert f"is after {ended.strftime('%Y-%m-%dT%H:%M:%SZ')}" in line
