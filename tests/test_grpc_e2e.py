"""gRPC callbacks end to end on loopback: real DNS, real NATS, QUIC through the proxy's HTTP/3 front, h2 in the tunnel.

Each test builds a state folder, starts every part in this event loop (resolver, nats-server and its callout, grpc-proxy pods,
the proxy front, a worker host) and stops them all in `finally`, even when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from nats_support import nats_components
from timeouts import scaled

import sim.worker.host
from certs.profiles import (
    FRONTEND_SECRET,
    GRPC_SECRET,
    GRPC_WILDCARD,
    PUBLIC,
    STACK,
    Profile,
    frontend_profile,
    grpc_profile,
    stack_profiles,
)
from certs.store import CertStore
from dns.server import Resolver
from sim.client.grpc_client import EchoClient
from sim.model.events import EventLog, of_kind
from sim.model.netmap import NetMap
from sim.model.parts import CONTROL_CLUSTER, WorkerSpec
from sim.model.topology import ComputeSpec, Topology, build
from sim.pods.grpcproxy import GrpcProxyPod
from sim.pods.grpcproxy import run as run_pod
from sim.protocols import h3
from sim.protocols.grpc_callback import (
    INVALID_AUTH,
    INVALID_REQUEST_ID,
    MAX_ATTEMPTS,
    MISSING_AUTH,
    MISSING_REQUEST_ID,
)
from sim.proxy.access_log import AccessLog, read_access_log
from sim.proxy.h3_front import H3Front
from sim.runtime.component import Context
from sim.wire import DNS_PORT, PROXY_H3_PORT
from sim.worker.grpc_callback import handle_work
from sim.worker.nats_links import WorkerLinks
from sim.worker.runtime import WorkerRuntime

DOMAIN = "grpc-worker.example.com"
COMPUTE = "ncpsim-compute-1"
TEST_TIMEOUT = scaled(20.0)  # a test's hang bound, stretched by the load measured at the session's start
# Loaded runs hung a test here past pytest-timeout (120 s): a worker's pull loop had swallowed its
# cancellation (nats-py catches it while sending a command) and went on to its next pull, which the
# teardown then waited out; sim.worker.nats_links.cancel_all now cancels again. Should a stack's start or
# teardown hang again, the tasks' stacks say which await it is.
TASK_DUMP_AFTER = 60.0
EVENT_TIMEOUT = 10.0  # seconds a component may take to record an event once its client has the answer


class Watch:
    """Every event the stack emits, with a way to await one (no polling, no sleeps)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    def attach(self, log: EventLog) -> None:
        emit = log.emit

        def watched(kind: str, **fields: Any) -> dict[str, Any]:
            event = emit(kind, **fields)
            self.events.append(event)
            self._changed.set()
            return event

        log.emit = watched  # type: ignore[method-assign]

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return of_kind(self.events, kind, **match)

    async def wait(
        self, kind: str, count: int = 1, timeout: float = EVENT_TIMEOUT, **match: Any
    ) -> list[dict[str, Any]]:
        """At least `count` events of `kind` matching `match`, once they have all been emitted."""
        try:
            async with asyncio.timeout(timeout):
                while len(found := self.of(kind, **match)) < count:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"{len(self.of(kind, **match))} of {count} {kind} events matching {match} after {timeout} s"
            ) from None
        return found


