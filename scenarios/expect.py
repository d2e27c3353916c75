"""Scenario expectations checked against call traces (pure): each failure names step, expectation, and what happened."""

from __future__ import annotations

from collections.abc import Callable

from scenarios.model import Expect, Step
from scenarios.trace import CallTrace

Check = Callable[[Expect, CallTrace, dict[str, str]], str | None]


def _outcome(exp: Expect, t: CallTrace, _ips: dict[str, str]) -> str | None:
    if t.outcome == exp.outcome:
        return None
    if t.outcome == "failure":
        return f"outcome {exp.outcome}, but it failed: {t.error or 'no response'}"
    return f"outcome {exp.outcome}, but it succeeded (client status {t.client_status})"


def _via(exp: Expect, t: CallTrace, _ips: dict[str, str]) -> str | None:
    if exp.via is None:
        return None
    if exp.via == "proxy" and not t.proxy:
        return f"via proxy, but the proxy's access log has no line for request {t.request_id} (worker went {t.via})"
    if exp.via == "direct" and (t.proxy or t.via == "proxy"):
        return "via direct, but the callback went through the proxy"
    return None


def _same_pod(exp: Expect, t: CallTrace, ips: dict[str, str]) -> str | None:
    if not exp.same_pod:
        return None
    callees = t.callee_pods
    if callees != {t.pod}:
        return f"callbacks on {t.pod} (which holds the request), but they reached {sorted(callees) or 'no pod'}"
    wrong = [rec["upstream_host"] for rec in t.proxy if rec["upstream_host"].split(":")[0] != ips.get(t.pod)]
    if wrong:
        return f"proxy forwarding to {ips.get(t.pod)} ({t.pod}), but it forwarded to {', '.join(wrong)}"
    return None


def _proxy_status(exp: Expect, t: CallTrace, _ips: dict[str, str]) -> str | None:
    if exp.proxy_status is None and exp.proxy_flag is None:
        return None
    seen = [(rec["status"], rec["flags"]) for rec in t.proxy]
    for status, flag in seen:
        if (exp.proxy_status is None or int(status) == exp.proxy_status) and \
                (exp.proxy_flag is None or flag == exp.proxy_flag):
            return None
    want = " ".join(str(x) for x in (exp.proxy_status, exp.proxy_flag) if x is not None)
    got = ", ".join(f"{s} {f}" for s, f in seen) or "no access-log line"
    return f"proxy answering {want}, but the access log shows {got}"


def _callee_status(exp: Expect, t: CallTrace, _ips: dict[str, str]) -> str | None:
    if exp.callee_status is None:
        return None
    first = t.worker_statuses[0] if t.worker_statuses else None
    if first != exp.callee_status:
        return f"the worker's first callback answered {exp.callee_status}, but it got {first}"
    return None


def _error(exp: Expect, t: CallTrace, _ips: dict[str, str]) -> str | None:
    if exp.error is None:
        return None
    if exp.error.lower() not in (t.error or "").lower():
        return f"error containing {exp.error!r}, but the error was {t.error!r}"
    return None


CHECKS: tuple[Check, ...] = (_outcome, _via, _same_pod, _proxy_status, _callee_status, _error)


def evaluate(step: Step, traces: list[CallTrace], pod_ips: dict[str, str]) -> list[str]:
    """One line per broken expectation, grouped by message so 10 identical failures read as one."""
    if step.expect is None:
        return []
    grouped: dict[str, list[int]] = {}
    for trace in traces:
        for check in CHECKS:
            problem = check(step.expect, trace, pod_ips)
            if problem:
                grouped.setdefault(problem, []).append(trace.index)
    return [f"{step.label}: expected {problem} (invocations {', '.join(map(str, idx))} of {len(traces)})"
            for problem, idx in grouped.items()]
