"""The shape of the source, the figures issue 30 is measured by: `python -m bench.shape [--json]`.

Needs the test extra (grimp comes with import-linter). Source lines and modules over 400 lines (per
package, tests apart), import cycles between modules, and imports that run against the order
`sim/__init__.py` states for its packages (a package may import those below it, never those above), read
from the import-linter contract that holds it (pyproject's "sim-layers"), so the two cannot disagree.
Imports are read by grimp (what import-linter reads), every import counted,
those inside functions and under `if TYPE_CHECKING:` included: a lazy import is still a dependency.
"""

from __future__ import annotations

import json
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "bench", "scenarios", "clusters", "sim", "dns", "certs")
LONG_MODULE = 400  # lines (DESIGN.md section 6)


def sim_order(root: Path = ROOT) -> dict[str, int]:
    """sim/__init__.py's order, top to bottom, as the "sim-layers" contract says it: package -> rank
    (packages of one layer, "a | b", share a rank; each may import those of a higher rank)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "sim-layers"]
    return {name.strip(): rank for rank, layer in enumerate(contract["layers"]) for name in layer.split("|")}


SIM_ORDER = sim_order()


@dataclass(frozen=True)
class Shape:
    source_lines: int
    test_lines: int
    modules: int
    long_modules: dict[str, int]
    cycles: list[list[str]]
    cycles_at_run_time: list[list[str]]  # the same, without the imports under `if TYPE_CHECKING:`
    against_sim_order: list[str]


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of modules that import one another round a loop (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return sorted(found)


def sim_rank(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "sim" or len(parts) < 2 or parts[1] not in SIM_ORDER:
        return None
    return SIM_ORDER[parts[1]]


def against_sim_order(graph: grimp.ImportGraph) -> list[str]:
    """`importer -> imported` where sim's importer sits below the package it imports."""
    found = []
    for importer in sorted(graph.modules):
        below = sim_rank(importer)
        if below is None:
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            above = sim_rank(imported)
            if above is not None and above < below:
                found.append(f"{importer} -> {imported}")
    return found


def measure(root: Path = ROOT) -> Shape:
    sources = [p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))]
    counted = {str(p.relative_to(root)): lines(p) for p in sources}
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    return Shape(
        source_lines=sum(counted.values()),
        test_lines=sum(lines(p) for p in (root / "tests").rglob("*.py")),
        modules=len(counted),
        long_modules={path: n for path, n in sorted(counted.items()) if n > LONG_MODULE},
        cycles=cycles(graph),
        cycles_at_run_time=cycles(
            grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)
        ),
        against_sim_order=against_sim_order(graph),
    )


def text(shape: Shape) -> str:
    out = [
        f"source lines        {shape.source_lines} in {shape.modules} modules (tests: {shape.test_lines})",
        f"modules over {LONG_MODULE}   {len(shape.long_modules)}",
        *(f"  {path} {n}" for path, n in shape.long_modules.items()),
        f"import cycles       {len(shape.cycles)}",
        *(f"  {' <-> '.join(cycle)}" for cycle in shape.cycles),
        f"  ({len(shape.cycles_at_run_time)} without the imports under `if TYPE_CHECKING:`)",
        f"against sim's order {len(shape.against_sim_order)}",
        *(f"  {line}" for line in shape.against_sim_order),
    ]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    shape = measure()
    print(json.dumps(asdict(shape), indent=2) if "--json" in argv else text(shape))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
