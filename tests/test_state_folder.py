"""The state folder attacked as a user on the same machine, or a mistake, would (issue 16, items 3, 5, 7, 8):
an unusable NCPSIM_HOME, `down --purge` aimed at a folder ncpsim did not make, symbolic links planted where
ncpsim writes, two `ncpsim up` at once, an `ncpsim up` SIGKILLed mid-start, a component killed under a
running stack. Every case runs the real command line (in-process, but for the `ncpsim up`s that must be
processes: two at once, one SIGKILLed); a refusal is one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cli_support import REPO, ncpsim
from timeouts import COMMAND, STACK_COMMAND, scaled

from sim.model.events import read_events

START = scaled(
    30.0
)  # until the components of an `ncpsim up` have reported ready (READY_TIMEOUT: 15 s a phase)
POLL = 0.005  # between looks at the pid folder: a worker must be caught long before it could be ready
SCENARIO = "http-callback"
STACK = "st"


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """A user-facing refusal: exit 2, one line, no traceback, naming what is wrong."""
    line = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    for word in words:
        assert word in line, line
    return line


def home(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "NCPSIM_HOME": str(tmp_path / "state")}


def component_pids(state: Path) -> dict[str, int]:
    """The recorded pids; a file caught as the launcher writes it (created, still empty) is not one yet,
    as the launcher's own reader takes it."""
    folder = state / "pids"
    found = {p.stem: p.read_text().strip() for p in folder.glob("*.pid")} if folder.exists() else {}
    return {name: int(text) for name, text in found.items() if text}


def living(pids: dict[str, int]) -> set[str]:
    out = set()
    for name, pid in pids.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(name)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def teardown(tmp_path: Path) -> Iterator[list[dict[str, int]]]:
    """Every component a test saw is gone when it ends, whatever happened (`ncpsim down`, then SIGKILL)."""
    seen: list[dict[str, int]] = []
    yield seen
    ncpsim("down", "--stack", STACK, env=home(tmp_path))
    left = {name: pid for pids in seen for name, pid in pids.items() if name in living(pids)}
    for pid in left.values():
        os.killpg(pid, signal.SIGKILL)
    assert not left, f"components still running after the test: {left}"


# NCPSIM_HOME unusable (item 3, item 7) ----------------------------------------------------------------
def test_empty_ncpsim_home_is_refused_and_the_current_folder_untouched(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / "sim").mkdir(parents=True)
    (clone / "sim" / "__init__.py").write_text("# the source package\n")
    env = {**os.environ, "NCPSIM_HOME": ""}
    refused(ncpsim("down", "--purge", "--stack", "sim", env=env, cwd=clone), "NCPSIM_HOME")
    refused(ncpsim("status", "--stack", "sim", env=env, cwd=clone), "NCPSIM_HOME")
    refused(ncpsim("up", SCENARIO, "--stack", "sim", env=env, cwd=clone), "NCPSIM_HOME")
    assert (clone / "sim" / "__init__.py").read_text() == "# the source package\n"
    assert sorted(p.name for p in clone.iterdir()) == ["sim"]


@pytest.mark.parametrize("command", [("status",), ("up", SCENARIO), ("down", "--purge")])
def test_ncpsim_home_a_file_is_refused(tmp_path: Path, command: tuple[str, ...]) -> None:
    state = tmp_path / "a-file"
    state.write_text("not a folder\n")
    refused(ncpsim(*command, "--stack", STACK, env={**os.environ, "NCPSIM_HOME": str(state)}), "not a folder")
    assert state.read_text() == "not a folder\n"


@pytest.mark.parametrize("where", ["/proc/self/ncpsim", "/proc/ncpsim-state"])
def test_ncpsim_home_where_nothing_can_be_created_is_refused(where: str) -> None:
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    refused(ncpsim("up", SCENARIO, "--stack", STACK, env={**os.environ, "NCPSIM_HOME": where}), "NCPSIM_HOME")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder anyway")
def test_ncpsim_home_read_only_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "ro"
    state.mkdir(mode=0o500)
    try:
        refused(
            ncpsim("up", SCENARIO, "--stack", STACK, env={**os.environ, "NCPSIM_HOME": str(state)}),
            "NCPSIM_HOME",
        )
    finally:
        state.chmod(0o700)


# down --purge deletes only a stack folder ncpsim made (item 3, item 5) ---------------------------------------
def test_purge_refuses_a_folder_ncpsim_did_not_make(tmp_path: Path) -> None:
    """NCPSIM_HOME pointing at a clone: `--stack sim` names the source package, which must survive."""
    clone = tmp_path / "clone"
    (clone / "sim").mkdir(parents=True)
    (clone / "sim" / "__init__.py").write_text("# the source package\n")
    env = {**os.environ, "NCPSIM_HOME": str(clone)}
    down = ncpsim("down", "--purge", "--stack", "sim", env=env)
    refused(down, "not an ncpsim stack folder", "nothing stopped or removed")
    assert "removed the state folder" not in down.stdout
    assert sorted(p.name for p in (clone / "sim").iterdir()) == ["__init__.py"]


def test_purge_refuses_a_stack_folder_that_is_a_link(tmp_path: Path) -> None:
    from clusters.state import create_stack_dir

    target = tmp_path / "precious"
    create_stack_dir(target)  # even a marked folder: the link is not ours
    (target / "keep.txt").write_text("keep\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / STACK).symlink_to(target)
    down = ncpsim("down", "--purge", "--stack", STACK, env=home(tmp_path))
    refused(down, "symbolic link", "nothing")
    assert "removed the state folder" not in down.stdout
    assert (target / "keep.txt").read_text() == "keep\n"


def test_purge_removes_a_stack_folder_ncpsim_made(tmp_path: Path) -> None:
    from clusters.state import create_stack_dir

    create_stack_dir(tmp_path / "state" / STACK)
    down = ncpsim("down", "--purge", "--stack", STACK, env=home(tmp_path))
    assert down.returncode == 0 and "removed the state folder" in down.stdout, down.stderr
    assert not (tmp_path / "state" / STACK).exists()


def test_a_folder_holding_only_what_ncpsim_writes_is_adopted(tmp_path: Path) -> None:
    """An ncpsim from before the marker made the folder: it is ours, and purge removes it."""
    from certs.store import CertStore

    env = home(tmp_path)
    CertStore(tmp_path / "state" / STACK / "certs").ensure_cas()  # what an older `certs` left, no marker
    assert ncpsim("certs", "--stack", STACK, env=env).returncode == 0  # adopted: a stack to every task
    (tmp_path / "state" / STACK / ".ncpsim-stack").unlink(missing_ok=True)
    down = ncpsim("down", "--purge", "--stack", STACK, env=env)
    assert down.returncode == 0 and "removed the state folder" in down.stdout, down.stdout + down.stderr
    assert not (tmp_path / "state" / STACK).exists()


@pytest.mark.parametrize(
    ("entry", "ours"),
    [
        ("..ncpsim-stack.k2j3x.tmp", True),
        (".status.json.0q9z.tmp", False),  # a write cut short (tests/test_write_file.py)
        (".bashrc.tmp", False),
    ],
)
def test_a_folder_another_command_is_marking_is_adopted(tmp_path: Path, entry: str, ours: bool) -> None:
    """Two `up`s at once both create the folder: one may look in while the other's marker is still the
    temporary it is written to (clusters.state.write_file), which must not read as someone else's file;
    any other temporary still does."""
    from clusters.state import adopt

    folder = tmp_path / STACK
    folder.mkdir()
    (folder / entry).write_text("")
    assert adopt(folder) is ours


# Symbolic links planted where ncpsim writes (item 5) -----------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "topology.json",
        "status.json",
        "netmap.json",
        "logs",
        "events",
        "reports",
        "certs",
        "pids",
        "nats",
        "netmap.tmp",
        "certs/ca",
        "certs/secrets/grpc-proxy-worker-tls/tls.key",
    ],
)
def test_up_refuses_a_planted_link(tmp_path: Path, name: str, teardown: list[dict[str, int]]) -> None:
    from clusters.state import create_stack_dir

    stack = tmp_path / "state" / STACK
    create_stack_dir(stack)
    victim = tmp_path / "victim"
    if "." in name:
        victim.write_text("the victim's file\n")
    else:
        victim.mkdir()
    (stack / name).parent.mkdir(parents=True, exist_ok=True)
    (stack / name).symlink_to(victim)
    up = ncpsim("up", SCENARIO, "--stack", STACK, env=home(tmp_path))
    teardown.append(component_pids(stack))
    refused(up, name, "symbolic link")
    if victim.is_dir():
        assert list(victim.iterdir()) == [], "files were written through the planted link"
    else:
        assert victim.read_text() == "the victim's file\n"
    assert not component_pids(stack), "components started although the state folder was refused"


