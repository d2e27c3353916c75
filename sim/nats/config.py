"""nats-server configuration, rendered from a small value (pure).

Why it looks like this (public NVCF chart ``deploy/helm/nats``, nats-server docs):

- Two accounts: ``AUTH`` holds only the auth callout service's own user; ``APP`` has
  JetStream and is where workers, invocation-service and grpc-proxy live.
- ``callout`` on (the public chart's way, whatever ``nats.workerAuth`` says): every
  login except ``auth_users`` is sent to the callout on ``$SYS.REQ.USER.AUTH``; the
  callout maps the shared worker NKey to APP (nkey mode) and also checks tokens
  through the webhook (token mode). The server's config is the same in both modes;
  only the callout's plugins differ. ``auth_users`` may name users of any account,
  so internal publishers in APP can bypass the callout (checked on 2.15.1).
- ``callout`` off (nkey mode only): the server checks the shared worker NKey
  itself; no callout process is needed, and refusals are the server's own.
- Port 0 means "let the server choose" (rendered ``-1``); the chosen ports are
  then read from the ports file written into ``ports_file_dir``.
- ``cluster`` (the nats chart's ``config.cluster``, upstream nats-io chart): the StatefulSet's servers
  route to each other; every server lists every route, its own included, as the chart renders them, and
  ``no_advertise`` keeps the servers from telling clients each other's addresses (clients reach them
  through the load balancer). JetStream needs the routes at start-up: it sizes its meta group by them.
- ``pid_file`` and the lame duck (upstream nats chart): the pod's preStop hook is
  ``nats-server --signal ldm=<pid file>``. In lame duck mode the server hands every Raft leadership it
  holds (meta, streams, consumers) to a peer and waits 1 s, shuts JetStream down, and after the grace
  period closes its clients one by one (at most 1 s apart, spread over the duration), so they reconnect to
  the others; a SIGTERM meanwhile is ignored. The chart's duration is 30 s (nats-server's minimum) with a
  10 s grace period, which is there for several servers entering lame duck together, so that their clients
  do not reconnect to each other; a rolling restart stops one at a time, and ncpsim's grace period is
  0.1 s (LAME_DUCK_GRACE), so a stopping server is gone a second or two after the signal rather than ten.
  Neither gives a server restarted just before time to catch up (the leaderships go at once, JetStream a
  second later): ncpsim's rollout waits for that explicitly (sim.nats.cluster).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

AUTH_ACCOUNT = "AUTH"
APP_ACCOUNT = "APP"
WorkerAuth = Literal["nkey", "token"]
LAME_DUCK_DURATION = 30.0  # seconds, the chart's lame_duck_duration (and nats-server's minimum)
LAME_DUCK_GRACE = 0.1  # seconds; the chart has 10 s (see above; nats-server reads 0 as its default, 10 s)


class ConfigError(ValueError):
    """A combination of values nats-server (or the stack) cannot run with."""


@dataclass(frozen=True)
class NkeyUser:
    """A statically configured APP user, named for the config's comments only."""

    name: str
    nkey: str


@dataclass(frozen=True)
class CalloutBlock:
    """The ``auth_callout`` values: who signs answers and who connects as the callout."""

    issuer: str  # public account nkey (A...) whose seed signs the callout's answers
    user: str  # public user nkey (U...) the callout service connects with


@dataclass(frozen=True)
class ClusterBlock:
    """The ``cluster`` values: the cluster's name, this server's route port, every server's route port."""

    routes: tuple[int, ...]
    port: int = 0  # this server's route listener (0: chosen by the server, read from its ports file)
    name: str = "nats"  # the StatefulSet's name, as the chart names the cluster


@dataclass(frozen=True)
class ServerConfig:
    store_dir: str
    worker_auth: WorkerAuth = "nkey"
    callout: CalloutBlock | None = None
    worker_nkey: str = ""  # shared worker NKey; rendered only when the callout is off
    internal_users: tuple[NkeyUser, ...] = ()
    host: str = "127.0.0.1"
    port: int = 0
    monitor_port: int = 0
    server_name: str = "ncpsim-nats"
    auth_timeout: float = 2.0  # seconds a login (callout answer included) may take
    ports_file_dir: str = ""
    cluster: ClusterBlock | None = None
    max_file_store: int = 1 << 30
    max_memory_store: int = 256 << 20
    # nats-server rotates its own log at this size and keeps this many old ones: a login storm (every
    # refused worker retries) cannot fill the disk, as the proxy's access log and the events cannot either
    logfile_size_limit: int = 64 << 20
    logfile_max_num: int = 2
    pid_file: str = ""  # where the preStop hook finds the server (`nats-server --signal ldm=<pid file>`)
    lame_duck_duration: float = LAME_DUCK_DURATION
    lame_duck_grace_period: float = LAME_DUCK_GRACE
    # seconds between the server's PINGs (0: nats-server's 2 min); a new client's first PING comes after the
    # lesser of this and 2 s, which a test of a sign-in slower than that PING may bring forward
    ping_interval: float = 0.0


