"""The local backend's launcher: starts a stack's processes on 127.0.0.1 (clusters/local/plan.py says
which), records them in <state>/pids, restarts and stops them, through the stack's supervisor.

Everything starts at once: phase 1 (resolver, the NATS servers, callout, pods, proxy) binds port 0 and
reports its bindings on a ready pipe; the launcher writes them into the network map, where the phase 2
worker hosts find the NATS servers before they report ready themselves. The few addresses peers dial
before their owner runs (the NATS servers' route ports) get their real ports before anything starts.
Nothing here sleeps to wait for a component: readiness is the line on its pipe, or EOF if it died first.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import shutil
import signal
import socket
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

import psutil

from certs.store import CertStore
from clusters.certificates import prepare_certificates
from clusters.interrupts import InterruptGuard
from clusters.state import write_file
from sim.errors import BackendError
from sim.model.netmap import LOOPBACK, NetMap
from sim.model.topology import Topology
from sim.nats.server import pre_stop
from sim.runtime.supervisor import STOP_TIMEOUT

from .plan import (
    NATS_SERVER_NAME,
    ProcessSpec,
    ready_timeout,
    redeploy_specs,
    spawn_order,
    stop_order,
)
from .process import wait_exited
from .sweep import is_ours, orphans, stop_processes, stop_strays
from .zygote import Zygote, ask, down

# seconds a pod with a preStop hook (a NATS server in lame duck) may take to exit by itself: Kubernetes'
# default terminationGracePeriodSeconds, which the nats chart keeps
TERMINATION_GRACE = 30.0


class Launcher:
    """Starts and stops one stack's processes; remembers them in <state>/pids."""

    def __init__(self, state_dir: Path, guard: InterruptGuard | None = None):
        """`guard`: the command's (one per command, handed down); a library caller's launch gets one."""
        self.state_dir = state_dir
        self.pids_dir = state_dir / "pids"
        self.logs_dir = state_dir / "logs"
        self.guard = guard or InterruptGuard()
        self.zygote: Zygote | None = None  # during a launch: forks the components, imports paid once

    @contextlib.contextmanager
    def stopping_all_on(self, *errors: type[BaseException]) -> Iterator[None]:
        """Ctrl-C or SIGTERM become KeyboardInterrupt (the guard); on `errors` every process is stopped, a
        second Ctrl-C deferred until that is done, then the error re-raised. Around a whole `ncpsim up`
        (start and replay), on KeyboardInterrupt; around a start, on anything."""
        with self.guard.installed():
            try:
                yield
            except errors:
                with self.guard.held():
                    self.stop_all()
                raise

    # Start -----------------------------------------------------------------------------------
    def prepare(self, topology: Topology) -> NetMap:
        # Each `up` starts with fresh logs and events (the certificates are kept: same CAs across runs).
        for folder in (self.logs_dir, self.state_dir / "events"):
            shutil.rmtree(folder, ignore_errors=True)
        for folder in (self.pids_dir, self.logs_dir, self.state_dir / "events"):
            folder.mkdir(parents=True, exist_ok=True)
        # The values are applied here: pods read topology.json, whose workerCallbackCaPem is PEM text now.
        applied = prepare_certificates(CertStore(self.state_dir / "certs"), topology)
        (self.state_dir / "topology.json").write_text(applied.to_json())
        netmap = NetMap(
            bindings=reserve_ports(topology.reserved_addresses()),
            reach={c.name: topology.reachable_ranges(c.name) for c in topology.clusters},
            services=topology.service_endpoints(),
            seed=topology.seed,
        )
        netmap.save(self.state_dir / "netmap.json")
        return netmap

    def start(self, topology: Topology) -> NetMap:
        """Start every component; interrupted or failed part-way, stop what was started and re-raise."""
        with self.stopping_all_on(BaseException):
            with self.guard.held():  # started and recorded as one step, as every child is
                kinds = (spec.kind for _, spec in spawn_order(topology))
                self.zygote = Zygote(self.state_dir, ready_timeout(topology), kinds)
            netmap = self.prepare(topology)
            # Worker hosts start with phase one: they import while the control plane starts, then
            # wait for the nats-server binding in the network map (written below) before reporting ready.
            order = spawn_order(topology)
            try:
                pipes = self._spawn_all(spec for _, spec in order)
            finally:
                self._close_zygote()
            for phase in (0, 1):
                ready = {spec.name: pipes[spec.name] for index, spec in order if index == phase}
                self._await_ready(ready, netmap, ready_timeout(topology))
        return netmap

    def _close_zygote(self, kill: bool = False) -> None:
        zygote, self.zygote = self.zygote, None
        if zygote is not None:
            zygote.close(kill)

    def _spawn_all(self, specs: Iterable[ProcessSpec]) -> dict[str, int]:
        """Each component forked and recorded: its ready pipe's read end by name (all closed if one fails)."""
        pipes: dict[str, int] = {}
        try:
            for spec in specs:
                pipes[spec.name] = self._spawn(spec)
        except BaseException:
            for fd in pipes.values():
                os.close(fd)
            raise
        return pipes

    def _spawn(self, spec: ProcessSpec) -> int:
        read_fd, write_fd = os.pipe()
        args = [spec.kind, "--state", str(self.state_dir), "--name", spec.name, "--cluster", spec.cluster]
        # Started and recorded as one step: an interrupt in between would orphan the child.
        with self.guard.held():
            log = open(self.logs_dir / f"{spec.name}.log", "ab")  # noqa: SIM115 - closed below
            try:
                if self.zygote is None:
                    raise BackendError("no zygote to fork a component: start it in a launch or a restart")
                pid = self.zygote.fork(args, write_fd, log.fileno())
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
                log.close()
            write_file(self.pids_dir / f"{spec.name}.pid", str(pid))  # as each starts: status reads them
        return read_fd

    def _await_ready(self, pipes: dict[str, int], netmap: NetMap, timeout: float) -> None:
        """Each component's ready line read from its pipe. Its addresses go into the network map as soon as
        it is ready, so those waiting on it (workers on nats-server) need not wait for the slowest."""
        selector = selectors.DefaultSelector()
        buffers = {name: b"" for name in pipes}
        for name, fd in pipes.items():
            selector.register(fd, selectors.EVENT_READ, name)
        ready: set[str] = set()
        deadline = time.monotonic() + timeout
        try:
            while len(ready) < len(pipes):
                remaining = deadline - time.monotonic()
                events = selector.select(max(remaining, 0)) if remaining > 0 else []
                if not events:
                    late = sorted(set(pipes) - ready)
                    raise BackendError(
                        f"components not ready after {timeout:.0f}s: {', '.join(late)}; see {self.logs_dir}"
                    )
                for key, _ in events:
                    name = key.data
                    chunk = os.read(key.fd, 65536)
                    buffers[name] += chunk
                    if b"\n" in buffers[name]:
                        ready.add(name)
                        selector.unregister(key.fd)
                        netmap.bindings.update(json.loads(buffers[name].split(b"\n", 1)[0])["bindings"])
                        netmap.save(self.state_dir / "netmap.json")
                    elif not chunk:
                        raise BackendError(f"{name} exited before it was ready:\n{self.log_tail(name)}")
        finally:
            selector.close()
            for fd in pipes.values():
                os.close(fd)

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.logs_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # Restart components (faults, scaling, redeploys) ----------------------------------------
    def restart(self, topology: Topology, *specs: ProcessSpec) -> None:
        """Stop the components of ``specs`` and start them anew, together: one pod, or the pods a scale-up
        brings back at once (the nats StatefulSet's Parallel pod management, a Deployment's ReplicaSet)."""
        with self._forking(topology, [spec.kind for spec in specs]):
            self._replace(topology, *specs)

    def redeploy(self, topology: Topology, what: str) -> None:
        """Replace processes as a rollout would: new pods read the current topology.json (and values). The
        control plane's Deployments roll one pod at a time; each compute cluster replaces its function's
        pods on its own, so the clusters' worker hosts are replaced together."""
        specs = redeploy_specs(topology, what)
        with self._forking(topology, [spec.kind for spec in specs]):
            for spec in specs:
                if spec.kind != "workers":
                    self._replace(topology, spec)
            if workers := [spec for spec in specs if spec.kind == "workers"]:
                self._replace(topology, *workers)

    @contextlib.contextmanager
    def _forking(self, topology: Topology, kinds: list[str]) -> Iterator[None]:
        """A restart forks through the stack's supervisor, so its components have the launch's parent; with
        none left to reach (killed), a zygote of its own, which then supervises what it forked."""
        with self.guard.held():
            self.zygote = Zygote(self.state_dir, ready_timeout(topology), kinds, attach=True)
        try:
            yield
        finally:
            self._close_zygote()

    def _replace(self, topology: Topology, *specs: ProcessSpec) -> None:
        self.stop(*(spec.name for spec in specs))
        netmap = NetMap(**json.loads((self.state_dir / "netmap.json").read_text()))
        self._await_ready(self._spawn_all(specs), netmap, ready_timeout(topology))

    # Stop ------------------------------------------------------------------------------------
    def _recorded(self) -> dict[str, int]:
        pidfiles = sorted(self.pids_dir.glob("*.pid")) if self.pids_dir.exists() else []
        return {pidfile.stem: int(pidfile.read_text().strip() or 0) for pidfile in pidfiles}

    def running(self) -> dict[str, int]:
        """Recorded processes that are still alive (pid files whose process is ours and running)."""
        return self._alive(self._recorded())

    def _alive(self, recorded: dict[str, int]) -> dict[str, int]:
        return {name: pid for name, pid in recorded.items() if pid and is_ours(pid, self.state_dir)}

    def kill(self, name: str, pid: int) -> None:
        """SIGKILL the component's process group (its supervisor does, and reaps it), its pid file dropped."""
        asked = ask(self.state_dir, {"kill": [name]}, STOP_TIMEOUT * 3)
        if asked is None or name not in asked[1].get("stopped", []):  # no supervisor, or not its parent
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            wait_exited(pid, STOP_TIMEOUT)
        (self.pids_dir / f"{name}.pid").unlink(missing_ok=True)

    def stop(self, *names: str) -> None:
        """Stop components as Kubernetes stops their pods, together: each NATS server runs the chart's preStop
        hook first (their lame ducks overlap, as a Parallel StatefulSet's pods terminate at once) and has the
        termination grace period to exit by itself; then the supervisor stops them, or the sweep where it
        cannot. A whole stack going down (`stop_all`) is not graceful."""
        running = self.running()
        hooked = {
            name: running[name]
            for name in names
            if NATS_SERVER_NAME.fullmatch(name)
            and name in running
            and pre_stop(self.state_dir, name, running[name]) is not None
        }
        deadline = time.monotonic() + TERMINATION_GRACE
        for pod in hooked.values():  # the NATS servers' lame ducks, then each pod's exit awaited
            wait_exited(pod, max(deadline - time.monotonic(), 0))
        self._stop_orphans(names)
        request = {"stop": [list(names)]}
        if self.zygote is not None and self.zygote.process is None:  # a restart's, through the supervisor
            self.zygote.ask(request)
        else:
            ask(self.state_dir, request, STOP_TIMEOUT * 3)
        if set(names) & set(self.running()):  # no supervisor stopped them: it is gone, or not their parent
            stop_strays(self.state_dir, set(names))
        for name in names:
            (self.pids_dir / f"{name}.pid").unlink(missing_ok=True)

    def orphans_of_dead(
        self, names: Collection[str] | None = None, running: Collection[str] | None = None
    ) -> dict[str, list[psutil.Process]]:
        """Per component (of `names`) whose recorded process is gone, the stack's processes still in its
        group: what a nats-server whose pod's supervisor was SIGKILLed alone left running. `running`: the
        components the caller has just found alive, so each pid is not checked twice."""
        left, recorded = {}, self._recorded()
        running = self._alive(recorded) if running is None else running
        for name, pid in recorded.items():
            picked = (names is None or name in names) and pid and name not in running
            if picked and (left_over := orphans(pid, self.state_dir)):
                left[name] = left_over
        return left

    def _stop_orphans(self, names: Collection[str] | None = None) -> None:
        for left in self.orphans_of_dead(names).values():
            stop_processes(left)

    def stop_all(self) -> list[str]:
        """Stop every component: the stack's supervisor stops its children stage by stage (stop_order; a
        stage's components together, as each may take its grace period) and exits; the sweep stops what it
        did not (it is gone, killed with an interrupted launch, or is not their parent)."""
        self._close_zygote(kill=True)  # first: a launch's zygote forks nothing more
        self._stop_orphans()
        names = sorted(self.running(), key=stop_order)
        stages = [list(stage) for _, stage in itertools.groupby(names, key=stop_order)]
        supervised = down(self.state_dir, stages, TERMINATION_GRACE + STOP_TIMEOUT * 2 * len(stages))
        swept = stop_strays(self.state_dir) if supervised is None or self.running() else []
        for pidfile in self.pids_dir.glob("*.pid") if self.pids_dir.exists() else []:
            pidfile.unlink(missing_ok=True)
        return sorted(set(names) | set(supervised or []) | set(swept), key=stop_order)


def reserve_ports(addresses: list[str]) -> dict[str, int]:
    """A free loopback port for each address, chosen now and let go at once: its owner binds it when it
    starts (a StatefulSet pod's stable address, which its peers are configured with before it runs). One
    taken meanwhile by another process makes its owner choose another (sim.pods.nats.component)."""
    held = []
    try:
        for _ in addresses:
            sock = socket.socket()
            held.append(sock)
            sock.bind((LOOPBACK, 0))
        return {address: sock.getsockname()[1] for address, sock in zip(addresses, held, strict=True)}
    finally:
        for sock in held:
            sock.close()