@dataclass
class Stack:
    state: Path
    topology: Topology
    watch: Watch
    host: Context  # the compute cluster's worker host
    pods: dict[str, GrpcProxyPod] = field(default_factory=dict)
    bindings: dict[str, int] = field(default_factory=dict)
    work: list[dict[str, Any]] = field(default_factory=list)  # every work message the worker host got
    workers: list[WorkerRuntime] = field(default_factory=list)  # their QUIC connections close at the end

    def client_addr(self, pod: str) -> tuple[str, int]:
        return "127.0.0.1", self.bindings[f"{self.pods[pod].pod.ip}:10081/tcp"]

    @property
    def proxy_addr(self) -> tuple[str, int]:
        return "127.0.0.1", self.bindings[f"{self.topology.proxy_lb_ip}:{PROXY_H3_PORT}/udp"]

    def access_log(self) -> list[dict[str, str]]:
        return read_access_log(self.state / "logs" / "worker-callback-proxy.access.log")

    def worker(self, trust: str = "stack", pem: str = "") -> WorkerRuntime:
        """A worker pod of its own (a fresh connection cache): each call is a newly deployed worker."""
        self.workers.append(WorkerRuntime(WorkerSpec("worker-x", COMPUTE, "1.4.0", trust), self.host, pem))
        return self.workers[-1]

    async def close_workers(self) -> None:
        for worker in self.workers:
            if worker.quic is not None:
                await worker.quic.close()
                worker.quic = None

    def stack_ca(self) -> str:
        return self.host.ca_path("stack").read_text()


def make_state(
    tmp_path: Path,
    *,
    proxy: bool = True,
    grpc_identities: tuple[str, ...] | None = None,
    workers: tuple[WorkerSpec, ...] = (WorkerSpec("worker-1-0", ""),),
) -> Topology:
    values = {
        "workerCallbackProxy": {"enabled": proxy, "workerDomain": DOMAIN},
        "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}},
        # One NATS server, as the catalogue's scenarios that are not about the NATS cluster have: three wait
        # for JetStream's first meta leader (half a second, or a split vote's 4-9 s election timeout).
        "nats": {"config": {"cluster": {"enabled": False}}},
    }
    compute = (ComputeSpec(workers=workers),) if proxy else ()
    topology = build(
        "t",
        values,
        invocation_replicas=0,
        grpc_replicas=2,
        compute=compute,
        control_workers=() if proxy else workers,
        seed=7,
    )
    store = CertStore(tmp_path / "certs")
    store.ensure_cas()
    # Applied as a backend applies values: `@stack-ca` becomes the CA's PEM text before any pod reads it.
    topology = topology.with_ca_pem(lambda issuer: store.ca_path(issuer).read_text())
    (tmp_path / "topology.json").write_text(topology.to_json())
    store.issue_all(stack_profiles(DOMAIN))
    if grpc_identities:  # a pod certificate for the wrong name, still from the stack CA
        store.issue(Profile(GRPC_SECRET, grpc_identities, STACK))
    return topology


async def _host_workers(stack: Stack) -> None:
    """A worker host as small as possible: each work message goes to sim.worker.grpc_callback.handle_work."""
    workers = {w.name: WorkerRuntime(w, stack.host, stack.stack_ca()) for w in stack.topology.workers}
    stack.workers += workers.values()

    async def record_and_handle(worker: WorkerRuntime, work: dict[str, Any]) -> None:
        stack.work.append(work)
        if work.get("kind") == "grpc":
            await handle_work(worker, work)

    links = WorkerLinks(stack.host, workers, record_and_handle)
    try:
        await links.start()
        await asyncio.Event().wait()
    finally:
        await links.close()


