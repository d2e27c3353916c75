"""Certificate rotation while callbacks run: new handshakes use new material, no callback is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from stack_records import Records

from certs.inspect import fingerprint_sha256
from certs.profiles import FRONTEND_SECRET, INVOCATION_SECRET
from certs.rotate import KINDS, rotate
from certs.store import CertStore
from certs.volume import write_secret
from clusters.local import LocalBackend, LocalStack
from scenarios.engine import run_scenario
from scenarios.load import load_scenario
from scenarios.tail import StackTail
from sim.client.grpc_client import EchoClient
from sim.client.http_client import invoke_http
from sim.model.parts import CONTROL_CLUSTER
from sim.runtime.component import Context
from sim.wire import GRPC_CLIENT_PORT

WD = "grpc-worker.example.com"
SCENARIO = {
    "name": "rotation-load",
    "summary": "HTTP and gRPC callbacks while certificates rotate",
    "seed": 3,
    "values": {
        "workerCallbackProxy": {"enabled": True, "workerDomain": WD, "service": {"type": "LoadBalancer"}},
        "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}},
        "nats": {"config": {"cluster": {"enabled": False}}},  # one NATS server: not about the NATS cluster
    },
    "topology": {
        "invocationReplicas": 2,
        "grpcProxyReplicas": 2,
        "computeClusters": [{"workers": [{"count": 4, "trust": "system"}]}],
    },
    "steps": [
        {"invoke": {"function": "http-echo", "count": 2}, "expect": {"outcome": "success"}},
        {"invoke": {"function": "grpc-echo", "count": 2}, "expect": {"outcome": "success"}},
    ],
}


@dataclass
class LoadResult:
    sent: int = 0
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    rotations: list[str] = field(default_factory=list)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    path = tmp_path / "rotation-load.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    stack = LocalStack("rotation", root=tmp_path / "state")
    try:
        result = run_scenario(load_scenario(str(path)), LocalBackend(stack.root), stack.name, keep=True)
        assert result.ok, result.failures
        yield stack
    finally:
        stack.down()
        assert not stack.launcher.running()


def worker_failure(tail: StackTail, request_id: str) -> str | None:
    tail.refresh()
    outcome = tail.worker_result(request_id)
    return str(outcome.get("error")) if outcome and not outcome.get("ok") else None


async def one_callback(client: Context, tail: StackTail, n: int, result: LoadResult, grpc_every: int) -> None:
    """Callback `n`: every `grpc_every`-th is a gRPC call (QUIC costs more), the rest HTTP; replicas in turn."""
    role = "grpc-proxy" if n % grpc_every == 0 else "invocation"
    pods = client.topology.pods_of(role)
    pod = pods[(n // grpc_every if role == "grpc-proxy" else n) % len(pods)]
    body = f"callback {n}".encode()
    result.sent += 1
    if pod.role == "invocation":
        inv = await invoke_http(
            client,
            pod,
            "http-echo",
            body,
            poll_seconds=5,
            timeout=30,
            give_up=lambda rid: worker_failure(tail, rid),
        )
        ok, why = inv.status == 200 and inv.body == body, inv.error or f"status {inv.status}"
    else:
        host, port = client.netmap.lookup(CONTROL_CLUSTER, pod.ip, GRPC_CLIENT_PORT)
        async with EchoClient((host, port)) as echo:
            out = await echo.traced(body, timeout=15)
        ok, why = out.error is None and out.replies == [body], out.error or "wrong reply"
    if ok:
        result.ok += 1
    else:
        result.failures.append(f"{pod.name} #{n}: {why}")


async def rotate_in_background(store: CertStore, kind: str, client: Context, result: LoadResult) -> None:
    client.events.emit("rotation.start", rotation=kind)
    result.rotations.append(await asyncio.to_thread(rotate, store, kind, WD))
    client.events.emit("rotation.done", rotation=kind)


async def load_while_rotating(
    stack: LocalStack, rate: float, seconds: float, grpc_every: int = 2
) -> LoadResult:
    """Open-loop callbacks at `rate` per second for `seconds`, rotating every kind once along the way
    (in the background: the load does not pause while a rotation waits out its propagation grace)."""
    client = Context(stack.state_dir, stack.topology, "load", CONTROL_CLUSTER)
    store = CertStore(stack.state_dir / "certs")
    result = LoadResult()
    tail = StackTail(stack.state_dir)
    tasks: list[asyncio.Task] = []
    started = time.monotonic()
    schedule = {i: kind for i, kind in enumerate(KINDS, start=1)}  # rotate at 1/5, 2/5, ... of the run
    n = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate)
        while n < due:
            tasks.append(
                asyncio.create_task(one_callback(client, tail, n, result, grpc_every), name=f"callback-{n}")
            )
            n += 1
        slot = int(elapsed / seconds * (len(KINDS) + 1))
        if slot in schedule:
            kind = schedule.pop(slot)
            tasks.append(
                asyncio.create_task(rotate_in_background(store, kind, client, result), name=f"rotate-{kind}")
            )
        await asyncio.sleep(1 / rate)  # pacing the open-loop load, not waiting for readiness
    await asyncio.gather(*tasks)
    client.events.close()
    return result


def test_rotating_every_kind_under_load_loses_no_callback(stack: LocalStack) -> None:
    before = {
        name: fingerprint_sha256((stack.state_dir / "certs/secrets" / name / "tls.crt").read_bytes())
        for name in (FRONTEND_SECRET, INVOCATION_SECRET)
    }
    result = asyncio.run(load_while_rotating(stack, rate=30, seconds=3))
    assert len(result.rotations) == len(KINDS)
    assert result.failures == [] and result.ok == result.sent > 60
    after = {
        name: fingerprint_sha256((stack.state_dir / "certs/secrets" / name / "tls.crt").read_bytes())
        for name in (FRONTEND_SECRET, INVOCATION_SECRET)
    }
    assert all(before[name] != after[name] for name in before)  # the material really changed


def test_new_handshakes_use_new_material_and_broken_files_keep_the_old(stack: LocalStack) -> None:
    """The proxy serves the renewed frontend at once; a broken swap leaves the previous one in use."""
    import socket
    import ssl

    port = stack.status()["proxy"]["http"]["port"]
    ctx = ssl.create_default_context(cafile=stack.status()["ca"]["stack"])

    def served() -> str:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
            ctx.wrap_socket(sock, server_hostname=f"invocation.{WD}") as tls,
        ):
            return fingerprint_sha256(ssl.DER_cert_to_PEM_cert(tls.getpeercert(binary_form=True)))

    first = served()
    store = CertStore(stack.state_dir / "certs")
    rotate(store, "frontend", WD)
    renewed = served()
    assert renewed != first
    records = Records(stack.state_dir)
    write_secret(store.secret_dir(FRONTEND_SECRET), b"not a certificate", b"not a key", b"")
    assert served() == renewed  # broken new files: old material stays in use
    assert records.event("proxy.tls.reload_failed", component="worker-callback-proxy")


@pytest.mark.long
def test_rotation_benchmark_100_per_second_for_30_seconds(stack: LocalStack) -> None:
    """110 callbacks/s for 30 s (one in ten over gRPC/QUIC, whose path tops out near 40 calls/s here)."""
    result = asyncio.run(load_while_rotating(stack, rate=110, seconds=30, grpc_every=10))
    print(
        f"rotation benchmark: sent {result.sent}, ok {result.ok}, lost {len(result.failures)}; "
        f"rotations: {result.rotations}"
    )
    assert result.failures == []
