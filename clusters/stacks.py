"""The stacks under the state root (`ncpsim ls`, `ncpsim down --all`): each folder ncpsim made, and its state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.local.stack import LocalStack
from clusters.state import STACK_NAME, is_stack_dir, state_root
from sim.errors import ConfigError


@dataclass(frozen=True)
class StackEntry:
    name: str
    state: str  # running | partly up | degraded | stopped
    scenario: str
    state_dir: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "scenario": self.scenario,
            "stateDir": str(self.state_dir),
        }


def stack_names(root: Path | None = None) -> list[str]:
    """Every stack folder ncpsim made under the root (marked), in name order; nothing else there counts."""
    folder = root or state_root()
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if STACK_NAME.match(p.name) and _readable_stack(p))


def _readable_stack(folder: Path) -> bool:
    """A folder ncpsim may not look into is not one it made (its folders are its own): not listed, so one
    foreign folder under the root does not hide every stack from `ls` and `down --all`."""
    try:
        return is_stack_dir(folder)
    except ConfigError:
        return False


def list_stacks(root: Path | None = None) -> list[StackEntry]:
    return [_entry(LocalStack(name, root)) for name in stack_names(root)]


def _entry(stack: LocalStack) -> StackEntry:
    status = stack.status()
    if status is None:
        return StackEntry(stack.name, "stopped", "", stack.state_dir)
    if not status.get("complete", True):
        state = "partly up"
    else:
        state = "degraded" if status.get("down") else "running"
    return StackEntry(stack.name, state, str(status.get("scenario") or ""), stack.state_dir)
