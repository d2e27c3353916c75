"""The proxy's TCP listener takes a burst of worker connections as Envoy's does.

Envoy listens with `tcp_backlog_size`, which the rendered config leaves unset: net.core.somaxconn on
Linux. asyncio's default backlog is 100, and with it a fleet of workers calling back at once had SYNs
dropped and connects timing out (the 10,000-worker scale benchmark lost 315 callbacks that way).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from clusters.local import LocalStack
from scenarios.model import load_scenario
from sim.proxy.http_front import SOMAXCONN, listener_backlog

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
