"""Which probe stacks a diagnosis brings up, and with what: the customer's world, cluster by cluster.

From values and options (`-f`, `--rewrite`, `--secret`, `--workers`): one compute cluster, the probe
profiles asked for or the default ones. From a support bundle: each compute cluster with its DNS as its
CoreDNS answers, and the worker-utils and NVCF_PROXY_CA_PEM its function pods show (no what-ifs: the
bundle says what runs); the frontend Secret as the cluster holds it, in a stand-in (scenarios/bundle).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from scenarios.bundle.certificate import Certificate, read_certificate
from scenarios.bundle.scenario import dns_rewrite, replay_secrets, worker_profiles
from scenarios.bundle.standin import STANDIN_NOTE
from scenarios.bundle.world import BundleWorld
from scenarios.secrets import parse_secret_arg
from sim.model.untrusted import read_text
from sim.model.values import CA_PEM, deep_merge, proxy_settings

CURRENT = "1.4.0"  # a current worker-utils, for pods whose version a bundle does not show


@dataclass(frozen=True)
class Probe:
    """One probe stack: a worker profile's label, in a compute cluster as the customer has it."""

    label: str  # VERSION:TRUST[:FLAG...] (scenarios.diagnose.probe.parse_label)
    values: dict[str, Any]
    cluster: dict[str, Any] = field(default_factory=dict)  # the compute cluster's entry, without workers
    secrets: dict[str, Any] = field(default_factory=dict)  # topology.secrets
    brought: tuple[str, ...] = ()  # --secret NAME=DIR, used as it is


def brought_certificates(secrets: Sequence[str]) -> dict[str, Certificate]:
    """The certificates of `--secret NAME=DIR` folders, read as a bundle's are (tls.crt, ca.crt)."""
    found = {}
    for arg in secrets:
        name, folder = parse_secret_arg(arg)
        crt = read_text(folder / "tls.crt", "--secret certificate") if (folder / "tls.crt").is_file() else ""
        ca = read_text(folder / "ca.crt", "--secret certificate") if (folder / "ca.crt").is_file() else ""
        cert = read_certificate(name, crt, ca, "", str(folder / "tls.crt"))
        if cert is not None:
            found[name] = cert
    return found


def bundle_probes(
    world: BundleWorld, values: dict[str, Any], merged: dict[str, Any], scratch: Path, now: datetime
) -> tuple[list[Probe], list[str]]:
    """A probe per compute cluster and distinct function pod; (probes, notes on what they assume)."""
    settings = proxy_settings(merged)
    secrets = replay_secrets(world.certificates, merged, scratch, now)
    notes = list(secrets.notes)
    if secrets.declared:
        notes.append(STANDIN_NOTE)
    if secrets.pem is not None:
        values = deep_merge(values, _nested(CA_PEM, secrets.pem))
    profiles = worker_profiles(world, merged)
    if not world.compute:
        notes.append(
            f"no compute cluster in the bundle; probed from one with worker-utils {CURRENT} and the default DNS"
        )
        return [Probe(f"{CURRENT}:system", values, {}, secrets.declared)], notes
    probes = []
    for dns in world.compute or ():
        rewrite, said = dns_rewrite(dns, settings.worker_domain, world.service)
        notes += said
        found = profiles.get(dns.context) or []
        if not found:
            notes.append(
                f"compute cluster {dns.context}: no function pods in the bundle; probed with worker-utils {CURRENT}"
            )
        for p in found or [None]:
            version = (p.worker_utils if p else None) or CURRENT
            flags = ":before-pem" if p and p.before_pem else ""
            probes.append(
                Probe(f"{version}:system{flags}", values, {"dnsRewrite": rewrite}, secrets.declared)
            )
    return probes, notes


def _nested(parts: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(parts):
        out = {part: out}
    return dict(out)
