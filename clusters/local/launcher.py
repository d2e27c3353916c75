"""The local backend's launcher: the Topology as processes on 127.0.0.1, each in its own process group.

Everything starts at once, forked by one preloaded zygote per launch (clusters/local/zygote.py), so
the imports are paid once: phase 1 (resolver, the NATS servers, callout, pods, proxy) binds port 0 and
reports its bindings on a ready pipe; the launcher writes them into the network map, where the phase 2
worker hosts find the NATS servers before they report ready themselves. The few addresses peers dial
before their owner runs (the NATS servers' route ports) get their real ports before anything starts. Nothing here sleeps to wait for a
component: readiness is the line on its pipe, or EOF if it died first. A restart after the launch (a
fault, a redeploy) forks its component afresh from a zygote of its own (the shared one's fork, in a run
that has one).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from certs.store import CertStore
from clusters.certificates import prepare_certificates
from clusters.state import purge as purge_state
from clusters.state import write_file
from sim.errors import BackendError
from sim.model.netmap import LOOPBACK, NetMap
from sim.model.parts import CONTROL_CLUSTER
from sim.model.topology import Topology
from sim.nats.server import pre_stop

from .interrupts import InterruptGuard
from .process import Forked, wait_exited
from .zygote import LAUNCH_ORDER, Zygote

READY_TIMEOUT = 15.0  # per phase; a healthy component is ready in well under a second
SIGN_IN_ALLOWANCE = 0.02  # more seconds per worker of the largest worker host: each signs in to NATS first
STOP_TIMEOUT = 3.0  # SIGTERM grace before SIGKILL
# seconds a pod with a preStop hook (a NATS server in lame duck) may take to exit by itself: Kubernetes'
# default terminationGracePeriodSeconds, which the nats chart keeps
TERMINATION_GRACE = 30.0
NATS_CALLOUT = "nats-auth-callout"  # the auth callout service
NATS_SERVER_NAME = re.compile(r"nats-\d+")  # a pod of the nats StatefulSet: its supervisor and nats-server


@dataclass(frozen=True)
class ProcessSpec:
    kind: str
    name: str
    cluster: str


def phase_one(topology: Topology) -> list[ProcessSpec]:
    specs = [ProcessSpec("resolver", "resolver", CONTROL_CLUSTER)]
    specs += [ProcessSpec("nats", server.name, CONTROL_CLUSTER) for server in topology.nats_servers]
    specs.append(ProcessSpec("nats-callout", NATS_CALLOUT, CONTROL_CLUSTER))
    specs += [
        ProcessSpec("invocation" if p.role == "invocation" else "grpc-proxy", p.name, p.cluster)
        for p in topology.pods
    ]
    if topology.proxy_enabled:
        specs.append(ProcessSpec("proxy", "worker-callback-proxy", CONTROL_CLUSTER))
    return specs


def spawn_order(topology: Topology) -> list[tuple[int, ProcessSpec]]:
    """Each component with its phase, in LAUNCH_ORDER by kind (stable within a kind). The zygote loads a
    runner's imports before forking its first component, in the same order. Readiness is still awaited
    phase by phase."""
    specs = [(0, spec) for spec in phase_one(topology)] + [(1, spec) for spec in phase_two(topology)]
    return sorted(specs, key=lambda item: LAUNCH_ORDER.index(item[1].kind))


def ready_timeout(topology: Topology) -> float:
    """How long a start phase may take: a worker host is ready once each of its workers has signed in."""
    largest = max((len(topology.workers_in(c.name)) for c in topology.clusters), default=0)
    return READY_TIMEOUT + SIGN_IN_ALLOWANCE * largest


def phase_two(topology: Topology) -> list[ProcessSpec]:
    return [ProcessSpec("workers", c.name, c.name) for c in topology.clusters if topology.workers_in(c.name)]


@contextlib.contextmanager
def stop_on_interrupt(launcher: Launcher) -> Iterator[None]:
    """Wrap a whole `ncpsim up` (start and replay): Ctrl-C or SIGTERM at any moment stops every process the
    launcher started, then re-raises KeyboardInterrupt for the command line to report."""
    guard = InterruptGuard()
    with guard.installed():
        try:
            yield
        except KeyboardInterrupt:
            with guard.held():  # a second Ctrl-C must not cut the cleanup short
                launcher.stop_all()
            raise


class Launcher:
    """Starts and stops one stack's processes; remembers them in <state>/pids."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.pids_dir = state_dir / "pids"
        self.logs_dir = state_dir / "logs"
        self.children: dict[str, Forked] = {}
        self.guard = InterruptGuard()
        self.zygote: Zygote | None = None  # during a launch: forks the components, imports paid once

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
        with self.guard.installed():
            try:
                with self.guard.held():  # started and recorded as one step, as every child is
                    kinds = (spec.kind for _, spec in spawn_order(topology))
                    self.zygote = Zygote(self.state_dir, ready_timeout(topology), kinds)
                netmap = self.prepare(topology)
                # Worker hosts start with phase one: they import while the control plane starts, then
                # wait for the nats-server binding in the network map (written below) before reporting ready.
                phases: list[dict[str, int]] = [{}, {}]
                try:
                    for index, spec in spawn_order(topology):
                        phases[index][spec.name] = self._spawn(spec)
                except BaseException:
                    for pipes in phases:
                        for fd in pipes.values():
                            os.close(fd)
                    raise
                finally:
                    self._close_zygote()

                def publish(_name: str, bindings: dict[str, int]) -> None:
                    # Each component's addresses go into the map as soon as it is ready, so those waiting
                    # on it (workers on nats-server) go on without waiting for the slowest of its phase.
                    netmap.bindings.update(bindings)
                    netmap.save(self.state_dir / "netmap.json")

                for pipes in phases:
                    self._await_ready(pipes, publish, ready_timeout(topology))
            except BaseException:
                with self.guard.held():  # a second Ctrl-C must not cut the cleanup short
                    self.stop_all()
                raise
        return netmap

    def _close_zygote(self, kill: bool = False) -> None:
        zygote, self.zygote = self.zygote, None
        if zygote is not None:
            zygote.close(kill)

    def _spawn(self, spec: ProcessSpec) -> int:
        read_fd, write_fd = os.pipe()
        args = [
            spec.kind,
            "--state",
            str(self.state_dir),
            "--name",
            spec.name,
            "--cluster",
            spec.cluster,
        ]
        # Started and recorded as one step: an interrupt in between would orphan the child.
        with self.guard.held():
            log = open(self.logs_dir / f"{spec.name}.log", "ab")  # noqa: SIM115 - closed below
            try:
                proc = self._start_process(args, write_fd, log.fileno())
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
                log.close()
            self.children[spec.name] = proc
            write_file(self.pids_dir / f"{spec.name}.pid", str(proc.pid))  # as each starts: status reads them
        return read_fd

    def _start_process(self, args: list[str], ready_fd: int, log_fd: int) -> Forked:
        """`python -m sim.runtime.run ARGS` in a session of its own, forked by the zygote of the launch or
        of the restart (`_forking`)."""
        if self.zygote is None:
            raise BackendError("no zygote to fork a component: start it in a launch or a restart")
        return self.zygote.fork(args, ready_fd, log_fd)

    def _await_ready(
        self,
        pipes: dict[str, int],
        on_ready: Callable[[str, dict[str, int]], None] | None = None,
        timeout: float = READY_TIMEOUT,
    ) -> dict[str, dict[str, int]]:
        selector = selectors.DefaultSelector()
        buffers = {name: b"" for name in pipes}
        for name, fd in pipes.items():
            selector.register(fd, selectors.EVENT_READ, name)
        ready: dict[str, dict[str, int]] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(ready) < len(pipes):
                remaining = deadline - time.monotonic()
                events = selector.select(max(remaining, 0)) if remaining > 0 else []
                if not events:
                    late = sorted(set(pipes) - set(ready))
                    raise BackendError(
                        f"components not ready after {timeout:.0f}s: {', '.join(late)}; see {self.logs_dir}"
                    )
                for key, _ in events:
                    name = key.data
                    chunk = os.read(key.fd, 65536)
                    buffers[name] += chunk
                    if b"\n" in buffers[name]:
                        ready[name] = json.loads(buffers[name].split(b"\n", 1)[0])["bindings"]
                        selector.unregister(key.fd)
                        if on_ready is not None:
                            on_ready(name, ready[name])
                    elif not chunk:
                        raise BackendError(f"{name} exited before it was ready:\n{self.log_tail(name)}")
        finally:
            selector.close()
            for fd in pipes.values():
                os.close(fd)
        return ready

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.logs_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # Restart one component (faults, redeploys) ----------------------------------------------
    def restart(self, topology: Topology, spec: ProcessSpec) -> None:
        with self._forking(topology, [spec.kind]):
            self._replace(topology, spec)

    def redeploy(self, topology: Topology, what: str) -> None:
        """Replace processes as a rollout would, one after the other: new pods read the current
        topology.json (and values)."""
        specs = redeploy_specs(topology, what)
        with self._forking(topology, [spec.kind for spec in specs]):
            for spec in specs:
                self._replace(topology, spec)

    @contextlib.contextmanager
    def _forking(self, topology: Topology, kinds: list[str]) -> Iterator[None]:
        """A zygote for a restart, as for a launch: forked from the shared one where a run has it (a
        fork, where a fresh interpreter that imports the runner costs 1-2 s), else started afresh."""
        with self.guard.held():
            self.zygote = Zygote(self.state_dir, ready_timeout(topology), kinds)
        try:
            yield
        finally:
            self._close_zygote()

    def _replace(self, topology: Topology, spec: ProcessSpec) -> None:
        self.stop_one(spec.name)
        netmap = NetMap(**json.loads((self.state_dir / "netmap.json").read_text()))
        bindings = self._await_ready({spec.name: self._spawn(spec)}, timeout=ready_timeout(topology))[
            spec.name
        ]
        netmap.bindings.update(bindings)
        netmap.save(self.state_dir / "netmap.json")

    # Stop ------------------------------------------------------------------------------------
    def running(self) -> dict[str, int]:
        """Recorded processes that are still alive (pid files whose process is ours and running)."""
        alive = {}
        for pidfile in sorted(self.pids_dir.glob("*.pid")) if self.pids_dir.exists() else []:
            pid = int(pidfile.read_text().strip() or 0)
            if pid and _is_ours(pid, self.state_dir):
                alive[pidfile.stem] = pid
        return alive

    def spec_for(self, topology: Topology, name: str) -> ProcessSpec:
        for spec in phase_one(topology) + phase_two(topology):
            if spec.name == name:
                return spec
        raise BackendError(f"no component named {name!r} in this topology")

    def reap(self, name: str) -> None:
        """Forget a process that died (SIGKILL fault): collect our child and drop its pid file."""
        proc = self.children.pop(name, None)
        if proc is not None:
            proc.wait(STOP_TIMEOUT)
        (self.pids_dir / f"{name}.pid").unlink(missing_ok=True)

    def stop_one(self, name: str, graceful: bool = True) -> None:
        """Stop one component as Kubernetes stops its pod: `graceful`, a NATS server runs the chart's preStop
        hook first and is given the termination grace period to exit by itself; then SIGTERM, SIGKILL. A
        whole stack going down (`stop_all`) is not graceful."""
        if graceful and NATS_SERVER_NAME.fullmatch(name):
            self._pre_stop(name)
        pidfile = self.pids_dir / f"{name}.pid"
        proc = self.children.get(name)
        if proc is not None:
            # One this launcher forked: its handle (pid and start time) is proof enough. A component
            # just forked may not show its command line yet, which _is_ours would need.
            if proc.poll() is None:
                _terminate(proc.pid, proc)
            else:
                self._stop_orphans(proc.pid)
        elif pidfile.exists():
            pid = int(pidfile.read_text().strip() or 0)
            if pid and _is_ours(pid, self.state_dir):
                _terminate(pid, None)
            elif pid:
                self._stop_orphans(pid)
        pidfile.unlink(missing_ok=True)
        self.children.pop(name, None)

    def _pre_stop(self, name: str) -> None:
        """A NATS server's lame duck (sim.nats.server.pre_stop), then its pod's exit awaited."""
        pod = self.running().get(name)
        if pod is not None and pre_stop(self.state_dir, name, pod) is not None:
            _wait_gone(pod, self.children.get(name), TERMINATION_GRACE)

    def _stop_orphans(self, pgid: int) -> None:
        """The leader died (kill -9 of a supervisor): what it started may run on in its group."""
        for orphan in self.orphans(pgid):  # members of a group whose leader is gone: one by one
            _terminate(orphan, None, group=False)

    def orphans(self, pgid: int) -> list[int]:
        """This stack's processes left in the process group of a component that died (a nats-server whose
        supervisor was SIGKILLed): found by group and by command line, never by the group id alone."""
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if os.getpgid(proc.info["pid"]) == pgid and _is_stack_process(
                    proc.info["cmdline"] or [], self.state_dir
                ):
                    found.append(proc.info["pid"])
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        return found

    def orphans_of_dead(self) -> dict[str, list[int]]:
        """Per component whose recorded process is gone, the stack's processes still in its group."""
        left = {}
        running = self.running()
        for pidfile in sorted(self.pids_dir.glob("*.pid")) if self.pids_dir.exists() else []:
            pid = int(pidfile.read_text().strip() or 0)
            if pid and pidfile.stem not in running and (orphans := self.orphans(pid)):
                left[pidfile.stem] = orphans
        return left

    def stop_all(self) -> list[str]:
        """Stop every recorded process (and any child started by this launcher) stage by stage, workers
        first (_stop_order), then any process of this stack that no record names. A stage's components stop
        together: each may take its grace period (a NATS server waits for the auth callout's answers
        still due, up to its authorization timeout), and one after the other they added up."""
        self._close_zygote(kill=True)  # first: it forks nothing more
        names = sorted(set(self.running()) | set(self.children), key=_stop_order)
        for _, stage in itertools.groupby(names, key=_stop_order):
            with ThreadPoolExecutor(thread_name_prefix="stop") as pool:
                list(pool.map(functools.partial(self.stop_one, graceful=False), stage))
        for pidfile in self.pids_dir.glob("*.pid") if self.pids_dir.exists() else []:
            pidfile.unlink(missing_ok=True)  # stale files of processes that were already gone
        return names + _stop_strays(self.state_dir)

    def purge(self) -> None:
        self.stop_all()
        purge_state(self.state_dir)  # only a real folder carrying ncpsim's marker


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


