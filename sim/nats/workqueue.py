"""JetStream work delivery: one stream and one durable pull consumer per function version.

Why (public NVCF source, WorkerNatsService and the worker's consumer): the stream
``rq_<region>_<fvid>`` keeps ``rq.<region>.<fvid>.<reqId>`` messages with work-queue
retention, one message per subject (a request id is never queued twice) and a
5 s duplicate window; workers share the durable consumer ``<stream>_workers``
(explicit ack, ack wait 30 s in the field). A worker acks when its callback is
done. If it dies first, the server hands the message to another worker once the
ack wait has passed, so nothing is lost silently; an acked message leaves the
stream and is never delivered again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, FetchTimeoutError

from .subjects import consumer_name, stream_name, stream_subjects, work_subject

ACK_WAIT = 30.0  # seconds, the field value
FETCH_TIMEOUT = 5.0  # seconds a worker's pull waits for work before asking again
PULL_SLACK = 2.0  # seconds past a pull's expiry before the worker stops waiting for the server's 408
PUBLISH_TIMEOUT = 5.0
CONSUMER_LIMIT = 10_000  # max ack pending and max waiting pulls


@dataclass(frozen=True)
class QueueSettings:
    ack_wait: float = ACK_WAIT
    storage: Literal["file", "memory"] = "file"
    max_msgs: int = 100_000
    duplicate_window: float = 5.0
    max_ack_pending: int = CONSUMER_LIMIT
    replicas: int = 1  # R3 on a NATS cluster of three: a server can be down, and nothing is lost


def stream_config(region: str, fvid: str, settings: QueueSettings) -> api.StreamConfig:
    return api.StreamConfig(
        name=stream_name(region, fvid),
        subjects=[stream_subjects(region, fvid)],
        retention=api.RetentionPolicy.WORK_QUEUE,
        max_msgs_per_subject=1,  # the subject carries the request id
        discard=api.DiscardPolicy.NEW,
        discard_new_per_subject=True,  # never replace a queued request
        max_msgs=settings.max_msgs,
        storage=api.StorageType(settings.storage),
        duplicate_window=settings.duplicate_window,
        allow_direct=True,
        num_replicas=settings.replicas,
    )


def consumer_config(region: str, fvid: str, settings: QueueSettings) -> api.ConsumerConfig:
    name = consumer_name(region, fvid)
    return api.ConsumerConfig(
        name=name,
        durable_name=name,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=settings.ack_wait,
        max_ack_pending=settings.max_ack_pending,
        max_waiting=settings.max_ack_pending,
    )


async def ensure_stream(
    js: JetStreamContext, region: str, fvid: str, settings: QueueSettings = QueueSettings()
) -> None:
    """Create (or bring up to date) the function version's stream and consumer."""
    config = stream_config(region, fvid, settings)
    try:
        await js.add_stream(config)
    except BadRequestError:  # exists with another configuration
        await js.update_stream(config)
    await js.add_consumer(stream_name(region, fvid), consumer_config(region, fvid, settings))


async def publish_work(
    js: JetStreamContext,
    region: str,
    fvid: str,
    req_id: str,
    data: bytes,
    headers: dict[str, str] | None = None,
    timeout: float = PUBLISH_TIMEOUT,
    msg_id: str | None = None,
) -> int:
    """Queue one request's work message; returns its stream sequence.

    ``Nats-Msg-Id`` is ``msg_id`` (default: the request id), so a retried publish
    within the duplicate window is not queued twice.
    """
    ack = await js.publish(
        work_subject(region, fvid, req_id),
        data,
        timeout=timeout,
        stream=stream_name(region, fvid),
        headers={"Nats-Msg-Id": msg_id or req_id, **(headers or {})},
    )
    return ack.seq


def delivery_count(msg: Msg) -> int:
    """1 on first delivery, 2 after one redelivery, ..."""
    return msg.metadata.num_delivered or 1


class WorkPuller:
    """A worker's end of the consumer: fetch one message, then ack or nak it.

    Binds to the existing durable consumer without looking it up, so a worker
    needs only the pull and ack subjects of its own consumer.
    """

    def __init__(self, nc: Client, region: str, fvid: str) -> None:
        self.nc, self.region, self.fvid = nc, region, fvid
        self._sub: Any = None

    async def start(self) -> WorkPuller:
        js = self.nc.jetstream()
        self._sub = await js.pull_subscribe_bind(
            consumer_name(self.region, self.fvid), stream=stream_name(self.region, self.fvid)
        )
        return self

    async def fetch(self, timeout: float = FETCH_TIMEOUT) -> Msg | None:
        """The next work message, or None if none came within ``timeout``."""
        if self._sub is None:
            await self.start()
        try:
            (msg,) = await self._sub.fetch(1, timeout=timeout)
        except (NatsTimeoutError, FetchTimeoutError, TimeoutError):
            return None
        return cast(Msg, msg)

    @staticmethod
    async def ack(msg: Msg) -> None:
        """Done: the message leaves the stream. Waits for the server's confirmation."""
        await msg.ack_sync()

    @staticmethod
    async def nak(msg: Msg, delay: float | None = None) -> None:
        """Give the message back now (or after ``delay``) for another worker."""
        await msg.nak(delay)

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None


