"""The control-plane cluster's manifests (namespace ``nvcf``): stand-in pods, their headless Services,
the certificate Secrets, and the worker callback proxy (Envoy) behind a LoadBalancer Service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from certs.profiles import GRPC_SECRET, INVOCATION_SECRET
from clusters.render import kube, standin
from clusters.render.envoy import render_envoy
from clusters.render.envoy_base import CONFIG_DIR, FRONTEND_DIR, GRPC_CA_DIR, INVOCATION_CA_DIR
from clusters.render.layout import (
    CAS_CONFIGMAP,
    ENVOY_CONFIGMAP,
    GRPC_SERVICE,
    INVOCATION_SERVICE,
    PROXY_NAME,
    STANDIN_IMAGE,
    TOPOLOGY_CONFIGMAP,
    TOPOLOGY_FILE,
)
from clusters.render.nats import nats_manifests
from clusters.render.text import dump
from sim.model.parts import CONTROL_CLUSTER
from sim.model.topology import Topology
from sim.model.values import proxy_settings
from sim.proxy.component import policy_from_values
from sim.wire import NAMESPACE, PROXY_H3_PORT, PROXY_HTTP_PORT

Json = dict[str, Any]
STACK_CA_MARKER = "@stack-ca"  # scenarios write this for "the stack CA's PEM" (see sim.worker.host)


@dataclass(frozen=True)
class CertMaterial:
    """What certs.CertStore holds, read once by the backend: Secret name -> (tls.crt, tls.key, ca.crt)."""

    secrets: dict[str, tuple[bytes, bytes, bytes]]
    stack_ca: bytes
    public_ca: bytes


def proxy_ca_pem(topology: Topology, material: CertMaterial) -> str:
    """NVCF_PROXY_CA_PEM as NVCA would hand it to new function pods (empty when not configured)."""
    agent = topology.values.get("global", {}).get("nvcaOperator", {}).get("agent", {})
    pem = str(agent.get("workerCallbackCaPem") or "")
    return material.stack_ca.decode() if pem.strip() == STACK_CA_MARKER else pem


def shared_config(topology: Topology, material: CertMaterial) -> list[Json]:
    """The namespace and the ConfigMaps every cluster's stand-in pods read."""
    return [
        kube.namespace(NAMESPACE),
        kube.config_map(TOPOLOGY_CONFIGMAP, NAMESPACE, {TOPOLOGY_FILE: topology.to_json()}),
        kube.config_map(
            CAS_CONFIGMAP,
            NAMESPACE,
            {"stack.crt": material.stack_ca.decode(), "public.crt": material.public_ca.decode()},
        ),
    ]


def secrets(material: CertMaterial) -> list[Json]:
    return [kube.tls_secret(name, NAMESPACE, *parts) for name, parts in sorted(material.secrets.items())]


def pod_services() -> list[Json]:
    return [
        kube.service(
            INVOCATION_SERVICE,
            NAMESPACE,
            standin.INVOCATION_PORTS,
            {"app": "invocation-service"},
            headless=True,
        ),
        kube.service(
            GRPC_SERVICE, NAMESPACE, standin.GRPC_PORTS, {"app": "grpc-proxy-deployment"}, headless=True
        ),
    ]


PROXY_PORTS = [kube.port("http", PROXY_HTTP_PORT), kube.port("h3", PROXY_H3_PORT, "UDP")]


def envoy_config_map(topology: Topology) -> Json:
    config = render_envoy(policy_from_values(topology.values), topology.worker_domain)
    data = {"envoy.yaml": dump(config.bootstrap)}
    data.update({f"sds-{name}": dump(body) for name, body in config.sds.items()})
    return kube.config_map(ENVOY_CONFIGMAP, NAMESPACE, data)


def proxy_deployment(topology: Topology, config_map: Json) -> Json:
    settings = proxy_settings(topology.values)
    image = topology.values["workerCallbackProxy"]["image"]
    items = {
        key: (f"sds/{key[len('sds-') :]}" if key.startswith("sds-") else key) for key in config_map["data"]
    }
    volumes = [
        kube.config_map_volume("config", ENVOY_CONFIGMAP, items),
        # Only what Envoy needs from each Secret: the frontend pair, and the pods' CA (never their keys).
        kube.secret_volume("frontend", settings.frontend_secret, ("tls.crt", "tls.key")),
        kube.secret_volume("invocation-ca", INVOCATION_SECRET, ("ca.crt",)),
        kube.secret_volume("grpc-ca", GRPC_SECRET, ("ca.crt",)),
    ]
    mounts = [
        kube.mount("config", CONFIG_DIR),
        kube.mount("frontend", FRONTEND_DIR),
        kube.mount("invocation-ca", INVOCATION_CA_DIR),
        kube.mount("grpc-ca", GRPC_CA_DIR),
    ]
    container = {
        "name": "envoy",
        "image": f"{image['registry']}/{image['repository']}:{image['tag']}",
        "imagePullPolicy": "IfNotPresent",
        "command": ["envoy"],
        "args": ["-c", f"{CONFIG_DIR}/envoy.yaml", "--log-level", "info"],
        "ports": [
            {"name": p["name"], "containerPort": p["port"], "protocol": p["protocol"]} for p in PROXY_PORTS
        ],
        "readinessProbe": {"tcpSocket": {"port": PROXY_HTTP_PORT}, "periodSeconds": 2},
        "volumeMounts": mounts,
    }
    spec = {"containers": [container], "volumes": volumes, "terminationGracePeriodSeconds": 5}
    # The config is static for a Deployment's life: a changed policy rolls the pods; Secrets reload in place.
    annotations = {"ncpsim.io/envoy-config-checksum": kube.checksum(config_map["data"])}
    return kube.deployment(
        PROXY_NAME, NAMESPACE, 1, kube.labels(PROXY_NAME, "worker-callback-proxy"), spec, annotations
    )


def proxy_manifests(topology: Topology) -> list[Json]:
    if not topology.proxy_enabled:
        return []
    config_map = envoy_config_map(topology)
    service_type = topology.values["workerCallbackProxy"]["service"]["type"]
    service = kube.service(PROXY_NAME, NAMESPACE, PROXY_PORTS, {"app": PROXY_NAME}, kind=service_type)
    return [config_map, proxy_deployment(topology, config_map), service]


def control_plane_manifests(
    topology: Topology, material: CertMaterial, image: str = STANDIN_IMAGE
) -> list[Json]:
    """Everything applied to ncpsim-cp, in apply order (namespace first)."""
    pem = proxy_ca_pem(topology, material)
    workers = [
        standin.worker_deployment(topology, w, pem, image) for w in topology.workers_in(CONTROL_CLUSTER)
    ]
    return [
        *shared_config(topology, material),
        *secrets(material),
        *nats_manifests(topology, CONTROL_CLUSTER, image),  # nats-server, its LoadBalancer, the callout
        standin.invocation_deployment(topology, CONTROL_CLUSTER, image),
        standin.grpc_deployment(topology, CONTROL_CLUSTER, image),
        *pod_services(),
        *proxy_manifests(topology),
        *workers,
    ]
