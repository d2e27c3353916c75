"""The proxy's TCP listener takes a burst of worker connections as Envoy's does.

Envoy listens with `tcp_backlog_size`, which the rendered config leaves unset: net.core.somaxconn on
Linux. asyncio's default backlog is 100, and with it a fleet of workers calling back at once had SYNs
dropped and connects timing out (the 10,000-worker scale benchmark lost 315 callbacks that way).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from clusters.local import LocalStack
from scenarios.load import load_scenario
from sim.protocols.listener import SOMAXCONN, Handler, TcpListener, listener_backlog

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop has no Windows wheels
    uvloop = None  # type: ignore[assignment]

BURST = 300  # more than asyncio's 100, fewer than any Linux somaxconn since 5.4 (4096)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="somaxconn and SIGSTOP semantics of Linux")


def test_the_backlog_is_somaxconn() -> None:
    assert listener_backlog() == int(SOMAXCONN.read_text())


def completed(port: int, count: int, within: float) -> int:
    """Open `count` connections at once; how many the kernel completes within `within` seconds."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            socks.append(sock)
        done: set[socket.socket] = set()
        deadline = time.monotonic() + within
        while len(done) < count and (left := deadline - time.monotonic()) > 0:
            _, writable, _ = select.select([], [s for s in socks if s not in done], [], left)
            done.update(s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
        return len(done)
    finally:
        for sock in socks:
            sock.close()


def test_a_burst_of_workers_is_queued_while_the_proxy_is_busy(tmp_path: Path) -> None:
    if int(SOMAXCONN.read_text()) < BURST:
        pytest.skip(f"net.core.somaxconn is below {BURST} here")
    stack = LocalStack("backlog", root=tmp_path)
    try:
        stack.up(load_scenario("http-callback").build_topology("backlog"), "http-callback")
        bindings = json.loads((stack.state_dir / "netmap.json").read_text())["bindings"]
        port = bindings[f"{stack.topology.proxy_lb_ip}:10084/tcp"]
        proxy = stack.launcher.running()["worker-callback-proxy"]
        os.kill(proxy, signal.SIGSTOP)  # busy: accepts nothing; the kernel's accept queue holds the burst
        try:
            # The kernel completes a handshake only while the accept queue has room: with asyncio's 100,
            # the rest wait for SYN retransmits (1 s, then 3 s), which is what timed workers out.
            assert completed(port, BURST, within=0.5) == BURST
        finally:
            os.kill(proxy, signal.SIGCONT)
    finally:
        stack.down()
    assert not stack.launcher.running()


# Accepting what is queued: all of it per readiness event (Envoy's default), even when the loop is busy ---------
QUEUED = 40
HOG_SECONDS = 0.01  # each loop iteration is at least this long: a busy proxy
Listen = Callable[[Handler], Awaitable[tuple[int, Callable[[], object]]]]  # handler -> (port, close)


def iterations_to_accept(listen: Listen, new_loop: Callable[[], Any]) -> int:
    """Queue QUEUED connections in the kernel, then count the loop iterations until the handler has seen
    them all, while every iteration is kept busy."""

    async def go() -> int:
        loop, seen, everyone = asyncio.get_running_loop(), [], asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer)
            if len(seen) == QUEUED:
                everyone.set()

        port, close = await listen(handler)
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(QUEUED)]
        iterations = 0

        def hog() -> None:  # one call per iteration: call_soon from a callback runs on the next one
            nonlocal iterations
            iterations += 1
            time.sleep(HOG_SECONDS)
            if not everyone.is_set():
                loop.call_soon(hog)

        loop.call_soon(hog)
        try:
            await asyncio.wait_for(everyone.wait(), 30)
        finally:
            for writer in seen:
                writer.close()
            for sock in socks:
                sock.close()
            closed = close()
            if asyncio.iscoroutine(closed):
                await closed
        return iterations

    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(go())


LOOPS = {"asyncio": asyncio.new_event_loop, **({"uvloop": uvloop.new_event_loop} if uvloop else {})}


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_the_listener_accepts_every_queued_connection_at_once(loop_name: str) -> None:
    async def listen(handler: Handler) -> tuple[int, Callable[[], object]]:
        listener = TcpListener(handler, tls=None)
        return await listener.start(), listener.close

    assert iterations_to_accept(listen, LOOPS[loop_name]) < 10


@pytest.mark.skipif(uvloop is None, reason="uvloop is not installed")
def test_start_server_on_uvloop_accepts_one_connection_an_iteration() -> None:
    """Why TcpListener exists; should uvloop drain the queue some day, this fails and the listener's
    docstring says something no longer true."""

    async def listen(handler: Handler) -> tuple[int, Callable[[], object]]:
        server = await asyncio.start_server(handler, "127.0.0.1", 0, backlog=QUEUED * 2)

        async def close() -> None:
            server.close()
            await server.wait_closed()

        return int(server.sockets[0].getsockname()[1]), close

    assert iterations_to_accept(listen, uvloop.new_event_loop) >= QUEUED // 2
