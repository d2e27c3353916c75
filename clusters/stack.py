"""A named stack on the local backend: its state folder, its processes, and the status contract."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from clusters.local import Launcher
from sim.errors import ConfigError
from sim.model.netmap import NetMap
from sim.model.topology import Topology
from sim.model.values import proxy_settings
from sim.protocols.wire import PROXY_H3_PORT, PROXY_HTTP_PORT

STACK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")


def state_root() -> Path:
    return Path(os.environ.get("NCPSIM_HOME", Path.cwd() / ".ncpsim"))


def state_dir(stack: str, root: Path | None = None) -> Path:
    if not STACK_NAME.match(stack):
        raise ConfigError(f"stack name {stack!r}: use lower-case letters, digits and dashes (at most 40)")
    return (root or state_root()) / stack


class LocalStack:
    def __init__(self, name: str = "default", root: Path | None = None):
        self.name = name
        self.state_dir = state_dir(name, root)
        self.launcher = Launcher(self.state_dir)

    def up(self, topology: Topology, scenario: str) -> dict[str, Any]:
        if self.launcher.running():
            raise ConfigError(f"stack {self.name!r} is already running ({self.state_dir}); "
                              f"run `invoke down` first or pick another --stack name")
        try:
            netmap = self.launcher.start(topology)
        except BaseException:
            self.launcher.stop_all()  # Ctrl-C or a failed component: leave nothing half-up
            raise
        status = build_status(topology, netmap, self.state_dir, scenario)
        (self.state_dir / "status.json").write_text(json.dumps(status, indent=2))
        return status

    def down(self, purge: bool = False) -> list[str]:
        stopped = self.launcher.stop_all()
        if purge:
            self.launcher.purge()
        else:
            (self.state_dir / "status.json").unlink(missing_ok=True)
        return stopped

    def status(self) -> dict[str, Any] | None:
        path = self.state_dir / "status.json"
        if not path.exists():
            return None
        status = json.loads(path.read_text())
        status["running"] = sorted(self.launcher.running())
        return status

    def topology(self) -> Topology:
        return Topology.load(self.state_dir)


def build_status(topology: Topology, netmap: NetMap, state: Path, scenario: str) -> dict[str, Any]:
    """The `invoke status --json` contract of DESIGN.md section 5."""
    wd = topology.worker_domain
    lb = topology.proxy_lb_ip

    def real(ip: str, port: int, proto: str) -> int | None:
        return netmap.bindings.get(f"{ip}:{port}/{proto}")

    # The pod targets workers are handed: the worker TLS port unless upstreamTls is off (DESIGN.md section 1).
    worker_port = 8443 if proxy_settings(topology.values).upstream_tls else 8080
    pods = [{"name": p.name, "role": p.role, "cluster": p.cluster, "ip": p.ip,
             "target": (f"http://{p.fqdn}:{worker_port}" if p.role == "invocation"
                        else f"https://{p.fqdn.split('.')[0]}.{wd}")}
            for p in topology.pods]
    logs = {path.stem: str(path) for path in sorted((state / "logs").glob("*.log"))}
    return {
        "backend": "local",
        "stack": topology.stack,
        "scenario": scenario,
        "workerDomain": wd,
        "stateDir": str(state),
        "proxy": {
            "http": {"host": "127.0.0.1", "port": real(lb, PROXY_HTTP_PORT, "tcp"), "name": f"invocation.{wd}",
                     "url": f"https://invocation.{wd}:{PROXY_HTTP_PORT}"},
            "h3": {"host": "127.0.0.1", "port": real(lb, PROXY_H3_PORT, "udp"), "name": f"*.{wd}",
                   "url": f"https://<dashed-pod-ip>.{wd}"},
        },
        "dns": {c.name: {"host": "127.0.0.1", "port": real(c.dns_ip, 53, "udp")} for c in topology.clusters},
        "ca": {"stack": str(state / "certs" / "ca" / "stack" / "ca.crt"),
               "public": str(state / "certs" / "ca" / "public" / "ca.crt")},
        "pods": pods,
        "logs": logs,
        "events": str(state / "events"),
    }
