"""A bundle's world as the scenario pieces ncpsim replays it with (pure but for minting stand-ins).

Each compute cluster's DNS becomes its `dnsRewrite` as the Corefile answers `invocation.<workerDomain>`:
the load balancer's address is the proxy's; the Service's ClusterIP and any other address stay what they
are (unreachable from the compute cluster); a rewrite to a cluster name, which today's DNS model cannot
hold, replays as no answer (the seed's make target names a Service the compute cluster does not have);
a question forwarded to a resolver the bundle cannot see replays as the proxy's address, and says so;
rules for another domain replay under that domain. The function pods become worker profiles; Secrets
become declarations or stand-in folders (scenarios/bundle/standin.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from certs.profiles import FRONTEND_SECRETS
from scenarios.bundle.certificate import Certificate, pem_sha256
from scenarios.bundle.resolve import Rule, rule_domain
from scenarios.bundle.standin import StandInCa, issuer_kind, write_standin
from scenarios.bundle.world import BundleWorld, ComputeDns, ProxyService
from sim.model.topology import PROXY_CLUSTER_IP
from sim.model.values import CA_PEM, lookup, proxy_settings

DNS_MODEL_NOTE = (
    "today's DNS model holds a wildcard rewrite only (exact records and name targets are pending)"
)


def _target(address: str, service: ProxyService | None) -> str:
    if service is not None and address in service.addresses:
        return "proxy"
    if service is not None and address == service.cluster_ip:
        return PROXY_CLUSTER_IP
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return "none"
    return address


def _rule_target(rule: Rule, service: ProxyService | None) -> str:
    return _target(rule.target, service) if rule.kind in ("template", "hosts") else "proxy"


def dns_rewrite(
    dns: ComputeDns, domain: str, service: ProxyService | None
) -> tuple[dict[str, str], list[str]]:
    """(the cluster's `dnsRewrite` for a scenario, notes on what it assumes)."""
    http, grpc = dns.resolve(f"invocation.{domain}"), dns.resolve(f"10-42-0-41.{domain}")
    where = f"compute cluster {dns.context}"
    if http.outcome == "address":
        notes = []
        if grpc.outcome != "address":
            notes.append(
                f"{where}: only invocation.{domain} resolves; replayed as a wildcard ({DNS_MODEL_NOTE})"
            )
        return {"target": _target(http.value, service)}, notes
    if http.outcome == "cluster-name":
        return {"target": "none"}, [
            f"{where}: callbacks are rewritten to {http.looked_up}; replayed as not resolving ({DNS_MODEL_NOTE})"
        ]
    if http.outcome == "forwarded":
        proxy = (*(service.addresses if service else ()), "worker-callback-proxy")
        other = dns.meant_for_callbacks(domain, proxy)
        if other and len(http.via) == 1:
            return {"domain": rule_domain(other[0]), "target": _rule_target(other[0], service)}, []
        return {"target": "proxy"}, [
            f"{where}: {http.name} is forwarded to {http.value}; assumed to answer the proxy's address"
        ]
    return {"target": "none"}, []


@dataclass(frozen=True)
class WorkerProfile:
    worker_utils: str | None  # None: not known (no worker-utils image on the pods)
    before_pem: bool  # the pods carry no NVCF_PROXY_CA_PEM, or an older one than the values'


def worker_profiles(world: BundleWorld, values: Mapping[str, Any]) -> dict[str, list[WorkerProfile]]:
    """Each compute cluster's distinct function pods, by context."""
    pem = lookup(values, CA_PEM)
    given = isinstance(pem, str) and pem.strip() != ""
    hashes = (
        {f"sha256:{pem_sha256(v)}" for v in (pem, pem.rstrip("\n"), pem.rstrip("\n") + "\n")}
        if given
        else set()
    )
    out: dict[str, list[WorkerProfile]] = {d.context: [] for d in world.compute}
    for w in world.workers:
        stale = given and (w.pem is None or (w.pem not in hashes and w.pem != "unreadable"))
        profile = WorkerProfile(w.worker_utils, stale)
        if profile not in out.setdefault(w.context, []):
            out[w.context].append(profile)
    return out


@dataclass
class Secrets:
    """`topology.secrets` for a replay, the values' workerCallbackCaPem as it must then read, and how to
    renew each Secret (a ticket's fix): a declaration or stand-in of the renewed certificate."""

    declared: dict[str, dict[str, Any]] = field(default_factory=dict)
    pem: str | None = None  # the values' workerCallbackCaPem as replayed: the stand-in CA's, or @stack-ca
    standin_ca: str | None = None  # the stand-in CA's PEM (a private frontend's), to give workers as a fix
    renewed: dict[str, dict[str, Any]] = field(default_factory=dict)  # NAME-renewed declarations
    notes: list[str] = field(default_factory=list)


def replay_secrets(
    certificates: Mapping[str, Certificate],
    values: Mapping[str, Any],
    folder: Path,
    now: datetime,
    relative_to: Path | None = None,
    private: frozenset[str] = frozenset(),
) -> Secrets:
    """The frontend Secret as the customer's cluster holds it: declared for the replaying stack to issue (the
    stack's issuer, a public one), or minted as a stand-in into `folder` (their own CA, or one named in
    `private`: a CA workers were seen to reject). Sources are written relative to `relative_to`."""
    out = Secrets()
    s = proxy_settings(values)
    cert = certificates.get(s.frontend_secret)
    if cert is None or not s.enabled:
        return out
    pem = lookup(values, CA_PEM)
    kind = (
        "private"
        if cert.secret in private
        else issuer_kind(cert, s.frontend_issuer, pem if isinstance(pem, str) else None)
    )
    domain = s.worker_domain
    if kind != "private":
        if kind == "stack" and isinstance(pem, str) and cert.signed_by(pem):
            out.pem = "@stack-ca"  # the replaying stack's CA plays the customer's OpenBao PKI, so its PEM too
        as_stack = kind == "stack" and cert.names == (f"*.{domain}",)
        if not as_stack or cert.expired(now):  # what the stack issues anyway needs no declaration
            out.declared[cert.secret] = {
                "issuer": kind,
                "names": list(cert.names),
                "expired": cert.expired(now),
            }
        out.renewed[f"{cert.secret}-renewed"] = {"issuer": kind}
        if cert.secret in out.declared:
            out.notes.append(
                f"Secret {cert.secret}: replayed from the replaying stack's {kind} CA, with the customer's names"
                + (" (expired)" if cert.expired(now) else "")
            )
        return out
    ca = StandInCa(cert)
    base = relative_to or folder
    path = write_standin(folder / cert.secret, ca.leaf(), cert)
    out.declared[cert.secret] = {"source": str(path.relative_to(base))}
    renewed = write_standin(folder / f"{cert.secret}-renewed", ca.leaf((f"*.{domain}",)), cert)
    out.renewed[f"{cert.secret}-renewed"] = {"source": str(renewed.relative_to(base))}
    out.standin_ca = ca.ca.cert_pem.bytes().decode()
    if isinstance(pem, str) and cert.signed_by(pem):
        out.pem = out.standin_ca
    out.notes.append(f"Secret {cert.secret}: a stand-in from a stand-in of the customer's CA ({cert.issuer})")
    return out


def default_frontend(secret: str) -> bool:
    """A Secret the stack names itself (rotate: frontend renews it), not one the customer brings."""
    return secret in FRONTEND_SECRETS.values()
