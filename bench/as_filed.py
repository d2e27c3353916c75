"""The tree as issue 32 found it (round five's, 3bc23ba), exported beside this checkout, so that start-up and
the catalogue are timed against it in the same run, on the same machine.

Why not the calibration's units alone: they do not carry start-up from one machine to another. Round five's
tree took 0.44 s to its first callback on its machine, at a loop of 0.25-0.29 s, and 0.77 s on a later one
at 0.29-0.30 s: start-up is imports and process creation, which a CPU-bound loop does not weigh as a machine
does. Two trees timed in turns on one machine give a ratio, and a ratio travels.

The tree comes from `git archive` (nothing is added to this repository's worktrees, index or refs) and runs
on this checkout's interpreter and packages, with `invoke` as its command line then was (`ncpsim` came later).
"""

from __future__ import annotations

import compileall
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

COMMIT = "3bc23ba"
# Its catalogue (60 scenarios, replayed in 14.6 s at a loop of about 0.27 s). Scenarios added since bring their
# own modelled waits (a NATS rolling restart takes 14.6 s by itself): this checkout replaying the same 60 says
# whether replaying got slower.
SCENARIOS = (
    "admin-issuer-edge-cert-right",
    "admin-issuer-edge-cert-wrong",
    "admin-issuer-edge-host-header-right",
    "admin-issuer-edge-host-header-wrong",
    "admin-issuer-edge-right",
    "admin-issuer-edge-wrong",
    "admin-issuer-removal-right",
    "admin-issuer-removal-wrong",
    "bad-invocation-proxy-url",
    "callback-wrong-pod",
    "cert-rotation",
    "clusterip-service",
    "deployment-restart-right",
    "deployment-restart-wrong",
    "disallowed-target",
    "dns-missing",
    "dns-outage",
    "dns-rewrite-wrong-address",
    "dns-rewrite-wrong-domain",
    "ess-mek-grace-right",
    "ess-mek-grace-wrong",
    "ess-mek-rotation-right",
    "ess-mek-rotation-wrong",
    "expired-frontend-cert",
    "grpc-callback",
    "http-callback",
    "legacy-worker-connect-off",
    "legacy-worker-connect-on",
    "link-faults",
    "missing-worker-ca",
    "multi-compute",
    "nats-log-sampling-right",
    "nats-log-sampling-wrong",
    "nats-token-switch-right",
    "nats-token-switch-wrong",
    "nats-values-right",
    "nats-values-wrong",
    "nats-webhook-url-right",
    "nats-webhook-url-wrong",
    "nats-worker-utils-right",
    "nats-worker-utils-wrong",
    "nvcf-cli-no-proxy-right",
    "nvcf-cli-no-proxy-wrong",
    "openbao-restart-right",
    "openbao-restart-wrong",
    "openbao-seal-check-right",
    "openbao-seal-check-wrong",
    "pod-killed-and-restarted",
    "private-ca-frontend",
    "public-frontend-cert",
    "service-annotations-right",
    "service-annotations-wrong",
    "single-cluster-direct",
    "single-cluster-names-published",
    "single-cluster-proxy-enabled-no-dns",
    "split-plane-url-set",
    "stale-ca-pem-after-rotation",
    "upstream-plaintext",
    "wrong-name-pod-cert",
    "wrong-path",
)


class ExportFailed(Exception):
    """The tree could not be exported (no git, no repository, or a shallow clone without that commit): its
    comparisons are not made, and the report says why."""


@dataclass(frozen=True)
class Tree:
    """A command line to time: the argv before the task's, the folder it runs in, and, for an exported tree,
    the folder its imports come from first."""

    key: str  # its name in the results
    argv: tuple[str, ...]
    cwd: Path
    pythonpath: Path | None = None

    def env(self, home: Path) -> dict[str, str]:
        """The environment it runs with: its stacks under `home`, its own modules before this checkout's."""
        env = {**os.environ, "NCPSIM_HOME": str(home)}
        if self.pythonpath is not None:
            env["PYTHONPATH"] = str(self.pythonpath)
        return env


@contextlib.contextmanager
def exported(repo: Path, into: Path, commit: str = COMMIT) -> Iterator[Tree]:
    """`commit` of `repo` unpacked into `into` and byte-compiled (as this checkout is before the bench times
    it), as a Tree running `python -m invoke` there; removed on the way out."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", commit],
            capture_output=True,
            timeout=120,
            check=False,
        )
    except FileNotFoundError:
        raise ExportFailed("git is not installed") from None
    if archive.returncode != 0:
        why = archive.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        # git's own words: no such commit (a shallow clone), not a repository (an unpacked archive)
        raise ExportFailed(f"git archive {commit} failed: {why[0]}")
    into.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(into, filter="data")
        compileall.compile_dir(into, quiet=1)
        yield Tree("as_filed", (sys.executable, "-m", "invoke"), into, into)
    finally:
        shutil.rmtree(into, ignore_errors=True)