@contextlib.asynccontextmanager
async def running(tmp_path: Path, topology: Topology, host_kind: str = "test") -> AsyncIterator[Stack]:
    watch = Watch()
    host_cluster = topology.workers[0].cluster
    host = Context(tmp_path, topology, host_cluster, host_cluster)
    stack = Stack(tmp_path, topology, watch, host)
    contexts = [host]
    resolver = Resolver(topology.dns_views())
    nats_parts = nats_components(tmp_path, topology)
    access_log = AccessLog(tmp_path / "logs" / "worker-callback-proxy.access.log")
    front: H3Front | None = None
    worker_task: asyncio.Task | None = None
    try:
        await resolver.start()
        for cluster in topology.clusters:
            stack.bindings[f"{cluster.dns_ip}:{DNS_PORT}/udp"] = resolver.ports[cluster.name]
        stack.bindings.update(await nats_parts.__aenter__())
        for pod in topology.pods_of("grpc-proxy"):
            ctx = Context(tmp_path, topology, pod.name, CONTROL_CLUSTER)
            contexts.append(ctx)
            stack.pods[pod.name] = GrpcProxyPod(ctx, pod)
            stack.bindings.update(await stack.pods[pod.name].start())
        proxy_ctx = Context(tmp_path, topology, "worker-callback-proxy", CONTROL_CLUSTER)
        contexts.append(proxy_ctx)
        front = H3Front(proxy_ctx, access_log)
        stack.bindings[f"{topology.proxy_lb_ip}:{PROXY_H3_PORT}/udp"] = await front.start()
        reach = {c.name: topology.reachable_ranges(c.name) for c in topology.clusters}
        NetMap(stack.bindings, reach).save(tmp_path / "netmap.json")
        for ctx in contexts:
            watch.attach(ctx.events)
        if host_kind == "sim.worker.host":  # the real worker host process's main, run in this loop
            worker_task = asyncio.create_task(
                sim.worker.host.run(host, lambda bindings: None), name="worker-host"
            )
        else:
            worker_task = asyncio.create_task(_host_workers(stack), name="test-worker-host")
        yield stack
    finally:
        if worker_task is not None:
            worker_task.cancel()
            await asyncio.gather(worker_task, return_exceptions=True)
        await stack.close_workers()
        for pod in stack.pods.values():
            await pod.close()
        if front is not None:
            await front.close()
        await nats_parts.__aexit__(None, None, None)
        await resolver.close()
        access_log.close()
        for ctx in contexts:
            ctx.events.close()


async def assert_no_tasks_left() -> None:
    # Connection handlers see their peers' EOF within a few loop turns; anything still running is a leak.
    others = asyncio.all_tasks() - {asyncio.current_task()}
    _, leaked = await asyncio.wait(others, timeout=2.0) if others else (set(), set())
    assert not leaked, f"tasks left running: {leaked}"


