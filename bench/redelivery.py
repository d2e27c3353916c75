"""Redelivery through JetStream: invocations while workers are SIGKILLed in the middle of their callbacks.

A local stack with 8 compute clusters of 2 workers each takes `invocations` HTTP invocations (bounded
concurrency). Once a fifth of the callbacks have started, the worker hosts of 5 clusters (10 workers)
are SIGKILLed, with callbacks in flight. Their work messages were never acked, so after the consumer's
ack wait (shortened here with nats.jetstream.ackWaitSeconds) JetStream hands them to the survivors.

Each invocation ends as one of:
- answered: the client got the function's 200 and its echoed body;
- documented error: the redelivered callback was refused because the killed worker had already
  redeemed the single-use request token (401 "The provided authorization token is invalid or has
  expired"); the client stops polling on the worker's reported failure, as a person reading the logs
  would (the client would otherwise see 504 past its poll window);
- lost: neither (what must never happen).
"Twice" counts requests whose response the pod accepted more than once (it must be 0: a response token
is single-use). `python -m bench.redelivery [--invocations N]` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from clusters.local import LocalBackend
from scenarios.load import scenario_from_data
from scenarios.tail import StackTail
from sim.client.http_client import Invocation, invoke_http
from sim.model.events import ATTACH_POST, CALLBACK_RESULT, CALLBACK_START
from sim.model.parts import CONTROL_CLUSTER
from sim.runtime.component import Context

CLUSTERS, WORKERS_PER_CLUSTER, KILLED_CLUSTERS = 8, 2, 5
ACK_WAIT = 3.0  # seconds before JetStream redelivers an unacked message
CALL_TIMEOUT = 60.0  # a client's whole wait, redelivery included
KILL_TIMEOUT = 60.0  # for a fifth of the callbacks to start
TOKEN_SPENT = "invalid or has expired"


def scenario_data(ack_wait: float = ACK_WAIT) -> dict[str, Any]:
    worker = {"count": WORKERS_PER_CLUSTER, "trust": "system"}
    return {
        "name": "redelivery",
        "summary": "workers SIGKILLed mid-callback; JetStream redelivers",
        "seed": 61,
        "values": {
            "workerCallbackProxy": {
                "enabled": True,
                "workerDomain": "grpc-worker.example.com",
                "service": {"type": "LoadBalancer"},
            },
            "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}},
            "nats": {"jetstream": {"ackWaitSeconds": ack_wait}},
        },
        "topology": {
            "invocationReplicas": 2,
            "grpcProxyReplicas": 0,
            "computeClusters": [{"workers": [worker]} for _ in range(CLUSTERS)],
        },
        "steps": [{"name": "none", "invoke": {"function": "http-echo", "count": 1}}],
    }


async def _until(tail: StackTail, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition did not hold in time")
        await asyncio.sleep(0.05)  # re-read the event files; nothing to await on another process
        tail.refresh()


async def _drive(stack: Any, invocations: int, concurrency: int) -> tuple[list[Invocation], dict[str, Any]]:
    topology = stack.topology
    tail = StackTail(stack.state_dir)
    client = Context(stack.state_dir, topology, "bench-client", CONTROL_CLUSTER)
    pods = topology.pods_of("invocation")
    slots = asyncio.Semaphore(concurrency)
    give_up_tail = StackTail(stack.state_dir)

    def give_up(request_id: str) -> str | None:
        give_up_tail.refresh()
        result = give_up_tail.worker_result(request_id)
        return str(result["error"]) if result and not result.get("ok") else None

    async def one(i: int) -> Invocation:
        async with slots:
            return await invoke_http(
                client,
                pods[i % len(pods)],
                "http-echo",
                f"call {i}".encode(),
                poll_seconds=1,
                timeout=CALL_TIMEOUT,
                give_up=give_up,
            )

    started = time.monotonic()
    calls = [asyncio.create_task(one(i), name=f"invocation-{i}") for i in range(invocations)]
    try:
        await _until(
            tail,
            lambda: sum(e["kind"] == CALLBACK_START for e in tail.events) >= invocations // 5,
            KILL_TIMEOUT,
        )
        victims = [c.name for c in topology.compute_clusters[:KILLED_CLUSTERS]]
        tail.refresh()
        in_flight = _in_flight(tail.events, {w.name for w in topology.workers if w.cluster in victims})
        for name in victims:
            stack.kill(name)
        killed_at = time.monotonic() - started
        results = await asyncio.gather(*calls)
    finally:
        for call in calls:
            call.cancel()
        client.events.close()
    return results, {
        "killed_clusters": victims,
        "killed_workers": len(victims) * WORKERS_PER_CLUSTER,
        "killed_at_seconds": round(killed_at, 2),
        "callbacks_in_flight_on_killed_workers": in_flight,
        "seconds": round(time.monotonic() - started, 2),
    }


def _in_flight(events: list[dict[str, Any]], workers: set[str]) -> int:
    started = {e["requestId"] for e in events if e["kind"] == CALLBACK_START and e.get("worker") in workers}
    done = {e["requestId"] for e in events if e["kind"] == CALLBACK_RESULT and e.get("worker") in workers}
    return len(started - done)


def classify(results: list[Invocation], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Answered, documented error or lost, per invocation; and responses accepted twice (pure)."""
    accepted = Counter(
        e.get("requestId") for e in events if e["kind"] == ATTACH_POST and e.get("status") == 200
    )
    redelivered = Counter(e.get("requestId") for e in events if e["kind"] == "worker.work.redelivered")
    outcome: Counter[str] = Counter()
    lost: list[str] = []
    for i, call in enumerate(results):
        if call.status == 200 and call.body == f"call {i}".encode():
            outcome["answered"] += 1
        elif call.error and TOKEN_SPENT in call.error:
            outcome["documented_error"] += 1
        else:
            outcome["lost"] += 1
            lost.append(f"{call.request_id}: status {call.status}, {call.error}")
    return {
        "invocations": len(results),
        **{k: outcome[k] for k in ("answered", "documented_error", "lost")},
        "answered_twice": sum(1 for n in accepted.values() if n > 1),
        "redelivered_messages": len(redelivered),
        "answered_after_redelivery": sum(1 for r in redelivered if accepted[r] == 1),
        "lost_examples": lost[:5],
    }


def run(invocations: int = 1000, concurrency: int = 200, root: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ncpsim-redelivery-") as scratch:
        scenario = scenario_from_data(scenario_data(), Path("redelivery.yaml"))
        backend = LocalBackend(root or Path(scratch))
        stack = backend.up(scenario.build_topology("redelivery"), scenario.name)
        try:
            results, facts = asyncio.run(_drive(stack, invocations, concurrency))
            tail = StackTail(stack.state_dir)
            tail.refresh()
            return {**facts, **classify(results, tail.events)}
        finally:
            stack.down()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.redelivery", description=__doc__)
    parser.add_argument("--invocations", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(run(args.invocations, args.concurrency), indent=2))


if __name__ == "__main__":
    main()
