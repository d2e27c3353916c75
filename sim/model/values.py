"""The stack's environment file: defaults, overrides, validation and the proxy's effective settings.

Same shape as NVCF's ``environments/<env>.yaml``, so a customer's file can be replayed. Everything here
is pure except ``load_values_file``. Validation reports what a render of the real stack would refuse,
each problem with its key path and, when known, the file and line that set it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from certs.profiles import FRONTEND_SECRETS, PUBLIC, STACK

KeyPath = tuple[str | int, ...]  # str: mapping key, int: sequence index
Origin = Mapping[str, tuple[str, int | None]]  # key path -> (file or --set, line)

# The seed's default: the auth callout sends worker tokens to the NVCF API's in-cluster Service.
DEFAULT_WEBHOOK_URL = "http://api.nvcf.svc.cluster.local:8080/v2/nvcf/webhook/nats-auth"
INVOCATION_PROXY_PORT = 10084
# workerCallbackCaPem markers: a scenario cannot know a CA's PEM in advance, so it names the CA, and the
# PEM is pasted in when the values are applied (Topology.with_ca_pem), as a customer pastes it into the
# environment file.
CA_MARKERS = {"@stack-ca": "stack", "@public-ca": "public", "@private-ca": "private"}


def _annotated(**extra: Any) -> dict[str, Any]:
    return {"podAnnotations": {}, **extra}


# The stack's own defaults, from the seeds: the proxy is off until enabled (seed step 1 enables it and
# exposes it with `service.type: LoadBalancer`, so the chart's Service is a ClusterIP until then); upstream
# TLS on, CONNECT off, the frontend certificate from the stack's issuer, NKey worker auth. The seed names
# no workerDomain default; its example stays, because the simulation issues the frontend certificates
# for every stack (certs.profiles refuses an empty domain) and the render refuses an empty one anyway
# once the proxy is enabled.
DEFAULTS: dict[str, Any] = {
    "workerCallbackProxy": {
        "enabled": False,
        "workerDomain": "grpc-worker.example.com",
        "service": {"type": "ClusterIP"},
        "tls": {"frontend": {"certificate": {"issuerRef": None}, "existingSecret": None}},
        "invocation": {"upstreamTls": {"enabled": True}, "connect": {"enabled": False}},
        "image": {"registry": "docker.io", "repository": "envoyproxy/envoy", "tag": "v1.31-latest"},
    },
    "global": {
        "workerEndpoints": dict.fromkeys(
            ("invocationServiceURL", "grpcProxyWorkerConnectURL", "invocationProxyURL"), ""
        ),
        "nvcaOperator": {"agent": {"workerCallbackCaPem": ""}},
    },
    "grpcproxy": _annotated(workerConnectBaseURL=""),
    # workerTls.enabled: the pod's 8443 worker TLS listener. Unset (null), the stack decides it from the
    # proxy's upstream TLS; a customer's explicit value wins, and can leave the proxy dialing a closed port.
    "invocation": _annotated(env={"WORKER_STREAM_PROPERTIES__SELF_ADDRESS": ""}, workerTls={"enabled": None}),
    # nats.config.cluster: the nats chart's StatefulSet (upstream nats-io chart keys; NVCF's nats chart turns
    # clustering on, and the upstream default is three replicas, "2 or higher when jetstream is enabled").
    "nats": _annotated(
        workerAuth="nkey",
        authCallout={"workerTokenAuth": {"webhookUrl": DEFAULT_WEBHOOK_URL}},
        config={"cluster": {"enabled": True, "replicas": 3}},
    ),
    # Where the NVCF API runs (its release's namespace and its Service): ncpsim's keys for the customer's
    # world, as the public templates fix both (api.nvcf.svc.cluster.local, HTTP on 8080); the auth callout's
    # webhook URL must name it (nats.authCallout.workerTokenAuth.webhookUrl).
    "api": _annotated(namespace="nvcf", service={"name": "api", "port": 8080}),
    "nvctApi": _annotated(),
    "apikeys": _annotated(),
    "ess": _annotated(),
    "natsAuthCalloutService": _annotated(),
    "openbao": {"server": {"annotations": {}}},
    "adminIssuerProxy": {"enabled": True, "gateway": {"enabled": True}},
}

WCP = "workerCallbackProxy"
ENABLED: KeyPath = (WCP, "enabled")
WORKER_DOMAIN: KeyPath = (WCP, "workerDomain")
FRONTEND: KeyPath = (WCP, "tls", "frontend")
ISSUER_REF: KeyPath = (*FRONTEND, "certificate", "issuerRef")
EXISTING_SECRET: KeyPath = (*FRONTEND, "existingSecret")
PROXY_URL: KeyPath = ("global", "workerEndpoints", "invocationProxyURL")
CA_PEM: KeyPath = ("global", "nvcaOperator", "agent", "workerCallbackCaPem")
WORKER_AUTH: KeyPath = ("nats", "workerAuth")
WEBHOOK_URL: KeyPath = ("nats", "authCallout", "workerTokenAuth", "webhookUrl")
NATS_CLUSTER: KeyPath = ("nats", "config", "cluster", "enabled")
NATS_REPLICAS: KeyPath = ("nats", "config", "cluster", "replicas")
NATS_MAX_REPLICAS = 5  # what ncpsim runs on a laptop; the field's clusters are 3 (or 5)
UPSTREAM_TLS: KeyPath = (WCP, "invocation", "upstreamTls", "enabled")
POD_WORKER_TLS: KeyPath = ("invocation", "workerTls", "enabled")
SPLIT_PLANE_URLS: tuple[KeyPath, ...] = (
    ("global", "workerEndpoints", "invocationServiceURL"),
    ("global", "workerEndpoints", "grpcProxyWorkerConnectURL"),
    ("grpcproxy", "workerConnectBaseURL"),
    ("invocation", "env", "WORKER_STREAM_PROPERTIES__SELF_ADDRESS"),
)
BOOLEANS: tuple[KeyPath, ...] = (
    ENABLED,
    UPSTREAM_TLS,
    (WCP, "invocation", "connect", "enabled"),
    ("adminIssuerProxy", "enabled"),
    ("adminIssuerProxy", "gateway", "enabled"),
    NATS_CLUSTER,
)
ANNOTATION_MAPS: tuple[KeyPath, ...] = (
    *(
        (svc, "podAnnotations")
        for svc in (
            "api",
            "nvctApi",
            "invocation",
            "grpcproxy",
            "apikeys",
            "ess",
            "natsAuthCalloutService",
            "nats",
        )
    ),
    ("openbao", "server", "annotations"),
)
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
RESERVED_ANNOTATION_PREFIX = "nvcf.nvidia.com/nats-worker-auth"
CHART_MANAGED_ANNOTATION_PREFIXES = ("checksum/",)  # the charts roll pods by these; a user value breaks that

_PLAIN_KEY = re.compile(r"[^.\[\]\"\s]+")


def key_path(parts: KeyPath) -> str:
    """Dotted path; keys that contain dots are bracketed (``api.podAnnotations["a.b/c"]``) as yq does."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out


