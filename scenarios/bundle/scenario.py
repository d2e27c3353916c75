"""A bundle's world as the scenario pieces ncpsim replays it with (pure but for minting stand-ins).

The function pods become worker profiles; Secrets become declarations or stand-in folders
(scenarios/bundle/standin.py), each said as assumed: ncpsim never has the customer's key. Each compute
cluster's DNS is records.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from certs.profiles import FRONTEND_SECRETS
from scenarios.bundle.certificate import Certificate, pem_sha256
from scenarios.bundle.standin import StandInCa, issuer_kind, write_standin
from scenarios.bundle.world import BundleWorld
from sim.model.assumptions import KEYLESS, Assumption
from sim.model.values import CA_PEM, lookup, proxy_settings

# ncpsim has no private key of the customer's certificates (tls.key never leaves the cluster)
KEYLESS_BRING = (
    "ncpsim never has the key (tls.key never leaves the cluster); replay the Secret itself with "
    "--secret NAME=DIR (tls.crt, tls.key) where the customer can share it"
)


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
    assumed: list[Assumption] = field(default_factory=list)


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
            out.assumed.append(
                Assumption(
                    KEYLESS,
                    f"Secret {cert.secret}: a stand-in from the replaying stack's {kind} CA with the "
                    f"customer's names, issuer kind and dates" + (" (expired)" if cert.expired(now) else ""),
                    KEYLESS_BRING,
                )
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
    out.assumed.append(
        Assumption(
            KEYLESS,
            f"Secret {cert.secret}: a stand-in with the customer's names and dates, from a stand-in of "
            f"their CA ({cert.issuer}), which the replay's workerCallbackCaPem names in its place",
            KEYLESS_BRING,
        )
    )
    return out


def default_frontend(secret: str) -> bool:
    """A Secret the stack names itself (rotate: frontend renews it), not one the customer brings."""
    return secret in FRONTEND_SECRETS.values()
