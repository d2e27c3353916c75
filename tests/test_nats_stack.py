"""The stack's real nats-server on the local backend: status, worker sign-in from the values, faults.

Each module-scoped stack is a real `up` of http-callback (nkey mode on the chart's three NATS servers, token
mode by ``--set nats.workerAuth=token`` on the scenario's one); clients here are plain nats-py clients with the credentials a
worker is handed, so the refusals are nats-server's own. The teardown fails if a process survives.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest
from nats_support import SHORT, connect, refused, run
from stack_records import Records
from test_faults import call  # the fault tests' one invocation, giving up on a failed callback
from timeouts import scaled

from clusters.local import LocalBackend, LocalStack
from clusters.local.plan import NATS_CALLOUT
from clusters.local.process import wait_exited
from scenarios.engine import run_scenario
from scenarios.faults import FaultInjector
from scenarios.load import load_scenario
from sim.nats.cluster import catch_up
from sim.nats.stack import REGION, StackKeys, mint_worker_token, worker_credentials
from sim.wire import NATS_MONITOR_PORT, NATS_PORT

VIOLATION = "Authorization Violation"
RECONNECT_TIMEOUT = scaled(15.0)  # seconds for every worker to be back after nats-server restarts
CALL_TIMEOUT = scaled(15.0)  # a sign-in to a server that is up
RECOVERY = scaled(60.0)  # seconds for NATS servers back from a kill to take work again (idle: a few)


def _up(root, name: str, sets: tuple[str, ...] = ()) -> LocalStack:  # type: ignore[no-untyped-def]
    stack = LocalStack(name, root=root)
    result = run_scenario(
        load_scenario("http-callback", sets=sets), LocalBackend(stack.root), stack.name, keep=True
    )
    assert result.ok, result
    return stack


def _down(stack: LocalStack) -> None:
    stack.down()
    assert not stack.launcher.running(), "components still running after down"


# nats-server's own auth timeout (2 s; ncpsim's default is 10 s, for thousands of workers at once): a worker
# that signs in again to a server just back, before the callout is heard there, is refused and signs in anew
# after 2 s rather than 10 (sim.model.values.AUTH_TIMEOUT).
SIGN_IN_WAIT = "nats.config.merge.authorization.timeout=2"


@pytest.fixture(scope="module")
def nkey_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    # The chart's three servers (the catalogue's http-callback runs one). The pods' publish attempt keeps
    # its 2 s (nats.jetstream.publishTimeoutSeconds): just after the servers come back, an R3 stream may take
    # over a second to commit, and a retry of a publish still in flight is refused (409, "duplicate message
    # id is in process"), so shorter attempts turn a slow success into the API's 500.
    sets = ("nats.config.cluster.enabled=true", SIGN_IN_WAIT)
    stack = _up(tmp_path_factory.mktemp("nats-nkey"), "nats-nkey", sets)
    try:
        yield stack
    finally:
        _down(stack)


@pytest.fixture(scope="module")
def token_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    # One server: no JetStream stream waits on a quorum to commit a publish, so the pods' attempt can be
    # the hostile stack's 0.5 s, and a dead bus is the API's 500 in 2.5 s rather than 8 (the outage test).
    sets = ("nats.workerAuth=token", SIGN_IN_WAIT, "nats.jetstream.publishTimeoutSeconds=0.5")
    stack = _up(tmp_path_factory.mktemp("nats-token"), "nats-token", sets)
    try:
        yield stack
    finally:
        _down(stack)


def nats_status(stack: LocalStack) -> dict:
    status = stack.status()
    assert status is not None
    return status["nats"]


def client_url(stack: LocalStack) -> str:
    nats = nats_status(stack)
    return f"nats://{nats['host']}:{nats['port']}"


def callout_log(stack: LocalStack) -> str:
    return (stack.state_dir / "logs" / f"{NATS_CALLOUT}.log").read_text(errors="replace")


def _address(monitor: str) -> tuple[str, int]:
    host, port = monitor.removeprefix("http://").split(":")
    return host, int(port)


def test_status_names_every_real_server(nkey_stack: LocalStack) -> None:
    nats = nats_status(nkey_stack)
    assert nats["url"] == f"nats://{nkey_stack.topology.bus_lb_ip}:4222"  # as workers see it
    servers = nats["servers"]
    assert [s["name"] for s in servers] == ["nats-0", "nats-1", "nats-2"]  # the StatefulSet's three pods
    assert (nats["port"], nats["monitor"]) == (servers[0]["port"], servers[0]["monitor"])  # the contract's
    assert len({s["port"] for s in servers}) == 3
    # The three formed one cluster: JetStream comes current on each (/healthz), a moment after `up`, which
    # waits only for the chart's readiness probe (js-server-only), as an operator checks it.
    monitors = {s["name"]: _address(s["monitor"]) for s in servers}
    caught_up = catch_up("nats-0", monitors, len(servers), timeout=RECOVERY)
    assert caught_up.current, caught_up.describe()
    in_ps = [
        p
        for p in os.listdir("/proc")
        if p.isdigit() and str(nkey_stack.state_dir) in _cmdline(int(p)).decode()
    ]
    assert sum(b"nats-server\x00-c" in _cmdline(int(p)) for p in in_ps) == 3  # three nats-server processes
    # Each nats-server runs in its supervisor's process group, so `ncpsim down` and SIGKILL reach it.
    for server in servers:
        supervisor = nkey_stack.launcher.running()[server["name"]]
        children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == supervisor]
        found = [p for p in children if b"nats-server" in _cmdline(p)]
        assert len(found) == 1 and os.getpgid(found[0]) == supervisor


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_nkey_mode_refuses_strangers_and_admits_the_shared_key(nkey_stack: LocalStack) -> None:
    url = client_url(nkey_stack)
    keys = StackKeys.of(nkey_stack.topology)  # from the stack's own secret, in its state folder
    stranger = StackKeys.derive("another stack's secret").worker

    async def body() -> None:
        assert VIOLATION in await refused(url)
        assert VIOLATION in await refused(url, nkeys_seed_str=stranger)
        cred = worker_credentials(keys, "nkey", "worker-x", "http-echo")
        nc, rec = await connect(url, name="shared-nkey-client", **cred.connect_kwargs)
        for function in ("http-echo", "grpc-echo"):  # the shared key reaches all of APP
            await nc.subscribe(f"rq.{REGION}.{function}.>")
        await nc.flush()
        assert rec.errors == []
        await nc.close()

    run(body())
    log = callout_log(nkey_stack)
    assert '"client_name": "shared-nkey-client", "plugin": "nkey"' in log
    assert "nkey not found in mappings" in log


def guessable_keys(topology_seed: int) -> list[StackKeys]:
    """Keys an attacker on the machine could derive: from the stack's published seed, from every seed the
    catalogue and the code use, and from none; as the stack derived them before it had a secret, and as
    StackKeys.derive would from each of them now."""
    from scenarios.load import load_scenario
    from scenarios.lookup import catalogue

    seeds = {
        topology_seed,
        0,
        1,
        7,
        42,
        1234,
        *(load_scenario(n, allow_expected_error=True).seed for n, _ in catalogue()),
    }
    return [StackKeys.derive(text) for s in sorted(seeds) for text in (f"seed:{s}", str(s))] + [
        StackKeys.derive("")
    ]


def test_keys_derived_from_any_seed_or_none_are_refused(nkey_stack: LocalStack) -> None:
    """Issue 31: the stack's NATS keys come from its own OS randomness, not from a seed anybody can read: a
    local process signing in as the API, a pod or a worker with a key derived from a seed is refused."""
    url = client_url(nkey_stack)
    guesses = guessable_keys(nkey_stack.topology.seed)

    async def body() -> None:
        for keys in guesses:
            for seed in (keys.worker, *keys.internal.values(), keys.callout_user):
                assert VIOLATION in await refused(url, nkeys_seed_str=seed), seed
        # The control: the stack's own keys (read from its state folder) sign in.
        nc, rec = await connect(url, nkeys_seed_str=StackKeys.of(nkey_stack.topology).internal["nvcf-api"])
        await nc.flush()
        assert rec.errors == []
        await nc.close()

    run(body())
    secret = nkey_stack.state_dir / "certs" / "stack.secret"
    assert oct(secret.stat().st_mode & 0o777) == "0o600" and len(secret.read_text().strip()) == 64


def test_token_mode_scopes_a_worker_to_its_function(token_stack: LocalStack) -> None:
    url = client_url(token_stack)
    keys = StackKeys.of(token_stack.topology)

    async def body() -> None:
        assert VIOLATION in await refused(url)
        assert VIOLATION in await refused(url, nkeys_seed_str=StackKeys.derive("seed:1234").worker)
        forged = worker_credentials(StackKeys.derive("seed:1234"), "token", "worker-1-0", "http-echo")
        assert VIOLATION in await refused(url, **forged.connect_kwargs)
        old = worker_credentials(keys, "token", "worker-1-0", "http-echo", reads_account=False)
        assert VIOLATION in await refused(url, **old.connect_kwargs)
        cred = worker_credentials(keys, "token", "worker-1-0", "http-echo")
        nc, rec = await connect(url, name="token-client", **cred.connect_kwargs)
        await nc.subscribe(f"rq.{REGION}.http-echo.>")
        await nc.flush()
        assert rec.errors == []
        await nc.subscribe(f"rq.{REGION}.grpc-echo.>")
        await rec.wait_for(f'permissions violation for subscription to "rq.{REGION}.grpc-echo.>"')
        await nc.close()

    run(body())
    log = callout_log(token_stack)
    assert '"client_name": "token-client", "plugin": "webhook", "user_id": "worker-http-echo"' in log
    assert "plugin webhook not found for account Worker" in log
    assert 'Authentication denied {"status_code": 403}' in log
    assert mint_worker_token(keys, "worker-1-0", "http-echo") not in log  # tokens are never logged


def _call_ok(stack: LocalStack) -> None:
    result = call(stack)
    assert result.status == 200, result


def _answered_after_restart(stack: LocalStack) -> None:
    """NATS servers back from a kill elect each stream's and consumer's leader anew, a moment after they
    are current (several on a loaded machine). The outage ends at the first invocation answered, as a
    client retrying would see it: the API's 500 while no stream leader takes the publish (nothing else),
    then a request its worker answers once the consumer has a leader (the 202 polled until then)."""
    deadline = time.monotonic() + RECOVERY
    while (answered := call(stack, timeout=max(1.0, deadline - time.monotonic()))).status == 500:
        assert time.monotonic() < deadline, answered
    assert answered.status == 200, answered


def test_workers_reconnect_after_every_nats_server_is_killed_and_restarted(nkey_stack: LocalStack) -> None:
    faults = FaultInjector(nkey_stack, random.Random(1))
    workers = [w.name for w in nkey_stack.topology.workers]
    servers = nkey_stack.topology.members("nats")
    records = Records(nkey_stack.state_dir)
    for server in servers:
        assert f"SIGKILL {server}" in faults.apply({"kill": server})
    assert not set(servers) & set(nkey_stack.launcher.running())
    for worker in workers:
        records.event("worker.nats.disconnected", worker=worker)
    # The StatefulSet brings its pods back together (Parallel pod management), as the kubelet restarts
    # killed containers: restarted one by one, a server would campaign alone and the second one's first
    # election could wait out nats-server's 4-9 s timeout.
    said = faults.apply({"scale": {"role": "nats", "replicas": len(servers)}})
    assert f"JetStream current on the {len(servers)} running servers" in said
    for worker in workers:  # its pulls start again, whether nats-py reconnected or the worker signed in anew
        records.event("worker.work.pulling", worker=worker, function="http-echo", timeout=RECONNECT_TIMEOUT)
    _answered_after_restart(nkey_stack)


def test_new_logins_need_the_callout_running_ones_do_not(nkey_stack: LocalStack) -> None:
    faults = FaultInjector(nkey_stack, random.Random(1))
    url = client_url(nkey_stack)
    cred = worker_credentials(StackKeys.of(nkey_stack.topology), "nkey", "w", "http-echo")
    faults.apply({"kill": NATS_CALLOUT})
    _call_ok(nkey_stack)  # connected workers keep working without the callout
    with pytest.raises(
        nats.errors.Error
    ):  # the server holds the sign-in, then refuses it at its auth timeout
        run(_login(url, cred.connect_kwargs))
    faults.apply({"restart": NATS_CALLOUT})
    run(_login(url, cred.connect_kwargs))


async def _login(url: str, kwargs: dict) -> None:
    nc, _ = await asyncio.wait_for(connect(url, **kwargs), CALL_TIMEOUT)
    await nc.close()


def test_scaling_nats_to_zero_is_a_full_outage_until_it_scales_back(token_stack: LocalStack) -> None:
    """The seed: scaling the NATS StatefulSet to zero is a full outage; scaling it back ends it. On the
    one-server stack, whose pods give up a publish sooner; three servers coming back together, the last
    waiting for a majority, are test_workers_reconnect_after_every_nats_server_is_killed_and_restarted's."""
    faults = FaultInjector(token_stack, random.Random(1))
    said = faults.apply({"scale": {"role": "nats", "replicas": 0}})
    assert said == "scaled nats to 0 of 1 replicas"
    assert "nats-0" not in token_stack.launcher.running()
    assert call(token_stack).status == 500  # the API could not publish the work: no server to take it
    said = faults.apply({"scale": {"role": "nats", "replicas": 1}})
    assert "JetStream current on the 1 running servers" in said
    _answered_after_restart(token_stack)  # workers sign in again through the callout


