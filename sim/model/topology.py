"""The model every backend runs: clusters, pods, workers and the virtual addresses between them.

A Topology is built once from a scenario's topology section and the merged values, then written to
the stack's state folder as JSON so every component process reads the same picture. Nothing here
does I/O beyond (de)serialising; addresses are virtual and are never dialed (see sim.model.netmap).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dns.rule import View, WildcardRule, dashed_ip
from sim.protocols.wire import (
    GRPC_SUFFIX,
    INVOCATION_HTTP_PORT,
    INVOCATION_SUFFIX,
    INVOCATION_TLS_PORT,
    PROXY_SERVICE_FQDN,
)

CONTROL_CLUSTER = "ncpsim-cp"

# The invocation Service's ClusterIP: one name and address in front of every invocation-service pod.
INVOCATION_SERVICE_FQDN = INVOCATION_SUFFIX
INVOCATION_SERVICE_IP = "10.43.0.20"

LB_POOL = "10.100.0.0/24"  # load-balancer addresses, reachable from every cluster
PROXY_LB_IP = "10.100.0.10"
BUS_LB_IP = "10.100.0.11"


@dataclass(frozen=True)
class Cluster:
    name: str
    kind: str  # "control" | "compute"
    pod_cidr: str
    service_cidr: str
    wildcard_dns: bool = True  # compute clusters: the *.<workerDomain> rewrite is installed

    @property
    def dns_ip(self) -> str:
        return str(ipaddress.ip_network(self.service_cidr).network_address + 10)


@dataclass(frozen=True)
class Pod:
    name: str  # e.g. "invocation-service-0"
    role: str  # "invocation" | "grpc-proxy"
    cluster: str
    ip: str

    @property
    def fqdn(self) -> str:
        suffix = INVOCATION_SUFFIX if self.role == "invocation" else GRPC_SUFFIX
        return f"{dashed_ip(self.ip)}.{suffix}"


@dataclass(frozen=True)
class WorkerSpec:
    name: str  # e.g. "worker-1-0"
    cluster: str
    worker_utils: str = "1.4.0"  # version of the worker-utils profile
    trust: str = "stack"  # "stack" (gets NVCF_PROXY_CA_PEM if configured) | "system" | "none"


@dataclass(frozen=True)
class Topology:
    stack: str
    worker_domain: str
    values: dict[str, Any]
    clusters: tuple[Cluster, ...]
    pods: tuple[Pod, ...]
    workers: tuple[WorkerSpec, ...] = ()
    proxy_lb_ip: str = PROXY_LB_IP
    bus_lb_ip: str = BUS_LB_IP
    seed: int = 0
    functions: tuple[str, ...] = field(default=("http-echo", "grpc-echo"))

    def cluster(self, name: str) -> Cluster:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)

    def pods_of(self, role: str) -> list[Pod]:
        return [p for p in self.pods if p.role == role]

    def pod_by_ip(self, ip: str) -> Pod | None:
        return next((p for p in self.pods if p.ip == ip), None)

    def workers_in(self, cluster: str) -> list[WorkerSpec]:
        return [w for w in self.workers if w.cluster == cluster]

    @property
    def compute_clusters(self) -> list[Cluster]:
        return [c for c in self.clusters if c.kind == "compute"]

    @property
    def proxy_enabled(self) -> bool:
        return bool(self.values.get("workerCallbackProxy", {}).get("enabled", True))

    def reachable_ranges(self, cluster: str) -> list[str]:
        """What a pod of `cluster` can route to: its own pod and service ranges and the LB pool."""
        c = self.cluster(cluster)
        return [c.pod_cidr, c.service_cidr, LB_POOL]

    def dns_views(self) -> dict[str, View]:
        """One DNS view per cluster: the control view knows pod names, compute views the rewrite."""
        views: dict[str, View] = {}
        for c in self.clusters:
            if c.kind == "control":
                hosts = tuple((p.fqdn, p.ip) for p in self.pods)
                hosts += ((PROXY_SERVICE_FQDN, self.proxy_lb_ip),
                          (INVOCATION_SERVICE_FQDN, INVOCATION_SERVICE_IP))
                views[c.name] = View(cluster=c.name, hosts=hosts)
            else:
                rule = WildcardRule(self.worker_domain, self.proxy_lb_ip) if c.wildcard_dns else None
                views[c.name] = View(cluster=c.name, wildcard=rule)
        return views

    def service_endpoints(self) -> dict[str, list[str]]:
        """Service address -> pod endpoints (network-map keys); connections to it spread over the pods."""
        pods = self.pods_of("invocation")
        if not pods:
            return {}
        return {f"{INVOCATION_SERVICE_IP}:{port}/tcp": [f"{p.ip}:{port}/tcp" for p in pods]
                for port in (INVOCATION_HTTP_PORT, INVOCATION_TLS_PORT)}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Topology:
        raw = json.loads(text)
        return cls(
            stack=raw["stack"],
            worker_domain=raw["worker_domain"],
            values=raw["values"],
            clusters=tuple(Cluster(**c) for c in raw["clusters"]),
            pods=tuple(Pod(**p) for p in raw["pods"]),
            workers=tuple(WorkerSpec(**w) for w in raw["workers"]),
            proxy_lb_ip=raw["proxy_lb_ip"],
            bus_lb_ip=raw["bus_lb_ip"],
            seed=raw["seed"],
            functions=tuple(raw["functions"]),
        )

    @classmethod
    def load(cls, state_dir: Path) -> Topology:
        return cls.from_json((state_dir / "topology.json").read_text())


@dataclass(frozen=True)
class ComputeSpec:
    """A compute cluster as a scenario asks for it."""

    workers: tuple[WorkerSpec, ...]
    wildcard_dns: bool = True


def build(
    stack: str,
    values: dict[str, Any],
    *,
    invocation_replicas: int = 2,
    grpc_replicas: int = 2,
    compute: tuple[ComputeSpec, ...] = (),
    control_workers: tuple[WorkerSpec, ...] = (),
    seed: int = 0,
) -> Topology:
    """Lay out addresses: control pods in 10.42/16, compute cluster N in 10.(42+10N)/16."""
    worker_domain = values["workerCallbackProxy"]["workerDomain"]
    clusters = [Cluster(CONTROL_CLUSTER, "control", "10.42.0.0/16", "10.43.0.0/16")]
    pods = [Pod(f"invocation-service-{i}", "invocation", CONTROL_CLUSTER, f"10.42.0.{11 + i}")
            for i in range(invocation_replicas)]
    pods += [Pod(f"grpc-proxy-{i}", "grpc-proxy", CONTROL_CLUSTER, f"10.42.0.{41 + i}")
             for i in range(grpc_replicas)]
    workers = [WorkerSpec(w.name, CONTROL_CLUSTER, w.worker_utils, w.trust) for w in control_workers]
    for n, spec in enumerate(compute, start=1):
        name = f"ncpsim-compute-{n}"
        second = 42 + 10 * n
        clusters.append(Cluster(name, "compute", f"10.{second}.0.0/16", f"10.{second + 1}.0.0/16",
                                wildcard_dns=spec.wildcard_dns))
        workers += [WorkerSpec(w.name, name, w.worker_utils, w.trust) for w in spec.workers]
    return Topology(stack=stack, worker_domain=worker_domain, values=values, clusters=tuple(clusters),
                    pods=tuple(pods), workers=tuple(workers), seed=seed)
