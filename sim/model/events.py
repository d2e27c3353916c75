"""Structured JSON-lines events, one file per component in <state>/events/.

The replay engine reads them back to check expectations and draw each callback's sequence, so every
component writes what it decided, with the request id whenever it knows one.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

MAX_BYTES = 16 * 1024 * 1024  # per component: a query flood must not fill the disk (one event per DNS query)


class EventLog:
    """One component's events, capped at `max_bytes`; past the cap events are counted, not written, and
    the count is written as one `events.dropped` record when the log closes."""

    def __init__(self, state_dir: Path, component: str, max_bytes: int = MAX_BYTES):
        self.component, self.max_bytes = component, max_bytes
        folder = state_dir / "events"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{component}.jsonl"
        # Line-buffered append: a crashed component still leaves every event it wrote.
        self._file: TextIO = open(self.path, "a", buffering=1)  # noqa: SIM115 - lives as long as the log
        self.written = self.path.stat().st_size
        self.dropped = 0
        self.failed: OSError | None = (
            None  # a write refused (a full disk): later events are counted, not written
        )

    def emit(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        if "kind" in fields:
            raise ValueError("'kind' names the event type; call the field something else (e.g. 'callback')")
        event = {"ts": time.time(), "component": self.component, "kind": kind, **fields}
        self._append(json.dumps(event, sort_keys=True, default=str) + "\n", event["ts"])
        return event

    def template(self, kind: str, /, **fields: Any) -> EventTemplate:
        """An event whose fields never change, serialised once (see EventTemplate)."""
        return EventTemplate(self, kind, fields)

    def _append(self, line: str, ts: float) -> None:
        if self.written + len(line) > self.max_bytes:
            if not self.dropped:
                self._write(
                    {
                        "ts": ts,
                        "component": self.component,
                        "kind": "events.capped",
                        "maxBytes": self.max_bytes,
                    }
                )
            self.dropped += 1
            return
        self._write_line(line)

    def _write(self, event: dict[str, Any]) -> None:
        self._write_line(json.dumps(event, sort_keys=True) + "\n")

    def _write_line(self, line: str) -> None:
        """A component keeps serving whatever its disk does: a refused write (ENOSPC, EIO) stops the log,
        says so once on stderr (the component's log, if that disk still takes it), and counts what follows."""
        if self.failed is not None:
            self.dropped += 1
            return
        try:
            self._file.write(line)
        except OSError as exc:
            self.failed, self.dropped = exc, self.dropped + 1
            with contextlib.suppress(OSError, ValueError):
                print(
                    f"events: cannot write {self.path}: {exc.strerror or exc}; later events are not kept",
                    file=sys.stderr,
                    flush=True,
                )
            return
        self.written += len(line)

    def close(self) -> None:
        if self.dropped and not self._file.closed and self.failed is None:
            self._write(
                {
                    "ts": time.time(),
                    "component": self.component,
                    "kind": "events.dropped",
                    "count": self.dropped,
                }
            )
        with contextlib.suppress(OSError):  # a buffered line the full disk refused: nothing more to do
            self._file.close()


class EventTemplate:
    """An event whose fields never change, for a component that emits the same one many times (the
    resolver's `dns.query` for a cached answer, once per query): serialised once, then each `emit()` writes
    the line `EventLog.emit` would write, byte for byte, with the time it is emitted."""

    _MARK = "\x00ts\x00"  # stands for the timestamp while the rest is serialised (no field holds it)

    def __init__(self, log: EventLog, kind: str, fields: dict[str, Any]):
        if "kind" in fields or "ts" in fields:
            raise ValueError("'kind' and 'ts' are the event's own; call the field something else")
        self._log = log
        event = {"ts": self._MARK, "component": log.component, "kind": kind, **fields}
        head, mark, tail = json.dumps(event, sort_keys=True, default=str).partition(json.dumps(self._MARK))
        if not mark or json.dumps(self._MARK) in tail:
            raise ValueError("a field of a templated event holds its timestamp's marker")
        self._head, self._tail = head, tail + "\n"

    def emit(self) -> None:
        ts = time.time()
        self._log._append(f"{self._head}{ts!r}{self._tail}", ts)


def read_events(state_dir: Path, since: float = 0.0) -> list[dict[str, Any]]:
    """All components' events, oldest first. Partial trailing lines (a writer mid-line) are skipped."""
    events: list[dict[str, Any]] = []
    for path in sorted((state_dir / "events").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("ts", 0) >= since:
                events.append(event)
    events.sort(key=lambda e: e["ts"])
    return events


def of_kind(events: list[dict[str, Any]], kind: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]
