"""HTTP callbacks per second: through ncpsim's proxy vs straight to the pod, and vs nginx.

One stack: one invocation-service pod, the proxy, one compute cluster with no workers (the benchmark is
the only worker, see bench.callbacks). The same client, the same minted work and the same pod serve
every route, so the differences are the relays'. Besides throughput, the relay's own CPU time per
callback is read from /proc: it does not depend on how fast the Python load generator is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.callbacks import Minter, Route, direct_route, drive, proxy_route, worker_tls
from bench.nginx import NginxSite, nginx
from bench.procs import CpuMeter
from bench.stacks import BenchStack
from certs.profiles import FRONTEND_SECRET
from sim.topology import Pod

WARMUP = 20
NEW_CONN_LANES = 4  # concurrent workers, each opening a new TLS connection per callback


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    return round(a["per_second"] / b["per_second"], 3) if b.get("per_second") else None


async def _measure(minter: Minter, route: Route, bench: BenchStack, pod: Pod, calls: int, lanes: int,
                   reuse: bool, cpu_pids: list[int]) -> dict[str, Any]:
    works = await minter.mint(calls)
    with CpuMeter(lambda: cpu_pids) as cpu:
        result = await drive(works, route, worker_tls(bench), lanes=lanes, reuse=reuse,
                             poll_addr=bench.pod_http(pod), bodies=minter.bodies)
    if cpu_pids:
        result["relay_cpu_ms_per_call"] = round(cpu.seconds * 1000 / calls, 3)
    return result


async def keepalive(bench: BenchStack, calls: int) -> dict[str, Any]:
    """One keep-alive TLS connection to the proxy vs one straight to the pod's 8443, same callbacks."""
    pod = bench.topology.pods_of("invocation")[0]
    proxy_pid = [bench.component_pid("worker-callback-proxy")]
    async with Minter(bench, pod) as minter:
        sample = (await minter.mint(1))[0]
        routes = {"proxy": proxy_route(bench, sample), "direct": direct_route(bench, pod)}
        await _lane_warmup(minter, bench, pod, routes.values())
        out = {name: await _measure(minter, route, bench, pod, calls, 1, True, proxy_pid if name == "proxy" else [])
               for name, route in routes.items()}
    out["ratio"] = _ratio(out["proxy"], out["direct"])
    return out


async def _lane_warmup(minter: Minter, bench: BenchStack, pod: Pod, routes: Any) -> None:
    """A few callbacks each way first, so imports, caches and pools are warm for both."""
    for route in routes:
        await drive(await minter.mint(WARMUP), route, worker_tls(bench), lanes=1, reuse=True,
                    poll_addr=bench.pod_http(pod), bodies=minter.bodies)


def _site(bench: BenchStack, pod: Pod, keepalive_upstream: bool) -> NginxSite:
    frontend = bench.secret(FRONTEND_SECRET)
    return NginxSite(frontend / "tls.crt", frontend / "tls.key", bench.stack_ca,
                     {pod.fqdn: bench.pod_tls(pod)}, keepalive_upstream)


async def new_connections(bench: BenchStack, calls: int, folder: Path) -> dict[str, Any]:
    """A new TLS connection per callback: ncpsim's proxy vs nginx (shared upstream pool, and without)."""
    pod = bench.topology.pods_of("invocation")[0]
    proxy_pid = [bench.component_pid("worker-callback-proxy")]
    out: dict[str, Any] = {"lanes": NEW_CONN_LANES}
    async with Minter(bench, pod) as minter:
        sample = (await minter.mint(1))[0]
        route = proxy_route(bench, sample)
        out["proxy"] = await _measure(minter, route, bench, pod, calls, NEW_CONN_LANES, False, proxy_pid)
        for pooled in (True, False):
            key = "nginx" if pooled else "nginx_no_upstream_keepalive"
            with nginx(_site(bench, pod, pooled), folder / key) as server:
                via = proxy_route(bench, sample, ("127.0.0.1", server.port), key)
                await drive(await minter.mint(WARMUP), via, worker_tls(bench), lanes=1, reuse=False,
                            poll_addr=bench.pod_http(pod), bodies=minter.bodies)
                out[key] = await _measure(minter, via, bench, pod, calls, NEW_CONN_LANES, False, server.pids())
    out["ratio"] = _ratio(out["proxy"], out["nginx"])
    out["ratio_vs_no_upstream_keepalive"] = _ratio(out["proxy"], out["nginx_no_upstream_keepalive"])
    return out


async def measure(bench: BenchStack, keepalive_calls: int, newconn_calls: int, nginx_folder: Path) -> dict[str, Any]:
    """Both comparisons on `bench` (one invocation-service pod, no workers)."""
    return {"keepalive": await keepalive(bench, keepalive_calls),
            "new_connection": await new_connections(bench, newconn_calls, nginx_folder)}
