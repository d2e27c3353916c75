"""Per-invocation traces joined from the components' events and the proxy's access log (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from sim.model.events import (
    ATTACH_LEGS,
    CALLBACK_RESULT,
    CALLBACK_START,
    POD_LEGS,
    POD_REQUEST,
    PROBE_LEGS,
    PROXY_DECISION,
    CallbackResult,
    CallbackStart,
    Decision,
    Event,
    PodLeg,
    of_kind,
)


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
    error: str | None = None  # as the field logs it: the Go worker's line when the worker failed
    cause: str | None = None  # ncpsim's own account of the worker's failure, beside that line
    worker: str | None = None
    worker_stage: str | None = None
    worker_statuses: list[int] = field(default_factory=list)
    dns: dict[str, Any] = field(default_factory=dict)
    connections: list[str] = field(default_factory=list)  # the worker's per leg: "new" or "reused"
    via: str | None = None  # proxy | direct
    proxy: list[dict[str, str]] = field(default_factory=list)  # access-log records of this request
    pod_legs: list[dict[str, Any]] = field(default_factory=list)  # attach.get/post or grpc callback events
    decisions: list[dict[str, Any]] = field(
        default_factory=list
    )  # the proxy's routing decisions, with reasons
    elapsed_ms: int = 0
    kind: str = "invoke"  # invoke | probe (a crafted request straight to the proxy)
    method: str | None = None  # probes: the request line the prober sent
    target: str | None = None

    @property
    def callee_pods(self) -> set[str]:
        return {leg["pod"] for leg in self.pod_legs if leg.get("status") == 200}

    @property
    def lookup(self) -> str:
        """What the worker's DNS lookup answered; "kept alive" when it looked nothing up, its connection to
        the proxy (or pod) being one kept from an earlier callback."""
        if self.dns:
            return str(self.dns.get("answer") or self.dns.get("rcode") or "-")
        return "kept alive" if "reused" in self.connections else "-"

    @property
    def landed(self) -> str | None:
        """ "holder" when every callback leg reached the pod holding the request, "other" when one did not."""
        pods = {leg["pod"] for leg in self.pod_legs if leg.get("pod")}
        if not pods:
            return None
        return "holder" if pods == {self.pod} else "other"

    def to_dict(self) -> dict[str, Any]:
        """The trace's fields, for a JSON document: not deep-copied as dataclasses.asdict would (a report
        serializes every trace of a replay at once, and nothing mutates what it is handed)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def join(trace: CallTrace, events: list[Event], access: list[dict[str, str]]) -> CallTrace:
    """Fill a trace from everything the stack recorded about its request.

    Workers send no X-Request-Id (worker-utils does not), so the proxy's lines carry ids the proxy made
    up. A line is this call's when a pod leg of this call received that id (the pod's events record the
    X-Request-Id the proxy sent, and the fingerprint of the bearer token the worker was handed); a line
    that never reached a pod (UF, DF, NR, a CONNECT tunnel) is matched by pod name and time (proxy_lines)."""
    rid = trace.request_id
    if rid is None:
        return trace
    tokens = _tokens(rid, events)
    legs = PROBE_LEGS if trace.kind == "probe" else POD_LEGS
    for event in events:
        kind = event["kind"]
        if event.get("requestId") != rid and not (kind in ATTACH_LEGS and event.get("token") in tokens):
            continue
        if kind == CALLBACK_RESULT:
            _worker_result(trace, CallbackResult.read(event))
        elif kind in legs:
            trace.pod_legs.append(PodLeg.read(event).as_dict())
        elif kind == PROXY_DECISION:
            trace.decisions.append(Decision.read(event).as_dict())
        elif kind == CALLBACK_START:
            trace.via = "proxy" if CallbackStart.read(event).proxy else "direct"
    trace.proxy = proxy_lines(rid, events, access)
    ids = {rec["request_id"] for rec in trace.proxy} - {rid}
    trace.decisions += [
        decision.as_dict()
        for decision in map(Decision.read, of_kind(events, PROXY_DECISION))
        if decision.request_id in ids
    ]
    return trace


def _worker_result(trace: CallTrace, result: CallbackResult) -> None:
    trace.worker, trace.worker_stage = result.worker, result.stage
    trace.worker_statuses, trace.dns = list(result.statuses), result.dns
    trace.connections = list(result.connections)
    if not result.ok:
        # The worker's cause (DNS rcode, TLS error, the status and message it got) explains a failure
        # better than what the client saw of it (a 504, or gRPC's DEADLINE_EXCEEDED).
        trace.error = result.error or trace.error
        trace.cause = result.cause


