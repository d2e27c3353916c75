"""A sequence diagram per scenario: lanes for client, worker, DNS, proxy and pods, drawn from call traces.

`diagram()` is pure (a result in, lanes and rows out); `mermaid()` renders Mermaid text and
`scenarios.sequence_html` a self-contained HTML page with an inline SVG drawing of the same rows.
Calls whose sequences look alike (same lanes, same messages) are drawn once with their call numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scenarios.result import ScenarioResult, StepResult
from scenarios.trace import CallTrace

MAX_GROUPS_PER_STEP = 16  # more distinct shapes than this in one step would drown the picture


@dataclass(frozen=True)
class Lane:
    id: str  # Mermaid participant id: letters, digits, underscores
    label: str


@dataclass(frozen=True)
class Message:
    src: str
    dst: str
    label: str
    style: str = "call"  # call | reply | fail


@dataclass(frozen=True)
class Note:
    text: str


Row = Message | Note


@dataclass(frozen=True)
class Diagram:
    title: str
    ok: bool
    lanes: tuple[Lane, ...]
    rows: tuple[Row, ...]
    failures: tuple[str, ...] = ()


BASE_LANES = (Lane("client", "client"), Lane("worker", "worker"), Lane("dns", "DNS"), Lane("proxy", "proxy"))


def pod_lane(name: str) -> str:
    return "pod_" + re.sub(r"[^A-Za-z0-9]", "_", name)


class _Calls:
    """Builds the rows of one call; knows which pod stands behind an upstream address."""

    def __init__(self, pod_by_ip: dict[str, str]):
        self.pod_by_ip = pod_by_ip
        self.rows: list[Message] = []

    def say(self, src: str, dst: str, label: str, style: str = "call") -> None:
        self.rows.append(Message(src, dst, label, style))

    def invoke(self, t: CallTrace) -> list[Message]:
        holder = pod_lane(t.pod)
        grpc = t.function == "grpc-echo"
        pexec = f"POST /v2/nvcf/pexec/functions/{t.function}"
        self.say("client", holder, "gRPC Echo call (h2c)" if grpc else pexec)
        self.say(holder, "worker", "work message (NATS): target and proxy address", "reply")
        self.dns(t)
        if t.via == "direct":
            self.direct(t)
        else:
            self.proxied(t)
        self.finish(t, holder)
        return self.rows

    def dns(self, t: CallTrace) -> None:
        if not t.dns:
            return
        self.say("worker", "dns", f"A {t.dns.get('name', '?')}")
        answer = t.dns.get("answer")
        rcode = str(t.dns.get("rcode", "no answer"))
        self.say("dns", "worker", answer or rcode, "reply" if answer else "fail")

    def proxied(self, t: CallTrace) -> None:
        if not t.proxy and t.worker_stage in ("tls", "connect", "worker"):
            self.say("worker", "proxy", f"{t.worker_stage}: {t.error}", "fail")
            return
        for rec in t.proxy:
            self.proxy_record(rec)
        if not any(rec["method"] == "CONNECT" and rec["status"] == "200" for rec in t.proxy):
            return
        # A legacy worker's own TLS session and requests to the pod, inside the CONNECT tunnel.
        if t.worker_stage == "tls":
            self.say("worker", pod_lane(t.pod), f"TLS through the tunnel: {t.error}", "fail")
        for leg in t.pod_legs:
            pod = pod_lane(leg["pod"] or t.pod)
            self.say(
                "worker",
                pod,
                f"{leg['kind'].split('.')[-1].upper()} /v2/nvcf/worker/request-attach (inside the tunnel)",
            )
            self.say(pod, "worker", str(leg.get("status")), "reply" if leg.get("status") == 200 else "fail")

    def proxy_record(self, rec: dict[str, str]) -> None:
        method = rec["method"]
        target = rec["authority"] if method == "CONNECT" else f"http://{rec['authority']}{rec['path']}"
        if rec.get("protocol") == "HTTP/3":  # a gRPC callback: QUIC to the proxy, re-encrypted to the pod
            target = f"https://{rec['authority']}{rec['path']} (HTTP/3)"
        self.say("worker", "proxy", f"{method} {target}")
        status = int(rec["status"])
        upstream = rec["upstream_host"]
        if upstream not in ("-", ""):
            pod = pod_lane(self.pod_by_ip.get(upstream.split(":")[0], upstream))
            if method == "CONNECT":
                self.say("proxy", pod, f"TCP to {upstream} (raw tunnel)")
            else:
                self.say("proxy", pod, f"{method} {rec['path']} to {upstream}")
                self.say(pod, "proxy", str(status), "reply" if status < 400 else "fail")
        self.say("proxy", "worker", f"{status} {rec['flags']}", "reply" if status < 400 else "fail")

    def direct(self, t: CallTrace) -> None:
        for leg in t.pod_legs:
            pod = pod_lane(leg["pod"] or t.pod)
            self.say("worker", pod, f"{leg['kind'].split('.')[-1].upper()} /v2/nvcf/worker/request-attach")
            ok = leg.get("status") == 200
            answer = f"{leg.get('status')} {leg.get('reason') or ''}".strip()
            self.say(pod, "worker", answer, "reply" if ok else "fail")
        if not t.pod_legs and t.outcome == "failure":
            self.say("worker", pod_lane(t.pod), f"{t.worker_stage or 'callback'}: {t.error}", "fail")

    def finish(self, t: CallTrace, holder: str) -> None:
        if t.outcome == "success":
            self.say(holder, "client", "the function's response", "reply")
        else:
            self.say(holder, "client", f"no response ({t.client_status or 'none'}): gave up", "fail")

    def probe(self, t: CallTrace) -> list[Message]:
        self.say("worker", "proxy", f"{t.method} {t.target}")
        for leg in t.pod_legs:
            self.say("proxy", pod_lane(leg["pod"]), f"{leg.get('path')}", "fail")
        rec = t.proxy[0] if t.proxy else None
        answer = f"{rec['status']} {rec['flags']}" if rec else (t.error or "no answer")
        why = next(
            (d["reason"] for d in t.decisions if d.get("decision") == "Reject" and d.get("reason")), None
        )
        answer += f": {why}" if why and rec else ""
        self.say("proxy", "worker", answer, "reply" if t.outcome == "success" else "fail")
        return self.rows


def call_rows(t: CallTrace, pod_by_ip: dict[str, str]) -> list[Message]:
    builder = _Calls(pod_by_ip)
    return builder.probe(t) if t.kind == "probe" else builder.invoke(t)


def step_rows(step: StepResult, pod_by_ip: dict[str, str]) -> list[Row]:
    rows: list[Row] = [Note(step.step.label + (f": {step.note}" if step.note else ""))]
    groups: dict[tuple[Message, ...], list[CallTrace]] = {}
    for trace in step.traces:
        groups.setdefault(tuple(call_rows(trace, pod_by_ip)), []).append(trace)
    for n, (messages, traces) in enumerate(groups.items()):
        if n == MAX_GROUPS_PER_STEP:
            rest = sum(len(ts) for ts in list(groups.values())[n:])
            rows.append(Note(f"... and {rest} more calls of other shapes (see report.json)"))
            break
        noun = "probe" if traces[0].kind == "probe" else "call"
        workers = sorted({t.worker for t in traces if t.worker})
        rows.append(
            Note(
                f"{noun}s {', '.join(str(t.index) for t in traces)} (x{len(traces)})"
                + (f" by {', '.join(workers)}" if workers and noun == "call" else "")
            )
        )
        rows.extend(messages)
    rows += [Note(f"FAILED {line}") for line in step.failures]
    return rows


def diagram(result: ScenarioResult) -> Diagram:
    topology_pods = [p for p in (result.status or {}).get("pods", [])]
    pod_by_ip = {p["ip"]: p["name"] for p in topology_pods}
    rows: list[Row] = [row for step in result.steps for row in step_rows(step, pod_by_ip)]
    if result.error:
        rows.append(Note(f"FAILED {result.error}"))
    used = {r.src for r in rows if isinstance(r, Message)} | {r.dst for r in rows if isinstance(r, Message)}
    pods = [
        Lane(pod_lane(p["name"]), p["name"])
        for p in topology_pods
        if p["role"] == "invocation" or pod_lane(p["name"]) in used
    ]
    return Diagram(
        f"{result.scenario.name}: {result.scenario.summary}",
        result.ok,
        (*BASE_LANES, *pods),
        tuple(rows),
        tuple(result.failures),
    )


# -- Mermaid ---------------------------------------------------------------------------------------
ARROWS = {"call": "->>", "reply": "-->>", "fail": "-x"}


def _clean(text: str) -> str:
    """Mermaid ends a message at ';' or a newline and reads '#' as an entity: keep those out."""
    return " ".join(text.replace(";", ",").replace("#", "no. ").split())


def mermaid(d: Diagram) -> str:
    first, last = d.lanes[0].id, d.lanes[-1].id
    lines = ["sequenceDiagram", f"    title {_clean(d.title)}"]
    lines += [f"    participant {lane.id} as {_clean(lane.label)}" for lane in d.lanes]
    for row in d.rows:
        if isinstance(row, Note):
            lines.append(f"    Note over {first},{last}: {_clean(row.text)}")
        else:
            lines.append(f"    {row.src}{ARROWS[row.style]}{row.dst}: {_clean(row.label)}")
    return "\n".join(lines) + "\n"
