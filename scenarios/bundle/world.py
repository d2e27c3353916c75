"""A support bundle's files turned into facts about the customer's world, each citing its file and line.

Every file is optional: one the collector could not write (meta.yaml lists the failed command) or one
missing from a hand-made bundle is a note, never an error. A file that is there but malformed is one
ConfigError line naming it, as a values file is (the same bounds, sim.model.untrusted).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dns.rule import PROXY, REGEX, DnsRecord
from scenarios.bundle.archive import Bundle
from scenarios.bundle.certificate import Certificate, decode_pem, pem_sha256, read_certificate
from scenarios.bundle.corefile import CorefileError, ServerBlock, parse_cluster
from scenarios.bundle.resolve import Resolution, Rule, resolve, rule_domain, rules
from sim.errors import ConfigError
from sim.model.layering import FILE, Layer
from sim.model.values import key_path
from sim.model.values_file import values_from_text
from sim.proxy.access_log import parse_line

ENVIRONMENT, SERVICES, SECRETS, META = (
    "environment.yaml",
    "control-plane/services.yaml",
    "control-plane/secrets.yaml",
    "meta.yaml",
)
PROXY_LOG = "control-plane/logs/worker-callback-proxy.log"
CALLOUT_LOG = "control-plane/logs/nats-auth-callout-service.log"
PROXY_SERVICE = "worker-callback-proxy"
SLIP = 0.75  # how alike another domain must be to the workerDomain to be taken for it (difflib ratio)
POD_NODES = 200_000  # a compute cluster's function pods: hundreds of pods, a few hundred values each
_WORKER_UTILS = re.compile(r"worker-utils[^/:@]*:v?(\d+\.\d+\.\d+)")
_SHA = re.compile(r"^sha256:([0-9a-f]{64})$")
_CALLOUT = re.compile(r"Authentication (failed|denied)")


@dataclass(frozen=True)
class ProxyService:
    """The proxy Service as the cluster has it."""

    type: str
    cluster_ip: str
    addresses: tuple[str, ...]  # status.loadBalancer.ingress (ip or hostname)
    ports: tuple[str, ...]
    source: str

    @property
    def pending(self) -> bool:
        return self.type == "LoadBalancer" and not self.addresses


@dataclass(frozen=True)
class Workers:
    """Function pods alike in worker-utils version and NVCF_PROXY_CA_PEM, in one compute cluster."""

    context: str
    worker_utils: str | None  # None: no worker-utils image found on the pod
    pem: str | None  # "sha256:<hex>", "unreadable", or None when the pod has no NVCF_PROXY_CA_PEM
    pods: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class ComputeDns:
    """One compute cluster's CoreDNS configuration."""

    context: str
    source: str  # the bundle file
    blocks: tuple[ServerBlock, ...]
    files: Mapping[str, str]  # files the Corefile reads from the coredns ConfigMap (NodeHosts)
    line_of: Mapping[str, int]  # ConfigMap key -> the line its text starts on in the bundle file

    def resolve(self, name: str) -> Resolution:
        return resolve(list(self.blocks), name, self.files)

    def meant_for_callbacks(self, domain: str, proxy: tuple[str, ...]) -> list[Rule]:
        """The customer's own coredns-custom rules for callbacks under another domain than `domain`: each
        answers the proxy (an address or a name in `proxy`), or names a domain one slip from it."""

        def written(rule: Rule) -> str:
            return rule_domain(rule)

        return [
            r
            for r in rules(list(self.blocks), self.files)
            if r.origin.configmap == "coredns-custom"
            and r.kind != "forward"
            and domain not in written(r)
            and (
                any(p in r.target for p in proxy)
                or difflib.SequenceMatcher(None, written(r), domain).ratio() >= SLIP
            )
        ]

    def cite(self, origin: Any) -> str:
        """`compute/C/coredns.yaml:LINE` for a directive's origin (its key's text starts a line below)."""
        start = self.line_of.get(f"{origin.configmap}/{origin.key}")
        return f"{self.source}:{start + origin.line}" if start else f"{self.source} ({origin})"


@dataclass(frozen=True)
class LogLine:
    source: str  # file:line
    text: str