def _stop_order(name: str) -> int:
    """Workers first (they call the others), then the proxy and pods, the NATS servers and DNS last."""
    if name.startswith("ncpsim-compute") or name == "ncpsim-cp":
        return 0
    if NATS_SERVER_NAME.fullmatch(name):
        return 3
    return {"worker-callback-proxy": 1, "resolver": 4}.get(name, 2)


def _is_ours(pid: int, state_dir: Path) -> bool:
    """True if `pid` is alive and is one of this stack's components (not a recycled pid), on Linux and macOS
    alike: psutil reads the command line there too, so a pid file is never trusted on its own."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False  # nothing left to stop
        args = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # gone, or another user's: not ours
        return False
    return _is_component(args, state_dir)


def _is_component(args: list[str], state_dir: Path) -> bool:
    return _runs("sim.runtime.run", args, state_dir)


def _is_stack_process(args: list[str], state_dir: Path) -> bool:
    """A component of this stack, its launch's zygote, or a nats-server on a config in its state folder."""
    if _runs("sim.runtime.run", args, state_dir) or _runs("sim.runtime.zygote", args, state_dir):
        return True
    inside = str(state_dir) + os.sep
    return bool(args) and Path(args[0]).name == "nats-server" and any(a.startswith(inside) for a in args)


