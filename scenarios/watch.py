"""`ncpsim watch`: what crosses the running stack, one row each, from its events and access log.

Each worker callback is a row once its records are in; every other request the proxy sees (a `curl`
through it, a probe, a scanner) is a row of its own once no callback has claimed its access-log line. On
a terminal the rows form a live table (rich); into a pipe or a file each row is one plain line, or one
JSON object with `--json`. `--grep TEXT` keeps the rows that mention it, `--failed` the failures. Ctrl-C
stops it; so does the stack going down. What a row shows came from the network: it is escaped, never
interpreted (no terminal escapes, no rich markup).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from scenarios.calls import expected_proxy_lines
from scenarios.tail import StackTail
from scenarios.terminal import safe
from scenarios.trace import CallTrace, join
from sim.model.events import CALLBACK_RESULT
from sim.proxy.access_log import start_time

POLL_SECONDS = 0.1  # how often the files are re-read: a human watches, a tenth of a second is live enough
SETTLE_SECONDS = 2.0  # how long a finished callback waits for its proxy lines before its row is final
COLUMNS = ("time", "request", "kind", "client", "DNS answer", "proxy", "pod", "outcome")
PLAIN_WIDTHS = (12, 8, 9, 12, 15, 14, 22)  # plain lines line up; the outcome, last, takes what it needs


@dataclass
class Crossing:
    """One callback: the worker's result, joined with what the proxy and the pods recorded about it."""

    trace: CallTrace
    ts: float
    seen: float  # monotonic time the result was read
    final: bool = False

    @property
    def ok(self) -> bool:
        return self.trace.outcome == "success"

    def to_json(self) -> dict[str, object]:
        return {"kind": "callback", "ts": self.ts, **self.trace.to_dict()}

    def row(self) -> list[str]:
        t = self.trace
        proxy = ", ".join(f"{r['status']} {r['flags']}" for r in t.proxy) or (
            "direct" if t.via == "direct" else "-"
        )
        pods = sorted({leg["pod"] for leg in t.pod_legs if leg.get("pod")})
        outcome = "ok" if t.outcome == "success" else f"FAILED: {t.error}"
        return [
            datetime.fromtimestamp(self.ts).strftime("%H:%M:%S.%f")[:-3],
            (t.request_id or "-")[:8],
            t.function,
            t.worker or "-",
            t.lookup,
            proxy,
            ", ".join(pods) or "-",
            outcome,
        ]


@dataclass
class Request:
    """A request the proxy saw that no worker callback claimed: a `curl`, a probe, a scanner."""

    record: dict[str, str]
    ts: float
    seen: float
    final: bool = False

    @property
    def ok(self) -> bool:
        return self.record.get("flags") == "-" and self.record.get("status", "0") < "400"

    def to_json(self) -> dict[str, object]:
        return {"kind": "request", "ts": self.ts, **self.record}

    def row(self) -> list[str]:
        r = self.record
        return [
            datetime.fromtimestamp(self.ts).strftime("%H:%M:%S.%f")[:-3],
            (r.get("request_id") or "-")[:8],
            f"{r.get('method', '-')} {r.get('protocol', '')}".strip(),
            r.get("ua", "-"),
            "-",
            f"{r.get('status', '-')} {r.get('flags', '-')}",
            r.get("upstream_host", "-"),
            f"{r.get('status')} {r.get('authority', '-')}{r.get('path', '')}",
        ]


