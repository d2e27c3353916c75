"""Support for the NATS tests: real keys, real nats-server processes that are always stopped and checked
gone, clients that record errors, a webhook stand-in. Test modules import the fixtures they use."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
import nkeys
import pytest
from nats.aio.client import Client

from sim.model.topology import Topology
from sim.nats import jwt
from sim.nats.client import connect_once
from sim.nats.config import CalloutBlock, NkeyUser, ServerConfig
from sim.nats.server import NatsServer

SHORT = 5.0  # seconds: anything local that should be quick
LONG = 30.0  # seconds: a whole scenario
T = TypeVar("T")


def run(coro: Awaitable[T], timeout: float = LONG) -> T:
    """Run one async test body under a named deadline."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


class Keys:
    """Fresh NKeys per session: what the chart's secrets would hold."""

    def __init__(self) -> None:
        user, account = nkeys.PREFIX_BYTE_USER, nkeys.PREFIX_BYTE_ACCOUNT
        self.callout_user = jwt.new_keypair(user, os.urandom(32))
        self.issuer = jwt.new_keypair(account, os.urandom(32))
        self.worker = jwt.new_keypair(user, os.urandom(32))
        self.invocation = jwt.new_keypair(user, os.urandom(32))
        self.stranger = jwt.new_keypair(user, os.urandom(32))
        self.other_account = jwt.new_keypair(account, os.urandom(32))

    @staticmethod
    def pub(kp: nkeys.KeyPair) -> str:
        return kp.public_key.decode()

    @staticmethod
    def seed(kp: nkeys.KeyPair) -> str:
        return bytes(kp.seed).decode()

    def internal_users(self) -> tuple[NkeyUser, ...]:
        return (NkeyUser("invocation-service", self.pub(self.invocation)),)

    def callout_block(self) -> CalloutBlock:
        return CalloutBlock(issuer=self.pub(self.issuer), user=self.pub(self.callout_user))

    def nkey_mappings(self) -> tuple[tuple[str, str], ...]:
        return ((self.pub(self.worker), "APP"),)


@pytest.fixture(scope="session", name="keys")
def keys_fixture() -> Keys:
    return Keys()


@pytest.fixture(name="start_server")
def start_server_fixture(tmp_path: Path) -> Iterator[Callable[..., NatsServer]]:
    """Start servers for a test; stop them after it and fail if a process survived."""
    servers: list[NatsServer] = []

    def start(config: ServerConfig | None = None, name: str = "nats", **kw: Any) -> NatsServer:
        config = config or ServerConfig(store_dir=str(tmp_path / name / "js"), **kw)
        server = NatsServer(config, tmp_path / name, tmp_path / "logs" / f"{name}.log")
        servers.append(server)
        server.start()
        return server

    yield start
    pids = [s.pid for s in servers if s.pid is not None]
    for server in servers:
        server.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # the whole group is gone, not just the leader


def server_log(server: NatsServer, wait_for: str = "", timeout: float = SHORT) -> str:
    """nats-server's log; with ``wait_for``, once that text is in it (the server may log a refusal a
    moment after the client has it)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        text = server.log_path.read_text(errors="replace")
        if not wait_for or wait_for in text or time.monotonic() > deadline:
            return text
        time.sleep(0.02)  # a file another process appends to: nothing to await


@dataclass
class Recorded:
    """A client's asynchronous errors (permission violations arrive this way)."""

    errors: list[str] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_error(self, exc: Exception) -> None:
        self.errors.append(str(exc))
        self.event.set()

    async def wait_for(self, text: str, timeout: float = SHORT) -> str:
        async def poll() -> str:
            while True:
                for e in self.errors:
                    if text in e:
                        return e
                self.event.clear()
                await self.event.wait()

        return await asyncio.wait_for(poll(), timeout)


async def connect(url: str, **kw: Any) -> tuple[Client, Recorded]:
    """One connection attempt, no reconnects: a refusal raises at once."""
    rec = Recorded()
    nc = await connect_once(url, reconnect=False, connect_timeout=SHORT, error_cb=rec.on_error, **kw)
    return nc, rec


async def refused(url: str, **kw: Any) -> str:
    """The client-side error of a refused login (fails the test if it connects)."""
    try:
        nc, _ = await connect(url, **kw)
    except nats.errors.Error as exc:  # nats-py raises its generic Error for -ERR
        return str(exc)
    await nc.close()
    raise AssertionError(f"login with {sorted(kw)} was accepted")


class WebhookStandIn:
    """The NVCF API's /v2/nvcf/webhook/nats-auth, over real HTTP/1.1 on 127.0.0.1."""

    def __init__(self, answer: Callable[[dict], tuple[int, bytes]]) -> None:
        self.answer = answer
        self.requests: list[dict] = []
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v2/nvcf/webhook/nats-auth"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
            body = json.loads(await reader.readexactly(int(headers["content-length"])))
            self.requests.append({"line": head[0], "headers": headers, "body": body})
            status, data = self.answer(body)
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def nats_components(state: Path, topology: Topology) -> AsyncIterator[dict[str, int]]:
    """The stack's NATS servers (their supervisors) and auth callout as tasks of this loop, as the launcher
    starts them: route ports chosen first, every server at once, its bindings in the network map when it
    is ready, then the callout; yields the NATS bindings for the network map. All are stopped on the way
    out (each supervisor stops the nats-server it started)."""
    from clusters.local.launcher import reserve_ports
    from sim.model.netmap import NetMap
    from sim.model.parts import CONTROL_CLUSTER
    from sim.pods.nats import callout_component, component
    from sim.runtime.component import Context

    (state / "logs").mkdir(parents=True, exist_ok=True)
    reach = {c.name: topology.reachable_ranges(c.name) for c in topology.clusters}
    bindings = reserve_ports(topology.reserved_addresses())

    def publish() -> None:
        NetMap(dict(bindings), reach, topology.service_endpoints(), seed=topology.seed).save(
            state / "netmap.json"
        )

    publish()
    servers = [Context(state, topology, s.name, CONTROL_CLUSTER) for s in topology.nats_servers]
    callout = Context(state, topology, "nats-auth-callout", CONTROL_CLUSTER)
    tasks: list[asyncio.Task[None]] = []

    async def started(ctx: Context, runner: Any) -> dict[str, int]:
        ready: asyncio.Future[dict[str, int]] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(runner(ctx, ready.set_result), name=ctx.name)
        tasks.append(task)
        await asyncio.wait({ready, task}, timeout=LONG, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # raises what stopped it
        return ready.result()

    try:
        for found in await asyncio.gather(*(started(ctx, component.run) for ctx in servers)):
            bindings.update(found)
        publish()
        bindings.update(await started(callout, callout_component.run))
        yield bindings
    finally:
        for task in reversed(tasks):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for ctx in [*servers, callout]:
            ctx.events.close()
