"""Bring a customer's world up on the local backend and watch probe workers call back through it.

Each probe worker profile (worker-utils version and trust) gets a fresh stack of its own, so which worker
took which call is never in doubt: the customer's values, two invocation-service pods, one grpc-proxy pod
and one compute cluster whose only worker is that profile. Every callback it makes becomes an
Observation; scenarios.diagnose.judge turns them into findings.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clusters.local import LocalBackend
from scenarios.diagnose.causes import CAUSES
from scenarios.diagnose.judge import Finding, Observation, RenderIssue, World, cause_of, judge
from scenarios.diagnose.symptoms import rank
from scenarios.diagnose.ticket import ticket, write
from scenarios.engine import run_scenario
from scenarios.model import load_scenario
from scenarios.result import ScenarioResult
from scenarios.secrets import with_brought_secrets
from scenarios.trace import CallTrace
from sim.errors import ConfigError
from sim.model.events import of_kind, read_events
from sim.model.layering import DEFAULT, Layered, defaults_layer, layer, parse_set
from sim.model.values import lookup, proxy_settings, validate
from sim.model.values_file import file_layer

CURRENT, LEGACY = "1.4.0", "1.2.9"  # worker-utils: forward-proxy callbacks from 1.3.2 on
PROBE_TIMEOUT = 2  # seconds a probe call waits: a healthy callback takes milliseconds, a failed one is told


@dataclass(frozen=True)
class Profile:
    worker_utils: str
    trust: str  # "system": system roots plus NVCF_PROXY_CA_PEM as the values give it; "stack": CA baked in

    @property
    def label(self) -> str:
        return f"{self.worker_utils}:{self.trust}"


@dataclass
class Diagnosis:
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)
    symptom: str | None = None
    symptom_causes: list[str] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)  # what only the default older-worker probe hit
    probe_of: dict[str, str] = field(default_factory=dict)  # cause id -> the first probe worker that hit it
    values: dict[str, Any] = field(default_factory=dict)  # what the customer set (no chart defaults)
    refusal: str | None = None  # the first render refusal's message
    seconds: float = 0.0

    def ranked(self) -> list[Finding]:
        """Findings whose cause the symptom names come first, in the symptom table's order."""
        order = {c: i for i, c in enumerate(self.symptom_causes)}
        return sorted(
            self.findings, key=lambda f: (order.get(f.cause.id, len(order)), f.cause.severity != "error")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": [f.to_json() for f in self.ranked()],
            "warnings": self.warnings,
            "symptom": self.symptom,
            "symptomCauses": self.symptom_causes,
            "probes": self.probes,
            "notes": [f.to_json() for f in self.notes],
            "seconds": round(self.seconds, 2),
        }


@dataclass(frozen=True)
class Rewrite:
    """What the customer's compute-cluster DNS holds for callbacks: `--rewrite DOMAIN=TARGET`, where TARGET
    is `proxy` (the proxy Service's address), an IPv4 address, or `none` (no rewrite at all)."""

    domain: str | None  # None: the values' workerDomain
    target: str

    def to_topology(self) -> dict[str, Any]:
        return {"target": self.target, **({"domain": self.domain} if self.domain else {})}


def parse_rewrite(spec: str) -> Rewrite:
    domain, sep, target = spec.partition("=")
    if spec.strip() == "none":
        return Rewrite(None, "none")
    if not sep or not domain or not target:
        raise ConfigError(
            f"--rewrite {spec!r}: write DOMAIN=TARGET (TARGET: proxy, none or an IPv4 address), or none"
        )
    return Rewrite(domain.strip().lstrip("*.").rstrip("."), target.strip())


def parse_workers(spec: str) -> list[Profile]:
    """`1.2.9:system,1.4.0:stack` -> profiles; a one-line error otherwise."""
    profiles = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        version, _, trust = item.partition(":")
        if trust not in ("stack", "system") or not all(p.isdigit() for p in version.split(".")):
            raise ConfigError(
                f"--workers {item!r}: write VERSION:TRUST, e.g. 1.2.9:system,1.4.0:stack "
                f"(trust is stack or system)"
            )
        profiles.append(Profile(version, trust))
    return profiles


def customer_values(files: Sequence[Path], sets: Sequence[str]) -> Layered:
    return layer([defaults_layer(), *(file_layer(f) for f in files), *(parse_set(s) for s in sets)])


