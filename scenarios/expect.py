"""Scenario expectations checked against call traces, log lines and refused changes (pure).

Each failure names the step, the expectation, and what happened instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scenarios.origins import unset
from scenarios.spec import Expect, LogExpect, Step, When
from scenarios.trace import CallTrace
from sim.errors import ConfigError
from sim.model.layering import parse_key
from sim.model.parts import WorkerSpec
from sim.model.values import deep_merge
from sim.model.values_check import check as check_values


@dataclass(frozen=True)
class Facts:
    """What the checks need to know about the stack besides the traces."""

    pod_ips: dict[str, str]
    workers: dict[str, WorkerSpec] = field(default_factory=dict)


Check = Callable[[Expect, CallTrace, Facts], str | None]


def _outcome(exp: Expect, t: CallTrace, _f: Facts) -> str | None:
    if exp.outcome is None or t.outcome == exp.outcome:
        return None
    if t.outcome == "failure":
        return f"outcome {exp.outcome}, but it failed: {t.error or 'no response'}"
    return f"outcome {exp.outcome}, but it succeeded (client status {t.client_status})"


def _via(exp: Expect, t: CallTrace, _f: Facts) -> str | None:
    if exp.via is None:
        return None
    if exp.via == "proxy" and not t.proxy:
        return (
            f"via proxy, but the proxy's access log has no line for request {t.request_id} "
            f"(worker went {t.via})"
        )
    if exp.via == "direct" and (t.proxy or t.via == "proxy"):
        return "via direct, but the callback went through the proxy"
    return None


def _same_pod(exp: Expect, t: CallTrace, facts: Facts) -> str | None:
    if not exp.same_pod:
        return None
    callees = t.callee_pods
    if callees != {t.pod}:
        reached = sorted(callees) or "no pod"
        return f"callbacks on {t.pod} (which holds the request), but they reached {reached}"
    ip = facts.pod_ips.get(t.pod)
    wrong = [rec["upstream_host"] for rec in t.proxy if rec["upstream_host"].split(":")[0] != ip]
    if wrong:
        return f"proxy forwarding to {ip} ({t.pod}), but it forwarded to {', '.join(wrong)}"
    return None


def _proxy_status(exp: Expect, t: CallTrace, _f: Facts) -> str | None:
    if exp.proxy_status is None and exp.proxy_flag is None:
        return None
    seen = [(rec["status"], rec["flags"]) for rec in t.proxy]
    for status, flag in seen:
        if (exp.proxy_status is None or int(status) == exp.proxy_status) and (
            exp.proxy_flag is None or flag == exp.proxy_flag
        ):
            return None
    want = " ".join(str(x) for x in (exp.proxy_status, exp.proxy_flag) if x is not None)
    got = ", ".join(f"{s} {f}" for s, f in seen) or "no access-log line"
    return f"proxy answering {want}, but the access log shows {got}"


def _callee_status(exp: Expect, t: CallTrace, _f: Facts) -> str | None:
    if exp.callee_status is None:
        return None
    first = t.worker_statuses[0] if t.worker_statuses else None
    if first != exp.callee_status:
        return f"the first callback leg answered {exp.callee_status}, but it got {first}"
    return None


def _error(exp: Expect, t: CallTrace, _f: Facts) -> str | None:
    if exp.error is None:
        return None
    if exp.error.lower() not in (t.error or "").lower():
        return f"error containing {exp.error!r}, but the error was {t.error!r}"
    return None


def _upstream_port(exp: Expect, t: CallTrace, _f: Facts) -> str | None:
    if exp.upstream_port is None:
        return None
    hosts = [rec["upstream_host"] for rec in t.proxy if rec["upstream_host"] != "-"]
    wrong = [h for h in hosts if h.rsplit(":", 1)[-1] != str(exp.upstream_port)]
    if not hosts or wrong:
        seen = hosts or "nothing"
        return f"the proxy forwarding to pod port {exp.upstream_port}, but it forwarded to {seen}"
    return None


def _dns_rcode(exp: Expect, t: CallTrace, _f: Facts) -> str | None:
    if exp.dns_rcode is None:
        return None
    got = t.dns.get("rcode") or ("NOERROR" if t.dns.get("answer") else None)
    if got != exp.dns_rcode:
        name = t.dns.get("name", "the callback name")
        return f"DNS answering {exp.dns_rcode} for {name}, but it answered {got}"
    return None


def _pod_contacted(exp: Expect, t: CallTrace, _f: Facts) -> str | None:
    if exp.pod_contacted is None or bool(t.pod_legs) == exp.pod_contacted:
        return None
    if exp.pod_contacted:
        return "a pod to see the request, but no pod recorded it"
    seen = ", ".join(f"{leg['pod']} {leg.get('path') or leg['kind']}" for leg in t.pod_legs)
    return f"no pod contacted, but {seen} received it"


CHECKS: tuple[Check, ...] = (
    _outcome,
    _via,
    _same_pod,
    _proxy_status,
    _callee_status,
    _error,
    _upstream_port,
    _dns_rcode,
    _pod_contacted,
)


def matches(when: When | None, t: CallTrace, facts: Facts) -> bool:
    """Is `t` one of the calls an expectation's `when` is about?"""
    if when is None:
        return True
    spec = facts.workers.get(t.worker or "")
    wanted = {
        "landed": (when.landed, t.landed),
        "worker": (when.worker, t.worker),
        "trust": (when.trust, spec.trust if spec else None),
        "workerUtils": (when.worker_utils, spec.worker_utils if spec else None),
        "cluster": (when.cluster, spec.cluster if spec else None),
    }
    return all(want is None or want == got for want, got in wanted.values())


