"""`ncpsim up --secret NAME=DIR`: a Secret the user brings, placed in the stack as it is.

The folder holds what `kubectl create secret tls` takes (tls.crt, tls.key, optional ca.crt). It joins the
scenario's `topology.secrets` under NAME, replacing a declaration of the same name: the customer's own
certificate wins over what the scenario would issue, so `existingSecret: NAME` serves it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from certs.names import secret_name_problem
from scenarios.spec import Scenario
from sim.errors import ConfigError


def parse_secret_arg(arg: str) -> tuple[str, Path]:
    """`NAME=DIR` -> (NAME, absolute DIR); one-line errors for the mistakes a user makes."""
    name, sep, folder = arg.partition("=")
    name = name.strip()
    if not sep or not name or not folder.strip():
        raise ConfigError(f"--secret {arg!r}: use NAME=DIR, e.g. --secret worker-public-tls=./certs")
    if problem := secret_name_problem(name):  # the name is a folder of the stack's: `..` must not climb
        raise ConfigError(f"--secret {arg[:80]!r}: {problem}")
    path = Path(folder.strip()).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"--secret {name}={folder}: no such folder")
    return name, path


def with_brought_secrets(scenario: Scenario, args: list[str]) -> Scenario:
    """The scenario with each `--secret NAME=DIR` as a Secret whose content is that folder's."""
    if not args:
        return scenario
    declared = dict(scenario.topology.get("secrets") or {})
    for arg in args:
        name, path = parse_secret_arg(arg)
        declared[name] = {"source": str(path)}
    return replace(scenario, topology={**scenario.topology, "secrets": declared})
