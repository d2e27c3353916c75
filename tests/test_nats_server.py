"""nats-server as a component: spawn, /healthz, process group, stop, restart, failure."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from nats_support import Keys, keys_fixture, server_log, start_server_fixture  # noqa: F401 - fixtures

from sim.pods.nats.config import ServerConfig
from sim.pods.nats.server import NatsServer, ServerError, healthz


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_starts_healthy_in_its_own_process_group(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    server = start_server(worker_nkey=keys.pub(keys.worker))
    ep = server.endpoints
    assert ep is not None and ep.port > 0 and ep.monitor_port > 0
    assert healthz(ep.host, ep.monitor_port) == 200
    assert os.getpgid(server.pid) == server.pid != os.getpgid(0)
    assert "Server is ready" in server_log(server)
    assert ep.url == f"nats://127.0.0.1:{ep.port}" and ep.monitor == f"http://127.0.0.1:{ep.monitor_port}"


def test_fixed_ports_and_restart_keeps_them(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    port, monitor = free_port(), free_port()
    server = start_server(worker_nkey=keys.pub(keys.worker), port=port, monitor_port=monitor)
    assert (server.endpoints.port, server.endpoints.monitor_port) == (port, monitor)
    first_pid = server.pid
    server.restart()
    assert server.pid != first_pid and (server.endpoints.port, server.endpoints.monitor_port) == (
        port,
        monitor,
    )
    with pytest.raises(ProcessLookupError):
        os.killpg(first_pid, 0)


def test_port_zero_is_pinned_after_first_start(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    server = start_server(worker_nkey=keys.pub(keys.worker))
    chosen = server.endpoints
    code = server.kill()
    assert code == -9 and not server.running
    assert healthz(chosen.host, chosen.monitor_port) == 0
    assert server.start() == chosen


def test_stop_is_graceful_and_idempotent(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    server = start_server(worker_nkey=keys.pub(keys.worker))
    pid = server.pid
    assert server.stop() == 0  # SIGTERM: nats-server exits cleanly
    assert server.stop() is None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_failed_start_reports_the_log_and_leaves_nothing(tmp_path: Path, keys: Keys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = ServerConfig(
            store_dir=str(tmp_path / "js"),
            worker_nkey=keys.pub(keys.worker),
            port=port,
            monitor_port=free_port(),
        )
        server = NatsServer(config, tmp_path / "nats", tmp_path / "nats.log")
        with pytest.raises(ServerError, match="exited|deadline") as err:
            server.start(timeout=5.0)
    assert "address already in use" in str(err.value)
    assert not server.running and server.pid is None
