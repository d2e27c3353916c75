"""One nats-server of the nats StatefulSet as a component: a small supervisor that runs the real
nats-server in its own process group.

Why a supervisor rather than nats-server started by the launcher: the launcher's contract is a
`sim.runtime.run` process that reports its bindings on the ready pipe. The supervisor of ``nats-N``
renders that server's config from the values into ``<state>/nats/nats-N/``, starts nats-server in the
supervisor's own process group (so `ncpsim down` and the kill fault stop both with one killpg), waits
for the chart's readiness probe, then reports the pod's addresses (4222, the monitor on 8222, the route
port 6222) bound to the server's real ports; the control plane's NATS load balancer fronts every server.
The streams are made by the callout component (the NVCF API's stand-in), so this process never loads
nats-py. If nats-server dies, the supervisor exits too, so the component is seen dead.

Clustered (``nats.config.cluster``, three servers unless the values say otherwise), each server routes
to every server's route port, which the launcher chose before any server started (JetStream sizes its
meta group by the routes it starts with). A restart (fault, rollout) comes back on the ports of the
network map, so clients and peers reconnect to the address they had; a fresh `ncpsim up` (no binding
yet) starts with an empty JetStream store.

A pod stopped by Kubernetes runs the chart's preStop hook first (sim.nats.server.pre_stop: lame duck
mode, see sim.nats.config); the server then exits by itself, and so does this supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sim.model.parts import NatsServer as NatsPod
from sim.model.values import NatsValues
from sim.nats.config import ClusterBlock
from sim.nats.server import PID_FILE, NatsServer, ServerError, nats_folder
from sim.nats.stack import StackKeys, server_config
from sim.runtime.component import Context, Ready
from sim.wire import NATS_MONITOR_PORT, NATS_PORT, NATS_ROUTE_PORT

Ports = tuple[int, int, int]  # client, monitor, route (0: the server chooses)
TOGETHER_WAIT = 5.0  # seconds a server waits for its peers at a launch before it starts regardless
LAUNCH_MARK = "launching"


class Stopped(Exception):
    """The supervisor was told to stop while it waited to spawn its server: none is spawned."""


def _ports(ctx: Context, pod: NatsPod) -> Ports:
    """This server's ports in the network map: pinned since its first start, the route port since the
    launch (0 where there is none yet)."""
    bindings = ctx.netmap.current().bindings
    client, monitor, route = (
        bindings.get(pod.address(p), 0) for p in (NATS_PORT, NATS_MONITOR_PORT, NATS_ROUTE_PORT)
    )
    return client, monitor, route


def _cluster(ctx: Context, route_port: int) -> ClusterBlock | None:
    """Routes to every server of the StatefulSet (none for a single server)."""
    servers = ctx.topology.nats_servers
    if len(servers) < 2:
        return None
    bindings = ctx.netmap.current().bindings
    routes = tuple(bindings.get(s.address(NATS_ROUTE_PORT), 0) for s in servers)
    if not all(routes):
        raise SystemExit("nats: the launcher chose no route port for some servers; start the stack anew")
    return ClusterBlock(routes, port=route_port)


def _start(ctx: Context, keys: StackKeys, stopping: threading.Event) -> NatsServer:
    pod = ctx.topology.nats_server(ctx.name)
    folder = nats_folder(ctx.state_dir, ctx.name)
    pinned = _ports(ctx, pod)
    if not pinned[0]:  # a fresh stack: no work left over from an earlier `ncpsim up`
        shutil.rmtree(folder / "js", ignore_errors=True)
    log_path = ctx.state_dir / "logs" / f"{ctx.name}.log"
    # A pinned port taken meanwhile by another process (a port freed by the stop is anyone's next ephemeral
    # port: seen on a loaded machine, the monitor's taken within 4 s): the server keeps the client port its
    # clients reconnect to (nats-py holds the real address it first dialed, as a client holds a Service's)
    # and takes free ones for the rest (its peers' routes to the old one fail, and its own routes to them
    # make the mesh whole again); the client port taken too, it takes three free ones.
    tries = [pinned, (pinned[0], 0, 0), (0, 0, 0)] if any(pinned) else [pinned]
    for client, monitor, route in dict.fromkeys(tries):
        config = server_config(
            keys,
            str(folder / "js"),
            client,
            monitor,
            _cluster(ctx, route),
            ctx.name,
            str(folder / PID_FILE),
            NatsValues.from_values(ctx.values).auth_timeout,
        )
        server = NatsServer(config, folder, log_path, own_group=False)
        try:
            server.start(before_spawn=_together(ctx, pod, stopping))
            return server
        except ServerError as exc:
            if (client, monitor, route) == (0, 0, 0):
                raise
            fatal = str(exc).splitlines()[-1]  # the log's last line: nats-server's [FTL], past the old run's
            ctx.events.emit("nats.port_taken", ports=[client, monitor, route], error=fatal[:300])
    raise AssertionError("unreachable")


async def _started(ctx: Context, keys: StackKeys) -> NatsServer:
    """Start the server in a thread. Cancelled meanwhile (SIGTERM while `ncpsim up` starts the stack),
    wait for that thread and stop what it started: the thread goes on after the cancellation, and a
    server it spawned after the group's SIGTERM would outlive this supervisor."""
    stopping = threading.Event()
    starting = asyncio.ensure_future(asyncio.to_thread(_start, ctx, keys, stopping))
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        stopping.set()  # a start still waiting for its peers spawns nothing
        with contextlib.suppress(Exception):
            server = await starting
            await asyncio.to_thread(server.stop)
        raise