def _runs(module: str, args: list[str], state_dir: Path) -> bool:
    """`python -m MODULE ... --state DIR ...`, as exec'd (one argument each) or as a forked component's
    title (one string: setproctitle writes the line over the zygote's arguments)."""
    line = " ".join(a for a in args if a) + " "
    return f" -m {module} " in line and f" --state {state_dir} " in line


def _stop_strays(state_dir: Path) -> list[str]:
    """Stop this stack's processes that no pid file names, known by their command lines: a component
    whose pid file went with a crashed `ncpsim up`, or a nats-server whose supervisor was stopped
    while it started it. SIGTERM, then SIGKILL what outlives the grace period; says what it stopped."""
    strays = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and _is_stack_process(
            proc.info["cmdline"] or [], state_dir
        ):
            strays.append(proc)
    stopped = [f"pid {proc.pid} (in no pid file)" for proc in strays]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in strays:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)
        deadline = time.monotonic() + STOP_TIMEOUT  # exited is enough: their parent reaps them, not us
        strays = [p for p in strays if not _wait_gone(p.pid, None, max(deadline - time.monotonic(), 0))]
        if not strays:
            break
    return stopped


def _terminate(pid: int, proc: Forked | None, group: bool = True) -> None:
    """SIGTERM the process group (with `group`, else the one process), then SIGKILL past the grace period."""
    send = os.killpg if group else os.kill
    for sig, grace in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
        try:
            send(pid, sig)
        except ProcessLookupError:
            return
        if _wait_gone(pid, proc, grace):
            return


def _wait_gone(pid: int, proc: Forked | None, timeout: float) -> bool:
    if proc is None:
        return wait_exited(pid, timeout)
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def redeploy_specs(topology: Topology, what: str) -> list[ProcessSpec]:
    """The processes a redeploy replaces: function workers, the proxy, the control-plane pods, or all."""
    first = phase_one(topology)
    groups = {
        "workers": phase_two(topology),
        "proxy": [s for s in first if s.kind == "proxy"],
        "pods": [s for s in first if s.kind in ("invocation", "grpc-proxy")],
    }
    if what == "all":
        return groups["pods"] + groups["proxy"] + groups["workers"]
    return groups[what]
