"""gRPC over the QUIC path: bench.grpc_path's rates on a fresh stack, with the proxy's ratio to direct.

`unary` is whole gRPC calls through the full path (client, grpc-proxy pod, bus, worker, HTTP/3 callback
through the proxy, echo in the tunnel); against the same on a stack with the proxy disabled (workers in
the control-plane cluster call the pod's UDP 10084 themselves). `callbacks_via_proxy` / `callbacks_direct` are callback
exchanges (a new QUIC session and one POST /v1/proxy each) through the proxy's UDP 443 and straight to
the pod's UDP 10084; their ratio is the proxy's cost on the QUIC path.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench.grpc_path import measure as grpc_measure
from bench.procs import CpuMeter
from bench.stacks import running, topology, unique_name

CONCURRENCY = 4


def _on_stack(root: Path, proxy: bool, calls: int) -> dict[str, Any]:
    topo = topology(unique_name("quic"), invocation=0, grpc=1, clusters=1, workers_per_cluster=2, proxy=proxy)
    with running(root, topo) as bench:
        asyncio.run(
            grpc_measure(bench.state_dir, calls=10, concurrency=2)
        )  # warm-up: imports, first sessions
        pids = [bench.component_pid("worker-callback-proxy")] if proxy else []
        with CpuMeter(lambda: pids) as cpu:
            report = asyncio.run(grpc_measure(bench.state_dir, calls=calls, concurrency=CONCURRENCY))
    if proxy:
        # Over the whole measurement: the unary calls' callbacks and the via-proxy exchanges.
        report["proxy_cpu_seconds"] = round(cpu.seconds, 3)
    return report


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    return round(a["per_second"] / b["per_second"], 3) if a and b and b.get("per_second") else None


def measure(root: Path, calls: int) -> dict[str, Any]:
    """The proxied stack, then the same stack with the proxy disabled (workers in the control plane)."""
    via = _on_stack(root, True, calls)
    direct = _on_stack(root, False, calls)
    return {
        "via_proxy": via,
        "direct_stack": direct,
        "unary_ratio": _ratio(via.get("unary"), direct.get("unary")),
        "callback_ratio": _ratio(via.get("callbacks_via_proxy"), via.get("callbacks_direct")),
    }
