"""State files are replaced atomically, and a Ctrl-C in the middle leaves no temporary behind: a stack
folder holding a stray `.topology.json.*.tmp` is not ncpsim's any more, and `down` refuses it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusters.state import adopt, create_stack_dir, write_file
from sim.errors import ConfigError


@pytest.mark.parametrize(
    ("raised", "seen"), [(KeyboardInterrupt, KeyboardInterrupt), (OSError(28, "No space left"), ConfigError)]
)
def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: BaseException, seen: type[BaseException]
) -> None:
    stack = tmp_path / "s1"
    create_stack_dir(stack)
    write_file(stack / "topology.json", "old\n")

    def interrupted(src: str, dst: str) -> None:
        raise raised

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(seen):
        write_file(stack / "topology.json", "new\n")
    monkeypatch.undo()
    assert (stack / "topology.json").read_text() == "old\n"
    assert sorted(p.name for p in stack.iterdir()) == [".ncpsim-stack", "topology.json"]
    assert adopt(stack)


def test_a_stray_temporary_is_what_makes_a_folder_not_ours(tmp_path: Path) -> None:
    """The control: the name a half-written state file has is not one ncpsim adopts."""
    folder = tmp_path / "s2"
    folder.mkdir()
    (folder / ".topology.json.x1y2.tmp").write_text("half")
    assert not adopt(folder)
    with pytest.raises(ConfigError):
        create_stack_dir(folder)
