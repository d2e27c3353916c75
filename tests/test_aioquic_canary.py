"""Canary for the aioquic internals that sim.protocols.h3 and sim.protocols.h3_quic patch or read.

aioquic's public API offers neither receive-side backpressure nor the ClientHello's server name, so the
HTTP/3 glue reaches into private attributes (pyproject.toml pins aioquic below 2 for that reason). When
an aioquic release renames or reshapes one of them, these tests say which one, by name, before any
end-to-end test fails in some less obvious way. The last two tests drive a client and a server
QuicConnection into each other in memory (no sockets) and check that both hooks still take effect.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest
import trustme
from aioquic import tls
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import Buffer
from aioquic.quic import connection as quic_connection
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import HandshakeCompleted
from aioquic.quic.packet import QuicFrameType, pull_quic_header
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.stream import QuicStream

from certs.volume import write_secret
from sim.protocols import h3_quic
from sim.protocols.h3_quic import WINDOW

NAME = "pod.example.test"
HANDSHAKE_ROUNDS = 20  # datagram exchanges allowed for the in-memory handshake (it takes 3-4)

# (owner, private method, the parameters the hook relies on, in order)
PATCHED_METHODS = [
    (
        QuicConnection,
        "_write_stream_limits",
        ["builder", "space", "stream"],
    ),  # replaced: h3_quic._install_credit
    (
        QuicConnection,
        "_on_max_stream_data_delivery",
        ["delivery", "stream"],
    ),  # handler of our MAX_STREAM_DATA
    (QuicConnection, "_initialize", ["peer_cid"]),  # wrapped: h3_quic.peek_server_name
    (
        QuicConnection,
        "_payload_received",
        ["context", "plain", "crypto_frame_required"],
    ),  # wrapped: h3_quic._install_ack_policy
    (QuicConnection, "receive_datagram", ["data", "addr", "now"]),  # wrapped: _install_ack_policy
    (tls.Context, "_server_handle_hello", ["input_buf", "initial_buf", "handshake_buf"]),  # wrapped: peek
]


def _client_config(trust: bytes) -> QuicConfiguration:
    return h3_quic.client_configuration(NAME, trust)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    ca = trustme.CA()
    leaf = ca.issue_cert(NAME)
    secret = write_secret(
        tmp_path_factory.mktemp("canary") / "tls",
        leaf.cert_chain_pems[0].bytes(),
        leaf.private_key_pem.bytes(),
        ca.cert_pem.bytes(),
    )
    return secret, ca.cert_pem.bytes()


@pytest.mark.parametrize(
    ("owner", "name", "params"), PATCHED_METHODS, ids=[f"{o.__name__}.{n}" for o, n, _ in PATCHED_METHODS]
)
def test_patched_method_keeps_its_name_and_parameters(owner: type, name: str, params: list[str]) -> None:
    method = getattr(owner, name, None)
    assert callable(method), f"aioquic {owner.__qualname__}.{name} is gone: sim/protocols/h3_quic.py hooks it"
    found = [p for p in inspect.signature(method).parameters if p != "self"]
    assert found == params, f"aioquic {owner.__qualname__}.{name}{tuple(found)}: the hook expects {params}"


def test_connection_fields_the_glue_reads(pki: tuple[Path, bytes]) -> None:
    quic = QuicConnection(configuration=_client_config(pki[1]))
    streams = getattr(quic, "_streams", None)
    assert isinstance(streams, dict), (
        "QuicConnection._streams (stream id -> QuicStream) is gone: h3.py reads it"
    )
    assert hasattr(quic, "_close_event"), (
        "QuicConnection._close_event is gone: h3.py reads it on each datagram"
    )
    assert quic._close_event is None


def test_stream_credit_fields_the_pool_reads(pki: tuple[Path, bytes]) -> None:
    """sim.proxy.h3_pool.stream_credit reads the peer's MAX_STREAMS and the next stream id to open."""
    pair = Pair(*pki)
    pair.exchange()
    assert pair.handshake_done()
    client = pair.client
    assert client._remote_max_streams_bidi == 128, (
        "the server's initial_max_streams_bidi, as aioquic reads it"
    )
    assert client._local_next_stream_id_bidi == 0
    client.send_stream_data(client.get_next_available_stream_id(), b"x")
    assert client._local_next_stream_id_bidi == 4, "QuicConnection._local_next_stream_id_bidi changed meaning"


def test_stream_fields_the_glue_reads() -> None:
    stream = QuicStream(stream_id=0, max_stream_data_local=1024, max_stream_data_remote=1024)
    for field in ("stream_id", "max_stream_data_local", "max_stream_data_local_sent", "sender", "receiver"):
        assert hasattr(stream, field), f"QuicStream.{field} is gone: h3_quic's credit hook uses it"
    assert stream.receiver.starting_offset() == 0, (
        "QuicStreamReceiver.starting_offset is gone: H3Endpoint._credit counts what QUIC delivered with it"
    )
    buffer = getattr(stream.sender, "_buffer", None)
    assert isinstance(buffer, (bytes, bytearray)), (
        "QuicStreamSender._buffer is gone: H3Endpoint.unacked reads it"
    )


