"""`ncpsim status`'s ports: what each component listens on, as `ss -ltnup` would show it."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from scenarios import state_view

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def row(local: str, remote: str, st: str, inode: int) -> str:
    return f"   0: {local} {remote} {st} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0\n"


@pytest.mark.parametrize(
    ("proto", "table", "expected"),
    [
        # 127.0.0.1:8080 listening, and a connection accepted on it (ESTABLISHED): only the listener
        (
            "tcp",
            HEADER
            + row("0100007F:1F90", "00000000:0000", "0A", 11)
            + row("0100007F:1F90", "0100007F:D431", "01", 12),
            {"11": "8080/tcp"},
        ),
        # [::]:10084 listening (tcp6's long addresses)
        (
            "tcp",
            HEADER + row("00000000000000000000000000000000:2764", "0" * 32 + ":0000", "0A", 13),
            {"13": "10084/tcp"},
        ),
        # a resolver's bound socket (UNCONN) and a QUIC client's connected one: only the bound one listens
        (
            "udp",
            HEADER
            + row("0100007F:0035", "00000000:0000", "07", 21)
            + row("0100007F:9BEF", "0100007F:94E5", "01", 22),
            {"21": "53/udp"},
        ),
        ("tcp", HEADER, {}),
        ("udp", HEADER + "   0: short line\n", {}),
    ],
    ids=["tcp-listen-not-established", "tcp6", "udp-unconn-not-connected", "empty", "malformed"],
)
def test_listening_sockets_from_a_table(proto: str, table: str, expected: dict[str, str]) -> None:
    assert state_view.listening_sockets(table, proto) == expected


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net")
def test_a_process_lists_what_it_listens_on_and_not_what_it_dialed() -> None:
    """This test's own process as the component: a TCP listener and a bound UDP socket are its ports; the
    connection to the listener and a connected UDP socket are not (the psutil path listed the latter)."""
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as bound,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as dialed,
        socket.create_connection(listener.getsockname()) as client,
    ):
        bound.bind(("127.0.0.1", 0))
        dialed.connect(bound.getsockname())
        ports = set(state_view.components({"me": os.getpid()})["me"]["ports"])
        assert {f"{listener.getsockname()[1]}/tcp", f"{bound.getsockname()[1]}/udp"} <= ports
        assert f"{dialed.getsockname()[1]}/udp" not in ports
        assert f"{client.getsockname()[1]}/tcp" not in ports


def test_a_gone_process_keeps_its_pid_and_no_ports() -> None:
    gone = 2**22 + 1  # above the kernel's pid_max ceiling: never a live process
    assert state_view.components({"gone": gone}) == {
        "gone": {"pid": gone, "uptimeSeconds": None, "ports": []}
    }


def test_a_component_listening_on_nothing_is_printed_without_trailing_blanks() -> None:
    extra = {
        "components": {
            "ncpsim-compute-1": {"pid": 7, "uptimeSeconds": 2.0, "ports": []},
            "resolver": {"pid": 8, "uptimeSeconds": 2.0, "ports": ["53/udp"]},
        }
    }
    assert state_view.text(extra) == [
        "  process        ncpsim-compute-1           pid 7       up 2 s",
        "  process        resolver                   pid 8       up 2 s     53/udp",
    ]
