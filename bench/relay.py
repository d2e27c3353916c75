"""HTTP callbacks per second: through ncpsim's proxy vs nginx doing the same relay, and vs straight to the pod.

Keep-alive: each route on one kept-alive TLS connection (proxy, nginx, the pod itself); the figure is
proxy / nginx, and proxy / direct is kept beside it. New connections: a new TLS connection per callback,
proxy / nginx (with its upstream pool, and without). One stack: one invocation-service pod, the proxy, one compute cluster with no workers (the benchmark is
the only worker, see bench.callbacks). The same client, the same minted work and the same pod serve
every route, so the differences are the relays'. The routes take turns in ROUNDS rounds (the order
flips each round), so a change in the machine's load during the run hits every route alike; a route's
rate is its callbacks over its summed time. Besides throughput, the relay's own CPU time per callback is
read with psutil: it does not depend on how fast the Python load generator is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.callbacks import Minter, Route, direct_route, drive, proxy_route, worker_tls
from bench.nginx import NginxSite, RunningNginx, nginx
from bench.procs import CpuMeter
from bench.stacks import BenchStack, running, topology, unique_name
from certs.profiles import FRONTEND_SECRET
from sim.model.parts import Pod

WARMUP = 20
ROUNDS = 5
NEW_CONN_LANES = 4  # concurrent workers, each opening a new TLS connection per callback


@dataclass
class Tally:
    """One route's callbacks over all rounds."""

    route: Route
    cpu_pids: list[int]
    calls: int = 0
    ok: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    rates: list[float] = field(default_factory=list)

    def add(self, result: dict[str, Any], cpu_seconds: float) -> None:
        self.calls += result["calls"]
        self.ok += result["ok"]
        self.seconds += result["seconds"]
        self.cpu += cpu_seconds
        self.rates.append(result["per_second"])

    def summary(self, lanes: int, reuse: bool) -> dict[str, Any]:
        out = {
            "route": self.route.name,
            "calls": self.calls,
            "ok": self.ok,
            "lanes": lanes,
            "connection": "keep-alive" if reuse else "new TLS connection per callback",
            "seconds": round(self.seconds, 3),
            "per_second": round(self.calls / self.seconds, 1),
            "round_rates": self.rates,
        }
        if self.cpu_pids:
            out["relay_cpu_ms_per_call"] = round(self.cpu * 1000 / self.calls, 3)
        return out