# -- merging and lookup ------------------------------------------------------------------------------
def plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    return copy.deepcopy(value)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's rule for values files: mappings merge key by key, anything else replaces. Inputs untouched."""
    merged = {key: plain(value) for key, value in base.items()}
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = plain(value)
    return merged


def lookup(values: Any, parts: KeyPath, default: Any = None) -> Any:
    """The value at a key path, or `default` where the path leaves the mappings."""
    node = values
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


_ABSENT = object()


def merged_lookup(
    base: Mapping[str, Any], override: Mapping[str, Any], parts: KeyPath, default: Any = None
) -> Any:
    """``lookup(deep_merge(base, override), parts, default)`` without copying either tree: a stack's
    effective settings are read many times over a launch and a replay, each time for a few keys."""
    # the two trees' nodes at the path so far; _ABSENT where one has none
    below: Any = base
    above: Any = override
    for part in parts:
        if above is not _ABSENT:
            if not isinstance(above, Mapping):
                return default
            if part in above:
                value = above[part]
                under = below[part] if isinstance(below, Mapping) and part in below else _ABSENT
                # mappings merge key by key, anything else replaces (deep_merge): the lower tree goes on
                # only under a mapping over a mapping
                merging = isinstance(value, Mapping) and isinstance(under, Mapping)
                below, above = (under if merging else _ABSENT), value
                continue
            above = _ABSENT  # a key the upper tree lacks is the lower one's, if it has it
        if not isinstance(below, Mapping) or part not in below:
            return default
        below = below[part]
    if above is _ABSENT:
        return below
    if isinstance(above, Mapping) and isinstance(below, Mapping):
        return deep_merge(below, above)
    return above


def quoted(text: str) -> str:
    """JSON-quoted and cut short: a block of text (or a 10,000-character name) stays a readable one line."""
    shown = json.dumps(text, ensure_ascii=False)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def nested(parts: KeyPath, value: Any) -> dict[str, Any]:
    """`value` at a key path, as a values tree (for deep_merge): (a, b), 1 -> {a: {b: 1}}."""
    out: Any = value
    for part in reversed(parts):
        out = {part: out}
    return dict(out)


