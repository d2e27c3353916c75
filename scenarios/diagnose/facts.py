"""Findings judged from what the customer sent, before any probe runs (pure).

A value-level fact is a finding whether or not a probe reached that layer: a ClusterIP Service and a
stack-CA frontend without workerCallbackCaPem are two findings, though the first stops every probe
callback before TLS. A support bundle adds the cluster's own facts: the proxy Service (a LoadBalancer
with no address), each compute cluster's DNS as its CoreDNS configuration answers the callback names,
the frontend certificate (names, expiry, the CA workers are given), the function pods' worker-utils and
NVCF_PROXY_CA_PEM, and the proxy's and the callout's log lines. Each finding's evidence names the file
and line it read. What the files show beside the findings is a note; what they cannot show and ncpsim takes
instead (where the NVCF API runs) is an assumption, said (sim.model.assumptions); how a callback name a
bundle cannot answer replays (an upstream resolver's answer) is scenarios/bundle/records.py's, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from certs.inspect import covers
from scenarios.bundle.certificate import Certificate, pem_sha256
from scenarios.bundle.records import GRPC_EXAMPLE, Callback, callbacks, proxy_names
from scenarios.bundle.resolve import Resolution
from scenarios.bundle.world import BundleWorld, ComputeDns, ProxyService, Workers
from scenarios.diagnose.causes import CAUSES
from scenarios.diagnose.judge import Finding
from sim.model.assumptions import API, Assumption
from sim.model.parts import api_from_webhook
from sim.model.values import (
    CA_PEM,
    DEFAULT_WEBHOOK_URL,
    WEBHOOK_URL,
    WORKER_AUTH,
    KeyPath,
    key_path,
    lookup,
    proxy_settings,
)
from sim.proxy.access_log import parse_line

CONNECT_MIN = (1, 3, 2)  # worker-utils from which callbacks are forward-proxy requests
_VALID_FOR = re.compile(r"certificate is valid for (?P<names>.+?), not (?P<host>[^\s,;]+)")


@dataclass(frozen=True)
class Customer:
    """What the customer sent: the merged values and where each key came from, certificates by Secret
    name (a bundle's, or a --secret folder's), their clusters as a bundle shows them, what they saw."""

    values: Mapping[str, Any]
    where: Mapping[str, tuple[str, int | None]]
    now: datetime
    certificates: Mapping[str, Certificate] = field(default_factory=dict)
    world: BundleWorld | None = None
    symptom: str | None = None

    def cite(self, parts: KeyPath) -> str:
        for depth in range(len(parts), 0, -1):
            file, line = self.where.get(key_path(parts[:depth]), (None, None))
            if file:
                return f"{file}:{line}" if line else file
        return "the values (chart default)"


class _Found:
    """Findings by cause, evidence in the order found; notes and assumptions beside them."""

    def __init__(self) -> None:
        self.evidence: dict[str, list[str]] = {}
        self.notes: list[str] = []
        self.assumed: list[Assumption] = []

    def add(self, cause: str, evidence: str) -> None:
        self.evidence.setdefault(cause, [])
        if evidence not in self.evidence[cause]:
            self.evidence[cause].append(evidence)

    def findings(self) -> list[Finding]:
        return [Finding(CAUSES[c], tuple(ev)) for c, ev in self.evidence.items()]


def judge_facts(customer: Customer) -> tuple[list[Finding], list[str], list[Assumption]]:
    """Every finding the customer's files show; notes on what else they show; what ncpsim assumes where
    they are silent."""
    found = _Found()
    settings = proxy_settings(customer.values)
    world = customer.world
    _values(customer, found, world.service if world else None)
    if world is not None:
        _service(world.service, customer, found)
        for dns in world.compute:
            _dns(dns, customer, found)
        _workers(world.workers, customer, found)
        _logs(world, found)
        found.notes += list(world.notes)
    cert = customer.certificates.get(settings.frontend_secret)
    if cert is not None and settings.enabled:
        _certificate(cert, customer, found)
    elif customer.symptom and settings.enabled:
        _symptom_names(customer.symptom, settings.worker_domain, found)
    return found.findings(), found.notes, found.assumed


# -- the values ---------------------------------------------------------------------------------------
def _values(customer: Customer, found: _Found, service: ProxyService | None) -> None:
    s = proxy_settings(customer.values)
    wcp = ("workerCallbackProxy",)
    if not s.enabled:
        found.add(
            "proxy-disabled",
            f"{customer.cite((*wcp, 'enabled'))}: workerCallbackProxy.enabled is not true, and workers run in a "
            "compute cluster, which cannot reach control-plane pod IPs",
        )
        return
    kind = str(lookup(customer.values, (*wcp, "service", "type"), "ClusterIP"))
    if kind == "ClusterIP" and service is None:
        found.add(
            "proxy-unreachable",
            f"{customer.cite((*wcp, 'service', 'type'))}: workerCallbackProxy.service.type is ClusterIP: the "
            "Service has an address only inside the control plane's cluster",
        )
    url = lookup(customer.values, WEBHOOK_URL)
    if lookup(customer.values, WORKER_AUTH) == "token" and url != DEFAULT_WEBHOOK_URL:
        where = (
            f"the NVCF API serves at {url}, where the values send worker tokens"
            if api_from_webhook(customer.values) is not None
            else f"nothing answers at {url} (not an in-cluster Service on the webhook's path), so the auth "
            f"callout refuses worker tokens; the NVCF API serves at {DEFAULT_WEBHOOK_URL}"
        )
        found.assumed.append(
            Assumption(
                API,
                f"{customer.cite(WEBHOOK_URL)}: {where} (ncpsim cannot see where it runs)",
                "check the auth callout's log: it says `webhook request failed` when nothing answers there",
            )
        )
    if s.frontend_issuer == "stack" and not s.worker_ca_pem_set:
        found.add(
            "worker-ca-missing",
            f"{customer.cite(CA_PEM)}: no global.nvcaOperator.agent.workerCallbackCaPem, while the frontend "
            f"certificate comes from the stack's issuer (no tls.frontend.existingSecret or issuerRef at "
            f"{customer.cite((*wcp, 'tls', 'frontend'))}): workers with system roots reject it",
        )


# -- the bundle: the proxy Service ---------------------------------------------------------------------
def _service(service: ProxyService | None, customer: Customer, found: _Found) -> None:
    if service is None:
        return
    wanted = str(lookup(customer.values, ("workerCallbackProxy", "service", "type"), "ClusterIP"))
    if service.type != wanted:
        found.notes.append(
            f"{service.source}: the cluster's proxy Service is {service.type}, the values say {wanted}: "
            "the values were changed after the last helmfile sync (the cluster's is what workers meet)"
        )
    if service.pending:
        found.add(
            "proxy-lb-pending",
            f"{service.source}: Service worker-callback-proxy is type LoadBalancer, and "
            "status.loadBalancer has no ingress address: nothing outside the cluster can reach it yet",
        )
    elif service.type == "ClusterIP":
        found.add(
            "proxy-unreachable",
            f"{service.source}: Service worker-callback-proxy is type ClusterIP ({service.cluster_ip}), "
            "reachable only inside the control plane's cluster",
        )


# -- the bundle: each compute cluster's DNS ---------------------------------------------------------------
def _cited(dns: ComputeDns, r: Resolution) -> str:
    return "; ".join(
        f"{dns.cite(rule.origin)}: {rule.kind} {rule.match} {rule.name} -> {rule.target}" for rule in r.via
    )


def _dns(dns: ComputeDns, customer: Customer, found: _Found) -> None:
    domain = proxy_settings(customer.values).worker_domain
    service = customer.world.service if customer.world else None
    where = f"compute cluster {dns.context}"
    fates = callbacks(dns, domain, service)
    for c in fates:
        r = c.resolution
        if r.outcome == "address":
            _address(r, c.what, dns, where, service, found)
        elif r.outcome == "cluster-name":
            found.add(
                "rewrite-target-unresolved",
                f"{_cited(dns, r)}: {r.name} is looked up as {r.looked_up} in {where}, which resolves it only "
                "if it has that Service; the bundle does not show it, and the seed's rewrite target is one the "
                "compute cluster does not have yet (ncpsim replays it as missing: NXDOMAIN)",
            )
        elif c.fate == "other-domain":
            other = _other_domains(dns, domain, service)
            found.add(
                "rewrite-wrong-domain",
                f"{other[0]}: {where}'s CoreDNS answers callbacks for another domain; {r.name} matches none "
                f"of its rules and goes to the upstream resolver ({r.value})",
            )
        elif c.fate == "missing":
            found.add("rewrite-missing", _missing(c, fates, dns, where, domain))


def _missing(c: Callback, fates: list[Callback], dns: ComputeDns, where: str, domain: str) -> str:
    """Why a callback name has no answer: no block serves it, or a rule answers the other name only."""
    r = c.resolution
    answered = [o for o in fates if o.fate == "answered" and o is not c]
    if r.outcome != "forwarded" or not answered:
        return f"{dns.source}: {where} has no answer for {r.name} ({c.what} callbacks)"
    other = answered[0].resolution
    family = "<dashed-pod-ip>" if c.what == "gRPC" else "invocation"
    return (
        f"{_cited(dns, other)}: only {other.name} has a rule in {where}; {c.what} callbacks resolve "
        f"{family}.{domain} ({r.name}: no rule, so the upstream resolver {r.value}, taken to have none "
        "either), which no wildcard covers"
    )


def _address(
    r: Resolution, what: str, dns: ComputeDns, where: str, service: ProxyService | None, found: _Found
) -> None:
    if service is None:
        return  # the replay takes it for the proxy's address, and says so (records.py)
    if service.pending:  # no address to point at yet: proxy-lb-pending says so
        found.notes.append(
            f"{_cited(dns, r)}: {r.name} resolves to {r.value}; the load balancer has none yet"
        )
    elif r.value == service.cluster_ip:
        found.add(
            "proxy-unreachable",
            f"{_cited(dns, r)}: {r.name} resolves to {r.value}, the Service's ClusterIP ({service.source}), "
            f"which {where} cannot route to",
        )
    elif r.value not in service.addresses:
        has = ", ".join(service.addresses) or "none yet"
        found.add(
            "rewrite-wrong-address",
            f"{_cited(dns, r)}: {r.name} resolves to {r.value}, not the proxy's load-balancer address "
            f"({has}, {service.source}); {what} callbacks go elsewhere",
        )


def _other_domains(dns: ComputeDns, domain: str, service: ProxyService | None) -> list[str]:
    return [
        f"{dns.cite(r.origin)}: {r.kind} {r.match} {r.name}"
        for r in dns.meant_for_callbacks(domain, proxy_names(service))
    ]


# -- the frontend certificate ---------------------------------------------------------------------------
def _certificate(cert: Certificate, customer: Customer, found: _Found) -> None:
    s = proxy_settings(customer.values)
    names = ", ".join(cert.names) or "no DNS names"
    for host in (f"invocation.{s.worker_domain}", f"{GRPC_EXAMPLE}.{s.worker_domain}"):
        if not cert.covers(host):
            found.add(
                "frontend-certificate-names",
                f"{cert.source}: Secret {cert.secret}'s certificate is valid for {names}, not {host} "
                f"(workerDomain {s.worker_domain}, {customer.cite(('workerCallbackProxy', 'workerDomain'))})",
            )
    if cert.expired(customer.now):
        found.add(
            "frontend-expired",
            f"{cert.source}: Secret {cert.secret}'s certificate expired {cert.not_after:%Y-%m-%dT%H:%M:%SZ}",
        )
    pem = lookup(customer.values, CA_PEM)
    if (
        isinstance(pem, str)
        and "-----BEGIN" in pem
        and not cert.signed_by(pem)
        and not (cert.ca_pem and cert.signed_by(cert.ca_pem) and s.frontend_issuer != "stack")
    ):
        found.add(
            "worker-ca-stale",
            f"{customer.cite(CA_PEM)}: workerCallbackCaPem holds no certificate for the frontend's issuer "
            f"({cert.issuer}, {cert.source})",
        )


def names_in_symptom(symptom: str) -> tuple[tuple[str, ...], str] | None:
    """Go's `x509: certificate is valid for A, B, not C` -> ((A, B), C)."""
    m = _VALID_FOR.search(symptom)
    if m is None:
        return None
    names = tuple(n.strip() for n in m["names"].split(",") if n.strip())
    return names, m["host"].rstrip(".")


