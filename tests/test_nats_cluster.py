"""NATS as the chart's StatefulSet: three nats-servers routed to each other, R3 work streams, a rolling restart
that keeps quorum, and the outage of losing a majority.

The pure parts from tables (values, topology, config, network map, client order, catch-up, the preStop
hook's pid check); then the two catalogue scenarios on real stacks, with the servers' own events read
back: during the rollout never more than one server is down at a time, and the same reading of the
quorum-lost scenario (two down at once, the invocations refused) is the negative control that shows the
reading can tell them apart. Each rolled server went through lame duck (the chart's preStop hook), read
from its own log, where the same server's stop at the end (`down`, no preStop) is the negative control.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats.aio.client
import pytest
from cases_support import Cases, asked, cases

from clusters.local.launcher import Launcher
from scenarios.load import load_scenario
from scenarios.replay import replay_one
from scenarios.result import ScenarioResult
from sim.errors import ConfigError
from sim.model.events import read_events
from sim.model.netmap import NetMap, Refused, Unreachable
from sim.model.parts import NATS_ROLE
from sim.model.topology import build
from sim.model.values import NatsValues, deep_merge, nats_replicas
from sim.model.values_check import check
from sim.nats.client import INFO_READ, inbox_generator, new_client, spread
from sim.nats.cluster import Group, Reading, behind, catch_up, groups, quorum
from sim.nats.config import ClusterBlock, ServerConfig, render
from sim.nats.config import ConfigError as NatsConfigError
from sim.nats.server import lame_duck
from sim.nats.stack import StackKeys, server_config

WD = {"workerCallbackProxy": {"workerDomain": "w.example.com"}}


def cluster(**values: Any) -> dict[str, Any]:
    return {"nats": {"config": {"cluster": values}}}


def sign_in_wait(seconds: Any) -> dict[str, Any]:  # the nats servers' auth timeout
    return {"nats": {"config": {"merge": {"authorization": {"timeout": seconds}}}}}


def publish_attempt(seconds: Any) -> dict[str, Any]:
    return {"nats": {"jetstream": {"publishTimeoutSeconds": seconds}}}


@pytest.mark.parametrize(
    ("values", "servers"),
    [({}, 3), (cluster(replicas=5), 5), (cluster(enabled=False), 1), (cluster(enabled=False, replicas=1), 1)],
)
def test_the_statefulset_has_the_replicas_the_values_give(values: dict[str, Any], servers: int) -> None:
    assert nats_replicas(values) == servers
    topology = build("t", {**WD, **values})
    assert topology.members(NATS_ROLE) == [f"nats-{i}" for i in range(servers)]
    assert len({s.ip for s in topology.nats_servers}) == servers
    lb = topology.service_endpoints()[f"{topology.bus_lb_ip}:4222/tcp"]  # the load balancer fronts each
    assert lb == [s.address(4222) for s in topology.nats_servers]
    assert topology.reserved_addresses() == (
        [s.address(6222) for s in topology.nats_servers] if servers > 1 else []
    )


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (cluster(replicas=1), "nats.config.cluster.replicas: must be 2 or higher when jetstream is enabled"),
        (cluster(replicas="three"), "nats.config.cluster.replicas: must be a whole number"),
        (cluster(replicas=9), "ncpsim runs at most 5 NATS servers"),
        (cluster(enabled="yes"), "nats.config.cluster.enabled: must be true or false"),
        (
            sign_in_wait(0),
            "nats.config.merge.authorization.timeout: must be a positive number of seconds, found 0",
        ),
        (
            sign_in_wait("2s"),
            "nats.config.merge.authorization.timeout: must be a positive number of seconds, found the",
        ),
        (
            publish_attempt(True),
            "nats.jetstream.publishTimeoutSeconds: must be a positive number of seconds, found a",
        ),
    ],
)
def test_values_a_cluster_cannot_run_with_are_refused(values: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError) as err:
        check(values)
    assert error in str(err.value)


@pytest.mark.parametrize(
    ("values", "auth", "publish"),
    [
        ({}, 10.0, 2.0),  # ncpsim's sign-in wait (nats-server's default is 2 s), the pods' publish attempt
        (deep_merge(sign_in_wait(2), publish_attempt(0.5)), 2.0, 0.5),
    ],
)
def test_the_nats_schedules_a_stack_may_be_given(values: dict[str, Any], auth: float, publish: float) -> None:
    check(values)
    nats = NatsValues.from_values(values)
    assert (nats.auth_timeout, nats.publish_timeout) == (auth, publish)
    config = server_config(StackKeys.derive("s"), "/js", 4222, 8222, auth_timeout=nats.auth_timeout)
    assert f"  timeout: {auth:g}" in render(config).splitlines()  # the servers' authorization block


def test_a_clustered_config_routes_to_every_server_and_advertises_none() -> None:
    config = ServerConfig(
        store_dir="/js",
        worker_nkey="U" + "A" * 55,
        port=4001,
        monitor_port=8001,
        server_name="nats-1",
        cluster=ClusterBlock((6000, 6001, 6002), port=6001),
    )
    text = render(config)
    assert 'server_name: "nats-1"' in text
    assert 'listen: "127.0.0.1:6001"' in text and "no_advertise: true" in text
    assert 'routes: [ "nats://127.0.0.1:6000", "nats://127.0.0.1:6001", "nats://127.0.0.1:6002" ]' in text
    assert "cluster {" not in render(
        ServerConfig(store_dir="/js", worker_nkey="U" + "A" * 55, ports_file_dir="/d")
    )
    with pytest.raises(ValueError, match="every server's route port"):
        render(
            ServerConfig(
                store_dir="/js", worker_nkey="U" + "A" * 55, port=1, monitor_port=2, cluster=ClusterBlock(())
            )
        )


def test_a_client_gets_every_bound_server_behind_the_load_balancer() -> None:
    lb, pods = "10.100.0.11:4222/tcp", ["10.42.2.10:4222/tcp", "10.42.2.11:4222/tcp", "10.42.2.12:4222/tcp"]
    netmap = NetMap({pods[0]: 4000, pods[2]: 4002}, {"compute": ["10.100.0.0/24"]}, {lb: pods})
    assert netmap.lookup_all("compute", "10.100.0.11", 4222) == [("127.0.0.1", 4000), ("127.0.0.1", 4002)]
    with pytest.raises(Unreachable):  # a compute cluster reaches the load balancer, never a pod
        netmap.lookup_all("compute", "10.42.2.10", 4222)
    with pytest.raises(Refused):
        NetMap({}, {"compute": ["10.100.0.0/24"]}, {lb: pods}).lookup_all("compute", "10.100.0.11", 4222)


@pytest.mark.parametrize(
    ("settings", "lines"),
    [
        ({}, ['lame_duck_duration: "30000ms"', 'lame_duck_grace_period: "100ms"']),  # the chart's 30 s
        ({"pid_file": "/p/nats.pid"}, ['pid_file: "/p/nats.pid"']),  # where its preStop hook signals
        ({"lame_duck_duration": 40.0, "lame_duck_grace_period": 10.0}, ['lame_duck_grace_period: "10000ms"']),
    ],
)
def test_a_server_config_carries_what_the_charts_prestop_hook_needs(
    settings: dict[str, Any], lines: list[str]
) -> None:
    text = render(ServerConfig(store_dir="/js", worker_nkey="U" + "A" * 55, ports_file_dir="/d", **settings))
    assert all(line in text.splitlines() for line in lines)
    assert ("pid_file" in text) == ("pid_file" in settings)


def test_a_grace_period_as_long_as_the_lame_duck_is_refused_in_nats_servers_words() -> None:
    config = ServerConfig(
        store_dir="/js", worker_nkey="U" + "A" * 55, ports_file_dir="/d", lame_duck_grace_period=30.0
    )
    with pytest.raises(NatsConfigError, match=r"lame duck grace period \(30000ms\) should be strictly lower"):
        render(config)


@pytest.mark.parametrize(
    ("content", "group"),
    [
        (None, 1),  # no pid file: the server never started
        ("not a pid", 1),
        (str(2**22 + 1), 1),  # a pid no process has
        ("MINE", "OTHER"),  # a pid of another process group: a stale file from the pod's earlier life
    ],
)
def test_the_prestop_hook_signals_only_a_server_of_its_own_pod(
    tmp_path: Path, content: str | None, group: int | str
) -> None:
    pid_file = tmp_path / "nats.pid"
    if content is not None:
        pid_file.write_text(str(os.getpid()) if content == "MINE" else content)
    other = os.getpgid(0) + 1 if group == "OTHER" else int(group)
    assert lame_duck(pid_file, other) is None  # nothing signalled (this test process would get SIGUSR2)


@pytest.mark.parametrize(("name", "first"), [("a", "s0"), ("worker-1-0", "s2"), ("nvcf-api", "s1")])
def test_clients_spread_over_the_servers_the_same_way_each_run(name: str, first: str) -> None:
    servers = ["s0", "s1", "s2"]
    order = spread(servers, name)
    assert sorted(order) == servers and order[0] == first
    assert order == [*servers[servers.index(first) :], *servers[: servers.index(first)]]
    assert spread([], name) == []


@pytest.mark.parametrize(("servers", "needed"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_quorum_is_a_majority(servers: int, needed: int) -> None:
    assert quorum(servers) == needed


STREAM = "stream 'APP > rq_ncpsim_http-echo'"
CONSUMER = "consumer 'APP > rq_ncpsim_http-echo > rq_ncpsim_http-echo_workers'"
# /jsz?streams=true&consumers=true from nats-2 (2.15.1) leading both groups of one function, trimmed
JSZ = {
    "meta_cluster": {"leader": "nats-2", "replicas": [{"name": "nats-0", "current": True}]},
    "account_details": [
        {
            "name": "APP",
            "stream_detail": [
                {
                    "name": "rq_ncpsim_http-echo",
                    "cluster": {
                        "leader": "nats-2",
                        "replicas": [
                            {"name": "nats-0", "current": True},
                            {"name": "nats-1", "current": False},
                        ],
                    },
                    "consumer_detail": [
                        {"name": "rq_ncpsim_http-echo_workers", "cluster": {"leader": "nats-2"}}
                    ],
                }
            ],
        }
    ],
}


def test_groups_reads_the_meta_group_each_stream_and_each_consumer_from_jsz() -> None:
    assert groups(JSZ) == (
        Group("meta", "nats-2", {"nats-0": True}),
        Group(STREAM, "nats-2", {"nats-0": True, "nats-1": False}),
        Group(CONSUMER, "nats-2", {}),
    )
    assert groups({}) == ()  # JetStream not up yet: nothing to read


def led(server: str, *members: str, behind_: tuple[str, ...] = ()) -> Reading:
    return Reading("", (Group(STREAM, server, {m: m not in behind_ for m in members}),))


def follows(leader: str) -> Reading:
    return Reading("", (Group(STREAM, leader, {leader: True}),))


@pytest.mark.parametrize(
    ("readings", "said"),
    [
        ({"nats-1": led("nats-1", "nats-2"), "nats-2": follows("nats-1")}, []),
        # the restarted server reads healthy but its leader has not heard it catch up: the handover would miss
        (
            {"nats-1": led("nats-1", "nats-2", behind_=("nats-2",)), "nats-2": follows("")},
            [f"{STREAM}: nats-2 not caught up with its leader nats-1"],
        ),
        # a member that is not running (nats-0, stopped) is not waited for
        ({"nats-1": led("nats-1", "nats-0", "nats-2", behind_=("nats-0",)), "nats-2": follows("nats-1")}, []),
        # the leader the others name is not among the running: an election is due
        (
            {"nats-1": follows("nats-0"), "nats-2": follows("nats-0")},
            [f"{STREAM}: no leader among the running servers"],
        ),
        (
            {
                "nats-1": led("nats-1", "nats-2"),
                "nats-2": Reading("JetStream is still recovering meta layer"),
            },
            ["nats-2: JetStream is still recovering meta layer"],
        ),
    ],
)
def test_behind_names_what_keeps_jetstream_from_being_current(
    readings: dict[str, Reading], said: list[str]
) -> None:
    assert behind(readings) == said


def test_catch_up_waits_for_every_running_server_and_not_without_quorum() -> None:
    current = {"nats-1": led("nats-1", "nats-2"), "nats-2": follows("nats-1")}
    answers = {
        ("h", 1): [
            Reading("JetStream is not current with the meta leader"),
            led("nats-1", "nats-2", behind_=("nats-2",)),
            current["nats-1"],
        ],
        ("h", 2): [follows(""), current["nats-2"]],
    }
    asked: list[tuple[str, int]] = []

    def probe(host: str, port: int) -> Reading:
        asked.append((host, port))
        queue = answers[(host, port)]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    done = catch_up("nats-2", {"nats-1": ("h", 1), "nats-2": ("h", 2)}, 3, probe=probe)
    assert (
        done.current is True
        and asked.count(("h", 2)) == 3
        and "current on the 2 running servers" in done.describe()
    )
    alone = catch_up("nats-1", {"nats-1": ("h", 1)}, 3, probe=probe)
    assert alone.current is None and "no quorum" in alone.describe() and "1 of 3" in alone.describe()
    lagging = {("h", 1): led("nats-1", "nats-2", behind_=("nats-2",)), ("h", 2): follows("nats-1")}
    stuck = catch_up(
        "nats-2", {"nats-1": ("h", 1), "nats-2": ("h", 2)}, 3, timeout=0.05, probe=lambda h, p: lagging[h, p]
    )
    assert stuck.current is False and stuck.describe().endswith(
        f"after 0 s: {STREAM}: nats-2 not caught up with its leader nats-1"
    )
    assert catch_up("nats-0", {"nats-0": ("h", 1)}, 1, probe=probe).current is True


# -- on real stacks --------------------------------------------------------------------------------------
def most_down_at_once(events: list[dict[str, Any]], since: float) -> int:
    """The most NATS servers down at the same moment after ``since``, from each server's own events: down
    from ``nats.stopped`` until its next ``nats.ready``."""
    changes = sorted(
        (e["ts"], 1 if e["kind"] == "nats.stopped" else -1)
        for e in events
        if e["kind"] in ("nats.stopped", "nats.ready") and e["ts"] >= since
    )
    down = most = 0
    for _, change in changes:
        down = max(down + change, 0)  # a server's first ready (the launch) downs nothing
        most = max(most, down)
    return most


Replayed = tuple[ScenarioResult, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def replays(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cases[str, Replayed]]:
    """Each catalogue scenario this run's tests ask for, replayed once on a fresh stack (stopped after, as
    `ncpsim replay` does), both at once: each mostly waits on its servers' lame ducks, elections and the
    API's publish attempts, not on the CPU (cases_support)."""
    root = tmp_path_factory.mktemp("nats-replays")

    def run(name: str) -> Replayed:
        result = replay_one(load_scenario(name), root=root)
        assert result.status is not None, "\n".join(result.failures)
        return result, read_events(Path(result.status["stateDir"]))

    with cases(run, [str(n) for n in asked(request, "scenario")], "nats-replay") as held:
        yield held


