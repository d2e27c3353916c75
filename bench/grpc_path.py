"""Side-by-side gRPC callback throughput on a running stack: `python -m bench.grpc_path --state DIR`.

Three rates, measured in one run against one grpc-proxy pod:
- `unary`: client unary calls per second through the whole QUIC path (client -> pod over h2c, work on
  the bus, the worker's HTTP/3 callback through the proxy, echo over HTTP/2 in the tunnel).
- `callbacks_via_proxy` and `callbacks_direct`: callback exchanges per second (a new QUIC session and
  one `POST /v1/proxy`) through the proxy's UDP 443, and straight to the pod's UDP 10084. The bench
  owns no real token, so each exchange ends in the pod's 403; the pod logs a rejection and the proxy an
  access-log line (user agent `ncpsim-bench`) for each.
Like curl or dig, the bench is a host tool: it reads the real loopback ports from the network map.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from dns.rule import dashed_ip
from sim.client.grpc_client import EchoClient
from sim.model.netmap import LOOPBACK, LiveNetMap
from sim.model.topology import Topology
from sim.protocols.h3 import client_configuration, close_client, connect, trust_pem
from sim.wire import GRPC_CALLBACK_PORT, GRPC_CLIENT_PORT, GRPC_SUFFIX, PROXY_H3_PORT

BENCH_REQUEST_ID = "00000000-0000-4000-8000-000000000000"


async def rate(count: int, concurrency: int, one: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    """Run `one` `count` times, at most `concurrency` at once; calls per second over the whole run."""
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> None:
        async with gate:
            await one()

    started = time.perf_counter()
    await asyncio.gather(*(gated() for _ in range(count)))
    seconds = time.perf_counter() - started
    return {"calls": count, "seconds": round(seconds, 4), "per_second": round(count / seconds, 1)}


async def callback_once(addr: tuple[str, int], sni: str, trust: bytes) -> int:
    """One callback exchange: QUIC handshake, POST /v1/proxy, the answer's status."""
    endpoint = await connect(addr, client_configuration(sni, trust), timeout=5)
    try:
        headers = {
            ":method": "POST",
            ":scheme": "https",
            ":authority": sni,
            ":path": "/v1/proxy",
            "authorization": "Bearer " + "b" * 64,
            "x-request-id": BENCH_REQUEST_ID,
            "user-agent": "ncpsim-bench",
        }
        stream = endpoint.open_request([(k.encode(), v.encode()) for k, v in headers.items()])
        await stream.headers
        while await stream.read():
            pass
        stream.end()
        return stream.status
    finally:
        close_client(endpoint)


async def measure(
    state_dir: Path, calls: int = 50, concurrency: int = 4, pod_name: str | None = None
) -> dict:
    topology = Topology.load(state_dir)
    bindings = LiveNetMap(state_dir / "netmap.json").current().bindings
    pod = next(p for p in topology.pods_of("grpc-proxy") if pod_name in (None, p.name))
    trust = trust_pem([state_dir / "certs" / "ca" / issuer / "ca.crt" for issuer in ("stack", "public")])
    report: dict[str, Any] = {"pod": pod.name, "concurrency": concurrency}
    async with EchoClient((LOOPBACK, bindings[f"{pod.ip}:{GRPC_CLIENT_PORT}/tcp"])) as echo:
        report["unary"] = await rate(calls, concurrency, lambda: echo.unary(b"bench"))
    direct = (
        (LOOPBACK, bindings[f"{pod.ip}:{GRPC_CALLBACK_PORT}/udp"]),
        f"{dashed_ip(pod.ip)}.{GRPC_SUFFIX}",
    )
    paths = {"callbacks_direct": direct}
    proxy_key = f"{topology.proxy_lb_ip}:{PROXY_H3_PORT}/udp"
    if proxy_key in bindings:
        paths["callbacks_via_proxy"] = (
            (LOOPBACK, bindings[proxy_key]),
            f"{dashed_ip(pod.ip)}.{topology.worker_domain}",
        )
    for name, (addr, sni) in sorted(paths.items()):
        report[name] = await rate(calls, concurrency, partial(callback_once, addr, sni, trust))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_path", description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, type=Path, help="the running stack's state folder")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--pod", help="grpc-proxy pod name (default: the first)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.state, args.calls, args.concurrency, args.pod)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
