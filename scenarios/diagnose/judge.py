"""Observations of a customer's world turned into findings, most serious first (pure).

Render-time refusals come first: in the field the render fails and nothing deploys. Then what the probe
workers saw, one finding per cause, each carrying the probe and its evidence (DNS rcode, TLS error,
status and response flag). A healthy world gives no findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scenarios.diagnose.causes import CAUSES, Cause

SPLIT_PLANE_KEYS = (
    "global.workerEndpoints.invocationServiceURL",
    "global.workerEndpoints.grpcProxyWorkerConnectURL",
    "grpcproxy.workerConnectBaseURL",
    "invocation.env.WORKER_STREAM_PROPERTIES__SELF_ADDRESS",
)
RENDER_CAUSES = (
    ("global.workerEndpoints.invocationProxyURL", "invocation-proxy-url"),
    ("nats.authCallout.workerTokenAuth.webhookUrl", "callout-webhook-empty"),
    ("nats.workerAuth", "nats-auth-mode"),
    ("podAnnotations", "pod-annotations"),
)


@dataclass(frozen=True)
class World:
    """What the values say, as far as diagnosis needs it."""

    proxy_enabled: bool
    service_type: str = "LoadBalancer"
    frontend: str = "stack"  # "stack" (OpenBao issuer) | "brought" (existingSecret or a public issuerRef)
    pem_set: bool = False
    connect_enabled: bool = False
    compute_clusters: int = 1
    rewrite_other_domain: bool = False  # the customer's rewrite names another domain than the workerDomain
    lb_pending: bool = False  # a support bundle shows the LoadBalancer Service without an address
    rewrite_to_name: bool = False  # a bundle's rewrite makes CoreDNS look up a name the cluster may lack
    worker_auth: str = "nkey"  # nats.workerAuth
    upstream_tls: bool = True  # the proxy dials the pod's 8443 with TLS
    pod_worker_tls: bool = True  # the pod's 8443 worker TLS listener is on


@dataclass(frozen=True)
class RenderIssue:
    path: str
    message: str
    where: str = ""  # FILE:LINE when known


@dataclass(frozen=True)
class Observation:
    """One callback a probe worker made, as the stack recorded it."""

    probe: str  # the probe worker, e.g. "1.4.0:stack"
    function: str
    ok: bool
    stage: str | None = None  # dns | connect | tls | get | post | ... (where the worker failed)
    error: str | None = None
    dns_rcode: str | None = None
    statuses: tuple[int, ...] = ()
    proxy: tuple[tuple[int, str], ...] = ()  # (status, response flag) per access-log line
    before_pem: bool = False  # the probe worker's pod predates workerCallbackCaPem (no NVCF_PROXY_CA_PEM)


@dataclass(frozen=True)
class Finding:
    cause: Cause
    evidence: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        c = self.cause
        return {
            "id": c.id,
            "severity": c.severity,
            "title": c.title,
            "section": c.section,
            "fix": c.fix,
            "evidence": list(self.evidence),
        }


def render_finding(issue: RenderIssue) -> Finding:
    cause = (
        "split-plane-url"
        if issue.path in SPLIT_PLANE_KEYS
        else next((c for key, c in RENDER_CAUSES if key in issue.path), "values-refused")
    )
    where = f"{issue.where}: " if issue.where else ""
    return Finding(CAUSES[cause], (f"render refused: {where}{issue.path}: {issue.message}",))


def cause_of(obs: Observation, world: World) -> str | None:
    """The documented cause of one failed callback (None when it succeeded)."""
    if obs.ok:
        return None
    error, stage = (obs.error or "").lower(), obs.stage or ""
    if stage == "nats":
        return "nats-account-not-read" if "for account worker" in error else "nats-auth-rejected"
    if not world.proxy_enabled and world.compute_clusters:
        return "proxy-disabled"  # compute workers are handed pod names they can neither resolve nor reach
    if stage == "dns" or obs.dns_rcode in ("NXDOMAIN", "SERVFAIL"):
        if world.rewrite_other_domain:
            return "rewrite-wrong-domain"
        return "rewrite-target-unresolved" if world.rewrite_to_name else "rewrite-missing"
    if stage == "connect" and 404 in obs.statuses:  # a legacy worker's CONNECT, refused
        return "legacy-worker-connect-off"
    unreached = not obs.statuses and any(word in error for word in UNREACHED)  # no answer: not Envoy's body
    if stage == "connect" or unreached:
        if world.service_type != "LoadBalancer":
            return "proxy-unreachable"
        return "proxy-lb-pending" if world.lb_pending else "rewrite-wrong-address"
    if stage == "tls" or "failed to verify certificate" in error or "no valid pem certs" in error:
        return _tls_cause(obs, world, error)
    return _status_cause(obs, world)


# What a Go worker's error says when the proxy was not reached (sim.protocols.go_errors).
UNREACHED = ("no route to host", "connection refused", "i/o timeout", "no recent network activity")
NAMES_MISMATCH = (
    "is valid for",
    "not valid for any names",
    "hostname mismatch",
    "doesn't match",
)  # Go's first


def _tls_cause(obs: Observation, world: World, error: str) -> str:
    if "expired" in error or "no longer valid" in error:  # Python's ssl, aioquic's words
        return "frontend-expired"
    if any(words in error for words in NAMES_MISMATCH):
        return "frontend-certificate-names"
    if "no valid pem certs" in error:
        return "worker-ca-stale"  # the PEM pasted into workerCallbackCaPem holds no certificate
    if world.pem_set and obs.before_pem:
        return "pem-not-redeployed"  # the values have the PEM; this worker's pod was created without it
    if world.pem_set:
        return "worker-ca-stale"  # the workers got a PEM, and it does not sign what they were shown
    return "frontend-private-ca" if world.frontend == "brought" else "worker-ca-missing"


def _status_cause(obs: Observation, world: World) -> str:
    statuses = set(obs.statuses) | {s for s, _ in obs.proxy}
    flags = {f for _, f in obs.proxy}
    if 503 in statuses or "UF" in flags or "CERTIFICATE_VERIFY_FAILED" in (obs.error or ""):
        if "CERTIFICATE_VERIFY_FAILED" in (obs.error or ""):
            return "pod-cert-untrusted"
        # the values say the proxy dials a listener the pod does not open
        return (
            "upstream-tls-mismatch" if world.upstream_tls and not world.pod_worker_tls else "pod-unreachable"
        )
    if 404 in statuses or "NR" in flags:
        return "wrong-path"
    if 401 in statuses:
        return "callback-wrong-pod"
    return "pod-unreachable"


def judge(issues: list[RenderIssue], observations: list[Observation], world: World) -> list[Finding]:
    """Every finding, render refusals first, then errors before warnings, each cause once."""
    findings = [render_finding(i) for i in issues]
    if findings:
        return findings  # the render fails in the field: nothing deploys, so nothing else can be probed
    evidence: dict[str, list[str]] = {}
    for obs in observations:
        cause = cause_of(obs, world)
        if cause is not None:
            evidence.setdefault(cause, []).append(_evidence(obs))
    found = [Finding(CAUSES[c], tuple(dict.fromkeys(ev))) for c, ev in evidence.items()]
    return sorted(found, key=lambda f: f.cause.severity != "error")


def _evidence(obs: Observation) -> str:
    parts = [f"probe worker {obs.probe}, {obs.function}"]
    if obs.stage:
        parts.append(f"failed at {obs.stage}")
    if obs.dns_rcode:
        parts.append(f"DNS {obs.dns_rcode}")
    parts += [f"proxy {status} {flag}" for status, flag in obs.proxy]
    if obs.error:
        parts.append(obs.error[:400])  # room for the auth callout's line after the client's error
    return "; ".join(parts)