def test_a_sigkilled_supervisor_is_told_and_its_orphan_replaced(nkey_stack: LocalStack) -> None:
    """Issue 31: `kill -9` of a NATS server's supervisor leaves its nats-server running on: status names it,
    and `fault restart` stops it and starts the server anew (it used to report success and fail on the ports)."""
    supervisor = nkey_stack.launcher.running()["nats-0"]
    os.kill(supervisor, signal.SIGKILL)
    assert wait_exited(supervisor, SHORT)
    status = nkey_stack.status()
    assert status is not None and "nats-0" in status["down"]
    (orphan,) = status["orphans"]["nats-0"]
    assert b"nats-server" in _cmdline(orphan)
    said = FaultInjector(nkey_stack, random.Random(1)).apply({"restart": "nats-0"})
    assert said.startswith("restarted nats-0")
    assert not Path(f"/proc/{orphan}").exists() or b"nats-server" not in _cmdline(orphan)
    after = nkey_stack.status()
    assert after is not None and "nats-0" in after["running"] and "orphans" not in after
    _answered_after_restart(nkey_stack)  # the streams and consumers nats-0 led elect anew


def _bound(stack: LocalStack, address: str) -> int:
    """The real port the network map binds a pod's port (its network-map key) to."""
    return int(json.loads((stack.state_dir / "netmap.json").read_text())["bindings"][address])


