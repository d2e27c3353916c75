"""Config renders, from a table; every valid render is also checked by `nats-server -t`."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from nats_support import SHORT, Keys

from sim.nats.config import CalloutBlock, ConfigError, NkeyUser, ServerConfig, render
from sim.nats.server import find_binary

KEYS = Keys()
CALLOUT = KEYS.callout_block()
WORKER = Keys.pub(KEYS.worker)
INTERNAL = KEYS.internal_users()
BASE = ServerConfig(store_dir="/tmp/js", port=4222, monitor_port=8222, internal_users=INTERNAL)

VALID = [
    # (case, config, must contain, must not contain)
    (
        "static nkey",
        replace(BASE, worker_nkey=WORKER),
        [
            f'{{ nkey: "{WORKER}" }}  # shared worker',
            "jetstream: enabled",
            'listen: "127.0.0.1:4222"',
            'http: "127.0.0.1:8222"',
            "timeout: 2",
        ],
        ["auth_callout", "AUTH {"],
    ),
    (
        "callout, nkey mode",
        replace(BASE, callout=CALLOUT),
        [
            f'issuer: "{CALLOUT.issuer}"',
            "account: AUTH",
            f'auth_users: [ "{CALLOUT.user}", "{INTERNAL[0].nkey}" ]',
            f'AUTH {{ users: [ {{ nkey: "{CALLOUT.user}" }} ] }}',
            "# invocation-service",
        ],
        [WORKER],
    ),
    (
        "callout, token mode",
        replace(BASE, callout=CALLOUT, worker_auth="token"),
        ["auth_callout {", "account: AUTH"],
        [WORKER],
    ),
    (
        "port 0 is the server's choice",
        replace(BASE, worker_nkey=WORKER, port=0, monitor_port=0, ports_file_dir="/tmp/p"),
        ['listen: "127.0.0.1:-1"', 'http: "127.0.0.1:-1"', 'ports_file_dir: "/tmp/p"'],
        [],
    ),
    ("auth timeout", replace(BASE, worker_nkey=WORKER, auth_timeout=0.5), ["timeout: 0.5"], []),
    ("ping interval", replace(BASE, worker_nkey=WORKER, ping_interval=0.2), ['ping_interval: "200ms"'], []),
    ("nats-server's ping interval", replace(BASE, worker_nkey=WORKER), [], ["ping_interval"]),
    (
        "the server rotates its own log",
        replace(BASE, worker_nkey=WORKER),
        ["logfile_size_limit: 67108864", "logfile_max_num: 2"],
        [],
    ),
    (
        "quoted store dir",
        replace(BASE, worker_nkey=WORKER, store_dir='/tmp/a "b"'),
        ['store_dir: "/tmp/a \\"b\\""'],
        [],
    ),
]

INVALID = [
    ("mode", replace(BASE, worker_nkey=WORKER, worker_auth="jwt"), "nats.workerAuth must be nkey or token"),  # type: ignore[arg-type]
    ("token without callout", replace(BASE, worker_auth="token"), "needs the auth callout"),
    ("nkey without key", BASE, "needs worker_nkey"),
    ("worker key with callout", replace(BASE, callout=CALLOUT, worker_nkey=WORKER), "callout's mappings"),
    (
        "issuer not an account key",
        replace(BASE, callout=CalloutBlock(issuer=WORKER, user=CALLOUT.user)),
        "callout.issuer",
    ),
    ("seed instead of key", replace(BASE, worker_nkey=Keys.seed(KEYS.worker)), "worker_nkey"),
    (
        "internal user key",
        replace(BASE, worker_nkey=WORKER, internal_users=(NkeyUser("x", "bad"),)),
        "internal_users[x]",
    ),
    ("port 0 without ports file", replace(BASE, worker_nkey=WORKER, port=0), "ports_file_dir"),
    ("port range", replace(BASE, worker_nkey=WORKER, port=70000), "port 70000"),
]


@pytest.mark.parametrize("case,config,present,absent", VALID, ids=[c[0] for c in VALID])
def test_render(
    case: str, config: ServerConfig, present: list[str], absent: list[str], tmp_path: Path
) -> None:
    text = render(config)
    for needle in present:
        assert needle in text, f"{case}: {needle!r} missing from\n{text}"
    for needle in absent:
        assert needle not in text, f"{case}: {needle!r} should not be in\n{text}"
    path = tmp_path / "n.conf"
    path.write_text(text)
    check = subprocess.run(
        [str(find_binary()), "-t", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=SHORT,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("case,config,message", INVALID, ids=[c[0] for c in INVALID])
def test_render_refuses(case: str, config: ServerConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        render(config)
    assert message in str(err.value), case
