"""A dev environment to poke (issue 15): idle `ncpsim up`, then tasks on the running stack, as a user runs them.

The acceptance test runs each step through the command line with NCPSIM_HOME in a temporary folder, in-process
but for what leaves a new component running (a restart, a redeploy: a process). Its teardown stops the
stack whatever happened and fails if one of its processes is left. The table tests cover the pure parts: the
steps each command writes, and the command-line words invoke is given (`invoke` in the repository, a process).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import REPO, ncpsim
from invoke import Program
from stack_records import stack_processes
from timeouts import COMMAND

from scenarios.devenv import call_step, fault_step, rotate_step, set_step, stack_flag, unknown_key_warnings
from sim.errors import ConfigError
from tasks import cli

INVOKE = str(Path(sys.executable).parent / "invoke")
# For the stacks that only serve other tasks: one NATS server, as the catalogue's scenarios not about the NATS
# cluster (three wait for JetStream's first leader, 4-9 s when the first vote splits). The acceptance test
# and the customer's file keep the chart's three.
ONE_NATS_SERVER = ("--set", "nats.config.cluster.enabled=false")


def down_all(home: Path) -> None:
    """Every stack under `home` stopped; a process left fails the test."""
    for state in sorted(home.iterdir()) if home.exists() else []:
        ncpsim("down", "--stack", state.name, home=home)
        assert not stack_processes(state), f"processes of {state.name} left after ncpsim down"


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "home"
    down_all(tmp_path / "home")


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One idle stack (`ncpsim up --stack idle`) for the tests that only call and probe it."""
    home = tmp_path_factory.mktemp("devenv") / "home"
    try:
        up = ncpsim("up", "--stack", "idle", *ONE_NATS_SERVER, home=home)
        assert up.returncode == 0, up.stdout + up.stderr
        yield home
    finally:
        down_all(home)


def calls(done: subprocess.CompletedProcess) -> list[dict]:
    report = json.loads(done.stdout)
    return [call for step in report["steps"] for call in step["calls"]]


def test_idle_stack_poked_as_a_user_would(home: Path) -> None:
    up = ncpsim("up", home=home)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "PASS idle" in up.stdout

    status = json.loads(ncpsim("status", "--json", home=home).stdout)
    roles = [p["role"] for p in status["pods"]]
    assert roles.count("invocation") == 2 and roles.count("grpc-proxy") == 2
    assert status["proxy"]["http"]["port"] and "ncpsim-compute-1" in status["dns"]

    first = ncpsim("call", "http-echo", "--count", "3", "--json", home=home)
    assert first.returncode == 0, first.stdout + first.stderr
    assert [c["outcome"] for c in calls(first)] == ["success"] * 3
    assert all(c["via"] == "proxy" for c in calls(first))

    kill = ncpsim("fault", "kill", "invocation-service-0", home=home)
    assert kill.returncode == 0 and "SIGKILL invocation-service-0" in kill.stdout, kill.stdout + kill.stderr

    during = ncpsim("call", "http-echo", "--count", "4", home=home)
    assert during.returncode == 1, during.stdout + during.stderr
    assert "2/4 calls succeeded" in during.stdout and "FAILED" in during.stdout

    restart = ncpsim("fault", "restart", "invocation-service-0", home=home)  # the supervisor forks it
    assert restart.returncode == 0, restart.stdout + restart.stderr

    after = ncpsim("call", "http-echo", "--count", "4", "--json", home=home)
    assert after.returncode == 0, after.stdout + after.stderr
    assert [c["outcome"] for c in calls(after)] == ["success"] * 4

    changed = ncpsim(
        "set", "workerCallbackProxy.invocation.connect.enabled=true", "--redeploy", "proxy", home=home
    )
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "redeployed proxy" in changed.stdout
    state = home / "default"
    topology = json.loads((state / "topology.json").read_text())
    assert topology["values"]["workerCallbackProxy"]["invocation"]["connect"]["enabled"] is True
    # The new proxy listens on new ports: what `ncpsim status` prints follows it.
    bound = json.loads((state / "netmap.json").read_text())["bindings"]
    status = json.loads(ncpsim("status", "--json", home=home).stdout)
    assert status["proxy"]["http"]["port"] == bound[f"{topology['proxy_lb_ip']}:10084/tcp"]

    down = ncpsim("down", home=home)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not stack_processes(home / "default")


def test_step_from_stdin_checks_its_expectations(idle: Path) -> None:
    holds = ncpsim(
        "step",
        "-",
        "--stack",
        "idle",
        home=idle,
        stdin="invoke: {function: grpc-echo, count: 2}\nexpect: {outcome: success, via: proxy}\n",
    )
    assert holds.returncode == 0, holds.stdout + holds.stderr
    assert "2/2 calls succeeded" in holds.stdout
    broken = ncpsim(
        "step",
        "-",
        "--stack",
        "idle",
        home=idle,
        stdin="invoke: {function: http-echo}\nexpect: {outcome: failure}\n",
    )
    assert broken.returncode == 1  # the calls succeed, so the expectation of a failure does not hold
    assert "expected" in broken.stdout
    typo = ncpsim("step", "-", "--stack", "idle", home=idle, stdin="invok: {function: http-echo}\n")
    assert typo.returncode == 2 and "invok" in typo.stderr and "Traceback" not in typo.stderr


def test_probe_steps_repeat_on_a_running_stack(idle: Path, tmp_path: Path) -> None:
    """Hand-made forward-proxy requests through `ncpsim step`, twice on the same stack, expectations checked."""
    steps = tmp_path / "probes.yaml"
    steps.write_text(
        "steps:\n"
        "  - probe: {targets: ['http://{pod}:8443/v2/nvcf/worker/request-attach']}\n"
        "    expect: {proxyStatus: 401, proxyFlag: '-', podContacted: true}\n"
        "  - probe: {targets: ['http://{pod}:8443/other']}\n"
        "    expect: {proxyStatus: 404, proxyFlag: NR, podContacted: false}\n"
    )
    for _ in range(2):
        done = ncpsim("step", str(steps), "--stack", "idle", home=idle)
        assert done.returncode == 0, done.stdout + done.stderr


def test_tasks_on_a_stack_that_is_not_up(home: Path) -> None:
    done = ncpsim("call", "http-echo", "--stack", "nothing", home=home)
    assert done.returncode == 2
    assert (
        done.stderr.strip() == "ncpsim: stack 'nothing' is not up; start it with `ncpsim up --stack nothing`"
    )
    missing = ncpsim("step", "no-such-step.yaml", "--stack", "nothing", home=home)
    assert missing.returncode == 2 and missing.stderr.startswith(
        "ncpsim: no-such-step.yaml: no such step file"
    )


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["a.b=true"], {"a": {"b": True}}),
        (["a.b=3", "a.c=x"], {"a": {"b": 3, "c": "x"}}),
        (
            ["workerCallbackProxy.tls.frontend.existingSecret=null"],
            {"workerCallbackProxy": {"tls": {"frontend": {"existingSecret": None}}}},
        ),
        (["a.b="], {"a": {"b": ""}}),
    ],
)
def test_set_writes_set_values(words: list[str], expected: dict) -> None:
    assert set_step(words, None)["setValues"] == expected


def test_set_warns_about_keys_the_stack_does_not_know() -> None:
    step = set_step(
        ["workerCallbackProxy.invocation.conect.enabled=true", "workerCallbackProxy.enabled=true"], None
    )
    assert unknown_key_warnings(step) == [
        "unknown key workerCallbackProxy.invocation.conect (did you mean workerCallbackProxy.invocation.connect?)"
    ]


