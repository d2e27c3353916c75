"""Ctrl-C and SIGTERM as cleanup for a process that owns components (ncpsim up), light enough for its first line."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_settled = False  # the process's signal dispositions are process state: see settle()


def settle() -> None:
    """This command's work is done (`ncpsim up` has printed its report): from here to exit, SIGINT and
    SIGTERM are ignored, and every guard still installed leaves them ignored as it comes off.

    A signal in the last moments before exit has nothing left to stop. Honouring it would end the
    command with 130, which says the start was undone, and leave a stack still up. Settled, 130
    comes only with nothing left running, and a stack that came up is reported by the command's own
    code (0 pass, 1 fail). For a command line about to exit; only the main thread may change handlers."""
    global _settled
    if threading.current_thread() is not threading.main_thread():
        return
    _settled = True
    for sig in InterruptGuard.SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class InterruptGuard:
    """Ctrl-C and SIGTERM while this process owns components: both become KeyboardInterrupt, so cleanup
    runs (SIGTERM's default action would end `ncpsim up` at once and orphan every component started so
    far), and inside `held()` they wait, so no signal lands between starting a child and recording it.

    A signal this process was started ignoring stays ignored: a shell runs `ncpsim up &` from a script
    with SIGINT ignored, and catching it only once the guard is in place would honour a Ctrl-C that
    lands late and drop one that lands early."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._depth = 0
        self._pending = False
        self._installs = 0  # one command's guard is handed down: installed again below, it is already in

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._depth:
            self._pending = True
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread() or self._installs:
            yield  # only the main thread may set handlers (there the caller owns interruption); or it has
            return
        self._installs += 1
        previous = {sig: h for sig in self.SIGNALS if (h := signal.getsignal(sig)) is not signal.SIG_IGN}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            yield
        finally:
            self._installs -= 1
            for sig, handler in previous.items():
                if _settled:
                    signal.signal(sig, signal.SIG_IGN)
                else:
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Signals wait until the block ends; in the main thread only, the one they interrupt (another
        thread's launch, a replay's or a probe's, is stopped from there)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending:
                self._pending = False
                raise KeyboardInterrupt("deferred until the child was recorded")


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
