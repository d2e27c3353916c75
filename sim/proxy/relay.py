"""One forwarded exchange: the worker's request body up, the pod's response down, as Envoy's router streams
them. Bytes and the access-log counts only (%BYTES_RECEIVED% and %BYTES_SENT% are body bytes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterable
from typing import Any

import h11

from sim.protocols.http1 import H11Stream, decode_headers, encode_headers
from sim.proxy.access_log import AccessRecord
from sim.proxy.downstream import DownstreamClosed, Next, reason
from sim.proxy.policy import http_date


class UpstreamClosed(ConnectionError):
    """The pod's connection ended before its response was complete."""


class BodyError(Exception):
    """The worker's request body broke the codec (Envoy answers with the codec's status, flag DPE)."""

    def __init__(self, error: h11.RemoteProtocolError):
        super().__init__(str(error))
        self.status = error.error_status_hint


async def exchange(
    down: H11Stream, up: H11Stream, request: h11.Request, record: AccessRecord, idle: float
) -> bool:
    """Relay one request and its response; True when the response went out whole.

    Raises BodyError, DownstreamClosed, UpstreamClosed, h11.RemoteProtocolError (from the pod) or
    TimeoutError (nothing moved for the stream idle timeout)."""
    started = time.monotonic()
    buffered, complete = _buffered_body(down, record)
    await _to_pod(up, request, *buffered)
    response = pump_response(down, up, record, started, idle)
    if complete:
        # The whole request is here (a worker's GET or POST, usually): no pump task, since nothing more can
        # arrive that the response has to race.
        return await response
    return await alongside(_pump_body(down, up, record, idle), response)


async def alongside(body: Coroutine[Any, Any, None], response: Coroutine[Any, Any, bool]) -> bool:
    """The rest of a request body pumped beside the response; True when the response went out whole.
    Whichever side fails first ends the exchange: a malformed or stalled request body must not wait out
    the response, which the pod cannot send before it has that body."""
    request_pump = asyncio.create_task(body, name="proxy-request-body")
    response_pump = asyncio.create_task(response, name="proxy-response")
    try:
        await asyncio.wait({request_pump, response_pump}, return_when=asyncio.FIRST_EXCEPTION)
        for task in (request_pump, response_pump):
            if task.done() and (failure := task.exception()) is not None:
                raise failure
        ok = await response_pump
        await request_pump
        return ok
    finally:
        for pending in (request_pump, response_pump):
            if not pending.done():
                pending.cancel()


async def _to_worker(down: H11Stream, *events: h11.Event) -> None:
    """Write to the worker; a broken connection there is the worker's leaving (DC), not the pod's."""
    try:
        await down.send(*events)
    except ConnectionError as exc:
        raise DownstreamClosed("worker connection closed mid-response") from exc


async def _to_pod(up: H11Stream, *events: h11.Event) -> None:
    try:
        await up.send(*events)
    except ConnectionError as exc:
        raise UpstreamClosed("upstream connection closed mid-request") from exc


def _body_event(down: H11Stream) -> Next:
    try:
        return down.buffered_event()
    except h11.RemoteProtocolError as exc:
        raise BodyError(exc) from exc


def _buffered_body(down: H11Stream, record: AccessRecord) -> tuple[list[h11.Event], bool]:
    """The request body events already received; True when they include the end of the message."""
    events: list[h11.Event] = []
    while (event := _body_event(down)) is not h11.NEED_DATA:
        if isinstance(event, h11.Data):
            record.bytes_received += len(event.data)
            events.append(h11.Data(data=event.data))
        elif isinstance(event, h11.EndOfMessage):
            return [*events, h11.EndOfMessage()], True
        else:
            raise DownstreamClosed("worker connection closed mid-request")
    return events, False


async def _pump_body(down: H11Stream, up: H11Stream, record: AccessRecord, idle: float) -> None:
    while True:
        event = _body_event(down)
        if event is h11.NEED_DATA:
            try:
                data = await down.reads.read(idle)
            except ConnectionError as exc:
                raise DownstreamClosed("worker connection reset mid-request") from exc
            down.conn.receive_data(data)
            continue
        if isinstance(event, h11.Data):
            record.bytes_received += len(event.data)
            await _to_pod(up, h11.Data(data=event.data))
        elif isinstance(event, h11.EndOfMessage):
            await _to_pod(up, h11.EndOfMessage())
            return
        else:
            raise DownstreamClosed("worker connection closed mid-request")


async def pump_response(
    down: H11Stream, up: H11Stream, record: AccessRecord, started: float, idle: float
) -> bool:
    while True:
        # Relay what one read brought (typically head, body and end together) in one write.
        events: list[Next] = [await up.next_event(idle)]
        while (
            type(events[-1]) in (h11.Response, h11.InformationalResponse, h11.Data)
            and (more := up.buffered_event()) is not h11.NEED_DATA
        ):
            events.append(more)
        out: list[h11.Event] = []
        for event in events:
            if isinstance(event, h11.Response):
                out.append(_response_head(event, record, started))
            elif isinstance(event, h11.Data):
                out.append(h11.Data(data=event.data))
                record.bytes_sent += len(event.data)
            elif isinstance(event, h11.EndOfMessage):
                await _to_worker(down, *out, h11.EndOfMessage())
                return True
            elif not isinstance(event, h11.InformationalResponse):  # the pod's own 100s are not relayed
                raise UpstreamClosed("upstream connection closed mid-response")
        if out:
            await _to_worker(down, *out)


def _response_head(event: h11.Response, record: AccessRecord, started: float) -> h11.Response:
    fields = response_fields(decode_headers(event.headers), event.status_code, record, started)
    # Envoy's codec writes the standard reason phrase for the code, whatever the pod wrote.
    return h11.Response(
        status_code=event.status_code, headers=encode_headers(fields), reason=reason(event.status_code)
    )


DROPPED = frozenset(
    {"server", "connection", "date"}
)  # Envoy's connection manager sets its own Date and Server


def response_fields(
    fields: Iterable[tuple[str, str]], status: int, record: AccessRecord, started: float
) -> list[tuple[str, str]]:
    """The pod's response fields as Envoy sends them on to the worker; the status goes on record."""
    record.status = status
    record.upstream_service_time = str(int((time.monotonic() - started) * 1000))
    return [
        *((k, v) for k, v in fields if k not in DROPPED),
        ("x-envoy-upstream-service-time", record.upstream_service_time),
        ("date", http_date(time.time())),
        ("server", "envoy"),
    ]
