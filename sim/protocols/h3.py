"""Thin asyncio glue around aioquic's HTTP/3: every QUIC party in ncpsim (grpc-proxy pods, the proxy's
HTTP/3 front, workers) speaks through H3Endpoint and H3Stream.

Four things aioquic's own asyncio helpers do not give us, and why we need them:
- `connect` keeps the protocol when the handshake fails, so a caller can report *why* (a certificate
  the worker does not trust is the answer the simulator exists to show).
- Backpressure. aioquic grants a peer more stream credit as soon as data arrives, whether or not the
  application has read it. sim.protocols.h3_quic's `_install_credit` replaces that policy, for streams an endpoint
  serves, by "what the application has read plus WINDOW", so a relay that stops reading stops its peer;
  and `H3Stream.drain` waits while too much written data is still unacknowledged.
- The server name of a ClientHello, which aioquic does not keep: sim.protocols.h3_quic's `peek_server_name`.
- Packets as the real peers send them: ACKs delayed and riding on data (sim.protocols.h3_quic's
  `_install_ack_policy`), and one transmit per loop iteration where aioquic transmits after each datagram.
Configurations, the trust bundle, certificate reload and those aioquic hooks live in sim.protocols.h3_quic,
one request stream in sim.protocols.h3_stream; their public names are re-exported here, so callers import
everything from sim.protocols.h3.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aioquic import tls
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import (
    ConnectionTerminated,
    HandshakeCompleted,
    ProtocolNegotiated,
    QuicEvent,
    StopSendingReceived,
)
from aioquic.quic.events import StreamReset as QuicStreamReset
from aioquic.quic.packet import QuicErrorCode

from sim.protocols.h3_quic import (
    WINDOW,
    AlertCertificateUnknown,
    AlertUnrecognizedName,
    ReloadingServerConfig,
    _install_ack_policy,
    _install_credit,
    bundle_ack,
    check_server_certificate,
    client_configuration,
    peek_server_name,
    peer_certificate,
    raised_credit,
    server_configuration,
    trust_pem,
)
from sim.protocols.h3_stream import (
    H3_CONNECT_ERROR,
    H3_REQUEST_CANCELLED,
    HIGH_WATER,
    H3Stream,
    Headers,
    StreamError,
)
from sim.protocols.lossy import Fate, LossyTransport

# The public API, including what sim.protocols.h3_quic and sim.protocols.h3_stream define: callers import
# all of it from sim.protocols.h3.
__all__ = [
    "H3_CONNECT_ERROR",
    "H3_REQUEST_CANCELLED",
    "HIGH_WATER",
    "WINDOW",
    "AlertCertificateUnknown",
    "AlertUnrecognizedName",
    "H3Endpoint",
    "H3Server",
    "H3Stream",
    "HandshakeFailed",
    "Headers",
    "ReloadingServerConfig",
    "StreamError",
    "client_configuration",
    "close_client",
    "connect",
    "peek_server_name",
    "server_configuration",
    "trust_pem",
]

log = logging.getLogger(__name__)

# TLS alerts that mean "I do not accept your certificate" (CRYPTO_ERROR + alert, RFC 9001 4.8).
_CERT_ALERTS = {
    tls.AlertDescription.bad_certificate,
    tls.AlertDescription.unsupported_certificate,
    tls.AlertDescription.certificate_expired,
    tls.AlertDescription.unknown_ca,
    tls.AlertDescription.certificate_unknown,
}


class HandshakeFailed(ConnectionError):
    """The QUIC handshake did not complete; `error_code` is the QUIC close code (None: timed out);
    `peer_certificate`, the certificate the server showed, if the handshake got that far."""

    def __init__(self, reason: str, error_code: int | None, peer_certificate: Any = None):
        super().__init__(reason)
        self.reason, self.error_code, self.peer_certificate = reason, error_code, peer_certificate

    @property
    def alert(self) -> int | None:
        """The TLS alert the connection was closed with (CRYPTO_ERROR + alert), if it was."""
        code = self.error_code
        if code is None or not 0 <= code - QuicErrorCode.CRYPTO_ERROR < 256:
            return None
        return code - QuicErrorCode.CRYPTO_ERROR

    @property
    def certificate_rejected(self) -> bool:
        code = self.error_code
        return code is not None and code - QuicErrorCode.CRYPTO_ERROR in _CERT_ALERTS


# -- endpoints -----------------------------------------------------------------------------------
class H3Endpoint(QuicConnectionProtocol):
    """One QUIC connection speaking HTTP/3, client or server side."""

    def __init__(
        self,
        quic: QuicConnection,
        stream_handler: Any = None,
        *,
        on_request: Callable[[H3Stream], None] | None = None,
    ):
        super().__init__(quic, stream_handler)
        self.quic = quic
        self.h3: H3Connection | None = None
        self.on_request = on_request  # server side: called with each new request stream
        self.on_closed: Callable[[], None] = lambda: None
        self.streams: dict[int, H3Stream] = {}
        self.close_info: tuple[int, str] | None = None  # (QUIC error code, reason) once terminated
        self.closed = False
        self.handshake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._progress = asyncio.Event()
        self._flush_handle: asyncio.Handle | None = None
        self._wrote = False  # the application wrote since the last transmit
        _install_credit(quic, self._credit)
        _install_ack_policy(quic)

    # Credit and acknowledgements --------------------------------------------------------------
    def _credit(self, stream_id: int) -> int | None:
        stream, quic_stream = self.streams.get(stream_id), self.quic._streams.get(stream_id)
        if stream is None or quic_stream is None:
            return None
        # What QUIC delivered in order (HTTP/3 framing included), less the payload not read yet.
        return quic_stream.receiver.starting_offset() - stream.pending + WINDOW

    def _consumed(self, stream_id: int) -> None:
        """The application read from the stream: send its new credit now if the hook would announce it."""
        limit = self._credit(stream_id)
        stream = self.quic._streams.get(stream_id)
        granted = stream.max_stream_data_local if stream is not None else 0
        if limit is not None and raised_credit(granted, limit) != granted:
            self.flush_soon()

    def unacked(self, stream_id: int) -> int:
        stream = self.quic._streams.get(stream_id)
        return len(stream.sender._buffer) if stream is not None else 0

    async def progress(self) -> None:
        """Wait for the next datagram (which may carry acknowledgements) or the end of the connection."""
        await self._progress.wait()

    def _wake(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    # Sending ---------------------------------------------------------------------------------
    def flush_soon(self) -> None:
        """The application wrote: send it, with any ACK pending, once this loop iteration is done."""
        self._wrote = True
        self._transmit_soon()

    def _transmit_soon(self) -> None:
        # One transmit for everything a loop iteration brought: the datagrams received (aioquic transmits after
        # each) and what the application wrote in answer, so an ACK and a response leave in one packet.
        if self._flush_handle is None and not self.closed:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if not self.closed:
            if self._wrote:
                bundle_ack(self.quic, self._loop.time())
                self._wrote = False
            self.transmit()

    def open_request(self, headers: Headers, end: bool = False) -> H3Stream:
        """Client side: start a request stream with `headers`."""
        assert self.h3 is not None, "HTTP/3 is not negotiated yet"
        stream = H3Stream(self, self.quic.get_next_available_stream_id())
        self.streams[stream.stream_id] = stream
        stream.send_headers(headers, end)
        return stream

    # Receiving -------------------------------------------------------------------------------
    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        self.quic.receive_datagram(data, addr, now=self._loop.time())  # type: ignore[arg-type]
        self._process_events()
        # aioquic reports the close only after the draining period (3 PTO); nothing more can flow
        # once either side has closed, so say so now (a refused handshake is then seen at once).
        close = self.quic._close_event
        if close is not None:
            self.transmit()  # our CONNECTION_CLOSE, if we are the side closing, goes before we stop
            self._terminated(close.error_code, close.reason_phrase)
        else:
            self._transmit_soon()
        self._wake()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ProtocolNegotiated) and event.alpn_protocol in H3_ALPN:
            self.h3 = self.new_h3()
        elif isinstance(event, HandshakeCompleted) and not self.handshake.done():
            self.handshake.set_result(None)
        elif isinstance(event, QuicStreamReset) and event.stream_id in self.streams:
            self.streams[event.stream_id]._on_error(
                StreamError(f"stream reset by peer ({event.error_code:#x})")
            )
        elif isinstance(event, StopSendingReceived) and event.stream_id in self.streams:
            self.streams[event.stream_id]._on_stopped(event.error_code)
        elif isinstance(event, ConnectionTerminated):
            self._terminated(event.error_code, event.reason_phrase)
        if self.h3 is not None:
            for h3_event in self.h3.handle_event(event):
                self._h3_event(h3_event)

    def new_h3(self) -> H3Connection:
        """The HTTP/3 layer once ALPN says h3 (the proxy's front brings one that resets malformed streams)."""
        return H3Connection(self.quic)

    def _h3_event(self, event: H3Event) -> None:
        if not isinstance(event, HeadersReceived | DataReceived):
            return
        stream = self.streams.get(event.stream_id)
        if isinstance(event, HeadersReceived):
            if stream is None and self.on_request is not None and not self.quic.configuration.is_client:
                stream = self.streams[event.stream_id] = H3Stream(self, event.stream_id)
                stream._on_headers(event.headers, event.stream_ended)
                self.on_request(stream)
            elif stream is not None:
                stream._on_headers(event.headers, event.stream_ended)
        elif stream is not None:
            stream._on_data(event.data, event.stream_ended)

    def _maybe_forget(self, stream: H3Stream) -> None:
        if stream.local_ended and stream.remote_ended:
            self.streams.pop(stream.stream_id, None)

    def _terminated(self, error_code: int, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_info = (error_code, reason)
        for stream in list(self.streams.values()):
            stream._on_error(StreamError(f"connection closed: {reason or error_code}"))
        if not self.handshake.done():
            self.handshake.set_exception(ConnectionError(reason))
            self.handshake.exception()  # mark retrieved: servers never await it
        self._wake()
        self.on_closed()

    # Closing ---------------------------------------------------------------------------------
    def abandon(self, error_code: int = QuicErrorCode.NO_ERROR, reason: str = "") -> None:
        """Send CONNECTION_CLOSE now and stop all timers, without waiting out the draining period."""
        if not self.closed:
            with contextlib.suppress(Exception):
                self.transmit()  # what is already written (a stream's FIN) goes out before the close
                self.close(error_code=error_code, reason_phrase=reason)
        self._terminated(error_code, reason or "closed locally")
        if self._timer is not None:  # aioquic would otherwise keep waking to send on a dead socket
            self._timer.cancel()
            self._timer = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.abandon()

    def error_received(self, exc: Exception) -> None:
        """Client side: the peer's port is closed (ICMP port unreachable on the connected socket), so no
        process holds the other end: fail the handshake now rather than time out, and end a session whose
        peer died without a CONNECTION_CLOSE (a SIGKILLed pod) instead of waiting out its idle timeout."""
        if isinstance(exc, ConnectionRefusedError):
            self.abandon(reason=f"connection refused ({exc.strerror or exc})")


async def connect(
    addr: tuple[str, int],
    config: QuicConfiguration,
    *,
    timeout: float,
    fate: Fate | None = None,
    check: Callable[[Any], None] | None = None,
) -> H3Endpoint:
    """Open a QUIC connection from 127.0.0.1 to `addr` and wait for the handshake.

    `fate` puts a faulty link under the connection (sim.protocols.lossy): each datagram sent is held back
    or lost as it says. `check(certificate)` judges the server's certificate after aioquic verified it (it
    may raise a tls.Alert). Raises HandshakeFailed with the peer's (or our own TLS stack's) reason. Close
    with `close_client`.
    """
    loop = asyncio.get_running_loop()
    quic = QuicConnection(configuration=config)
    if check is not None:
        check_server_certificate(quic, check)
    # A connected socket, so an ICMP port unreachable (nothing listens) reaches error_received.
    transport, endpoint = await loop.create_datagram_endpoint(lambda: H3Endpoint(quic), remote_addr=addr)
    if fate is not None:  # aioquic sends through the transport it was handed: hand it the link's
        endpoint.connection_made(LossyTransport(transport, fate))
    endpoint.connect(addr)
    try:
        async with asyncio.timeout(timeout):
            await asyncio.shield(endpoint.handshake)
    except (ConnectionError, TimeoutError) as exc:
        code, reason = endpoint.close_info or (None, "handshake timed out")
        close_client(endpoint)
        raise HandshakeFailed(reason, code, peer_certificate(quic)) from exc
    return endpoint


def close_client(endpoint: H3Endpoint) -> None:
    """Close a client endpoint and its socket (CONNECTION_CLOSE is sent before the socket goes)."""
    transport = endpoint._transport
    endpoint.abandon()
    if transport is not None:
        transport.close()


class H3Server:
    """An HTTP/3 listener on 127.0.0.1: each new connection gets an H3Endpoint from `make_endpoint`."""

    def __init__(self, config: ReloadingServerConfig, make_endpoint: Callable[[QuicConnection], H3Endpoint]):
        self.config, self.make_endpoint = config, make_endpoint
        self.endpoints: set[H3Endpoint] = set()
        self._server: QuicServer | None = None
        self._transport: asyncio.DatagramTransport | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self._transport, self._server = await loop.create_datagram_endpoint(
            lambda: QuicServer(configuration=self.config.config, create_protocol=self._create),
            local_addr=(host, port),
        )
        return self._transport.get_extra_info("sockname")[1]

    def _create(self, quic: QuicConnection, stream_handler: Any = None) -> H3Endpoint:
        self.config.refresh()  # before aioquic copies the certificate into this connection
        endpoint = self.make_endpoint(quic)
        self.endpoints.add(endpoint)
        closed = endpoint.on_closed

        def forget() -> None:
            self.endpoints.discard(endpoint)
            closed()

        endpoint.on_closed = forget
        return endpoint

    def close(self) -> None:
        # Not QuicServer.close(): it would close each connection again and re-arm its timers.
        for endpoint in list(self.endpoints):
            endpoint.abandon()
        if self._transport is not None:
            self._transport.close()