def _symptom_names(symptom: str, domain: str, found: _Found) -> None:
    parsed = names_in_symptom(symptom)
    if parsed is None:
        return
    names, host = parsed
    if not any(covers(n, f"invocation.{domain}") for n in names):
        found.add(
            "frontend-certificate-names",
            f"symptom: the certificate is valid for {', '.join(names)}, not {host}: none covers *.{domain} "
            "(judged from the message; give the certificate with --secret or a bundle to read it whole)",
        )


# -- the function pods ----------------------------------------------------------------------------------
def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _pem_hashes(pem: str) -> set[str]:
    return {f"sha256:{pem_sha256(v)}" for v in (pem, pem.rstrip("\n"), pem.rstrip("\n") + "\n")}


def _workers(groups: Sequence[Workers], customer: Customer, found: _Found) -> None:
    s = proxy_settings(customer.values)
    pem = lookup(customer.values, CA_PEM)
    for w in groups:
        pods = f"{len(w.pods)} function pod(s) in {w.context} ({', '.join(w.pods[:3])})"
        if w.worker_utils is not None and _version(w.worker_utils) < CONNECT_MIN and not s.connect_enabled:
            found.add(
                "legacy-worker-connect-off",
                f"{w.source}: {pods} run worker-utils {w.worker_utils}, which sends CONNECT; "
                f"workerCallbackProxy.invocation.connect.enabled is off",
            )
        if not (isinstance(pem, str) and pem.strip()) or s.frontend_issuer != "stack":
            continue
        if w.pem is None:
            found.add(
                "pem-not-redeployed", f"{w.source}: {pods} have no NVCF_PROXY_CA_PEM; the values set it"
            )
        elif w.pem not in _pem_hashes(pem) and w.pem != "unreadable":
            found.add(
                "pem-not-redeployed",
                f"{w.source}: {pods} carry NVCF_PROXY_CA_PEM {w.pem[:19]}..., not the values' "
                f"workerCallbackCaPem ({customer.cite(CA_PEM)}): they were created before it changed",
            )


# -- the logs -----------------------------------------------------------------------------------------
def _logs(world: BundleWorld, found: _Found) -> None:
    for line in world.callout_log:
        if "for account Worker" in line.text:
            found.add("nats-account-not-read", f"{line.source}: {line.text}")
        elif "webhook request failed" in line.text or "Authentication denied" in line.text:
            found.add("nats-auth-rejected", f"{line.source}: {line.text}")
    for line in world.proxy_log:
        record = parse_line(line.text) or {}
        if record.get("method") == "CONNECT" and (record.get("status"), record.get("flags")) == ("404", "NR"):
            found.add("legacy-worker-connect-off", f"{line.source}: {line.text}")
        elif (record.get("status"), record.get("flags")) == ("503", "UF"):
            found.add("pod-unreachable", f"{line.source}: {line.text}")