def test_frame_capacity_and_builder_arguments_match_aioquic() -> None:
    assert h3_quic._MAX_STREAM_DATA_FRAME_CAPACITY == quic_connection.MAX_STREAM_DATA_FRAME_CAPACITY
    params = list(inspect.signature(QuicPacketBuilder.start_frame).parameters)
    assert params[:5] == ["self", "frame_type", "capacity", "handler", "handler_args"], params
    assert QuicFrameType.MAX_STREAM_DATA


def test_protocol_fields_the_glue_reads(pki: tuple[Path, bytes]) -> None:
    async def make() -> QuicConnectionProtocol:
        return QuicConnectionProtocol(QuicConnection(configuration=_client_config(pki[1])))

    protocol = asyncio.run(make())
    for field in ("_transport", "_timer"):  # close_client takes the socket; abandon cancels the timer
        assert hasattr(protocol, field), (
            f"QuicConnectionProtocol.{field} is gone: sim/protocols/h3.py uses it"
        )


def test_tls_names_the_sni_check_uses() -> None:
    assert callable(tls.pull_client_hello), (
        "aioquic.tls.pull_client_hello is gone: peek_server_name parses with it"
    )
    assert "server_name" in inspect.signature(tls.ClientHello).parameters
    assert issubclass(h3_quic.AlertUnrecognizedName, tls.Alert)
    assert tls.AlertDescription.unrecognized_name == 112


# -- the hooks at work, in memory -----------------------------------------------------------------------
class Pair:
    """A client and a server QuicConnection handing datagrams to each other, with simulated time."""

    ADDR = ("127.0.0.1", 4433)

    def __init__(self, secret: Path, trust: bytes, on_server: object = None) -> None:
        self.now = 0.0
        self.client = QuicConnection(configuration=_client_config(trust))
        self.client.connect(self.ADDR, now=self.now)
        first = self.client.datagrams_to_send(now=self.now)
        header = pull_quic_header(Buffer(data=first[0][0]), host_cid_length=8)
        self.server = QuicConnection(
            configuration=h3_quic.server_configuration(secret),
            original_destination_connection_id=header.destination_cid,
        )
        if callable(on_server):
            on_server(self.server)
        for data, _ in first:
            self.server.receive_datagram(data, self.ADDR, now=self.now)

    def exchange(self) -> None:
        for _ in range(HANDSHAKE_ROUNDS):
            self.now += 0.001
            moved = 0
            for sender, receiver in ((self.server, self.client), (self.client, self.server)):
                for data, _ in sender.datagrams_to_send(now=self.now):
                    receiver.receive_datagram(data, self.ADDR, now=self.now)
                    moved += 1
            if not moved:
                return

    def handshake_done(self) -> bool:
        events = []
        while (event := self.client.next_event()) is not None:
            events.append(event)
        return any(isinstance(e, HandshakeCompleted) for e in events)


def test_peek_server_name_sees_the_client_hello(pki: tuple[Path, bytes]) -> None:
    seen: list[str | None] = []
    pair = Pair(*pki, on_server=lambda server: h3_quic.peek_server_name(server, seen.append))
    pair.exchange()
    assert seen == [NAME], "peek_server_name was not called with the ClientHello's server name"
    assert pair.handshake_done()


def test_install_credit_decides_max_stream_data(pki: tuple[Path, bytes]) -> None:
    granted = 3 * h3_quic.WINDOW
    asked: list[int] = []

    def credit(stream_id: int) -> int:
        asked.append(stream_id)
        return granted

    pair = Pair(*pki, on_server=lambda server: h3_quic._install_credit(server, credit))
    pair.exchange()
    assert pair.handshake_done()
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_stream_data(stream_id, b"x" * 1000)
    pair.exchange()
    assert stream_id in asked, "aioquic no longer calls _write_stream_limits for the server's streams"
    delivered = pair.server._streams[stream_id].receiver.starting_offset()
    assert delivered == 1000, (
        "QuicStreamReceiver.starting_offset no longer counts the bytes delivered in order"
    )
    assert pair.client._streams[stream_id].max_stream_data_remote == granted


