"""The stand-in image's entrypoint (clusters.k3d.pod) and its relays, exercised on loopback: the
Topology as one pod sees it, events on stdout, the cluster network instead of the network map, and
a component's loopback listeners published on its real port numbers (TCP and UDP)."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from clusters.k3d import pod as entry
from clusters.k3d.relay import parse_binding, publish
from clusters.render.nats import one_server
from scenarios.load import load_scenario
from sim.nats.client import connect_once
from sim.nats.publisher import WorkPublisher
from sim.nats.server import NatsServer
from sim.nats.stack import REGION, StackKeys, server_config
from sim.nats.workqueue import WorkPuller, ensure_stream

TOPOLOGY, _ = one_server(load_scenario("http-callback").build_topology("default"))  # k3d runs one nats-server
SHORT = 5.0
READY_TIMEOUT = 5.0  # seconds for the pod entry point to report component.ready
POLL_INTERVAL = 0.01  # how often the test re-reads the captured stdout while it waits


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_localize_gives_an_invocation_pod_its_real_name_and_ip() -> None:
    local = entry.localize(
        TOPOLOGY, "invocation", "invocation-service-7d9f8-x", "10.42.3.7", "ncpsim-cp", None
    )
    assert [(p.name, p.role, p.ip) for p in local.pods] == [
        ("invocation-service-7d9f8-x", "invocation", "10.42.3.7")
    ]
    assert local.pods[0].fqdn == "10-42-3-7.invocation.nvcf.svc.cluster.local"
    assert local.workers == TOPOLOGY.workers


def test_localize_keeps_one_worker_and_takes_the_ca_from_its_environment() -> None:
    local = entry.localize(TOPOLOGY, "workers", "worker-1-1", "10.52.0.9", "ncpsim-compute-1", "PEM")
    assert [w.name for w in local.workers] == ["worker-1-1"]
    assert local.values["global"]["nvcaOperator"]["agent"]["workerCallbackCaPem"] == "PEM"
    older = entry.localize(TOPOLOGY, "workers", "worker-1-1", "10.52.0.9", "ncpsim-compute-1", None)
    assert (
        older.values["global"]["nvcaOperator"]["agent"]["workerCallbackCaPem"] == ""
    )  # created before the change
    assert (
        TOPOLOGY.values["global"]["nvcaOperator"]["agent"]["workerCallbackCaPem"] == "@stack-ca"
    )  # untouched
    with pytest.raises(SystemExit):
        entry.localize(TOPOLOGY, "workers", "worker-9", "10.52.0.9", "ncpsim-compute-1", None)


def test_events_go_to_stdout_as_json_lines() -> None:
    stream = io.StringIO()
    events = entry.StdoutEvents("worker-1-0", stream)
    events.emit("worker.callback.start", requestId="r1")
    line = json.loads(stream.getvalue())
    assert (
        line["kind"] == "worker.callback.start"
        and line["component"] == "worker-1-0"
        and line["requestId"] == "r1"
    )
    with pytest.raises(ValueError):
        events.emit("x", kind="y")


def test_cluster_dns_comes_from_resolv_conf(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "search nvcf.svc.cluster.local svc.cluster.local\nnameserver 10.53.0.10\noptions ndots:5\n"
    )
    assert entry.nameserver(conf) == "10.53.0.10"
    assert entry.host_port("work-bus.nvcf.svc.cluster.local:4222") == (
        "work-bus.nvcf.svc.cluster.local",
        4222,
    )


def test_parse_binding() -> None:
    assert parse_binding("10.42.0.11:8443/tcp") == (8443, "tcp")
    assert parse_binding("10.42.0.41:10084/udp") == (10084, "udp")


async def _tcp_echo() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


class _UdpEcho(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.transport.sendto(data.upper(), addr)  # type: ignore[attr-defined]


def test_relays_publish_tcp_and_udp_listeners_on_their_real_ports() -> None:
    async def scenario() -> tuple[bytes, list[bytes]]:
        loop = asyncio.get_running_loop()
        server = await _tcp_echo()
        udp, _ = await loop.create_datagram_endpoint(_UdpEcho, local_addr=("127.0.0.1", 0))
        tcp_port, udp_port = free_port(), free_port(socket.SOCK_DGRAM)
        bindings = {
            f"10.42.0.11:{tcp_port}/tcp": server.sockets[0].getsockname()[1],
            f"10.42.0.11:{udp_port}/udp": udp.get_extra_info("sockname")[1],
        }
        published = await publish(bindings, host="127.0.0.1")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", tcp_port)
            writer.write(b"hello")
            await writer.drain()
            tcp_answer = await asyncio.wait_for(reader.read(100), SHORT)
            writer.close()
            answers: asyncio.Queue[bytes] = asyncio.Queue()

            class Client(asyncio.DatagramProtocol):
                def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
                    answers.put_nowait(data)

            client, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", udp_port))
            for text in (b"one", b"two"):  # the second rides the peer's existing upstream socket
                client.sendto(text)
            udp_answers = [await asyncio.wait_for(answers.get(), SHORT) for _ in range(2)]
            client.close()
            return tcp_answer, sorted(udp_answers)
        finally:
            published.close()
            server.close()
            udp.close()

    assert asyncio.run(scenario()) == (b"hello", [b"ONE", b"TWO"])


def test_serve_publishes_what_the_component_reports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    port = free_port()

    async def component(ctx: entry.Context, ready) -> None:
        server = await _tcp_echo()
        ready({f"10.42.0.11:{port}/tcp": server.sockets[0].getsockname()[1]})
        try:
            await asyncio.Event().wait()
        finally:
            server.close()

    async def publish_on_loopback(bindings: dict[str, int]):
        return await publish(bindings, host="127.0.0.1")

    monkeypatch.setattr(entry, "load_runner", lambda kind: component)
    monkeypatch.setattr(entry, "publish", publish_on_loopback)
    stream = io.StringIO()
    ctx = entry.KubeContext(tmp_path, TOPOLOGY, "invocation-service-x", "ncpsim-cp")
    ctx.events = entry.StdoutEvents("invocation-service-x", stream)  # type: ignore[assignment]

    async def scenario() -> bytes:
        task = asyncio.create_task(entry.serve("invocation", ctx), name="serve")
        async with asyncio.timeout(
            READY_TIMEOUT
        ):  # the ready event on stdout, as kubelet's probe waits for it
            while "component.ready" not in stream.getvalue():
                await asyncio.sleep(POLL_INTERVAL)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"through the pod port")
        await writer.drain()
        data = await asyncio.wait_for(reader.read(100), SHORT)
        writer.close()
        task.cancel()
        await task
        return data

    assert asyncio.run(scenario()) == b"through the pod port"
    kinds = [json.loads(line)["kind"] for line in stream.getvalue().splitlines()]
    assert kinds == ["component.ready", "component.stopped"]


def test_kube_context_dials_the_real_network_and_reaches_nats(tmp_path: Path) -> None:
    """A pod's publisher finds nats-server by the Service address it is given, not the network map."""
    keys = StackKeys.of(TOPOLOGY)
    server = NatsServer(server_config(keys, str(tmp_path / "js")), tmp_path / "nats", tmp_path / "nats.log")
    server.start()

    async def scenario() -> bytes:
        assert server.endpoints is not None
        ctx = entry.KubeContext(
            tmp_path,
            TOPOLOGY,
            "invocation-service-0",
            "ncpsim-cp",
            bus_address=f"127.0.0.1:{server.endpoints.port}",
        )
        assert ctx.udp_address("10.42.0.41", 10084) == ("10.42.0.41", 10084)
        # The API makes the function's stream when it is deployed (sim.pods.nats.api); the pod only publishes.
        reader = await connect_once(ctx.nats_url(), reconnect=False, nkeys_seed_str=keys.internal["nvcf-api"])
        await ensure_stream(reader.jetstream(), REGION, "http-echo")
        publisher = WorkPublisher(ctx, "invocation-service")
        await publisher.publish("http-echo", "r1", {"requestId": "r1"})
        msg = await (await WorkPuller(reader, REGION, "http-echo").start()).fetch(SHORT)
        assert msg is not None
        await reader.close()
        await publisher.close()
        return msg.data

    try:
        assert json.loads(asyncio.run(scenario())) == {"requestId": "r1"}
    finally:
        server.stop()


def test_entrypoint_names_its_kinds() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "clusters.k3d.pod", "--help"], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "{nats-callout,invocation,grpc-proxy,workers}" in result.stdout