def replayed(replays: Cases[str, Replayed], name: str) -> Replayed:
    result, events = replays(name)
    assert result.ok, "\n".join(result.failures)
    assert not Launcher(Path(result.status["stateDir"])).running(), (
        "components still running after the replay"
    )
    return result, events


@pytest.mark.parametrize("scenario", ["nats-rolling-restart"])
def test_a_rolling_restart_during_20_invocations_keeps_quorum_and_answers_all(
    replays: Cases[str, Replayed], scenario: str
) -> None:
    result, events = replayed(replays, scenario)
    rollout = result.steps[0]
    assert [t.outcome for t in rollout.traces] == ["success"] * 20  # none lost, all answered
    assert "rolled out nats in reverse ordinal order" in rollout.note
    assert "the chart's readiness probe does not" in rollout.note  # the wait ncpsim adds is said
    assert rollout.note.index("nats-2") < rollout.note.index("nats-1") < rollout.note.index("nats-0")
    start, end = (
        next(e["ts"] for e in events if e["kind"] == "step.start" and e["step"] == n) for n in (1, 2)
    )
    during = [e for e in events if start <= e["ts"] < end]
    assert [e["server"] for e in during if e["kind"] == "nats.stopped"] == ["nats-2", "nats-1", "nats-0"]
    assert most_down_at_once(during, start) == 1  # never two down, so never all of them
    assert rollout.note.count("after its lame duck") == 3
    logs = Path(result.status["stateDir"]) / "logs"
    for server in ("nats-0", "nats-1", "nats-2"):  # each log holds its first life, the rolled one, `down`
        lives = lifetimes((logs / f"{server}.log").read_text())
        assert len(lives) == 2, server
        rolled, downed = lives
        assert "Entering lame duck mode" in rolled and "Closing existing clients" in rolled, server
        assert 'Trapped "terminated" signal' in downed and "lame duck" not in downed, server  # no preStop


