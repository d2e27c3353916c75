"""Faults on a running stack: what fails while the fault holds, and that it recovers afterwards."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from clusters.local import LocalBackend, LocalStack
from scenarios.engine import run_scenario
from scenarios.faults import FaultInjector
from scenarios.load import load_scenario
from scenarios.tail import StackTail
from sim.client.http_client import Invocation, invoke_http
from sim.model.parts import CONTROL_CLUSTER
from sim.protocols.lossy import LossyTransport
from sim.runtime.component import Context
from sim.runtime.links import LinkFault, LinkState, attempt_timeout, datagram_delay, link_delay


@pytest.mark.parametrize(
    ("fault", "draw", "expected"),
    [
        (None, 0.5, (0.0, False)),
        (LinkFault("c", "10.0.0.0/8", latency_ms=200), 0.5, (0.2, False)),
        (LinkFault("c", "10.0.0.0/8", drop=0.3, timeout_ms=700), 0.1, (0.7, True)),
        (LinkFault("c", "10.0.0.0/8", latency_ms=5, drop=0.3), 0.9, (0.005, False)),
    ],
)
def test_link_delay(fault: LinkFault | None, draw: float, expected: tuple[float, bool]) -> None:
    assert link_delay(fault, Fixed(draw)) == expected


class Fixed(random.Random):
    """A draw that always comes out at `draw`."""

    def __init__(self, draw: float):
        super().__init__(0)
        self.draw = draw

    def random(self) -> float:
        return self.draw


@pytest.mark.parametrize(
    ("fault", "cluster", "ip", "protocol", "applies"),
    [
        (LinkFault("ncpsim-compute-1", "10.100.0.10"), "ncpsim-compute-1", "10.100.0.10", "tcp", True),
        (LinkFault("ncpsim-compute-1", "10.100.0.10"), "ncpsim-compute-1", "10.100.0.10", "udp", True),
        (LinkFault("ncpsim-compute-1", "10.100.0.10"), "ncpsim-compute-2", "10.100.0.10", "tcp", False),
        (LinkFault("ncpsim-compute-1", "10.100.0.10"), "ncpsim-compute-1", "10.100.0.11", "udp", False),
        (
            LinkFault("ncpsim-compute-1", "10.100.0.0/24", protocol="tcp"),
            "ncpsim-compute-1",
            "10.100.0.10",
            "tcp",
            True,
        ),
        (
            LinkFault("ncpsim-compute-1", "10.100.0.0/24", protocol="tcp"),
            "ncpsim-compute-1",
            "10.100.0.10",
            "udp",
            False,
        ),
        (
            LinkFault("ncpsim-compute-1", "10.100.0.0/24", protocol="udp"),
            "ncpsim-compute-1",
            "10.100.0.10",
            "udp",
            True,
        ),
        (
            LinkFault("ncpsim-compute-1", "10.100.0.0/24", protocol="udp"),
            "ncpsim-compute-1",
            "10.100.0.10",
            "tcp",
            False,
        ),
    ],
)
def test_link_fault_matches_source_cluster_target_range_and_protocol(
    fault: LinkFault, cluster: str, ip: str, protocol: str, applies: bool
) -> None:
    assert fault.applies(cluster, ip, protocol) is applies


def test_the_first_matching_link_fault_wins_per_protocol() -> None:
    tcp_only = LinkFault("c", "10.0.0.0/8", drop=1.0, protocol="tcp")
    udp_slow = LinkFault("c", "10.0.0.0/8", latency_ms=50, protocol="udp")
    state = LinkState([tcp_only, udp_slow])
    assert state.matching("c", "10.1.2.3", "tcp") is tcp_only
    assert state.matching("c", "10.1.2.3", "udp") is udp_slow
    assert state.matching("d", "10.1.2.3", "udp") is None


@pytest.mark.parametrize(
    ("fault", "draw", "expected"),
    [
        (None, 0.0, 0.0),
        (LinkFault("c", "10.0.0.0/8", latency_ms=200), 0.0, 0.2),
        (LinkFault("c", "10.0.0.0/8", drop=0.3, timeout_ms=700), 0.1, None),  # lost: no timeout of its own
        (LinkFault("c", "10.0.0.0/8", latency_ms=5, drop=0.3), 0.9, 0.005),
        (LinkFault("c", "10.0.0.0/8", drop=1.0), 0.999, None),
    ],
)
def test_datagram_delay(fault: LinkFault | None, draw: float, expected: float | None) -> None:
    assert datagram_delay(fault, Fixed(draw)) == expected


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (None, 5.0),
        (LinkFault("c", "10.0.0.0/8", latency_ms=200), 5.0),  # a slow link does not cut the handshake short
        (LinkFault("c", "10.0.0.0/8", drop=0.5, timeout_ms=300), 0.3),
        (LinkFault("c", "10.0.0.0/8", drop=1.0, timeout_ms=8000), 8.0),
    ],
)
def test_attempt_timeout(fault: LinkFault | None, expected: float) -> None:
    assert attempt_timeout(fault, 5.0) == expected


class Recorder(asyncio.DatagramTransport):
    """The socket under a LossyTransport: what reached it, and when."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[bytes, float]] = []
        self.closed = False

    def sendto(self, data: Any, addr: Any = None) -> None:
        self.sent.append((data, asyncio.get_running_loop().time()))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_lossy_transport_sends_holds_back_and_loses_datagrams_as_the_link_says() -> None:
    async def go() -> tuple[list[bytes], list[float], list[bytes]]:
        fates = iter([0.0, None, 0.05, 0.0])  # now, lost, 50 ms late, now
        inner = Recorder()
        link = LossyTransport(inner, lambda: next(fates))
        start = asyncio.get_running_loop().time()
        for datagram in (b"a", b"b", b"c", b"d"):
            link.sendto(datagram)
        at_once = [d for d, _ in inner.sent]
        await asyncio.sleep(0.1)  # longer than the link's 50 ms: what it held back has gone out
        return at_once, [t - start for d, t in inner.sent if d == b"c"], [d for d, _ in inner.sent]

    at_once, late, everything = asyncio.run(go())
    assert at_once == [b"a", b"d"]
    assert everything == [b"a", b"d", b"c"] and late[0] >= 0.05  # b"b" never arrives


