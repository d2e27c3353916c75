"""Faults on a running stack: what fails while the fault holds, and that it recovers afterwards."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest

from clusters.local import LocalBackend, LocalStack
from scenarios.engine import run_scenario
from scenarios.model import load_scenario
from scenarios.tail import StackTail
from sim.client.http_client import Invocation, invoke_http
from sim.model.topology import CONTROL_CLUSTER
from sim.runtime.component import Context
from sim.runtime.faults import FaultInjector, LinkFault, link_delay


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
    class Fixed(random.Random):
        def random(self) -> float:
            return draw

    assert link_delay(fault, Fixed()) == expected


def test_link_fault_matches_source_cluster_and_target_range() -> None:
    fault = LinkFault("ncpsim-compute-1", "10.100.0.10")
    assert fault.applies("ncpsim-compute-1", "10.100.0.10")
    assert not fault.applies("ncpsim-compute-2", "10.100.0.10")
    assert not fault.applies("ncpsim-compute-1", "10.100.0.11")


@pytest.fixture
def stack(tmp_path) -> Iterator[LocalStack]:
    stack = LocalStack("faults", root=tmp_path)
    try:
        assert run_scenario(
            load_scenario("http-callback"), LocalBackend(stack.root), stack.name, keep=True
        ).ok
        yield stack
    finally:
        stack.down()
        assert not stack.launcher.running()


def call(stack: LocalStack, pod_index: int = 0) -> Invocation:
    """One invocation; gives up as soon as the worker reports its callback failed."""
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
                timeout=10,
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