def customer_only(layered: Layered) -> dict[str, Any]:
    """The keys the customer's files and --set gave, with their merged values (for a ticket)."""
    out: dict[str, Any] = {}
    for path, origin in layered.origins.items():
        if origin.kind != DEFAULT:
            parts = tuple(path.split("."))
            node = out
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = lookup(layered.values, parts)
    return out


def write_ticket(d: Diagnosis, path: Path) -> list[Path]:
    """The top finding as a scenario that reproduces it and ends with its fix, and the values beside it."""
    if not d.findings:
        raise ConfigError("no finding to write a ticket for")
    top = d.ranked()[0]
    scenario = ticket(top, d.values, d.probe_of.get(top.cause.id, f"{CURRENT}:system"), d.refusal)
    return write(path, scenario, d.values)


def world_of(values: dict[str, Any], dns: Rewrite | None = None) -> World:
    settings = proxy_settings(values)
    other_domain = bool(dns and dns.domain and dns.domain != settings.worker_domain)
    return World(
        proxy_enabled=settings.enabled,
        rewrite_other_domain=other_domain,
        service_type=str(lookup(values, ("workerCallbackProxy", "service", "type"), "LoadBalancer")),
        frontend="stack" if settings.frontend_issuer == "stack" else "brought",
        pem_set=settings.worker_ca_pem_set,
        connect_enabled=settings.connect_enabled,
    )


def default_profiles(world: World) -> list[Profile]:
    """A function pod as NVCA starts it (system roots plus NVCF_PROXY_CA_PEM when the values give one),
    with current worker-utils and with one older than 1.3.2."""
    return [Profile(CURRENT, "system"), Profile(LEGACY, "system")]


def diagnose(
    files: Sequence[Path],
    sets: Sequence[str] = (),
    symptom: str | None = None,
    workers: str | None = None,
    root: Path | None = None,
    rewrite: str | None = None,
    secrets: Sequence[str] = (),
) -> Diagnosis:
    started = time.monotonic()
    layered = customer_values(files, sets)
    warnings = [str(u) for u in layered.unknown]
    issues = [
        RenderIssue(i.path, i.message, f"{i.file}:{i.line}" if i.file else "")
        for i in validate(layered.values, layered.locations())
    ]
    dns = parse_rewrite(rewrite) if rewrite else None
    world = world_of(layered.values, dns) if not issues else World(proxy_enabled=False)
    profiles = parse_workers(workers) if workers else default_profiles(world)
    observations = [] if issues else observe(layered.values, profiles, root, dns, secrets)
    findings = judge(issues, observations, world)
    # The default older-worker probe asks "what if some workers are old?": its failure is a note, unless
    # the user said such workers run (--workers) or the symptom points at it.
    named = {c.id for c in rank(symptom)} if symptom else set()
    notes = [
        f
        for f in findings
        if f.cause.id == "legacy-worker-connect-off" and not workers and f.cause.id not in named
    ]
    result = Diagnosis(
        [f for f in findings if f not in notes],
        warnings,
        symptom,
        [c.id for c in rank(symptom)] if symptom else [],
        [p.label for p in profiles],
        notes,
    )
    for obs in reversed(observations):
        cause = cause_of(obs, world)
        if cause is not None:
            result.probe_of[cause] = obs.probe
    result.values = customer_only(layered)
    result.refusal = issues[0].message if issues else None
    result.seconds = time.monotonic() - started
    return result


def observe(
    values: dict[str, Any],
    profiles: list[Profile],
    root: Path | None,
    dns: Rewrite | None = None,
    secrets: Sequence[str] = (),
) -> list[Observation]:
    with tempfile.TemporaryDirectory(prefix="ncpsim-diagnose-") as scratch:
        backend = LocalBackend(root or Path(scratch) / "state")
        found: list[Observation] = []
        for n, profile in enumerate(profiles):
            path = Path(scratch) / f"probe-{n}.yaml"
            path.write_text(yaml.safe_dump(probe_scenario(values, profile, dns), sort_keys=False))
            scenario = with_brought_secrets(
                load_scenario(str(path)), list(secrets)
            )  # the customer's own certs
            result = run_scenario(scenario, backend, f"diagnose-{n}", keep=False)
            refused = of_kind(read_events(backend.attach(f"diagnose-{n}").state_dir), "worker.nats.refused")
            found += observations_of(result, profile, refused)
            backend.attach(f"diagnose-{n}").down(purge=True)
        return found