async def _rounds(
    minter: Minter, bench: BenchStack, pod: Pod, tallies: list[Tally], calls: int, lanes: int, reuse: bool
) -> dict[str, dict[str, Any]]:
    tls, per_round = worker_tls(bench), max(calls // ROUNDS, 1)
    for tally in tallies:  # warm-up: imports, caches and pools, for every route alike
        await drive(
            await minter.mint(WARMUP),
            tally.route,
            tls,
            lanes=1,
            reuse=reuse,
            poll_addr=bench.pod_http(pod),
            bodies=minter.bodies,
        )
    for n in range(ROUNDS):
        for tally in tallies if n % 2 == 0 else reversed(tallies):
            works = await minter.mint(per_round)
            with CpuMeter(tally.cpu_pids.copy) as cpu:
                result = await drive(
                    works,
                    tally.route,
                    tls,
                    lanes=lanes,
                    reuse=reuse,
                    poll_addr=bench.pod_http(pod),
                    bodies=minter.bodies,
                )
            tally.add(result, cpu.seconds)
    return {t.route.name: t.summary(lanes, reuse) for t in tallies}


def _ratio(out: dict[str, dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    """The ratio of overall rates, and the median and range of the per-round ratios."""
    rounds = [x / y for x, y in zip(out[a]["round_rates"], out[b]["round_rates"], strict=True) if y]
    return {
        "ratio": round(out[a]["per_second"] / out[b]["per_second"], 3),
        "round_ratio_median": round(statistics.median(rounds), 3),
        "round_ratio_range": [round(min(rounds), 3), round(max(rounds), 3)],
    }


async def keepalive(bench: BenchStack, calls: int, peer: RunningNginx | None = None) -> dict[str, Any]:
    """One kept-alive TLS connection to the proxy, to nginx (`peer`, when there is one) and straight to the
    pod's 8443, the same callbacks on each: proxy / nginx, and proxy / direct (`vs_direct`)."""
    pod = bench.topology.pods_of("invocation")[0]
    async with Minter(bench, pod) as minter:
        sample = (await minter.mint(1))[0]
        tallies = [
            Tally(proxy_route(bench, sample), [bench.component_pid("worker-callback-proxy")]),
            *(
                [Tally(proxy_route(bench, sample, ("127.0.0.1", peer.port), "nginx"), peer.pids())]
                if peer
                else []
            ),
            Tally(direct_route(bench, pod), []),
        ]
        out: dict[str, Any] = await _rounds(minter, bench, pod, tallies, calls, 1, True)
    out["vs_direct"] = _ratio(out, "proxy", "direct")
    return out | (_ratio(out, "proxy", "nginx") if peer else {})


def nginx_site(bench: BenchStack, pod: Pod, keepalive_upstream: bool) -> NginxSite:
    frontend = bench.secret(FRONTEND_SECRET)
    return NginxSite(
        frontend / "tls.crt",
        frontend / "tls.key",
        bench.stack_ca,
        {pod.fqdn: bench.pod_tls(pod)},
        keepalive_upstream,
    )


async def new_connections(
    bench: BenchStack, calls: int, pooled: RunningNginx, unpooled: RunningNginx
) -> dict[str, Any]:
    """A new TLS connection per callback: ncpsim's proxy vs nginx (shared upstream pool, and without)."""
    pod = bench.topology.pods_of("invocation")[0]
    async with Minter(bench, pod) as minter:
        sample = (await minter.mint(1))[0]
        tallies = [
            Tally(proxy_route(bench, sample), [bench.component_pid("worker-callback-proxy")]),
            Tally(proxy_route(bench, sample, ("127.0.0.1", pooled.port), "nginx"), pooled.pids()),
            Tally(
                proxy_route(bench, sample, ("127.0.0.1", unpooled.port), "nginx_no_upstream_keepalive"),
                unpooled.pids(),
            ),
        ]
        out: dict[str, Any] = await _rounds(minter, bench, pod, tallies, calls, NEW_CONN_LANES, False)
    out["vs_no_upstream_keepalive"] = _ratio(out, "proxy", "nginx_no_upstream_keepalive")
    return out | _ratio(out, "proxy", "nginx")


async def measure(
    bench: BenchStack, keepalive_calls: int, newconn_calls: int, nginx_folder: Path
) -> dict[str, Any]:
    """Both comparisons on `bench` (one invocation-service pod, no workers), against the same nginx."""
    pod = bench.topology.pods_of("invocation")[0]
    with contextlib.ExitStack() as servers:
        pooled = servers.enter_context(nginx(nginx_site(bench, pod, True), nginx_folder / "pooled"))
        unpooled = servers.enter_context(nginx(nginx_site(bench, pod, False), nginx_folder / "unpooled"))
        return {
            "keepalive": await keepalive(bench, keepalive_calls, pooled),
            "new_connection": await new_connections(bench, newconn_calls, pooled, unpooled),
        }


def main() -> None:
    """This section of `ncpsim bench` alone, on a stack of its own: an A/B of two trees runs it with each
    tree first on PYTHONPATH (the stack's components run the `sim` found there)."""
    parser = argparse.ArgumentParser(prog="python -m bench.relay", description=__doc__)
    parser.add_argument("--keepalive", type=int, default=1000, help="keep-alive callbacks per route")
    parser.add_argument("--newconn", type=int, default=600, help="new-connection callbacks per route")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ncpsim-relay-") as folder:
        root = Path(folder)
        with running(root / "relay", topology(unique_name("relay"), invocation=1, clusters=1)) as bench:
            result = asyncio.run(measure(bench, args.keepalive, args.newconn, root / "nginx"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
