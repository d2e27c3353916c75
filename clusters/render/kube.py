"""Small constructors for the Kubernetes objects the k3d backend applies: plain dicts that pass
kubernetes-validate's strict schemas."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

Json = dict[str, Any]

PART_OF = {"app.kubernetes.io/part-of": "ncpsim", "app.kubernetes.io/managed-by": "ncpsim"}


def labels(app: str, component: str) -> dict[str, str]:
    return {"app": app, "app.kubernetes.io/component": component, **PART_OF}


def meta(name: str, namespace: str | None = None, extra: dict[str, str] | None = None) -> Json:
    out: Json = {"name": name, "labels": {**PART_OF, **(extra or {})}}
    if namespace:
        out["namespace"] = namespace
    return out


def namespace(name: str) -> Json:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta(name)}


def config_map(name: str, ns: str, data: dict[str, str]) -> Json:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name, ns), "data": data}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def tls_secret(name: str, ns: str, crt: bytes, key: bytes, ca: bytes) -> Json:
    """A kubernetes.io/tls Secret with ca.crt beside the pair, as cert-manager writes it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": meta(name, ns),
        "data": {"tls.crt": _b64(crt), "tls.key": _b64(key), "ca.crt": _b64(ca)},
    }


def port(name: str, number: int, protocol: str = "TCP") -> Json:
    return {"name": name, "port": number, "targetPort": number, "protocol": protocol}


def service(
    name: str,
    ns: str,
    ports: list[Json],
    selector: dict[str, str] | None,
    *,
    kind: str = "ClusterIP",
    headless: bool = False,
) -> Json:
    spec: Json = {"type": kind, "ports": ports}
    if selector is not None:
        spec["selector"] = selector
    if headless:
        # Headless: CoreDNS answers <dashed-pod-ip>.<service>.<ns>.svc.cluster.local for each ready
        # pod, the pod names the proxy forwards to.
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = False
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ns), "spec": spec}


def endpoints(name: str, ns: str, ip: str, ports: list[Json]) -> Json:
    """Endpoints for a selectorless Service of the same name (ports carry no targetPort here)."""
    subset_ports = [{"name": p["name"], "port": p["port"], "protocol": p["protocol"]} for p in ports]
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": meta(name, ns),
        "subsets": [{"addresses": [{"ip": ip}], "ports": subset_ports}],
    }


def checksum(*parts: Any) -> str:
    """For pod-template annotations: a changed config rolls the Deployment on apply."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def deployment(
    name: str,
    ns: str,
    replicas: int,
    pod_labels: dict[str, str],
    spec: Json,
    annotations: dict[str, str] | None = None,
) -> Json:
    template_meta: Json = {"labels": pod_labels}
    if annotations:
        template_meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(name, ns, {"app": pod_labels["app"]}),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": pod_labels["app"]}},
            "template": {"metadata": template_meta, "spec": spec},
        },
    }


def env_value(name: str, value: str) -> Json:
    return {"name": name, "value": value}


def env_field(name: str, path: str) -> Json:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def secret_volume(name: str, secret: str, keys: tuple[str, ...] | None = None) -> Json:
    source: Json = {"secretName": secret}
    if keys:
        source["items"] = [{"key": k, "path": k} for k in keys]
    return {"name": name, "secret": source}


def config_map_volume(name: str, config: str, items: dict[str, str] | None = None) -> Json:
    source: Json = {"name": config}
    if items:
        source["items"] = [{"key": k, "path": p} for k, p in items.items()]
    return {"name": name, "configMap": source}


def mount(name: str, path: str, read_only: bool = True) -> Json:
    return {"name": name, "mountPath": path, "readOnly": read_only}