def lifetimes(log: str) -> list[str]:
    """A server log cut at each start ("Starting nats-server"): the text each process wrote before its exit,
    one entry per process that exited."""
    lives = log.split("Starting nats-server")[1:]
    return [life for life in lives if "Server Exiting" in life]


@pytest.mark.parametrize("scenario", ["nats-quorum-lost"])
def test_losing_a_majority_refuses_invocations_until_one_is_back(
    replays: Cases[str, Replayed], scenario: str
) -> None:
    result, events = replayed(replays, scenario)
    refused = result.steps[3]
    assert [t.client_status for t in refused.traces] == [500, 500]
    assert {e["error"] for e in events if e["kind"] == "invoke.unqueued"}  # the pods said why
    assert "JetStream current on the 2 running servers" in result.steps[4].note
    assert all(t.outcome == "success" for t in result.steps[5].traces)
    end = next(e["ts"] for e in events if e["kind"] == "step.start" and e["step"] == 6)
    assert (
        most_down_at_once([e for e in events if e["ts"] < end], 0.0) == 2
    )  # the reading tells the two apart


def test_clients_of_a_process_share_one_inbox_generator_and_forked_processes_do_not() -> None:
    """Workers of one host share the inbox generator (memory); a component forked from the same zygote
    draws its own, or two worker hosts would subscribe the same inboxes and get each other's work."""
    first, second = new_client(), new_client()
    assert first._nuid is second._nuid is inbox_generator()
    assert first.new_inbox() != second.new_inbox()
    inbox_generator()  # made before the fork: the state a forked component inherits
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, reports through the pipe
        os.write(write, bytes(new_client()._nuid.next()))
        os._exit(0)
    os.close(write)
    try:
        child_next = os.read(read, 64)
    finally:
        os.close(read)
        os.waitpid(child, 0)
    parent_next = bytes(inbox_generator().next())
    assert len(child_next) == len(parent_next) == 22
    assert child_next[:12] != parent_next[:12]  # with the parent's generator they would be the same inbox


def test_a_client_keeps_every_info_key_nats_py_reads() -> None:
    """connect_once keeps only INFO_READ of the server's INFO; nats-py must read no other key (a new
    nats-py that does would find it missing only after a reconnect, or never)."""
    source = inspect.getsource(nats.aio.client)
    read = set(re.findall(r'_server_info\["(\w+)"\]', source)) | set(
        re.findall(r'"(\w+)" in self\._server_info', source)
    )
    assert read and read <= INFO_READ, sorted(read - INFO_READ)
