"""The aioquic side of sim.protocols.h3: QUIC configurations, the trust bundle, certificate reload, and hooks
into aioquic internals that its public API does not offer.

- Backpressure. aioquic grants a peer more stream credit as soon as data arrives, whether or not the
  application has read it. `_install_credit` replaces that policy, for streams an endpoint serves, by
  "what the application has read plus WINDOW", so a relay that stops reading stops its peer. The new limit
  is announced once it has moved half a window (`raised_credit`), as QUICHE's and quic-go's flow controllers
  announce theirs.
- Acknowledgements. aioquic acknowledges each ack-eliciting packet on its own 1 ms after it arrives, though it
  announces a max_ack_delay of 25 ms. `_install_ack_policy` acknowledges application data as QUICHE (Envoy)
  and quic-go (the worker library, grpc-proxy) do: every second ack-eliciting packet, a packet out of order
  at once, else within 25 ms; sim.protocols.h3's H3Endpoint sends a pending ACK with the data it writes.
- The server name of a ClientHello. aioquic parses it on the server side but does not keep it;
  `peek_server_name` looks at the ClientHello just before aioquic handles it (and may refuse it).
All reach into aioquic internals (pinned to aioquic 1.x; tests/test_aioquic_canary.py guards them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aioquic import tls
from aioquic.buffer import Buffer
from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicFrameType
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from sim.protocols.tls import secret_stamp

WINDOW = 256 * 1024  # stream credit granted beyond what the application has read
# How long an ACK may wait: the max_ack_delay aioquic announces, QUICHE's kDefaultDelayedAckTimeMs and quic-go's
# MaxAckDelay alike (25 ms).
MAX_ACK_DELAY = 0.025
QUIC_IDLE_TIMEOUT = 300.0  # Envoy's QUIC listener default (idle_timeout, 300000 ms); aioquic's own is 60 s
_MAX_STREAM_DATA_FRAME_CAPACITY = 1 + 8 + 8


class AlertUnrecognizedName(tls.Alert):
    """Refuse a ClientHello whose server name we do not serve (RFC 6066 unrecognized_name)."""

    description = tls.AlertDescription.unrecognized_name


class AlertCertificateUnknown(tls.Alert):
    """Refuse a server certificate for a reason of our own (the alert Envoy's validator sends on a SAN
    mismatch)."""

    description = tls.AlertDescription.certificate_unknown


# -- configurations ------------------------------------------------------------------------------
def trust_pem(cafiles: Iterable[Path], extra_pem: str = "") -> bytes:
    """CA certificates as the strict PEM aioquic splits on END lines; b"" trusts nothing.

    aioquic falls back to certifi's roots when given no CA at all, so "trust nothing" must be an
    explicit empty bundle, never None.
    """
    certs: list[x509.Certificate] = []
    for path in cafiles:
        certs += x509.load_pem_x509_certificates(Path(path).read_bytes())
    if extra_pem.strip():
        certs += x509.load_pem_x509_certificates(extra_pem.encode())
    return b"".join(cert.public_bytes(Encoding.PEM) for cert in certs)


def client_configuration(server_name: str, trust: bytes, idle_timeout: float = 60.0) -> QuicConfiguration:
    """`idle_timeout`: aioquic's own default unless the client says (the worker library: 8 s)."""
    config = QuicConfiguration(
        is_client=True,
        alpn_protocols=list(H3_ALPN),
        server_name=server_name,
        max_stream_data=WINDOW,
        idle_timeout=idle_timeout,
    )
    config.load_verify_locations(cadata=trust)
    return config


def server_configuration(secret_dir: Path) -> QuicConfiguration:
    config = QuicConfiguration(
        is_client=False, alpn_protocols=list(H3_ALPN), max_stream_data=WINDOW, idle_timeout=QUIC_IDLE_TIMEOUT
    )
    config.load_cert_chain(secret_dir / "tls.crt", secret_dir / "tls.key")
    return config


class ReloadingServerConfig:
    """A server configuration that follows its Secret, as sim.protocols.tls.ReloadingContext does for TCP.

    aioquic copies the certificate into each connection when it is created, so swapping the fields of
    the one shared configuration gives new connections the new material and leaves old ones alone.
    """

    def __init__(self, secret_dir: Path, on_error: Callable[[str], None] = lambda msg: None):
        self.secret_dir, self.on_error = secret_dir, on_error
        self._stamp = secret_stamp(secret_dir)
        self.config = server_configuration(secret_dir)  # broken material at start-up is a hard error
        self.generation = 1

    def refresh(self) -> QuicConfiguration:
        try:
            stamp = secret_stamp(self.secret_dir)
            if stamp != self._stamp:
                self._stamp = stamp
                fresh = server_configuration(self.secret_dir)
                self.config.certificate = fresh.certificate
                self.config.certificate_chain = fresh.certificate_chain
                self.config.private_key = fresh.private_key
                self.generation += 1
        except (OSError, ValueError) as exc:
            self.on_error(f"cannot load {self.secret_dir}: {exc}; keeping the previous certificate")
        return self.config


# -- aioquic hooks -------------------------------------------------------------------------------
def raised_credit(granted: int, wanted: int) -> int:
    """The stream credit to announce: `wanted` (what the application has read plus WINDOW) once it is half a
    window past the credit `granted`, else `granted` stands: the peer still has at least half a window to
    send on. QUICHE sends its window update at that point (QuicFlowController, threshold half the window);
    announcing each byte read put a MAX_STREAM_DATA packet, and the peer's ACK of it, behind nearly every
    packet a relayed stream received."""
    return wanted if wanted - granted >= WINDOW // 2 else granted


