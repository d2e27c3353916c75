"""Crafted forward-proxy requests sent through the proxy as a worker would (SSRF and routing checks).

A probe opens TLS to the proxy's load-balancer address from a compute cluster, trusting both the stack
CA and the public-style CA (it tests routing, not the frontend certificate), and writes its request
line byte for byte, so targets a well-behaved HTTP library would refuse to send still reach the proxy.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import uuid
from datetime import UTC, datetime
from urllib.parse import urlsplit

from scenarios.spec import PLACEHOLDER, ProbeTarget, Step
from scenarios.trace import CallTrace
from sim.model.topology import Topology
from sim.protocols.dial import close_within
from sim.protocols.go_errors import Dial, tcp_dial_error, tls_error
from sim.protocols.tls import client_context
from sim.runtime.component import Context
from sim.wire import PROXY_HTTP_PORT

PROBE_TIMEOUT = 5.0


def fill(target: str, topology: Topology) -> str:
    """Replace {pod} (first invocation pod's name), {pod1}, {podIp} and {workerDomain} in a target."""
    pods = topology.pods_of("invocation")
    names = {
        "workerDomain": topology.worker_domain,
        "pod": pods[0].fqdn if pods else "no-invocation-pod",
        "pod1": pods[1].fqdn if len(pods) > 1 else "no-second-invocation-pod",
        "podIp": pods[0].ip if pods else "0.0.0.0",
    }
    return PLACEHOLDER.sub(lambda m: names.get(m.group(1), m.group(0)), target)


def request_bytes(method: str, target: str, request_id: str) -> bytes:
    """The request as sent: absolute-form (or CONNECT authority) target, the Host it names."""
    host = target if method == "CONNECT" else (urlsplit(target).netloc or "-")
    lines = [
        f"{method} {target} HTTP/1.1",
        f"Host: {host}",
        "User-Agent: ncpsim-probe",
        f"X-Request-Id: {request_id}",
        "Content-Length: 0",
        "",
        "",
    ]
    return "\r\n".join(lines).encode("latin-1", errors="replace")


def parse_head(head: bytes) -> tuple[int, int]:
    """(status code, Content-Length) of a response head; status 0 if it is not one."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    status = int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else 0
    length = next(
        (
            int(v)
            for k, _, v in (line.partition(b":") for line in lines[1:])
            if k.strip().lower() == b"content-length" and v.strip().isdigit()
        ),
        0,
    )
    return status, length


async def send_probe(ctx: Context, topology: Topology, method: str, target: str, request_id: str) -> int:
    tls = client_context([ctx.ca_path("stack"), ctx.ca_path("public")])
    ip, port = topology.proxy_addresses(PROXY_HTTP_PORT)[0]
    reader, writer = await ctx.open_tcp(
        ip, port, tls=tls, server_hostname=f"invocation.{topology.worker_domain}"
    )
    try:
        writer.write(request_bytes(method, target, request_id))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PROBE_TIMEOUT)
        status, length = parse_head(head)
        # Read the whole answer: the proxy writes its access-log line once the response is delivered.
        await asyncio.wait_for(reader.readexactly(length), PROBE_TIMEOUT)
    finally:
        await close_within(writer)  # the step's loop may end next: a TLS close must be waited for
    return status


async def probe_call(
    ctx: Context, topology: Topology, step: Step, index: int, probe: ProbeTarget, rng: random.Random
) -> CallTrace:
    request_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    target = fill(probe.target, topology)
    trace = CallTrace(
        step=step.index,
        index=index,
        function="probe",
        pod="-",
        request_id=request_id,
        kind="probe",
        method=probe.method,
        target=target,
        worker="prober",
        via="proxy",
    )
    try:
        status = await send_probe(ctx, topology, probe.method, target, request_id)
    except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError) as exc:
        ip, port = topology.proxy_addresses(PROXY_HTTP_PORT)[0]  # named, never the loopback port behind it
        dial = Dial(f"invocation.{topology.worker_domain}", "", addr=f"{ip}:{port}")
        if isinstance(exc, asyncio.IncompleteReadError):
            said = "EOF"  # the proxy hung up mid-answer
        elif isinstance(exc, ssl.SSLError):
            said = tls_error(dial, exc, datetime.now(UTC))
        else:
            said = tcp_dial_error(dial, exc)
        trace.outcome, trace.error = "failure", f"probe: {said}"
        return trace
    trace.client_status, trace.worker_statuses = status, [status]
    trace.outcome = "success" if 200 <= status < 400 else "failure"
    if trace.outcome == "failure":
        trace.error = f"proxy answered {status}"
    return trace
