"""ncpsim's benchmarks (issue 7): `invoke bench [--quick]` calls `bench.run(quick)`."""

from __future__ import annotations


def run(quick: bool = False) -> int:
    """Measure everything, write docs/benchmarks.json and docs/benchmarks.md; 0 when every target is met."""
    from bench.runner import run as run_all  # lazy: `import bench` stays cheap for `invoke --list`

    return run_all(quick)
