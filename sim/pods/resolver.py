"""The DNS process: one view per cluster (its CoreDNS), each on its own real port, UDP and TCP.

It records no event per query, as CoreDNS logs none without its `log` plugin (which k3s's Corefile does not
load): what a worker was answered is in the worker's own `worker.callback.result` (its `dns` field), which
traces read. A rule that fails is logged, as CoreDNS's `errors` plugin would.
"""

from __future__ import annotations

import asyncio

from dns.server import Resolver
from sim.runtime.component import Context, Ready
from sim.wire import DNS_PORT


async def run(ctx: Context, ready: Ready) -> None:
    resolver = Resolver(ctx.topology.dns_views())
    await resolver.start()
    bindings = {}
    for cluster, port in resolver.ports.items():
        dns_ip = ctx.topology.cluster(cluster).dns_ip
        bindings[f"{dns_ip}:{DNS_PORT}/udp"] = port
        bindings[f"{dns_ip}:{DNS_PORT}/tcp"] = port
    ready(bindings)
    try:
        await asyncio.Event().wait()
    finally:
        await resolver.close()
