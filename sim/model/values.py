"""The stack's environment file: defaults, overrides, validation and the proxy's effective settings.

Same shape as NVCF's ``environments/<env>.yaml``, so a customer's file can be replayed. Everything here
is pure except ``load_values_file``. Validation reports what a render of the real stack would refuse,
each problem with its key path and, when known, the file and line that set it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from certs.inspect import covers
from certs.names import secret_name_problem
from certs.profiles import FRONTEND_SECRETS, PUBLIC, STACK
from sim.errors import ConfigError

KeyPath = tuple[str | int, ...]  # str: mapping key, int: sequence index
Origin = Mapping[str, tuple[str, int | None]]  # key path -> (file or --set, line)

# The seed's default: the auth callout sends worker tokens to the NVCF API's in-cluster Service.
DEFAULT_WEBHOOK_URL = "http://api.nvcf.svc.cluster.local:8080/v2/nvcf/webhook/nats-auth"
INVOCATION_PROXY_PORT = 10084


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
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")


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
def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return copy.deepcopy(value)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's rule for values files: mappings merge key by key, anything else replaces. Inputs untouched."""
    merged = {key: _plain(value) for key, value in base.items()}
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = _plain(value)
    return merged


def lookup(values: Any, parts: KeyPath, default: Any = None) -> Any:
    """The value at a key path, or `default` where the path leaves the mappings."""
    node = values
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _quoted(text: str) -> str:
    """JSON-quoted and cut short: a block of text (or a 10,000-character name) stays a readable one line."""
    shown = json.dumps(text, ensure_ascii=False)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def nested(parts: KeyPath, value: Any) -> dict[str, Any]:
    """`value` at a key path, as a values tree (for deep_merge): (a, b), 1 -> {a: {b: 1}}."""
    out: Any = value
    for part in reversed(parts):
        out = {part: out}
    return dict(out)


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {_quoted(value)}"
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", list: "a list"}
    return names.get(type(value), f"a {type(value).__name__}")


def _set(value: Any) -> bool:
    return value is not None and value != ""


# -- issues ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ValuesIssue:
    """One problem, located like a render failure: ``FILE:LINE: key.path: message``."""

    path: str
    message: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = self.file or ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        # Some messages are fixed strings that already start with the key (nats.workerAuth ...).
        text = self.message
        if self.path and not self.message.startswith(self.path):
            text = f"{self.path}: {text}"
        return f"{where}: {text}" if where else text


Add = Callable[[KeyPath, str], None]


def _check_shapes(defaults: Mapping[str, Any], values: dict[str, Any], parts: KeyPath, add: Add) -> None:
    """Where the defaults hold a mapping the values must too. A wrong node is reported once and then
    replaced by its default, so the rules below do not report follow-on errors under it."""
    for key, default in defaults.items():
        if not isinstance(default, Mapping):
            continue
        here = (*parts, key)
        value = values.get(key)
        if value is None and not default:
            values[key] = {}  # "podAnnotations:" with nothing under it renders nothing, like {}
        elif not isinstance(value, Mapping):
            add(here, f"must be a mapping (indented key: value lines), found {_kind(value)}")
            values[key] = _plain(default)
        else:
            _check_shapes(default, values[key], here, add)


def _dns_problem(name: str) -> str | None:
    if name.endswith("."):
        return "drop the trailing dot"
    if "*" in name:
        return "leave out the '*': the certificate adds the wildcard"
    labels = name.split(".")
    if len(labels) < 2:
        return "needs at least two labels, e.g. grpc-worker.example.com"
    if len(name) > 253:
        return "is longer than 253 characters"
    for label in labels:
        if len(label) > 63 or not _DNS_LABEL.fullmatch(label):
            if label != label.lower() and _DNS_LABEL.fullmatch(label.lower()):
                return "must be lower case"
            return f'label {_quoted(label)} must be 1-63 of a-z, 0-9 and "-", not starting or ending with "-"'
    return None


def _rule_booleans(values: Mapping[str, Any], add: Add) -> None:
    for parts in BOOLEANS:
        value = lookup(values, parts)
        if not isinstance(value, bool):
            add(parts, f"must be true or false (unquoted), found {_kind(value)}")
    worker_tls = lookup(values, POD_WORKER_TLS)
    if worker_tls is not None and not isinstance(worker_tls, bool):
        add(POD_WORKER_TLS, f"must be true or false (unquoted), or unset, found {_kind(worker_tls)}")


def _rule_proxy_enabled(values: Mapping[str, Any], add: Add) -> None:
    enabled, domain = lookup(values, ENABLED) is True, lookup(values, WORKER_DOMAIN)
    if enabled and (not isinstance(domain, str) or not domain):
        add(
            WORKER_DOMAIN,
            "must be set to the DNS name workers reach the proxy under, e.g. grpc-worker.example.com",
        )
    # Checked with the proxy off too: the stack still issues its frontend certificate for *.<workerDomain>
    # (and names it in the compute clusters' DNS), so a name DNS cannot carry failed deep in a later step.
    elif isinstance(domain, str) and domain and (problem := _dns_problem(domain)):
        add(WORKER_DOMAIN, f"{_quoted(domain)} is not a valid DNS name: {problem}")
    if not enabled:
        return
    for parts in SPLIT_PLANE_URLS:
        if _set(lookup(values, parts)):
            add(
                parts,
                "must be empty when workerCallbackProxy.enabled is true "
                "(the proxy replaces split-plane URLs)",
            )


