"""ncpsim's benchmarks (issue 7): `invoke bench [--quick]` calls `bench.run(quick)`."""

from __future__ import annotations


def run(quick: bool = False, install_peers: bool = False) -> int:
    """Measure everything, write docs/benchmarks.json and docs/benchmarks.md; 0 when every target is met.

    nginx and dnsmasq are checked first: each missing one is named with its install command (run with
    `install_peers`), and its comparison is reported as skipped."""
    from bench.runner import run as run_all  # lazy: `import bench` stays cheap for `invoke --list`

    return run_all(quick, install_peers=install_peers)
