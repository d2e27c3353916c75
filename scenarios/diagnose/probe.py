"""Bring a customer's world up on the local backend and watch probe workers call back through it.

Each probe worker profile (worker-utils version and trust) gets a fresh stack of its own, so which worker
took which call is never in doubt: the customer's values, two invocation-service pods, one grpc-proxy pod
and one compute cluster whose only worker is that profile. Every callback it makes becomes an
Observation; scenarios.diagnose.judge turns them into findings.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from clusters.local import LocalBackend
from clusters.local.launcher import NATS_CALLOUT
from scenarios.bundle.archive import read_bundle
from scenarios.bundle.world import BundleWorld, read_world
from scenarios.diagnose.assumed import UNSEEN, probe_assumptions, unseen_certificate
from scenarios.diagnose.causes import BLOCKING, CAUSES
from scenarios.diagnose.facts import Customer, judge_facts
from scenarios.diagnose.judge import Finding, Observation, RenderIssue, World, cause_of, judge
from scenarios.diagnose.plan import Probe, brought_certificates, bundle_probes
from scenarios.diagnose.symptoms import rank
from scenarios.engine import run_scenario
from scenarios.model import load_scenario
from scenarios.result import ScenarioResult
from scenarios.secrets import with_brought_secrets
from scenarios.trace import CallTrace
from sim.errors import ConfigError
from sim.model.assumptions import Assumption
from sim.model.events import of_kind, read_events
from sim.model.layering import DEFAULT, Layered, defaults_layer, layer, parse_set
from sim.model.values import key_path, lookup, proxy_settings, validate
from sim.model.values_file import file_layer

CURRENT, LEGACY = "1.4.0", "1.2.9"  # worker-utils: forward-proxy callbacks from 1.3.2 on
PARALLEL_PROBES = 2  # probe stacks at once: start-up is CPU-bound, and two cores are the common laptop floor
PROBE_TIMEOUT = 2  # seconds a probe call waits: a healthy callback takes milliseconds, a failed one is told


BEFORE_PEM = "before-pem"  # the pod was created before workerCallbackCaPem was set (no NVCF_PROXY_CA_PEM)
NO_NATS_ACCOUNT = "no-nats-account"  # a worker-utils image that does not read NVCF_NATS_ACCOUNT
FLAGS = (BEFORE_PEM, NO_NATS_ACCOUNT)


@dataclass(frozen=True)
class Profile:
    worker_utils: str
    trust: str  # "system": system roots plus NVCF_PROXY_CA_PEM as the values give it; "stack": CA baked in
    flags: tuple[str, ...] = ()  # of FLAGS
    what_if: bool = False  # a default probe asking "what if such workers run?": its findings are notes

    @property
    def label(self) -> str:
        return ":".join((self.worker_utils, self.trust, *self.flags))

    def worker_group(self, count: int) -> dict[str, Any]:
        """The scenario file's worker group for this profile."""
        group: dict[str, Any] = {"count": count, "trust": self.trust, "workerUtils": self.worker_utils}
        if BEFORE_PEM in self.flags:
            group["createdBeforePem"] = True
        if NO_NATS_ACCOUNT in self.flags:
            group["readsNatsAccount"] = False
        return group


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
    assumptions: list[Assumption] = field(default_factory=list)  # what the probe stacks filled in
    not_modelled: list[str] = field(default_factory=list)  # values keys accepted, not modelled
    seconds: float = 0.0
    assumed: list[str] = field(default_factory=list)  # what the customer's files cannot show, as assumed
    bundle: str | None = None
    world: BundleWorld | None = None  # the bundle's facts (a ticket replays them)
    rewrite: Rewrite | None = None
    secrets: tuple[str, ...] = ()  # --secret NAME=DIR

    def ranked(self) -> list[Finding]:
        """Findings whose cause the symptom names come first, in the symptom table's order; then the most
        blocking (causes.BLOCKING: the order a callback meets them), errors before warnings."""
        order = {c: i for i, c in enumerate(self.symptom_causes)}
        blocking = {c: i for i, c in enumerate(BLOCKING)}
        return sorted(
            self.findings,
            key=lambda f: (
                order.get(f.cause.id, len(order)),
                f.cause.severity != "error",
                blocking.get(f.cause.id, len(blocking)),
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": [f.to_json() for f in self.ranked()],
            "warnings": self.warnings,
            "symptom": self.symptom,
            "symptomCauses": self.symptom_causes,
            "probes": self.probes,
            "notes": [f.to_json() for f in self.notes],
            "assumptions": [a.to_json() for a in self.assumptions],
            "notModelled": self.not_modelled,
            "assumed": self.assumed,
            "bundle": self.bundle,
            "seconds": round(self.seconds, 2),
        }


@dataclass(frozen=True)
class Rewrite:
    """What the customer's compute-cluster DNS holds for callbacks: `--rewrite DOMAIN=TARGET`, where TARGET
    is `proxy` (the proxy Service's address), an IPv4 address, a DNS name looked up instead, or `none`."""

    domain: str | None  # None: the values' workerDomain
    target: str

    @property
    def to_name(self) -> bool:
        """A rewrite to a name (the make target's), which the compute cluster must resolve itself."""
        return self.target not in ("proxy", "none") and not all(p.isdigit() for p in self.target.split("."))

    def to_topology(self) -> dict[str, Any]:
        return {"target": self.target, **({"domain": self.domain} if self.domain else {})}


def parse_rewrite(spec: str) -> Rewrite:
    domain, sep, target = spec.partition("=")
    if spec.strip() == "none":
        return Rewrite(None, "none")
    if not sep or not domain or not target:
        raise ConfigError(
            f"--rewrite {spec!r}: write DOMAIN=TARGET (TARGET: proxy, none, an IPv4 address or a DNS name), or none"
        )
    return Rewrite(domain.strip().lstrip("*.").rstrip("."), target.strip())


def parse_workers(spec: str) -> list[Profile]:
    """`1.2.9:system,1.4.0:stack:before-pem` -> profiles; a one-line error otherwise."""
    profiles = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        version, _, rest = item.partition(":")
        trust, *flags = rest.split(":")
        if (
            trust not in ("stack", "system")
            or not all(p.isdigit() for p in version.split("."))
            or any(f not in FLAGS for f in flags)
        ):
            raise ConfigError(
                f"--workers {item!r}: write VERSION:TRUST[:FLAG...], e.g. 1.2.9:system,1.4.0:stack "
                f"(trust is stack or system; flags: {', '.join(FLAGS)})"
            )
        profiles.append(Profile(version, trust, tuple(dict.fromkeys(flags))))
    return profiles


def parse_label(label: str) -> Profile:
    """A probe worker's label (VERSION:TRUST[:FLAG...]) back into its profile."""
    return parse_workers(label)[0]


def customer_values(files: Sequence[Path], sets: Sequence[str], world: BundleWorld | None = None) -> Layered:
    """Defaults < the bundle's environment.yaml < each -f file < --set, as Helm layers them."""
    bundled = [world.values] if world is not None and world.values is not None else []
    return layer([defaults_layer(), *bundled, *(file_layer(f) for f in files), *(parse_set(s) for s in sets)])


def customer_only(layered: Layered) -> dict[str, Any]:
    """The keys the customer's files and --set gave, with their merged values (for a ticket). Walked as key
    parts, never split on dots: `service.annotations."service.beta.kubernetes.io/aws-load-balancer-internal"`
    is one key under annotations, as the customer wrote it."""
    return _given(layered.values, (), layered)


def _given(values: dict[str, Any], parts: tuple[str, ...], layered: Layered) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        here = (*parts, str(key))
        origin = layered.origins.get(key_path(here))
        if isinstance(value, dict) and value:
            below = _given(value, here, layered)
            if below:
                out[key] = below
            elif origin is not None and origin.kind != DEFAULT and not _defaults_under(here, layered):
                out[key] = value  # a mapping set whole, its keys the customer's own
        elif origin is not None and origin.kind != DEFAULT:
            out[key] = value
    return out


def _defaults_under(parts: tuple[str, ...], layered: Layered) -> bool:
    prefix = key_path(parts)
    return any(p.startswith(prefix) and o.kind == DEFAULT for p, o in layered.origins.items() if p != prefix)


def world_of(values: dict[str, Any], dns: Rewrite | None = None, facts: Sequence[Finding] = ()) -> World:
    settings = proxy_settings(values)
    other_domain = bool(dns and dns.domain and dns.domain != settings.worker_domain) or any(
        f.cause.id == "rewrite-wrong-domain" for f in facts
    )
    said = {f.cause.id for f in facts}
    return World(
        proxy_enabled=settings.enabled,
        rewrite_other_domain=other_domain,
        lb_pending="proxy-lb-pending" in said,
        rewrite_to_name=(dns is not None and dns.to_name) or "rewrite-target-unresolved" in said,
        service_type=str(lookup(values, ("workerCallbackProxy", "service", "type"), "LoadBalancer")),
        frontend="stack" if settings.frontend_issuer == "stack" else "brought",
        pem_set=settings.worker_ca_pem_set,
        connect_enabled=settings.connect_enabled,
        worker_auth=str(lookup(values, ("nats", "workerAuth"), "nkey")),
        upstream_tls=settings.upstream_tls,
        pod_worker_tls=settings.pod_worker_tls,
    )


def default_profiles(world: World) -> list[Profile]:
    """A function pod as NVCA starts it (system roots plus NVCF_PROXY_CA_PEM when the values give one),
    with current worker-utils; then the what-ifs the values make worth asking: a worker-utils older than
    1.3.2, a pod created before the PEM was set, an image that does not read NVCF_NATS_ACCOUNT."""
    profiles = [Profile(CURRENT, "system"), Profile(LEGACY, "system", what_if=True)]
    if world.pem_set:
        profiles.append(Profile(CURRENT, "system", (BEFORE_PEM,), what_if=True))
    if world.worker_auth == "token":
        profiles.append(Profile(CURRENT, "system", (NO_NATS_ACCOUNT,), what_if=True))
    return profiles


def diagnose(
    files: Sequence[Path],
    sets: Sequence[str] = (),
    symptom: str | None = None,
    workers: str | None = None,
    root: Path | None = None,
    rewrite: str | None = None,
    secrets: Sequence[str] = (),
    bundle: Path | None = None,
    now: datetime | None = None,
) -> Diagnosis:
    started, now = time.monotonic(), now or datetime.now(UTC)
    bundled = read_world(read_bundle(bundle)) if bundle is not None else None
    layered = customer_values(files, sets, bundled)
    warnings = [str(u) for u in layered.unknown]
    issues = [
        RenderIssue(i.path, i.message, f"{i.file}:{i.line}" if i.file else "")
        for i in validate(layered.values, layered.locations())
    ]
    dns = parse_rewrite(rewrite) if rewrite else None
    certificates = {**(bundled.certificates if bundled else {}), **brought_certificates(secrets)}
    customer = Customer(layered.values, layered.locations(), now, certificates, bundled, symptom)
    facts, assumed = judge_facts(customer) if not issues else ([], [])
    world = world_of(layered.values, dns, facts) if not issues else World(proxy_enabled=False)
    with tempfile.TemporaryDirectory(prefix="ncpsim-diagnose-") as scratch:  # stand-in Secrets, probe stacks
        if issues:
            probes, profiles = [], []
        elif bundled is not None:
            labels = [p.label for p in parse_workers(workers)] if workers else []
            args = (customer_only(layered), layered.values, Path(scratch), now, labels)
            probes, said = bundle_probes(bundled, *args)
            assumed += said
            profiles = [parse_label(p.label) for p in probes]
        else:
            profiles = parse_workers(workers) if workers else default_profiles(world)
            compute = {"dnsRewrite": dns.to_topology()} if dns else {}
            probes = [Probe(p.label, layered.values, compute, brought=tuple(secrets)) for p in profiles]
        observations = observe(probes, root, Path(scratch))
    findings = merge(facts, judge(issues, observations, world))
    # A what-if probe asks "what if some workers are old, or predate the PEM?": what only such probes hit
    # is a note, unless the symptom points at it (with --workers, the user said such workers run).
    named = {c.id for c in rank(symptom)} if symptom else set()
    what_if = {p.label for p in profiles if p.what_if}
    hit_by: dict[str, list[str]] = {}  # cause id -> the probe workers that hit it, in probe order
    for obs in observations:
        cause = cause_of(obs, world)
        if cause is not None:
            hit_by.setdefault(cause, []).append(obs.probe)
    notes = [
        f
        for f in findings
        if f.cause.id not in named and f.cause.id in hit_by and set(hit_by[f.cause.id]) <= what_if
    ]
    result = Diagnosis(
        [f for f in findings if f not in notes],
        warnings,
        symptom,
        [c.id for c in rank(symptom)] if symptom else [],
        [p.label for p in profiles],
        notes,
    )
    result.probe_of = {cause: probes[0] for cause, probes in hit_by.items()}
    result.values = customer_only(layered)
    result.refusal = issues[0].message if issues else None
    result.not_modelled = [str(a) for a in layered.accepted]
    if not issues:
        result.assumptions = probe_assumptions(layered.values, [p.worker_utils for p in profiles], secrets)
    result.assumed, result.bundle, result.world = assumed, str(bundle) if bundle else None, bundled
    result.rewrite, result.secrets = dns, tuple(secrets)
    result.seconds = time.monotonic() - started
    return result


def merge(facts: list[Finding], observed: list[Finding]) -> list[Finding]:
    """One finding per cause: what the files show, then what the probes saw."""
    evidence: dict[str, list[str]] = {}
    causes = {}
    for finding in (*facts, *observed):
        causes[finding.cause.id] = finding.cause
        evidence.setdefault(finding.cause.id, []).extend(
            e for e in finding.evidence if e not in evidence.get(finding.cause.id, [])
        )
    return [Finding(causes[c], tuple(ev)) for c, ev in evidence.items()]


def observe(probes: list[Probe], root: Path | None, scratch: Path) -> list[Observation]:
    """Every probe's stack, PARALLEL_PROBES at a time (each is isolated: own ports, own state folder),
    so a diagnosis with its what-if probes costs about what two stacks cost one after the other."""
    backend = LocalBackend(root or scratch / "state")
    names = [f"diagnose-{n}" for n in range(len(probes))]
    with ThreadPoolExecutor(max_workers=PARALLEL_PROBES, thread_name_prefix="probe") as pool:
        futures = [
            pool.submit(_probe, backend, scratch, name, probe)
            for name, probe in zip(names, probes, strict=True)
        ]
        try:
            return [obs for future in futures for obs in future.result()]
        except BaseException:  # Ctrl-C: start nothing more, and stop every probe stack already started
            pool.shutdown(wait=False, cancel_futures=True)
            for name in names:
                backend.attach(name).down(purge=True)
            raise


def _probe(backend: LocalBackend, scratch: Path, name: str, probe: Probe) -> list[Observation]:
    profile = parse_label(probe.label)
    path = scratch / f"{name}.yaml"
    path.write_text(yaml.safe_dump(probe_scenario(probe, profile), sort_keys=False))
    scenario = with_brought_secrets(load_scenario(str(path)), list(probe.brought))  # the customer's own certs
    stack = backend.attach(name)
    try:
        result = run_scenario(scenario, backend, name, keep=False)
        events = read_events(stack.state_dir)
        # a login refused once and then accepted (timed out on a busy machine) explains nothing
        signed_in = {e.get("worker") for e in of_kind(events, "worker.nats.connected")}
        refused = [e for e in of_kind(events, "worker.nats.refused") if e.get("worker") not in signed_in]
        return observations_of(result, profile, refused, callout_refusals(stack.logs().get(NATS_CALLOUT)))
    finally:
        # A start that failed has stopped what it started, and may leave no stack folder to purge: its own
        # error is the one to report (the scratch folder goes with the diagnosis).
        with contextlib.suppress(ConfigError):
            stack.down(purge=True)


FAILED = "Authentication failed"  # the callout's line for a refused login, with its reason


def callout_refusals(log: str | None) -> list[str]:
    """The auth callout's "Authentication failed" lines (from its log file): its reason, which nats-server
    does not pass on to the client (the worker only sees 'Authorization Violation')."""
    if log is None or not Path(log).exists():
        return []
    lines = Path(log).read_text(errors="replace").splitlines()
    return [line[line.index(FAILED) :].strip() for line in lines if FAILED in line]


def probe_scenario(probe: Probe, profile: Profile) -> dict[str, Any]:
    values = probe.values
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
            "computeClusters": [{"workers": [profile.worker_group(1)], **probe.cluster}],
            **({"secrets": probe.secrets} if probe.secrets else {}),
        },
        "steps": steps,
    }