def test_lossy_transport_close_drops_what_is_still_on_the_link() -> None:
    async def go() -> Recorder:
        inner = Recorder()
        link = LossyTransport(inner, lambda: 0.05)
        link.sendto(b"late")
        link.close()
        await asyncio.sleep(0.1)
        return inner

    inner = asyncio.run(go())
    assert inner.closed and inner.sent == []


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """One stack for the module's fault tests: each puts back what it broke (restart, start, scale back,
    renew, clear) and calls through it afterwards, so the next starts on a healthy stack."""
    stack = LocalStack("faults", root=tmp_path_factory.mktemp("faults"))
    try:
        assert run_scenario(
            load_scenario("http-callback"), LocalBackend(stack.root), stack.name, keep=True
        ).ok
        yield stack
    finally:
        stack.down()
        assert not stack.launcher.running()


def call(stack: LocalStack, pod_index: int = 0, timeout: float = 10) -> Invocation:
    """One invocation, polled up to `timeout` s; gives up as soon as the worker reports its callback failed."""
    topology = stack.topology
    tail = StackTail(stack.state_dir)

    def give_up(request_id: str) -> str | None:
        tail.refresh()
        result = tail.worker_result(request_id)
        return str(result["error"]) if result and not result.get("ok") else None

    async def go() -> Invocation:
        client = Context(stack.state_dir, topology, "test-client", CONTROL_CLUSTER)
        try:
            return await invoke_http(
                client,
                topology.pods_of("invocation")[pod_index],
                "http-echo",
                b"x",
                poll_seconds=1,
                timeout=timeout,
                give_up=give_up,
            )
        finally:
            client.events.close()

    return asyncio.run(go())


