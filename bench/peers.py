"""The programs `ncpsim bench` compares ncpsim with (nginx, dnsmasq): checked before anything starts.

A missing peer costs only its comparison: the run says so first, with the command that installs it (or
runs that command with `--install-peers`), and reports that comparison as skipped, not failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

INSTALL_TIMEOUT = 600.0  # a package manager on a slow mirror


@dataclass(frozen=True)
class Peer:
    binary: str
    compares: str  # the comparison that needs it
    apt: str  # Debian/Ubuntu package
    brew: str  # Homebrew formula


PEERS = (
    Peer(
        "nginx", "relay: keep-alive and new-TLS-connection callbacks, proxy vs nginx", "nginx-light", "nginx"
    ),
    Peer("dnsmasq", "dns: queries/s, resolver vs dnsmasq", "dnsmasq-base", "dnsmasq"),
)
Which = Callable[[str], str | None]


SBIN = Path("/usr/sbin")  # where Debian puts both, and a user's PATH often lacks


def located(binary: str, which: Which = shutil.which, sbin: Path = SBIN) -> str | None:
    """The peer's path: on PATH, or in /usr/sbin."""
    found = which(binary)
    if found:
        return found
    path = sbin / binary
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def missing(which: Which = shutil.which, sbin: Path = SBIN) -> list[Peer]:
    return [peer for peer in PEERS if located(peer.binary, which, sbin) is None]


def install_command(
    peers: list[Peer], which: Which = shutil.which, root: bool | None = None
) -> list[str] | None:
    """The package manager's command for these peers on this machine, or None when there is none we know."""
    root = os.geteuid() == 0 if root is None else root
    if which("apt-get"):
        sudo = [] if root else ["sudo"]
        return [*sudo, "apt-get", "install", "-y", *(p.apt for p in peers)]
    if which("brew"):
        return ["brew", "install", *(p.brew for p in peers)]
    return None


def advice(peers: list[Peer], which: Which = shutil.which) -> str:
    """One line per missing peer and the comparison it costs, then how to install them."""
    lines = [f"bench: {p.binary} is not installed: skipping {p.compares}" for p in peers]
    command = install_command(peers, which)
    how = " ".join(command) if command else f"your package manager ({', '.join(p.binary for p in peers)})"
    lines.append(f"bench: install with `{how}`, or run `ncpsim bench --install-peers`")
    return "\n".join(lines)


def install(peers: list[Peer], which: Which = shutil.which) -> list[Peer]:
    """Run the package manager for the missing peers; what is still missing afterwards."""
    command = install_command(peers, which)
    if command is None:
        print("bench: no apt-get or brew here to install the peers with", file=sys.stderr)
        return peers
    print(f"bench: {' '.join(command)}", file=sys.stderr, flush=True)
    try:
        subprocess.run(command, check=False, timeout=INSTALL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"bench: installing the peers failed: {exc}", file=sys.stderr)
    return [p for p in peers if located(p.binary, which) is None]


def check(install_peers: bool = False) -> frozenset[str]:
    """Before the run: the peers that are (still) missing, each said once on stderr."""
    absent = missing()
    if absent and install_peers:
        absent = install(absent)
    if absent:
        print(advice(absent), file=sys.stderr, flush=True)
    return frozenset(p.binary for p in absent)


def skipped(binary: str) -> dict[str, str]:
    """What a comparison records when its peer is missing: skipped, with why, and never an error."""
    peer = next(p for p in PEERS if p.binary == binary)
    return {"skipped": f"{binary} is not installed ({peer.compares})"}