@pytest.mark.parametrize(
    ("granted", "wanted", "announced"),
    [
        (WINDOW, WINDOW, WINDOW),  # nothing read
        (WINDOW, WINDOW + 1, WINDOW),  # one byte read: the peer still has a whole window
        (WINDOW, WINDOW + WINDOW // 2 - 1, WINDOW),  # just short of half a window
        (WINDOW, WINDOW + WINDOW // 2, WINDOW + WINDOW // 2),  # half a window read: announce it
        (WINDOW, 3 * WINDOW, 3 * WINDOW),
        (2 * WINDOW, WINDOW, 2 * WINDOW),  # never taken back
    ],
)
def test_raised_credit(granted: int, wanted: int, announced: int) -> None:
    assert h3_quic.raised_credit(granted, wanted) == announced


def _credit_updates(pki: tuple[Path, bytes], reads: list[int]) -> list[int]:
    """The server reads `reads` bytes in turn, each after the client sent them; the credit the client sees."""
    read = 0
    pair = Pair(*pki, on_server=lambda server: h3_quic._install_credit(server, lambda _: read + WINDOW))
    pair.exchange()
    stream_id = pair.client.get_next_available_stream_id()
    seen = []
    for size in reads:
        pair.client.send_stream_data(stream_id, b"x" * size)
        pair.exchange()
        read += size
        pair.client.send_stream_data(stream_id, b"")  # any packet lets the server answer
        pair.exchange()
        seen.append(pair.client._streams[stream_id].max_stream_data_remote)
    return seen


def test_credit_is_announced_per_half_window(pki: tuple[Path, bytes], monkeypatch) -> None:
    """Small reads leave the peer's credit alone until half a window is read; then one MAX_STREAM_DATA."""
    reads = [100] * 10 + [WINDOW // 2]
    assert _credit_updates(pki, reads) == [WINDOW] * 10 + [WINDOW + 1000 + WINDOW // 2]
    # Control: announcing every byte read (the hook before) moves the peer's credit on every read.
    monkeypatch.setattr(h3_quic, "raised_credit", lambda granted, wanted: max(granted, wanted))
    assert len(set(_credit_updates(pki, reads))) == len(reads)


@pytest.mark.parametrize(
    ("pending", "in_order", "due"),
    [
        (None, True, 1.0 + h3_quic.MAX_ACK_DELAY),  # the first packet since the last ACK may wait
        (1.02, True, 1.0),  # the second: at once
        (None, False, 1.0),  # out of order: at once
        (0.5, False, 1.0),
    ],
)
def test_ack_deadline(pending: float | None, in_order: bool, due: float) -> None:
    assert h3_quic.ack_deadline(1.0, pending, in_order) == pytest.approx(due)


def _quiet_pair(pki: tuple[Path, bytes], hooked: bool) -> tuple[Pair, int]:
    """A pair past its handshake with nothing left to acknowledge, and a client stream open."""
    pair = Pair(*pki, on_server=h3_quic._install_ack_policy if hooked else None)
    pair.exchange()
    for _ in range(3):  # let every ACK timer run out
        pair.now += 1.0
        for side in (pair.client, pair.server):
            side.handle_timer(pair.now)
        pair.exchange()
    return pair, pair.client.get_next_available_stream_id()


def _deliver(pair: Pair, stream_id: int, data: bytes) -> float | None:
    """The client sends `data`; the server receives it. Returns when the server will acknowledge it."""
    pair.client.send_stream_data(stream_id, data)
    for datagram, _ in pair.client.datagrams_to_send(now=pair.now):
        pair.server.receive_datagram(datagram, Pair.ADDR, now=pair.now)
    return pair.server._spaces[tls.Epoch.ONE_RTT].ack_at


def test_application_data_is_acknowledged_every_second_packet_or_within_25_ms(pki) -> None:
    pair, stream_id = _quiet_pair(pki, hooked=True)
    assert _deliver(pair, stream_id, b"one") == pytest.approx(pair.now + h3_quic.MAX_ACK_DELAY)
    pair.now += 0.002
    assert _deliver(pair, stream_id, b"two") == pytest.approx(pair.now)  # the second packet: at once
    # Control: aioquic's own policy acknowledges each packet 1 ms after it arrives.
    pair, stream_id = _quiet_pair(pki, hooked=False)
    assert _deliver(pair, stream_id, b"one") == pytest.approx(pair.now + 0.001)


def test_data_written_carries_the_pending_ack(pki) -> None:
    for bundled in (True, False):  # False: the control, no bundling
        pair, stream_id = _quiet_pair(pki, hooked=True)
        _deliver(pair, stream_id, b"request")
        pair.server.send_stream_data(stream_id, b"response")
        if bundled:
            h3_quic.bundle_ack(pair.server, pair.now)
        sent = pair.server.datagrams_to_send(now=pair.now)
        assert len(sent) == 1
        acked = pair.server._spaces[tls.Epoch.ONE_RTT].ack_at is None
        assert acked == bundled, (
            "the response packet carried the ACK" if bundled else "no ACK without bundling"
        )


def test_quic_servers_idle_out_as_envoys_listener_does(tmp_path) -> None:
    """Envoy's QUIC listener closes a connection after 300 s without network activity (aioquic: 60 s)."""
    import trustme

    from sim.protocols.h3_quic import server_configuration

    leaf = trustme.CA().issue_cert("*.grpc-worker.example.com")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    assert server_configuration(tmp_path).idle_timeout == 300.0
