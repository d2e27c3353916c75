"""Both backends are the seam's: mypy (tests/test_types.py, strict on this module) checks each assignment
below, so a backend or a stack that drifts from `clusters.stack.Backend`/`Stack` fails the suite. At run
time each backend attaches to a stack that was never brought up, through the protocols alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusters.k3d.stack import K3dBackend, K3dStack
from clusters.local import LocalBackend, LocalStack
from clusters.stack import Backend, Components, Stack
from scenarios.faults import FaultTarget


def never_up(backend: Backend, name: str) -> Stack:
    """A stack of that name, through the protocol only: nothing runs, so no status."""
    stack = backend.attach(name)
    assert (stack.name, stack.backend, stack.status()) == (name, backend.name, None)
    return stack


def test_local_backend_is_a_backend(tmp_path: Path) -> None:
    backend: Backend = LocalBackend(tmp_path)
    stack: Stack = never_up(backend, "seam")
    local: LocalStack = LocalBackend(tmp_path).attach("seam")
    components: Components | None = local.components  # fault steps drive its processes
    target: FaultTarget = local
    assert stack.state_dir == target.state_dir == tmp_path / "seam"
    assert components is local


def test_k3d_backend_is_a_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCPSIM_HOME", str(tmp_path))
    backend: Backend = K3dBackend()
    stack: Stack = never_up(backend, "seam")
    k3d: K3dStack = K3dBackend().attach("seam")
    target: FaultTarget = k3d
    assert stack.state_dir == target.state_dir == tmp_path / "seam"
    assert k3d.components is None  # no process control on k3d: fault steps that need it say so
