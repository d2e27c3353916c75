"""One gRPC call of a scenario step: a client calls a grpc-proxy pod, whose worker calls back over QUIC."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from scenarios.spec import Step
from scenarios.tail import StackTail
from scenarios.trace import CallTrace
from sim.client.grpc_client import CallOutcome, EchoClient
from sim.model.parts import Pod
from sim.protocols.tasks import cancelled
from sim.runtime.component import Context
from sim.wire import GRPC_CLIENT_PORT

CALL_TIMEOUT = 10.0


async def _watch_worker(tail: StackTail, tag: str, request_ids: list[str]) -> str:
    """Resolve with the worker's error once it reports the callback failed (then the call can stop). A unary
    call's request id comes with its end, so the pod's event for the call's tag names it sooner."""

    def failed() -> bool:
        if not request_ids and (minted := tail.tagged_request(tag)):
            request_ids.append(minted)
        result = tail.callback_result(request_ids[0]) if request_ids else None
        return bool(result and not result.ok)

    while not await tail.wait_for(failed, CALL_TIMEOUT):
        pass
    result = tail.callback_result(request_ids[0])
    return (result and result.error) or "callback failed"


async def _call(
    client: Context,
    pod: Pod,
    payload: bytes,
    stream: int | None,
    timeout: float,
    tag: str,
    request_ids: list[str],
) -> CallOutcome:
    def named(request_id: str) -> None:
        if request_id not in request_ids:  # the watcher may have found it first
            request_ids.append(request_id)

    host, port = client.netmap.lookup(client.cluster, pod.ip, GRPC_CLIENT_PORT)
    async with EchoClient((host, port)) as echo:
        return await echo.traced(payload, stream, timeout, on_request_id=named, call_tag=tag)


async def grpc_call(
    client: Context, tail: StackTail, step: Step, index: int, pod: Pod, spec: dict[str, Any]
) -> CallTrace:
    payload = f"step {step.index} call {index}".encode()
    stream = spec.get("stream")
    started = time.monotonic()
    request_ids: list[str] = []
    tag = secrets.token_hex(8)  # unique across commands on one stack, whose events accumulate
    call = asyncio.create_task(
        _call(client, pod, payload, stream, spec.get("timeout", CALL_TIMEOUT), tag, request_ids),
        name=f"grpc-call-{step.index}-{index}",
    )
    watch = asyncio.create_task(
        _watch_worker(tail, tag, request_ids), name=f"grpc-watch-{step.index}-{index}"
    )
    done, _ = await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
    for task in (call, watch):
        if task not in done:
            await cancelled(task)
    trace = CallTrace(
        step=step.index,
        index=index,
        function=spec["function"],
        pod=pod.name,
        request_id=request_ids[0] if request_ids else None,
        elapsed_ms=int((time.monotonic() - started) * 1000),
    )
    if call in done and not call.exception():
        outcome = call.result()
        expected = [payload] if stream is None else None
        trace.body_ok = outcome.error is None and (
            outcome.replies == expected if expected else len(outcome.replies) == stream
        )
        trace.client_status = 200 if trace.body_ok else 0
        trace.error = outcome.error
    else:
        trace.error = (
            watch.result() if watch in done else f"{type(call.exception()).__name__}: {call.exception()}"
        )
    trace.outcome = "success" if trace.body_ok else "failure"
    return trace