WINDOW_SLACK = 0.01  # START_TIME is truncated to the millisecond; event times are not


def _starts(events: list[Event]) -> list[CallbackStart]:
    return [CallbackStart.read(e) for e in events if e["kind"] == CALLBACK_START]


def _attach_legs(events: list[Event]) -> list[PodLeg]:
    return [PodLeg.read(e) for e in events if e["kind"] in ATTACH_LEGS]


def _tokens(rid: str, events: list[Event]) -> set[str]:
    """Fingerprints of the bearer tokens the worker of request `rid` was handed (HTTP callbacks)."""
    return {t for start in _starts(events) if start.request_id == rid for t in start.tokens}


def proxy_lines(rid: str, events: list[Event], access: list[dict[str, str]]) -> list[dict[str, str]]:
    """The access-log lines of request `rid`: those carrying its id (gRPC callbacks and probes send one),
    those whose id a pod leg of this request received, and the one line of a proxied HTTP callback that
    never reached a pod, matched by pod host and the callback's time."""
    tokens = _tokens(rid, events)
    ids = {rid} | {
        leg.x_request_id
        for leg in _attach_legs(events)
        if leg.x_request_id and (leg.request_id == rid or leg.token in tokens)
    }
    unreached = _unreached(events, access)
    return [rec for i, rec in enumerate(access) if rec.get("request_id") in ids or unreached.get(i) == rid]


def _unreached(events: list[Event], access: list[dict[str, str]]) -> dict[int, str]:
    """Access-log lines that reached no pod, each given to the proxied HTTP callback it belongs to: same pod
    host, started within the callback's time, the callback that ends first. A callback has at most one
    such line: the leg the proxy refused (which ends the callback), or a legacy worker's CONNECT."""
    attach, starts = _attach_legs(events), _starts(events)
    reached = {leg.x_request_id for leg in attach} | {
        e.get("requestId") for e in of_kind(events, POD_REQUEST)
    }
    results = {e.get("requestId"): CallbackResult.read(e) for e in of_kind(events, CALLBACK_RESULT)}
    owners = {t: start.request_id for start in starts for t in start.tokens}
    legs: dict[str, int] = {}  # lines each callback has through pods (the proxy's id in a pod's event)
    for leg in attach:
        if leg.x_request_id:
            owner = owners.get(leg.token or "") or leg.request_id or ""
            legs[owner] = legs.get(owner, 0) + 1
    waiting = []
    for start in sorted((s for s in starts if s.callback == "http" and s.proxy), key=lambda s: s.ts):
        rid = str(start.request_id)
        result = results.get(rid)
        if result is not None and not _needs_unreached(start, result, legs.get(rid, 0)):
            continue  # every leg it sent reached a pod, or it never got a request to the proxy (DNS, TLS)
        end = result.ts if result else float("inf")
        waiting.append((rid, urlsplit(start.target or "").hostname, start.ts, end))
    lines = sorted(
        (_epoch(rec.get("start", "")), i, rec.get("authority", "").rsplit(":", 1)[0])
        for i, rec in enumerate(access)
        if rec.get("request_id") not in reached and rec.get("protocol") == "HTTP/1.1"
    )
    out: dict[int, str] = {}
    # By start time, each line to the callback containing it that ends first: as many callbacks get their
    # line as can. Lines are written as tunnels close, not as they open; taken in the log's order, a line to
    # the earliest callback containing it could take the line of a longer callback started earlier, whose
    # own line then fell in no other's time (two legacy workers' CONNECTs to one pod, under load).
    for at, i, host in lines:
        fits = [
            (end, begin, n)
            for n, (_, target_host, begin, end) in enumerate(waiting)
            if host == target_host and begin - WINDOW_SLACK <= at <= end + WINDOW_SLACK
        ]
        if fits:
            out[i] = waiting.pop(min(fits)[2])[0]
    return out


LEGS_SENT = {"get": 1, "post": 2, "done": 2}  # callback legs a worker had sent when it stopped at that stage


def _needs_unreached(start: CallbackStart, result: CallbackResult, through_pods: int) -> bool:
    """Did this finished callback leave a line that reached no pod? A legacy worker's CONNECT always does
    once the proxy answered it; otherwise a leg it sent that no pod received (refused, or cut off)."""
    if start.connect:
        return bool(result.statuses)
    return LEGS_SENT.get(str(result.stage), 0) > through_pods


def _epoch(start: str) -> float:
    try:
        return datetime.strptime(start, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0
