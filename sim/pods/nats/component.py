"""The nats-server component: a small supervisor that runs the real nats-server in its own process group.

Why a supervisor rather than nats-server started by the launcher: the launcher's contract is a
`sim.runtime.run` process that reports its bindings on the ready pipe. The supervisor renders the
config from the values into ``<state>/nats/``, starts nats-server in the supervisor's own process
group (so `ncpsim down` and the kill fault stop both with one killpg), waits for ``/healthz``, then
reports the load
balancer's address (4222, and the monitor on 8222) bound to the server's real ports. The streams are
made by the callout component (the NVCF API's stand-in), so this process never loads nats-py. If
nats-server dies, the supervisor exits too, so the component is seen dead.

A restart (fault, redeploy) comes back on the ports of the network map, so clients reconnect to the
address they had; a fresh `ncpsim up` (no binding yet) starts with an empty JetStream store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from pathlib import Path

from sim.protocols.wire import NATS_MONITOR_PORT, NATS_PORT
from sim.runtime.component import Context, Ready

from .server import NatsServer, ServerError
from .stack import StackKeys, server_config

ENDPOINTS_FILE = "server.json"


def nats_folder(state_dir: Path) -> Path:
    return state_dir / "nats"


def endpoints_path(state_dir: Path) -> Path:
    """Where the supervisor says where the server listens, for the callout (which starts beside it,
    before the launcher writes the network map)."""
    return nats_folder(state_dir) / ENDPOINTS_FILE


def _pinned_ports(ctx: Context) -> tuple[int, int] | None:
    bindings = ctx.netmap.current().bindings
    lb = ctx.topology.bus_lb_ip
    client, monitor = bindings.get(f"{lb}:{NATS_PORT}/tcp"), bindings.get(f"{lb}:{NATS_MONITOR_PORT}/tcp")
    return (client, monitor) if client and monitor else None


def _start(ctx: Context, keys: StackKeys) -> NatsServer:
    folder = nats_folder(ctx.state_dir)
    pinned = _pinned_ports(ctx)
    if pinned is None:  # a fresh stack: no work left over from an earlier `ncpsim up`
        shutil.rmtree(folder / "js", ignore_errors=True)
    endpoints_path(ctx.state_dir).unlink(missing_ok=True)
    log_path = ctx.state_dir / "logs" / f"{ctx.name}.log"
    for port, monitor in ([pinned] if pinned else []) + [(0, 0)]:
        config = server_config(keys, str(folder / "js"), port, monitor)
        server = NatsServer(config, folder, log_path, own_group=False)
        try:
            server.start()
            return server
        except ServerError as exc:
            if (port, monitor) == (0, 0):
                raise
            ctx.events.emit("nats.port_taken", port=port, error=str(exc)[:200])
    raise AssertionError("unreachable")


async def _started(ctx: Context, keys: StackKeys) -> NatsServer:
    """Start the server in a thread. Cancelled meanwhile (SIGTERM while `ncpsim up` starts the stack),
    wait for that thread and stop what it started: the thread goes on after the cancellation, and a
    server it spawned after the group's SIGTERM would outlive this supervisor."""
    starting = asyncio.ensure_future(asyncio.to_thread(_start, ctx, keys))
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            server = await starting
            await asyncio.to_thread(server.stop)
        raise


async def run(ctx: Context, ready: Ready) -> None:
    keys = StackKeys.derive(ctx.topology.seed)
    server = await _started(ctx, keys)
    try:
        assert server.endpoints is not None
        ends = server.endpoints
        path = endpoints_path(ctx.state_dir)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": ends.url, "monitor": ends.monitor, "pid": server.pid}))
        os.replace(tmp, path)
        ctx.events.emit("nats.ready", url=ends.url, monitor=ends.monitor, pid=server.pid)
        lb = ctx.topology.bus_lb_ip
        ready({f"{lb}:{NATS_PORT}/tcp": ends.port, f"{lb}:{NATS_MONITOR_PORT}/tcp": ends.monitor_port})
        code = await asyncio.to_thread(server.wait)
        ctx.events.emit("nats.exited", code=code)
        if code != 0:  # 0: it was told to stop (SIGTERM reaches the whole group at `ncpsim down`)
            raise SystemExit(f"nats-server exited with {code}: {server.log_tail(5)}")
    finally:
        await asyncio.to_thread(server.stop)