@dataclass(frozen=True)
class BundleWorld:
    source: str
    values: Layer | None
    service: ProxyService | None
    certificates: Mapping[str, Certificate]
    compute: tuple[ComputeDns, ...]
    workers: tuple[Workers, ...]
    proxy_log: tuple[LogLine, ...]  # access-log lines that are not a success
    callout_log: tuple[LogLine, ...]  # the callout's refused logins
    notes: tuple[str, ...] = field(default_factory=tuple)


def _yaml(
    bundle: Bundle, path: str, max_nodes: int | None = None
) -> tuple[dict[str, Any], dict[str, tuple[str, int]]] | None:
    text = bundle.text(path)
    if text is None:
        return None
    kwargs = {"max_nodes": max_nodes} if max_nodes else {}
    return values_from_text(text, path, "bundle file", **kwargs)


def _items(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A kubectl List's items (or one object), each with its key-path prefix for line lookups."""
    if doc.get("kind") == "List" or "items" in doc:
        return [
            (f"items[{n}]", item) for n, item in enumerate(doc.get("items") or []) if isinstance(item, dict)
        ]
    return [("", doc)]


def _line(origin: Mapping[str, tuple[str, int]], path: str, prefix: str, *parts: str) -> str:
    here = ".".join(p for p in (prefix, key_path(parts)) if p)
    found = origin.get(here) or origin.get(prefix)
    return f"{path}:{found[1]}" if found else path


def _service(bundle: Bundle) -> ProxyService | None:
    read = _yaml(bundle, SERVICES)
    if read is None:
        return None
    doc, origin = read
    for prefix, item in _items(doc):
        if (item.get("metadata") or {}).get("name") != PROXY_SERVICE:
            continue
        spec, status = item.get("spec") or {}, item.get("status") or {}
        ingress = (status.get("loadBalancer") or {}).get("ingress") or []
        return ProxyService(
            type=str(spec.get("type") or "ClusterIP"),
            cluster_ip=str(spec.get("clusterIP") or ""),
            addresses=tuple(str(i.get("ip") or i.get("hostname")) for i in ingress if isinstance(i, dict)),
            ports=tuple(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or []),
            source=_line(origin, SERVICES, prefix, "spec", "type"),
        )
    return None


def _certificates(bundle: Bundle) -> dict[str, Certificate]:
    read = _yaml(bundle, SECRETS)
    if read is None:
        return {}
    doc, origin = read
    found = {}
    for prefix, item in _items(doc):
        meta, data = item.get("metadata") or {}, item.get("data") or {}
        annotations = meta.get("annotations") or {}
        ref = "/".join(
            str(annotations[k])
            for k in ("cert-manager.io/issuer-kind", "cert-manager.io/issuer-name")
            if k in annotations
        )
        crt, ca = decode_pem(data.get("tls.crt")), decode_pem(data.get("ca.crt")) or ""
        name = str(meta.get("name") or "")
        cert = read_certificate(name, crt or "", ca, ref, _line(origin, SECRETS, prefix, "data", "tls.crt"))
        if cert is not None:
            found[name] = cert
    return found


def _contexts(bundle: Bundle) -> dict[str, str]:
    """Compute folder -> the kubectl context it was collected from (meta.yaml), else the folder."""
    read = _yaml(bundle, META)
    contexts = {f: f for f in bundle.folders("compute")}
    for entry in (read[0] if read else {}).get("compute") or []:
        if isinstance(entry, dict) and entry.get("folder") in contexts:
            contexts[str(entry["folder"])] = str(entry.get("context"))
    return contexts


def _compute_dns(bundle: Bundle, folder: str, context: str, notes: list[str]) -> ComputeDns | None:
    """The cluster's CoreDNS configuration; what CoreDNS ignores in it (a coredns-custom key no import
    reaches) goes to `notes`."""
    path = f"compute/{folder}/coredns.yaml"
    read = _yaml(bundle, path)
    if read is None:
        return None
    doc, origin = read
    maps, line_of = {}, {}
    for prefix, item in _items(doc):
        name = str((item.get("metadata") or {}).get("name") or "")
        maps[name] = {str(k): str(v) for k, v in (item.get("data") or {}).items()}
        for key in maps[name]:
            cited = origin.get(".".join(p for p in (prefix, key_path(("data", key))) if p))
            if cited:
                line_of[f"{name}/{key}"] = cited[1]
    if "Corefile" not in maps.get("coredns", {}):
        raise ConfigError(
            f"{path}: no coredns ConfigMap with a Corefile key; collect it again (meta.yaml names the command)"
        )
    files = {f"/etc/coredns/{k}": v for k, v in maps["coredns"].items() if k != "Corefile"}
    try:
        blocks, ignored = parse_cluster(maps["coredns"]["Corefile"], maps.get("coredns-custom"))
    except CorefileError as exc:
        raise ConfigError(f"{path}: {exc}; CoreDNS would refuse this configuration too") from None
    notes += [f"{path}: {note}" for note in ignored]
    found = ComputeDns(context, path, tuple(blocks), files, line_of)
    for rule in rules(list(blocks), files):
        if rule.match == "regex":  # matched against names here, by Python's backtracking matcher
            try:
                DnsRecord(REGEX, rule.name, PROXY)
            except ValueError as exc:
                raise ConfigError(f"{found.cite(rule.origin)}: {exc}") from None
    return found


def _workers(bundle: Bundle, folder: str, context: str) -> list[Workers]:
    path = f"compute/{folder}/pods.yaml"
    read = _yaml(bundle, path, POD_NODES)
    if read is None:
        return []
    doc, origin = read
    groups: dict[tuple[str | None, str | None], list[tuple[str, str]]] = {}
    for prefix, pod in _items(doc):
        containers = (pod.get("spec") or {}).get("containers") or []
        version, pem = None, None
        for container in containers:
            image = str(container.get("image") or "")
            if m := _WORKER_UTILS.search(image):
                version = m[1]
            for env in container.get("env") or []:
                if isinstance(env, dict) and env.get("name") == "NVCF_PROXY_CA_PEM":
                    pem = _pem_value(env.get("value"))
        name = str((pod.get("metadata") or {}).get("name") or "?")
        groups.setdefault((version, pem), []).append((name, _line(origin, path, prefix, "metadata", "name")))
    return [
        Workers(context, version, pem, tuple(n for n, _ in pods), pods[0][1])
        for (version, pem), pods in groups.items()
    ]


def _pem_value(value: object) -> str:
    """The collector's `sha256:<hex>`; a hand-made bundle's PEM text is hashed here, never kept."""
    text = str(value or "")
    if _SHA.match(text):
        return text
    return f"sha256:{pem_sha256(text)}" if "-----BEGIN" in text else "unreadable"


def _log(bundle: Bundle, path: str, keep: Any) -> tuple[LogLine, ...]:
    text = bundle.text(path) or ""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        body = re.sub(r"^\[pod/[^\]]*\] ", "", line)  # kubectl logs --prefix
        if keep(body):
            out.append(LogLine(f"{path}:{number}", body.strip()[:400]))
    return tuple(out)


def _failed_access(line: str) -> bool:
    record = parse_line(line)
    return record is not None and (record["flags"] != "-" or not record["status"].startswith("2"))


def _notes(bundle: Bundle) -> list[str]:
    read = _yaml(bundle, META)
    meta = read[0] if read else {}
    notes = [] if read else ["meta.yaml: missing (a hand-made bundle?): which commands failed is unknown"]
    for failed in meta.get("failed") or []:
        if isinstance(failed, dict):
            notes.append(f"{failed.get('file')}: `{failed.get('command')}` failed: {failed.get('error')}")
    return notes


def read_world(bundle: Bundle) -> BundleWorld:
    contexts = _contexts(bundle)
    notes = _notes(bundle)
    compute = [d for f, c in contexts.items() if (d := _compute_dns(bundle, f, c, notes)) is not None]
    workers = [w for f, c in contexts.items() for w in _workers(bundle, f, c)]
    values = _yaml(bundle, ENVIRONMENT)
    layer = Layer(FILE, ENVIRONMENT, values[0], values[1]) if values else None
    for path in (ENVIRONMENT, SERVICES, SECRETS):
        if path not in bundle.files:
            notes.append(f"{path}: not in the bundle; what it would tell is assumed from the values")
    return BundleWorld(
        source=bundle.source,
        values=layer,
        service=_service(bundle),
        certificates=_certificates(bundle),
        compute=tuple(compute),
        workers=tuple(workers),
        proxy_log=_log(bundle, PROXY_LOG, _failed_access),
        callout_log=_log(bundle, CALLOUT_LOG, lambda line: bool(_CALLOUT.search(line))),
        notes=tuple(notes),
    )
