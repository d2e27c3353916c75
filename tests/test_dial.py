"""Dialing and closing under a deadline (sim.protocols.dial).

open_within, cancelled at the moment it connects: the caller is cancelled, with the connection in hand,
and its cleanup closes it. asyncio.wait_for, which every dialer used before, dials in a task of its own;
on Python 3.11 the dial's result then wins over the cancellation, which is lost (a Ctrl-C or a step's
deadline that never lands).

close_within, as the loop ends: a TLS close waits for the peer's close_notify, and a plain close() whose
loop ends first leaves the socket open (the "unclosed transport" warnings that surfaced in random tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import ssl
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterator
from unittest import mock

import trustme

from sim.protocols.dial import close_within, open_within

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


# Closing -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def quiet_tls_peer(ca: trustme.CA) -> Iterator[int]:
    """A TLS server that answers one message, then neither reads nor writes until the test is done (a peer
    in another process, busy): the client's close_notify gets no answer while the client's loop runs."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("peer.test").configure_cert(context)
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        raw, _ = listener.accept()
        with context.wrap_socket(raw, server_side=True) as conn:
            conn.recv(16)
            conn.sendall(b"ok")
            done.wait(10)

    peer = threading.Thread(target=serve, daemon=True)
    peer.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        peer.join(10)
        listener.close()


def unclosed_after_the_loop(close: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> list[str]:
    """The ResourceWarnings once a loop that closed its TLS connection with `close` has ended."""
    ca = trustme.CA()
    client = ssl.create_default_context()
    ca.configure_trust(client)

    async def session(port: int) -> None:
        reader, writer = await open_within("127.0.0.1", port, 5.0, client, "peer.test")
        writer.write(b"hi")
        assert await reader.readexactly(2) == b"ok"
        await close(writer)

    with warnings.catch_warnings(record=True) as caught, quiet_tls_peer(ca) as port:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(session(port))
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


async def plain_close(writer: asyncio.StreamWriter) -> None:
    writer.close()


def test_close_within_leaves_no_socket_when_the_loop_ends() -> None:
    assert unclosed_after_the_loop(lambda writer: close_within(writer, timeout=0.2)) == []


def test_a_plain_close_leaves_the_socket_open_the_negative_control() -> None:
    assert any("unclosed" in message for message in unclosed_after_the_loop(plain_close))