def _dump_tasks() -> None:
    """Every task's stack on stderr (pytest shows it with the failure): pytest-timeout's dump shows only
    threads, and a stuck await in a stack's start or teardown is a task's."""
    print(f"-- asyncio tasks still running after {TASK_DUMP_AFTER} s --", file=sys.stderr)
    for task in asyncio.all_tasks():
        try:
            task.print_stack(file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - a compiled coroutine's frame has no line: name the task
            print(f"{task!r} (no stack: {exc!r})", file=sys.stderr)


def run_stack(tmp_path: Path, body: Callable[[Stack], Any], host_kind: str = "test", **state: Any) -> None:
    topology = make_state(tmp_path, **state)

    async def main() -> None:
        watchdog = asyncio.get_running_loop().call_later(TASK_DUMP_AFTER, _dump_tasks)
        try:
            async with running(tmp_path, topology, host_kind) as stack:
                await asyncio.wait_for(body(stack), TEST_TIMEOUT)
            await assert_no_tasks_left()
        finally:
            watchdog.cancel()

    asyncio.run(main())


async def raw_callback(stack: Stack, sni: str, headers: dict[str, str]) -> tuple[int, str]:
    """One POST /v1/proxy to the proxy front, as a worker would send it, trusting the stack CA."""
    config = h3.client_configuration(sni, h3.trust_pem([stack.host.ca_path("stack")]))
    endpoint = await h3.connect(stack.proxy_addr, config, timeout=5)
    try:
        head = {":method": "POST", ":scheme": "https", ":authority": sni, ":path": "/v1/proxy", **headers}
        stream = endpoint.open_request([(k.encode(), v.encode()) for k, v in head.items()])
        await stream.headers
        body = b""
        while chunk := await stream.read():
            body += chunk
        stream.end()
        return stream.status, body.decode()
    finally:
        h3.close_client(endpoint)


def pod_sni(stack: Stack, pod: str) -> str:
    return f"{stack.pods[pod].pod.ip.replace('.', '-')}.{DOMAIN}"


# -- passing paths ------------------------------------------------------------------------------
@pytest.mark.parametrize("host_kind", ["test", "sim.worker.host"])
def test_unary_and_stream_reach_the_minting_pod(tmp_path: Path, host_kind: str) -> None:
    async def body(stack: Stack) -> None:
        for name in stack.pods:
            async with EchoClient(stack.client_addr(name)) as echo:
                assert await echo.unary(b"hello " + name.encode()) == b"hello " + name.encode()
                replies = await echo.stream("tick", 5)
                assert [json.loads(r) for r in replies] == [{"seq": i, "text": "tick"} for i in range(5)]
        done = await stack.watch.wait("grpc.call.done", 4)
        assert all(e["ok"] for e in done) and sorted(e["messages"] for e in done) == [1, 1, 5, 5]
        results = await stack.watch.wait("worker.callback.result", 4)
        assert all(r["status"] == 200 and r["error"] is None and r["calls"] == 1 for r in results)
        # The compute cluster's DNS sends every <dashed-pod-ip>.<workerDomain> to the proxy's LB address.
        lookups = {(e["name"], tuple(e["answer"])) for e in stack.watch.of("worker.dns")}
        assert lookups == {(pod_sni(stack, name), (stack.topology.proxy_lb_ip,)) for name in stack.pods}
        await stack.watch.wait("proxy.h3.stream", 4)  # the proxy logs a stream once both sides ended
        log = {line["request_id"]: line for line in stack.access_log()}
        for minted in stack.watch.of("grpc.token.minted"):
            pod = stack.pods[minted["pod"]].pod
            line = log[minted["requestId"]]
            assert (line["status"], line["flags"], line["protocol"]) == ("200", "-", "HTTP/3")
            assert line["upstream_host"] == f"{pod.ip}:10084"
            assert line["authority"] == f"{pod.ip.replace('.', '-')}.{DOMAIN}"
            assert stack.watch.of("grpc.callback.accepted", requestId=minted["requestId"], pod=pod.name)

    run_stack(tmp_path, body, host_kind)


# -- negative controls ---------------------------------------------------------------------------
def test_reused_token_gets_403(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        assert await unary_once(stack, "grpc-proxy-0") == b"once"
        await stack.watch.wait("worker.callback.result", 1)
        replay = stack.worker(pem=stack.stack_ca())
        await handle_work(replay, stack.work[0])
        result = stack.watch.of("worker.callback.result", worker="worker-x")[0]
        assert (result["status"], result["attempts"]) == (403, 1)  # never retried after 403
        assert INVALID_AUTH in result["error"]
        rejected = stack.watch.of("grpc.callback.rejected")
        assert [(r["status"], r["reason"]) for r in rejected] == [(403, INVALID_AUTH)]

    run_stack(tmp_path, body)


async def unary_once(stack: Stack, pod: str) -> bytes:
    async with EchoClient(stack.client_addr(pod)) as echo:
        return await echo.unary(b"once")


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({"x-request-id": "3b241101-e2bb-4255-8caf-4136c566a962"}, 401, MISSING_AUTH),
        ({"authorization": "Bearer " + "a" * 64}, 400, MISSING_REQUEST_ID),
        ({"authorization": "Bearer " + "a" * 64, "x-request-id": "not-a-uuid"}, 400, INVALID_REQUEST_ID),
        (
            {"authorization": "Bearer " + "a" * 64, "x-request-id": "3b241101-e2bb-4255-8caf-4136c566a962"},
            403,
            INVALID_AUTH,
        ),
    ],
)
def test_callback_rejections_through_the_proxy(
    tmp_path: Path, headers: dict, status: int, message: str
) -> None:
    async def body(stack: Stack) -> None:
        got = await raw_callback(stack, pod_sni(stack, "grpc-proxy-1"), headers)
        assert got == (status, message + "\n")
        await stack.watch.wait("proxy.h3.stream")
        [line] = stack.access_log()
        assert (int(line["status"]), line["flags"]) == (status, "-")
        assert line["upstream_host"] == f"{stack.pods['grpc-proxy-1'].pod.ip}:10084"

    run_stack(tmp_path, body)


