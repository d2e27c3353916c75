"""Work delivery on real JetStream: redelivery after the ack wait, none after an ack."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from collections.abc import Callable

import nats
from nats_support import LONG, SHORT, Keys, connect, keys_fixture, run, start_server_fixture  # noqa: F401 - fixtures

from sim.nats.server import NatsServer
from sim.nats.subjects import consumer_name, stream_name
from sim.nats.workqueue import (
    BatchPuller,
    QueueSettings,
    WorkPuller,
    delivery_count,
    ensure_stream,
    publish_work,
)

REGION, FVID = "r1", "cccccccc-0000-4000-8000-00000000000c"
ACK_WAIT = 0.5  # seconds; the field's 30 s would make these tests slow


def queue_server(start_server: Callable[..., NatsServer], keys: Keys) -> NatsServer:
    return start_server(worker_nkey=keys.pub(keys.worker), internal_users=keys.internal_users())


def test_unacked_work_is_redelivered_and_acked_work_is_not(
    start_server: Callable[..., NatsServer], keys: Keys
) -> None:
    server = queue_server(start_server, keys)
    url = server.endpoints.url

    async def body() -> None:
        publisher, _ = await connect(url, nkeys_seed_str=keys.seed(keys.invocation))
        js = publisher.jetstream()
        await ensure_stream(js, REGION, FVID, QueueSettings(ack_wait=ACK_WAIT))
        for i in range(3):
            await publish_work(js, REGION, FVID, f"req-{i}", f"work {i}".encode())
        assert await publish_work(js, REGION, FVID, "req-0", b"retried publish") == 1  # deduplicated
        first_conn, _ = await connect(url, nkeys_seed_str=keys.seed(keys.worker))
        first = await WorkPuller(first_conn, REGION, FVID).start()
        t_first = time.monotonic()  # no delivery before this
        held = [await first.fetch(SHORT) for _ in range(3)]
        assert [m.data for m in held if m] == [b"work 0", b"work 1", b"work 2"]
        assert await first.fetch(ACK_WAIT / 5) is None  # all three are out, none acked
        await first_conn.close()  # the worker goes away without acking

        second_conn, _ = await connect(url, nkeys_seed_str=keys.seed(keys.worker))
        second = await WorkPuller(second_conn, REGION, FVID).start()
        again = [await second.fetch(ACK_WAIT * 4)]
        assert time.monotonic() - t_first >= ACK_WAIT  # no redelivery before the ack wait
        again += [await second.fetch(ACK_WAIT * 4) for _ in range(2)]
        assert sorted(m.data for m in again if m) == [b"work 0", b"work 1", b"work 2"]
        assert [delivery_count(m) for m in again if m] == [2, 2, 2]
        for m in again:
            await WorkPuller.ack(m)
        assert await second.fetch(ACK_WAIT * 3) is None  # acked work never comes back
        info = await js.consumer_info(stream_name(REGION, FVID), consumer_name(REGION, FVID))
        assert (info.num_pending, info.num_ack_pending, info.num_redelivered) == (0, 0, 0)
        assert (await js.stream_info(stream_name(REGION, FVID))).state.messages == 0  # work-queue retention
        await second_conn.close()
        await publisher.close()

    run(body())


def test_a_held_pull_hands_each_message_over_as_it_is_read(
    start_server: Callable[..., NatsServer], keys: Keys
) -> None:
    """BatchPuller's subscription has neither a task nor a queue of its own (nats-py's internals it relies
    on: a subscription given a ``future`` gets every message through ``set_result``); a batch ends the
    pull when full, else the server's 408 at its expiry."""
    server = queue_server(start_server, keys)
    url = server.endpoints.url

    async def body() -> None:
        publisher, _ = await connect(url, nkeys_seed_str=keys.seed(keys.invocation))
        js = publisher.jetstream()
        await ensure_stream(js, REGION, FVID, QueueSettings(ack_wait=LONG, storage="memory"))
        for i in range(3):
            await publish_work(js, REGION, FVID, f"req-{i}", f"work {i}".encode())
        worker, _ = await connect(url, nkeys_seed_str=keys.seed(keys.worker))
        got: list[tuple[bytes, bool]] = []
        puller = await BatchPuller(
            worker, REGION, FVID, lambda msg, counted: got.append((msg.data, counted))
        ).start()
        sub = puller._sub
        assert sub._wait_for_msgs_task is None and sub._pending_queue.qsize() == 0
        assert await puller.pull(2, LONG) == 2  # full: ended without waiting for the expiry
        assert await puller.pull(2, 0.3) == 1  # the 408 at expiry ends a pull that is not full
        assert await puller.pull(2, 0.3) == 0
        assert got == [(b"work 0", True), (b"work 1", True), (b"work 2", True)]
        await puller.close()
        await worker.close()
        await publisher.close()

    run(body())


