"""The local backend as a Stack: one stack's processes on 127.0.0.1, its state folder, its status."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path

from clusters.interrupts import InterruptGuard
from clusters.local.launcher import Launcher
from clusters.local.plan import components, spec_named
from clusters.stack import COMMAND_TURN, Endpoint, Endpoints, Json, build_status, log_files, nats_endpoint
from clusters.state import (
    StackLock,
    adopt,
    check_links,
    create_stack_dir,
    is_stack_dir,
    state_dir,
    write_file,
)
from clusters.state import purge as purge_state
from sim.errors import ConfigError
from sim.model.netmap import NetMap
from sim.model.topology import Topology
from sim.wire import DNS_PORT, PROXY_H3_PORT, PROXY_HTTP_PORT

LOOPBACK = "127.0.0.1"


class LocalStack:
    """A named stack of processes; also its own `Components` (fault steps act on its processes)."""

    backend = "local"

    def __init__(self, name: str = "default", root: Path | None = None, guard: InterruptGuard | None = None):
        self.name, self.root = name, root
        self.state_dir = state_dir(name, root)
        self.launcher = Launcher(self.state_dir, guard)
        self.lock = StackLock(self.state_dir)  # held by up, down and redeploys (re-entrant in this process)

    @property
    def topology(self) -> Topology:
        return Topology.load(self.state_dir)

    def up(self, topology: Topology, scenario: str) -> LocalStack:
        create_stack_dir(self.state_dir)
        # Under the lock, so two `ncpsim up` runs cannot both pass the check; a loser stops nothing.
        with self.lock.held():
            if self.launcher.running():
                raise ConfigError(
                    f"stack {self.name!r} is already running ({self.state_dir}); "
                    f"run `ncpsim down` first or pick another --stack name"
                )
            check_links(self.state_dir)
            (self.state_dir / "status.json").unlink(missing_ok=True)  # until this start completes
            netmap = self.launcher.start(topology)  # Ctrl-C or a failed component: it leaves nothing half-up
            self._write_status(topology, netmap, scenario)
        return self

    def redeploy(self, topology: Topology, what: str) -> Topology:
        with self.lock.held():
            self.launcher.redeploy(topology, what)
            self._refresh_status()
        return topology

    def _refresh_status(self) -> None:
        """A replaced proxy or resolver binds new ports: keep status.json (what `ncpsim status` prints) current."""
        path = self.state_dir / "status.json"
        if path.exists():
            netmap = NetMap(**json.loads((self.state_dir / "netmap.json").read_text()))
            self._write_status(self.topology, netmap, json.loads(path.read_text()).get("scenario", ""))

    def _write_status(self, topology: Topology, netmap: NetMap, scenario: str) -> None:
        ends = endpoints(topology, netmap, self.state_dir)
        status = build_status(self.backend, topology, self.state_dir, scenario, ends)
        write_file(self.state_dir / "status.json", json.dumps(status, indent=2))

    def expected(self) -> list[str]:
        """The components this stack's topology runs (empty when there is no readable topology.json)."""
        try:
            topology = self.topology
        except (OSError, ValueError, KeyError, TypeError):
            return []
        return [spec.name for spec in components(topology)]

    def status(self) -> Json | None:
        """The status contract, with `running` and `down` read from the pid files (checked for liveness).

        status.json is written only once a start completes; a start cut short (a SIGKILLed `ncpsim up`)
        leaves components running without it, and the status says so (`complete: false`) rather than
        "not up"."""
        if not is_stack_dir(self.state_dir):
            return None
        running = sorted(self.launcher.running())
        path = self.state_dir / "status.json"
        status: Json
        complete = path.is_file() and not path.is_symlink()
        if complete:
            status = json.loads(path.read_text())
        elif running:
            status = {"backend": self.backend, "stack": self.name, "stateDir": str(self.state_dir)}
        else:
            return None
        status["complete"] = complete
        status["running"] = running
        status["down"] = [name for name in self.expected() if name not in running]
        orphans = self.launcher.orphans_of_dead(running=running)
        if orphans:  # a supervisor that died left what it ran: `fault restart NAME` or `down` stops it
            status["orphans"] = {name: [proc.pid for proc in procs] for name, procs in orphans.items()}
        return status

    def logs(self) -> dict[str, str]:
        return log_files(self.state_dir)

    def down(self, purge: bool = False) -> list[str]:
        """Stop every component; with `purge`, delete the stack folder, only if it is one ncpsim made."""
        if self.state_dir.is_symlink():
            raise ConfigError(
                f"{self.state_dir} is a symbolic link, not a stack folder: nothing stopped or removed"
            )
        if not self.state_dir.exists():
            return []
        if not adopt(self.state_dir):
            raise ConfigError(
                f"{self.state_dir} is not an ncpsim stack folder (no marker): nothing stopped or removed"
            )
        with self.lock.held():
            stopped = self.launcher.stop_all()
            if purge:
                purge_state(self.state_dir)
            else:
                (self.state_dir / "status.json").unlink(missing_ok=True)
        return stopped

    def close(self) -> None:
        """The processes belong to the stack, not to this process: nothing to let go of."""

    def changing(self) -> AbstractContextManager[None]:
        return self.lock.held(wait=COMMAND_TURN)

    @property
    def components(self) -> LocalStack:
        return self

    # Components: what fault steps do to processes ------------------------------------------------
    def running(self) -> dict[str, int]:
        return self.launcher.running()

    def kill(self, name: str) -> int:
        """SIGKILL the component's process group, as a node losing the pod would."""
        pid = self.launcher.running()[name]
        self.launcher.kill(name, pid)
        return pid

    def restart(self, *names: str) -> None:
        """Stop and start the components ``names``, together."""
        with self.lock.held():
            topology = self.topology
            self.launcher.restart(topology, *(spec_named(topology, name) for name in names))
        self._refresh_status()

    def stop(self, *names: str) -> None:
        self.launcher.stop(*names)


def endpoints(topology: Topology, netmap: NetMap, state: Path) -> Endpoints:
    def real(ip: str, port: int, proto: str) -> Endpoint:
        return Endpoint(LOOPBACK, netmap.bindings.get(f"{ip}:{port}/{proto}"))

    ((http_ip, http_port),) = topology.proxy_addresses(PROXY_HTTP_PORT)[:1]
    ((h3_ip, h3_port),) = topology.proxy_addresses(PROXY_H3_PORT)[:1]
    return Endpoints(
        proxy_http=real(http_ip, http_port, "tcp"),
        proxy_h3=real(h3_ip, h3_port, "udp"),
        dns={c.name: real(c.dns_ip, DNS_PORT, "udp") for c in topology.clusters},
        logs=log_files(state),
        nats=nats_endpoint(topology, netmap.bindings, LOOPBACK),
    )


class LocalBackend:
    """Processes on 127.0.0.1: the default backend, with nothing but Python."""

    name = "local"

    def __init__(self, root: Path | None = None, guard: InterruptGuard | None = None):
        """`guard`: the command's interrupt guard, handed to each stack's launcher."""
        self.root, self.guard = root, guard
        self._stacks: dict[str, LocalStack] = {}  # one launcher per stack: it holds the children it started

    def up(self, topology: Topology, scenario: str) -> LocalStack:
        return self.attach(topology.stack).up(topology, scenario)

    def attach(self, stack: str) -> LocalStack:
        if stack not in self._stacks:
            self._stacks[stack] = LocalStack(stack, self.root, self.guard)
        return self._stacks[stack]

    def interruptible(self, stack: str) -> AbstractContextManager[None]:
        return self.attach(stack).launcher.stopping_all_on(KeyboardInterrupt)
