"""Connections as asyncio streams, each step under a deadline: dialed (open_within), closed (close_within), and
a stream protocol that says whether a write would wait (DrainAware). Every party's HTTP, the proxy's pod
connections and the components' dials go through these (tests/test_dial.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from sim.protocols.reads import STREAM_LIMIT

StreamProtocol = Callable[[asyncio.StreamReader], asyncio.StreamReaderProtocol]


class DrainAware(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, saying whether StreamWriter.drain() would wait now (the transport's buffer
    is over its high-water mark): for code that writes in callbacks and leaves any wait to a coroutine."""

    write_paused = False

    def pause_writing(self) -> None:
        super().pause_writing()
        self.write_paused = True

    def resume_writing(self) -> None:
        super().resume_writing()
        self.write_paused = False


async def open_within(
    host: str,
    port: int,
    timeout: float | None,
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    protocol: StreamProtocol | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP (or TLS) connection under a deadline, dialed in the caller's task. asyncio.wait_for dials in a
    task of its own, and on Python 3.11 a caller cancelled just as that task connects gets the connection
    and loses the cancellation (a Ctrl-C or a deadline that never lands); here the cancellation is raised
    at the caller's next suspension, with the connection in hand for its cleanup (tests/test_dial.py).
    `protocol`: the connection's protocol, made from its reader, instead of asyncio's StreamReaderProtocol
    (one that takes some of its bytes itself)."""
    hostname = server_hostname if tls else None
    async with asyncio.timeout(timeout):
        if protocol is None:
            return await asyncio.open_connection(host, port, ssl=tls, server_hostname=hostname)
        return await _open_connection(host, port, tls, hostname, protocol)


async def _open_connection(
    host: str, port: int, tls: ssl.SSLContext | None, server_hostname: str | None, protocol: StreamProtocol
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """asyncio.open_connection, with the protocol `protocol` makes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
    transport, made = await loop.create_connection(
        lambda: protocol(reader), host, port, ssl=tls, server_hostname=server_hostname
    )
    return reader, asyncio.StreamWriter(transport, made, reader, loop)


CLOSE_TIMEOUT = 1.0  # for the peer's close_notify; a local peer answers in well under a millisecond


async def close_within(writer: asyncio.StreamWriter, timeout: float = CLOSE_TIMEOUT) -> None:
    """Close, and wait until the socket is closed; abort it past `timeout`. A TLS close sends close_notify
    and keeps the socket until the peer's arrives (asyncio waits up to 30 s for it): a loop that ends
    first, as asyncio.run does once its coroutine returns, leaves the socket open, reported later as an
    unclosed transport in whatever code the garbage collector runs in (tests/test_dial.py)."""
    writer.close()
    try:
        async with asyncio.timeout(timeout):
            await writer.wait_closed()
    except (TimeoutError, OSError):  # no close_notify in time, or the peer reset: the socket goes anyway
        writer.transport.abort()
    except BaseException:  # cancelled while closing: the socket goes, the cancellation goes on
        writer.transport.abort()
        raise
