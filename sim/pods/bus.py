"""The work bus: how invocation-service and grpc-proxy hand work to function workers.

In the real stack this is NATS, reached from compute clusters through the control plane's load
balancer. ncpsim keeps that shape with a tiny JSON-lines protocol over TCP: subscribers join a queue
group per function and each message goes to one subscriber, round-robin (a NATS queue group).

    -> {"op": "sub", "queue": "http-echo", "sid": "worker-1-0"}
    -> {"op": "pub", "queue": "http-echo", "msg": {...}}         <- {"op": "ok", "sid": "worker-1-0"}
    <- {"op": "msg", "queue": "http-echo", "sid": "worker-1-0", "msg": {...}}
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from sim.model.events import EventLog


async def send_line(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    await writer.drain()


async def read_line(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    line = await reader.readline()
    if not line:
        return None
    return json.loads(line)


@dataclass
class _Subscription:
    sid: str
    writer: asyncio.StreamWriter


@dataclass
class QueueGroups:
    """Round-robin delivery state; messages wait while a queue has no subscriber."""

    subs: dict[str, deque[_Subscription]] = field(default_factory=lambda: defaultdict(deque))
    waiting: dict[str, deque[dict[str, Any]]] = field(default_factory=lambda: defaultdict(deque))

    def next_subscriber(self, queue: str) -> _Subscription | None:
        group = self.subs[queue]
        while group and group[0].writer.is_closing():
            group.popleft()
        if not group:
            return None
        group.rotate(-1)
        return group[-1]

    def drop(self, writer: asyncio.StreamWriter) -> None:
        for group in self.subs.values():
            for sub in [s for s in group if s.writer is writer]:
                group.remove(sub)


class WorkBus:
    def __init__(self, events: EventLog):
        self.events = events
        self.groups = QueueGroups()
        self.server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1") -> int:
        self.server = await asyncio.start_server(self._serve, host, 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (frame := await read_line(reader)) is not None:
                await self._handle(frame, writer)
        except (ConnectionError, json.JSONDecodeError, asyncio.IncompleteReadError):
            pass
        finally:
            self.groups.drop(writer)
            writer.close()

    async def _handle(self, frame: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        op, queue = frame.get("op"), frame.get("queue", "")
        if op == "sub":
            self.groups.subs[queue].append(_Subscription(frame["sid"], writer))
            self.events.emit("bus.sub", queue=queue, sid=frame["sid"])
            while self.groups.waiting[queue]:
                await self._deliver(queue, self.groups.waiting[queue].popleft())
        elif op == "pub":
            sid = await self._deliver(queue, frame["msg"])
            await send_line(writer, {"op": "ok", "sid": sid})

    async def _deliver(self, queue: str, msg: dict[str, Any]) -> str | None:
        sub = self.groups.next_subscriber(queue)
        if sub is None:
            self.groups.waiting[queue].append(msg)
            self.events.emit("bus.wait", queue=queue, requestId=msg.get("requestId"))
            return None
        try:
            await send_line(sub.writer, {"op": "msg", "queue": queue, "sid": sub.sid, "msg": msg})
        except ConnectionError:
            self.groups.drop(sub.writer)
            return await self._deliver(queue, msg)
        self.events.emit("bus.deliver", queue=queue, sid=sub.sid, requestId=msg.get("requestId"))
        return sub.sid

    async def close(self) -> None:
        if self.server:
            self.server.close()
            await self.server.wait_closed()


class BusClient:
    """One connection to the bus; used by publishers (pods) and by a worker host for all its workers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, host: str, port: int) -> BusClient:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def publish(self, queue: str, msg: dict[str, Any]) -> str | None:
        async with self._lock:  # one outstanding pub per connection keeps replies in order
            await send_line(self.writer, {"op": "pub", "queue": queue, "msg": msg})
            reply = await read_line(self.reader)
        return reply.get("sid") if reply else None

    async def subscribe(self, queue: str, sid: str) -> None:
        await send_line(self.writer, {"op": "sub", "queue": queue, "sid": sid})

    async def messages(self):
        while (frame := await read_line(self.reader)) is not None:
            if frame.get("op") == "msg":
                yield frame

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass
