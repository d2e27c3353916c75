"""The command line around a running stack (issue 29): values with origins, set --unset and --secret, a
status that shows the state, logs -f and events, render -f, replay's one JSON document.

One stack serves the module, brought up by `ncpsim up` from a folder outside the repository with a customer's
file and a `--set`; each test acts on it as a user would, in-process (a restart or a redeploy too: the stack's
supervisor forks the new component, so it is nobody's child here) but for what needs a process of its own
(`logs -f` ends on Ctrl-C, concurrent `set`s). The teardown stops it and fails if anything is left running.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from cli_support import NCPSIM, ncpsim
from stack_records import Records, stack_processes
from timeouts import COMMAND, RECORD

FOLLOW_TIMEOUT = RECORD  # logs -f re-reads every 0.2 s; a loaded machine may be slower to schedule it
CUSTOMER = "workerCallbackProxy:\n  enabled: true\n  workerDomain: acme.example.net\n"
CONNECT = "workerCallbackProxy.invocation.connect.enabled"


class Cli:
    def __init__(self, here: Path, home: Path):
        self.here, self.home = here, home
        self.env = {**os.environ, "NCPSIM_HOME": str(home)}

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return ncpsim(*args, home=self.home, cwd=self.here)

    def json(self, *args: str) -> object:
        done = self(*args)
        assert done.returncode in (0, 1), done.stdout + done.stderr
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    root = tmp_path_factory.mktemp("cli")
    (root / "here").mkdir()
    (root / "here" / "customer.yaml").write_text(CUSTOMER)
    run = Cli(root / "here", root / "home")
    try:
        up = run("up", "-f", "customer.yaml", "--set", f"{CONNECT}=true")
        assert up.returncode == 0, up.stdout + up.stderr
        yield run
    finally:
        run("down")
        assert not stack_processes(run.home / "default"), "processes left after ncpsim down"


def test_values_name_each_origin_and_unset_restores_the_default(cli: Cli) -> None:
    shown = {v["key"]: v for v in cli.json("values", "--json")}  # type: ignore[union-attr]
    assert shown["workerCallbackProxy.workerDomain"]["from"] == "customer.yaml:3"
    assert shown[CONNECT] == {"key": CONNECT, "value": True, "from": f"--set {CONNECT}=true"}
    assert "nats.workerAuth" not in shown  # a default is not a value anyone set
    assert cli("set", "nats.workerAuth=token", "--unset", CONNECT).returncode == 0  # restarts NATS
    shown = {v["key"]: v for v in cli.json("values", "--json")}  # type: ignore[union-attr]
    assert shown["nats.workerAuth"]["from"].startswith("ncpsim set nats.workerAuth=token")
    assert not any(key.startswith("workerCallbackProxy.invocation.connect") for key in shown)
    everything = {v["key"]: v for v in cli.json("values", "--all", "--json")}  # type: ignore[union-attr]
    assert everything["adminIssuerProxy.enabled"]["from"] == "default"
    assert cli("set", "--unset", "nats.workerAuth").returncode == 0


def test_status_shows_faults_values_processes_and_the_frontend(cli: Cli) -> None:
    assert cli("fault", "link", "ncpsim-compute-1", "--latency-ms", "5").returncode == 0
    try:
        assert cli("set", "workerCallbackProxy.service.annotations.team=edge").returncode == 0
        status = cli.json("status", "--json")
        assert isinstance(status, dict)
        assert [(f["source"], f["latency_ms"]) for f in status["faults"]["links"]] == [
            ("ncpsim-compute-1", 5)
        ]
        assert {"key": "workerCallbackProxy.service.annotations.team", "value": "edge"}.items() <= next(
            v for v in status["values"] if v["key"].endswith(".team")
        ).items()
        assert (
            status["frontend"]["names"] == ["*.acme.example.net"] and status["frontend"]["issuer"] == "stack"
        )
        proxy = status["components"]["worker-callback-proxy"]
        assert proxy["pid"] > 0 and f"{status['proxy']['http']['port']}/tcp" in proxy["ports"]
        assert {w["workerUtils"] for w in status["workers"]} == {"1.4.0"}
    finally:
        cli("fault", "clear-links")


def test_a_rollout_without_its_secret_is_refused_and_set_secret_brings_it(cli: Cli, tmp_path: Path) -> None:
    ca = trustme.CA()
    folder = tmp_path / "acme-tls"
    folder.mkdir()
    ca.issue_cert("*.acme.example.net").cert_chain_pems[0].write_to_path(folder / "tls.crt")
    ca.issue_cert("*.acme.example.net").private_key_pem.write_to_path(folder / "tls.key")
    issued = ca.issue_cert("*.acme.example.net")
    issued.cert_chain_pems[0].write_to_path(folder / "tls.crt")
    issued.private_key_pem.write_to_path(folder / "tls.key")
    change = "workerCallbackProxy.tls.frontend.existingSecret=acme-tls"
    refused = cli("set", change, "--redeploy", "proxy")
    assert (
        refused.returncode == 2
        and "Secret 'acme-tls'" in refused.stderr
        and "--secret acme-tls=" in refused.stderr
    )
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert cli("call", "http-echo").returncode == 0  # the running proxy keeps serving
    assert cli.json("status", "--json")["frontend"]["issuer"] == "stack"  # type: ignore[index]
    switched = cli("set", change, "--secret", f"acme-tls={folder}", "--redeploy", "proxy")
    assert switched.returncode == 0, switched.stdout + switched.stderr
    frontend = cli.json("status", "--json")["frontend"]  # type: ignore[index]
    assert frontend["secret"] == "acme-tls" and frontend["issuer"] != "stack"  # the customer's CA
    assert (
        cli(
            "set", "--unset", "workerCallbackProxy.tls.frontend.existingSecret", "--redeploy", "proxy"
        ).returncode
        == 0
    )


@pytest.mark.usefixtures("sigint_as_on_a_terminal")  # the Ctrl-C that ends the follower must reach it
def test_logs_follow_prints_a_curl_made_after_it_started(cli: Cli) -> None:
    status = cli.json("status", "--json")
    assert isinstance(status, dict)
    http, pod = status["proxy"]["http"], status["pods"][0]["target"]
    assert cli("call", "http-echo").returncode == 0  # a line in the access log, for the follower's first
    records = Records(cli.home / "default")
    follower = subprocess.Popen(
        [NCPSIM, "logs", "-f", "worker-callback-proxy.access", "-n", "1"],
        cwd=cli.here,
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert next_line(follower), "logs -f did not print the last line"  # it has read the file: following
        front = f"{http['name']}:{http['port']}"
        curl = subprocess.run(
            [
                "curl",
                "-s",
                "--proxy",
                f"https://{front}",
                "--proxy-cacert",
                status["ca"]["stack"],
                "--resolve",
                f"{front}:127.0.0.1",
                "-A",
                "curl-after-follow",
                f"{pod}/v2/nvcf/worker/request-attach",
            ],
            capture_output=True,
            text=True,
            timeout=COMMAND,
            check=False,
        )
        assert curl.returncode == 0, curl.stderr
        records.access_line(ua="curl-after-follow")  # written: the follower's next read has it
        line = next_line(follower)
        assert '"curl-after-follow"' in line and " 401 " in line, line
    finally:
        follower.send_signal(signal.SIGINT)
        follower.communicate(timeout=COMMAND)
    assert follower.returncode == 0


def next_line(process: subprocess.Popen[str]) -> str:
    ready, _, _ = select.select([process.stdout], [], [], FOLLOW_TIMEOUT)
    assert ready, f"logs -f printed nothing within {FOLLOW_TIMEOUT} s"
    return process.stdout.readline()  # type: ignore[union-attr]


def test_events_filter_by_kind(cli: Cli) -> None:
    ready = [
        json.loads(line) for line in cli("events", "--kind", "component.ready", "--json").stdout.splitlines()
    ]
    assert ready and {e["kind"] for e in ready} == {"component.ready"}
    assert "worker-callback-proxy" in {e["component"] for e in ready}


def test_render_takes_the_customer_values(cli: Cli, tmp_path: Path) -> None:
    done = cli("render", "-f", "customer.yaml", "--out", str(tmp_path / "out"), "--stack", "rendered")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "*.acme.example.net" in (tmp_path / "out" / "envoy" / "envoy.yaml").read_text()


def test_replay_json_is_one_document(cli: Cli) -> None:
    done = cli("replay", "nats-values-*", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["total"] == report["passed"] == 2 and len(report["scenarios"]) == 2


def test_a_failed_callback_leaves_a_line_in_the_workers_log(cli: Cli) -> None:
    assert cli("fault", "link", "ncpsim-compute-1", "--drop", "1", "--timeout-ms", "200").returncode == 0
    try:
        failed = cli("call", "http-echo", "--json")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        request_id = json.loads(failed.stdout)["steps"][0]["calls"][0]["request_id"]
    finally:
        cli("fault", "clear-links")
    logged = cli("logs", "ncpsim-compute-1", "-n", "200").stdout
    line = next((x for x in logged.splitlines() if request_id in x), "")
    assert '"level": "error"' in line and '"msg": "failed to handle request"' in line, logged[-2000:]


def test_certs_lists_the_leaf_certificates(cli: Cli) -> None:
    shown = cli("certs").stdout
    assert "stack CA:" in shown and "Secret worker-callback-proxy-frontend-tls:" in shown
    assert "names=*.acme.example.net  issuer=stack" in shown


def test_concurrent_sets_apply_in_turn_and_keep_every_assignment(cli: Cli) -> None:
    keys = [f"workerCallbackProxy.service.annotations.concurrent-{n}" for n in range(4)]
    running = [
        subprocess.Popen(
            [NCPSIM, "set", f"{key}=v"],
            cwd=cli.here,
            env=cli.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for key in keys
    ]
    for process in running:
        _, err = process.communicate(timeout=COMMAND)
        assert process.returncode == 0, err
    shown = {v["key"] for v in cli.json("values", "--json")}  # type: ignore[union-attr]
    assert set(keys) <= shown
    assert cli("set", *(f"--unset={key}" for key in keys)).returncode == 0


def test_untrusted_text_reaches_the_terminal_escaped(cli: Cli, tmp_path: Path) -> None:
    """A step name, a scenario's text and what a client sent carry escapes, newlines and rich markup: the
    step's output, the replay report and the logs show them escaped, never interpreted."""
    hostile = "evil\\x1b[31m\\rred\\nFAKE PASS [/][bold]"  # as YAML writes it: escapes, CR, newline, markup
    step = f'name: "{hostile}"\ninvoke: {{function: http-echo}}\n'
    done = ncpsim("step", "-", home=cli.home, cwd=cli.here, stdin=step)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\x1b" not in done.stdout and "\r" not in done.stdout and "\nFAKE PASS" not in done.stdout
    assert "evil\\x1b[31m\\x0dred\\x0aFAKE PASS [/][bold]" in done.stdout  # shown, markup and all
    scenario = tmp_path / "hostile.yaml"
    scenario.write_text(
        f'name: hostile\nsummary: "{hostile}"\nvalues: {{workerCallbackProxy: {{enabled: true}}}}\n'
        f'steps:\n  - name: "{hostile}"\n    setValues: {{}}\n'
    )
    replayed = cli("replay", str(scenario))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "\x1b" not in replayed.stdout and "\r" not in replayed.stdout
    assert replayed.stdout.count("FAKE PASS") == 2 and "\nFAKE PASS" not in replayed.stdout
