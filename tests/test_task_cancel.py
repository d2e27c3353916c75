"""One task cancelled and waited for (sim.protocols.tasks.cancelled) without losing a cancellation of the waiter.

The pattern it replaces, `task.cancel(); with suppress(CancelledError): await task`, is the negative control:
a waiter cancelled while the task winds down runs on (a replay's status poll given up for the worker's
answer, in sim/client/http_client.py, could so swallow the cancellation a Ctrl-C sends; the bench's lanes and
the gRPC calls' watchers had the same pattern).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from sim.protocols.tasks import cancelled

Stop = Callable[[asyncio.Task[None]], Awaitable[None]]


async def suppressed(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def slow_to_end(ended: asyncio.Event) -> None:
    """A task that takes a moment to wind down once cancelled (a TLS close, a socket drained)."""
    try:
        await asyncio.sleep(60)
    finally:
        await ended.wait()


async def waiter_cancelled_meanwhile(stop: Stop) -> str:
    ended = asyncio.Event()
    child = asyncio.create_task(slow_to_end(ended))
    await asyncio.sleep(0)  # the child is in its sleep

    async def waiter() -> str:
        await stop(child)
        return "ran on"

    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the waiter waits for the child to end
    waiting.cancel()  # Ctrl-C, as asyncio.run's runner delivers it
    await asyncio.sleep(0)
    ended.set()
    try:
        return await waiting
    except asyncio.CancelledError:
        return "cancelled"


@pytest.mark.parametrize(("stop", "expected"), [(cancelled, "cancelled"), (suppressed, "ran on")])
def test_a_waiter_cancelled_while_the_task_ends_is_cancelled(stop: Stop, expected: str) -> None:
    assert asyncio.run(waiter_cancelled_meanwhile(stop)) == expected


def test_the_tasks_own_end_is_quiet_and_an_unexpected_error_is_raised() -> None:
    async def failing(error: BaseException) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            raise error

    async def main() -> None:
        task = asyncio.create_task(asyncio.sleep(60))
        await asyncio.sleep(0)
        await cancelled(task)
        assert task.cancelled()
        task = asyncio.create_task(failing(ConnectionResetError("gone")))
        await asyncio.sleep(0)
        await cancelled(task, ConnectionError)  # expected: quiet
        task = asyncio.create_task(failing(ValueError("a bug")))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="a bug"):
            await cancelled(task, ConnectionError)

    asyncio.run(main())
