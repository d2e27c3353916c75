"""A compute cluster's manifests: function workers, the selectorless Service that stands for the control
plane's load-balanced NATS, and the cluster's DNS records (``*.<workerDomain>`` by default) for CoreDNS.

The compute cluster holds no Service for the proxy: workers reach it at the address its records answer,
as the seed's step 2 has it, and a rewrite to ``worker-callback-proxy.nvcf.svc.cluster.local`` finds no
such name there unless a record makes it (as on the local backend). `ncpsim dns-rewrite` creates one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from clusters.render import kube, standin
from clusters.render.control_plane import PROXY_PORTS, CertMaterial, proxy_ca_pem, shared_config
from clusters.render.layout import BUS_NAME, PROXY_NAME, STANDIN_IMAGE
from dns.coredns import render_coredns_custom
from sim.model.parts import Cluster
from sim.model.topology import Topology
from sim.wire import NAMESPACE, NATS_PORT, PROXY_SERVICE_FQDN

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


def coredns_rewrite(topology: Topology, cluster: Cluster, proxy_address: str | None = None) -> Json | None:
    """kube-system/coredns-custom from the very records the local resolver answers this cluster with, the
    proxy's address as k3d gives it (`proxy_address`, default the virtual one); None when the cluster has
    no records (then *.<workerDomain> does not resolve)."""
    records = topology.dns_views()[cluster.name].records
    if not records:
        return None
    if cluster.kind == "control":  # the proxy Service is this cluster's own: its name, whatever its type
        return render_coredns_custom(records, {topology.proxy_ip: PROXY_SERVICE_FQDN})
    real = proxy_address or topology.proxy_ip
    return render_coredns_custom(
        [replace(r, target=real) if r.target == topology.proxy_ip else r for r in records]
    )


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
    rewrite = coredns_rewrite(topology, cluster, proxy_address)
    return [
        *shared_config(topology, material),
        *bus_service(bus_address),
        *([rewrite] if rewrite else []),
        *(standin.worker_deployment(topology, w, pem, image) for w in topology.workers_in(cluster.name)),
    ]