@dataclass
class CallbackFeed:
    """Turns what the stack appends to its files into Crossings; pure apart from re-reading the files."""

    tail: StackTail
    since: float  # wall-clock time: callbacks finished before it are history, not shown
    crossings: list[Crossing] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    _known: set[str] = field(default_factory=set)
    _read: int = 0  # events already looked at
    _access_read: int = 0  # access-log lines already looked at

    def rows(self) -> list[Crossing | Request]:
        return sorted([*self.crossings, *self.requests], key=lambda row: row.ts)

    def poll(self, now: float) -> list[Crossing | Request]:
        """Read what is new; return the rows that just became final (all records in, or waited enough)."""
        finished: list[Crossing | Request] = list(self._poll_callbacks(now))
        finished += self._poll_requests(now)
        return sorted(finished, key=lambda row: row.ts)

    def _poll_requests(self, now: float) -> list[Request]:
        """Access-log lines no callback claimed once their callbacks have had time to: requests of their own."""
        fresh, self._access_read = self.tail.access[self._access_read :], len(self.tail.access)
        for record in fresh:
            ts = start_time(record)
            if ts >= self.since:
                self.requests.append(Request(record, ts, now))
        claimed = {id(r) for c in self.crossings for r in c.trace.proxy}
        done = []
        for request in self.requests:
            if request.final or now - request.seen < SETTLE_SECONDS:
                continue
            request.final = True
            if id(request.record) not in claimed:
                done.append(request)
        self.requests = [r for r in self.requests if not r.final or id(r.record) not in claimed]
        return done

    def _poll_callbacks(self, now: float) -> list[Crossing]:
        self.tail.refresh()
        new, self._read = self.tail.events[self._read :], len(self.tail.events)
        for event in new:
            rid = str(event.get("requestId") or "")
            fresh = rid and rid not in self._known and event.get("ts", 0) >= self.since
            if event.get("kind") != CALLBACK_RESULT or not fresh:
                continue
            self._known.add(rid)
            function = "grpc-echo" if event.get("callback") == "grpc" else "http-echo"
            trace = CallTrace(
                step=0, index=len(self.crossings) + 1, function=function, pod="", request_id=rid
            )
            self.crossings.append(Crossing(trace, event.get("ts", 0.0), now))
        finished = []
        for crossing in self.crossings:
            if crossing.final:
                continue
            self._fill(crossing)
            if self._complete(crossing) or now - crossing.seen >= SETTLE_SECONDS:
                crossing.final = True
                finished.append(crossing)
        return finished

    def _fill(self, crossing: Crossing) -> None:
        trace = crossing.trace
        trace.proxy, trace.pod_legs, trace.decisions = [], [], []
        join(trace, self.tail.events, self.tail.access)
        result = self.tail.callback_result(trace.request_id or "")
        trace.outcome = "success" if result and result.ok else "failure"
        trace.error = trace.error or (result.error if result else None)

    def _complete(self, crossing: Crossing) -> bool:
        trace = crossing.trace
        if trace.via != "proxy" or trace.outcome != "success":
            return trace.via is not None
        start = self.tail.callback_start(trace.request_id or "")
        return len(trace.proxy) >= expected_proxy_lines(trace, start)


@dataclass(frozen=True)
class Choice:
    """Which rows to show: those mentioning `grep` (case-insensitive), only failures with `failed`."""

    grep: str = ""
    failed: bool = False

    def keeps(self, row: Crossing | Request) -> bool:
        if self.failed and row.ok:
            return False
        return not self.grep or self.grep.lower() in " ".join(row.row()).lower()


def _table(rows: list[Crossing | Request], limit: int) -> Table:
    table = Table(
        box=None,
        padding=(0, 1),
        show_edge=False,
        title="what crosses the stack (Ctrl-C stops)",
        title_justify="left",
    )
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for row in rows[-limit:]:
        # Text, not markup: a request id or user agent a client chose must not be read as rich markup
        table.add_row(*(Text(safe(cell)) for cell in row.row()), style=None if row.ok else "red")
    return table


def watch(
    state_dir: Path,
    out: TextIO,
    running: Callable[[], bool],
    terminal: bool | None = None,
    choice: Choice = Choice(),
    as_json: bool = False,
) -> int:
    """Show what crosses the stack until Ctrl-C or until `running()` turns false; how many rows were shown."""
    feed = CallbackFeed(StackTail(state_dir), since=time.time())
    terminal = out.isatty() if terminal is None else terminal
    shown = 0
    try:
        if terminal and not as_json:
            _watch_live(feed, Console(file=out), running, choice)
        else:
            shown = _watch_lines(feed, out, running, choice, as_json)
    except KeyboardInterrupt:
        pass
    return shown or len([r for r in feed.rows() if r.final and choice.keeps(r)])


def _watch_live(feed: CallbackFeed, console: Console, running: Callable[[], bool], choice: Choice) -> None:
    limit = max(console.height - 4, 5)
    with Live(_table([], limit), console=console, refresh_per_second=8, transient=False) as live:
        while running():
            feed.poll(time.monotonic())
            live.update(_table([r for r in feed.rows() if choice.keeps(r)], limit))
            time.sleep(POLL_SECONDS)  # a polling interval between re-reads of the files, not a readiness wait
    console.print("the stack is down")


def _plain(cells: list[str]) -> str:
    return (
        " ".join(f"{cell:<{width}}" for cell, width in zip(cells, PLAIN_WIDTHS, strict=False))
        + " "
        + cells[-1]
    )


def _watch_lines(
    feed: CallbackFeed, out: TextIO, running: Callable[[], bool], choice: Choice, as_json: bool
) -> int:
    shown = 0
    if not as_json:
        print(_plain(list(COLUMNS)), file=out, flush=True)
    while running():
        for row in feed.poll(time.monotonic()):
            if choice.keeps(row):
                text = json.dumps(row.to_json(), default=str) if as_json else safe(_plain(row.row()))
                print(text, file=out, flush=True)
                shown += 1
        time.sleep(POLL_SECONDS)  # a polling interval between re-reads of the files, not a readiness wait
    if not as_json:
        print("the stack is down", file=out, flush=True)
    return shown