@pytest.mark.parametrize(
    ("words", "redeploy", "message"),
    [
        ([], None, "give at least one key.path=value"),
        (["novalue"], None, "^set novalue: expected key.path=value, e.g. set "),
        (["a..b=1"], None, "^set a..b=1: cannot read the key"),
        (["a=1", "a.b=2"], None, "cannot also hold keys"),
        (["a.b=2", "a=1"], None, "cannot also hold keys"),
        (["a=1"], "everything", "choose one of workers, proxy, pods, all"),
    ],
)
def test_set_mistakes_are_one_line(words: list[str], redeploy: str | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        set_step(words, redeploy)


@pytest.mark.parametrize(
    ("action", "target", "expected"),
    [
        ("kill", "invocation-service-0", {"kill": "invocation-service-0"}),
        ("scale", "invocation=1", {"scale": {"role": "invocation", "replicas": 1}}),
        ("expire", "frontend", {"expire": "frontend"}),
        ("clear-links", None, {"clear-links": True}),
    ],
)
def test_fault_writes_the_fault_step(action: str, target: str | None, expected: dict) -> None:
    assert fault_step(action, target)["fault"] == expected


def test_fault_link_and_mistakes() -> None:
    link = fault_step("link", "ncpsim-compute-1", "10.100.0.10", latency_ms=200, drop=0.5)["fault"]["link"]
    assert link == {
        "from": "ncpsim-compute-1",
        "to": "10.100.0.10",
        "latencyMs": 200,
        "drop": 0.5,
        "timeoutMs": 1000,
        "protocol": "any",
    }
    udp = fault_step("link", "ncpsim-compute-1", "10.100.0.10", drop=1.0, protocol="udp")["fault"]["link"]
    assert udp["protocol"] == "udp"  # `ncpsim fault link CLUSTER --protocol udp`
    with pytest.raises(ConfigError, match="choose one of kill"):
        fault_step("explode", "x")
    with pytest.raises(ConfigError, match="ncpsim fault kill COMPONENT"):
        fault_step("kill", None)
    with pytest.raises(ConfigError, match="ROLE=REPLICAS"):
        fault_step("scale", "invocation")
    with pytest.raises(ConfigError, match="at least one call"):
        call_step("http-echo", 0)
    with pytest.raises(ConfigError, match="^call 'nope': choose one of http-echo, grpc-echo$"):
        call_step("nope", 1)
    with pytest.raises(
        ConfigError, match="^rotate 'nope': choose one of frontend, pod-certs, stack-ca, public-ca$"
    ):
        rotate_step("nope")


def test_stack_flag_only_for_other_stacks() -> None:
    assert stack_flag("default") == ""
    assert stack_flag("x") == " --stack x"


@pytest.mark.parametrize(
    ("argv", "parsed"),
    [
        (["up"], "{'scenario': None}"),
        (["up", "http-callback"], "{'scenario': 'http-callback'}"),
        (["up", "-f", "values.yaml", "--stack", "x"], "{'scenario': None}"),
        (["up", "--file=values.yaml", "scenario=wrong-path"], "{'scenario': 'scenario=wrong-path'}"),
        (["set", "a=1", "b=2", "--redeploy", "proxy"], "{'assignment': ['a=1', 'b=2'], 'redeploy': 'proxy'}"),
        (["fault", "clear-links"], "{'action': 'clear-links', 'target': None}"),
    ],
)
def test_optional_positional_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], parsed: str
) -> None:
    """invoke itself has no optional positional arguments; tasks.py gives them from the words present. Run
    by invoke's own Program in this process, the probe loaded as `invoke -c` loads it, the words read from
    sys.argv as the `invoke` console script's are."""
    probe = tmp_path / "probe_tasks.py"
    probe.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tasks.cli import optional_positional\n"
        "@optional_positional('scenario')\n"
        "def up(c, scenario=None, file=None, stack='default'):\n"
        "    print({'scenario': scenario})\n"
        "@optional_positional('assignment', more='assignment', name='set')\n"
        "def set_(c, assignment=None, redeploy=None):\n"
        "    print({'assignment': assignment, 'redeploy': redeploy})\n"
        "@optional_positional('action', 'target')\n"
        "def fault(c, action=None, target=None):\n"
        "    print({'action': action, 'target': target})\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader puts the probe's folder first
    monkeypatch.setattr(sys, "argv", [INVOKE, "-c", "probe_tasks", *argv])
    monkeypatch.setattr(cli, "_command_line", None)  # as in a process of its own: no ncpsim run named one
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            Program().run(sys.argv, exit=False)  # a parse error is printed to stderr, and nothing runs
    finally:
        sys.modules.pop("probe_tasks", None)
    assert out.getvalue().strip() == parsed, err.getvalue()