# Two `ncpsim up` at once, and a component killed under a running stack (item 8) ------------------------------
def test_two_simultaneous_ups_one_wins_and_the_loser_stops_nothing(
    tmp_path: Path, teardown: list[dict[str, int]]
) -> None:
    env, stack = home(tmp_path), tmp_path / "state" / STACK
    command = [sys.executable, "-m", "invoke", "--search-root", str(REPO), "up", SCENARIO, "--stack", STACK]
    runs = [
        subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        results = [run.communicate(timeout=STACK_COMMAND) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    pids = component_pids(stack)
    teardown.append(pids)
    codes = sorted(run.returncode for run in runs)
    assert codes == [0, 2], results
    loser = results[[run.returncode for run in runs].index(2)]
    assert len(loser[1].strip().splitlines()) == 1 and "Traceback" not in loser[1], loser[1]
    assert "busy" in loser[1] or "already running" in loser[1], loser[1]
    # The loser stopped none of the winner's components: every one of them still runs.
    status = ncpsim("status", "--json", "--stack", STACK, env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    current = json.loads(status.stdout)
    assert (
        current["down"] == [] and current["running"] and living(pids) == set(pids) == set(current["running"])
    )

    # Item 8: the proxy killed under the running stack; status must not print it as if it ran, and exits 1.
    proxy = pids["worker-callback-proxy"]
    os.killpg(proxy, signal.SIGKILL)
    wait_for("the proxy to go", lambda: "worker-callback-proxy" not in living(pids), COMMAND)
    text = ncpsim("status", "--stack", STACK, env=env)
    assert text.returncode == 1, text.stdout
    assert "down: worker-callback-proxy" in text.stdout
    assert json.loads(ncpsim("status", "--json", "--stack", STACK, env=env).stdout)["down"] == [
        "worker-callback-proxy"
    ]


# `ncpsim up` SIGKILLed mid-start (item 8) -----------------------------------------------------------------------
def wait_for(what: str, check, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(POLL)


def phase_one_read(stack: Path, names: set[str]) -> bool:
    """The launcher has read each of these components' ready line: it saves a component's bindings in the
    network map as soon as it reads them, so a component whose reported bindings are all in the map cannot
    die writing to a dead `up`'s pipe."""
    try:
        mapped = json.loads((stack / "netmap.json").read_text())["bindings"]
    except (OSError, ValueError, KeyError):
        return False  # not written yet, or caught mid-write
    for name in names:
        ready = [e for e in read_events(stack) if e["component"] == name and e["kind"] == "component.ready"]
        if not ready or not set(ready[0]["bindings"]) <= set(mapped):
            return False
    return True


def test_status_after_up_is_sigkilled_mid_start(tmp_path: Path, teardown: list[dict[str, int]]) -> None:
    """The control plane is ready, the worker hosts are held (SIGSTOP) so the start cannot finish, and then
    `ncpsim up` is SIGKILLed: its components keep running without status.json, and status must say so."""
    env, stack = home(tmp_path), tmp_path / "state" / STACK
    up = subprocess.Popen(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO), "up", SCENARIO, "--stack", STACK],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    held: dict[str, int] = {}
    try:

        def workers_held() -> bool:
            for name, pid in component_pids(stack).items():
                if name.startswith("ncpsim-compute") and name not in held:
                    os.killpg(pid, signal.SIGSTOP)
                    held[name] = pid
            return bool(held) and (stack / "topology.json").exists()

        wait_for("the worker hosts to start", workers_held, START)
        # The proxy is forked after the worker hosts (its imports are the heaviest): the last to start.
        wait_for("the proxy to start", lambda: "worker-callback-proxy" in component_pids(stack), START)
        pids = component_pids(stack)
        teardown.append(pids)
        control = set(pids) - set(held)
        wait_for("the control plane to be ready", lambda: phase_one_read(stack, control), START)
        assert not (stack / "status.json").exists()
    finally:
        up.kill()
        up.wait(COMMAND)
    for pid in held.values():  # the held workers cannot report ready to a dead `up`: they are down
        os.killpg(pid, signal.SIGKILL)
    wait_for("the held workers to go", lambda: not living(held), COMMAND)

    text = ncpsim("status", "--stack", STACK, env=env)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "not up" not in text.stdout and "partly up" in text.stdout, text.stdout
    current = json.loads(ncpsim("status", "--json", "--stack", STACK, env=env).stdout)
    assert current["complete"] is False
    assert set(current["running"]) == control == living(pids) - set(held)
    assert set(current["down"]) == set(held)

    down = ncpsim("down", "--stack", STACK, env=env)
    assert down.returncode == 0 and f"stopped {len(control)} processes" in down.stdout, (
        down.stdout + down.stderr
    )
    assert not living(pids)


def test_a_pid_file_naming_a_foreign_process_is_not_a_component(tmp_path: Path) -> None:
    """Ownership is checked (psutil, also on macOS): a pid file pointing at another process is not trusted."""
    from clusters.state import create_stack_dir

    stack = tmp_path / "state" / STACK
    create_stack_dir(stack)
    (stack / "pids").mkdir()
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    ) as other:
        try:
            (stack / "pids" / "worker-callback-proxy.pid").write_text(str(other.pid))
            status = ncpsim("status", "--stack", STACK, env=home(tmp_path))
            assert status.returncode == 1 and "not up" in status.stdout, status.stdout
            down = ncpsim("down", "--stack", STACK, env=home(tmp_path))
            assert down.returncode == 0 and other.poll() is None, "down stopped a process that is not ours"
        finally:
            other.stdin.close()  # type: ignore[union-attr]
            other.wait(COMMAND)


def test_k3d_purge_refuses_a_folder_ncpsim_did_not_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same attack through the k3d backend (fake k3d and docker first on PATH): the clusters go, the
    clone's sim/ package stays."""
    import importlib.util

    from clusters.k3d.runner import CommandRunner
    from clusters.k3d.stack import K3dBackend
    from sim.errors import ConfigError

    spec = importlib.util.spec_from_file_location("ncpsim_fake_tools", REPO / "tests" / "fakebin" / "fake.py")
    assert spec and spec.loader
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    tools = fake.Harness(tmp_path)
    clone = tmp_path / "clone"
    (clone / "sim").mkdir(parents=True)
    (clone / "sim" / "__init__.py").write_text("# the source package\n")
    monkeypatch.setenv("NCPSIM_HOME", str(clone))
    with pytest.raises(ConfigError, match="not an ncpsim stack folder"):
        K3dBackend(CommandRunner(env=tools.env, echo=None), NoEngine()).attach("sim").down(purge=True)
    assert sorted(p.name for p in (clone / "sim").iterdir()) == ["__init__.py"]


class NoEngine:
    """The docker SDK seam, never reached by `down` (the default would open Docker's socket)."""

    def version(self) -> str:
        raise AssertionError("down must not ask the Docker engine")

    def build(self, context: bytes, dockerfile: str, tag: str) -> str:
        raise AssertionError("down must not build")