def probe_scenario(values: dict[str, Any], profile: Profile, dns: Rewrite | None = None) -> dict[str, Any]:
    grpc = lookup(
        values, ("workerCallbackProxy", "enabled"), False
    )  # gRPC callbacks need the proxy's H3 front
    call = {"count": 1, "timeout": PROBE_TIMEOUT}
    steps: list[dict[str, Any]] = [
        {
            "name": "HTTP callback",
            "invoke": {"function": "http-echo", **call},
            "expect": {"outcome": "success"},
        }
    ]
    if grpc:
        steps.append(
            {
                "name": "gRPC callback",
                "invoke": {"function": "grpc-echo", **call},
                "expect": {"outcome": "success"},
            }
        )
    return {
        "name": f"diagnose-{profile.worker_utils.replace('.', '-')}-{profile.trust}",
        "summary": "a customer's values, probed by one worker profile",
        "seed": 1,
        "values": values,
        "topology": {
            "invocationReplicas": 2,
            "grpcProxyReplicas": 1 if grpc else 0,
            "computeClusters": [
                {
                    "workers": [{"count": 1, "trust": profile.trust, "workerUtils": profile.worker_utils}],
                    **({"dnsRewrite": dns.to_topology()} if dns else {}),
                }
            ],
        },
        "steps": steps,
    }


def observations_of(
    result: ScenarioResult, profile: Profile, refused: list[dict[str, Any]] = ()
) -> list[Observation]:
    """Each call's observation; a worker that NATS refused never took work, so the calls it never took
    are explained by the refusal (its error as the callout and the server gave it), not by a timeout."""
    if result.error and not result.steps:
        return [Observation(profile.label, "-", False, "stack", result.error)]
    traces = [t for step in result.steps for t in step.traces]
    if refused:
        first = refused[0]
        nats = Observation(
            profile.label,
            ",".join(first.get("functions", [])),
            False,
            "nats",
            f"NATS sign-in refused ({first.get('credentials')}): {first.get('error')}",
        )
        return [nats] + [observation(t, profile) for t in traces if t.worker is not None]
    return [observation(t, profile) for t in traces]


def observation(t: CallTrace, profile: Profile) -> Observation:
    ok = t.outcome == "success"
    proxy = tuple((int(r.get("status", 0) or 0), str(r.get("flags", "-"))) for r in t.proxy)
    rcode = (t.dns or {}).get("rcode")
    return Observation(
        profile.label,
        t.function,
        ok,
        None if ok else t.worker_stage,
        None if ok else t.error,
        rcode if rcode and rcode != "NOERROR" else None,
        tuple(t.worker_statuses),
        proxy,
    )


def text(d: Diagnosis) -> str:
    lines = [
        (
            f"ncpsim diagnose: {len(d.findings)} finding(s) in {d.seconds:.1f}s "
            f"(probe workers: {', '.join(d.probes)})"
        )
    ]
    lines += [f"warning: {w}" for w in d.warnings]
    if d.symptom:
        named = ", ".join(d.symptom_causes) or "no documented cause matches"
        lines.append(f"symptom {d.symptom!r}: {named}")
    for n, f in enumerate(d.ranked(), start=1):
        lines.append(f"{n}. [{f.cause.severity}] {f.cause.id}: {f.cause.title}")
        lines += [f"   observed: {e}" for e in f.evidence]
        lines.append(f"   seed: {f.cause.section}")
        lines.append(f"   fix: {f.cause.fix}")
    for f in d.notes:
        lines.append(
            f"note: {f.cause.title} ({f.cause.id}): {'; '.join(f.evidence)}; if such workers run: "
            f"{f.cause.fix}"
        )
    if not d.findings:
        lines.append("no findings: the current workers' callbacks arrived")
        if d.symptom_causes:
            lines.append("the symptom's documented causes, most likely first:")
            lines += [
                f"  - {CAUSES[c].id}: {CAUSES[c].title} (fix: {CAUSES[c].fix})" for c in d.symptom_causes
            ]
    return "\n".join(lines)
