"""The DNS process: one view per cluster (its CoreDNS), each on its own real port, UDP and TCP."""

from __future__ import annotations

import asyncio

from dns.server import REPLY_CACHE_SIZE, QueryEvent, Resolver
from sim.model.events import EventTemplate
from sim.runtime.component import Context, Ready
from sim.wire import DNS_PORT


async def run(ctx: Context, ready: Ready) -> None:
    # One `dns.query` line per query is most of the resolver's work under load; a cached answer's event is
    # the same each time, so its line is serialised once (keyed by the event's value).
    templates: dict[QueryEvent, EventTemplate] = {}

    def record(q: QueryEvent) -> None:
        template = templates.get(q)
        if template is None:
            template = ctx.events.template(
                "dns.query",
                view=q.view,
                qname=q.qname,
                qtype=q.qtype,
                rcode=q.rcode,
                answers=list(q.addresses),
                transport=q.transport,
            )
            if len(templates) < REPLY_CACHE_SIZE:
                templates[q] = template
        template.emit()

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
