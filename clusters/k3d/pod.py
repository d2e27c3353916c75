"""Entry point of the stand-in image: ``python -m clusters.k3d.pod KIND`` (nats-callout, invocation,
grpc-proxy, workers), running the same component code as ``python -m sim.runtime.run`` does on the local backend.

What differs in a pod, and only that, is handled here:
- identity: the pod's real name and IP (downward API) replace the Topology's virtual ones;
- network: dialing, DNS and NATS use the cluster's real network (cluster DNS from
  /etc/resolv.conf, Services by name) instead of the local network map;
- listening: each loopback binding the component reports is published on the pod's real port;
- events: JSON lines on stdout, so `kubectl logs` carries them to the replay engine;
- NVCF_PROXY_CA_PEM: the pod's environment, as NVCA set it at creation, wins over the values.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import signal
import ssl
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from clusters.k3d.relay import Published, publish
from clusters.render.layout import (
    BUS_ADDRESS,
    ENV_BUS,
    ENV_CLUSTER,
    ENV_POD_IP,
    ENV_POD_NAME,
    ENV_PROXY_CA,
    ENV_TOPOLOGY,
    ENV_WORKER,
    POD_STATE_DIR,
    TOPOLOGY_DIR,
    TOPOLOGY_FILE,
)
from sim.model.netmap import LiveNetMap
from sim.model.parts import Pod
from sim.model.topology import Topology
from sim.protocols.dial import StreamProtocol, open_within
from sim.runtime.component import CONNECT_TIMEOUT, Context
from sim.runtime.run import load_runner
from sim.wire import DNS_PORT

KINDS = ("nats-callout", "invocation", "grpc-proxy", "workers")
POD_ROLES = {"invocation": "invocation", "grpc-proxy": "grpc-proxy"}


class StdoutEvents:
    """sim.model.events.EventLog's interface, writing to stdout (the container log) instead of a file."""

    def __init__(self, component: str, stream: TextIO | None = None):
        self.component, self.stream = component, stream or sys.stdout

    def emit(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        if "kind" in fields:
            raise ValueError("'kind' names the event type; call the field something else")
        event = {"ts": time.time(), "component": self.component, "kind": kind, **fields}
        self.stream.write(json.dumps(event, sort_keys=True, default=str) + "\n")
        self.stream.flush()
        return event

    def close(self) -> None:
        self.stream.flush()


def nameserver(resolv_conf: Path = Path("/etc/resolv.conf")) -> str:
    for line in resolv_conf.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            return parts[1]
    raise RuntimeError(f"no nameserver in {resolv_conf}")


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass
class KubeContext(Context):
    """A Context whose network is the cluster's own."""

    bus_address: str = BUS_ADDRESS

    def __post_init__(self) -> None:
        self.events = StdoutEvents(self.name)  # type: ignore[assignment]
        self.netmap = LiveNetMap(self.state_dir / "netmap.json")  # unused in a pod; kept for the type
        self.mint_seed = f"{self.topology.seed}:{self.name}"  # a restarted pod is a new pod, named anew

    def dns_server(self) -> tuple[str, int]:
        return nameserver(), DNS_PORT

    async def open_tcp(
        self,
        ip: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = CONNECT_TIMEOUT,
        protocol: StreamProtocol | None = None,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await open_within(ip, port, timeout, tls, server_hostname, protocol)

    def udp_address(self, ip: str, port: int) -> tuple[str, int]:
        return ip, port

    def nats_url(self) -> str:
        return f"nats://{self.bus_address}"

    def nats_servers(self, every: bool = False) -> list[str]:
        return [self.nats_url()]  # the cluster's Service, as in the field

    def nats_sign_in_up(self) -> bool:
        return True  # a pod signs in when it starts; the cluster's readiness probes order the rest


def localize(
    topology: Topology, kind: str, name: str, pod_ip: str, cluster: str, proxy_ca_pem: str | None
) -> Topology:
    """The Topology as this one pod must see it (pure)."""
    if kind in POD_ROLES:
        return replace(topology, pods=(Pod(name, POD_ROLES[kind], cluster, pod_ip),))
    if kind == "workers":
        workers = tuple(w for w in topology.workers if w.name == name)
        if not workers:
            raise SystemExit(f"worker {name!r} is not in the topology")
        values = copy.deepcopy(topology.values)
        agent = values.setdefault("global", {}).setdefault("nvcaOperator", {}).setdefault("agent", {})
        agent["workerCallbackCaPem"] = proxy_ca_pem or ""
        return replace(topology, workers=workers, values=values)
    return topology


async def serve(kind: str, ctx: Context) -> None:
    """Run the component; publish its bindings on real ports once it is ready; stop on SIGTERM."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[dict[str, int]] = loop.create_future()

    def announce(bindings: dict[str, int]) -> None:
        if not ready.done():
            ready.set_result(bindings)

    runner = loop.create_task(load_runner(kind)(ctx, announce), name=f"component:{kind}")
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runner.cancel)
    published: Published | None = None
    try:
        either: set[asyncio.Future[Any]] = {runner, ready}
        done, _ = await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if ready in done:
            published = await publish(ready.result())
            ctx.events.emit("component.ready", bindings=ready.result(), pid=os.getpid())
        await runner
    except asyncio.CancelledError:
        ctx.events.emit("component.stopped")
    finally:
        if published is not None:
            published.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusters.k3d.pod", description=__doc__)
    parser.add_argument("kind", choices=KINDS)
    args = parser.parse_args(argv)
    env = os.environ
    name = env.get(ENV_WORKER) if args.kind == "workers" else env.get(ENV_POD_NAME, args.kind)
    cluster = env[ENV_CLUSTER]
    topology = Topology.from_json(Path(env.get(ENV_TOPOLOGY, f"{TOPOLOGY_DIR}/{TOPOLOGY_FILE}")).read_text())
    topology = localize(
        topology,
        args.kind,
        name or args.kind,
        env.get(ENV_POD_IP, "127.0.0.1"),
        cluster,
        env.get(ENV_PROXY_CA),
    )
    ctx = KubeContext(
        Path(POD_STATE_DIR), topology, name or args.kind, cluster, bus_address=env.get(ENV_BUS, BUS_ADDRESS)
    )
    try:
        asyncio.run(serve(args.kind, ctx))
    except KeyboardInterrupt:
        pass
    finally:
        ctx.events.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
