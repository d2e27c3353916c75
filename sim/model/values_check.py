"""What a render of the real stack would refuse in an environment file: each problem with its key path
and, when known, the file and line that set it (pure). The values themselves, their defaults and key
paths, and what the stack reads of them are sim.model.values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from certs.inspect import covers
from certs.names import secret_name_problem
from sim.errors import ConfigError
from sim.model.values import (
    ANNOTATION_MAPS,
    BOOLEANS,
    CA_MARKERS,
    CA_PEM,
    CHART_MANAGED_ANNOTATION_PREFIXES,
    DEFAULT_WEBHOOK_URL,
    DEFAULTS,
    ENABLED,
    EXISTING_SECRET,
    INVOCATION_PROXY_PORT,
    ISSUER_REF,
    NATS_AUTH_TIMEOUT,
    NATS_CLUSTER,
    NATS_MAX_REPLICAS,
    NATS_PUBLISH_TIMEOUT,
    NATS_REPLICAS,
    POD_WORKER_TLS,
    PROXY_URL,
    RESERVED_ANNOTATION_PREFIX,
    SERVICE_TYPES,
    SPLIT_PLANE_URLS,
    WCP,
    WEBHOOK_URL,
    WORKER_AUTH,
    WORKER_DOMAIN,
    KeyPath,
    Origin,
    deep_merge,
    is_set,
    key_path,
    kind_of,
    lookup,
    plain,
    quoted,
)

_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")


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
            add(here, f"must be a mapping (indented key: value lines), found {kind_of(value)}")
            values[key] = plain(default)
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
            return f'label {quoted(label)} must be 1-63 of a-z, 0-9 and "-", not starting or ending with "-"'
    return None


def _rule_booleans(values: Mapping[str, Any], add: Add) -> None:
    for parts in BOOLEANS:
        value = lookup(values, parts)
        if not isinstance(value, bool):
            add(parts, f"must be true or false (unquoted), found {kind_of(value)}")
    worker_tls = lookup(values, POD_WORKER_TLS)
    if worker_tls is not None and not isinstance(worker_tls, bool):
        add(POD_WORKER_TLS, f"must be true or false (unquoted), or unset, found {kind_of(worker_tls)}")


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
        add(WORKER_DOMAIN, f"{quoted(domain)} is not a valid DNS name: {problem}")
    if not enabled:
        return
    for parts in SPLIT_PLANE_URLS:
        if is_set(lookup(values, parts)):
            add(
                parts,
                "must be empty when workerCallbackProxy.enabled is true "
                "(the proxy replaces split-plane URLs)",
            )


def _rule_proxy_url(values: Mapping[str, Any], add: Add) -> None:
    url = lookup(values, PROXY_URL)
    if not is_set(url):
        return
    if not isinstance(url, str):
        add(PROXY_URL, f"must be an https URL string, found {kind_of(url)}")
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
        add(PROXY_URL, f"host {quoted(host)} is not a valid DNS name: {problem}")
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
    if ref is not None and is_set(secret):
        add(
            EXISTING_SECRET,
            "cannot be combined with workerCallbackProxy.tls.frontend.certificate.issuerRef; set only one",
        )
    if ref is not None:
        if not isinstance(ref, Mapping):
            add(ISSUER_REF, f"must be a mapping with kind and name, found {kind_of(ref)}")
        else:
            for field, example in (("kind", "ClusterIssuer"), ("name", "letsencrypt")):
                if not isinstance(ref.get(field), str) or not ref.get(field):
                    add((*ISSUER_REF, field), f"must be set, e.g. {field}: {example}")
    if is_set(secret) and not isinstance(secret, str):
        add(EXISTING_SECRET, f"must be the name of a kubernetes.io/tls Secret, found {kind_of(secret)}")
    elif is_set(secret) and (problem := secret_name_problem(secret)):
        add(EXISTING_SECRET, f"{kind_of(secret)} is not a Secret name: {problem}")


def _rule_service_type(values: Mapping[str, Any], add: Add) -> None:
    kind = lookup(values, (WCP, "service", "type"))
    if kind not in SERVICE_TYPES:
        add((WCP, "service", "type"), f"must be one of {', '.join(SERVICE_TYPES)}, found {kind_of(kind)}")


def _rule_worker_ca_pem(values: Mapping[str, Any], add: Add) -> None:
    """PEM text as the customer pastes it (not checked: a broken paste is a field failure to replay), or a
    scenario's marker for a CA whose PEM is pasted when the values are applied (Topology.with_ca_pem)."""
    pem = lookup(values, CA_PEM)
    if pem is not None and not isinstance(pem, str):
        add(CA_PEM, f"must be PEM text (a block scalar, |), found {kind_of(pem)}")
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
        add(NATS_REPLICAS, f"must be a whole number, found {kind_of(replicas)}")
    elif replicas < 2:
        # nats-server would start, and JetStream would wait for ever for a meta leader.
        add(
            NATS_REPLICAS,
            "must be 2 or higher when jetstream is enabled (one clustered server never elects a JetStream "
            "meta leader); set 3, or nats.config.cluster.enabled: false for a single server",
        )
    elif replicas > NATS_MAX_REPLICAS:
        add(NATS_REPLICAS, f"ncpsim runs at most {NATS_MAX_REPLICAS} NATS servers, found {replicas}")


def _rule_nats_seconds(values: Mapping[str, Any], add: Add) -> None:
    """The NATS schedules a stack may be given (sim.model.values.NatsValues): a positive number of seconds."""
    for parts in (NATS_AUTH_TIMEOUT, NATS_PUBLISH_TIMEOUT):
        seconds = lookup(values, parts)
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0
        ):
            number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
            add(
                parts,
                f"must be a positive number of seconds, found {seconds if number else kind_of(seconds)}",
            )


def _rule_api_service(values: Mapping[str, Any], add: Add) -> None:
    for parts in (("api", "namespace"), ("api", "service", "name")):
        name = lookup(values, parts)
        if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.fullmatch(name):
            add(parts, f'must be a DNS label (a-z, 0-9 and "-"), found {kind_of(name)}')
    port = lookup(values, ("api", "service", "port"))
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        add(("api", "service", "port"), f"must be a port number, found {kind_of(port)}")


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
                add(here, f'value must be a string, found {kind_of(value)}; quote it: "{json.dumps(value)}"')


RULES: tuple[Callable[[Mapping[str, Any], Add], None], ...] = (
    _rule_booleans,
    _rule_proxy_enabled,
    _rule_proxy_url,
    _rule_frontend_tls,
    _rule_service_type,
    _rule_worker_ca_pem,
    _rule_nats,
    _rule_nats_cluster,
    _rule_nats_seconds,
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
        return [ValuesIssue("", f"top level must be a mapping of keys, found {kind_of(values)}")]
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
