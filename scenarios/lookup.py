"""Which scenario a name means: a catalogue entry (scenarios/catalogue/NAME.yaml) or a YAML file's path;
the catalogue's list (`ncpsim scenarios`); the closest names for one that is not there.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from sim.errors import ScenarioError
from sim.model.values_file import load_values_file

CATALOGUE = Path(__file__).parent / "catalogue"


def resolve_ref(ref: str) -> Path:
    """A catalogue name or a path to a YAML file."""
    candidate = Path(ref)
    if candidate.suffix in (".yaml", ".yml") or "/" in ref:
        if not _exists(candidate):
            raise ScenarioError(f"{ref[:200]}: no such scenario file")
        return candidate
    path = CATALOGUE / f"{ref}.yaml"
    if not _exists(path):
        raise ScenarioError(unknown_scenario(ref, catalogue_names()))
    return path


def _exists(path: Path) -> bool:
    """exists(), with a name the system refuses (too long, say) as missing rather than a traceback."""
    try:
        return path.exists() or path.is_symlink()
    except (OSError, ValueError):
        return False


def unknown_scenario(ref: str, names: list[str]) -> str:
    """The closest catalogue names, one per line (a list of all of them on one line helps nobody)."""
    close = difflib.get_close_matches(ref, names, n=4, cutoff=0.5)
    close += [n for n in names if ref and ref in n and n not in close][: 4 - len(close)]
    if not close:
        return f"unknown scenario {ref!r}; `ncpsim scenarios` lists the {len(names)} in the catalogue"
    return "\n".join(
        [
            f"unknown scenario {ref!r}; did you mean:",
            *(f"  {name}" for name in close),
            "(`ncpsim scenarios` lists them all)",
        ]
    )


def catalogue_names() -> list[str]:
    """Every catalogue scenario's name, in file-name order, without reading the files: each names itself
    after its file (tests/test_catalogue.py holds them to it)."""
    return sorted(path.stem for path in CATALOGUE.glob("*.yaml"))


def catalogue() -> list[tuple[str, str]]:
    """(name, summary) of every catalogue scenario, in file-name order."""
    out = []
    for path in sorted(CATALOGUE.glob("*.yaml")):
        data, _ = load_values_file(path, "scenario file")
        out.append((data.get("name", path.stem), data.get("summary", "")))
    return out