def test_kill_restart_and_scale(stack: LocalStack) -> None:
    faults = FaultInjector(stack, random.Random(1))
    assert "SIGKILL invocation-service-0" in faults.apply({"kill": "invocation-service-0"})
    assert "invocation-service-0" not in stack.launcher.running()
    assert call(stack, 0).error and call(stack, 1).status == 200  # the other replica still serves
    faults.apply({"restart": "invocation-service-0"})
    assert call(stack, 0).status == 200
    assert "scaled invocation to 0 of 2" in faults.apply({"scale": {"role": "invocation", "replicas": 0}})
    assert call(stack, 1).error
    faults.apply({"scale": {"role": "invocation", "replicas": 2}})
    assert call(stack, 0).status == 200 and call(stack, 1).status == 200


def warm_workers(stack: LocalStack, attempts: int = 40) -> None:
    """Call until every worker has called back once, so each holds a kept-alive connection to the proxy
    (JetStream hands each message to whichever worker's pull is waiting)."""
    workers = {w.name for w in stack.topology.workers}
    tail, seen = StackTail(stack.state_dir), set()
    for _ in range(attempts):
        rid = call(stack).request_id or ""
        # The worker writes its result once the pod has answered its POST, which may be after the client's 200.
        assert asyncio.run(tail.wait_for(lambda rid=rid: tail.worker_result(rid) is not None, 5.0))
        seen.add((tail.worker_result(rid) or {}).get("worker"))
        if workers <= seen:
            return
    raise AssertionError(
        f"only {sorted(map(str, seen))} of {sorted(workers)} called back in {attempts} calls"
    )


def fresh_workers(stack: LocalStack) -> None:
    """Redeploy the functions: new worker pods, so no connection kept alive from an earlier callback."""
    stack.redeploy(stack.topology, "workers")


def test_dns_stop_and_start(stack: LocalStack) -> None:
    faults = FaultInjector(stack, random.Random(1))
    warm_workers(stack)
    faults.apply({"stop": "resolver"})
    # Every worker keeps its connection to the proxy alive from its last callback: no name to look up.
    assert call(stack).status == 200
    fresh_workers(stack)
    failed = call(stack)
    assert "lookup invocation.grpc-worker.example.com on 10.53.0.10:53: " in (failed.error or "")
    faults.apply({"start": "resolver"})
    assert call(stack).status == 200


def test_link_drop_and_latency_then_heal(stack: LocalStack) -> None:
    faults = FaultInjector(stack, random.Random(1))
    faults.apply({"link": {"from": "ncpsim-compute-1", "to": "10.100.0.10", "drop": 1.0, "timeoutMs": 200}})
    assert (call(stack).error or "").endswith(": context canceled")  # worker-utils gives the GET up
    faults.apply({"clear-links": None})
    faults.apply({"link": {"from": "ncpsim-compute-1", "to": "10.100.0.10", "latencyMs": 300}})
    slow = call(stack)
    assert slow.status == 200 and slow.elapsed_ms >= 300
    faults.apply({"clear-links": None})


def test_expired_frontend_certificate_fails_then_renewal_recovers(stack: LocalStack) -> None:
    from certs.rotate import rotate
    from certs.store import CertStore

    faults = FaultInjector(stack, random.Random(1))
    warm_workers(stack)
    faults.apply({"expire": "frontend"})
    assert call(stack).status == 200  # a kept-alive connection was verified before the certificate expired
    fresh_workers(stack)
    assert "certificate has expired" in (call(stack).error or "")
    rotate(CertStore(stack.state_dir / "certs"), "frontend", "grpc-worker.example.com")
    assert call(stack).status == 200


def test_restart_the_proxy(stack: LocalStack) -> None:
    faults = FaultInjector(stack, random.Random(1))
    faults.apply({"restart": "worker-callback-proxy"})
    assert call(stack).status == 200  # workers find the proxy's new port through the network map


# -- link faults on TCP, UDP or both, end to end -------------------------------------------------------
def link_step(name: str, protocol: str | None = None, **fault: Any) -> dict[str, Any]:
    """A link fault from the compute cluster to the proxy's load-balancer address."""
    spec = {"from": "ncpsim-compute-1", "to": "10.100.0.10", **fault}
    return {"name": name, "fault": {"link": {**spec, **({"protocol": protocol} if protocol else {})}}}


