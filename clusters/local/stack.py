"""The local backend as a Stack: one stack's processes on 127.0.0.1, its state folder, its status."""

from __future__ import annotations

import json
import os
import signal
from contextlib import AbstractContextManager
from pathlib import Path

from clusters.local.launcher import Launcher, stop_on_interrupt
from clusters.stack import Endpoint, Endpoints, Json, build_status, log_files, state_dir
from sim.errors import ConfigError
from sim.model.netmap import NetMap
from sim.model.topology import Topology
from sim.protocols.wire import DNS_PORT, PROXY_H3_PORT, PROXY_HTTP_PORT

LOOPBACK = "127.0.0.1"


class LocalStack:
    """A named stack of processes; also its own `Components` (fault steps act on its processes)."""

    backend = "local"

    def __init__(self, name: str = "default", root: Path | None = None):
        self.name, self.root = name, root
        self.state_dir = state_dir(name, root)
        self.launcher = Launcher(self.state_dir)

    @property
    def topology(self) -> Topology:
        return Topology.load(self.state_dir)

    def up(self, topology: Topology, scenario: str) -> LocalStack:
        if self.launcher.running():
            raise ConfigError(f"stack {self.name!r} is already running ({self.state_dir}); "
                              f"run `invoke down` first or pick another --stack name")
        try:
            netmap = self.launcher.start(topology)
        except BaseException:
            self.launcher.stop_all()  # Ctrl-C or a failed component: leave nothing half-up
            raise
        status = build_status(self.backend, topology, self.state_dir, scenario, endpoints(topology, netmap,
                                                                                         self.state_dir))
        (self.state_dir / "status.json").write_text(json.dumps(status, indent=2))
        return self

    def redeploy(self, topology: Topology, what: str) -> Topology:
        self.launcher.redeploy(topology, what)
        self._refresh_status()
        return topology

    def _refresh_status(self) -> None:
        """A replaced proxy or resolver binds new ports: keep status.json (what `invoke status` prints) current."""
        path = self.state_dir / "status.json"
        if path.exists():
            netmap = NetMap(**json.loads((self.state_dir / "netmap.json").read_text()))
            topology = self.topology
            scenario = json.loads(path.read_text()).get("scenario", "")
            status = build_status(self.backend, topology, self.state_dir, scenario,
                                  endpoints(topology, netmap, self.state_dir))
            path.write_text(json.dumps(status, indent=2))

    def status(self) -> Json | None:
        path = self.state_dir / "status.json"
        if not path.exists():
            return None
        status = json.loads(path.read_text())
        status["running"] = sorted(self.launcher.running())
        return status

    def logs(self) -> dict[str, str]:
        return log_files(self.state_dir)

    def down(self, purge: bool = False) -> list[str]:
        stopped = self.launcher.stop_all()
        if purge:
            self.launcher.purge()
        else:
            (self.state_dir / "status.json").unlink(missing_ok=True)
        return stopped

    def close(self) -> None:
        """The processes belong to the stack, not to this process: nothing to let go of."""

    @property
    def components(self) -> LocalStack:
        return self

    # Components: what fault steps do to processes ------------------------------------------------
    def running(self) -> dict[str, int]:
        return self.launcher.running()

    def kill(self, name: str) -> int:
        """SIGKILL the component's process group, as a node losing the pod would."""
        pid = self.launcher.running()[name]
        os.killpg(pid, signal.SIGKILL)
        self.launcher.reap(name)
        return pid

    def restart(self, name: str) -> None:
        topology = self.topology
        self.launcher.restart(topology, self.launcher.spec_for(topology, name))
        self._refresh_status()

    def stop(self, name: str) -> None:
        self.launcher.stop_one(name)


def endpoints(topology: Topology, netmap: NetMap, state: Path) -> Endpoints:
    def real(ip: str, port: int, proto: str) -> Endpoint:
        return Endpoint(LOOPBACK, netmap.bindings.get(f"{ip}:{port}/{proto}"))

    (http_ip, http_port), = topology.proxy_addresses(PROXY_HTTP_PORT)[:1]
    (h3_ip, h3_port), = topology.proxy_addresses(PROXY_H3_PORT)[:1]
    return Endpoints(proxy_http=real(http_ip, http_port, "tcp"), proxy_h3=real(h3_ip, h3_port, "udp"),
                     dns={c.name: real(c.dns_ip, DNS_PORT, "udp") for c in topology.clusters},
                     logs=log_files(state))


class LocalBackend:
    """Processes on 127.0.0.1: the default backend, with nothing but Python."""

    name = "local"

    def __init__(self, root: Path | None = None):
        self.root = root

    def up(self, topology: Topology, scenario: str) -> LocalStack:
        return self.attach(topology.stack).up(topology, scenario)

    def attach(self, stack: str) -> LocalStack:
        return LocalStack(stack, self.root)

    def interruptible(self, stack: str) -> AbstractContextManager[None]:
        return stop_on_interrupt(self.attach(stack).launcher)
