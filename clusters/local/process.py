"""Watching a process that is not this one's child (a component, a zygote the shared one forked) until it
has exited, and no longer. "Exited" must mean what waitpid means: every thread gone, so every socket
closed. A zombie does not: the main thread of a process killed with threads running becomes a zombie
before the others have closed the process's files (a pod SIGKILLed that way still refused no connection:
its listener took one and reset it). On Linux a pidfd is readable exactly when the whole thread group has
exited; elsewhere the process table is polled, where a zombie is the best sign there is.
"""

from __future__ import annotations

import os
import select
import subprocess
import time

import psutil

POLL_INTERVAL = 0.005  # seconds, where there is no pidfd


def wait_exited(pid: int, timeout: float | None, process: psutil.Process | None = None) -> bool:
    """True once `pid` has exited (or is not `process` any more: its pid was reused), False at the
    timeout."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):  # not Linux, or an old kernel
        deadline = None if timeout is None else time.monotonic() + timeout
        while _running(pid, process):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_INTERVAL)
        return True
    try:
        if process is not None and not process.is_running():
            return True  # the pidfd is a newer process's: ours was gone before it was opened
        return bool(select.select([pidfd], [], [], timeout)[0])
    finally:
        os.close(pidfd)


def _running(pid: int, process: psutil.Process | None) -> bool:
    try:
        proc = process or psutil.Process(pid)
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # exists, and not ours to inspect


class Forked:
    """A zygote the shared one forked, held as the launcher holds a zygote it started (pid, poll, wait);
    as a psutil.Process (pid plus start time), so a pid the system reused is never taken for it."""

    def __init__(self, pid: int):
        self.pid = pid
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:  # it ended at once and was reaped
            self._proc = None

    def poll(self) -> int | None:
        """None while it runs; 0 once it has exited (its exit code went to its parent)."""
        return 0 if self._proc is None or wait_exited(self.pid, 0, self._proc) else None

    def wait(self, timeout: float | None = None) -> int:
        if self._proc is not None and not wait_exited(self.pid, timeout, self._proc):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        return 0
