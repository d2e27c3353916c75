"""What the k3d backend needs before it touches anything: `docker`, `k3d` and `kubectl` on PATH with
usable versions, and a reachable Docker engine. Each missing piece is named with its install step."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from clusters.k3d.engine import DockerEngine
from clusters.k3d.runner import CommandRunner
from sim.errors import BackendError, NcpsimError

MIN_K3D = (5, 5)  # k3d.io/v1alpha5 config files arrived in k3d v5.5

INSTALL = {
    "docker": "install Docker Desktop (macOS) or Docker Engine (Linux): https://docs.docker.com/engine/install/",
    "k3d": "install k3d v5.5+: `brew install k3d` or "
    "`curl -s https://raw.githubusercontent.com/k3d-io/k3d/main/install.sh | bash`",
    "kubectl": "install kubectl: `brew install kubectl` or https://kubernetes.io/docs/tasks/tools/",
}
VERSION_COMMANDS = {
    "docker": ("docker", "version", "--format", "{{.Client.Version}}"),
    "k3d": ("k3d", "version"),
    "kubectl": ("kubectl", "version", "--client", "-o", "json"),
}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # the version found, or what is wrong
    fix: str = ""

    def line(self) -> str:
        mark = "ok " if self.ok else "MISSING" if "not found" in self.detail else "FAIL"
        text = f"  [{mark:>7}] {self.name}: {self.detail}"
        return text + (f"\n            fix: {self.fix}" if self.fix and not self.ok else "")


def parse_version(tool: str, output: str) -> str:
    """The version a tool printed; ValueError when the output is not what that tool prints."""
    if tool == "kubectl":
        return str(json.loads(output)["clientVersion"]["gitVersion"])
    if tool == "k3d":
        found = re.search(r"k3d version (v?\d+\.\d+\.\d+\S*)", output)
        if not found:
            raise ValueError(output.strip()[:80])
        return found[1]
    text = output.strip()
    if not text:
        raise ValueError("empty output")
    return text.splitlines()[0]


def _too_old(tool: str, version: str) -> str | None:
    if tool != "k3d":
        return None
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    if numbers < MIN_K3D:
        return f"{version} is older than v{MIN_K3D[0]}.{MIN_K3D[1]} (needed for k3d.io/v1alpha5 configs)"
    return None


def tool_check(runner: CommandRunner, tool: str) -> Check:
    if runner.which(tool) is None:
        return Check(tool, False, "not found on PATH", INSTALL[tool])
    result = runner.run(*VERSION_COMMANDS[tool], check=False, timeout=30)
    try:
        version = parse_version(tool, result.stdout)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        reason = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        return Check(tool, False, f"`{' '.join(VERSION_COMMANDS[tool])}` failed: {reason}", INSTALL[tool])
    problem = _too_old(tool, version)
    return Check(tool, problem is None, problem or version, INSTALL[tool] if problem else "")


def engine_check(engine: DockerEngine) -> Check:
    try:
        return Check("docker engine", True, engine.version())
    except NcpsimError as exc:
        message = str(exc)
        detail, _, fix = message.partition("; ")
        return Check("docker engine", False, detail, fix)


TOOLS = ("docker", "k3d", "kubectl")


def k3d_checks(
    runner: CommandRunner, engine: DockerEngine, tools: tuple[str, ...] = TOOLS, with_engine: bool = True
) -> list[Check]:
    checks = [tool_check(runner, tool) for tool in tools]
    if with_engine:
        docker_cli = next(c for c in checks if c.name == "docker")
        checks.append(
            engine_check(engine)
            if docker_cli.ok
            else Check("docker engine", False, "not checked: the docker CLI is missing", INSTALL["docker"])
        )
    return checks


def preflight(
    runner: CommandRunner, engine: DockerEngine, tools: tuple[str, ...] = TOOLS, with_engine: bool = True
) -> dict[str, str]:
    """Versions by tool; BackendError (exit 2) listing every missing piece with its fix."""
    checks = k3d_checks(runner, engine, tools, with_engine)
    failed = [c for c in checks if not c.ok]
    if failed:
        parts = "; ".join(f"{c.name} {c.detail} ({c.fix})" for c in failed)
        raise BackendError(f"the k3d backend cannot start: {parts}. `ncpsim doctor` shows the full picture")
    return {c.name: c.detail for c in checks}
