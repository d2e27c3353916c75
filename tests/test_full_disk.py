"""A full disk is one line (issue 31, item 7): commands refuse before they start, components keep serving,
`down` still stops everything, and a later `up` works once there is room again."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import ncpsim
from stack_records import stack_processes

from clusters.state import MIN_FREE, require_room
from sim.errors import ConfigError
from sim.model.events import EventLog

# One NATS server: nothing here is about the NATS cluster (three wait for JetStream's first leader).
ONE_NATS_SERVER = ("--set", "nats.config.cluster.enabled=false")


class Stats:
    def __init__(self, free: int):
        self.f_bavail, self.f_frsize = free, 1


def test_require_room_names_the_folder_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "statvfs", lambda path: Stats(MIN_FREE - 1))
    with pytest.raises(
        ConfigError, match=rf"no space left for the stack in {tmp_path}/s .*down --all --purge"
    ):
        require_room(tmp_path / "s")
    monkeypatch.setattr(os, "statvfs", lambda path: Stats(MIN_FREE))
    require_room(tmp_path / "s")  # the control: room enough, nothing said


def test_an_event_log_on_a_full_disk_counts_and_keeps_going(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "pod.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    log = EventLog(tmp_path, "pod")
    for n in range(3):
        log.emit("pod.request", n=n)  # buffered by line: the first refused write shows here
    log.close()
    assert log.failed is not None and log.dropped >= 2
    assert capsys.readouterr().err.count("cannot write") == 1  # said once, not per event


@pytest.fixture
def tiny_home(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs as NCPSIM_HOME (root only: mount); unmounted whatever happens."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a 2 MiB tmpfs (CI runs as root)")
    where = tmp_path / "tiny"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_up_call_down_on_a_full_tmpfs(tiny_home: Path) -> None:
    home = tiny_home / "home"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return ncpsim(*args, home=home, cwd=tiny_home)

    up = run("up", *ONE_NATS_SERVER)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        filler = tiny_home / "fill"
        with open(filler, "wb") as handle, pytest.raises(OSError):
            while True:
                handle.write(b"\0" * 65536)
        for refused in (run("call", "http-echo"), run("up", "--stack", "second")):
            assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
            assert "no space left for the stack" in refused.stderr and "Traceback" not in refused.stderr
        down = run("down")
        assert down.returncode == 0 and re.match(r"stopped \d+ processes", down.stdout), (
            down.stdout + down.stderr
        )
        assert not stack_processes(tiny_home / "home" / "default")
        filler.unlink()
        again = run("up", "--stack", "after", *ONE_NATS_SERVER)
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        run("down", "--all")
        assert not stack_processes(tiny_home / "home" / "default")
