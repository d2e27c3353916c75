"""The NATS side of one cluster's function workers: sign in as worker-utils does, pull work, ack it.

``nats.workerAuth: nkey``: a worker signs in once with NKEY_SEED (the shared NKey) and pulls every
function it serves over that connection. ``token``: it signs in with its own worker token, which is
scoped to one function version, so it holds one connection per function it serves. A refused login
is retried with a growing delay (a crash-looping pod); the worker gets no work meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nats.aio.client import Client

from sim.model.events import WORKER_NATS_CONNECTED, WORKER_NATS_REFUSED
from sim.model.values import NatsValues
from sim.nats.client import close_client
from sim.nats.stack import StackKeys, worker_credentials
from sim.nats.work import InFlight, connect, pull_loop
from sim.runtime.component import Context

LOGIN_BACKOFF = (0.5, 10.0)  # first and longest delay between refused logins
SIGN_INS_AT_ONCE = 16
CANCEL_AGAIN = 0.2  # seconds before a task that survived its cancellation is cancelled again
BIND_POLL = 0.005  # seconds between looks at the network map while the NATS servers are not mapped yet


class Worker(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def reads_nats_account(self) -> bool: ...  # False: an older worker-utils, which asks for account Worker


WorkHandler = Callable[[Any, dict[str, Any]], Awaitable[None]]  # (worker, work message)


@dataclass(frozen=True)
class Link:
    """One NATS connection of one worker and the function versions it pulls over it."""

    worker: str
    functions: tuple[str, ...]
    credentials: Mapping[str, str]
    describe: str


def plan_links(
    keys: StackKeys,
    mode: str,
    workers: list[str],
    functions: tuple[str, ...],
    reads_account: Callable[[str], bool] = lambda _: True,
) -> list[Link]:
    """nkey: one connection per worker for all functions; token: one per worker and function (pure)."""
    links = []
    for worker in workers:
        if mode == "nkey":
            cred = worker_credentials(keys, mode, worker, functions[0] if functions else "")
            links.append(Link(worker, functions, cred.connect_kwargs, cred.describe))
            continue
        for function in functions:
            cred = worker_credentials(keys, mode, worker, function, reads_account(worker))
            links.append(Link(worker, (function,), cred.connect_kwargs, cred.describe))
    return links


async def wait_for_nats(ctx: Context) -> None:
    """Until the launcher has mapped every NATS server and the auth callout is up (worker hosts start beside
    the control plane), so each worker's server list is whole and its sign-in is answered."""
    while not ctx.nats_sign_in_up():
        await asyncio.sleep(BIND_POLL)


def settle(done: asyncio.Future[None]) -> None:
    """Mark ``done`` (once; later calls do nothing). The links wait on futures rather than asyncio.Events:
    an Event holds a deque (~0.75 KiB) for its life, and a worker held four of them."""
    if not done.done():
        done.set_result(None)


class Connection:
    """What nats-py's callbacks tell one sign-in's pull loops: the connection closed for good, or it came
    back from a reconnect (the server forgot the pulls that were waiting). One signal for both, so a
    session waits on it without a task per state: at ten thousand workers, a task each cost memory."""

    def __init__(self) -> None:
        self.closed = False
        self.changed = asyncio.get_running_loop().create_future()

    def rearm(self) -> None:
        """A new session starts: wait for the next change."""
        if self.changed.done():
            self.changed = asyncio.get_running_loop().create_future()

    def change(self) -> None:
        settle(self.changed)

    def close(self) -> None:
        self.closed = True
        self.change()


