"""The HTTP/3 front's codec: aioquic's H3Connection, made to answer a worker as Envoy's QUICHE codec answers.

aioquic already meets RFC 9114 on nearly every malformed frame sequence a worker-side attacker can send
(tests/test_hostile_h3_frames.py tries each, on its own connection), so this changes only where Envoy differs:

- A malformed request (RFC 9114 section 4.1.2) is a stream error: the stream is reset with H3_MESSAGE_ERROR and
  the connection lives on; aioquic closes the whole connection. It is caught where a header block is handled,
  so a block that first waited on the QPACK encoder stream is judged as one that did not.
- A HEADERS frame whose length alone is over the header limit is reset (H3_EXCESSIVE_LOAD) before it is buffered.
- CANCEL_PUSH and PUSH_PROMISE from a client close the connection with H3_FRAME_ERROR on any stream, before
  anything else is checked, as QUICHE's HttpDecoder does (it has no server push). aioquic ignores a CANCEL_PUSH on
  the control stream (RFC 9114 section 7.2.3 makes one for a push never promised H3_ID_ERROR) and calls the
  others H3_FRAME_UNEXPECTED.
- SETTINGS as Envoy sends them: QUICHE's QPACK defaults (Envoy leaves them: a 64 KiB table, 100 blocked
  streams), SETTINGS_MAX_FIELD_SECTION_SIZE from max_request_headers_kb, and no ENABLE_CONNECT_PROTOCOL
  (extended CONNECT is off, so a :protocol is a malformed request: sim.proxy.h3_policy).

Server side only: the front is the one HTTP/3 server ncpsim plays as Envoy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pylsqpack
from aioquic.h3.connection import FrameError, FrameType, H3Connection, MessageError, Setting
from aioquic.quic.connection import QuicConnection

from sim.proxy.h3_policy import H3_EXCESSIVE_LOAD, H3_MESSAGE_ERROR, Reset
from sim.proxy.policy import MAX_HEADERS_BYTES

QPACK_TABLE_CAPACITY = 64 * 1024  # QUICHE's kDefaultQpackMaxDynamicTableCapacity
QPACK_BLOCKED_STREAMS = 100  # QUICHE's kDefaultMaximumBlockedStreams
NO_PUSH: dict[int, str] = {FrameType.CANCEL_PUSH: "CANCEL_PUSH", FrameType.PUSH_PROMISE: "PUSH_PROMISE"}


class StreamScopedH3(H3Connection):
    """The front's HTTP/3 layer: `on_reset(stream_id, reset)` hears of each stream it resets."""

    def __init__(self, quic: QuicConnection, on_reset: Callable[[int, Reset], None]):
        super().__init__(quic)
        self.on_reset = on_reset
        self.reset_streams: set[int] = set()

    # What the front announces ---------------------------------------------------------------------
    def _init_connection(self) -> None:
        # Called at the end of H3Connection.__init__, before the SETTINGS go out: the decoder must allow what
        # they announce.
        self._max_table_capacity, self._blocked_streams = QPACK_TABLE_CAPACITY, QPACK_BLOCKED_STREAMS
        self._decoder = pylsqpack.Decoder(self._max_table_capacity, self._blocked_streams)
        super()._init_connection()

    def _get_local_settings(self) -> dict[int, int]:
        return {
            Setting.QPACK_MAX_TABLE_CAPACITY: self._max_table_capacity,
            Setting.MAX_FIELD_SECTION_SIZE: MAX_HEADERS_BYTES,
            Setting.QPACK_BLOCKED_STREAMS: self._blocked_streams,
        }

    # Frames a client never sends -------------------------------------------------------------------
    def _check_control_frame_type(self, frame_type: int) -> None:
        _refuse_push(frame_type)
        super()._check_control_frame_type(frame_type)

    def _check_request_or_push_frame_type(self, frame_type: int, stream: Any) -> None:
        _refuse_push(frame_type)
        super()._check_request_or_push_frame_type(frame_type, stream)

    # Malformed requests: a stream error ----------------------------------------------------------
    def _receive_request_or_push_data(self, stream: Any, data: bytes, stream_ended: bool) -> list[Any]:
        if stream.stream_id in self.reset_streams:
            return []
        try:
            events = super()._receive_request_or_push_data(stream, data, stream_ended)
        except MessageError as exc:  # the end of the stream (content-length) is judged outside any frame
            self._reset(stream, Reset(H3_MESSAGE_ERROR, "DPE", str(exc)))
            return []
        if stream.stream_id in self.reset_streams:  # a frame of this data was malformed: none of it goes on
            return []
        # An encoded field line is never longer than its QPACK size (name + value + 32), so a frame this
        # long holds more than the limit however it is encoded.
        if stream.frame_type == FrameType.HEADERS and (stream.frame_size or 0) > MAX_HEADERS_BYTES + 1024:
            self._reset(
                stream, Reset(H3_EXCESSIVE_LOAD, "DPE", f"headers frame of {stream.frame_size} bytes")
            )
            return []
        return events

    def _handle_request_or_push_frame(
        self, frame_type: int, frame_data: bytes | None, stream: Any, stream_ended: bool
    ) -> list[Any]:
        """Every frame of a request stream, including a header block the encoder stream just unblocked."""
        if stream.stream_id in self.reset_streams:
            return []
        try:
            return super()._handle_request_or_push_frame(frame_type, frame_data, stream, stream_ended)
        except MessageError as exc:
            self._reset(stream, Reset(H3_MESSAGE_ERROR, "DPE", str(exc)))
            return []

    def _reset(self, stream: Any, reset: Reset) -> None:
        self.reset_streams.add(stream.stream_id)
        stream.buffer = b""
        for stop in (self._quic.reset_stream, self._quic.stop_stream):
            with contextlib.suppress(Exception):  # a side that already finished cannot be stopped again
                stop(stream.stream_id, reset.error_code)
        self.on_reset(stream.stream_id, reset)


def _refuse_push(frame_type: int) -> None:
    if frame_type in NO_PUSH:
        raise FrameError(f"{NO_PUSH[frame_type]} frame received.")  # QUICHE's words