def ack_deadline(now: float, pending: float | None, in_order: bool) -> float:
    """When to acknowledge application data, an ack-eliciting packet having arrived at `now`: at once if it is
    the second since the last ACK (`pending`: the deadline the first one set) or arrived out of order (a packet
    is missing, so its sender should hear soon), else MAX_ACK_DELAY later, unless data going back carries the
    ACK before (QUICHE's QuicReceivedPacketManager, quic-go's receivedPacketTracker: two packets, 25 ms)."""
    if pending is not None or not in_order:
        return now
    return now + MAX_ACK_DELAY


def _install_ack_policy(quic: QuicConnection) -> None:
    """Acknowledge 1-RTT packets when `ack_deadline` says (aioquic: 1 ms after each). Initial and Handshake
    packets keep aioquic's policy: they are acknowledged at once, as RFC 9000 section 13.2.1 asks."""
    payload_received, receive_datagram = quic._payload_received, quic.receive_datagram
    eliciting = [False]  # an ack-eliciting 1-RTT packet in the datagram being received

    def note_eliciting(context: Any, plain: bytes, crypto_frame_required: bool = False) -> tuple[bool, bool]:
        result = payload_received(context, plain, crypto_frame_required=crypto_frame_required)
        eliciting[0] = eliciting[0] or (result[0] and context.epoch == tls.Epoch.ONE_RTT)
        return result

    def receive(data: bytes, addr: Any, now: float) -> None:
        space = quic._spaces.get(tls.Epoch.ONE_RTT)  # made with the first packet a server receives
        pending, largest = (space.ack_at, space.largest_received_packet) if space else (None, -1)
        eliciting[0] = False
        receive_datagram(data, addr, now)
        space = quic._spaces.get(tls.Epoch.ONE_RTT)
        if eliciting[0] and space is not None and space.ack_at is not None:
            in_order = largest < 0 or space.largest_received_packet == largest + 1
            space.ack_at = ack_deadline(now, pending, in_order)

    quic._payload_received = note_eliciting  # type: ignore[method-assign]
    quic.receive_datagram = receive  # type: ignore[method-assign]


def bundle_ack(quic: QuicConnection, now: float) -> None:
    """Let the next packet carry the pending ACK of application data, if one waits (the packet that writes
    data: QUICHE bundles a pending ACK with it, quic-go with any packet it sends)."""
    space = quic._spaces.get(tls.Epoch.ONE_RTT)
    if space is not None and space.ack_at is not None and space.ack_at > now:
        space.ack_at = now


def _install_credit(quic: QuicConnection, credit: Callable[[int], int | None]) -> None:
    """Grant stream credit from `credit(stream_id)` (None: aioquic's own policy for that stream)."""
    default = quic._write_stream_limits

    def write_stream_limits(builder: Any, space: Any, stream: Any) -> None:
        limit = credit(stream.stream_id)
        if limit is None or not stream.max_stream_data_local:
            default(builder=builder, space=space, stream=stream)
            return
        stream.max_stream_data_local = raised_credit(stream.max_stream_data_local, limit)
        if stream.max_stream_data_local_sent != stream.max_stream_data_local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=_MAX_STREAM_DATA_FRAME_CAPACITY,
                handler=quic._on_max_stream_data_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(stream.stream_id)
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local

    quic._write_stream_limits = write_stream_limits  # type: ignore[method-assign]


def check_server_certificate(quic: QuicConnection, check: Callable[[x509.Certificate], None]) -> None:
    """Call `check(certificate)` once aioquic has verified the server's certificate, inside the handshake.

    `check` may raise a tls.Alert (e.g. AlertCertificateUnknown) to refuse the certificate; aioquic then
    closes the connection with CRYPTO_ERROR + that alert, as a TLS stack with its own validator would."""
    initialize = quic._initialize

    def initialize_and_hook(peer_cid: bytes) -> None:
        initialize(peer_cid)
        verify = quic.tls._client_handle_certificate_verify

        def verify_and_check(input_buf: Buffer) -> None:
            verify(input_buf)
            certificate = quic.tls._peer_certificate
            if certificate is not None:  # set by the verification that just passed
                check(certificate)

        quic.tls._client_handle_certificate_verify = verify_and_check  # type: ignore[method-assign]

    quic._initialize = initialize_and_hook  # type: ignore[method-assign]


def peer_certificate(quic: QuicConnection) -> x509.Certificate | None:
    """The certificate the server showed, once the handshake got that far (None before, or on a server)."""
    context = getattr(quic, "tls", None)
    return getattr(context, "_peer_certificate", None)


def peek_server_name(quic: QuicConnection, on_hello: Callable[[str | None], None]) -> None:
    """Call `on_hello(server_name)` with each ClientHello before aioquic handles it.

    `on_hello` may raise a tls.Alert (e.g. AlertUnrecognizedName) to refuse the handshake; aioquic
    then closes the connection with CRYPTO_ERROR + that alert, as a TLS stack refusing the SNI would.
    """
    initialize = quic._initialize

    def initialize_and_hook(peer_cid: bytes) -> None:
        initialize(peer_cid)
        handle_hello = quic.tls._server_handle_hello

        def peek(input_buf: Buffer, initial_buf: Buffer, handshake_buf: Buffer) -> None:
            start = input_buf.tell()
            hello = tls.pull_client_hello(input_buf)
            input_buf.seek(start)
            on_hello(hello.server_name)
            handle_hello(input_buf, initial_buf, handshake_buf)

        quic.tls._server_handle_hello = peek  # type: ignore[method-assign]

    quic._initialize = initialize_and_hook  # type: ignore[method-assign]
