"""Per-invocation traces joined from the components' events and the proxy's access log (pure)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CallTrace:
    step: int
    index: int
    function: str
    pod: str  # the replica that accepted (HTTP) or minted the token (gRPC)
    request_id: str | None = None
    client_status: int = 0
    body_ok: bool = False
    outcome: str = "pending"  # success | failure
    error: str | None = None
    worker: str | None = None
    worker_stage: str | None = None
    worker_statuses: list[int] = field(default_factory=list)
    dns: dict[str, Any] = field(default_factory=dict)
    via: str | None = None  # proxy | direct
    proxy: list[dict[str, str]] = field(default_factory=list)  # access-log records of this request
    pod_legs: list[dict[str, Any]] = field(default_factory=list)  # attach.get/post or grpc callback events
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the proxy's routing decisions, with reasons
    elapsed_ms: int = 0
    kind: str = "invoke"  # invoke | probe (a crafted request straight to the proxy)
    method: str | None = None  # probes: the request line the prober sent
    target: str | None = None

    @property
    def callee_pods(self) -> set[str]:
        return {leg["pod"] for leg in self.pod_legs if leg.get("status") == 200}

    @property
    def landed(self) -> str | None:
        """"holder" when every callback leg reached the pod holding the request, "other" when one did not."""
        pods = {leg["pod"] for leg in self.pod_legs if leg.get("pod")}
        if not pods:
            return None
        return "holder" if pods == {self.pod} else "other"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


POD_LEG_KINDS = ("attach.get", "attach.post", "grpc.callback.accepted", "grpc.callback.rejected")
PROBE_LEG_KINDS = ("pod.request",)  # a probe must not reach a pod at all, whatever the path


def join(trace: CallTrace, events: list[dict[str, Any]], access: list[dict[str, str]]) -> CallTrace:
    """Fill a trace from everything the stack recorded about its request id."""
    rid = trace.request_id
    if rid is None:
        return trace
    for event in events:
        if event.get("requestId") != rid:
            continue
        kind = event["kind"]
        if kind == "worker.callback.result":
            trace.worker = event.get("worker")
            trace.worker_stage = event.get("stage")
            trace.worker_statuses = list(event.get("statuses") or [])
            trace.dns = event.get("dns") or {}
            if not event.get("ok"):
                trace.error = trace.error or event.get("error")
        elif kind in (PROBE_LEG_KINDS if trace.kind == "probe" else POD_LEG_KINDS):
            trace.pod_legs.append(_leg(kind, event))
        elif kind == "proxy.decision":
            trace.decisions.append({k: event.get(k) for k in ("method", "target", "decision", "status", "flag",
                                                             "reason")})
        elif kind == "worker.callback.start":
            trace.via = "proxy" if event.get("proxy") else "direct"
    trace.proxy = [rec for rec in access if rec.get("request_id") == rid]
    return trace


def _leg(kind: str, event: dict[str, Any]) -> dict[str, Any]:
    status = event.get("status", None if kind == "pod.request" else 200)  # a bare request has no status yet
    return {"kind": kind, "pod": event.get("pod"), "status": status, "reason": event.get("reason"),
            "path": event.get("path")}
