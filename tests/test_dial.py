"""A dial under a deadline (sim.protocols.http1.open_within), cancelled at the moment it connects: the caller
is cancelled, with the connection in hand, and its cleanup closes it. asyncio.wait_for, which every dialer
used before, dials in a task of its own; on Python 3.11 the dial's result then wins over the cancellation,
which is lost (a Ctrl-C or a step's deadline that never lands).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from unittest import mock

from sim.protocols.http1 import open_within

Dial = Callable[[str, int, float], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def wait_for_dial(
    host: str, port: int, timeout: float
) -> Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """The dial as it was: the negative control."""
    return asyncio.wait_for(asyncio.open_connection(host, port), timeout)


async def cancelled_as_it_connects(dial: Dial) -> bool:
    """Whether a caller cancelled as its dial connects is cancelled, and its connection closed by its cleanup."""

    async def serve(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    made: list[asyncio.StreamWriter] = []
    connect = asyncio.open_connection

    async def connect_then_cancel(
        *args: object, **kwargs: object
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await connect(*args, **kwargs)
        made.append(writer)
        caller.cancel()  # the moment under test: the caller is cancelled as the dial completes
        return reader, writer

    async def use() -> None:
        _reader, writer = await dial("127.0.0.1", port, 5.0)
        try:
            await asyncio.sleep(0)  # the first suspension: a pending cancellation lands here
        finally:
            writer.close()

    try:
        with mock.patch("asyncio.open_connection", connect_then_cancel):
            caller = asyncio.create_task(use())
            with contextlib.suppress(asyncio.CancelledError):
                await caller
        assert made, "the dial never connected: this test tested nothing"
        return caller.cancelled() and made[0].is_closing()
    finally:
        for writer in made:
            writer.close()  # whatever the dial under test did with it
        server.close()
        await server.wait_closed()


def test_a_connection_made_as_its_caller_is_cancelled_reaches_the_caller() -> None:
    assert asyncio.run(cancelled_as_it_connects(open_within))


def test_wait_for_loses_the_cancellation_the_negative_control() -> None:
    assert not asyncio.run(cancelled_as_it_connects(wait_for_dial))