def _rule_proxy_url(values: Mapping[str, Any], add: Add) -> None:
    url = lookup(values, PROXY_URL)
    if not _set(url):
        return
    if not isinstance(url, str):
        add(PROXY_URL, f"must be an https URL string, found {_kind(url)}")
        return
    try:
        split = urlsplit(url)
        host, _port = split.hostname, split.port
    except ValueError as exc:
        add(PROXY_URL, f"is not a URL ({exc}); use https://invocation.<workerDomain>:{INVOCATION_PROXY_PORT}")
        return
    if split.scheme != "https":
        add(PROXY_URL, f"must use https (workers open TLS to the proxy), found {split.scheme or 'no scheme'}")
    elif not host:
        add(PROXY_URL, f"has no host; use https://invocation.<workerDomain>:{INVOCATION_PROXY_PORT}")
    elif problem := _dns_problem(host):  # workers dial it and send it as the SNI: a longer name cannot be
        add(PROXY_URL, f"host {_quoted(host)} is not a valid DNS name: {problem}")
    else:
        domain = lookup(values, WORKER_DOMAIN)
        if isinstance(domain, str) and domain and not covers(f"*.{domain}", host):
            add(
                PROXY_URL,
                f"host {host} is not covered by the *.{domain} certificate; "
                "use exactly one label under workerCallbackProxy.workerDomain",
            )


def _rule_frontend_tls(values: Mapping[str, Any], add: Add) -> None:
    ref, secret = lookup(values, ISSUER_REF), lookup(values, EXISTING_SECRET)
    if ref is not None and _set(secret):
        add(
            EXISTING_SECRET,
            "cannot be combined with workerCallbackProxy.tls.frontend.certificate.issuerRef; set only one",
        )
    if ref is not None:
        if not isinstance(ref, Mapping):
            add(ISSUER_REF, f"must be a mapping with kind and name, found {_kind(ref)}")
        else:
            for field, example in (("kind", "ClusterIssuer"), ("name", "letsencrypt")):
                if not isinstance(ref.get(field), str) or not ref.get(field):
                    add((*ISSUER_REF, field), f"must be set, e.g. {field}: {example}")
    if _set(secret) and not isinstance(secret, str):
        add(EXISTING_SECRET, f"must be the name of a kubernetes.io/tls Secret, found {_kind(secret)}")
    elif _set(secret) and (problem := secret_name_problem(secret)):
        add(EXISTING_SECRET, f"{_kind(secret)} is not a Secret name: {problem}")


def _rule_service_type(values: Mapping[str, Any], add: Add) -> None:
    kind = lookup(values, (WCP, "service", "type"))
    if kind not in SERVICE_TYPES:
        add((WCP, "service", "type"), f"must be one of {', '.join(SERVICE_TYPES)}, found {_kind(kind)}")


def _rule_worker_ca_pem(values: Mapping[str, Any], add: Add) -> None:
    """PEM text as the customer pastes it (not checked: a broken paste is a field failure to replay), or a
    scenario's marker for a CA whose PEM is pasted when the values are applied (Topology.with_ca_pem)."""
    from sim.model.topology import CA_MARKERS

    pem = lookup(values, CA_PEM)
    if pem is not None and not isinstance(pem, str):
        add(CA_PEM, f"must be PEM text (a block scalar, |), found {_kind(pem)}")
    elif isinstance(pem, str) and pem.strip().startswith("@") and pem.strip() not in CA_MARKERS:
        add(CA_PEM, f"unknown marker {pem.strip()!r}; paste PEM text or use one of {', '.join(CA_MARKERS)}")


def _rule_nats(values: Mapping[str, Any], add: Add) -> None:
    mode = lookup(values, WORKER_AUTH)
    if not isinstance(mode, str) or mode not in ("nkey", "token"):
        add(WORKER_AUTH, "nats.workerAuth must be nkey or token")  # the stack's own wording
    elif mode == "token":
        url = lookup(values, WEBHOOK_URL)
        if not isinstance(url, str) or not url.strip():
            add(
                WEBHOOK_URL,
                "must be set when nats.workerAuth is token (the auth callout sends worker "
                f"tokens there), e.g. {DEFAULT_WEBHOOK_URL}",
            )


def _rule_nats_cluster(values: Mapping[str, Any], add: Add) -> None:
    replicas = lookup(values, NATS_REPLICAS)
    if lookup(values, NATS_CLUSTER) is not True:
        return
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        add(NATS_REPLICAS, f"must be a whole number, found {_kind(replicas)}")
    elif replicas < 2:
        # nats-server would start, and JetStream would wait for ever for a meta leader.
        add(
            NATS_REPLICAS,
            "must be 2 or higher when jetstream is enabled (one clustered server never elects a JetStream "
            "meta leader); set 3, or nats.config.cluster.enabled: false for a single server",
        )
    elif replicas > NATS_MAX_REPLICAS:
        add(NATS_REPLICAS, f"ncpsim runs at most {NATS_MAX_REPLICAS} NATS servers, found {replicas}")