class WorkerLinks:
    """Every worker's connections and pull loops of one worker host; ``start`` returns once each link
    has signed in and bound its consumers, or been refused once (then it keeps trying)."""

    def __init__(self, ctx: Context, workers: Mapping[str, Worker], handle: WorkHandler) -> None:
        self.ctx, self.workers, self.handle = ctx, workers, handle
        values = NatsValues.from_values(ctx.values)
        self.links = plan_links(
            StackKeys.of(ctx.topology),
            values.worker_auth,
            list(workers),
            ctx.topology.functions,
            lambda name: workers[name].reads_nats_account,
        )
        self.tasks: set[asyncio.Task[None]] = set()
        self.clients: list[Client] = []
        self.in_flight: list[InFlight] = []
        # Sign-ins at once from this host: hundreds of workers starting together would queue at the auth
        # callout past nats-server's first PING (~2 s), which nats-py cannot take (sim.nats.client).
        self.signing_in = asyncio.Semaphore(SIGN_INS_AT_ONCE)

    async def start(self) -> None:
        await wait_for_nats(self.ctx)
        first = [asyncio.get_running_loop().create_future() for _ in self.links]
        for link, event in zip(self.links, first, strict=True):
            task = asyncio.create_task(self._serve(link, event), name=f"nats:{link.worker}:{link.functions}")
            self.tasks.add(task)
        await asyncio.gather(*first)

    async def _serve(self, link: Link, first: asyncio.Future[None]) -> None:
        """Sign in, pull until the connection is closed for good (nats-py gives up on a refused
        re-login), then sign in again, as a restarted worker-utils would."""
        in_flight = InFlight()  # the worker's callbacks, across reconnects and re-logins
        self.in_flight.append(in_flight)
        while True:
            connection = Connection()
            nc = await self._login(link, first, connection)
            try:
                await self._session(link, nc, first, connection, in_flight)
            finally:
                self.clients.remove(nc)
                with contextlib.suppress(Exception):  # cancel_all may cancel this task again meanwhile:
                    await close_client(nc)  # the close goes on to its end (sim.nats.client.close_client)
            self.ctx.events.emit("worker.nats.closed", worker=link.worker, functions=list(link.functions))

    async def _login(self, link: Link, first: asyncio.Future[None], connection: Connection) -> Client:
        delay = LOGIN_BACKOFF[0]
        note_reconnect = self._state_cb(link, "worker.nats.reconnected")

        async def on_closed() -> None:
            connection.close()

        async def on_reconnected() -> None:
            connection.change()
            await note_reconnect()

        while True:
            try:
                async with self.signing_in:
                    nc = await connect(
                        self.ctx.nats_servers(),
                        link.worker,
                        link.credentials,
                        error_cb=self._error_cb(link),
                        disconnected_cb=self._state_cb(link, "worker.nats.disconnected"),
                        reconnected_cb=on_reconnected,
                        closed_cb=on_closed,
                    )
                break
            except Exception as exc:  # noqa: BLE001 - refused or unreachable: retry like a crash-looping pod
                self.ctx.events.emit(
                    WORKER_NATS_REFUSED,
                    worker=link.worker,
                    functions=list(link.functions),
                    credentials=link.describe,
                    error=str(exc) or type(exc).__name__,
                )
                settle(first)
                await asyncio.sleep(delay)
                delay = min(delay * 2, LOGIN_BACKOFF[1])
        self.clients.append(nc)
        self.ctx.events.emit(
            WORKER_NATS_CONNECTED,
            worker=link.worker,
            functions=list(link.functions),
            credentials=link.describe,
        )
        return nc

    async def _session(
        self,
        link: Link,
        nc: Client,
        first: asyncio.Future[None],
        connection: Connection,
        in_flight: InFlight,
    ) -> None:
        """Pull loops until the connection closes; after each reconnect they start over, since the
        server forgot the pulls that were waiting (they would otherwise idle until they expire)."""
        while not connection.closed:
            connection.rearm()
            bound = [asyncio.get_running_loop().create_future() for _ in link.functions]
            loops = [
                asyncio.create_task(
                    pull_loop(nc, f, self._handler(link.worker), self._pull_error(link), b, in_flight),
                    name=f"pull:{link.worker}:{f}",
                )
                for f, b in zip(link.functions, bound, strict=True)
            ]
            try:
                await asyncio.gather(*bound)
                for function in link.functions:  # readiness a scenario can wait for (after a redeploy)
                    self.ctx.events.emit("worker.work.pulling", worker=link.worker, function=function)
                settle(first)
                await connection.changed  # closed, or reconnected
            finally:
                await cancel_all(loops)

    def _handler(self, name: str) -> Callable[[dict[str, Any], int], Awaitable[None]]:
        worker = self.workers[name]

        async def handle(work: dict[str, Any], delivered: int) -> None:
            if delivered > 1:
                self.ctx.events.emit(
                    "worker.work.redelivered",
                    worker=name,
                    requestId=work.get("requestId"),
                    delivered=delivered,
                )
            await self.handle(worker, work)

        return handle

    def _error_cb(self, link: Link) -> Callable[[Exception], Awaitable[None]]:
        async def on_error(exc: Exception) -> None:
            self.ctx.events.emit(
                "worker.nats.error", worker=link.worker, error=str(exc) or type(exc).__name__
            )

        return on_error

    def _state_cb(self, link: Link, kind: str) -> Callable[[], Awaitable[None]]:
        async def on_change() -> None:
            self.ctx.events.emit(kind, worker=link.worker, functions=list(link.functions))

        return on_change

    def _pull_error(self, link: Link) -> Callable[[str], None]:
        def on_error(error: str) -> None:
            self.ctx.events.emit("worker.nats.pull_error", worker=link.worker, error=error)

        return on_error

    async def close(self) -> None:
        await cancel_all(list(self.tasks))
        for flight in self.in_flight:
            await flight.cancel_all()
        for nc in self.clients:
            with contextlib.suppress(Exception):
                await close_client(nc)


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait for them to end, cancelling again while any is left: nats-py catches a
    CancelledError that lands while it sends a command (``Client._send_command``), so one cancel can leave
    a pull loop going on to its next pull, and whoever waits for it waits until that pull expires."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN)
    await asyncio.gather(*tasks, return_exceptions=True)  # retrieve what each ended with