def observations_of(
    result: ScenarioResult,
    profile: Profile,
    refused: Sequence[dict[str, Any]] = (),
    callout: Sequence[str] = (),
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
            f"NATS sign-in refused ({first.get('credentials')}): {first.get('error')}"
            + (f"; auth callout log: {callout[0]}" if callout else ""),
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
        BEFORE_PEM in profile.flags,
    )


def text(d: Diagnosis) -> str:
    lines = [
        (
            f"ncpsim diagnose: {len(d.findings)} finding(s) in {d.seconds:.1f}s "
            f"(probe workers: {', '.join(d.probes)})"
        )
    ]
    if d.bundle:
        lines.append(f"bundle: {d.bundle} (evidence cites its files and lines)")
    lines += [f"warning: {w}" for w in d.warnings]
    lines += d.not_modelled + [str(a) for a in d.assumptions]
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
    lines += [f"note: {a}" for a in d.assumed]
    if not d.findings:
        lines.append("no findings: the current workers' callbacks arrived")
        if unseen_certificate(d.assumptions):
            lines.append(f"but {UNSEEN}")
        if d.symptom_causes:
            lines.append("the symptom's documented causes, most likely first:")
            lines += [
                f"  - {CAUSES[c].id}: {CAUSES[c].title} (fix: {CAUSES[c].fix})" for c in d.symptom_causes
            ]
    return "\n".join(lines)
