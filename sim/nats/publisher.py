"""The pods' publishing end of the work streams (invocation-service, grpc-proxy).

Why nats-py is imported late: a pod reports ready before anyone can invoke it, and at start-up every
component of the stack competes for the CPU; loading nats-py (and the NKey crypto) there delayed every
pod's readiness. ``start`` loads them on a thread right after the pod is ready, well before its first
publish; ``publish`` would load them itself if it came first.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
from collections.abc import Mapping
from typing import Any, Protocol

from sim.model.events import EventLog
from sim.model.topology import Topology
from sim.model.values import NatsValues

_MODULES = ("nats.aio.client", "nats.js", "sim.nats.work", "sim.nats.stack")
PUBLISH_ATTEMPTS = 3
REPUBLISH_AFTER = (0.2, 0.8)  # seconds before the second and the third attempt
CONNECT_SLACK = 1.0  # seconds beyond the attempts: with the bus down nats-py may first try to connect longer


def publish_deadline(attempt_timeout: float) -> float:
    """Seconds a pod waits for its publish of work, after which the API answers 500: every attempt (each
    waits ``attempt_timeout`` for JetStream's answer; a lost answer is sent again), the pauses between
    them, and a margin (8 s with the default 2 s attempt, nats.jetstream.publishTimeoutSeconds)."""
    return PUBLISH_ATTEMPTS * attempt_timeout + sum(REPUBLISH_AFTER) + CONNECT_SLACK


class Pod(Protocol):
    """What the publisher reads of its pod's Context (sim.runtime.component): the library stays below the
    component runtime."""

    @property
    def name(self) -> str: ...
    @property
    def topology(self) -> Topology: ...
    @property
    def values(self) -> Mapping[str, Any]: ...
    @property
    def events(self) -> EventLog: ...
    def nats_servers(self) -> list[str]: ...


def _load() -> None:
    for name in _MODULES:
        importlib.import_module(name)


class WorkPublisher:
    """One connection, opened on first use as the pod's internal NATS user (an ``auth_users`` NKey)."""

    def __init__(self, ctx: Pod, role: str) -> None:
        self.ctx, self.role = ctx, role
        self.attempt_timeout = NatsValues.from_values(ctx.values).publish_timeout
        self.deadline = publish_deadline(self.attempt_timeout)  # the pods bound publish() by it
        self._nc: Any = None
        self._lock = asyncio.Lock()
        self._warm: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Load nats-py off the event loop, now that the pod is ready."""
        self._warm = asyncio.create_task(asyncio.to_thread(_load), name=f"{self.ctx.name}:nats-warm")

    async def _client(self) -> Any:
        """The pod's connection: it only publishes. The streams are the API's, made when a function is
        deployed (sim.pods.nats.api), so a publish waits on no JetStream request but its own."""
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                from .stack import StackKeys
                from .work import connect

                seed = StackKeys.of(self.ctx.topology).internal[self.role]
                self._nc = await connect(
                    self.ctx.nats_servers(), f"{self.role}/{self.ctx.name}", {"nkeys_seed_str": seed}
                )
            return self._nc

    async def publish(self, function: str, request_id: str, work: Mapping[str, Any]) -> int:
        """Queue ``work`` in the function version's stream; returns its stream sequence.

        A publish whose answer went down with the NATS server it passed through (a rolling restart, a
        crash) is sent again, up to PUBLISH_ATTEMPTS times, under the same Nats-Msg-Id: JetStream's
        duplicate window keeps one message of however many arrived. ncpsim's assumption: the public source
        does not say how invocation-service retries; each retry is an event (``work.republished``)."""
        from nats import errors

        from .stack import REGION
        from .workqueue import publish_work

        data = json.dumps(work, separators=(",", ":")).encode()
        # The message id adds this process: a pod restarted by a fault replays its seeded request ids,
        # which must not be dropped as duplicates of its previous life's messages (5 s window).
        msg_id = f"{request_id}.{os.getpid()}"
        for attempt in range(1, PUBLISH_ATTEMPTS + 1):
            try:
                nc = await self._client()
                return await publish_work(
                    nc.jetstream(),
                    REGION,
                    function,
                    request_id,
                    data,
                    timeout=self.attempt_timeout,
                    msg_id=msg_id,
                )
            except (errors.Error, TimeoutError) as exc:
                if attempt == PUBLISH_ATTEMPTS:
                    raise
                error = f"{type(exc).__name__}: {exc}"
                self.ctx.events.emit("work.republished", requestId=request_id, attempt=attempt, error=error)
                # A server just back may not know of the stream's interest yet ("no responders"): a moment
                await asyncio.sleep(REPUBLISH_AFTER[attempt - 1])
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._warm is not None:
            self._warm.cancel()
            await asyncio.gather(self._warm, return_exceptions=True)
        if self._nc is not None:
            from .client import close_client  # nats-py late, as everywhere in this module

            with contextlib.suppress(Exception):
                await close_client(self._nc)
            self._nc = None
