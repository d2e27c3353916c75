"""Waiting for what a running stack records: the exact event or access-log line a test needs.

Components write their records a little after their client has its answer (the proxy logs a request
once the response is sent), so a test that acts and then reads "the last line" can read the line
before. Take a `Records` before acting and wait for the record the action produces, matched by its
fields, never by its position, with a named timeout. Tests import it as `from stack_records import
Records` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scenarios.tail import POLL_INTERVAL, StackTail

RECORD_TIMEOUT = 10.0  # seconds a component may take to write a record once its client has the answer

Match = Any  # a value the field must equal, or a predicate on the field's value


def matches(record: dict[str, Any], match: dict[str, Match]) -> bool:
    return all(
        want(record.get(key)) if callable(want) else record.get(key) == want for key, want in match.items()
    )


class Records:
    """The events and access-log lines a stack's components write from now on (or, with
    ``since_start=True``, all of them), read incrementally as scenarios/tail.py reads them."""

    def __init__(self, state_dir: Path, *, since_start: bool = False) -> None:
        self._tail = StackTail(state_dir)
        if not since_start:
            self._tail.refresh()
        self._events_from = len(self._tail.events)
        self._access_from = len(self._tail.access)

    @property
    def events(self) -> list[dict[str, Any]]:
        return self._tail.events[self._events_from :]

    @property
    def access(self) -> list[dict[str, str]]:
        return self._tail.access[self._access_from :]

    def event(self, kind: str, timeout: float = RECORD_TIMEOUT, **match: Match) -> dict[str, Any]:
        """The first new event of `kind` whose fields match."""
        return self._wait(f"{kind} event", lambda: self.events, {"kind": kind, **match}, timeout)

    def access_line(self, timeout: float = RECORD_TIMEOUT, **match: Match) -> dict[str, str]:
        """The first new access-log line whose fields (sim.proxy.access_log.parse_line's names) match."""
        return self._wait("access-log line", lambda: self.access, match, timeout)

    def _wait(
        self, what: str, records: Callable[[], list[dict[str, Any]]], match: dict[str, Match], timeout: float
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            self._tail.refresh()
            found = next((r for r in records() if matches(r, match)), None)
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"no {what} matching {match} within {timeout} s; the last ones written: {records()[-3:]}"
                )
            time.sleep(POLL_INTERVAL)


def stack_processes(state: Path) -> list[int]:
    """Live processes whose command line names this stack's state folder (what `ncpsim down` must stop)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            zombie = (proc / "stat").read_text().split(")")[-1].split()[0] == "Z"
        except OSError:
            continue
        if str(state).encode() in cmdline and not zombie:
            found.append(int(proc.name))
    return found