class PullRefused(Exception):
    """The server ended a pull request with an error status (409 Consumer Deleted, Exceeded MaxWaiting...)."""


@dataclass
class _Pull:
    batch: int
    done: asyncio.Future[None]  # a future, not an Event: an Event holds a deque (~0.75 KiB) for its life
    delivered: int = 0
    error: str = ""

    def end(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


# What a Handoff subscription has for a pending queue: messages never wait in it (nats-py reads it only
# for ``pending_msgs`` and a drain). tests/test_nats_workqueue.py pins both nats-py internals used here.
_NO_QUEUE: asyncio.Queue[Msg] = asyncio.Queue()


class Handoff:
    """What nats-py's ``subscribe`` takes as its ``future``: each message goes to ``on_msg`` as the read
    loop parses it, and the subscription stays. Given a ``cb`` instead, nats-py runs a task per
    subscription that takes the messages from a queue of its own, a task switch a message and ~2 KiB a
    worker at ten thousand workers. ``on_msg`` must not block: it runs in the connection's read loop."""

    __slots__ = ("on_msg",)

    def __init__(self, on_msg: Callable[[Msg], None]) -> None:
        self.on_msg = on_msg

    def cancelled(self) -> bool:
        return False

    def set_result(self, msg: Msg) -> None:
        self.on_msg(msg)


class BatchPuller:
    """A worker's end of the consumer as a held pull, the way nats.go's ``Consume`` pulls (without its
    heartbeats): one request at a time for up to ``batch`` messages, open until they have all come or it
    expires. Each message goes to ``deliver`` as it arrives, with whether it counts against the request
    being waited on (it does unless none is: a late one of a request given up on); acking is the caller's.

    Why not one ``fetch(1)`` per message: every pull request makes nats-server walk all the consumer's
    waiting requests (``processWaiting``, an interest lookup each), which with one waiting request per
    worker was most of nats-server's CPU at scale; and each cost the worker a publish and a flush.
    The reply subject is a plain inbox (``_INBOX.<id>``, no wildcard: the server looks its interest up for
    every waiting request on every pass). Requests follow one another, so a message (work keeps its stream
    subject) or status is about the open request, unless one was given up on (no 408 in time); then the
    next request gets a new inbox."""

    def __init__(self, nc: Client, region: str, fvid: str, deliver: Callable[[Msg, bool], None]) -> None:
        self.nc, self.deliver = nc, deliver
        self.next_subject = (
            f"$JS.API.CONSUMER.MSG.NEXT.{stream_name(region, fvid)}.{consumer_name(region, fvid)}"
        )
        self._inbox = ""
        self._sub: Any = None
        self._current: _Pull | None = None
        self.delivered = 0  # messages the last pull brought, however it ended (cancelled too)

    async def start(self) -> BatchPuller:
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(
            self._inbox, future=cast(asyncio.Future[Any], Handoff(self._on_msg))
        )
        self._sub._pending_queue = _NO_QUEUE  # its own (four deques, ~3 KiB) would never hold a message
        return self

    async def pull(self, batch: int, expires: float) -> int:
        """One pull request; returns how many messages it brought once it is used up or has expired, or
        raises PullRefused. A request whose 408 never comes (the server went away) is given up on."""
        self.delivered = 0
        if self._sub is None:
            await self.start()
        pull = self._current = _Pull(batch, asyncio.get_running_loop().create_future())
        request = b'{"batch":%d,"expires":%d}' % (batch, int(expires * 1e9))
        try:
            await self.nc.publish(self.next_subject, request, reply=self._inbox)
            async with asyncio.timeout(expires + PULL_SLACK):  # no task per pull, as wait_for makes
                await pull.done
        except TimeoutError:
            await self.close()  # whatever still comes for it finds no one: redelivered after ack wait
        finally:
            self._current, self.delivered = None, pull.delivered
        if pull.error:
            raise PullRefused(pull.error)
        return pull.delivered

    def _on_msg(self, msg: Msg) -> None:
        pull = self._current
        status = msg.headers.get(api.Header.STATUS) if msg.headers else None
        if not status:
            if pull is not None:
                pull.delivered += 1
                if pull.delivered >= pull.batch:
                    pull.end()
            self.deliver(msg, pull is not None)
            return
        if pull is None or status == "100":
            return  # about a request that has ended, or a heartbeat (none is asked for)
        if status not in ("404", "408"):  # no messages, request timeout: the request has ended
            description = (msg.headers or {}).get(api.Header.DESCRIPTION, "")
            pull.error = f"nats: pull refused: {status} {description}".strip()
        pull.end()

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()
