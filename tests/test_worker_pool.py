"""The worker's kept-alive connections: worker-utils' shared proxy client for HTTP callbacks (as Go's
http.Transport pools them), and the worker library's QUIC connection per host for gRPC callbacks.

The pool on its own, then a worker's callbacks against a stand-in pod on loopback: one connection for
successive callbacks, a GET lost on a reused connection sent again, a POST lost that way failing, a link
fault reaching requests on a kept-alive connection, and a connection the server closed while idle
never handed out. Then the QUIC cache with a stand-in connection: one dial shared, a failed dial
forgotten, PINGs while it lasts, and a closed connection dialed again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import h11
import pytest

from sim.protocols.http1 import H11Stream, exchange, respond
from sim.worker.http_callback import CallbackFailed, Trace, callback, route_of
from sim.worker.pool import KeepAlivePool
from sim.worker.quic_cache import QuicCache

POD_TARGET = "http://10-42-0-11.invocation.nvcf.svc.cluster.local:8080"
CLIENT_REQUEST = b"POST /echo HTTP/1.1\r\nhost: fn\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nhi"
SHORT = 5.0


# The pool on its own -------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def echo_server(
    answer: Callable[[int, h11.Request], bool] = lambda n, r: True,
) -> AsyncIterator[Server]:
    """A stand-in pod on loopback, plain HTTP/1.1 with keep-alive. `answer(n, request)` is asked before the
    n-th request of a connection (from 1) is answered; False: the connection is closed instead."""
    server = Server(answer)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        for writer in server.writers:
            writer.close()
        listener.close()
        await listener.wait_closed()


@dataclass
class Server:
    answer: Callable[[int, h11.Request], bool]
    port: int = 0
    connections: int = 0
    requests: list[str] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        stream, n = H11Stream(h11.SERVER, reader, writer), 0
        with contextlib.suppress(ConnectionError, h11.ProtocolError):
            while True:
                event = await stream.next_event()
                if not isinstance(event, h11.Request):
                    return
                while not isinstance(await stream.next_event(), h11.EndOfMessage):
                    pass
                n += 1
                self.requests.append(event.method.decode())
                if not self.answer(n, event):
                    writer.close()
                    return
                body = CLIENT_REQUEST if event.method == b"GET" else b""
                await respond(stream, 200, body)
                stream.next_cycle()


async def open_client(port: int) -> H11Stream:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return H11Stream(h11.CLIENT, reader, writer)


async def one_exchange(stream: H11Stream) -> None:
    assert (await exchange(stream, "GET", "/", [("host", "pod")], timeout=SHORT)).status == 200


def test_the_connection_given_back_last_is_taken_first() -> None:
    async def go() -> None:
        async with echo_server() as server:
            pool = KeepAlivePool()
            first, second = await open_client(server.port), await open_client(server.port)
            for stream in (first, second):
                await one_exchange(stream)
                pool.give("proxy", stream, "10.100.0.10")
            taken = pool.take("proxy")
            assert taken is not None and taken.stream is second and taken.ip == "10.100.0.10"
            assert pool.take("elsewhere") is None  # keyed by where the connection leads
            await one_exchange(taken.stream)  # the cycle was restarted: it takes the next request
            taken.stream.close()
            pool.close()
            assert first.writer.is_closing()  # the one still idle

    asyncio.run(go())


def test_a_connection_the_server_closed_while_idle_is_not_handed_out() -> None:
    async def go() -> None:
        async with echo_server() as server:
            pool = KeepAlivePool()
            stream = await open_client(server.port)
            await one_exchange(stream)
            pool.give("proxy", stream, "10.100.0.10")
            server.writers[0].close()
            for _ in range(100):  # until the client's loop has read the server's FIN
                if stream.reader.at_eof():
                    break
                await asyncio.sleep(0.01)
            assert stream.reader.at_eof()
            assert pool.take("proxy") is None
            assert stream.writer.is_closing()

    asyncio.run(go())


def test_a_connection_that_cannot_take_another_request_is_closed_not_kept() -> None:
    async def go() -> None:
        async with echo_server() as server:
            pool = KeepAlivePool()
            unfinished = await open_client(server.port)  # nothing exchanged: h11 is not at DONE
            pool.give("proxy", unfinished, "10.100.0.10")
            assert pool.idle_count("proxy") == 0 and unfinished.writer.is_closing()

            small = KeepAlivePool(max_idle=1)
            streams = [await open_client(server.port) for _ in range(2)]
            for stream in streams:
                await one_exchange(stream)
                small.give("proxy", stream, "10.100.0.10")
            assert small.idle_count("proxy") == 1 and streams[1].writer.is_closing()
            small.close()

    asyncio.run(go())


def test_an_idle_connection_is_closed_when_its_idle_timeout_ends() -> None:
    async def go() -> None:
        async with echo_server() as server:
            pool = KeepAlivePool(idle_timeout=0.05)
            stream = await open_client(server.port)
            await one_exchange(stream)
            pool.give("proxy", stream, "10.100.0.10")
            assert pool.idle_count("proxy") == 1
            for _ in range(200):
                if stream.writer.is_closing():
                    break
                await asyncio.sleep(0.01)
            assert stream.writer.is_closing() and pool.idle_count("proxy") == 0

    asyncio.run(go())


# A worker's callbacks through its pool ------------------------------------------------------------------
@dataclass
class FakeContext:
    """What a worker asks of its Context: every dial goes to the stand-in pod."""

    port: int
    lookups: list[str] = field(default_factory=list)
    dials: int = 0
    link_down: bool = False

    async def resolve(self, name: str) -> list[str]:
        self.lookups.append(name)
        return ["10.42.0.11"]

    async def open_tcp(
        self, ip: str, port: int, **_: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.dials += 1
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def cross_link(self, ip: str) -> None:
        if self.link_down:
            raise TimeoutError(f"connection to {ip} timed out (packets dropped on the link)")


def fake_worker(port: int) -> Any:
    return SimpleNamespace(
        ctx=FakeContext(port),
        pool=KeepAlivePool(),
        spec=SimpleNamespace(worker_utils="1.4.0"),
        sends_connect=False,
        proxy_ca_broken=False,
        dns_address="10.53.0.10:53",
        client_context=lambda: None,
    )


def work(n: int) -> dict[str, Any]:
    return {
        "targetURI": POD_TARGET,
        "requestToken": f"get-{n}",
        "responseToken": f"post-{n}",
        "requestId": f"r{n}",
    }


async def one_callback(worker: Any, n: int) -> Trace:
    trace = Trace(f"r{n}", "worker-1-0")
    await asyncio.wait_for(callback(worker, work(n), trace), SHORT)
    return trace


def test_successive_callbacks_share_one_connection_and_one_lookup() -> None:
    async def go() -> None:
        async with echo_server() as server:
            worker = fake_worker(server.port)
            first, second = await one_callback(worker, 1), await one_callback(worker, 2)
            assert first.connections == ["new", "reused"] and first.dns["answer"] == "10.42.0.11"
            assert second.connections == [
                "reused",
                "reused",
            ]  # and no lookup: the connection's answer is its own
            assert second.dns == {"name": first.dns["name"], "answer": "10.42.0.11"}
            assert worker.ctx.dials == server.connections == 1
            assert worker.ctx.lookups == ["10-42-0-11.invocation.nvcf.svc.cluster.local"]
            assert route_of(work(1)).key == "http://10-42-0-11.invocation.nvcf.svc.cluster.local:8080"
            worker.pool.close()

    asyncio.run(go())


def test_a_get_lost_on_a_reused_connection_is_sent_again_on_a_new_one() -> None:
    # The third request of the first connection is the second callback's GET: the server hangs up on it.
    async def go() -> None:
        async with echo_server(lambda n, request: n != 3) as server:
            worker = fake_worker(server.port)
            await one_callback(worker, 1)
            second = await one_callback(worker, 2)
            assert second.connections == ["reused", "new", "reused"] and second.statuses == [200, 200]
            assert server.connections == 2 and server.requests == ["GET", "POST", "GET", "GET", "POST"]
            worker.pool.close()

    asyncio.run(go())


def test_a_post_lost_on_a_reused_connection_is_not_sent_again() -> None:
    # Go's Transport does not replay a POST with a body: the callback fails, as worker-utils' would.
    async def go() -> None:
        async with echo_server(lambda n, request: request.method != b"POST") as server:
            worker = fake_worker(server.port)
            with pytest.raises(CallbackFailed) as failed:
                await one_callback(worker, 1)
            assert failed.value.stage == "post"
            url = POD_TARGET + "/v2/nvcf/worker/request-attach"
            assert failed.value.error == f'failed to send POST request: Post "{url}": EOF'
            assert failed.value.cause == "connection closed before a response"
            assert server.connections == 1 and worker.pool.idle_count(route_of(work(1)).key) == 0

    asyncio.run(go())


def test_a_link_fault_reaches_a_request_on_a_kept_alive_connection() -> None:
    async def go() -> None:
        async with echo_server() as server:
            worker = fake_worker(server.port)
            await one_callback(worker, 1)
            worker.ctx.link_down = True
            with pytest.raises(CallbackFailed) as failed:
                await one_callback(worker, 2)
            assert failed.value.stage == "get" and failed.value.error.endswith(": context canceled")
            assert "timed out" in str(failed.value.cause)
            assert worker.pool.idle_count(route_of(work(2)).key) == 0  # given up, and closed
            worker.ctx.link_down = False
            assert (await one_callback(worker, 3)).connections == ["new", "reused"]
            worker.pool.close()

    asyncio.run(go())


# The gRPC side: the worker library's QUIC connection per host (sim.worker.quic_cache) -------------------------
@dataclass
class FakeQuicConnection:
    """What the cache touches of an H3Endpoint: `closed`, PINGs, and what close_client calls."""

    pings: list[int] = field(default_factory=list)
    closed: bool = False
    _transport: None = None

    @property
    def quic(self) -> Any:
        return SimpleNamespace(send_ping=self.pings.append)

    def transmit(self) -> None:
        pass

    def abandon(self) -> None:
        self.closed = True


def test_callbacks_arriving_during_a_dial_share_it() -> None:
    async def go() -> None:
        cache, dials, gate = QuicCache(), [], asyncio.Event()

        async def dial() -> Any:
            dials.append(1)
            await gate.wait()
            return FakeQuicConnection()

        waiting = [asyncio.create_task(cache.get("10-42-0-41.wd:443", dial)) for _ in range(3)]
        await asyncio.sleep(0)  # let all three ask (a turn of the loop, not a wait for readiness)
        gate.set()
        got = await asyncio.gather(*waiting)
        assert dials == [1] and len({id(conn) for conn, _ in got}) == 1
        assert [reused for _, reused in got] == [False, False, False]  # none found it dialed
        assert (await cache.get("10-42-0-41.wd:443", dial))[1] is True
        await cache.close()
        assert got[0][0].closed

    asyncio.run(go())


def test_a_failed_dial_leaves_nothing_and_the_next_callback_dials_again() -> None:
    async def go() -> None:
        cache, attempts = QuicCache(), []

        async def dial() -> Any:
            attempts.append(1)
            if len(attempts) == 1:
                raise ConnectionError("handshake refused")
            return FakeQuicConnection()

        with pytest.raises(ConnectionError, match="handshake refused"):
            await cache.get("h:443", dial)
        _, reused = await cache.get("h:443", dial)
        assert not reused and attempts == [1, 1]
        await cache.close()

    asyncio.run(go())


def test_a_kept_connection_is_pinged_and_leaves_the_cache_when_it_closes() -> None:
    async def go() -> None:
        cache = QuicCache(keep_alive=0.01)
        conn = FakeQuicConnection()

        async def dial() -> Any:
            return conn

        await cache.get("h:443", dial)
        for _ in range(200):
            if len(conn.pings) >= 3:
                break
            await asyncio.sleep(0.01)
        assert len(conn.pings) >= 3 and len(set(conn.pings)) == len(conn.pings)
        conn.closed = True  # the proxy closed it, or its idle timeout passed
        for _ in range(200):
            if not cache._entries:
                break
            await asyncio.sleep(0.01)
        assert not cache._entries and not cache._pings
        fresh, reused = await cache.get("h:443", lambda: asyncio.sleep(0, FakeQuicConnection()))
        assert fresh is not conn and not reused
        await cache.close()

    asyncio.run(go())
