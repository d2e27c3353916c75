"""No shared session to starve (issue 31, item 6): the HTTP/3 front pools its upstream QUIC sessions to a
grpc-proxy pod as Envoy pools them, so request streams one client holds open cannot stop other callbacks.

The decision (sim.proxy.h3_policy.pick_session) is a table; the acceptance runs on the in-process gRPC stack of
tests/test_grpc_e2e.py: 150 request streams held open on the front (HEADERS without END_STREAM, over two
worker connections, each under Envoy's 100-stream limit), then four gRPC callbacks to the same pod.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest
from test_grpc_e2e import Stack, pod_sni, run_stack, unary_once

from sim.client.grpc_client import STREAM, EchoClient
from sim.protocols import h3
from sim.protocols.grpc_callback import parse_connect_url
from sim.proxy import h3_pool
from sim.proxy.h3_policy import (
    MAX_CONCURRENT_STREAMS,
    OpenSession,
    Overflow,
    SessionLoad,
    UseSession,
    pick_session,
)
from sim.worker.grpc_callback import callback_headers

HELD, PER_CONNECTION = 150, 75
CALLBACKS, WITHIN = 4, 2.0  # the acceptance: four callbacks to the held pod, each done within 2 s
POD = "grpc-proxy-0"


def S(active: int, credit: int | None = None) -> SessionLoad:  # a table reads better short
    return SessionLoad(active, credit)


@pytest.mark.parametrize(
    ("sessions", "open_in_cluster", "expected"),
    [
        ([], 0, OpenSession()),
        ([S(0, 128)], 1, UseSession(0)),
        ([S(99, 29)], 1, UseSession(0)),
        ([S(100, 28)], 1, OpenSession()),  # Envoy's 100 streams a session, though the pod allows 128
        ([S(10, 0)], 1, OpenSession()),  # the pod's MAX_STREAMS is used up first
        ([S(100, 28), S(50, 78)], 2, UseSession(1)),
        ([S(1, 10), S(0, 100)], 2, UseSession(0)),  # the oldest with room
        ([S(5)], 1, UseSession(0)),  # a dial in progress with room: wait for it
        ([S(100)], 1, OpenSession()),  # a dial in progress already full
        ([S(100, 28)], 1024, Overflow("")),  # no room, the circuit breaker's 1024 connections open
        ([S(100, 28), S(3, 100)], 1024, UseSession(1)),  # the breaker only stops a new session
    ],
)
def test_pick_session(sessions: list[SessionLoad], open_in_cluster: int, expected: object) -> None:
    got = pick_session(sessions, open_in_cluster)
    assert (Overflow("") if isinstance(got, Overflow) else got) == expected


def test_the_limit_is_envoys_default() -> None:
    assert (
        MAX_CONCURRENT_STREAMS == 100
    )  # quic_protocol_options.max_concurrent_streams; the renderer sets none


async def hold(stack: Stack, count: int) -> tuple[list[h3.H3Endpoint], list[h3.H3Stream]]:
    """`count` callback request streams to POD, each sent without END_STREAM and answered (403: a made-up
    token), so each stays open on the proxy's session to the pod, waiting for a body that never comes."""
    sni = pod_sni(stack, POD)
    config = h3.client_configuration(sni, h3.trust_pem([stack.host.ca_path("stack")]))
    clients: list[h3.H3Endpoint] = []
    held: list[h3.H3Stream] = []
    target = parse_connect_url(stack.pods[POD].url)
    while len(held) < count:
        clients.append(await h3.connect(stack.proxy_addr, config, timeout=5))
        for _ in range(min(PER_CONNECTION, count - len(held))):
            work = {"token": "a" * 64, "requestId": f"00000000-0000-4000-8000-{len(held):012d}"}
            held.append(clients[-1].open_request(callback_headers(target, work, "1.4.0")))  # a worker's head
    return clients, held


async def callbacks_while_held(stack: Stack) -> tuple[list[object], float, list[h3.H3Stream]]:
    clients, held = await hold(stack, HELD)
    try:
        await asyncio.wait_for(asyncio.gather(*(s.headers for s in held)), 20)
        started = time.monotonic()
        calls = [asyncio.create_task(unary_once(stack, POD)) for _ in range(CALLBACKS)]
        done, late = await asyncio.wait(calls, timeout=WITHIN)
        for call in late:
            call.cancel()
        outcomes = [c.result() if c in done and not c.exception() else c for c in calls]
        await asyncio.gather(*calls, return_exceptions=True)
        return outcomes, time.monotonic() - started, held
    finally:
        for client in clients:
            h3.close_client(client)


def test_held_streams_do_not_stop_other_callbacks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def body(stack: Stack) -> None:
        pod = stack.pods[POD].h3
        assert pod is not None
        outcomes, elapsed, held = await callbacks_while_held(stack)
        assert outcomes == [b"once"] * CALLBACKS, f"{outcomes} after {elapsed:.2f} s"
        assert elapsed < WITHIN
        assert {s.status for s in held} == {403}  # every held stream reached the pod
        results = await stack.watch.wait("worker.callback.result", CALLBACKS)  # a worker's record comes last
        assert [r["status"] for r in results] == [200] * CALLBACKS
        # The proxy opened a second session to the pod once the first carried 100 streams, and no third.
        assert len(pod.endpoints) == 2, f"{len(pod.endpoints)} sessions from the proxy to the pod"

    run_stack(tmp_path, body)


def test_negative_control_one_session_a_pod_starves(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The same attack with the pool capped at one session (what the front had before): no callback gets
    through. The cap answers UO at once where the old shared session made them wait out 10 s."""
    monkeypatch.setattr(h3_pool, "MAX_CONNECTIONS", 1)

    async def body(stack: Stack) -> None:
        outcomes, _, held = await callbacks_while_held(stack)
        assert not any(o == b"once" for o in outcomes), outcomes
        assert sorted({s.status for s in held}) == [403, 503]  # the 101st stream already found no room
        lines = stack.access_log()
        assert any(line["flags"] == "UO" for line in lines), lines[-3:]

    run_stack(tmp_path, body)


def test_a_callback_the_pod_stops_ends_cleanly_at_the_proxy(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """A call the worker refuses (INVALID_ARGUMENT): the pod resets its tunnel, which after its own FIN is a
    STOP_SENDING alone. aioquic's HTTP/3 layer then drops the stream, and the proxy's pump ending it raised
    FrameUnexpected in two tasks (each a traceback in the proxy's log); now the stream is ended, quietly."""

    async def body(stack: Stack) -> None:
        async with EchoClient(stack.client_addr(POD)) as echo:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                _ = [m async for m in echo.channel.unary_stream(STREAM)(b"not json", timeout=5)]
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert await echo.unary(b"after") == b"after"  # control: the path still works
        await stack.watch.wait("proxy.h3.stream", 2)

    with caplog.at_level(logging.ERROR, logger="sim.protocols.h3"):
        run_stack(tmp_path, body)
    assert not [r.getMessage() for r in caplog.records if r.name == "sim.protocols.h3"]
