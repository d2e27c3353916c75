"""The DNS process: one view per cluster (its CoreDNS), each on its own real port, UDP and TCP."""

from __future__ import annotations

import asyncio

from dns.server import QueryEvent, Resolver
from sim.protocols.wire import DNS_PORT
from sim.runtime.component import Context, Ready


async def run(ctx: Context, ready: Ready) -> None:
    def record(q: QueryEvent) -> None:
        ctx.events.emit(
            "dns.query",
            view=q.view,
            qname=q.qname,
            qtype=q.qtype,
            rcode=q.rcode,
            answers=list(q.addresses),
            transport=q.transport,
        )

    resolver = Resolver(ctx.topology.dns_views(), on_query=record)
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
