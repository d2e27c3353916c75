"""Reading one connection: each read under an idle deadline (TimedReads), and the bytes read kept until they
start with a whole message head (HeadReader), for a relay that forwards plain heads as they came."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Protocol

import h11

from sim.protocols.h1plain import head_end

READ_SIZE = 65536
STREAM_LIMIT = 2**16  # asyncio's own StreamReader limit, as start_server and open_connection use
# Envoy's default max_request_headers_kb is 60: h11 must be able to buffer that much before we judge.
MAX_HEAD = 64 * 1024


class Reader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class TimedReads:
    """Reads from one connection, each under an idle deadline (TimeoutError past it), as asyncio.timeout
    would give, at a fraction of its cost: one timer per connection, moved on only when it fires.

    A proxy reads each kept-alive connection once or twice a request; asyncio.timeout scheduled and cancelled
    a timer handle around every read. Here a read notes when it started and its limit; the timer, when it
    fires, either finds the current read's deadline still ahead (and sleeps until then) or cancels the reading
    task, which the read turns into TimeoutError (unless the task was also cancelled from outside)."""

    def __init__(self, reader: Reader):
        self.reader = reader
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None  # set only while a read waits under a limit
        self._deadline = 0.0
        self._expired = False

    async def read(self, timeout: float | None, size: int = READ_SIZE) -> bytes:
        if timeout is None:
            return await self.reader.read(size)
        loop = self._loop or asyncio.get_running_loop()
        self._loop, self._task = loop, asyncio.current_task()
        assert self._task is not None
        self._deadline = loop.time() + timeout
        if self._timer is None or self._timer.when() > self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(self._deadline, _fire, weakref.ref(self))
        cancelling = self._task.cancelling()
        try:
            return await self.reader.read(size)
        except asyncio.CancelledError:
            if self._expired and self._task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise
        finally:
            self._task, self._expired = None, False

    def _fire(self) -> None:
        self._timer = None
        if self._task is None:  # no read waiting: the next one arms the timer again
            return
        assert self._loop is not None
        if self._loop.time() < self._deadline:
            self._timer = self._loop.call_at(self._deadline, _fire, weakref.ref(self))
        elif not self._expired:
            self._expired = True
            self._task.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _fire(reads: weakref.ref[TimedReads]) -> None:
    """The timer holds its connection's reads weakly: a connection dropped unclosed is not kept for up to
    its idle timeout (an hour for a worker's) by a timer that has nothing left to do."""
    if (alive := reads()) is not None:
        alive._fire()


def buffered(reader: asyncio.StreamReader) -> int:
    """The bytes `reader` holds unread. StreamReader has no public way to ask without reading: a connection
    that leaves its stream for protocol callbacks must know that no byte stays behind in it."""
    return len(reader._buffer)  # type: ignore[attr-defined]


class HeadReader:
    """A connection's bytes read and not yet consumed, read on until they start with a whole message head,
    for a relay that takes plain messages (sim.protocols.h1plain) as they came and hands h11 the rest."""

    def __init__(
        self, reader: asyncio.StreamReader, reads: TimedReads | None = None, max_head: int = MAX_HEAD
    ):
        self.reader = reader
        self.reads = reads or TimedReads(reader)  # `reads`: the connection's own, when it has them already
        self.max_head = max_head
        self.pending = bytearray()
        self.eof = False

    async def head(self, first: bytes, idle: float | None, begun: float | None) -> int:
        """The length of the whole head `pending` starts with; -1 when h11 must judge the bytes as they are
        (the peer closed, sent a first byte not in `first`, or more than max_head without a blank line):
        everything h11 would refuse early, it then refuses as early. Reads wait up to `idle` while nothing
        is pending, `begun` once a head has begun (TimeoutError past either)."""
        searched = 0
        while True:
            if self.pending:
                if self.pending[0] not in first:
                    return -1
                if (end := head_end(self.pending, searched)) >= 0:
                    return end
                if len(self.pending) > self.max_head:
                    return -1
                searched = len(self.pending)
            if self.eof:
                return -1
            data = await self.reads.read(begun if self.pending else idle)
            self.eof = not data
            self.pending += data

    async def read_to(self, size: int, timeout: float | None) -> bool:
        """Read on until `size` bytes are pending; False if the stream ended first."""
        while len(self.pending) < size and not self.eof:
            data = await self.reads.read(timeout)
            self.eof = not data
            self.pending += data
        return len(self.pending) >= size

    def take(self, size: int) -> bytes:
        data = bytes(self.pending[:size])
        del self.pending[:size]
        return data

    def hand_over(self, conn: h11.Connection) -> None:
        """Everything pending (and the end of the stream, if it came) to `conn`, which reads on from there."""
        if self.pending:  # (h11 takes b"" for the end of the stream)
            conn.receive_data(self.take(len(self.pending)))
        if self.eof:
            conn.receive_data(b"")
