"""The work bus process (NATS's place in the control plane), reached through its load-balancer address."""

from __future__ import annotations

import asyncio

from sim.pods.bus import WorkBus
from sim.protocols.wire import NATS_PORT
from sim.runtime.component import Context, Ready


async def run(ctx: Context, ready: Ready) -> None:
    bus = WorkBus(ctx.events)
    port = await bus.start()
    ready({f"{ctx.topology.bus_lb_ip}:{NATS_PORT}/tcp": port})
    try:
        await asyncio.Event().wait()
    finally:
        await bus.close()
