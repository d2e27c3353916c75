"""Reads under an idle deadline, one timer per connection (sim.protocols.reads.TimedReads).

What asyncio.timeout gave each read, kept: silence past the limit is TimeoutError, a read answered in time is
not, a cancellation from outside stays a cancellation, and the connection can be read again after a timeout.
What it no longer costs: a timer scheduled and cancelled around every read (counted here on the loop).
In-process, on a StreamReader fed by the test; the limits are short, and only the timeout cases wait them out.
"""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest

from sim.protocols.reads import TimedReads

LIMIT = 0.05  # seconds: the timeout under test
SOON = LIMIT / 5  # well inside the limit


async def fed(reader: asyncio.StreamReader, data: bytes, after: float) -> None:
    await asyncio.sleep(after)
    reader.feed_data(data)


def test_silence_past_the_limit_is_a_timeout_and_the_connection_reads_on() -> None:
    async def main() -> bytes:
        reader = asyncio.StreamReader()
        reads = TimedReads(reader)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await reads.read(LIMIT)
        assert loop.time() - started >= LIMIT
        reader.feed_data(b"late")  # what came after the timeout is still there to read
        return await reads.read(LIMIT)

    assert asyncio.run(main()) == b"late"


def test_a_read_answered_in_time_is_not_a_timeout_however_long_the_connection_lives() -> None:
    """Each read has its own limit: many reads, each inside it, add up to far more than the limit."""

    async def main() -> int:
        reader = asyncio.StreamReader()
        reads = TimedReads(reader)
        got = 0
        for _ in range(int(3 * LIMIT / SOON)):
            feeder = asyncio.create_task(fed(reader, b"x", SOON))
            got += len(await reads.read(LIMIT))
            await feeder
        return got

    assert asyncio.run(main()) == int(3 * LIMIT / SOON)


def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    async def main() -> None:
        reads = TimedReads(asyncio.StreamReader())
        reading = asyncio.create_task(reads.read(LIMIT))
        await asyncio.sleep(0)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading

    asyncio.run(main())


def test_one_timer_serves_a_connections_reads() -> None:
    """The cost that was removed: asyncio.timeout armed a timer for every read (the negative control)."""

    async def count(timed: bool) -> int:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        reads = TimedReads(reader)
        with mock.patch.object(loop, "call_at", wraps=loop.call_at) as call_at:
            for _ in range(50):
                reader.feed_data(b"x")
                if timed:
                    await reads.read(10.0)
                else:
                    async with asyncio.timeout(10.0):
                        await reader.read(1)
        return call_at.call_count

    assert asyncio.run(count(timed=True)) == 1
    assert asyncio.run(count(timed=False)) == 50


def test_no_limit_is_a_plain_read() -> None:
    async def main() -> bytes:
        reader = asyncio.StreamReader()
        asyncio.get_running_loop().call_later(SOON, reader.feed_data, b"data")
        return await TimedReads(reader).read(None)

    assert asyncio.run(main()) == b"data"
