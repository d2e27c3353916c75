"""Follow a running stack's events and access log incrementally (files other processes append to)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

from sim.model.events import (
    CALLBACK_RESULT,
    CALLBACK_START,
    TOKEN_MINTED,
    CallbackResult,
    CallbackStart,
    Event,
)
from sim.proxy.access_log import ACCESS_LOG, parse_line

POLL_INTERVAL = 0.02  # how often a waiting caller re-reads the files it is waiting on


class _FileTail:
    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")  # keep a half-written last line for next time
        return [line.decode(errors="replace") for line in lines if line]


class StackTail:
    """Everything the stack has recorded so far, refreshed on demand."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.events: list[Event] = []
        self.access: list[dict[str, str]] = []
        self._tails: dict[Path, _FileTail] = {}
        self._access_tail = _FileTail(state_dir / "logs" / ACCESS_LOG)
        self._results: dict[str, Event] = {}
        self._starts: dict[str, CallbackStart] = {}  # each request's first worker.callback.start
        self._tagged: dict[str, str] = {}  # a gRPC call's tag -> the request id its pod minted

    def refresh(self) -> None:
        for path in sorted((self.state_dir / "events").glob("*.jsonl")):
            tail = self._tails.setdefault(path, _FileTail(path))
            for line in tail.new_lines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self.events.append(event)
                kind = event.get("kind")
                if kind == CALLBACK_RESULT:
                    self._results[event.get("requestId")] = event
                elif kind == CALLBACK_START:
                    self._starts.setdefault(str(event.get("requestId")), CallbackStart.read(event))
                elif kind == TOKEN_MINTED and event.get("call"):
                    self._tagged[event["call"]] = event.get("requestId")
        self.access += [rec for line in self._access_tail.new_lines() if (rec := parse_line(line))]

    def worker_result(self, request_id: str) -> Event | None:
        """The worker's worker.callback.result for the request, as written."""
        return self._results.get(request_id)

    def callback_result(self, request_id: str) -> CallbackResult | None:
        event = self._results.get(request_id)
        return None if event is None else CallbackResult.read(event)

    def callback_start(self, request_id: str) -> CallbackStart | None:
        return self._starts.get(request_id)

    def tagged_request(self, tag: str) -> str | None:
        """The request id a grpc-proxy pod minted for the gRPC call sent with this tag (GRPC_CALL_TAG)."""
        return self._tagged.get(tag)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Re-read until `predicate` holds or `timeout` passes: waiting on what components record."""
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_INTERVAL)
