"""gRPC over the QUIC path: bench.grpc_path's rates on two fresh stacks, with the proxy's ratio to direct.

`unary` is whole gRPC calls through the full path (client, grpc-proxy pod, bus, worker, HTTP/3 callback
through the proxy, echo in the tunnel); against the same on a stack with the proxy disabled (workers in
the control-plane cluster call the pod's UDP 10084 themselves). `callbacks_via_proxy` / `callbacks_direct` are callback
exchanges (a new QUIC session and one POST /v1/proxy each) through the proxy's UDP 443 and straight to
the pod's UDP 10084; their ratio is the proxy's cost on the QUIC path.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from pathlib import Path
from typing import Any

from bench.grpc_path import measure as grpc_measure
from bench.procs import CpuMeter
from bench.stacks import BenchStack, running, topology, unique_name

CONCURRENCY = 4
ROUNDS = 5  # turns each stack takes, the order flipping each round (as the relay's and the resolver's)
PATHS = ("unary", "callbacks_direct", "callbacks_via_proxy")


def _stack(root: Path, proxy: bool) -> contextlib.AbstractContextManager[BenchStack]:
    topo = topology(unique_name("quic"), invocation=0, grpc=1, clusters=1, workers_per_cluster=2, proxy=proxy)
    return running(root, topo)


def _turn(bench: BenchStack, calls: int) -> dict[str, Any]:
    return asyncio.run(grpc_measure(bench.state_dir, calls=calls, concurrency=CONCURRENCY))


def _summed(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One stack's turns as one report: each path's calls over its summed time."""
    out: dict[str, Any] = {"pod": reports[0]["pod"], "concurrency": CONCURRENCY, "rounds": len(reports)}
    for path in PATHS:
        turns = [r[path] for r in reports if path in r]
        if turns:
            calls, seconds = sum(t["calls"] for t in turns), sum(t["seconds"] for t in turns)
            out[path] = {
                "calls": calls,
                "seconds": round(seconds, 4),
                "per_second": round(calls / seconds, 1),
                "round_rates": [t["per_second"] for t in turns],
            }
    return out


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    return round(a["per_second"] / b["per_second"], 3) if a and b and b.get("per_second") else None


def measure(root: Path, calls: int) -> dict[str, Any]:
    """The proxied stack and the same stack with the proxy disabled (workers in the control plane), both up
    at once, take ROUNDS turns of `calls` gRPC calls each: a change in the machine's load during the run hits
    both alike, and the unary figure is judged on the median of the rounds' ratios. (One turn each on one
    stack after the other read 0.76-0.83 for the same tree within minutes.)"""
    turns: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    with contextlib.ExitStack() as up:
        stacks = {proxy: up.enter_context(_stack(root, proxy)) for proxy in (True, False)}
        for bench in stacks.values():
            asyncio.run(grpc_measure(bench.state_dir, calls=10, concurrency=2))  # warm-up: first sessions
        pids = [stacks[True].component_pid("worker-callback-proxy")]
        with CpuMeter(lambda: pids) as cpu:  # over the proxied stack's turns only: the other has no proxy
            for n in range(ROUNDS):
                for proxy in (True, False) if n % 2 == 0 else (False, True):
                    turns[proxy].append(_turn(stacks[proxy], calls))
    via, direct = _summed(turns[True]), _summed(turns[False])
    via["proxy_cpu_seconds"] = round(cpu.seconds, 3)
    rounds = [_ratio(v["unary"], d["unary"]) or 0.0 for v, d in zip(turns[True], turns[False], strict=True)]
    return {
        "via_proxy": via,
        "direct_stack": direct,
        "unary_ratio": _ratio(via.get("unary"), direct.get("unary")),
        "round_ratio_median": round(statistics.median(rounds), 3),
        "round_ratio_range": [min(rounds), max(rounds)],
        "callback_ratio": _ratio(via.get("callbacks_via_proxy"), via.get("callbacks_direct")),
    }
