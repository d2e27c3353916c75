"""The work bus process (NATS's place in the control plane), reached through its load-balancer address."""

from __future__ import annotations

import asyncio

from sim.bus import WorkBus
from sim.component import Context, Ready
from sim.topology import BUS_PORT


async def run(ctx: Context, ready: Ready) -> None:
    bus = WorkBus(ctx.events)
    port = await bus.start()
    ready({f"{ctx.topology.bus_lb_ip}:{BUS_PORT}/tcp": port})
    try:
        await asyncio.Event().wait()
    finally:
        await bus.close()
