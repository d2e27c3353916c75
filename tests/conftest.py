"""Shared fixtures: a stack on the local backend in a temporary state root, always torn down."""

from __future__ import annotations

import compileall
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import markers
import pytest
import timeouts

from clusters.local import LocalBackend, LocalStack, zygote
from scenarios.engine import run_scenario
from scenarios.load import load_scenario
from scenarios.result import ScenarioResult

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "sim", "scenarios", "clusters", "dns", "certs", "bench")
# pytest keeps each test module's assert-rewritten code in __pycache__, but not when PYTHONDONTWRITEBYTECODE
# is set: then every process of every run rewrote all hundred test modules again (about half of the
# collection's time). Written here as ncpsim's own .pyc files are below, for the same reason.
sys.dont_write_bytecode = False


# The suite's temporary folders go to a RAM-backed file system when the machine has one with room. About 300
# stacks write certificates, state files, logs and JetStream stores, many small files renamed into place and
# deleted. On this machine's disk (ext4, mounted with discard) against /dev/shm, the whole suite alternated
# idle (2026-12-04): 213.0 and 205.1 s wall, 299.8 and 289.5 CPU-s; 198.5 and 198.7 s, 271.9 and 274.8 CPU-s.
# About 70 MB a run; pytest keeps the last three. Elsewhere (macOS, a container's small /dev/shm, --basetemp
# or PYTEST_DEBUG_TEMPROOT given) pytest's own choice stands.
RAM_DISK = Path("/dev/shm")
RAM_DISK_ROOM = 1 << 30


def ram_disk() -> Path | None:
    """/dev/shm when it is a tmpfs this user can write with at least RAM_DISK_ROOM free, else None."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
        room = os.statvfs(RAM_DISK)
    except OSError:
        return None
    tmpfs = any(line.split()[1:3] == [str(RAM_DISK), "tmpfs"] for line in mounts if len(line.split()) > 2)
    if tmpfs and room.f_bavail * room.f_frsize >= RAM_DISK_ROOM and os.access(RAM_DISK, os.W_OK | os.X_OK):
        return RAM_DISK
    return None


# One xdist worker more than the machine has cores (`-n auto` in pyproject.toml). A third of the suite's time
# is spent waiting on the timings it models (JetStream's elections, nats-py's reconnects, link latency, the
# API's publish deadline), with less than one core busy: a third worker keeps both cores working through them.
# The README's command, idle on 2 cores, back to back (2026-12-04): -n 2 175.9 s wall, 232.7 CPU-s; -n 3
# 136.5 s, 223.4 CPU-s; -n 4 132.2 s, 240.3 CPU-s.
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile ncpsim once, before any test starts a component. Python writes the .pyc files on a
    module's first import, unless PYTHONDONTWRITEBYTECODE is set (CI images often set it): then each of
    the suite's thousand component processes would compile every module it imports again."""
    if not hasattr(config, "workerinput"):  # the controller, not each xdist worker
        for package in PACKAGES:
            compileall.compile_dir(REPO / package, quiet=1)
        os.environ[timeouts.LOAD_ENV] = str(timeouts.LOAD)  # one figure for the run: the workers inherit it
        # pytest's documented override of the system's temporary folder, read when the base folder is first
        # made (xdist's workers get theirs under the controller's)
        if (
            config.option.basetemp is None
            and "PYTEST_DEBUG_TEMPROOT" not in os.environ
            and (disk := ram_disk())
        ):
            os.environ["PYTEST_DEBUG_TEMPROOT"] = str(disk)


# The test files that take longest (test-seconds summed per file), longest first. xdist hands out whole
# files in collection order (--no-loadscope-reorder in pyproject.toml): these start first, so no worker is
# left with one of them at the end while the other has finished. A stale guess costs time, never a result.
# The order of the suite's JUnit times (main 7ba0cb5, both workers busy: what a file takes in the suite, not
# alone), the files this round made cheaper moved down by what they saved (-n 0, back to back, 2026-12-04).
LONGEST_FIRST = (
    "test_teardown.py",
    "test_catalogue.py",
    "test_diagnose.py",
    "test_nats_stack.py",
    "test_k3d_commands.py",
    "test_bundle_diagnose.py",
    "test_nats_cluster.py",
    "test_printed_commands.py",
    "test_program.py",
    "test_types.py",  # mypy: a second or so with its cache, 25 s without (a fresh clone): early either way
    "test_faults.py",
    "test_hostile_http.py",
    "test_customer_world_e2e.py",
    "test_policy_props.py",
    "test_grpc_e2e.py",
    "test_replay_interrupt.py",
    "test_watch.py",
    "test_report_failing.py",
    "test_hostile_pods.py",
    "test_fuzz_files.py",
    "test_cli_state.py",
    "test_devenv.py",
    "test_k3d_envoy_proto.py",
    "test_h1plain.py",
    "test_rotation.py",
    "test_runbook_registry.py",
    "test_h3_pool.py",
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the marker must be there to be read
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markers.mark_e2e(items)
    items[:] = markers.without_long(config, items)
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    # pytest-timeout's limit bounds a hang, as the suite's other timeouts do: it stretches with the load too
    # (a module fixture that replays fifteen scenarios counts against its first test's limit).
    hang = timeouts.scaled(float(config.getini("timeout") or 0))
    for item in items:
        if hang and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(hang))


def pytest_report_header() -> list[str]:
    root = os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()
    return [
        f"ncpsim: timeouts (pytest-timeout's too) scaled x{timeouts.LOAD:.2f} (load average per core at the "
        + "start, never below 1)",
        f"ncpsim: temporary folders under {root}",
    ]


def stack_processes_alive(stack: LocalStack) -> dict[str, int]:
    return stack.launcher.running()


@pytest.fixture(scope="session", autouse=True)
def launches_share_a_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every stack this test process launches takes its zygote from one preloaded zygote, as a replay of
    several scenarios does (clusters.local.zygote.shared): the runners' imports once a worker, not once a
    stack. `ncpsim` commands run as processes start zygotes of their own, as a user's do."""
    with zygote.shared(tmp_path_factory.getbasetemp()):
        yield


@pytest.fixture
def own_zygote(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test of the zygote a launch starts itself (an `ncpsim up`): no shared one for its launches."""
    monkeypatch.setattr(zygote, "_SHARED", None)


@pytest.fixture(scope="module")
def http_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, ScenarioResult]]:
    """The http-callback scenario, up for the whole module; the teardown fails if anything survives."""
    root = tmp_path_factory.mktemp("ncpsim")
    stack = LocalStack("e2e-http", root=root)
    try:
        result = run_scenario(load_scenario("http-callback"), LocalBackend(stack.root), stack.name, keep=True)
        yield stack, result
    finally:
        stack.down()
        assert not stack_processes_alive(stack), "components still running after down"


@pytest.fixture
def invoke_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running `invoke` as a user would, with state under tmp_path."""
    return {**os.environ, "NCPSIM_HOME": str(tmp_path / "state")}


@pytest.fixture
def sigint_as_on_a_terminal() -> Iterator[None]:
    """Children started by the test get Ctrl-C's default action, as a terminal's foreground job does, even
    when the test run itself ignores SIGINT (a shell's background job, `pytest &`): an ignored signal is
    inherited across exec, and a test of what Ctrl-C does would then test nothing."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
