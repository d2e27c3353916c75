"""`ncpsim bench` checks its peers (nginx, dnsmasq) before it starts (issue 15): a missing one is named with
the command that installs it, and its comparison is reported as skipped, not failed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench import peers, runner
from bench.targets import judge


def which_only(*present: str):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_missing_peers_are_found_before_anything_starts(tmp_path: Path) -> None:
    sbin = tmp_path  # an empty /usr/sbin: what this machine has installed must not matter
    assert [p.binary for p in peers.missing(which_only("apt-get"), sbin)] == ["nginx", "dnsmasq"]
    assert [p.binary for p in peers.missing(which_only("nginx"), sbin)] == ["dnsmasq"]
    assert peers.missing(which_only("nginx", "dnsmasq"), sbin) == []
    (sbin / "dnsmasq").write_text("#!/bin/sh\n")
    (sbin / "dnsmasq").chmod(0o755)
    assert [p.binary for p in peers.missing(which_only("nginx"), sbin)] == []  # found off PATH, in sbin


@pytest.mark.parametrize(
    ("present", "root", "command"),
    [
        (("apt-get",), True, ["apt-get", "install", "-y", "nginx-light", "dnsmasq-base"]),
        (("apt-get",), False, ["sudo", "apt-get", "install", "-y", "nginx-light", "dnsmasq-base"]),
        (("brew",), False, ["brew", "install", "nginx", "dnsmasq"]),
        ((), False, None),
    ],
)
def test_install_command_for_this_machine(
    present: tuple[str, ...], root: bool, command: list[str] | None
) -> None:
    assert peers.install_command(list(peers.PEERS), which_only(*present), root=root) == command


def test_advice_names_each_peer_its_comparison_and_the_fix() -> None:
    text = peers.advice(list(peers.PEERS), which_only("apt-get"))
    lines = text.splitlines()
    assert lines[0].startswith("bench: nginx is not installed: skipping relay")
    assert lines[1].startswith("bench: dnsmasq is not installed: skipping dns")
    assert "apt-get install -y nginx-light dnsmasq-base" in lines[2] and "--install-peers" in lines[2]


def test_check_installs_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nginx, dnsmasq = peers.PEERS
    installed: list[list[str]] = []
    monkeypatch.setattr(peers, "missing", lambda: [nginx, dnsmasq])

    def install(wanted: list[peers.Peer]) -> list[peers.Peer]:
        installed.append([p.binary for p in wanted])
        return [dnsmasq]  # nginx installed, dnsmasq not

    monkeypatch.setattr(peers, "install", install)
    assert peers.check(install_peers=False) == {"nginx", "dnsmasq"} and installed == []
    assert peers.check(install_peers=True) == {"dnsmasq"} and installed == [["nginx", "dnsmasq"]]
    assert "dnsmasq is not installed" in capsys.readouterr().err


def test_skipped_comparisons_are_neither_errors_nor_misses() -> None:
    results = {
        "relay": {"keepalive": {}, "new_connection": peers.skipped("nginx")},
        "dns": peers.skipped("dnsmasq"),
        "catalogue": {"skipped": True},
    }
    assert runner.skipped_comparisons(results) == [
        "nginx is not installed (relay: keep-alive and new-TLS-connection callbacks, proxy vs nginx)",
        "dnsmasq is not installed (dns: queries/s, resolver vs dnsmasq)",
    ]
    assert not [k for k, v in results.items() if isinstance(v, dict) and v.get("error")]
    rows = {r.figure.split(",")[0]: r for r in judge(results)}
    assert all(row.met is not False for row in rows.values())


def test_sections_without_their_peers_are_skipped_not_failed(tmp_path: Path) -> None:
    """The shared relay/DNS stack still runs the keep-alive comparison, which needs no peer."""
    plan = replace(runner.QUICK, keepalive_calls=20)
    relayed, dns = runner._relay_and_dns(plan, tmp_path, tmp_path, frozenset({"nginx", "dnsmasq"}))
    assert "error" not in relayed, relayed
    assert relayed["new_connection"] == peers.skipped("nginx") and dns == peers.skipped("dnsmasq")
    assert relayed["keepalive"]["proxy"]["per_second"] > 0
    assert not _processes_under(tmp_path), "the bench stack was left running"


def _processes_under(folder: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            alive = proc.name.isdigit() and (proc / "stat").read_text().split(")")[-1].split()[0] != "Z"
            if alive and str(folder).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found
