"""Which probe stacks a diagnosis brings up, and with what: the customer's world, cluster by cluster.

From values and options (`-f`, `--rewrite`, `--secret`, `--workers`): one compute cluster, the probe
profiles asked for or the default ones. From a support bundle: each compute cluster with its DNS as its
CoreDNS answers, and the worker-utils and NVCF_PROXY_CA_PEM its function pods show (no what-ifs: the
bundle says what runs); the frontend Secret as the cluster holds it, in a stand-in (scenarios/bundle).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scenarios.bundle.archive import read_bundle
from scenarios.bundle.certificate import Certificate, read_certificate
from scenarios.bundle.records import replayed_dns
from scenarios.bundle.scenario import WorkerProfile, replay_secrets, worker_profiles
from scenarios.bundle.world import BundleWorld, Workers, read_world
from scenarios.diagnose.profiles import CURRENT, parse_label
from scenarios.load import scenario_from_data
from scenarios.secrets import parse_secret_arg
from scenarios.spec import Scenario
from sim.model.assumptions import DNS, WORKER_UTILS, Assumption
from sim.model.untrusted import read_text
from sim.model.values import CA_PEM, deep_merge, nested, proxy_settings

CALL_TIMEOUT = 3  # seconds a bundle world's call waits: a healthy callback takes milliseconds
NAME_THE_VERSION = "name what runs there with --workers VERSION:TRUST (or collect the pods again: pods.yaml)"


@dataclass(frozen=True)
class Probe:
    """One probe stack: a worker profile's label, in a compute cluster as the customer has it."""

    label: str  # VERSION:TRUST[:FLAG...] (scenarios.diagnose.profiles.parse_label)
    values: dict[str, Any]
    cluster: dict[str, Any] = field(default_factory=dict)  # the compute cluster's entry, without workers
    secrets: dict[str, Any] = field(default_factory=dict)  # topology.secrets
    brought: tuple[str, ...] = ()  # --secret NAME=DIR, used as it is
    context: str = ""  # the bundle's compute cluster


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
    world: BundleWorld,
    values: dict[str, Any],
    merged: dict[str, Any],
    scratch: Path,
    now: datetime,
    labels: Sequence[str] = (),
) -> tuple[list[Probe], list[Assumption]]:
    """A probe per compute cluster and distinct function pod (or per profile in `labels`, `--workers`:
    what the user says runs there); (probes, what they assume where the bundle is silent)."""
    settings = proxy_settings(merged)
    secrets = replay_secrets(world.certificates, merged, scratch, now)
    assumed = list(secrets.assumed)
    if secrets.pem is not None:
        values = deep_merge(values, nested(CA_PEM, secrets.pem))
    profiles = worker_profiles(world, merged)
    if not world.compute:
        assumed.append(
            Assumption(
                DNS,
                f"no compute cluster in the bundle: probed from one with worker-utils {CURRENT} and the "
                f"*.{settings.worker_domain} record for the proxy's address",
                "collect each compute context: collect.sh --compute CONTEXT",
            )
        )
        return [
            Probe(label, values, {}, secrets.declared) for label in labels or [f"{CURRENT}:system"]
        ], assumed
    probes = []
    for dns in world.compute:
        replayed = replayed_dns(dns, settings.worker_domain, world.service)
        assumed += replayed.assumed
        found = profiles.get(dns.context) or []
        assumed += [] if labels else _unknown_versions(dns.context, found, world.workers)
        cluster = replayed.cluster(settings.worker_domain)
        for label in list(labels) or [_label(p) for p in found] or [_label(None)]:
            probes.append(Probe(label, values, cluster, secrets.declared, context=dns.context))
    return probes, list(dict.fromkeys(assumed))


def _unknown_versions(context: str, found: list[WorkerProfile], pods: Sequence[Workers]) -> list[Assumption]:
    """Function pods whose worker-utils the bundle does not show, probed as a current one."""
    if not found:
        what = f"compute cluster {context}: no function pods in the bundle"
    elif any(p.worker_utils is None for p in found):
        shown = [w for w in pods if w.context == context and w.worker_utils is None]
        what = (
            f"{shown[0].source}: {len(shown[0].pods)} function pod(s) in {context} show no worker-utils image"
        )
    else:
        return []
    return [Assumption(WORKER_UTILS, f"{what}; probed with worker-utils {CURRENT}", NAME_THE_VERSION)]


def _label(profile: WorkerProfile | None) -> str:
    version = (profile.worker_utils if profile else None) or CURRENT
    return f"{version}:system" + (":before-pem" if profile and profile.before_pem else "")


def bundle_scenario(path: Path, scratch: Path, now: datetime) -> tuple[dict[str, Any], list[Assumption]]:
    """The customer's world from a bundle as a scenario (`up --bundle`, `replay --bundle`): their values,
    each compute cluster with its DNS and its function pods' worker-utils, their frontend Secret as a
    stand-in, and one HTTP and one gRPC callback expected to arrive; and the notes on what it assumes."""
    world = read_world(read_bundle(path))
    values = world.values.values if world.values else {}
    merged = deep_merge({}, values)
    probes, assumed = bundle_probes(world, dict(values), merged, scratch, now)
    clusters: dict[str, dict[str, Any]] = {}
    for probe in probes:
        entry = clusters.setdefault(probe.context, {**probe.cluster, "workers": []})
        entry["workers"].append(parse_label(probe.label).worker_group(1))
    call = {"count": 2, "timeout": CALL_TIMEOUT}
    steps = [
        {"name": f"{f} callbacks", "invoke": {"function": f, **call}, "expect": {"outcome": "success"}}
        for f in ("http-echo", "grpc-echo")
    ]
    slug = "".join(c if c.isalnum() else "-" for c in path.name.lower().removesuffix(".tar.gz")).strip("-")
    data = {
        "name": f"bundle-{slug}"[:40].rstrip("-"),
        "summary": f"the customer's world from support bundle {path.name}",
        "seed": 1,
        "values": probes[0].values if probes else dict(values),
        "topology": {
            "invocationReplicas": 2,
            "grpcProxyReplicas": 1,
            "computeClusters": list(clusters.values()),
            **({"secrets": probes[0].secrets} if probes and probes[0].secrets else {}),
        },
        "steps": steps,
    }
    return data, assumed


def load_bundle_scenario(
    path: Path,
    scratch: Path,
    files: Sequence[Path] = (),
    sets: Sequence[str] = (),
    now: datetime | None = None,
) -> tuple[Scenario, list[str]]:
    """`bundle_scenario` loaded as any scenario file is (schema, values checked, -f and --set on top), its
    stand-in Secrets minted into `scratch`, which must outlive the stack's start; and what it assumes, each
    a line (the command prints them as notes before anything starts)."""
    data, assumed = bundle_scenario(path, scratch, now or datetime.now(UTC))
    loaded = scenario_from_data(data, scratch / "bundle-scenario.yaml", None, list(files), sets=sets)
    return loaded, [str(a) for a in assumed]