def _together(ctx: Context, pod: NatsPod, stopping: threading.Event) -> Callable[[], None] | None:
    """At a launch, the servers start in the same instant, as the StatefulSet's Parallel pod management
    starts them: a JetStream campaigns for the first meta leader as soon as it has a route, and one that
    campaigns while a peer is still starting can split the vote and wait out a 4-9 s election. Each
    supervisor, its config written, says it is about to spawn (a file with its pid) and spawns once every
    one has (None: a restart, or a single server, has no one to wait for); told to stop meanwhile (a
    launch interrupted before its peers were forked), it spawns nothing, where waiting out TOGETHER_WAIT
    outlasted the launcher's grace period."""
    if _ports(ctx, pod)[0] or len(ctx.topology.nats_servers) < 2:
        return None
    mine = nats_folder(ctx.state_dir, ctx.name) / LAUNCH_MARK
    peers = [nats_folder(ctx.state_dir, s.name) / LAUNCH_MARK for s in ctx.topology.nats_servers]

    def wait_for_peers() -> None:  # in the start thread
        mine.write_text(str(os.getpid()))
        deadline = time.monotonic() + TOGETHER_WAIT
        while not all(_alive(path) for path in peers) and time.monotonic() < deadline:
            if stopping.wait(0.001):  # a peer that never comes: start anyway, JetStream elects once it does
                raise Stopped("told to stop before its peers started")

    return wait_for_peers


def _alive(mark: Path) -> bool:
    """A launch mark of a running supervisor (one of an earlier launch names a pid gone since)."""
    try:
        os.kill(int(mark.read_text()), 0)
    except (ValueError, OSError):
        return False
    return True


async def run(ctx: Context, ready: Ready) -> None:
    keys = StackKeys.of(ctx.topology)
    pod = ctx.topology.nats_server(ctx.name)
    server = await _started(ctx, keys)
    try:
        assert server.endpoints is not None
        ends = server.endpoints
        ctx.events.emit("nats.ready", server=ctx.name, url=ends.url, monitor=ends.monitor, pid=server.pid)
        bindings = {pod.address(NATS_PORT): ends.port, pod.address(NATS_MONITOR_PORT): ends.monitor_port}
        if ends.cluster_port:
            bindings[pod.address(NATS_ROUTE_PORT)] = ends.cluster_port
        ready(bindings)
        code = await asyncio.to_thread(server.wait)
        ctx.events.emit("nats.exited", server=ctx.name, code=code)
        if code != 0:  # 0: it was told to stop (SIGTERM reaches the whole group at `ncpsim down`)
            raise SystemExit(f"nats-server exited with {code}: {server.log_tail(5)}")
    finally:
        await asyncio.to_thread(server.stop)
        ctx.events.emit("nats.stopped", server=ctx.name)  # down from here until its next nats.ready
