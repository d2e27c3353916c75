"""The model every backend runs: clusters, pods, workers and the virtual addresses between them.

A Topology is built once from a scenario's topology section and the merged values, then written to
the stack's state folder as JSON so every component process reads the same picture. Nothing here
does I/O beyond (de)serialising; addresses are virtual and are never dialed (see sim.model.netmap).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dns.rule import DnsRecord, View, wildcard
from sim.errors import ConfigError
from sim.model.parts import (
    BUS_LB_IP,
    CONTROL_CLUSTER,
    CONTROL_NODE_IP,
    INVOCATION_SERVICE_FQDN,
    INVOCATION_SERVICE_IP,
    LB_POOL,
    NATS_POD_RANGE,
    NATS_ROLE,
    NO_REWRITE,
    NODE_POOL,
    NODE_PORTS,
    PROXY_CLUSTER_IP,
    PROXY_LB_IP,
    ApiService,
    Cluster,
    DnsRewrite,
    NatsServer,
    Pod,
    SecretSpec,
    WorkerSpec,
    api_from_webhook,
)
from sim.model.values import CA_MARKERS, nats_replicas
from sim.wire import (
    INVOCATION_HTTP_PORT,
    INVOCATION_TLS_PORT,
    NATS_MONITOR_PORT,
    NATS_PORT,
    NATS_ROUTE_PORT,
    PROXY_SERVICE_FQDN,
)


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
    # The stack's own randomness, from the OS when the stack is created (clusters.certificates): every NATS
    # key and the API's token key derive from it, never from the seed a scenario publishes.
    secret: str = ""
    functions: tuple[str, ...] = field(default=("http-echo", "grpc-echo"))
    secrets: tuple[SecretSpec, ...] = ()

    def cluster(self, name: str) -> Cluster:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)

    def with_workers_redeployed(self) -> Topology:
        """The function pods created anew: each gets the values as they are now (NVCF_PROXY_CA_PEM with
        them); the worker-utils image stays what it was."""
        return replace(self, workers=tuple(replace(w, created_before_pem=False) for w in self.workers))

    def pods_of(self, role: str) -> list[Pod]:
        return [p for p in self.pods if p.role == role]

    def pod_by_ip(self, ip: str) -> Pod | None:
        return next((p for p in self.pods if p.ip == ip), None)

    @property
    def nats_servers(self) -> tuple[NatsServer, ...]:
        """The nats StatefulSet's pods, as many as nats.config.cluster says (one without clustering)."""
        return tuple(
            NatsServer(f"nats-{i}", i, f"{NATS_POD_RANGE}{10 + i}") for i in range(nats_replicas(self.values))
        )

    @property
    def api_service(self) -> ApiService:
        """Where the NVCF API runs: `api.namespace` and `api.service.{name, port}` when the values set them;
        else where the token webhook URL points, if that is another in-cluster Service on the webhook's path
        (the seed: "if the API runs elsewhere, set the URL to it"; the bundle cannot show where it runs, so
        ncpsim takes the URL at its word and diagnose says so); else the chart's api.nvcf:8080."""
        api = self.values.get("api") or {}
        service = api.get("service") or {}
        chart = ApiService("api", "nvcf", 8080)
        said = ApiService(
            str(service.get("name") or chart.name),
            str(api.get("namespace") or chart.namespace),
            int(service.get("port") or chart.port),
        )
        return (api_from_webhook(self.values) or chart) if said == chart else said

    def nats_server(self, name: str) -> NatsServer:
        for server in self.nats_servers:
            if server.name == name:
                return server
        raise KeyError(name)

    def members(self, role: str) -> list[str]:
        """The pod names of a role, in ordinal order: invocation, grpc-proxy, or the nats StatefulSet."""
        if role == NATS_ROLE:
            return [s.name for s in self.nats_servers]
        return [p.name for p in self.pods_of(role)]

    def workers_in(self, cluster: str) -> list[WorkerSpec]:
        return [w for w in self.workers if w.cluster == cluster]

    @property
    def compute_clusters(self) -> list[Cluster]:
        return [c for c in self.clusters if c.kind == "compute"]

    @property
    def proxy_enabled(self) -> bool:
        return bool(self.values.get("workerCallbackProxy", {}).get("enabled", True))

    @property
    def proxy_service_type(self) -> str:
        """workerCallbackProxy.service.type: decides where the proxy answers and who can route there."""
        service = self.values.get("workerCallbackProxy", {}).get("service") or {}
        return str(service.get("type") or "LoadBalancer")

    @property
    def proxy_ip(self) -> str:
        """Where the proxy Service answers, by service.type: its load-balancer address, its ClusterIP
        (routable only inside the control plane), or the control plane's node address."""
        return {"ClusterIP": PROXY_CLUSTER_IP, "NodePort": CONTROL_NODE_IP}.get(
            self.proxy_service_type, self.proxy_lb_ip
        )

    def proxy_addresses(self, service_port: int) -> list[tuple[str, int]]:
        """Virtual (ip, port)s at which the proxy's Service port (10084/tcp, 443/udp) answers; the first is
        what the proxy's DNS rewrite points at. A NodePort Service also keeps its ClusterIP."""
        if self.proxy_service_type == "NodePort":
            return [(CONTROL_NODE_IP, NODE_PORTS[service_port]), (PROXY_CLUSTER_IP, service_port)]
        return [(self.proxy_ip, service_port)]

    def reachable_ranges(self, cluster: str) -> list[str]:
        """What a pod of `cluster` can route to: its own pod and service ranges, the LB pool, the nodes."""
        c = self.cluster(cluster)
        return [c.pod_cidr, c.service_cidr, LB_POOL, NODE_POOL]

    def dns_views(self) -> dict[str, View]:
        """One DNS view per cluster: the control view knows pod names, every view its cluster's records."""
        views: dict[str, View] = {}
        for c in self.clusters:
            hosts: tuple[tuple[str, str], ...] = ()
            if c.kind == "control":
                hosts = tuple((p.fqdn, p.ip) for p in self.pods)
                # In cluster the Service name answers its ClusterIP (a NodePort Service has one too); the
                # simulation keeps the LB address for LoadBalancer, where both reach the same proxy.
                service_ip = (
                    self.proxy_lb_ip if self.proxy_service_type == "LoadBalancer" else PROXY_CLUSTER_IP
                )
                hosts += ((PROXY_SERVICE_FQDN, service_ip), (INVOCATION_SERVICE_FQDN, INVOCATION_SERVICE_IP))
                hosts += ((self.api_service.fqdn, self.api_service.ip),)  # the NVCF API, where it runs
            views[c.name] = View(cluster=c.name, hosts=hosts, records=c.dns_records)
        return views

    def service_endpoints(self) -> dict[str, list[str]]:
        """Service address -> pod endpoints (network-map keys); connections to it spread over the pods. The
        NATS load balancer fronts every server of the StatefulSet (client and monitor ports)."""
        services = {
            f"{self.bus_lb_ip}:{port}/tcp": [s.address(port) for s in self.nats_servers]
            for port in (NATS_PORT, NATS_MONITOR_PORT)
        }
        pods = self.pods_of("invocation")
        services.update(
            {
                f"{INVOCATION_SERVICE_IP}:{port}/tcp": [f"{p.ip}:{port}/tcp" for p in pods]
                for port in (INVOCATION_HTTP_PORT, INVOCATION_TLS_PORT)
                if pods
            }
        )
        return services

    def reserved_addresses(self) -> list[str]:
        """Addresses peers dial before their owner runs, so their real ports are chosen before any component
        starts: each NATS server's route port (every server's config lists all of them, as the chart's
        routes list every pod of the StatefulSet)."""
        if len(self.nats_servers) < 2:
            return []
        return [s.address(NATS_ROUTE_PORT) for s in self.nats_servers]

    def with_ca_pem(self, pem_of: Callable[[str], str]) -> Topology:
        """The values as applied: a workerCallbackCaPem marker replaced by that CA's PEM text now, once.

        Worker pods read the text, never the CA file, so a CA rotated after this keeps the old PEM in
        every worker pod created later, until the values are applied again (as in the field).
        """
        pem = (
            self.values.get("global", {}).get("nvcaOperator", {}).get("agent", {}).get("workerCallbackCaPem")
        )
        if not isinstance(pem, str) or not pem.strip().startswith("@"):
            return self
        issuer = CA_MARKERS.get(pem.strip())
        if issuer is None:
            raise ConfigError(
                f"global.nvcaOperator.agent.workerCallbackCaPem: unknown marker {pem.strip()!r}; "
                f"paste PEM text or use one of {', '.join(CA_MARKERS)}"
            )
        agent = {**self.values["global"]["nvcaOperator"]["agent"], "workerCallbackCaPem": pem_of(issuer)}
        nvca = {**self.values["global"]["nvcaOperator"], "agent": agent}
        values = {**self.values, "global": {**self.values["global"], "nvcaOperator": nvca}}
        return replace(self, values=values)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Topology:
        raw = json.loads(text)
        return cls(
            stack=raw["stack"],
            worker_domain=raw["worker_domain"],
            values=raw["values"],
            clusters=tuple(_cluster(c) for c in raw["clusters"]),
            pods=tuple(Pod(**p) for p in raw["pods"]),
            workers=tuple(WorkerSpec(**w) for w in raw["workers"]),
            proxy_lb_ip=raw["proxy_lb_ip"],
            bus_lb_ip=raw["bus_lb_ip"],
            seed=raw["seed"],
            secret=str(raw.get("secret", "")),  # a topology.json from before the field: its stack's keys
            functions=tuple(raw["functions"]),
            secrets=tuple(SecretSpec(**{**s, "names": tuple(s["names"])}) for s in raw.get("secrets", ())),
        )

    @classmethod
    def load(cls, state_dir: Path) -> Topology:
        return cls.from_json((state_dir / "topology.json").read_text())


