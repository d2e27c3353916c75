"""k3d cluster configs (``k3d.io/v1alpha5``, ``kind: Simple``), one per Topology cluster.

Every cluster joins one Docker network that ncpsim manages, so a compute cluster's pods reach the
control plane's load-balancer addresses (its node IPs on that network) and nothing else of it. Each
cluster gets the pod and service ranges the Topology gave it, so pod IPs stay unambiguous across
clusters, exactly as in the local backend's virtual network.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from clusters.render.layout import CLUSTER_TIMEOUT, H3_HOST_PORT, HTTP_HOST_PORT, K3S_IMAGE, NETWORK
from sim.model.parts import Cluster
from sim.model.topology import Topology
from sim.wire import PROXY_H3_PORT, PROXY_HTTP_PORT

Json = dict[str, Any]
SERVERS = ["server:*"]


def _arg(text: str) -> Json:
    return {"arg": text, "nodeFilters": SERVERS}


def k3s_args(cluster: Cluster) -> list[Json]:
    dns_ip = str(ipaddress.ip_network(cluster.service_cidr).network_address + 10)
    return [
        _arg(f"--cluster-cidr={cluster.pod_cidr}"),
        _arg(f"--service-cidr={cluster.service_cidr}"),
        _arg(f"--cluster-dns={dns_ip}"),  # the Topology's DNS address for this cluster
        # Traefik would claim the load balancer's 80/443; ncpsim publishes only the proxy.
        _arg("--disable=traefik"),
    ]


def proxy_ports(http_host_port: int = HTTP_HOST_PORT, h3_host_port: int = H3_HOST_PORT) -> list[Json]:
    """The proxy's TCP 10084 and UDP 443 on the k3d load balancer, so curl and openssl on the
    laptop reach the same Envoy the compute clusters do."""
    return [
        {"port": f"{http_host_port}:{PROXY_HTTP_PORT}/tcp", "nodeFilters": ["loadbalancer"]},
        {"port": f"{h3_host_port}:{PROXY_H3_PORT}/udp", "nodeFilters": ["loadbalancer"]},
    ]


def k3d_config(cluster: Cluster, stack: str, *, network: str = NETWORK, image: str = K3S_IMAGE) -> Json:
    config: Json = {
        "apiVersion": "k3d.io/v1alpha5",
        "kind": "Simple",
        "metadata": {"name": cluster.name},
        "servers": 1,
        "agents": 0,
        "image": image,
        "network": network,
        "kubeAPI": {"hostIP": "127.0.0.1"},  # a free host port is picked; never exposed beyond loopback
        "options": {
            "k3d": {"wait": True, "timeout": CLUSTER_TIMEOUT},
            "k3s": {"extraArgs": k3s_args(cluster)},
            # Add the context, never switch to it: the user's current context stays theirs.
            "kubeconfig": {"updateDefaultKubeconfig": True, "switchCurrentContext": False},
            "runtime": {"labels": [{"label": f"io.ncpsim.stack={stack}", "nodeFilters": SERVERS}]},
        },
    }
    if cluster.kind == "control":
        config["ports"] = proxy_ports()
    return config


def k3d_configs(topology: Topology, *, network: str = NETWORK) -> dict[str, Json]:
    """Cluster name -> config, control plane first (compute clusters point at it)."""
    return {c.name: k3d_config(c, topology.stack, network=network) for c in topology.clusters}
