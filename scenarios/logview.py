"""`ncpsim logs` and `ncpsim events` as compose and kubectl show them: one timeline, prefixes, `-f`.

Each component writes its own log in its own format (Envoy's access log in UTC, nats-server's and the
Python components' in local time); several logs are merged into one timeline by the time each line
carries (a line without one keeps the time of the line before it), with the component's name in front,
coloured on a terminal, as `docker compose logs` shows them. `-f` follows the files as they grow, until
Ctrl-C or until the stack is down. Nothing a file holds reaches the terminal raw: control characters
(ANSI escapes, carriage returns) are shown escaped, since the lines carry what clients sent.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from scenarios.terminal import safe

FOLLOW_POLL = 0.2  # seconds between re-reads when following: a person reads, a fifth of a second is live
ALIVE_CHECK = 1.0  # seconds between checks that the stack is still up while following
COLOURS = (36, 33, 32, 35, 34, 91, 92, 93, 94, 95, 96)  # compose's rotation of prefix colours
_ZAP_TS = re.compile(r'"ts": ?([0-9]+(?:\.[0-9]+)?)')
_STAMPS = (  # (pattern, strptime format, the time zone it is written in: None for local)
    (re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\]"), "%Y-%m-%dT%H:%M:%S.%f", UTC),  # Envoy
    (re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)"), "%Y-%m-%d %H:%M:%S,%f", None),  # Python logging
    (re.compile(r"^\[\d+\] (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+)"), "%Y/%m/%d %H:%M:%S.%f", None),  # nats
    (re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z"), "%Y-%m-%dT%H:%M:%S.%f", UTC),  # Go, zap
)


def line_time(line: str) -> float | None:
    """The time a log line carries, as a Unix timestamp; None when it carries none this knows."""
    if line.startswith("{"):  # zap's production JSON (worker-utils): "ts" in epoch seconds
        found = _ZAP_TS.search(line)
        return float(found.group(1)) if found else None
    for pattern, layout, zone in _STAMPS:
        found = pattern.match(line)
        if found:
            text = found.group(1)
            if "." not in text and "," not in text:
                text += ".0"
            try:
                stamp = datetime.strptime(text, layout)
            except ValueError:
                return None
            return stamp.replace(tzinfo=zone).timestamp() if zone else stamp.timestamp()
    return None


@dataclass(frozen=True)
class Line:
    ts: float
    component: str
    text: str


def timeline(logs: dict[str, Path], last: int) -> list[Line]:
    """The last `last` lines of each log, merged by time (a stable sort: equal times keep file order)."""
    merged: list[Line] = []
    for component, path in logs.items():
        merged += list(_timed(component, _last_lines(path, last)))
    return sorted(merged, key=lambda line: line.ts)


def _last_lines(path: Path, count: int) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-count:] if count else []


def _timed(component: str, lines: Iterable[str], previous: float = 0.0) -> Iterator[Line]:
    for text in lines:
        previous = line_time(text) or previous
        yield Line(previous, component, text)


class Printer:
    """`name | line`, the names padded to one width and coloured on a terminal (one colour per name)."""

    def __init__(self, names: Iterable[str], out: TextIO, colour: bool, prefix: bool = True):
        self.names = list(names)
        self.width = max((len(n) for n in self.names), default=0)
        self.out, self.colour, self.prefix = out, colour, prefix

    def show(self, line: Line) -> None:
        text = safe(line.text)
        if self.prefix:
            name = f"{line.component:<{self.width}} |"
            if self.colour:
                code = COLOURS[self.names.index(line.component) % len(COLOURS)]
                name = f"\x1b[{code}m{name}\x1b[0m"
            text = f"{name} {text}"
        print(text, file=self.out, flush=True)


def follow(
    logs: dict[str, Path],
    printer: Printer,
    running: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Print what each log gains from now on, until Ctrl-C (the caller's) or until `running()` is false."""
    offsets = {name: _size(path) for name, path in logs.items()}
    partial = {name: b"" for name in logs}
    checked = clock()
    while True:
        for name, path in logs.items():
            data = _read_from(path, offsets[name])
            offsets[name] += len(data)
            *complete, partial[name] = (partial[name] + data).split(b"\n")
            for line in _timed(name, (c.decode(errors="replace") for c in complete if c), time.time()):
                printer.show(line)
        if clock() - checked >= ALIVE_CHECK:
            if not running():
                return
            checked = clock()
        time.sleep(FOLLOW_POLL)  # a polling interval between re-reads of growing files, not a readiness wait


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read()
    except OSError:
        return b""


# -- events ---------------------------------------------------------------------------------------------
def event_line(event: dict[str, Any]) -> str:
    """`12:20:18.452 worker-callback-proxy component.ready pid=5321 ...`: one event a line, escaped."""
    when = datetime.fromtimestamp(float(event.get("ts") or 0)).strftime("%H:%M:%S.%f")[:-3]
    rest = " ".join(
        f"{key}={json.dumps(value, default=str) if not isinstance(value, str) else value}"
        for key, value in event.items()
        if key not in ("ts", "kind", "component")
    )
    return safe(f"{when} {event.get('component', '-')} {event.get('kind', '-')} {rest}".rstrip())


def wanted(event: dict[str, Any], kinds: Iterable[str]) -> bool:
    """An event of one of `kinds` (a kind, or a prefix ending in `.`: `worker.` is every worker event)."""
    chosen = list(kinds)
    kind = str(event.get("kind", ""))
    return not chosen or any(kind == k or (k.endswith(".") and kind.startswith(k)) for k in chosen)