def validate(config: ServerConfig) -> None:
    """Raise ConfigError naming the field and the fix."""
    if config.worker_auth not in ("nkey", "token"):
        raise ConfigError("nats.workerAuth must be nkey or token")
    if config.worker_auth == "token" and config.callout is None:
        raise ConfigError("worker_auth token needs the auth callout: set callout")
    if config.callout is None and not config.worker_nkey:
        raise ConfigError("worker_auth nkey without the callout needs worker_nkey")
    if config.callout is not None and config.worker_nkey:
        raise ConfigError(
            "with the callout on, the worker NKey belongs in the callout's mappings, not worker_nkey"
        )
    if config.callout is not None:
        _check_key("callout.issuer", config.callout.issuer, "A")
        _check_key("callout.user", config.callout.user, "U")
    if config.worker_nkey:
        _check_key("worker_nkey", config.worker_nkey, "U")
    for user in config.internal_users:
        _check_key(f"internal_users[{user.name}]", user.nkey, "U")
    _check_ports(config)
    if config.auth_timeout <= 0:
        raise ConfigError("auth_timeout must be positive")
    if not 0 <= config.lame_duck_grace_period < config.lame_duck_duration:  # nats-server's own rule
        raise ConfigError(
            f"lame duck grace period ({_duration(config.lame_duck_grace_period)}) should be strictly lower "
            f"than lame duck duration ({_duration(config.lame_duck_duration)})"
        )


def _check_ports(config: ServerConfig) -> None:
    ports = [("port", config.port), ("monitor_port", config.monitor_port)]
    if config.cluster is not None:
        if not config.cluster.routes or not all(0 < route <= 65535 for route in config.cluster.routes):
            raise ConfigError(
                "a clustered server needs every server's route port (JetStream sizes its meta group by them)"
            )
        ports.append(("cluster.port", config.cluster.port))
    for name, port in ports:
        if not 0 <= port <= 65535:
            raise ConfigError(f"{name} {port} is out of range")
    if any(port == 0 for _, port in ports) and not config.ports_file_dir:
        raise ConfigError("port 0 needs ports_file_dir, where the server says what it chose")


def _check_key(field: str, key: str, prefix: str) -> None:
    if len(key) != 56 or not key.startswith(prefix) or not key.isalnum() or not key.isupper():
        raise ConfigError(f"{field} must be a public nkey starting with {prefix!r}, got {key!r}")


def _q(text: str) -> str:
    """Quote a string for the nats config format (JSON string syntax is accepted)."""
    return json.dumps(text)


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def _port(port: int) -> int:
    return -1 if port == 0 else port


def render(config: ServerConfig) -> str:
    """The nats-server config file text for ``config``."""
    validate(config)
    lines = [
        f"server_name: {_q(config.server_name)}",
        f"listen: {_q(f'{config.host}:{_port(config.port)}')}",
        f"http: {_q(f'{config.host}:{_port(config.monitor_port)}')}",
    ]
    if config.ports_file_dir:
        lines.append(f"ports_file_dir: {_q(config.ports_file_dir)}")
    if config.pid_file:
        lines.append(f"pid_file: {_q(config.pid_file)}")
    lines += [
        f"logfile_size_limit: {config.logfile_size_limit}",
        f"logfile_max_num: {config.logfile_max_num}",
        f"lame_duck_duration: {_q(_duration(config.lame_duck_duration))}",
        f"lame_duck_grace_period: {_q(_duration(config.lame_duck_grace_period))}",
    ]
    if config.ping_interval:
        lines.append(f"ping_interval: {_q(_duration(config.ping_interval))}")
    if config.cluster is not None:
        routes = ", ".join(_q(f"nats://{config.host}:{port}") for port in config.cluster.routes)
        lines += [
            "cluster {",
            f"  name: {_q(config.cluster.name)}",
            f"  listen: {_q(f'{config.host}:{_port(config.cluster.port)}')}",
            "  no_advertise: true",
            f"  routes: [ {routes} ]",
            "}",
        ]
    lines += [
        "jetstream {",
        f"  store_dir: {_q(config.store_dir)}",
        f"  max_file_store: {config.max_file_store}",
        f"  max_memory_store: {config.max_memory_store}",
        "}",
        "accounts {",
    ]
    if config.callout is not None:
        lines.append(f"  {AUTH_ACCOUNT} {{ users: [ {{ nkey: {_q(config.callout.user)} }} ] }}")
    app_users = [(u.name, u.nkey) for u in config.internal_users]
    if config.callout is None:
        app_users.append(("shared worker", config.worker_nkey))
    lines.append(f"  {APP_ACCOUNT} {{")
    lines.append("    jetstream: enabled")
    lines.append("    users: [")
    lines += [f"      {{ nkey: {_q(nkey)} }}  # {name}" for name, nkey in app_users]
    lines += ["    ]", "  }", "}", "authorization {", f"  timeout: {config.auth_timeout:g}"]
    if config.callout is not None:
        bypass = [config.callout.user] + [u.nkey for u in config.internal_users]
        lines += [
            "  auth_callout {",
            f"    issuer: {_q(config.callout.issuer)}",
            f"    account: {AUTH_ACCOUNT}",
            f"    auth_users: [ {', '.join(_q(k) for k in bypass)} ]",
            "  }",
        ]
    lines.append("}")
    return "\n".join(lines) + "\n"
