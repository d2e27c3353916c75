"""A compute cluster's manifests: function workers, the selectorless Services that stand for the
control plane's load-balanced proxy and NATS, and the CoreDNS rewrite for ``*.<workerDomain>``."""

from __future__ import annotations

from typing import Any

from clusters.render import kube, standin
from clusters.render.control_plane import PROXY_PORTS, CertMaterial, proxy_ca_pem, shared_config
from clusters.render.layout import BUS_NAME, PROXY_NAME, STANDIN_IMAGE
from dns.coredns import render_coredns_custom
from sim.model.topology import Cluster, Topology
from sim.protocols.wire import NAMESPACE, NATS_PORT, PROXY_SERVICE_FQDN

Json = dict[str, Any]


def proxy_service(address: str, name: str = PROXY_NAME, namespace: str = NAMESPACE) -> list[Json]:
    """A Service without a selector plus its Endpoints: the cluster's name for an address outside it
    (the control plane's proxy load balancer on the shared Docker network)."""
    return [
        kube.service(name, namespace, PROXY_PORTS, None),
        kube.endpoints(name, namespace, address, PROXY_PORTS),
    ]


def bus_service(address: str) -> list[Json]:
    ports = [kube.port("client", NATS_PORT)]
    return [
        kube.service(BUS_NAME, NAMESPACE, ports, None),
        kube.endpoints(BUS_NAME, NAMESPACE, address, ports),
    ]


def coredns_rewrite(topology: Topology, cluster: Cluster) -> Json | None:
    """kube-system/coredns-custom from the very WildcardRule the local resolver answers this cluster
    with; None when the scenario leaves the rewrite out (then *.<workerDomain> does not resolve)."""
    rule = topology.dns_views()[cluster.name].wildcard
    return render_coredns_custom(rule, PROXY_SERVICE_FQDN) if rule is not None else None


def compute_manifests(
    topology: Topology,
    cluster: Cluster,
    material: CertMaterial,
    proxy_address: str,
    bus_address: str,
    image: str = STANDIN_IMAGE,
) -> list[Json]:
    """Everything applied to one ncpsim-compute-N cluster, namespace first.

    `proxy_address` and `bus_address` are the control plane's load-balancer IPs on the shared
    network; `clusters.k3d` reads them from the live Services (render uses the Topology's).
    """
    pem = proxy_ca_pem(topology, material)
    rewrite = coredns_rewrite(topology, cluster)
    return [
        *shared_config(topology, material),
        *proxy_service(proxy_address),
        *bus_service(bus_address),
        *([rewrite] if rewrite else []),
        *(standin.worker_deployment(topology, w, pem, image) for w in topology.workers_in(cluster.name)),
    ]
