"""The worker callback proxy process: the HTTP/1.1 front on TCP 10084 and the HTTP/3 front on UDP 443."""

from __future__ import annotations

import asyncio
import os

from certs.profiles import INVOCATION_SECRET
from sim.model.values import proxy_settings
from sim.protocols.tls import ReloadingContext, client_context, server_context
from sim.proxy.access_log import ACCESS_LOG, AccessLog
from sim.proxy.h3_front import H3Front
from sim.proxy.http_front import HttpFront
from sim.proxy.policy import ProxyPolicy
from sim.runtime.component import Context, Ready
from sim.wire import PROXY_H3_PORT, PROXY_HTTP_PORT


def policy_from_values(values: dict) -> ProxyPolicy:
    settings = proxy_settings(values)
    return ProxyPolicy(upstream_tls=settings.upstream_tls, connect_enabled=settings.connect_enabled)


async def run(ctx: Context, ready: Ready) -> None:
    settings = proxy_settings(ctx.values)

    def tls_error(message: str) -> None:
        ctx.events.emit("proxy.tls.reload_failed", error=message)

    frontend = ReloadingContext(ctx.secret(settings.frontend_secret), server_context, tls_error)
    # The chain is checked in the handshake; the pod name after it, by Envoy's SAN rule (sim.proxy.san).
    upstream = ReloadingContext(
        ctx.secret(INVOCATION_SECRET),
        lambda d: client_context([d / "ca.crt"], check_hostname=False),
        tls_error,
    )
    access_log = AccessLog(ctx.state_dir / "logs" / ACCESS_LOG)
    # NCPSIM_PROXY_STREAM_IDLE lets tests exercise Envoy's idle stream timeout (300 s) in milliseconds.
    idle = float(os.environ.get("NCPSIM_PROXY_STREAM_IDLE", "300"))
    http = HttpFront(ctx, policy_from_values(ctx.values), access_log, frontend, upstream, idle)
    h3 = H3Front(ctx, access_log)
    try:
        http_port, h3_port = await http.start(), await h3.start()
        # Every address service.type gives the Service (LB, ClusterIP, node port) reaches the same fronts.
        bindings = {
            f"{ip}:{port}/tcp": http_port for ip, port in ctx.topology.proxy_addresses(PROXY_HTTP_PORT)
        }
        bindings.update(
            {f"{ip}:{port}/udp": h3_port for ip, port in ctx.topology.proxy_addresses(PROXY_H3_PORT)}
        )
        ready(bindings)
        await asyncio.Event().wait()
    finally:
        await http.close()
        await h3.close()
        access_log.close()