def _rule_api_service(values: Mapping[str, Any], add: Add) -> None:
    for parts in (("api", "namespace"), ("api", "service", "name")):
        name = lookup(values, parts)
        if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
            add(parts, f'must be a DNS label (a-z, 0-9 and "-"), found {_kind(name)}')
    port = lookup(values, ("api", "service", "port"))
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        add(("api", "service", "port"), f"must be a port number, found {_kind(port)}")


def nats_replicas(values: Mapping[str, Any]) -> int:
    """How many nats-servers the StatefulSet runs: one without clustering (expects valid values)."""
    merged = deep_merge(DEFAULTS, values)
    return int(lookup(merged, NATS_REPLICAS)) if lookup(merged, NATS_CLUSTER) is True else 1


def _annotation_key_problem(key: str) -> str | None:
    if key.startswith(RESERVED_ANNOTATION_PREFIX):
        return "is reserved for the auth callout's restart on a worker auth change; remove it"
    if key.startswith(CHART_MANAGED_ANNOTATION_PREFIXES):
        return "is managed by the chart itself; remove it"
    return None


def _rule_annotations(values: Mapping[str, Any], add: Add) -> None:
    for parts in ANNOTATION_MAPS:
        for key, value in (lookup(values, parts) or {}).items():
            here = (*parts, str(key))
            problem = _annotation_key_problem(key) if isinstance(key, str) else "key must be a string"
            if problem:
                add(here, problem)
            if not isinstance(value, str):
                # json.dumps spells the value the way YAML would (true, 8080), ready to be quoted.
                add(here, f'value must be a string, found {_kind(value)}; quote it: "{json.dumps(value)}"')


RULES: tuple[Callable[[Mapping[str, Any], Add], None], ...] = (
    _rule_booleans,
    _rule_proxy_enabled,
    _rule_proxy_url,
    _rule_frontend_tls,
    _rule_service_type,
    _rule_worker_ca_pem,
    _rule_nats,
    _rule_nats_cluster,
    _rule_api_service,
    _rule_annotations,
)


def _locate(parts: KeyPath, message: str, origin: Origin) -> ValuesIssue:
    """Attach the file and line of the key, or of its nearest ancestor the file set."""
    for depth in range(len(parts), 0, -1):
        found = origin.get(key_path(parts[:depth]))
        if found:
            return ValuesIssue(key_path(parts), message, found[0], found[1])
    return ValuesIssue(key_path(parts), message)


def validate(values: Mapping[str, Any], origin: Origin | None = None) -> list[ValuesIssue]:
    """Every problem in ``values`` (user overrides or an already merged tree), in rule order."""
    if not isinstance(values, Mapping):
        return [ValuesIssue("", f"top level must be a mapping of keys, found {_kind(values)}")]
    found: list[tuple[KeyPath, str]] = []

    def add(parts: KeyPath, message: str) -> None:  # a value's line break must not break the one-line message
        found.append((parts, message.replace("\r", "\\r").replace("\n", "\\n")))

    merged = deep_merge(DEFAULTS, values)
    _check_shapes(DEFAULTS, merged, (), add)
    for rule in RULES:
        rule(merged, add)
    return [_locate(parts, message, origin or {}) for parts, message in found]


def check(values: Mapping[str, Any], origin: Origin | None = None) -> None:
    """Raise ``ConfigError`` naming the first problem; all of them are on ``.issues``."""
    issues = validate(values, origin)
    if issues:
        error = ConfigError(str(issues[0]))
        error.issues = tuple(issues)
        raise error


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
    merged = deep_merge(DEFAULTS, values)

    def get(parts: KeyPath) -> Any:
        return lookup(merged, parts, lookup(DEFAULTS, parts))

    domain = str(get(WORKER_DOMAIN))
    ref, secret = get(ISSUER_REF), get(EXISTING_SECRET)
    # Any frontend certificate the user brings is assumed public (the seed's reason to bring one). The
    # simulation issues the issuerRef case into the same folder as the public profile (certs.profiles).
    issuer = PUBLIC if ref is not None or _set(secret) else STACK
    url = get(PROXY_URL)
    pem = get(CA_PEM)
    return ProxySettings(
        enabled=get(ENABLED) is True,
        worker_domain=domain,
        frontend_issuer=issuer,
        frontend_secret=str(secret) if _set(secret) else FRONTEND_SECRETS[issuer],
        upstream_tls=get(UPSTREAM_TLS) is True,
        connect_enabled=get((WCP, "invocation", "connect", "enabled")) is True,
        invocation_proxy_url=url if _set(url) else f"https://invocation.{domain}:{INVOCATION_PROXY_PORT}",
        worker_ca_pem_set=isinstance(pem, str) and bool(pem.strip()),
        pod_worker_tls=get(UPSTREAM_TLS) is True
        if get(POD_WORKER_TLS) is None
        else get(POD_WORKER_TLS) is True,
    )
