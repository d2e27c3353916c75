"""What the replay engine needs of the k3d clusters, as parts of clusters.k3d.stack.K3dStack.

The engine needs three things from a stack: a client that reaches the pods' client ports, the
components' events, and the proxy's access log. Here:

- the client reaches each control-plane pod through `kubectl port-forward`, recorded in the state
  folder's network map as that pod's real IP -> the forwarded loopback port (the engine's client
  dials through the map exactly as on the local backend);
- stand-in pods write their events as JSON lines on stdout and Envoy writes its default access log
  there too; a background thread copies `kubectl logs` into ``events/<pod>.jsonl`` and the access
  log file the engine tails.

This path has not been run against live clusters on the machine it was written on (no Docker there);
its parts are tested with a fake kubectl.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

from clusters.k3d.runner import CommandRunner
from clusters.render.layout import GRPC_DEPLOYMENT, INVOCATION_DEPLOYMENT, kube_context
from sim.errors import BackendError
from sim.model.netmap import NetMap
from sim.model.parts import CONTROL_CLUSTER, Pod
from sim.model.topology import Topology
from sim.proxy.access_log import parse_line
from sim.proxy.component import ACCESS_LOG
from sim.wire import GRPC_CLIENT_PORT, INVOCATION_HTTP_PORT, NAMESPACE

FORWARD_TIMEOUT = 15.0
SYNC_INTERVAL = 0.5
FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")
PREFIX = re.compile(r"^\[pod/(?P<pod>[^/\]]+)/(?P<container>[^\]]+)\] (?P<line>.*)$")
ROLES = {
    INVOCATION_DEPLOYMENT: ("invocation", INVOCATION_HTTP_PORT),
    GRPC_DEPLOYMENT: ("grpc-proxy", GRPC_CLIENT_PORT),
}
SELECTOR = "app.kubernetes.io/part-of=ncpsim"


# -- pods as the cluster placed them -------------------------------------------------------------
def parse_pods(raw: str) -> list[Pod]:
    """Running, ready control-plane pods from `kubectl get pods -o json`, with their real names and IPs."""
    pods = []
    for item in json.loads(raw).get("items", []):
        role = ROLES.get(item["metadata"].get("labels", {}).get("app", ""))
        status = item.get("status", {})
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
        )
        if role and status.get("phase") == "Running" and ready and status.get("podIP"):
            pods.append(Pod(item["metadata"]["name"], role[0], CONTROL_CLUSTER, status["podIP"]))
    return sorted(pods, key=lambda p: (p.role, p.name))


def live_pods(runner: CommandRunner) -> tuple[Pod, ...]:
    raw = runner.run(
        "kubectl",
        "--context",
        kube_context(CONTROL_CLUSTER),
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        SELECTOR,
        "-o",
        "json",
    ).stdout
    return tuple(parse_pods(raw))


# -- port-forwards -------------------------------------------------------------------------------
@dataclass
class PortForward:
    pod: Pod
    port: int
    process: subprocess.Popen[str]
    local_port: int = 0

    @classmethod
    def start(cls, runner: CommandRunner, pod: Pod, port: int) -> PortForward:
        process = runner.spawn(
            "kubectl",
            "--context",
            kube_context(pod.cluster),
            "-n",
            NAMESPACE,
            "port-forward",
            f"pod/{pod.name}",
            f":{port}",
        )
        forward = cls(pod, port, process)
        try:
            forward.local_port = forward._await_line()
        except BaseException:
            forward.stop()
            raise
        return forward

    def _await_line(self) -> int:
        """kubectl prints `Forwarding from 127.0.0.1:PORT -> 8080` once it listens."""
        assert self.process.stdout is not None
        deadline, seen = time.monotonic() + FORWARD_TIMEOUT, []
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline and selector.select(deadline - time.monotonic()):
                line = self.process.stdout.readline()
                if not line:
                    break
                seen.append(line.strip())
                if found := FORWARDING.search(line):
                    return int(found[1])
        raise BackendError(
            f"kubectl port-forward to {self.pod.name}:{self.port} did not start: "
            f"{seen[-1] if seen else 'no output'}"
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()


def write_netmap(state: Path, topology: Topology, forwards: list[PortForward]) -> NetMap:
    """The client's view: each forwarded pod port as its real IP, reachable from the control plane."""
    netmap = NetMap(
        bindings={f"{f.pod.ip}:{f.port}/tcp": f.local_port for f in forwards},
        reach={CONTROL_CLUSTER: topology.reachable_ranges(CONTROL_CLUSTER)},
    )
    netmap.save(state / "netmap.json")
    return netmap


