"""nats-server as a component: spawn, /healthz, process group, stop, restart, failure."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from nats_support import Keys, keys_fixture, server_log, start_server_fixture  # noqa: F401 - fixtures

from sim.model.parts import CONTROL_CLUSTER
from sim.model.topology import build
from sim.nats.config import ServerConfig
from sim.nats.server import GO_GC_PERCENT, NatsServer, ServerError, healthz
from sim.pods.nats import component
from sim.runtime.component import Context


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
    # ncpsim's own collector target for the server (its memory at 10,000 workers), unless the user set one
    assert psutil.Process(server.pid).environ().get("GOGC") == os.environ.get("GOGC", GO_GC_PERCENT)


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


def test_a_supervisor_stopped_while_it_starts_stops_the_server_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM reaches the supervisor's group while its thread is still about to spawn nats-server: the
    thread goes on, and the server it spawns must not outlive the supervisor (a CI run's leftover)."""
    values = {
        "workerCallbackProxy": {"enabled": True, "workerDomain": "w.example.com"},
        "nats": {"config": {"cluster": {"enabled": False}}},  # one server: no routes to choose first
    }
    topology = build("t", values, seed=3)
    (tmp_path / "topology.json").write_text(topology.to_json())
    (tmp_path / "logs").mkdir()
    entered, go = threading.Event(), threading.Event()
    started: list[NatsServer] = []
    real_start = component._start

    def held_start(ctx: Context, keys: component.StackKeys, stopping: threading.Event) -> NatsServer:
        entered.set()
        assert go.wait(30), "the test never let the start go on"
        started.append(real_start(ctx, keys, stopping))
        return started[-1]

    monkeypatch.setattr(component, "_start", held_start)

    async def cancel_while_starting() -> None:
        ctx = Context(tmp_path, topology, "nats-0", CONTROL_CLUSTER)
        try:
            task = asyncio.create_task(component.run(ctx, lambda _bindings: None))
            assert await asyncio.to_thread(entered.wait, 30)
            task.cancel()
            await asyncio.sleep(0)  # the cancellation is delivered before the thread spawns the server
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
        finally:
            go.set()
            ctx.events.close()

    try:
        asyncio.run(cancel_while_starting())
        assert len(started) == 1, "the start thread did not finish"
        leaked = [
            p.info["pid"]
            for p in psutil.process_iter(["pid", "cmdline"])
            if str(tmp_path) in " ".join(p.info["cmdline"] or ())
        ]
        assert not leaked, f"nats-server outlived its supervisor: {leaked}"
    finally:
        for server in started:
            server.stop()
