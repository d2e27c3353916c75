"""Named tasks a component owns: spawned, tracked, and cancelled together on close; a task that fails is
logged with its name (an exception nobody awaited would otherwise vanish with the task). And one task
cancelled and waited for without losing a cancellation of the waiter (`cancelled`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Tasks:
    """Named tasks owned by a component: spawned, tracked, and cancelled together on close."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a bug: say so, with the task's name
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def cancelled(task: asyncio.Task[Any], *expected: type[BaseException]) -> None:
    """Cancel `task` and wait until it has ended: its cancellation, or an error of an `expected` kind, ends
    it quietly; any other error is raised here.

    `task.cancel(); with suppress(CancelledError): await task` also swallows a cancellation of the waiter
    that lands while the task winds down, and the waiter runs on: a replay's status poll given up for the
    worker's answer could so lose the cancellation a Ctrl-C sends (run_cancelled_by_signal's, which ends the
    replay). asyncio.wait raises only the waiter's own cancellation."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and (error := task.exception()) is not None and not isinstance(error, expected):
        raise error
