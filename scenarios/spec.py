"""What a scenario says, as frozen values: steps, expectations, probes, wait conditions (pure).

`scenarios.load` reads files into these; the engine runs them; `scenarios.expect` judges traces by them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dns.rule import DnsRecord
from sim.errors import ConfigError
from sim.model.layering import STEP, Layer, Layered, then
from sim.model.parts import NO_REWRITE, REWRITE_TO_PROXY, DnsRewrite, SecretSpec, WorkerSpec
from sim.model.topology import ComputeSpec, Topology, build

DEFAULT_WORKER_UTILS = "1.4.0"
PLACEHOLDER = re.compile(r"\{([A-Za-z0-9]+)\}")  # in probe targets, filled from the topology
PLACEHOLDERS = ("pod", "pod1", "podIp", "workerDomain")


@dataclass(frozen=True)
class When:
    """Which calls an expectation is about (all of them when empty)."""

    landed: str | None = None  # "holder": callbacks reached the pod holding the request; "other": another pod
    trust: str | None = None
    worker_utils: str | None = None
    cluster: str | None = None
    worker: str | None = None

    def describe(self) -> str:
        parts = [
            f"{k}={v}"
            for k, v in (
                ("landed", self.landed),
                ("trust", self.trust),
                ("workerUtils", self.worker_utils),
                ("cluster", self.cluster),
                ("worker", self.worker),
            )
            if v is not None
        ]
        return ", ".join(parts)


@dataclass(frozen=True)
class LogExpect:
    """Lines of a component's log a step expects: those containing `contains` and matching `matches`, between
    `at_least` and `at_most` of them (None: unbounded), among the step's lines or the whole log."""

    component: str
    contains: str | None = None
    matches: str | None = None  # a Python regular expression, searched in each line
    at_least: int | None = 1
    at_most: int | None = None
    lines: str = "step"  # "step": written while the step ran | "all": the whole log

    def describe(self) -> str:
        what = " and ".join(
            part
            for part in (
                f"containing {self.contains!r}" if self.contains is not None else "",
                f"matching /{self.matches}/" if self.matches is not None else "",
            )
            if part
        )
        if self.at_least == self.at_most:
            bound = f"exactly {self.at_least}"
        elif self.at_most is None:
            bound = f"at least {self.at_least or 0}"
        elif not self.at_least:
            bound = f"at most {self.at_most}"
        else:
            bound = f"{self.at_least} to {self.at_most}"
        scope = "written during the step" if self.lines == "step" else "in the whole log"
        return f"{bound} line(s) of {self.component} {what}, {scope}"


@dataclass(frozen=True)
class Expect:
    outcome: str | None = "success"
    via: str | None = None  # "proxy" | "direct"
    same_pod: bool | None = None
    proxy_status: int | None = None
    proxy_flag: str | None = None
    callee_status: int | None = None  # the status the first callback leg got back
    error: str | None = None  # substring of the failure the worker (or prober) reports
    upstream_port: int | None = None  # the pod port the proxy forwarded to
    dns_rcode: str | None = None  # NOERROR, NXDOMAIN, ... of the worker's first lookup
    pod_contacted: bool | None = None  # did any pod see a request for this call (probes: must not)
    when: When | None = None
    at_least: int | None = None  # calls that must match `when`
    fix: str | None = None  # runbook steps: the step the report must name as the fix
    log: LogExpect | None = None  # an entry of its own: lines of a component's log (no call checks)
    refused: str | None = None  # an entry of its own: the step's values change is refused with this text


@dataclass(frozen=True)
class ProbeTarget:
    method: str
    target: str  # may hold {pod}, {podIp}, {workerDomain}: the engine fills them in


@dataclass(frozen=True)
class Probe:
    targets: tuple[ProbeTarget, ...]
    cluster: str | None = None


@dataclass(frozen=True)
class Wait:
    event: str | None = None
    where: dict[str, Any] = field(default_factory=dict)
    count: int = 1
    listener: str | None = None  # "POD:PORT"
    bound: bool = True
    timeout: float = 5.0

    def describe(self) -> str:
        if self.listener:
            return f"{self.listener} {'bound' if self.bound else 'not bound'}"
        where = ", ".join(f"{k}={v}" for k, v in self.where.items())
        return f"{self.count} {self.event} event(s)" + (f" with {where}" if where else "")


