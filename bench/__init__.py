"""ncpsim's benchmarks (issue 7): `ncpsim bench [--quick]` calls `bench.run(quick)`."""

from __future__ import annotations

from pathlib import Path


def run(
    quick: bool = False,
    install_peers: bool = False,
    out_dir: Path | None = None,
    update_docs: bool = False,
    check: bool = False,
) -> int:
    """Measure everything, write benchmarks.json and benchmarks.md under `out_dir` (the stack home's bench/ by
    default, docs/ with `update_docs`); with `check`, 1 when a target is missed.

    nginx and dnsmasq are checked first: each missing one is named with its install command (run with
    `install_peers`), and its comparison is reported as skipped."""
    from bench.runner import run as run_all  # lazy: `import bench` stays cheap for `ncpsim --list`

    return run_all(quick, out_dir, install_peers=install_peers, update_docs=update_docs, check=check)
