"""Work over the stack's NATS: pods publish work messages, workers pull them and ack when done.

Everything dials the NATS servers behind the control plane's load-balancer address (4222) through the
network map, as seen from the caller's cluster, with every server in its list. nats-py reconnects by
itself to another server, or to the same one when it comes back (a kill/restart fault brings it back on
the same address); a pull that fails while none answers is retried, a publish that fails is the
caller's error to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from .client import connect_once
from .stack import REGION
from .workqueue import BatchPuller

CONNECT_TIMEOUT = 5.0
RECONNECT_WAIT = 0.5  # seconds between reconnect attempts; longer than the callout's (0.1 s), so after a
# nats-server restart the callout is usually back first: a sign-in with no callout listening is held
# until the server's auth timeout (10 s) before it is refused
PULL_TIMEOUT = 300.0  # seconds one pull waits for work before asking again (an idle worker's only traffic;
# after a reconnect the worker re-issues its pulls at once, see sim.worker.nats_links; a leadership change
# or a deleted consumer ends it with a 409). Each expiry and each new pull makes nats-server walk every
# waiting pull of the consumer, so their cost grows with the square of the workers: at 30 s, 2,000 idle
# workers' expiries cost it more than the work did; at 120 s one round of them cost the three servers
# 6.2 CPU-s (2,000 workers; 150 s idle: 0.059 -> 0.0175 cores at 300 s, bench/findings.md).
PULL_RETRY_FIRST = 0.05  # seconds before a refused pull is asked again, doubling up to RECONNECT_WAIT
MAX_IN_FLIGHT = 64  # work messages one worker handles at once (its pulls pause beyond this)
PULL_BATCH = 8  # messages a pull asks for at most (a worker with many functions keeps room for each)
ACK_PROGRESS = 1.0  # seconds between "in progress" acks while a callback runs (well under any ack wait)


async def connect(servers: list[str], name: str, credentials: Mapping[str, str], **options: Any) -> Client:
    """One login attempt to ``servers`` (the caller's Context.nats_servers()) (a refusal raises at once), then a client that reconnects for ever; a refused
    worker backs off as a crash-looping pod would (its caller's loop)."""
    settings: dict[str, Any] = {**credentials, **options}  # nats-py's own keywords (user_credentials, ...)
    return await connect_once(
        servers,
        name=name,
        connect_timeout=CONNECT_TIMEOUT,
        reconnect_time_wait=RECONNECT_WAIT,
        **settings,
    )


Handler = Callable[[dict[str, Any], int], Awaitable[None]]  # (work message, delivery count)


class InFlight:
    """One worker's messages being handled: at most MAX_IN_FLIGHT, and they outlive the pull loops that
    fetched them (pulls restart after a reconnect; a callback in progress must not be cut short). A pull
    reserves slots for the messages it asks for; each message it brings keeps one until handled."""

    def __init__(self, limit: int = MAX_IN_FLIGHT) -> None:
        self.slots = asyncio.Semaphore(limit)
        self.tasks: set[asyncio.Task[None]] = set()

    async def reserve(self, most: int) -> int:
        """Wait for one free slot, then take up to ``most`` without waiting."""
        await self.slots.acquire()
        taken = 1
        while taken < most and not self.slots.locked():
            await self.slots.acquire()  # free: returns at once
            taken += 1
        return taken

    def release(self, count: int) -> None:
        for _ in range(count):
            self.slots.release()

    def spawn(
        self, msg: Msg, handle: Handler, on_error: Callable[[str], None], reserved: bool = True
    ) -> None:
        task = asyncio.create_task(
            _handle(msg, handle, self.slots, on_error, reserved), name=f"work:{msg.subject}"
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def cancel_all(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def pull_loop(
    nc: Client,
    function: str,
    handle: Handler,
    on_error: Callable[[str], None],
    started: asyncio.Future[None] | None = None,
    in_flight: InFlight | None = None,
) -> None:
    """Pull one function version's work for ever, up to PULL_BATCH messages a request (as many as the
    worker has room for); each message is handled in its own task and acked when the handler returns
    (a worker that dies first leaves it to be redelivered after ack wait). Handlers belong to
    ``in_flight`` when given (the caller ends them), else to this loop."""
    own = in_flight is None
    flight = in_flight or InFlight()
    puller = BatchPuller(
        nc, REGION, function, lambda msg, reserved: flight.spawn(msg, handle, on_error, reserved)
    )
    failing, wait = False, PULL_RETRY_FIRST
    try:
        await puller.start()
        if started is not None and not started.done():
            started.set_result(None)
        while True:
            reserved = await flight.reserve(PULL_BATCH)
            try:
                await puller.pull(reserved, PULL_TIMEOUT)
                failing, wait = False, PULL_RETRY_FIRST
            except Exception as exc:  # noqa: BLE001 - server away or refused: wait for the reconnect
                if not failing:  # once per outage, not once per retry
                    on_error(f"{type(exc).__name__}: {exc}")
                failing = True
                # Soon at first (a JetStream still electing its leaders answers 503 for a moment), then
                # as often as nats-py reconnects.
                await asyncio.sleep(wait)
                wait = min(wait * 2, RECONNECT_WAIT)
            finally:
                # What the pull brought went to handlers, which free their own slots (cancelled too).
                flight.release(reserved - puller.delivered)
    finally:
        with contextlib.suppress(Exception):
            await puller.close()
        if own:
            await flight.cancel_all()


async def _keep_in_progress(msg: Msg) -> None:
    """ "Still working on it" (+WPI) every ACK_PROGRESS seconds: a long callback is not redelivered while its
    worker is alive; only a worker that died (no more progress acks) lets the ack wait run out."""
    while True:
        await asyncio.sleep(ACK_PROGRESS)
        await msg.in_progress()


async def _handle(
    msg: Msg, handle: Handler, slots: asyncio.Semaphore, on_error: Callable[[str], None], reserved: bool
) -> None:
    if not reserved:  # a late message of a pull given up on: it waits for room like any other
        await slots.acquire()
    try:
        try:
            work = json.loads(msg.data)
        except (ValueError, RecursionError) as exc:
            on_error(f"unreadable work message {msg.subject}: {type(exc).__name__}")
            await msg.term()
            return
        progress = asyncio.create_task(_keep_in_progress(msg), name=f"in-progress:{msg.subject}")
        try:
            await handle(work, msg.metadata.num_delivered or 1)
        finally:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
        await msg.ack()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a lost ack is redelivered; report it, keep pulling
        on_error(f"ack failed for {msg.subject}: {type(exc).__name__}: {exc}")
    finally:
        slots.release()
