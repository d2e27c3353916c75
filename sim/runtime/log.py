"""A component's log: one line a record, never a traceback, and a repeated line said once a while.

A component's stderr is its log file (`ncpsim logs COMPONENT`). Libraries log there too: nats-py says
`nats: encountered error` with a whole traceback on every reconnect attempt while the bus is down (twice a
second), and asyncio's `Unhandled exception in client_connected_cb` came with one. Each record is one line
here, its exception as `: Type: message` at the end; a library's same line again within REPEAT_WINDOW is
dropped (ncpsim's own lines each say one event, and all are kept).
NCPSIM_DEBUG keeps everything, tracebacks included, for a developer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
REPEAT_WINDOW = 30.0  # seconds during which the same line is not written again
DEBUG_ENV = "NCPSIM_DEBUG"


class OneLine(logging.Formatter):
    """The record and its exception on one line; line breaks in a message shown as \\n."""

    def format(self, record: logging.LogRecord) -> str:
        exc, text = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            line = super().format(record)
        finally:
            record.exc_info, record.exc_text = exc, text
        if exc and exc[1] is not None:
            line += f": {type(exc[1]).__name__}: {exc[1]}"
        return line.replace("\r", "\\r").replace("\n", "\\n")


class Repeats(logging.Filter):
    """Drop a line said already within `window` seconds (the same logger, message and exception type)."""

    def __init__(self, window: float = REPEAT_WINDOW, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window, self.clock = window, clock
        self.said: dict[tuple[str, str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        key = (record.name, record.getMessage(), f"{type(error).__name__}: {error}" if error else "")
        now, last = self.clock(), self.said.get(key)
        if last is not None and now - last < self.window:
            return False
        if len(self.said) > 1000:  # bounded: old lines are forgotten, not the process's memory
            self.said.clear()
        self.said[key] = now
        return True


def _handler(quiet_repeats: bool) -> logging.Handler:
    handler = logging.StreamHandler()
    if os.environ.get(DEBUG_ENV):
        handler.setFormatter(logging.Formatter(FORMAT))
        return handler
    handler.setFormatter(OneLine(FORMAT))
    if quiet_repeats:
        handler.addFilter(Repeats())
    return handler


def component_log(name: str) -> logging.Logger:
    """ncpsim's own logger `name` in a component: one line a record (set up once, whoever asks first)."""
    log = logging.getLogger(name)
    if not log.handlers:
        log.addHandler(_handler(quiet_repeats=False))  # each of ncpsim's own lines says one event
        log.setLevel(logging.DEBUG if os.environ.get(DEBUG_ENV) else logging.INFO)
        log.propagate = False
    return log


def one_line_logs() -> None:
    """Every library's records in this process one line each too (the root logger's handler); a logger with
    a handler of its own (the callout's, on stdout) is written there only."""
    root = logging.getLogger()
    if not any(getattr(h, "one_line_root", False) for h in root.handlers):
        handler = _handler(quiet_repeats=True)  # a library retrying says the same thing over and over
        handler.addFilter(lambda record: not logging.getLogger(record.name).handlers)
        handler.one_line_root = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if os.environ.get(DEBUG_ENV) else logging.WARNING)
