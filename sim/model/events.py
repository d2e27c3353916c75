"""Structured JSON-lines events, one file per component in <state>/events/.

The replay engine reads them back to check expectations and draw each callback's sequence, so every
component writes what it decided, with the request id whenever it knows one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO


class EventLog:
    def __init__(self, state_dir: Path, component: str):
        self.component = component
        folder = state_dir / "events"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{component}.jsonl"
        # Line-buffered append: a crashed component still leaves every event it wrote.
        self._file: TextIO = open(self.path, "a", buffering=1)  # noqa: SIM115 - lives as long as the log

    def emit(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        if "kind" in fields:
            raise ValueError("'kind' names the event type; call the field something else (e.g. 'callback')")
        event = {"ts": time.time(), "component": self.component, "kind": kind, **fields}
        self._file.write(json.dumps(event, sort_keys=True, default=str) + "\n")
        return event

    def close(self) -> None:
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
