"""Closing a nats-py client while its closer is cancelled (sim.nats.client.close_client), on nats-server.

nats-py's own close is the negative control: cancelled at its first suspension, it leaves the client marked
closed with its socket open, and a second close does nothing. That was the "unclosed transport" (and "loop
is closed") ResourceWarning seen under load in tests/test_h3_pool.py: sim.worker.nats_links.cancel_all
cancels a link's task again while the task's ``finally`` closes the link's client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from unittest import mock

import pytest
from nats.aio.client import Client
from nats_support import Keys, connect, keys_fixture, run, start_server_fixture  # noqa: F401 - fixtures

from sim.nats.client import close_client
from sim.nats.server import NatsServer

Close = Callable[[Client], Awaitable[None]]


async def close_cancelled(url: str, seed: str, closer: Close, cancels: int) -> tuple[bool, bool, bool]:
    """A connected client closed by `closer` in a task cancelled at each of its first `cancels` suspensions
    (cancel_all cancels a task again until it ends). Whether the task ended cancelled, the client's socket is
    closed, and nats-py's close ran to its end (its closed callback)."""
    made: list[asyncio.StreamWriter] = []
    dial = asyncio.open_connection

    async def recording(*args: object, **kwargs: object) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await dial(*args, **kwargs)
        made.append(writer)
        return reader, writer

    ended = asyncio.get_running_loop().create_future()

    async def on_closed() -> None:
        ended.set_result(None)

    with mock.patch("asyncio.open_connection", recording):
        nc, _ = await connect(url, nkeys_seed_str=seed, closed_cb=on_closed)
    try:
        [writer] = made
        closing = asyncio.create_task(closer(nc))
        for _ in range(cancels):
            await asyncio.sleep(0)  # the close runs on to its next suspension
            closing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closing
        return closing.cancelled(), writer.transport.is_closing(), ended.done()
    finally:
        for writer in made:
            writer.close()  # whatever the closer under test left open


@pytest.mark.parametrize("cancels", [1, 2, 5])
def test_a_close_cancelled_midway_still_closes_the_socket(
    start_server: Callable[..., NatsServer], keys: Keys, cancels: int
) -> None:
    server = start_server(worker_nkey=keys.pub(keys.worker))
    got = run(close_cancelled(server.endpoints.url, keys.seed(keys.worker), close_client, cancels))
    assert got == (True, True, True)  # cancelled, yet closed to the end


def test_nats_pys_own_close_cancelled_midway_leaves_the_socket_open(
    start_server: Callable[..., NatsServer], keys: Keys
) -> None:
    """The negative control, and a canary: should nats-py close its socket before it yields, this fails and
    sim.nats.client.close_client may go."""
    server = start_server(worker_nkey=keys.pub(keys.worker))
    got = run(close_cancelled(server.endpoints.url, keys.seed(keys.worker), Client.close, 1))
    assert got == (True, False, False)