@dataclass(frozen=True)
class Step:
    index: int  # 1-based, as reports name it
    name: str
    invoke: dict[str, Any] | None = None
    set_values: dict[str, Any] | None = None
    unset_values: tuple[str, ...] | None = None  # key paths back to the chart's defaults (before setValues)
    redeploy: str | None = None
    probe: Probe | None = None
    wait: Wait | None = None
    expects: tuple[Expect, ...] = ()
    fault: dict[str, Any] | None = None  # scenarios.faults action, e.g. {"kill": "invocation-service-0"}
    fault_after_ms: int | None = None  # with invoke: fire the fault this long after the calls start
    rotate: str | None = None  # certs.rotate kind
    runbook: dict[str, str] | None = None  # {"name": ..., "variant": "right" | "wrong"[, "install": ...]}
    dns_rewrite: dict[str, Any] | None = None  # every compute cluster's CoreDNS rewrite from this step on
    dns_records: list[dict[str, Any]] | None = None  # every compute cluster's DNS records from this step on

    @property
    def label(self) -> str:
        return f"step {self.index} ({self.name})"

    @property
    def refused(self) -> str | None:
        """The text this step's values change must be refused with (helmfile sync's), when it expects that."""
        return next((e.refused for e in self.expects if e.refused is not None), None)

    @property
    def expect(self) -> Expect | None:
        """The first expectation (most steps have one)."""
        return self.expects[0] if self.expects else None


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    path: Path
    seed: int
    values: dict[str, Any]  # merged as Helm does: defaults < scenario values < -f files < --set
    topology: dict[str, Any]
    steps: tuple[Step, ...]
    origin: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    expect_error: str | None = None  # an error scenario: the values must be refused with this text
    config_error: str | None = None  # what loading refused (error scenarios only)
    layering: Layered | None = None  # each key's origin, the overridden scenario values, unknown keys

    @property
    def stackless(self) -> bool:
        """Only runbook steps: nothing runs on the clusters, so no stack is brought up."""
        return bool(self.steps) and all(step.runbook is not None for step in self.steps)

    def layered_at(self, step: Step) -> Layered | None:
        """The values as `step` sees them, each key with its origin: the scenario's, the customer's `-f`
        and `--set`, then every `setValues` up to and including this step's (Helm's order)."""
        layered = self.layering
        for earlier in self.steps[: step.index]:
            if layered is not None and earlier.set_values is not None and earlier.refused is None:
                layered = then(layered, Layer(STEP, f"step {earlier.index}", earlier.set_values))
        return layered

    def build_topology(self, stack: str, values: dict[str, Any] | None = None) -> Topology:
        spec = self.topology
        compute = tuple(
            ComputeSpec(
                workers=_workers(c.get("workers", []), f"worker-{n}"),
                rewrite=_rewrite(c, DnsRewrite()),
                records=_records(c, f"topology.computeClusters[{n - 1}]"),
            )
            for n, c in enumerate(spec.get("computeClusters", []), start=1)
        )
        control = spec.get("controlPlane", {})
        return build(
            stack,
            values if values is not None else self.values,
            invocation_replicas=spec.get("invocationReplicas", 2),
            grpc_replicas=spec.get("grpcProxyReplicas", 2),
            compute=compute,
            control_workers=_workers(spec.get("controlWorkers", []), "worker-cp"),
            control_rewrite=_rewrite(control, None),
            control_records=_records(control, "topology.controlPlane"),
            secrets=_secrets(spec, self.path.parent),
            seed=self.seed,
        )


def _rewrite(cluster: dict[str, Any], default: DnsRewrite | None) -> DnsRewrite | None:
    """`dnsRewrite: {domain, target}`; `wildcardDns: false` is the older spelling of `target: none`. A
    cluster that lists its `dnsRecords` has no other rewrite unless it names one: its DNS is what it lists."""
    if "dnsRewrite" in cluster:
        raw = cluster["dnsRewrite"]
        return DnsRewrite(domain=raw.get("domain"), target=raw.get("target", REWRITE_TO_PROXY))
    if cluster.get("wildcardDns") is False or "dnsRecords" in cluster:
        return DnsRewrite(target=NO_REWRITE)
    return default


def dns_records(raw: list[dict[str, Any]]) -> tuple[DnsRecord, ...]:
    """`dnsRecords: [{kind, name, target}, ...]` as DnsRecords; ValueError names the first bad one."""
    return tuple(DnsRecord(r["kind"], r["name"], r["target"]) for r in raw)


def _records(cluster: dict[str, Any], where: str) -> tuple[DnsRecord, ...]:
    try:
        return dns_records(cluster.get("dnsRecords", []))
    except ValueError as exc:
        raise ConfigError(f"{where}.dnsRecords: {exc}") from None


def _secrets(spec: dict[str, Any], base: Path) -> tuple[SecretSpec, ...]:
    """`topology.secrets`; a `source` folder is read relative to the scenario file (a ticket's own)."""
    return tuple(
        SecretSpec(
            name,
            raw.get("issuer", "public"),
            tuple(raw.get("names", ())),
            bool(raw.get("expired", False)),
            str(base / raw["source"]) if raw.get("source") else None,
        )
        for name, raw in (spec.get("secrets") or {}).items()
    )