def _cluster(raw: dict[str, Any]) -> Cluster:
    fields = dict(raw)
    records = tuple(DnsRecord(**r) for r in fields.pop("dns_records", ()))
    # A state folder written before dnsRecords held one rewrite as (domain, IPv4): read it as that record.
    domain, target = fields.pop("rewrite_domain", ""), fields.pop("rewrite_target", "")
    if target:
        records = (wildcard(domain, target), *records)
    return Cluster(**fields, dns_records=records)


@dataclass(frozen=True)
class ComputeSpec:
    """A compute cluster as a scenario asks for it."""

    workers: tuple[WorkerSpec, ...]
    # default: *.<workerDomain> -> the proxy's address (seed step 2); DnsRewrite is frozen, safe to share
    rewrite: DnsRewrite | None = DnsRewrite()  # noqa: RUF009
    records: tuple[DnsRecord, ...] = ()  # after the rewrite, as the customer wrote them


def _records(
    rule: DnsRewrite | None, records: tuple[DnsRecord, ...], worker_domain: str, proxy_ip: str
) -> tuple[DnsRecord, ...]:
    """A cluster's DNS: its `dnsRewrite` (none for None or target none), then its own records, each
    "proxy" target written as the proxy's address now."""
    written = list(records)
    if rule is not None and rule.target != NO_REWRITE:
        domain = rule.domain or worker_domain
        try:  # refused here, in one line, rather than by the resolver process later
            written.insert(0, wildcard(domain, rule.target))
        except ValueError as exc:
            raise ConfigError(
                f"topology dnsRewrite {{domain: {domain}, target: {rule.target}}}: {exc}"
            ) from None
    return tuple(record.pointing_at(proxy_ip) for record in written)