def synthetic_work(stack: Stack, pod: str) -> dict[str, str]:
    from sim.protocols.grpc_callback import work_message

    return work_message("3b241101-e2bb-4255-8caf-4136c566a962", "t" * 64, stack.pods[pod].url, pod)


def test_worker_without_the_stack_ca_fails_the_handshake(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        await handle_work(stack.worker(trust="system"), synthetic_work(stack, "grpc-proxy-0"))
        [result] = stack.watch.of("worker.callback.result")
        assert result["status"] is None and result["attempts"] == MAX_ATTEMPTS
        assert result["error"] == (  # quic-go's words, as the worker library logs them
            "CRYPTO_ERROR 0x12a (local): tls: failed to verify certificate: "
            "x509: certificate signed by unknown authority"
        )
        assert result["cause"].startswith("TLS handshake failed: certificate verify failed")
        assert stack.access_log() == []  # the worker never got as far as a request
        # Control: the same worker given NVCF_PROXY_CA_PEM gets through to the pod (403: a made-up token).
        await handle_work(
            stack.worker(trust="system", pem=stack.stack_ca()), synthetic_work(stack, "grpc-proxy-0")
        )
        assert stack.watch.of("worker.callback.result")[1]["status"] == 403

    run_stack(tmp_path, body)


def test_wrong_pod_certificate_gives_503_uf(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        await handle_work(stack.worker(pem=stack.stack_ca()), synthetic_work(stack, "grpc-proxy-0"))
        [result] = stack.watch.of("worker.callback.result")
        assert (result["status"], result["attempts"]) == (503, MAX_ATTEMPTS)
        streams = await stack.watch.wait("proxy.h3.stream", MAX_ATTEMPTS)  # logged once both sides ended
        lines = stack.access_log()
        assert len(lines) == MAX_ATTEMPTS and {(x["status"], x["flags"]) for x in lines} == {("503", "UF")}
        assert all("CERTIFICATE_VERIFY_FAILED" in s["details"] for s in streams)
        assert not stack.watch.of("grpc.callback.rejected")  # the pod never saw a request
        # Reissue the right certificate: the pod picks it up for new sessions, without a restart.
        CertStore(stack.state / "certs").issue(grpc_profile())
        await handle_work(stack.worker(pem=stack.stack_ca()), synthetic_work(stack, "grpc-proxy-0"))
        assert stack.watch.of("worker.callback.result")[1]["status"] == 403  # reached the pod: made-up token

    run_stack(tmp_path, body, grpc_identities=("*.wrong.example",))


OWN_NAMES = (
    "10-42-0-41.grpc-headless.nvcf.svc.cluster.local",
    "10-42-0-42.grpc-headless.nvcf.svc.cluster.local",
)


@pytest.mark.parametrize(
    ("identities", "status"),
    [(OWN_NAMES, 503), ((*OWN_NAMES, GRPC_WILDCARD), 403)],
    ids=["own-names-refused", "negative-control-fixed-name"],
)
def test_a_pod_certificate_for_the_pods_own_name_is_refused(
    tmp_path: Path, identities: tuple[str, ...], status: int
) -> None:
    """The seed's rule, as the rendered Envoy config checks it (an exact `*.grpc-headless...` SAN matcher):
    a grpc-proxy pod certificate for the pod's own name is 503 UF, though a hostname check of the pod name
    would take it; the same certificate with the fixed name on it reaches the pod (403: a made-up token)."""

    async def body(stack: Stack) -> None:
        await handle_work(stack.worker(pem=stack.stack_ca()), synthetic_work(stack, "grpc-proxy-0"))
        [result] = stack.watch.of("worker.callback.result")
        assert result["status"] == status
        if status == 503:
            streams = await stack.watch.wait("proxy.h3.stream", MAX_ATTEMPTS)
            assert {x["flags"] for x in stack.access_log()} == {"UF"}
            assert all("SAN matcher" in s["details"] for s in streams)
            assert result["error"].startswith(
                "unexpected status 503 from CONNECT proxy: upstream connect error"
            )
            assert not stack.watch.of("grpc.callback.rejected")  # the pod never saw a request

    run_stack(tmp_path, body, grpc_identities=identities)


def test_sni_naming_no_pod_is_refused(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        auth = {"authorization": "Bearer " + "a" * 64, "x-request-id": "3b241101-e2bb-4255-8caf-4136c566a962"}
        assert (await raw_callback(stack, f"10-42-0-99.{DOMAIN}", auth))[0] == 503
        assert (await raw_callback(stack, f"invocation.{DOMAIN}", auth))[0] == 404
        with pytest.raises(h3.HandshakeFailed) as refused:
            await raw_callback(stack, "10-42-0-41.elsewhere.example.org", auth)
        assert "no filter chain" in refused.value.reason
        await stack.watch.wait("proxy.h3.stream", 2)  # each stream is logged once both sides ended
        await stack.watch.wait("proxy.h3.refused", authority="10-42-0-41.elsewhere.example.org")
        lines = stack.access_log()
        assert [(x["status"], x["flags"]) for x in lines] == [("503", "DF"), ("404", "NR"), ("0", "NR")]
        assert not stack.watch.of("grpc.callback.rejected")  # nothing reached a pod

    run_stack(tmp_path, body)


def test_direct_callbacks_without_the_proxy(tmp_path: Path) -> None:
    """Single cluster, proxy off: the worker calls the pod's own name on UDP 10084, no access-log line."""

    async def body(stack: Stack) -> None:
        async with EchoClient(stack.client_addr("grpc-proxy-1")) as echo:
            assert await echo.unary(b"direct") == b"direct"
        [result] = await stack.watch.wait("worker.callback.result")
        assert result["status"] == 200
        [dns] = stack.watch.of("worker.dns")
        assert dns["name"].endswith(".grpc-headless.nvcf.svc.cluster.local")
        assert stack.access_log() == []

    run_stack(tmp_path, body, proxy=False)


def test_client_sees_unavailable_when_the_pod_cannot_publish(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        NetMap(
            {k: v for k, v in stack.bindings.items() if "/tcp" not in k or ":10081/" in k},
            {c.name: stack.topology.reachable_ranges(c.name) for c in stack.topology.clusters},
        ).save(stack.state / "netmap.json")
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await unary_once(stack, "grpc-proxy-0")
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        [done] = await stack.watch.wait("grpc.call.done")  # the pod records the call after answering it
        assert not done["ok"] and "NATS unreachable" in done["error"]

    run_stack(tmp_path, body)


def test_frontend_certificate_is_reloaded_for_new_connections(tmp_path: Path) -> None:
    """A worker with only system roots fails until the frontend Secret holds a public-style certificate."""

    async def body(stack: Stack) -> None:
        config = h3.client_configuration(
            pod_sni(stack, "grpc-proxy-0"), h3.trust_pem([stack.host.ca_path(PUBLIC)])
        )
        with pytest.raises(h3.HandshakeFailed):
            await h3.connect(stack.proxy_addr, config, timeout=5)
        CertStore(stack.state / "certs").issue(frontend_profile(DOMAIN, PUBLIC, secret=FRONTEND_SECRET))
        h3.close_client(await h3.connect(stack.proxy_addr, config, timeout=5))

    run_stack(tmp_path, body)


def test_pod_runner_binds_reports_and_stops(tmp_path: Path) -> None:
    topology = make_state(tmp_path)

    async def main() -> None:
        ctx = Context(tmp_path, topology, "grpc-proxy-1", CONTROL_CLUSTER)
        ready: asyncio.Future[dict[str, int]] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(run_pod(ctx, ready.set_result), name="grpc-proxy-1")
        try:
            bindings = await asyncio.wait_for(ready, 5)
            assert set(bindings) == {"10.42.0.42:10084/udp", "10.42.0.42:10081/tcp"}
            # Nothing is mapped yet, so NATS is unreachable: the client hears UNAVAILABLE at once.
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                async with EchoClient(("127.0.0.1", bindings["10.42.0.42:10081/tcp"])) as echo:
                    await echo.unary(b"x", timeout=5)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            ctx.events.close()
        assert task.cancelled()
        await assert_no_tasks_left()

    asyncio.run(main())


def test_large_messages_cross_every_window(tmp_path: Path) -> None:
    """512 KiB each way: more than the h2 windows and the QUIC stream credit, so every flow control must work."""
    payload = bytes(range(256)) * 2048

    async def body(stack: Stack) -> None:
        async with EchoClient(stack.client_addr("grpc-proxy-0")) as echo:
            # what is tested is flow control, not speed: 1 MiB through Python QUIC on a busy machine
            assert await echo.unary(payload, timeout=TEST_TIMEOUT - 2) == payload
        [line] = await stack.watch.wait("proxy.h3.stream")
        assert line["status"] == 200 and line["flags"] == "-"

    run_stack(tmp_path, body)


def test_bench_measures_both_paths_side_by_side(tmp_path: Path) -> None:
    from bench.grpc_path import measure

    async def body(stack: Stack) -> None:
        report = await measure(stack.state, calls=4, concurrency=2)
        assert set(report) >= {"unary", "callbacks_direct", "callbacks_via_proxy"}
        assert all(
            report[k]["calls"] == 4 and report[k]["per_second"] > 0
            for k in ("unary", "callbacks_direct", "callbacks_via_proxy")
        )
        rejected = stack.watch.of("grpc.callback.rejected")
        assert len(rejected) == 8 and {r["status"] for r in rejected} == {403}

    run_stack(tmp_path, body)


def test_pod_gone_gives_503_uf_at_once(tmp_path: Path) -> None:
    """Nothing listens on the pod's UDP port any more: the proxy answers 503 UF without waiting out a timeout."""

    async def body(stack: Stack) -> None:
        stack.pods["grpc-proxy-1"].h3.close()
        auth = {"authorization": "Bearer " + "a" * 64, "x-request-id": "3b241101-e2bb-4255-8caf-4136c566a962"}
        status, text = await asyncio.wait_for(raw_callback(stack, pod_sni(stack, "grpc-proxy-1"), auth), 2)
        assert status == 503 and "connection failure" in text
        [event] = await stack.watch.wait("proxy.h3.stream")
        assert event["flags"] == "UF" and "refused" in event["details"]

    run_stack(tmp_path, body)


def test_worker_connections_share_the_proxy_session_to_a_pod(tmp_path: Path) -> None:
    """Envoy pools upstream connections per host of a cluster, not per downstream connection: three
    callbacks, each on a worker connection of its own, reach the pod over one QUIC session that outlives
    them."""

    async def body(stack: Stack) -> None:
        pod = stack.pods["grpc-proxy-0"].h3
        assert pod is not None
        accepted: list[Any] = []
        make_endpoint = pod.make_endpoint
        pod.make_endpoint = lambda quic: accepted.append(quic) or make_endpoint(quic)  # counts sessions
        for done in range(1, 4):
            assert await unary_once(stack, "grpc-proxy-0") == b"once"
            await stack.watch.wait("worker.callback.result", done)
            await stack.close_workers()  # the worker's cached connection goes: the next callback dials anew
        results = stack.watch.of("worker.callback.result")
        assert [r["status"] for r in results] == [200, 200, 200]
        assert [r["connections"] for r in results] == [["new"]] * 3
        assert len(accepted) == 1, f"{len(accepted)} sessions from the proxy to the pod"
        assert len(pod.endpoints) == 1, "the proxy's session outlives the worker connections"

    run_stack(tmp_path, body)


def test_a_pooled_session_to_a_killed_pod_fails_at_once(tmp_path: Path) -> None:
    """The pod dies without a CONNECTION_CLOSE (SIGKILL): the next stream on the pooled session meets the
    closed port and gets 503 at once, not after the session's idle timeout; the one after dials anew."""

    async def body(stack: Stack) -> None:
        assert await unary_once(stack, "grpc-proxy-1") == b"once"
        await stack.watch.wait("worker.callback.result", 1)
        pod = stack.pods["grpc-proxy-1"].h3
        assert pod is not None and pod._transport is not None
        for session in pod.endpoints:  # a killed process sends nothing more, CONNECTION_CLOSE included
            session.transmit = lambda: None  # type: ignore[method-assign]
        pod._transport.close()  # and its port closes
        auth = {"authorization": "Bearer " + "a" * 64, "x-request-id": "3b241101-e2bb-4255-8caf-4136c566a962"}
        for _ in range(2):
            status, _ = await asyncio.wait_for(raw_callback(stack, pod_sni(stack, "grpc-proxy-1"), auth), 2)
            assert status == 503
        streams = await stack.watch.wait("proxy.h3.stream", 3)
        # UC when the stream went out on the pooled session first; UF when the session had already met the
        # closed port (an acknowledgement sent after the kill) and the proxy dialed anew.
        first, second = (e["flags"] for e in streams[1:])
        assert first in ("UC", "UF") and second == "UF", streams

    run_stack(tmp_path, body)


def test_a_workers_callbacks_to_a_pod_share_one_quic_connection(tmp_path: Path) -> None:
    """The worker library caches one QUIC connection per host: the first callback to a pod dials (a DNS
    lookup, a handshake), the next ones open a stream on it; another pod's name is another host."""

    async def body(stack: Stack) -> None:
        for done, pod in enumerate(["grpc-proxy-0", "grpc-proxy-0", "grpc-proxy-0", "grpc-proxy-1"], start=1):
            assert await unary_once(stack, pod) == b"once"
            await stack.watch.wait("worker.callback.result", done)
        results = stack.watch.of("worker.callback.result")
        assert [r["connections"] for r in results] == [["new"], ["reused"], ["reused"], ["new"]]
        assert [r["dns"] for r in results[1:3]] == [{}, {}]  # nothing looked up on a kept connection
        assert len(stack.watch.of("worker.dns")) == 2
        (worker,) = [w for w in stack.workers if w.quic is not None]
        assert worker.quic is not None and len(worker.quic._entries) == 2

    run_stack(tmp_path, body)


def test_a_cached_connection_the_proxy_closed_is_dialed_again(tmp_path: Path) -> None:
    async def body(stack: Stack) -> None:
        assert await unary_once(stack, "grpc-proxy-0") == b"once"
        await stack.watch.wait("worker.callback.result", 1)
        (worker,) = [w for w in stack.workers if w.quic is not None]
        assert worker.quic is not None
        (entry,) = worker.quic._entries.values()
        endpoint = entry.result()
        endpoint.abandon(reason="closed by the test")  # as a CONNECTION_CLOSE from the proxy ends it
        assert await unary_once(stack, "grpc-proxy-0") == b"once"
        second = (await stack.watch.wait("worker.callback.result", 2))[1]
        assert second["connections"] == ["new"] and second["status"] == 200

    run_stack(tmp_path, body)
