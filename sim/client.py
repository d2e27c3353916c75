"""The function client: invokes through an invocation-service pod and reads the response."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import h11

from sim.component import Context
from sim.http1 import H11Stream, Response, exchange
from sim.topology import INVOCATION_HTTP_PORT, Pod

PEXEC = "/v2/nvcf/pexec/functions/"


@dataclass(frozen=True)
class Invocation:
    function: str
    pod: str  # the replica that accepted the request
    status: int
    body: bytes
    request_id: str | None
    elapsed_ms: int
    error: str | None = None


async def invoke_http(ctx: Context, pod: Pod, function: str, body: bytes, poll_seconds: int = 60,
                      timeout: float = 30.0, give_up: Callable[[str], str | None] | None = None) -> Invocation:
    """POST pexec to `pod`; follow 202s with status polls until the response or `timeout`.

    `give_up(request_id)` is asked between polls; a non-empty answer (why) ends the wait early, as a
    person would stop polling once the worker's logs show the callback failed.
    """
    started = time.monotonic()
    try:
        reader, writer = await ctx.open_tcp(pod.ip, INVOCATION_HTTP_PORT)
    except OSError as exc:
        return Invocation(function, pod.name, 0, b"", None, 0, f"{type(exc).__name__}: {exc}")
    stream = H11Stream(h11.CLIENT, reader, writer)
    headers = [("host", f"{pod.ip}:{INVOCATION_HTTP_PORT}"), ("content-type", "application/json"),
               ("nvcf-poll-seconds", str(poll_seconds))]
    try:
        response = await exchange(stream, "POST", PEXEC + function, headers, body, timeout=timeout)
        while response.status == 202 and time.monotonic() - started < timeout:
            reqid = response.header("nvcf-reqid") or ""
            why = give_up(reqid) if give_up else None
            if why:
                return Invocation(function, pod.name, 202, b"", reqid, _ms(started), why)
            response = await exchange(stream, "GET", f"/v2/nvcf/pexec/status/{reqid}", headers[:1] + headers[2:],
                                      timeout=timeout)
    except (ConnectionError, h11.ProtocolError, TimeoutError) as exc:
        return Invocation(function, pod.name, 0, b"", None, _ms(started), f"{type(exc).__name__}: {exc}")
    finally:
        stream.close()
    return _result(function, pod, response, started)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _result(function: str, pod: Pod, response: Response, started: float) -> Invocation:
    return Invocation(function, pod.name, response.status, response.body, response.header("nvcf-reqid"),
                      _ms(started))
