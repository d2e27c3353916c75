"""Ctrl-C and SIGTERM as cleanup for a process that owns components (ncpsim up), light enough for its first line
(tasks/main.py: the standard library's signal and threading only; an event loop run so that a signal cancels it
is clusters.signal_run)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

INTERRUPTED = "interrupted; the processes started so far were stopped"  # what the command says on exit 130
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

    @classmethod
    def for_command(cls) -> InterruptGuard:
        """The guard this process already has installed, or a new one: one guard a command, though the
        `ncpsim` binary installs it in its first lines (tasks.main), before the task that hands it down."""
        owner = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
        return owner if isinstance(owner, cls) else cls()

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