def _check_one(step: Step, exp: Expect, traces: list[CallTrace], facts: Facts) -> list[str]:
    if exp.log is not None or exp.refused is not None:
        return []  # judged on the log's lines (check_log) or the values change (the engine), not on calls
    chosen = [t for t in traces if matches(exp.when, t, facts)]
    scope = f"for calls with {exp.when.describe()}: " if exp.when else ""
    out = []
    need = exp.at_least if exp.at_least is not None else (1 if exp.when else 0)
    if len(chosen) < need:
        which = f" with {exp.when.describe()}" if exp.when else ""
        out.append(
            f"{step.label}: expected at least {need} call(s){which}, but {len(chosen)} of {len(traces)} were"
        )
    grouped: dict[str, list[int]] = {}
    for trace in chosen:
        for check in CHECKS:
            problem = check(exp, trace, facts)
            if problem:
                grouped.setdefault(problem, []).append(trace.index)
    out += [
        f"{step.label}: {scope}expected {problem} ({_calls(step, idx)} {', '.join(map(str, idx))} "
        f"of {len(traces)})"
        for problem, idx in grouped.items()
    ]
    return out


def _calls(step: Step, indexes: list[int]) -> str:
    noun = "probe" if step.probe is not None else "invocation"
    return noun + ("s" if len(indexes) > 1 else "")


def evaluate(
    step: Step,
    traces: list[CallTrace],
    pod_ips: dict[str, str] | Facts,
    workers: dict[str, WorkerSpec] | None = None,
) -> list[str]:
    """One line per broken expectation, grouped by message so 10 identical failures read as one."""
    facts = pod_ips if isinstance(pod_ips, Facts) else Facts(pod_ips, workers or {})
    return [line for exp in step.expects for line in _check_one(step, exp, traces, facts)]


def log_matches(exp: LogExpect, lines: Sequence[str]) -> list[str]:
    """The lines `exp` counts: each containing its text and matching its expression, where given."""
    pattern = re.compile(exp.matches) if exp.matches is not None else None
    return [
        line
        for line in lines
        if (exp.contains is None or exp.contains in line) and (pattern is None or pattern.search(line))
    ]


def check_log(
    step: Step, exp: LogExpect, lines: Sequence[str] | None, known: Sequence[str] = ()
) -> str | None:
    """One line when the log breaks `exp`; `lines` is None when the stack has no such log."""
    if lines is None:
        return (
            f"{step.label}: expected {exp.describe()}, but the stack has no log {exp.component!r} "
            f"(it has: {', '.join(known) or 'none'})"
        )
    found = log_matches(exp, lines)
    low, high = exp.at_least or 0, exp.at_most
    if low <= len(found) and (high is None or len(found) <= high):
        return None
    shown = found[0] if found else (lines[-1] if lines else "")
    which = "first match" if found else "last line"
    sample = f"; {which}: {shown[:200]!r}" if shown else ""
    return f"{step.label}: expected {exp.describe()}, but {len(found)} of {len(lines)} line(s) did{sample}"


def check_refused(step: Step, values: Mapping[str, Any]) -> tuple[str, str | None]:
    """(note, failure) for a step whose unsetValues/setValues must be refused with `step.refused`, as helmfile
    sync refuses a render: judged on `values` as the change would leave them, never applied (a refused sync
    changes nothing; the running pods keep serving)."""
    want = step.refused or ""
    changed = dict(values)
    for path in step.unset_values or ():
        changed = unset(changed, parse_key(path))
    try:
        check_values(deep_merge(changed, step.set_values or {}))
    except ConfigError as exc:
        if want in str(exc):
            return f"refused, as helmfile sync refuses the render: {exc}; nothing changed", None
        return "refused", f"{step.label}: expected the change refused with {want!r}, but the error was: {exc}"
    return "accepted", f"{step.label}: expected the change refused with {want!r}, but it was accepted"