def _workers(groups: list[dict[str, Any]], prefix: str) -> tuple[WorkerSpec, ...]:
    workers: list[WorkerSpec] = []
    for group in groups:
        for _ in range(group.get("count", 1)):
            version = group.get("workerUtils", DEFAULT_WORKER_UTILS)
            workers.append(
                WorkerSpec(
                    f"{prefix}-{len(workers)}",
                    "",
                    version,
                    group.get("trust", "system"),
                    reads_nats_account=group.get("readsNatsAccount", True),
                    created_before_pem=group.get("createdBeforePem", False),
                )
            )
    return tuple(workers)


# -- from parsed YAML (already checked against the schema) ------------------------------------------
_EXPECT_KEYS = {
    "outcome": "outcome",
    "via": "via",
    "samePod": "same_pod",
    "proxyStatus": "proxy_status",
    "proxyFlag": "proxy_flag",
    "calleeStatus": "callee_status",
    "error": "error",
    "upstreamPort": "upstream_port",
    "dnsRcode": "dns_rcode",
    "podContacted": "pod_contacted",
    "atLeast": "at_least",
    "fix": "fix",
}
_WHEN_KEYS = {
    "landed": "landed",
    "trust": "trust",
    "workerUtils": "worker_utils",
    "cluster": "cluster",
    "worker": "worker",
}
ACTIONS = ("invoke", "probe", "wait", "runbook")
CHANGES = (
    "setValues",
    "unsetValues",
    "redeploy",
    "dnsRewrite",
    "dnsRecords",
    "fault",
    "rotate",
)  # what a step may do before its action


def log_from(raw: dict[str, Any]) -> LogExpect:
    count = raw.get("count") or {"min": 1}
    low, high = (count["exactly"],) * 2 if "exactly" in count else (count.get("min"), count.get("max"))
    return LogExpect(
        raw["component"], raw.get("contains"), raw.get("matches"), low, high, raw.get("lines", "step")
    )


def expect_from(raw: dict[str, Any]) -> Expect:
    if "log" in raw:  # about a log, not about the calls: no outcome to check
        return Expect(outcome=None, log=log_from(raw["log"]))
    if "refused" in raw:  # about the step's values change, not about calls
        return Expect(outcome=None, refused=raw["refused"])
    fields: dict[str, Any] = {py: raw[key] for key, py in _EXPECT_KEYS.items() if key in raw}
    if "when" in raw:
        when = raw["when"]
        fields["when"] = When(**{py: when[key] for key, py in _WHEN_KEYS.items() if key in when})
    if "outcome" not in raw and "podContacted" in raw:
        fields["outcome"] = None  # a probe's outcome is its proxy status; "success" would mean nothing
    return Expect(**fields)


def probe_from(raw: dict[str, Any]) -> Probe:
    targets = []
    for item in raw["targets"]:
        if isinstance(item, dict):
            targets.append(ProbeTarget(item.get("method", "GET"), item["target"]))
        else:
            method, _, rest = item.partition(" ")
            is_method = bool(rest) and method.isalpha() and method.isupper()
            targets.append(ProbeTarget(method, rest.strip()) if is_method else ProbeTarget("GET", item))
    return Probe(tuple(targets), raw.get("cluster"))


def wait_from(raw: dict[str, Any]) -> Wait:
    return Wait(
        event=raw.get("event"),
        where=dict(raw.get("where") or {}),
        count=raw.get("count", 1),
        listener=raw.get("listener"),
        bound=raw.get("bound", True),
        timeout=raw.get("timeout", 5.0),
    )


def step_from(index: int, raw: dict[str, Any]) -> Step:
    kind = next((k for k in (*ACTIONS, *CHANGES) if k in raw), "step")
    expect = raw.get("expect")
    listed = expect if isinstance(expect, list) else [expect] if expect else []
    expects = tuple(expect_from(e) for e in listed)
    return Step(
        index=index,
        name=raw.get("name", kind),
        invoke=raw.get("invoke"),
        set_values=raw.get("setValues"),
        unset_values=tuple(raw["unsetValues"]) if "unsetValues" in raw else None,
        redeploy=raw.get("redeploy"),
        probe=probe_from(raw["probe"]) if "probe" in raw else None,
        wait=wait_from(raw["wait"]) if "wait" in raw else None,
        expects=expects,
        fault=raw.get("fault"),
        fault_after_ms=raw.get("faultAfterMs"),
        rotate=raw.get("rotate"),
        runbook=raw.get("runbook"),
        dns_rewrite=raw.get("dnsRewrite"),
        dns_records=raw.get("dnsRecords"),
    )
