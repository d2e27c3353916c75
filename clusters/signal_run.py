"""asyncio.run for a command that owns components, so that Ctrl-C or SIGTERM cancels its program instead of
landing inside the event loop (clusters.interrupts guards the code outside a loop)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from clusters.interrupts import InterruptGuard

T = TypeVar("T")


def run_cancelled_by_signal(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) for a command that owns components: the first Ctrl-C or SIGTERM cancels `main`,
    and KeyboardInterrupt is raised once the loop has closed, for the caller's cleanup.

    Raised where the signal lands, as the guard does outside a loop, KeyboardInterrupt can fall between
    the loop taking a task's next step off its queue and running it: that task never runs again, and
    asyncio.run's cleanup waits for it forever (an `ncpsim up` signalled in its replay on a loaded
    machine hung until SIGKILL, leaving its whole stack up). asyncio.Runner cancels its main task for
    the same reason, but only for SIGINT and only where no handler of ours is installed. A second signal
    gets what it would have got without this function (the guard's KeyboardInterrupt, SIGTERM's exit);
    an ignored signal stays ignored. Off the main thread, which cannot receive signals, it is asyncio.run."""
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(main)
    cancels = _SignalCancels()
    try:
        result = asyncio.run(cancels.running(main))
    except asyncio.CancelledError:
        if not cancels.received:
            raise
    finally:
        cancels.restore()
    if cancels.received:
        raise KeyboardInterrupt(cancels.received[0].name)
    return result


class _SignalCancels:
    """While installed (from construction to restore()), the first signal cancels the task running()."""

    def __init__(self) -> None:
        self.received: list[signal.Signals] = []
        self._task: asyncio.Task[Any] | None = None
        self._previous = {
            sig: h for sig in InterruptGuard.SIGNALS if (h := signal.getsignal(sig)) is not signal.SIG_IGN
        }
        for sig in self._previous:
            signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    async def running(self, main: Coroutine[Any, Any, T]) -> T:
        self._task = asyncio.current_task()
        if self.received:  # signalled while the loop was being made
            main.close()
            raise asyncio.CancelledError
        return await main

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.received.append(signal.Signals(signum))
        if len(self.received) > 1:
            self.restore()
            signal.raise_signal(signum)
        elif self._task is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: raised after it instead
                self._task.get_loop().call_soon_threadsafe(self._task.cancel)
