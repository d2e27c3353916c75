"""How the replay engine makes one call of each kind and knows when its records are complete."""

from __future__ import annotations

import json
from typing import Any

from scenarios.spec import Step
from scenarios.tail import StackTail
from scenarios.trace import CallTrace, proxy_lines
from sim.client.http_client import invoke_http
from sim.model.events import CallbackStart
from sim.model.parts import Pod
from sim.runtime.component import Context

CALL_TIMEOUT = 10.0
POLL_SECONDS = 1  # NVCF-POLL-SECONDS of each status poll
FIRST_POLL_SECONDS = 0  # the pexec POST answers 202 at once, so the client knows the request id to watch


async def http_call(
    client: Context, tail: StackTail, step: Step, index: int, pod: Pod, spec: dict[str, Any]
) -> CallTrace:
    body = json.dumps({"step": step.index, "invocation": index}).encode()

    def failed(request_id: str) -> str | None:
        result = tail.callback_result(request_id)
        if result and not result.ok:
            return result.error or "callback failed"
        return None

    async def watch(request_id: str) -> str:
        """Ends as soon as the worker reports this callback failed: no poll needs to run out first."""
        while not await tail.wait_for(lambda: failed(request_id) is not None, CALL_TIMEOUT):
            pass
        return failed(request_id) or "callback failed"

    inv = await invoke_http(
        client,
        pod,
        spec["function"],
        body,
        poll_seconds=POLL_SECONDS,
        timeout=spec.get("timeout", CALL_TIMEOUT),
        first_poll_seconds=FIRST_POLL_SECONDS,
        watch=watch,
    )
    trace = CallTrace(
        step=step.index,
        index=index,
        function=spec["function"],
        pod=pod.name,
        request_id=inv.request_id,
        client_status=inv.status,
        elapsed_ms=inv.elapsed_ms,
    )
    trace.body_ok = inv.status == 200 and inv.body == body
    trace.outcome = "success" if trace.body_ok else "failure"
    if not trace.body_ok:
        trace.error = inv.error or client_got(inv.status, inv.body)
    return trace


def client_got(status: int, body: bytes, most: int = 300) -> str:
    """A call's failure as the client saw it: the status, and for an error the API's own words (the
    problem's ``detail``, or a plain-text body), so a report says why without a look in the pod's log."""
    said = f"client got {status}"
    if status < 400 or not body:
        return said
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):  # not a problem+json document: a plain-text answer
        detail = body.decode("utf-8", "replace")
    detail = " ".join(str(detail or "").split())
    if not detail:
        return said
    return f"{said}: {detail[:most]}{'...' if len(detail) > most else ''}"


async def grpc_call(
    client: Context, tail: StackTail, step: Step, index: int, pod: Pod, spec: dict[str, Any]
) -> CallTrace:
    # Imported here, not at the top: grpcio costs ~70 ms of every `ncpsim up`, and most replays make no gRPC call.
    from scenarios.grpc_calls import grpc_call as call

    return await call(client, tail, step, index, pod, spec)


def expected_proxy_lines(trace: CallTrace, start: CallbackStart | None = None) -> int:
    """Access-log lines a successful proxied callback leaves: GET and POST (HTTP), one stream (gRPC),
    one CONNECT (a legacy worker's tunnel)."""
    if trace.function != "http-echo" or (start and start.connect):
        return 1
    return 2


def recorded(trace: CallTrace, tail: StackTail) -> bool:
    """Has everything this call will leave in the events and the access log been written?"""
    rid = trace.request_id or ""
    if trace.kind == "probe":
        # The proxy writes its line after it answers: wait for it whenever the prober got an answer.
        return not trace.client_status or _lines(tail, rid) >= 1
    result, start = tail.callback_result(rid), tail.callback_start(rid)
    if result is None:
        if trace.function != "http-echo" and trace.outcome != "success" and start is not None:
            # A gRPC client can give up (DEADLINE_EXCEEDED) while its worker still retries: wait for the
            # worker's result, whose cause (DNS, TLS, the status it got) the trace reports instead.
            return False
        return trace.outcome != "success"  # a failed call may never have reached a worker
    if trace.via == "direct" or not (start and start.proxy):
        return True
    if not result.ok:
        # The proxy answered, or had a leg cut off under it: its line follows.
        sent = result.statuses or result.stage in ("get", "post")
        return not sent or _lines(tail, rid) >= 1
    return _lines(tail, rid) >= expected_proxy_lines(trace, start)


def _lines(tail: StackTail, request_id: str) -> int:
    """This call's access-log lines so far (workers send no X-Request-Id: see scenarios.trace.join)."""
    return len(proxy_lines(request_id, tail.events, tail.access))
