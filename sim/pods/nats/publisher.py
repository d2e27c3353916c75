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
from typing import Any

from sim.runtime.component import Context

_MODULES = ("nats.aio.client", "nats.js", "sim.pods.nats.work", "sim.pods.nats.stack")


def _load() -> None:
    for name in _MODULES:
        importlib.import_module(name)


class WorkPublisher:
    """One connection, opened on first use as the pod's internal NATS user (an ``auth_users`` NKey)."""

    def __init__(self, ctx: Context, role: str) -> None:
        self.ctx, self.role = ctx, role
        self._nc: Any = None
        self._lock = asyncio.Lock()
        self._warm: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Load nats-py off the event loop, now that the pod is ready."""
        self._warm = asyncio.create_task(asyncio.to_thread(_load), name=f"{self.ctx.name}:nats-warm")

    async def _client(self) -> Any:
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                from .stack import REGION, NatsValues, StackKeys
                from .work import connect
                from .workqueue import QueueSettings, ensure_stream

                seed = StackKeys.derive(self.ctx.topology.seed).internal[self.role]
                nc = await connect(self.ctx, f"{self.role}/{self.ctx.name}", {"nkeys_seed_str": seed})
                # The streams may not exist yet where no one made them (a k3d pod); idempotent.
                settings = QueueSettings(ack_wait=NatsValues.from_values(self.ctx.values).ack_wait)
                js = nc.jetstream()
                for function in self.ctx.topology.functions:
                    await ensure_stream(js, REGION, function, settings)
                self._nc = nc
            return self._nc

    async def publish(self, function: str, request_id: str, work: Mapping[str, Any]) -> int:
        """Queue ``work`` in the function version's stream; returns its stream sequence."""
        from .stack import REGION
        from .workqueue import publish_work

        nc = await self._client()
        # The message id adds this process: a pod restarted by a fault replays its seeded request ids,
        # which must not be dropped as duplicates of its previous life's messages (5 s window).
        return await publish_work(
            nc.jetstream(),
            REGION,
            function,
            request_id,
            json.dumps(work, separators=(",", ":")).encode(),
            msg_id=f"{request_id}.{os.getpid()}",
        )

    async def close(self) -> None:
        if self._warm is not None:
            self._warm.cancel()
            await asyncio.gather(self._warm, return_exceptions=True)
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None
