"""Structured JSON-lines events, one file per component in <state>/events/.

The replay engine reads them back to check expectations and draw each callback's sequence, so every
component writes what it decided, with the request id whenever it knows one.
"""

from __future__ import annotations

import json
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

    def emit(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        if "kind" in fields:
            raise ValueError("'kind' names the event type; call the field something else (e.g. 'callback')")
        event = {"ts": time.time(), "component": self.component, "kind": kind, **fields}
        line = json.dumps(event, sort_keys=True, default=str) + "\n"
        if self.written + len(line) > self.max_bytes:
            if not self.dropped:
                self._write(
                    {
                        "ts": event["ts"],
                        "component": self.component,
                        "kind": "events.capped",
                        "maxBytes": self.max_bytes,
                    }
                )
            self.dropped += 1
            return event
        self._write_line(line)
        return event

    def _write(self, event: dict[str, Any]) -> None:
        self._write_line(json.dumps(event, sort_keys=True) + "\n")

    def _write_line(self, line: str) -> None:
        self._file.write(line)
        self.written += len(line)

    def close(self) -> None:
        if self.dropped and not self._file.closed:
            self._write(
                {
                    "ts": time.time(),
                    "component": self.component,
                    "kind": "events.dropped",
                    "count": self.dropped,
                }
            )
        self._file.close()


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
