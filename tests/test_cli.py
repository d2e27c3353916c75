"""The command line as a user types it: `ncpsim up scenario=...`, status, logs, certs and down (in-process, as
tests/cli_support.py runs them; `up` as a process of its own is test_teardown.py's and test_printed_commands.py's)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from cli_support import ncpsim


def ports_listening(ports: list[int]) -> list[int]:
    open_ports = []
    for port in ports:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                open_ports.append(port)
    return open_ports


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z":
            out.append(pid)
    return out


@pytest.mark.parametrize(
    ("scenario", "access_line"),
    [
        ("http-callback", '"POST /v2/nvcf/worker/request-attach HTTP/1.1" 200 -'),
        ("grpc-callback", '"POST /v1/proxy HTTP/3" 200 -'),
    ],
)
def test_up_literal_form_then_down_leaves_nothing(
    invoke_env: dict[str, str], scenario: str, access_line: str
) -> None:
    state = Path(invoke_env["NCPSIM_HOME"]) / "cli"
    try:
        up = ncpsim("up", f"scenario={scenario}", "--stack", "cli", env=invoke_env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"PASS {scenario}" in up.stdout
        assert "dig @127.0.0.1" in up.stdout
        if scenario == "http-callback":
            assert "curl -sv --proxy https://invocation.grpc-worker.example.com:" in up.stdout
            assert "openssl s_client" in up.stdout
        status = json.loads(ncpsim("status", "--json", "--stack", "cli", env=invoke_env).stdout)
        netmap = json.loads((state / "netmap.json").read_text())
        tcp_ports = [port for key, port in netmap["bindings"].items() if key.endswith("/tcp")]
        pids = [int(p.read_text()) for p in (state / "pids").glob("*.pid")]
        assert len(pids) >= 6 and len(alive(pids)) == len(pids)
        assert ports_listening(tcp_ports) == tcp_ports
        assert status["scenario"] == scenario and status["backend"] == "local"
        logs = ncpsim("logs", "worker-callback-proxy.access", "--stack", "cli", env=invoke_env)
        assert access_line in logs.stdout
    finally:
        down = ncpsim("down", "--stack", "cli", env=invoke_env)
    assert down.returncode == 0, down.stderr
    assert alive(pids) == []
    assert ports_listening(tcp_ports) == []
    assert ncpsim("status", "--stack", "cli", env=invoke_env).returncode == 1


def test_scenario_flag_form_and_unknown_scenario(invoke_env: dict[str, str]) -> None:
    bad = ncpsim("up", "--scenario", "no-such-scenario", "--stack", "cli2", env=invoke_env)
    assert bad.returncode == 2
    assert "unknown scenario 'no-such-scenario'" in bad.stderr and "Traceback" not in bad.stderr


def test_certs_prints_fingerprints_and_expiry(invoke_env: dict[str, str]) -> None:
    from clusters.state import create_stack_dir

    missing = ncpsim("certs", "--stack", "certs", env=invoke_env)
    assert missing.returncode == 2 and "no stack 'certs'" in missing.stderr  # never created by certs
    assert not (Path(invoke_env["NCPSIM_HOME"]) / "certs").exists()
    create_stack_dir(Path(invoke_env["NCPSIM_HOME"]) / "certs")
    out = ncpsim("certs", "--stack", "certs", env=invoke_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("SHA-256") >= 2 or out.stdout.count(":") > 60
    assert "stack" in out.stdout and "public" in out.stdout


@pytest.mark.parametrize("task", ["up", "down", "status", "logs", "certs", "scenarios", "replay", "test"])
def test_every_task_has_help(task: str, invoke_env: dict[str, str]) -> None:
    out = ncpsim("--help", task, env=invoke_env)
    assert out.returncode == 0
    docstring = out.stdout.split("Docstring:")[1].strip().splitlines()[0]
    assert docstring and docstring != "none"