def kind_of(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {quoted(value)}"
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", list: "a list"}
    return names.get(type(value), f"a {type(value).__name__}")


def is_set(value: Any) -> bool:
    return value is not None and value != ""


# -- effective proxy settings ----------------------------------------------------------------------
@dataclass(frozen=True)
class ProxySettings:
    enabled: bool
    worker_domain: str
    frontend_issuer: str  # STACK or PUBLIC
    frontend_secret: str
    upstream_tls: bool
    connect_enabled: bool
    invocation_proxy_url: str  # the https URL workers are handed
    worker_ca_pem_set: bool
    pod_worker_tls: bool  # the invocation-service pods open their 8443 worker TLS listener


def proxy_settings(values: Mapping[str, Any]) -> ProxySettings:
    """What the stack would deploy for these values (expects values that pass ``validate``)."""

    def get(parts: KeyPath) -> Any:
        return merged_lookup(DEFAULTS, values, parts, lookup(DEFAULTS, parts))

    domain = str(get(WORKER_DOMAIN))
    ref, secret = get(ISSUER_REF), get(EXISTING_SECRET)
    # Any frontend certificate the user brings is assumed public (the seed's reason to bring one). The
    # simulation issues the issuerRef case into the same folder as the public profile (certs.profiles).
    issuer = PUBLIC if ref is not None or is_set(secret) else STACK
    url = get(PROXY_URL)
    pem = get(CA_PEM)
    return ProxySettings(
        enabled=get(ENABLED) is True,
        worker_domain=domain,
        frontend_issuer=issuer,
        frontend_secret=str(secret) if is_set(secret) else FRONTEND_SECRETS[issuer],
        upstream_tls=get(UPSTREAM_TLS) is True,
        connect_enabled=get((WCP, "invocation", "connect", "enabled")) is True,
        invocation_proxy_url=url if is_set(url) else f"https://invocation.{domain}:{INVOCATION_PROXY_PORT}",
        worker_ca_pem_set=isinstance(pem, str) and bool(pem.strip()),
        pod_worker_tls=get(UPSTREAM_TLS) is True
        if get(POD_WORKER_TLS) is None
        else get(POD_WORKER_TLS) is True,
    )


# -- the NATS values, read in one place ------------------------------------------------------------
def nats_replicas(values: Mapping[str, Any]) -> int:
    """How many nats-servers the StatefulSet runs: one without clustering (expects valid values)."""
    clustered = merged_lookup(DEFAULTS, values, NATS_CLUSTER) is True
    return int(merged_lookup(DEFAULTS, values, NATS_REPLICAS)) if clustered else 1


STREAM_REPLICAS = 3  # R3 on a cluster of three or more; every server of a smaller one
# Seconds nats-server holds a sign-in for the callout's answer (its authorization.timeout, which the chart
# sets through config.merge). nats-server's default is 2 s; ncpsim's 10 s lets thousands of workers sign in
# at once on a laptop. A sign-in whose request no callout hears (one restarting, or a server whose routes
# are not up yet) is refused only then, and the worker signs in anew.
AUTH_TIMEOUT = 10.0
NATS_AUTH_TIMEOUT: KeyPath = ("nats", "config", "merge", "authorization", "timeout")
NATS_PUBLISH_TIMEOUT: KeyPath = ("nats", "jetstream", "publishTimeoutSeconds")


@dataclass(frozen=True)
class NatsValues:
    """What the nats pods, the callout, the pods' publisher and the workers read of ``nats.*``."""

    worker_auth: str = "nkey"
    webhook_url: str = DEFAULT_WEBHOOK_URL
    ack_wait: float = 30.0  # the consumer's ack wait (field value); scenarios may shorten it
    servers: int = 3  # the StatefulSet's replicas (nats.config.cluster)
    # seconds one publish of work waits for JetStream's acknowledgement before the pod sends it again
    # (sim.nats.publisher; the pods' client, async-nats, waits 5 s by default, its JetStream context's
    # timeout); a test of a dead bus may shorten it
    publish_timeout: float = 2.0
    auth_timeout: float = AUTH_TIMEOUT

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> NatsValues:
        nats = values.get("nats") or {}
        url = ((nats.get("authCallout") or {}).get("workerTokenAuth") or {}).get("webhookUrl")
        jetstream = nats.get("jetstream") or {}
        return cls(
            worker_auth=str(nats.get("workerAuth") or "nkey"),
            webhook_url=str(url or DEFAULT_WEBHOOK_URL),
            ack_wait=float(jetstream.get("ackWaitSeconds") or 30.0),
            servers=nats_replicas(values),
            publish_timeout=float(lookup(values, NATS_PUBLISH_TIMEOUT) or cls.publish_timeout),
            auth_timeout=float(lookup(values, NATS_AUTH_TIMEOUT) or AUTH_TIMEOUT),
        )

    @property
    def stream_replicas(self) -> int:
        """Each work stream's replicas: ncpsim's choice (the public source leaves it to the API), R3 where
        the cluster has three servers, so one server can be down without an outage."""
        return min(STREAM_REPLICAS, self.servers)
