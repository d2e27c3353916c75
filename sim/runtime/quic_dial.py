"""A component's QUIC dial across the simulated link, for the components that speak HTTP/3 (the worker
hosts' gRPC callbacks, the proxy's upstream to grpc-proxy).

Apart from Context (sim.runtime.component) because of what it imports: with Context, aioquic and its TLS
stack were 10 % of `ncpsim up`'s work before the stack's first component (its replay client dials no
QUIC) and half of the zygote's before the first runner (the resolver, NATS, the callout and
invocation-service dial none either): bench/findings.md, issue 32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aioquic.quic.configuration import QuicConfiguration

from sim.protocols.h3 import H3Endpoint, connect
from sim.runtime.component import Context
from sim.runtime.links import UDP, attempt_timeout


async def open_quic(
    ctx: Context,
    ip: str,
    port: int,
    config: QuicConfiguration,
    *,
    timeout: float,
    check: Callable[[Any], None] | None = None,
) -> H3Endpoint:
    """QUIC from `ctx`'s cluster to the virtual `ip:port`, across the link as the faults in force say: each
    datagram sent is delayed or lost, and a handshake over a link that loses packets is given up after its
    timeoutMs, as a TCP dial is. `check` judges the server's certificate (sim.protocols.h3.connect)."""
    give_up = attempt_timeout(ctx.link_fault(ip, UDP), timeout)
    return await connect(
        ctx.udp_address(ip, port), config, timeout=give_up, fate=ctx.datagram_fate(ip), check=check
    )
