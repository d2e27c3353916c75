"""`ncpsim watch` (issue 15): rows appear for calls made meanwhile; a live table on a terminal, plain lines
otherwise; Ctrl-C stops it, and so does the stack going down.

The terminal is a real pseudo-terminal (pty) that is the watch's controlling terminal, so Ctrl-C is the
byte 0x03 typed into it, as a person would. Every process a test starts is stopped by its teardown.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_support import REPO, ncpsim
from timeouts import CALL, COMMAND, RECORD

INVOKE = str(Path(sys.executable).parent / "invoke")
STACK = "watched"
pytestmark = pytest.mark.usefixtures("sigint_as_on_a_terminal")  # Ctrl-C typed must reach the watch
ROW_TIMEOUT = CALL  # a finished callback's row is drawn within a poll interval plus its settle time
EXIT_TIMEOUT = RECORD  # the watch ends within a poll interval of Ctrl-C or the stack going down
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def run_invoke(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The tasks around the watch, `up` included, in-process; the watch itself is a process."""
    return ncpsim(*args, env=env)


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One stack for the module: the watches only read it, but the last test's, which ends with it going down."""
    env = {
        **os.environ,
        "NCPSIM_HOME": str(tmp_path_factory.mktemp("watch") / "home"),
        "TERM": "xterm-256color",
    }
    env.pop("NO_COLOR", None)
    # one NATS server, as the catalogue's scenarios not about the NATS cluster: three wait for a leader
    up = run_invoke("up", "--stack", STACK, "--set", "nats.config.cluster.enabled=false", env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield env
    finally:
        down = run_invoke("down", "--stack", STACK, env=env)  # already down after the last test: said so
        assert down.returncode == 0, down.stderr


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Process ids a test starts (each leads its own session); any still alive afterwards is killed, and the
    test fails."""
    pids: list[int] = []
    yield pids
    left = []
    for pid in pids:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue  # reaped by the test
        if not done:
            left.append(pid)
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert not left, "a watch was still running at the end of the test"


def request_ids(env: dict[str, str], function: str, count: int) -> list[str]:
    done = run_invoke("call", function, "--count", str(count), "--json", "--stack", STACK, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return [c["request_id"] for step in json.loads(done.stdout)["steps"] for c in step["calls"]]


class Output:
    """What a process wrote to `fd` so far, read until a condition holds or a timeout passes."""

    def __init__(self, fd: int):
        self.fd, self.screen, self.ended = fd, b"", False

    def read_until(self, done: Callable[[bytes], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done(self.text):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # a pty whose other side closed: the watch has ended
                    chunk = b""
                if not chunk:
                    self.ended = True
                    return done(self.text)
                self.screen += chunk
        return True

    def wait_end(self, timeout: float) -> bool:
        """True once the writer has closed its side (the process ended) within `timeout`."""
        self.read_until(lambda _: self.ended, timeout)
        return self.ended

    @property
    def text(self) -> bytes:
        return ANSI.sub(b"", self.screen)


def watch_on_a_terminal(env: dict[str, str], rows: int = 40, columns: int = 200) -> tuple[int, Output]:
    """`ncpsim watch` in a session of its own whose controlling terminal is a new pty (pty.fork), so Ctrl-C
    typed into the pty interrupts it as it would a person's watch."""
    pid, master = pty.fork()
    if pid == 0:  # the child: size its terminal before the watch can read it, then exec at once
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        os.chdir(REPO)
        # rich takes COLUMNS/LINES over the terminal's size when they are set (pytest-xdist's workers and
        # CI may pass them down): give the same size both ways.
        os.execve(
            INVOKE, [INVOKE, "watch", "--stack", STACK], {**env, "COLUMNS": str(columns), "LINES": str(rows)}
        )
    return pid, Output(master)


def exit_code(pid: int, out: Output) -> int:
    """Wait for the pty's other side to close (the watch ended), then reap it."""
    assert out.wait_end(EXIT_TIMEOUT), "the watch did not end"
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_watch_on_a_terminal_shows_rows_and_stops_on_ctrl_c(
    stack_env: dict[str, str], started: list[int]
) -> None:
    pid, terminal = watch_on_a_terminal(stack_env)
    started.append(pid)
    try:
        assert terminal.read_until(
            lambda text: b"what crosses the stack (Ctrl-C stops)" in text, ROW_TIMEOUT
        ), terminal.text
        assert b"\x1b[" in terminal.screen  # a live table drawn with terminal controls, not plain lines

        ids = request_ids(stack_env, "http-echo", 2) + request_ids(stack_env, "grpc-echo", 1)
        # Each callback's own row: a proxy line no callback has claimed within SETTLE_SECONDS is first shown
        # as a request of its own, with the same request id (a busy machine), until the callback's result
        # comes and claims it.
        shown = terminal.read_until(
            lambda text: (
                all(rid[:8].encode() in text for rid in ids) and b"grpc-echo" in text and b"worker-1-" in text
            ),
            ROW_TIMEOUT,
        )
        assert shown, terminal.text.decode(errors="replace")

        os.write(terminal.fd, b"\x03")  # Ctrl-C, typed
        assert exit_code(pid, terminal) == 0
    finally:
        os.close(terminal.fd)


def watch_into_a_pipe(
    stack_env: dict[str, str], started: list[int], *args: str
) -> tuple[subprocess.Popen[bytes], Output, int]:
    """`invoke watch` on the module's stack with its output into a pipe: the process, its reader and the
    pipe's read end (the test closes it)."""
    read_end, write_end = os.pipe()
    watch = subprocess.Popen(
        [INVOKE, "watch", "--stack", STACK, *args],
        cwd=REPO,
        env=stack_env,
        stdout=write_end,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(write_end)
    started.append(watch.pid)
    return watch, Output(read_end), read_end


def test_watch_json_shows_a_curl_through_the_proxy_and_filters(
    stack_env: dict[str, str], started: list[int]
) -> None:
    """Every request the proxy sees is a row, not only worker callbacks; --grep keeps what mentions it."""
    watch, out, read_end = watch_into_a_pipe(stack_env, started, "--json", "--grep", "curl-in-watch")
    try:
        status = json.loads(run_invoke("status", "--json", "--stack", STACK, env=stack_env).stdout)
        http, pod = status["proxy"]["http"], status["pods"][0]["target"]
        front = f"{http['name']}:{http['port']}"
        request_ids(stack_env, "http-echo", 1)  # a callback: not shown, it does not mention the text
        deadline = time.monotonic() + ROW_TIMEOUT
        # The watch shows what happens from its start on (its imports take a second): curl until a row comes,
        # each curl's row SETTLE_SECONDS after the watch read it (it waits for a callback to claim the line).
        while not out.text and time.monotonic() < deadline:
            subprocess.run(
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
                    "curl-in-watch\x1b[31m",
                    f"{pod}/v2/nvcf/worker/request-attach",
                ],
                capture_output=True,
                timeout=COMMAND,
                check=False,
            )
            out.read_until(lambda text: b"\n" in text, 0.5)
        rows = [json.loads(line) for line in out.text.decode().splitlines()]
        assert rows and {r["kind"] for r in rows} == {"request"}, out.text
        assert rows[0]["ua"].startswith("curl-in-watch") and rows[0]["status"] == "401"
        assert b"\x1b" not in out.text  # what the client sent is escaped, never a terminal control
    finally:
        watch.send_signal(signal.SIGINT)  # Ctrl-C: the stack stays up for the next test
        assert watch.wait(EXIT_TIMEOUT) == 0
        os.close(read_end)


def test_watch_into_a_pipe_prints_plain_lines_and_ends_with_the_stack(
    stack_env: dict[str, str], started: list[int]
) -> None:
    watch, out, read_end = watch_into_a_pipe(stack_env, started)
    # The header is printed once the watch is reading the stack's files.
    assert out.read_until(lambda text: b"\n" in text, ROW_TIMEOUT), out.text
    assert out.text.split()[:3] == [b"time", b"request", b"kind"]

    ids = request_ids(stack_env, "http-echo", 3)
    assert out.read_until(lambda text: text.count(b"\n") >= 1 + len(ids), ROW_TIMEOUT), out.text
    lines = out.text.decode().splitlines()[1:]
    assert sorted(line.split()[1] for line in lines) == sorted(rid[:8] for rid in ids)
    assert all(line.rstrip().endswith(" ok") and "\x1b" not in line for line in lines)

    try:
        assert run_invoke("down", "--stack", STACK, env=stack_env).returncode == 0
        assert out.wait_end(EXIT_TIMEOUT), "the watch did not end with the stack"
        assert watch.wait(EXIT_TIMEOUT) == 0
        assert out.text.decode().rstrip().endswith("the stack is down")
    finally:
        os.close(read_end)