def test_a_server_back_on_a_taken_monitor_port_keeps_the_client_port_its_workers_reconnect_to(
    token_stack: LocalStack,
) -> None:
    """Seen on a loaded machine: while nats-0 was stopped, another process's socket took its freed monitor
    port; it came back on three new ports, and its workers, reconnecting to the client port they first
    dialed (nats-py keeps the real address), never found it (no pull for 40 s). The port taken is the
    monitor's here; the server keeps its client port, and every worker pulls again."""
    pod = token_stack.topology.nats_server("nats-0")
    client, monitor = (_bound(token_stack, pod.address(port)) for port in (NATS_PORT, NATS_MONITOR_PORT))
    faults = FaultInjector(token_stack, random.Random(1))
    faults.apply({"stop": "nats-0"})
    records = Records(token_stack.state_dir)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", monitor))
        squatter.listen()
        assert "JetStream current" in faults.apply({"start": "nats-0"})
        taken = records.event("nats.port_taken")
    assert "address already in use" in taken["error"], taken
    assert _bound(token_stack, pod.address(NATS_PORT)) == client
    assert _bound(token_stack, pod.address(NATS_MONITOR_PORT)) != monitor
    for worker in token_stack.topology.workers:
        records.event(
            "worker.work.pulling", worker=worker.name, function="http-echo", timeout=RECONNECT_TIMEOUT
        )
    _answered_after_restart(token_stack)