def build(
    stack: str,
    values: dict[str, Any],
    *,
    invocation_replicas: int = 2,
    grpc_replicas: int = 2,
    compute: tuple[ComputeSpec, ...] = (),
    control_workers: tuple[WorkerSpec, ...] = (),
    control_rewrite: DnsRewrite | None = None,
    control_records: tuple[DnsRecord, ...] = (),
    secrets: tuple[SecretSpec, ...] = (),
    seed: int = 0,
) -> Topology:
    """Lay out addresses: control pods in 10.42/16, compute cluster N in 10.(42+10N)/16.

    The control plane's DNS has no rewrite unless asked (a single cluster normally calls pods directly);
    each compute cluster's rewrite defaults to *.<workerDomain> -> the proxy's address.
    """
    worker_domain = values["workerCallbackProxy"]["workerDomain"]
    # A rewrite to "proxy" is written once with the Service's address now, as a DNS record would be: a
    # later service.type change gives the proxy a new address that the record does not follow.
    proxy_ip = Topology("", worker_domain, values, (), ()).proxy_ip
    control_dns = _records(control_rewrite, control_records, worker_domain, proxy_ip)
    clusters = [Cluster(CONTROL_CLUSTER, "control", "10.42.0.0/16", "10.43.0.0/16", control_dns)]
    pods = [
        Pod(f"invocation-service-{i}", "invocation", CONTROL_CLUSTER, f"10.42.0.{11 + i}")
        for i in range(invocation_replicas)
    ]
    pods += [
        Pod(f"grpc-proxy-{i}", "grpc-proxy", CONTROL_CLUSTER, f"10.42.0.{41 + i}")
        for i in range(grpc_replicas)
    ]
    workers = [replace(w, cluster=CONTROL_CLUSTER) for w in control_workers]
    for n, spec in enumerate(compute, start=1):
        name = f"ncpsim-compute-{n}"
        second = 42 + 10 * n
        dns = _records(spec.rewrite, spec.records, worker_domain, proxy_ip)
        clusters.append(Cluster(name, "compute", f"10.{second}.0.0/16", f"10.{second + 1}.0.0/16", dns))
        workers += [replace(w, cluster=name) for w in spec.workers]
    return Topology(
        stack=stack,
        worker_domain=worker_domain,
        values=values,
        clusters=tuple(clusters),
        pods=tuple(pods),
        workers=tuple(workers),
        seed=seed,
        secrets=secrets,
    )
