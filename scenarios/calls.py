"""How the replay engine makes one call of each kind and knows when its records are complete."""

from __future__ import annotations

import json
from typing import Any

from scenarios.model import Step
from scenarios.tail import StackTail
from scenarios.trace import CallTrace
from sim.client import invoke_http
from sim.component import Context
from sim.topology import Pod

CALL_TIMEOUT = 10.0
POLL_SECONDS = 1  # short NVCF-POLL-SECONDS: a failed callback shows as 202s while the worker reports why


async def http_call(client: Context, tail: StackTail, step: Step, index: int, pod: Pod,
                    spec: dict[str, Any]) -> CallTrace:
    body = json.dumps({"step": step.index, "invocation": index}).encode()

    def give_up(request_id: str) -> str | None:
        tail.refresh()
        result = tail.worker_result(request_id)
        if result and not result.get("ok"):
            return str(result.get("error") or "callback failed")
        return None

    inv = await invoke_http(client, pod, spec["function"], body, poll_seconds=POLL_SECONDS,
                            timeout=spec.get("timeout", CALL_TIMEOUT), give_up=give_up)
    trace = CallTrace(step=step.index, index=index, function=spec["function"], pod=pod.name,
                      request_id=inv.request_id, client_status=inv.status, elapsed_ms=inv.elapsed_ms)
    trace.body_ok = inv.status == 200 and inv.body == body
    trace.outcome = "success" if trace.body_ok else "failure"
    if not trace.body_ok:
        trace.error = inv.error or f"client got {inv.status}"
    return trace


async def grpc_call(client: Context, tail: StackTail, step: Step, index: int, pod: Pod,
                    spec: dict[str, Any]) -> CallTrace:
    from scenarios.grpc_calls import grpc_call as call

    return await call(client, tail, step, index, pod, spec)


def expected_proxy_lines(trace: CallTrace) -> int:
    """Access-log lines a successful proxied callback leaves: GET and POST (HTTP), one stream (gRPC)."""
    return 2 if trace.function == "http-echo" else 1


def recorded(trace: CallTrace, tail: StackTail) -> bool:
    result = tail.worker_result(trace.request_id or "")
    if result is None:
        return trace.outcome != "success"  # a failed call may never have reached a worker
    if not result.get("ok") or trace.via == "direct" or not _proxied(tail, trace):
        return True
    lines = sum(1 for rec in tail.access if rec.get("request_id") == trace.request_id)
    return lines >= expected_proxy_lines(trace)


def _proxied(tail: StackTail, trace: CallTrace) -> bool:
    return any(e.get("requestId") == trace.request_id and e["kind"] == "worker.callback.start" and e.get("proxy")
               for e in tail.events)
