"""Ctrl-C and SIGTERM in a command that owns components (clusters/interrupts.py), without a stack:
the guard's handlers, and an event loop run so that a signal cancels it instead of landing inside it."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from clusters import interrupts
from clusters.interrupts import InterruptGuard, run_cancelled_by_signal


@pytest.fixture(autouse=True)
def handlers_put_back() -> Iterator[None]:
    """Each test starts with Python's own SIGINT handler, as on a terminal, even where the suite runs as a
    shell's background job (SIGINT ignored from the start, which the guard then leaves so); the tests of
    an ignored signal ignore it themselves. Every handler is put back afterwards."""
    before = {sig: signal.getsignal(sig) for sig in InterruptGuard.SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_a_signal_ignored_from_the_start_stays_ignored() -> None:
    """`ncpsim up &` in a script starts with SIGINT ignored: the guard leaves it so (and still turns
    SIGTERM into cleanup), then puts every handler back."""
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guard = InterruptGuard()
    with guard.installed():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == guard._on_signal
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_settled_command_ignores_signals_to_its_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """After `ncpsim up` has printed its report: a signal is ignored inside the guards and stays ignored
    as each comes off, so the exit code (0) and the stack (up) agree."""
    monkeypatch.setattr(interrupts, "_settled", False)
    with InterruptGuard().installed(), InterruptGuard().installed():
        interrupts.settle()
        os.kill(os.getpid(), signal.SIGTERM)  # raised as KeyboardInterrupt by an unsettled guard
        os.kill(os.getpid(), signal.SIGINT)
    for sig in InterruptGuard.SIGNALS:
        assert signal.getsignal(sig) is signal.SIG_IGN


async def signalled(sig: signal.Signals, reached: list[str]) -> None:
    """A replay step: the signal lands in the middle of synchronous code running on the loop."""
    later = asyncio.ensure_future(asyncio.sleep(30))  # another task the loop holds, as a replay's calls are
    os.kill(os.getpid(), sig)
    reached.append("the line after the signal")  # where the guard's own handler would have raised
    try:
        await later
    finally:
        reached.append("cleanup")


@pytest.mark.parametrize("sig", InterruptGuard.SIGNALS, ids=lambda s: s.name)
def test_a_signal_in_the_loop_cancels_it_and_is_raised_once_it_is_closed(sig: signal.Signals) -> None:
    """The hang seen in CI: SIGTERM raised as KeyboardInterrupt between two of the loop's callbacks left a
    task that never ran again, and `ncpsim up` waited for it until SIGKILL. Here the signal only cancels:
    the code it lands in runs on, every task is cancelled, and KeyboardInterrupt comes after the loop."""
    guard, before = InterruptGuard(), signal.getsignal(sig)
    reached: list[str] = []
    started = time.monotonic()
    with guard.installed(), pytest.raises(KeyboardInterrupt, match=sig.name):
        run_cancelled_by_signal(signalled(sig, reached))
    assert reached == ["the line after the signal", "cleanup"]
    assert time.monotonic() - started < 10  # the sleep it cancelled was 30 s
    assert signal.getsignal(sig) == before

    # The control: the same step under asyncio.run, where the guard's handler raises where the signal lands.
    control: list[str] = []
    with guard.installed(), pytest.raises(KeyboardInterrupt):
        asyncio.run(signalled(sig, control))
    assert control == [], "the control did not raise where the signal landed: this test tests nothing"


def test_the_guard_is_back_after_the_loop() -> None:
    guard = InterruptGuard()
    with guard.installed():
        assert run_cancelled_by_signal(asyncio.sleep(0, "done")) == "done"
        for sig in InterruptGuard.SIGNALS:
            assert signal.getsignal(sig) == guard._on_signal


def test_a_second_signal_gets_the_handler_it_would_have_got() -> None:
    """Cleanup that itself hangs must not make Ctrl-C useless: the second signal goes to the guard, which
    raises where it lands, as asyncio.Runner does on a second Ctrl-C."""
    reached: list[str] = []

    async def stuck_in_cleanup() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C again
            reached.append("past the second signal")
            await asyncio.sleep(30)

    started = time.monotonic()
    with InterruptGuard().installed(), pytest.raises(KeyboardInterrupt):
        run_cancelled_by_signal(stuck_in_cleanup())
    assert reached == [] and time.monotonic() - started < 10


def test_an_ignored_signal_stays_ignored_in_the_loop() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> str:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.01)
        return "finished"

    with InterruptGuard().installed():
        assert run_cancelled_by_signal(main()) == "finished"
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_off_the_main_thread_it_is_asyncio_run() -> None:
    """A catalogue or diagnose worker thread replays too; only the main thread may touch handlers."""
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(run_cancelled_by_signal(asyncio.sleep(0, 7))))
    thread.start()
    thread.join(10)
    assert got == [7]
