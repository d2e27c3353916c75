"""Every file the k3d backend applies, as text: k3d configs, one manifest stream per cluster, and the
Envoy config on its own for reading. `ncpsim render --backend k3d` writes exactly this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clusters.render.compute import compute_manifests, coredns_rewrite
from clusters.render.control_plane import CertMaterial, control_plane_manifests
from clusters.render.envoy import render_envoy
from clusters.render.k3d_config import k3d_configs
from clusters.render.layout import STANDIN_IMAGE
from clusters.render.text import dump, dump_all
from sim.model.topology import Topology
from sim.proxy.component import policy_from_values

Json = dict[str, Any]


@dataclass(frozen=True)
class RenderedFile:
    text: str
    private: bool = False  # holds private keys: written owner-only


@dataclass(frozen=True)
class Addresses:
    """The control plane's load-balancer IPs on the shared network, as compute clusters reach them.

    Unknown until the control plane is up; a render without a live cluster uses the Topology's
    virtual addresses so the files are complete and valid."""

    proxy: str
    bus: str

    @classmethod
    def virtual(cls, topology: Topology) -> Addresses:
        return cls(proxy=topology.proxy_lb_ip, bus=topology.bus_lb_ip)


def manifests_by_cluster(
    topology: Topology, material: CertMaterial, addresses: Addresses, image: str = STANDIN_IMAGE
) -> dict[str, list[Json]]:
    out = {}
    for cluster in topology.clusters:
        if cluster.kind == "control":
            # A single cluster with the proxy enabled publishes *.<workerDomain> in its own CoreDNS (seed step 2).
            rewrite = coredns_rewrite(topology, cluster, addresses.proxy)
            out[cluster.name] = control_plane_manifests(topology, material, image) + (
                [rewrite] if rewrite else []
            )
        else:
            out[cluster.name] = compute_manifests(
                topology, cluster, material, addresses.proxy, addresses.bus, image
            )
    return out


def k3d_config_path(cluster: str) -> str:
    return f"k3d/{cluster}.yaml"


def manifest_path(cluster: str) -> str:
    return f"manifests/{cluster}.yaml"


def render_bundle(
    topology: Topology, material: CertMaterial, addresses: Addresses | None = None, image: str = STANDIN_IMAGE
) -> dict[str, RenderedFile]:
    """Relative path -> file, for every cluster of the Topology."""
    addresses = addresses or Addresses.virtual(topology)
    files = {
        k3d_config_path(name): RenderedFile(dump(config)) for name, config in k3d_configs(topology).items()
    }
    for name, objects in manifests_by_cluster(topology, material, addresses, image).items():
        files[manifest_path(name)] = RenderedFile(dump_all(objects), private=True)  # Secrets inside
    envoy = render_envoy(policy_from_values(topology.values), topology.worker_domain)
    files["envoy/envoy.yaml"] = RenderedFile(dump(envoy.bootstrap))
    for name, body in envoy.sds.items():
        files[f"envoy/sds/{name}"] = RenderedFile(dump(body))
    return files