def calls(function: str, outcome: str, error: str | None = None) -> dict[str, Any]:
    expect = {"outcome": outcome, **({"error": error} if error else {"via": "proxy"})}
    return {"name": f"{function} {outcome}", "invoke": {"function": function, "count": 1}, "expect": expect}


WD = "grpc-worker.example.com"
HEAL = {"name": "heal", "fault": {"clear-links": None}}
DEAD = {"drop": 1.0, "timeoutMs": 150}
LINK_PROTOCOLS = {
    "name": "link-protocols",
    "summary": "a dead link on TCP, UDP or both: HTTP callbacks ride TCP 10084, gRPC callbacks QUIC on UDP 443",
    "seed": 7,
    "values": {
        "workerCallbackProxy": {"enabled": True, "workerDomain": WD, "service": {"type": "LoadBalancer"}},
        "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}},
        "nats": {"config": {"cluster": {"enabled": False}}},  # one server: not about the NATS cluster
    },
    "topology": {
        "invocationReplicas": 1,
        "grpcProxyReplicas": 1,
        "computeClusters": [{"workers": [{"count": 1, "trust": "system"}]}],
    },
    # No QUIC connection is kept alive until the tcp phase: a dead link under one shows only after its 8 s
    # idle timeout (quic-go's, as in the field), which the latency phase shows faster.
    "steps": [
        link_step("both protocols dropped (the default, any)", **DEAD),  # 1
        calls("http-echo", "failure", "context canceled"),  # Go's words: the dial outlived its context
        calls("grpc-echo", "failure", "timeout: no recent network activity"),  # quic-go's
        HEAL,
        link_step("only UDP dropped: a TCP-only load balancer", "udp", **DEAD),  # 5
        calls("http-echo", "success"),
        calls("grpc-echo", "failure", "timeout: no recent network activity"),
        HEAL,
        # New worker pods: a request lost on a kept-alive TCP connection (tests/test_worker_pool.py) leaves
        # the replay waiting out SETTLE_TIMEOUT for a proxy line that never comes.
        {"name": "new worker pods", "redeploy": "workers"},
        link_step("only TCP dropped", "tcp", **DEAD),  # 10
        calls("http-echo", "failure", "context canceled"),
        calls("grpc-echo", "success"),  # its QUIC connection is kept alive from here on
        HEAL,
        link_step("0.6 s more on each datagram the compute cluster sends", "udp", latencyMs=600),  # 14
        calls("grpc-echo", "success"),
        HEAL,
        calls("grpc-echo", "success"),  # 17
    ],
}


def test_link_faults_reach_tcp_udp_or_both(tmp_path, ncpsim_replay) -> None:
    """A 100 % drop fails HTTP and gRPC callbacks alike; on tcp only HTTP fails, on udp only gRPC: each
    protocol's passing calls are the other one's negative control."""
    path = tmp_path / "link-protocols.yaml"
    path.write_text(yaml.safe_dump(LINK_PROTOCOLS, sort_keys=False))
    result = ncpsim_replay(path)
    assert result.ok, "\n".join(result.failures)
    # A fault written after the QUIC connection opened reaches it, datagram by datagram, as one reaches a
    # kept-alive TCP connection request by request.
    slow, fast = result.steps[14].traces[0], result.steps[16].traces[0]
    assert slow.connections == ["reused"] and slow.elapsed_ms >= 600, slow
    assert fast.connections == ["reused"] and fast.elapsed_ms < 600, fast  # the negative control
    # A failed gRPC call ends when its worker reports the failure (found by the call's tag), not at the
    # client's deadline (scenarios.grpc_calls.CALL_TIMEOUT, 10 s): six handshakes of 150 ms each.
    dead = result.steps[2].traces[0]
    assert dead.worker_stage == "connect" and dead.elapsed_ms < 5000, (
        dead
    )  # nothing came back: not a TLS refusal
