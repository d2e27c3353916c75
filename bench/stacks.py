"""Stacks the benchmark brings up: topologies built with sim.model.topology.build, run on the local backend.

Every stack lives under the benchmark's own temporary state root with a unique name, and is stopped
when its `with` block ends, however it ends. The benchmark is a host tool like curl or dig: it reads
real loopback ports from the stack's network map and never dials a virtual 10.x address.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.local import LocalStack
from sim.errors import BackendError
from sim.model.netmap import LOOPBACK, NetMap
from sim.model.parts import CONTROL_CLUSTER, Pod, WorkerSpec
from sim.model.topology import ComputeSpec, Topology, build
from sim.model.values import DEFAULTS, deep_merge
from sim.model.values_check import check
from sim.wire import INVOCATION_HTTP_PORT, INVOCATION_TLS_PORT, PROXY_HTTP_PORT

WORKER_DOMAIN = "grpc-worker.example.com"
_serial = itertools.count(1)

# The catalogue's http-callback values: proxy on, stack-CA frontend, workers given the CA as
# NVCF_PROXY_CA_PEM; the worker's "system roots" are the public-style CA.
BENCH_VALUES: dict[str, Any] = {
    # Seed step 1: enable the proxy and expose it to the compute clusters (the stack's defaults do neither).
    "workerCallbackProxy": {
        "enabled": True,
        "workerDomain": WORKER_DOMAIN,
        "service": {"type": "LoadBalancer"},
    },
    "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}},
}


def unique_name(kind: str) -> str:
    """A stack name no other run on this machine uses (the pid keeps concurrent benches apart)."""
    return f"bench-{os.getpid()}-{next(_serial)}-{kind}"[:40]


def topology(
    name: str,
    *,
    invocation: int = 1,
    grpc: int = 0,
    clusters: int = 1,
    workers_per_cluster: int = 0,
    proxy: bool = True,
) -> Topology:
    """Without the proxy (a single-cluster install) the workers live in the control-plane cluster and
    call the pods directly; `clusters` is then ignored."""
    values = deep_merge(DEFAULTS, BENCH_VALUES)
    values["workerCallbackProxy"]["enabled"] = proxy
    check(values)

    def workers(n: int) -> tuple[WorkerSpec, ...]:
        return tuple(WorkerSpec(f"worker-{n}-{i}", "", trust="system") for i in range(workers_per_cluster))

    compute = tuple(ComputeSpec(workers=workers(n)) for n in range(1, clusters + 1)) if proxy else ()
    return build(
        name,
        values,
        invocation_replicas=invocation,
        grpc_replicas=grpc,
        compute=compute,
        control_workers=() if proxy else workers(0),
        seed=7,
    )


@dataclass
class BenchStack:
    stack: LocalStack
    topology: Topology
    status: dict[str, Any]

    @property
    def state_dir(self) -> Path:
        return self.stack.state_dir

    @property
    def stack_ca(self) -> Path:
        return self.state_dir / "certs" / "ca" / "stack" / "ca.crt"

    def secret(self, name: str) -> Path:
        return self.state_dir / "certs" / "secrets" / name

    def bindings(self) -> dict[str, int]:
        return json.loads((self.state_dir / "netmap.json").read_text())["bindings"]

    def real(self, ip: str, port: int, proto: str = "tcp") -> tuple[str, int]:
        """The loopback address standing for a virtual ip:port, as the control plane reaches it (a Service
        such as the NATS load balancer answers on one of its endpoints)."""
        netmap = NetMap(**json.loads((self.state_dir / "netmap.json").read_text()))
        bound = netmap.bindings.get(f"{ip}:{port}/{proto}")  # a component's own address, any cluster's
        return (LOOPBACK, bound) if bound else netmap.lookup(CONTROL_CLUSTER, ip, port, proto)

    def proxy_http(self) -> tuple[str, int]:
        return self.real(self.topology.proxy_lb_ip, PROXY_HTTP_PORT)

    def pod_tls(self, pod: Pod) -> tuple[str, int]:
        return self.real(pod.ip, INVOCATION_TLS_PORT)

    def pod_http(self, pod: Pod) -> tuple[str, int]:
        return self.real(pod.ip, INVOCATION_HTTP_PORT)

    def pids(self) -> list[int]:
        return list(self.stack.launcher.running().values())

    def component_pid(self, name: str) -> int:
        return self.stack.launcher.running()[name]


@contextlib.contextmanager
def running(root: Path, topo: Topology) -> Iterator[BenchStack]:
    """Bring `topo` up under `root`; stop every process of it when the block ends."""
    stack = LocalStack(topo.stack, root=root)
    try:
        status = stack.up(topo, "bench").status()
        if status is None:  # up writes it once every component is ready
            raise BackendError(f"{stack.state_dir}: no status after up")
        yield BenchStack(stack, topo, status)
    finally:
        stack.down()
