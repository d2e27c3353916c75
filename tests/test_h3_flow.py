"""sim.protocols.h3 on real loopback QUIC: requests, stream credit that follows reading, SNI peeking, handshake errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import trustme
from aioquic.quic.packet import QuicErrorCode
from timeouts import CALL

from certs.volume import write_secret
from sim.protocols import h3

NAME = "a.example.test"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    ca = trustme.CA()
    leaf = ca.issue_cert("*.example.test")
    secret = write_secret(
        tmp_path_factory.mktemp("h3") / "tls",
        leaf.cert_chain_pems[0].bytes(),
        leaf.private_key_pem.bytes(),
        ca.cert_pem.bytes(),
    )
    return secret, ca.cert_pem.bytes()


class Harness:
    """A server that answers every request 200 and hands the stream to the test."""

    def __init__(self, secret: Path, on_hello=None):
        self.requests: asyncio.Queue[h3.H3Stream] = asyncio.Queue()
        self.on_hello = on_hello
        self.server = h3.H3Server(h3.ReloadingServerConfig(secret), self._endpoint)

    def _endpoint(self, quic) -> h3.H3Endpoint:
        endpoint = h3.H3Endpoint(quic, on_request=self.requests.put_nowait)
        if self.on_hello:
            h3.peek_server_name(quic, lambda name: self.on_hello(endpoint, name))
        return endpoint


async def _with_server(secret: Path, body, on_hello=None) -> None:
    harness = Harness(secret, on_hello)
    port = await harness.server.start()
    try:
        await asyncio.wait_for(
            body(harness, ("127.0.0.1", port)), CALL
        )  # a hang bound, stretched by the load
    finally:
        harness.server.close()


def test_request_round_trip_and_sni(pki: tuple[Path, bytes]) -> None:
    secret, ca = pki
    seen: list[str | None] = []

    def on_hello(endpoint: h3.H3Endpoint, name: str | None) -> None:
        seen.append(name)

    async def body(harness: Harness, addr: tuple[str, int]) -> None:
        client = await h3.connect(addr, h3.client_configuration(NAME, ca), timeout=5)
        try:
            stream = client.open_request(
                [
                    (b":method", b"POST"),
                    (b":scheme", b"https"),
                    (b":authority", NAME.encode()),
                    (b":path", b"/x"),
                ]
            )
            served = await harness.requests.get()
            assert dict(await served.headers)[b":path"] == b"/x"
            served.send_headers([(b":status", b"200")])
            stream.write(b"ping")
            assert await served.read() == b"ping"
            served.write(b"pong", end=True)
            assert await stream.headers and stream.status == 200
            assert await stream.read() == b"pong"
            assert await stream.read() == b""
            stream.end()
            assert await served.read() == b""
            assert seen == [NAME]
        finally:
            h3.close_client(client)

    asyncio.run(_with_server(secret, body, on_hello))
    assert seen == [NAME]


def test_unread_stream_stops_the_writer(pki: tuple[Path, bytes]) -> None:
    """The server never reads: the client must stall near WINDOW instead of the server buffering 1 MiB."""
    secret, ca = pki
    total = 1024 * 1024

    async def body(harness: Harness, addr: tuple[str, int]) -> None:
        client = await h3.connect(addr, h3.client_configuration(NAME, ca), timeout=5)
        try:
            stream = client.open_request(
                [
                    (b":method", b"POST"),
                    (b":scheme", b"https"),
                    (b":authority", NAME.encode()),
                    (b":path", b"/bulk"),
                ]
            )
            served = await harness.requests.get()

            async def writer() -> None:
                chunk = b"x" * 16384
                for _ in range(total // len(chunk)):
                    stream.write(chunk)
                    await stream.drain()
                stream.end()

            task = asyncio.create_task(writer(), name="bulk-writer")
            while served.pending < h3.WINDOW - 32 * 1024:
                await served.endpoint.progress()
            for _ in range(5):  # real round trips: the writer had every chance to push more
                await client.ping()
            assert not task.done()
            assert served.pending <= h3.WINDOW + 1024
            received = 0
            while chunk := await served.read():
                received += len(chunk)
            await task
            assert received == total
        finally:
            h3.close_client(client)

    asyncio.run(_with_server(secret, body))


def test_refused_server_name_and_untrusted_certificate(pki: tuple[Path, bytes]) -> None:
    secret, ca = pki

    def on_hello(endpoint: h3.H3Endpoint, name: str | None) -> None:
        if name != NAME:
            raise h3.AlertUnrecognizedName(f"no route for {name}")

    async def body(harness: Harness, addr: tuple[str, int]) -> None:
        with pytest.raises(h3.HandshakeFailed) as refused:
            await h3.connect(addr, h3.client_configuration("b.example.test", ca), timeout=5)
        assert refused.value.error_code == QuicErrorCode.CRYPTO_ERROR + 112
        assert not refused.value.certificate_rejected
        with pytest.raises(h3.HandshakeFailed) as untrusted:
            await h3.connect(addr, h3.client_configuration(NAME, b""), timeout=5)
        assert untrusted.value.certificate_rejected
        assert "issuer" in untrusted.value.reason

    asyncio.run(_with_server(secret, body, on_hello))


def test_trust_pem_normalises_bundles(tmp_path: Path) -> None:
    first, second = trustme.CA(), trustme.CA()
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(b"\n" + first.cert_pem.bytes() + b"\n\n")
    pem = h3.trust_pem([bundle], second.cert_pem.bytes().decode() + "\n\n")
    assert pem.count(b"BEGIN CERTIFICATE") == 2
    assert h3.trust_pem([]) == b""


def test_reloading_config_swaps_good_material_and_keeps_old_on_broken(tmp_path: Path) -> None:
    ca = trustme.CA()
    first, second = ca.issue_cert("a.example.test"), ca.issue_cert("b.example.test")
    secret = write_secret(
        tmp_path / "tls", first.cert_chain_pems[0].bytes(), first.private_key_pem.bytes(), ca.cert_pem.bytes()
    )
    errors: list[str] = []
    reloading = h3.ReloadingServerConfig(secret, errors.append)
    config = reloading.refresh()
    original = config.certificate
    write_secret(secret, b"garbage", b"garbage", ca.cert_pem.bytes())
    assert reloading.refresh().certificate == original and len(errors) == 1
    write_secret(
        secret, second.cert_chain_pems[0].bytes(), second.private_key_pem.bytes(), ca.cert_pem.bytes()
    )
    assert reloading.refresh() is config  # same object: aioquic's server holds it
    assert config.certificate != original and reloading.generation == 2


def _answered_in(pki: tuple[Path, bytes]) -> int:
    """Datagrams the server sends for a request that came in two packets handled in one wake-up (so the second
    makes the ACK due at once), which a task answers; the connection otherwise quiet."""
    secret, ca = pki
    received: list[bytes] = []

    async def body(harness: Harness, addr: tuple[str, int]) -> None:
        client = await h3.connect(addr, h3.client_configuration(NAME, ca), timeout=5)
        try:
            hear = client.datagram_received
            client.datagram_received = lambda data, peer: (received.append(data), hear(data, peer))  # type: ignore[method-assign]
            await client.ping()  # answered: the server owes nothing from the handshake on
            received.clear()
            headers = [
                (b":method", b"POST"),
                (b":scheme", b"https"),
                (b":authority", NAME.encode()),
                (b":path", b"/"),
            ]
            stream = client.open_request(headers)
            client.transmit()  # the headers in one datagram, the body in the next, both before the server reads
            stream.write(b"body", end=True)
            client.transmit()
            served = await harness.requests.get()  # this task is woken by the request, as a relay is
            assert await served.read() == b"body"
            assert await served.read() == b""
            served.send_headers([(b":status", b"204")], end=True)
            await stream.headers
        finally:
            h3.close_client(client)

    asyncio.run(_with_server(secret, body))
    return len(received)


def test_an_answer_carries_the_ack_its_request_made_due(pki: tuple[Path, bytes], monkeypatch) -> None:
    """An endpoint transmits once per loop iteration, after the tasks the datagrams woke have written: the ACK
    the request's second packet made due leaves with the answer, in one datagram."""
    assert _answered_in(pki) == 1
    # Control: transmitting as each datagram is handled (aioquic's way) sends the ACK on its own first.
    monkeypatch.setattr(h3.H3Endpoint, "_transmit_soon", h3.H3Endpoint.transmit)
    assert _answered_in(pki) == 2