# -- the command line's rough edges (issue 15) -----------------------------------------------------------
def test_unknown_scenario_suggests_the_closest_names_one_per_line(home: Path) -> None:
    done = ncpsim("up", "htp-callback", home=home)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "ncpsim: unknown scenario 'htp-callback'; did you mean:"
    assert lines[1] == "  http-callback" and len(lines) <= 6


def test_replay_takes_help_and_stack(home: Path) -> None:
    helped = ncpsim("replay", "--help", home=home)
    assert helped.returncode == 0 and "--stack" in helped.stdout and "--all" in helped.stdout
    done = ncpsim("replay", "nats-values-right", "--stack", "mine", home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (home / "mine" / "reports" / "report.json").is_file()
    nothing = ncpsim("replay", home=home)
    assert nothing.returncode == 2 and "ncpsim replay NAME..., --all, or --bundle B" in nothing.stderr


def test_replay_stack_names_are_shortened_out_loud() -> None:
    from scenarios.replay import replay_stack

    assert replay_stack("wrong-path") == ("replay-wrong-path", "replay-wrong-path")
    assert replay_stack("wrong-path", "mine") == ("mine", "mine")
    assert replay_stack("wrong-path", "mine", several=True) == ("mine-wrong-path", "mine-wrong-path")
    long_a, asked = replay_stack("single-cluster-proxy-enabled-no-dns")
    long_b, _ = replay_stack("single-cluster-proxy-enabled-no-dns-2")
    assert asked == "replay-single-cluster-proxy-enabled-no-dns"
    assert len(long_a) == 40 and long_a != long_b  # a hash of the whole name keeps them apart


def test_a_closed_pipe_ends_output_quietly(home: Path) -> None:
    """`ncpsim scenarios | head`: the reader left before the writer was done."""
    for args in (["scenarios"], ["--list"], ["replay", "--help"]):
        proc = subprocess.Popen(
            [INVOKE, *args],
            cwd=REPO,
            env={**os.environ, "NCPSIM_HOME": str(home)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        proc.stdout.close()  # nothing will ever be read: every write meets a closed pipe
        _, err = proc.communicate(timeout=COMMAND)
        assert b"Traceback" not in err and b"BrokenPipe" not in err, (args, err)
        if args == ["scenarios"]:  # a task's output; invoke's own (--list, --help) ends with its exit code 1
            assert proc.returncode == 0, err


def test_logs_without_a_component_prints_them_all(home: Path) -> None:
    assert ncpsim("replay", "nats-values-right", "--stack", "runbook", home=home).returncode == 0
    done = ncpsim("logs", "--stack", "runbook", home=home)
    assert done.returncode == 0, done.stderr


def test_idle_up_with_a_customer_values_file(home: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("workerCallbackProxy:\n  workerDomain: acme.example.net\n")
    up = ncpsim("up", "-f", str(values), "--stack", "acme", home=home)
    assert up.returncode == 0, up.stdout + up.stderr
    status = json.loads(ncpsim("status", "--json", "--stack", "acme", home=home).stdout)
    assert status["workerDomain"] == "acme.example.net" and status["proxy"]["http"]["port"]
    done = ncpsim("call", "http-echo", "--count", "2", "--stack", "acme", "--json", home=home)
    assert (
        done.returncode == 0
        and [c["dns"]["name"] for c in calls(done)] == ["invocation.acme.example.net"] * 2
    )


def test_status_of_a_stack_that_is_not_up_says_how_to_start_it(home: Path) -> None:
    never = ncpsim("status", "--stack", "later", home=home)
    assert never.returncode == 2 and "no stack 'later'" in never.stderr
    assert "`ncpsim up --stack later`" in never.stderr
    assert ncpsim("up", "--stack", "later", *ONE_NATS_SERVER, home=home).returncode == 0
    assert ncpsim("down", "--stack", "later", home=home).returncode == 0
    done = ncpsim("status", "--stack", "later", home=home)
    assert done.returncode == 1
    assert done.stdout.strip() == "stack 'later' is not up (bring it up with `ncpsim up --stack later`)"