def test_nak_gives_work_back_at_once(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    server = queue_server(start_server, keys)

    async def body() -> None:
        nc, _ = await connect(server.endpoints.url, nkeys_seed_str=keys.seed(keys.worker))
        js = nc.jetstream()
        await ensure_stream(js, REGION, FVID, QueueSettings(ack_wait=LONG, storage="memory"))
        await publish_work(js, REGION, FVID, "req-n", b"n")
        puller = await WorkPuller(nc, REGION, FVID).start()
        msg = await puller.fetch(SHORT)
        await WorkPuller.nak(msg)
        again = await puller.fetch(SHORT)  # well before the 30 s ack wait
        assert again is not None and again.data == b"n" and delivery_count(again) == 2
        await WorkPuller.ack(again)
        await nc.close()

    run(body())


WORKER_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, sys.argv[4])
    import nats
    from sim.nats.workqueue import WorkPuller
    async def main():
        nc = await nats.connect(sys.argv[1], nkeys_seed_str=sys.argv[2])
        msg = await (await WorkPuller(nc, "r1", sys.argv[3]).start()).fetch(5)
        print(msg.subject, flush=True)
        await asyncio.Event().wait()  # "mid-callback", until SIGKILL
    asyncio.run(main())
""")


def test_sigkilled_worker_holding_work(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    server = queue_server(start_server, keys)
    url = server.endpoints.url
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    async def body() -> None:
        nc, _ = await connect(url, nkeys_seed_str=keys.seed(keys.worker))
        js = nc.jetstream()
        await ensure_stream(js, REGION, FVID, QueueSettings(ack_wait=ACK_WAIT, storage="memory"))
        await publish_work(js, REGION, FVID, "req-k", b"k")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WORKER_SCRIPT,
            url,
            keys.seed(keys.worker),
            FVID,
            root,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), SHORT)
            assert line.decode().strip() == f"rq.{REGION}.{FVID}.req-k"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            assert await proc.wait() == -signal.SIGKILL
        msg = await (await WorkPuller(nc, REGION, FVID).start()).fetch(ACK_WAIT * 4)
        assert msg is not None and msg.data == b"k" and delivery_count(msg) == 2
        await WorkPuller.ack(msg)
        await nc.close()

    run(body())


def test_work_survives_a_server_kill(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    """SIGKILL and restart on the same port: file-stored work is still there, the worker reconnects."""
    server = queue_server(start_server, keys)
    url = server.endpoints.url

    async def body() -> None:
        reconnected = asyncio.Event()

        async def on_reconnect() -> None:
            reconnected.set()

        nc = await nats.connect(
            url,
            nkeys_seed_str=keys.seed(keys.worker),
            reconnect_time_wait=0.05,
            max_reconnect_attempts=-1,
            reconnected_cb=on_reconnect,
        )
        js = nc.jetstream()
        await ensure_stream(js, REGION, FVID, QueueSettings(ack_wait=LONG))
        await publish_work(js, REGION, FVID, "req-s", b"s")
        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(reconnected.wait(), SHORT)
        msg = await (await WorkPuller(nc, REGION, FVID).start()).fetch(SHORT)
        assert msg is not None and msg.data == b"s"
        await WorkPuller.ack(msg)
        await nc.close()

    run(body())
