"""`invoke watch`: callbacks as they cross the running stack, one row each, from its events and access log.

On a terminal the rows form a live table (rich) that fills in as each callback's records arrive; written
to a pipe or a file, each callback is one plain line once its records are complete. Ctrl-C stops it; so
does the stack going down.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from scenarios.calls import expected_proxy_lines
from scenarios.tail import StackTail
from scenarios.trace import CallTrace, join

POLL_SECONDS = 0.1  # how often the files are re-read: a human watches, a tenth of a second is live enough
SETTLE_SECONDS = 2.0  # how long a finished callback waits for its proxy lines before its row is final
COLUMNS = ("time", "request", "callback", "worker", "DNS answer", "proxy", "pod", "outcome")
PLAIN_WIDTHS = (12, 8, 9, 12, 15, 14, 22)  # plain lines line up; the outcome, last, takes what it needs


@dataclass
class Crossing:
    """One callback: the worker's result, joined with what the proxy and the pods recorded about it."""

    trace: CallTrace
    ts: float
    seen: float  # monotonic time the result was read
    final: bool = False

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
class CallbackFeed:
    """Turns what the stack appends to its files into Crossings; pure apart from re-reading the files."""

    tail: StackTail
    since: float  # wall-clock time: callbacks finished before it are history, not shown
    crossings: list[Crossing] = field(default_factory=list)
    _known: set[str] = field(default_factory=set)
    _read: int = 0  # events already looked at

    def poll(self, now: float) -> list[Crossing]:
        """Read what is new; return the crossings that just became final (all records in, or waited enough)."""
        self.tail.refresh()
        new, self._read = self.tail.events[self._read :], len(self.tail.events)
        for event in new:
            rid = str(event.get("requestId") or "")
            fresh = rid and rid not in self._known and event.get("ts", 0) >= self.since
            if event.get("kind") != "worker.callback.result" or not fresh:
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
        result = self.tail.worker_result(trace.request_id or "") or {}
        trace.outcome = "success" if result.get("ok") else "failure"
        trace.error = trace.error or result.get("error")

    def _complete(self, crossing: Crossing) -> bool:
        trace = crossing.trace
        if trace.via != "proxy" or trace.outcome != "success":
            return trace.via is not None
        start = next(
            (
                e
                for e in self.tail.events
                if e.get("requestId") == trace.request_id and e.get("kind") == "worker.callback.start"
            ),
            None,
        )
        return len(trace.proxy) >= expected_proxy_lines(trace, start)


def _table(crossings: list[Crossing], limit: int) -> Table:
    table = Table(
        box=None, padding=(0, 1), show_edge=False, title="callbacks (Ctrl-C stops)", title_justify="left"
    )
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for crossing in crossings[-limit:]:
        table.add_row(*crossing.row(), style=None if crossing.trace.outcome == "success" else "red")
    return table


def watch(state_dir: Path, out: TextIO, running: Callable[[], bool], terminal: bool | None = None) -> int:
    """Show callbacks until Ctrl-C or until `running()` turns false; returns how many were shown."""
    feed = CallbackFeed(StackTail(state_dir), since=time.time())
    terminal = out.isatty() if terminal is None else terminal
    try:
        if terminal:
            _watch_live(feed, Console(file=out), running)
        else:
            _watch_plain(feed, out, running)
    except KeyboardInterrupt:
        pass
    return len(feed.crossings)


def _watch_live(feed: CallbackFeed, console: Console, running: Callable[[], bool]) -> None:
    limit = max(console.height - 4, 5)
    with Live(_table([], limit), console=console, refresh_per_second=8, transient=False) as live:
        while running():
            feed.poll(time.monotonic())
            live.update(_table(feed.crossings, limit))
            time.sleep(POLL_SECONDS)  # a polling interval between re-reads of the files, not a readiness wait
    console.print("the stack is down")


def _plain(cells: list[str]) -> str:
    return (
        " ".join(f"{cell:<{width}}" for cell, width in zip(cells, PLAIN_WIDTHS, strict=False))
        + " "
        + cells[-1]
    )


def _watch_plain(feed: CallbackFeed, out: TextIO, running: Callable[[], bool]) -> None:
    print(_plain(list(COLUMNS)), file=out, flush=True)
    while running():
        for crossing in feed.poll(time.monotonic()):
            print(_plain(crossing.row()), file=out, flush=True)
        time.sleep(POLL_SECONDS)  # a polling interval between re-reads of the files, not a readiness wait
    print("the stack is down", file=out, flush=True)
