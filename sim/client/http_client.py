"""The function client: invokes through an invocation-service pod and reads the response."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import h11

from sim.model.parts import Pod
from sim.protocols.go_errors import Dial, tcp_dial_error, url_error
from sim.protocols.http1 import H11Stream, Response, exchange
from sim.protocols.tasks import cancelled
from sim.runtime.component import Context
from sim.wire import INVOCATION_HTTP_PORT

PEXEC = "/v2/nvcf/pexec/functions/"
CLIENT_TIMEOUT = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"  # net/http's


@dataclass(frozen=True)
class Invocation:
    function: str
    pod: str  # the replica that accepted the request
    status: int
    body: bytes
    request_id: str | None
    elapsed_ms: int
    error: str | None = None


async def invoke_http(
    ctx: Context,
    pod: Pod,
    function: str,
    body: bytes,
    poll_seconds: int = 60,
    timeout: float = 30.0,
    give_up: Callable[[str], str | None] | None = None,
    first_poll_seconds: int | None = None,
    watch: Callable[[str], Awaitable[str]] | None = None,
) -> Invocation:
    """POST pexec to `pod`; follow 202s with status polls until the response or `timeout`.

    `give_up(request_id)` is asked between polls; a non-empty answer (why) ends the wait early, as a
    person would stop polling once the worker's logs show the callback failed. `watch(request_id)`
    does the same without waiting for the poll to end: it is raced against each status poll.
    `first_poll_seconds` (e.g. 0) gets the request id back at once, so the watch can start early.
    """
    started = time.monotonic()
    address = f"{pod.ip}:{INVOCATION_HTTP_PORT}"
    url = f"http://{address}{PEXEC}{function}"
    try:
        reader, writer = await ctx.open_tcp(pod.ip, INVOCATION_HTTP_PORT)
    except (OSError, TimeoutError) as exc:  # a Go client's words, naming the pod's address (never loopback)
        error = url_error("POST", url, tcp_dial_error(Dial(pod.ip, "", addr=address), exc))
        return Invocation(function, pod.name, 0, b"", None, 0, error)
    stream = H11Stream(h11.CLIENT, reader, writer)
    first = poll_seconds if first_poll_seconds is None else first_poll_seconds
    host = ("host", f"{pod.ip}:{INVOCATION_HTTP_PORT}")
    poller = _Poller(stream, host, poll_seconds, timeout, started, give_up, watch)
    try:
        response = await exchange(
            stream,
            "POST",
            PEXEC + function,
            [host, ("content-type", "application/json"), ("nvcf-poll-seconds", str(first))],
            body,
            timeout=timeout,
        )
        response, why = await poller.follow(response)
        if why:
            return Invocation(function, pod.name, 202, b"", response.header("nvcf-reqid"), _ms(started), why)
    except (ConnectionError, h11.ProtocolError, TimeoutError) as exc:
        error = url_error("POST", url, CLIENT_TIMEOUT if isinstance(exc, TimeoutError) else "EOF")
        return Invocation(function, pod.name, 0, b"", None, _ms(started), error)
    finally:
        poller.stop()
        await stream.aclose()
    return _result(function, pod, response, started)


class _Poller:
    """Follows a 202 with status polls; gives up when `give_up` or the `watch` says why."""

    def __init__(
        self,
        stream: H11Stream,
        host: tuple[str, str],
        poll_seconds: int,
        timeout: float,
        started: float,
        give_up: Callable[[str], str | None] | None,
        watch: Callable[[str], Awaitable[str]] | None,
    ):
        self.stream, self.host, self.poll_seconds, self.timeout = stream, host, poll_seconds, timeout
        self.started, self.give_up, self.watch = started, give_up, watch
        self.watcher: asyncio.Task[str] | None = None  # started once the request id is known

    async def follow(self, response: Response) -> tuple[Response, str | None]:
        while response.status == 202 and time.monotonic() - self.started < self.timeout:
            reqid = response.header("nvcf-reqid") or ""
            why = self.give_up(reqid) if self.give_up else None
            if why:
                return response, why
            if self.watch and self.watcher is None:
                self.watcher = asyncio.create_task(_as_task(self.watch(reqid)), name=f"watch:{reqid}")
            poll = exchange(
                self.stream,
                "GET",
                f"/v2/nvcf/pexec/status/{reqid}",
                [self.host, ("nvcf-poll-seconds", str(self.poll_seconds))],
                timeout=self.timeout,
            )
            polled, why = await _race(poll, self.watcher)
            if why:
                return response, why
            response = polled
        return response, None

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()


async def _as_task(awaitable: Awaitable[str]) -> str:
    return await awaitable


async def _race(
    poll: Coroutine[Any, Any, Response], watcher: asyncio.Task[str] | None
) -> tuple[Response, str | None]:
    """The poll's response, or the watcher's reason if it comes first (the poll is then abandoned)."""
    if watcher is None:
        return await poll, None
    poll_task = asyncio.create_task(poll, name="status-poll")
    done, _ = await asyncio.wait({poll_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if poll_task in done:
        return poll_task.result(), None
    await cancelled(poll_task, ConnectionError, h11.ProtocolError, TimeoutError)
    return Response(202, [], b""), watcher.result() or "gave up"


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _result(function: str, pod: Pod, response: Response, started: float) -> Invocation:
    return Invocation(
        function, pod.name, response.status, response.body, response.header("nvcf-reqid"), _ms(started)
    )