# -- events and the access log from `kubectl logs` ----------------------------------------------
def sort_log_lines(text: str) -> tuple[dict[str, list[str]], list[str]]:
    """`kubectl logs --prefix` output -> (event lines by pod, Envoy access-log lines)."""
    events: dict[str, list[str]] = {}
    access: list[str] = []
    for raw in text.splitlines():
        match = PREFIX.match(raw)
        if not match:
            continue
        line = match["line"].rstrip()
        if line.startswith("{"):
            try:
                if "kind" in json.loads(line):
                    events.setdefault(match["pod"], []).append(line)
            except json.JSONDecodeError:
                pass
        elif parse_line(line):
            access.append(line)
    return events, access


class LogSync:
    """Copies every ncpsim pod's log into the state folder until stopped (then once more)."""

    def __init__(
        self, runner: CommandRunner, state: Path, clusters: list[str], interval: float = SYNC_INTERVAL
    ):
        self.runner, self.state, self.clusters, self.interval = runner, state, clusters, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="k3d-log-sync", daemon=True)

    def sync_once(self) -> None:
        events: dict[str, list[str]] = {}
        access: list[str] = []
        for cluster in self.clusters:
            result = self.runner.run(
                "kubectl",
                "--context",
                kube_context(cluster),
                "-n",
                NAMESPACE,
                "logs",
                "-l",
                SELECTOR,
                "--all-containers",
                "--prefix",
                "--tail=-1",
                "--max-log-requests=64",
                check=False,
            )
            pod_events, pod_access = sort_log_lines(result.stdout)
            events.update(pod_events)
            access += pod_access
        for pod, lines in events.items():
            _write_lines(self.state / "events" / f"{pod}.jsonl", lines)
        _write_lines(self.state / "logs" / ACCESS_LOG, access)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sync_once()

    def start(self) -> Self:
        self.sync_once()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sync_once()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _write_lines(path: Path, lines: list[str]) -> None:
    """Logs only grow, so the file grows by a suffix: the engine's tail keeps reading from its offset."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(line + "\n" for line in lines)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def fresh_records(state: Path) -> None:
    """Events and access lines of an earlier run would be joined into this one's traces."""
    shutil.rmtree(state / "events", ignore_errors=True)
    (state / "logs" / ACCESS_LOG).unlink(missing_ok=True)
    for folder in ("events", "logs"):
        (state / folder).mkdir(parents=True, exist_ok=True)


def live_topology(runner: CommandRunner, topology: Topology) -> Topology:
    pods = live_pods(runner)
    want = len(topology.pods)
    if len(pods) != want:
        raise BackendError(
            f"{len(pods)} of {want} control-plane pods are running and ready; "
            f"see `kubectl --context {kube_context(CONTROL_CLUSTER)} -n {NAMESPACE} get pods`"
        )
    return replace(topology, pods=pods)


def start_forwards(runner: CommandRunner, topology: Topology) -> list[PortForward]:
    forwards: list[PortForward] = []
    try:
        for pod in topology.pods:
            port = INVOCATION_HTTP_PORT if pod.role == "invocation" else GRPC_CLIENT_PORT
            forwards.append(PortForward.start(runner, pod, port))
    except BaseException:
        for forward in forwards:
            forward.stop()
        raise
    return forwards
