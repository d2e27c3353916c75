"""One HTTP/3 request stream as a byte pipe (sim.protocols.h3's H3Stream): headers, then data both ways,
read in order as the application asks, written with backpressure (``drain`` waits while too much is
unacknowledged). The connection it rides on is sim.protocols.h3's H3Endpoint, seen here only through what
a stream asks of it (``Endpoint``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Protocol

from aioquic.h3.connection import H3Connection
from aioquic.quic.connection import QuicConnection

Headers = list[tuple[bytes, bytes]]
HIGH_WATER = 256 * 1024  # unacknowledged bytes a writer may leave queued before drain() waits
H3_REQUEST_CANCELLED = 0x10C
H3_CONNECT_ERROR = 0x10F


class StreamError(ConnectionError):
    """The stream was reset by the peer, or its connection closed before the stream finished."""


class Endpoint(Protocol):
    """What a stream asks of its connection (sim.protocols.h3.H3Endpoint)."""

    quic: QuicConnection
    h3: H3Connection | None
    streams: dict[int, H3Stream]
    closed: bool

    def _maybe_forget(self, stream: H3Stream) -> None: ...
    def _consumed(self, stream_id: int) -> None: ...
    def unacked(self, stream_id: int) -> int: ...
    async def progress(self) -> None: ...
    def flush_soon(self) -> None: ...


class H3Stream:
    """One HTTP/3 request stream as a byte pipe: headers, then data both ways, with backpressure."""

    def __init__(self, endpoint: Endpoint, stream_id: int):
        self.endpoint, self.stream_id = endpoint, stream_id
        self.headers: asyncio.Future[Headers] = asyncio.get_running_loop().create_future()
        self.trailers: Headers = []
        self.bytes_received = 0  # DATA payload in each direction (what an access log counts)
        self.bytes_sent = 0
        self.pending = 0  # received payload the application has not read yet
        self.local_ended = False
        self.remote_ended = False
        self._stopped = ""  # why the peer stopped our side, if it did
        self._chunks: deque[bytes] = deque()
        self._error: StreamError | None = None
        self._readable = asyncio.Event()

    # Inbound, from the endpoint --------------------------------------------------------------
    def _on_headers(self, headers: Headers, ended: bool) -> None:
        if not self.headers.done():
            self.headers.set_result(headers)
        else:
            self.trailers = headers
        if ended:
            self._on_end()

    def _on_data(self, data: bytes, ended: bool) -> None:
        if data:
            self._chunks.append(data)
            self.pending += len(data)
            self.bytes_received += len(data)
        if ended:
            self._on_end()
        self._readable.set()

    def _on_end(self) -> None:
        self.remote_ended = True
        self._readable.set()
        self.endpoint._maybe_forget(self)

    def _on_stopped(self, error_code: int) -> None:
        """The peer asked us to stop sending (STOP_SENDING): QUIC has reset our side of the stream already, so
        it is ended here too; a write raises, and end() has nothing left to do (aioquic's HTTP/3 layer has
        dropped the stream, and a DATA frame sent on it would raise FrameUnexpected)."""
        if not self.local_ended:
            self.local_ended = True
            self._stopped = f"stream {self.stream_id} stopped by peer ({error_code:#x})"
            self.endpoint._maybe_forget(self)
        self._readable.set()

    def _on_error(self, error: StreamError) -> None:
        if self._error is None and not (self.remote_ended and self.local_ended):
            self._error = error
        if not self.headers.done():
            self.headers.set_exception(error)
            self.headers.exception()  # mark retrieved: not every caller awaits the headers
        self._readable.set()

    # Application side ------------------------------------------------------------------------
    @property
    def error(self) -> StreamError | None:
        """Why the stream failed (reset by either side, or its connection closed), if it did."""
        return self._error

    @property
    def status(self) -> int:
        """The response status (client streams, once the headers have arrived)."""
        return int(dict(self.headers.result()).get(b":status", b"0"))

    async def read(self) -> bytes:
        """The next chunk of DATA payload; b"" once the peer has ended the stream."""
        while not self._chunks:
            if self.remote_ended:  # a clean end stays an end, even if the connection closes after it
                return b""
            if self._error is not None:
                raise self._error
            self._readable.clear()
            await self._readable.wait()
        chunk = self._chunks.popleft()
        self.pending -= len(chunk)
        self.endpoint._consumed(self.stream_id)
        return chunk

    def send_headers(self, headers: Headers, end: bool = False) -> None:
        self._check_writable()
        assert self.endpoint.h3 is not None, "HTTP/3 is not negotiated yet"  # a stream means it is
        self.endpoint.h3.send_headers(self.stream_id, headers, end_stream=end)
        self._sent(end)

    def write(self, data: bytes, end: bool = False) -> None:
        self._check_writable()
        assert self.endpoint.h3 is not None, "HTTP/3 is not negotiated yet"
        self.endpoint.h3.send_data(self.stream_id, data, end_stream=end)
        self.bytes_sent += len(data)
        self._sent(end)

    def end(self) -> None:
        if not self.local_ended and self._error is None:
            self.write(b"", end=True)

    def reset(self, error_code: int = H3_REQUEST_CANCELLED) -> None:
        """Abandon the stream both ways (RESET_STREAM and STOP_SENDING)."""
        quic = self.endpoint.quic
        self._on_error(StreamError(f"stream {self.stream_id} reset locally"))
        with contextlib.suppress(Exception):  # a stream that already finished cannot be reset
            if not self.local_ended:
                quic.reset_stream(self.stream_id, error_code)
            if not self.remote_ended:
                quic.stop_stream(self.stream_id, error_code)
        self.local_ended = True
        self.endpoint.streams.pop(self.stream_id, None)  # nothing more will be read or written here
        self.endpoint.flush_soon()

    async def drain(self) -> None:
        """Wait until the peer has acknowledged enough of what was written (or raise if it went away)."""
        while self.endpoint.unacked(self.stream_id) > HIGH_WATER:
            if self._error is not None:
                raise self._error
            if self.endpoint.closed:
                raise StreamError("connection closed")
            await self.endpoint.progress()

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self.local_ended:
            raise StreamError(self._stopped or f"stream {self.stream_id} already ended")

    def _sent(self, end: bool) -> None:
        if end:
            self.local_ended = True
            self.endpoint._maybe_forget(self)
        self.endpoint.flush_soon()
