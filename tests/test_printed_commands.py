"""Every command `ncpsim up` prints under "Try it:" works when pasted into a shell (issues 15 and 29).

Each stack is brought up by `ncpsim up` from a folder outside the repository with NCPSIM_HOME set: the default
stack's by a real process, the others in-process (tests/cli_support.py, its sys.argv
the console script's, so they print the same program); each printed command runs as printed, through `bash -c`, in the same folder
but in a shell where NCPSIM_HOME is not set (a command pasted elsewhere must still find the stack), with
nothing substituted.
The teardown stops the stack whatever happened and fails the test if one of its processes is left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_support import NCPSIM, ncpsim, ncpsim_process
from stack_records import stack_processes
from timeouts import COMMAND


def printed_commands(stdout: str) -> list[str]:
    """The lines under "Try it:", continuation lines (ending in a backslash) joined as a shell joins them."""
    lines = stdout.split("\nTry it:\n", 1)[1].splitlines()
    commands: list[str] = []
    for line in lines:
        if not line.startswith("  "):
            break
        if commands and commands[-1].endswith("\\"):
            commands[-1] += "\n" + line
        else:
            commands.append(line.strip())
    return commands


@pytest.fixture
def shell_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """NCPSIM_HOME in a temporary folder; afterwards every stack under it is stopped and checked gone."""
    (tmp_path / "here").mkdir()
    env = {**os.environ, "NCPSIM_HOME": str(tmp_path / "home"), "HERE": str(tmp_path / "here")}
    yield env
    home = Path(env["NCPSIM_HOME"])
    for state in sorted(home.iterdir()) if home.exists() else []:
        ncpsim("down", "--stack", state.name, env=env)
        assert not stack_processes(state), f"processes of {state.name} left after ncpsim down"


def paste(command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=env["HERE"],
        env={k: v for k, v in env.items() if k != "NCPSIM_HOME"},
        capture_output=True,
        text=True,
        timeout=COMMAND,
        check=False,
    )


def check_command(command: str, env: dict[str, str]) -> None:
    """Run one pasted command and check it did what its kind promises."""
    done = paste(command, env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command}\n{output}"
    assert "None" not in command
    if command.startswith("curl") and "--proxy" in command:
        assert "< HTTP/1.1 401" in output, output  # the pod itself answered, through the proxy
    elif command.startswith("curl"):
        assert json.loads(done.stdout), output  # nats-server's monitoring endpoint
    elif command.startswith("openssl"):
        assert "Verify return code: 0 (ok)" in output, output
    elif "scenarios.h3get" in command:
        assert done.stdout.startswith("HTTP/3 401") and "missing auth" in done.stdout, output
    elif command.startswith("dig"):
        assert done.stdout.strip(), f"{command}: no answer"
    elif " call " in command:
        assert "3/3 calls succeeded" in done.stdout, output
    elif " status --json" in command:
        assert json.loads(done.stdout)["stack"]
    elif " down" in command:
        assert "stopped" in done.stdout


def up_and_paste(
    env: dict[str, str],
    *up_args: str,
    before_down: Callable[[], None] = lambda: None,
    run: Callable[..., subprocess.CompletedProcess[str]] = ncpsim,
) -> list[str]:
    """`ncpsim up` (from the folder outside the repository; `run` it as a process or in-process), then each
    printed command pasted; `before_down` runs on the stack before the last, `down`, is pasted."""
    up = run("up", *up_args, cwd=Path(env["HERE"]), env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    commands = printed_commands(up.stdout)
    endpoints = up.stdout[up.stdout.index("\nStack ") :]
    assert "None" not in endpoints, endpoints  # a proxy that is off has no port to print
    assert commands[-1].endswith(" down" + (f" --stack {up_args[-1]}" if "--stack" in up_args else ""))
    for command in commands[:-1]:
        check_command(command, env)
    before_down()
    check_command(commands[-1], env)
    return commands


@pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("openssl") and shutil.which("dig")),
    reason="curl, openssl and dig are the clients the printed commands use",
)
def test_default_idle_stack_commands_work_as_pasted(shell_env: dict[str, str]) -> None:
    commands = up_and_paste(shell_env, run=ncpsim_process)  # the real command, as a user runs it
    kinds = " ".join(commands)
    for kind in ("curl", "openssl s_client", "scenarios.h3get", "dig", " call http-echo", " down"):
        assert kind in kinds
    assert "--stack" not in kinds  # the default stack needs no flag


@pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("openssl") and shutil.which("dig")),
    reason="curl, openssl and dig are the clients the printed commands use",
)
def test_named_stack_commands_carry_the_stack(shell_env: dict[str, str]) -> None:
    # one NATS server (three wait for JetStream's first leader, 4-9 s when the vote splits): nothing printed
    # depends on it
    commands = up_and_paste(shell_env, "--set", "nats.config.cluster.enabled=false", "--stack", "x")
    invokes = [c for c in commands if NCPSIM in c]
    assert invokes and all(c.endswith("--stack x") for c in invokes)
    assert all(c.startswith(f"NCPSIM_HOME={shell_env['NCPSIM_HOME']} ") for c in invokes)
    assert all("/x/certs/" in c for c in commands if "--cacert" in c or "-CAfile" in c)


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("openssl")), reason="curl and openssl")
def test_public_frontend_commands_trust_the_public_ca(shell_env: dict[str, str]) -> None:
    wrong: list[subprocess.CompletedProcess] = []

    def with_the_stack_ca() -> None:
        """Negative control: the same command with the stack CA fails, so the CA printed is the one that matters."""
        status = json.loads(ncpsim("status", "--json", env=shell_env).stdout)
        http = status["proxy"]["http"]
        wrong.append(
            paste(
                f"openssl s_client -connect 127.0.0.1:{http['port']} -servername invocation."
                f"{status['workerDomain']} -CAfile {status['ca']['stack']} -verify_return_error </dev/null",
                shell_env,
            )
        )

    # in-process, the scenario's redeploy too: the stack's supervisor forks the new proxy
    commands = up_and_paste(shell_env, "public-frontend-cert", before_down=with_the_stack_ca)
    openssl = next(c for c in commands if c.startswith("openssl"))
    assert "/certs/ca/public/ca.crt" in openssl
    assert wrong and wrong[0].returncode != 0


def test_proxy_disabled_prints_nothing_through_the_proxy(shell_env: dict[str, str]) -> None:
    commands = up_and_paste(shell_env, "single-cluster-direct")
    assert not any("--proxy" in c or c.startswith("openssl") or "h3get" in c for c in commands)
    assert any(" logs all" in c for c in commands)
