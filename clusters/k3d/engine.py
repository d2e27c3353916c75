"""The Docker engine, through the docker SDK: is it reachable, and build the stand-in image.

`DockerEngine` is the seam tests replace; `SdkEngine` is the real one. The build context is a tar
made here from an allow-list of the repository (the packages and the Dockerfile), so neither the
virtualenv nor a stack's state folder (private keys) is ever sent to the engine.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from sim.errors import BackendError

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "docker/Dockerfile"
CONTEXT_DIRS = ("sim", "dns", "certs", "clusters", "scenarios")
CONTEXT_FILES = ("pyproject.toml", DOCKERFILE)
ENGINE_TIMEOUT = 10  # seconds for the engine to answer a ping


class DockerEngine(Protocol):
    def version(self) -> str:
        """The engine's version; BackendError naming the fix when it cannot be reached."""

    def build(self, context: bytes, dockerfile: str, tag: str) -> str:
        """Build `tag` from a tar `context`; returns the image id."""


def _skipped(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo") or path.name.startswith(".")


def context_members(root: Path = REPO_ROOT) -> list[Path]:
    """Repository-relative paths that go into the build context, sorted (a stable context caches)."""
    members = [Path(name) for name in CONTEXT_FILES if (root / name).is_file()]
    for folder in CONTEXT_DIRS:
        members += [
            p.relative_to(root)
            for p in (root / folder).rglob("*")
            if p.is_file() and not _skipped(p.relative_to(root))
        ]
    return sorted(set(members))


def build_context(root: Path = REPO_ROOT, members: Iterable[Path] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member in members if members is not None else context_members(root):
            info = tar.gettarinfo(str(root / member), arcname=member.as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0  # content, not checkout time, decides the layer cache
            with open(root / member, "rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


ENGINE_FIX = (
    "start Docker (Docker Desktop on macOS; `sudo systemctl start docker` on Linux) and check that "
    "`docker info` works for your user (DOCKER_HOST, the docker group)"
)


class SdkEngine:
    """The Docker engine the docker SDK finds from the environment (DOCKER_HOST or the local socket)."""

    def __init__(self) -> None:
        self._client: Any = None

    def _docker(self) -> Any:
        if self._client is None:
            import docker  # the SDK is only needed once Docker is actually used

            try:
                self._client = docker.from_env(timeout=ENGINE_TIMEOUT)
            except docker.errors.DockerException as exc:
                raise BackendError(
                    f"Docker engine not reachable ({_first_line(exc)}); {ENGINE_FIX}"
                ) from None
        return self._client

    def version(self) -> str:
        import docker

        try:
            return str(self._docker().version().get("Version", "unknown"))
        except docker.errors.DockerException as exc:
            raise BackendError(f"Docker engine not reachable ({_first_line(exc)}); {ENGINE_FIX}") from None

    def build(self, context: bytes, dockerfile: str, tag: str) -> str:
        import docker

        try:
            image, _logs = self._docker().images.build(
                fileobj=io.BytesIO(context), custom_context=True, dockerfile=dockerfile, tag=tag, rm=True
            )
        except docker.errors.BuildError as exc:
            raise BackendError(f"building {tag} failed: {_first_line(exc)}") from None
        except docker.errors.DockerException as exc:
            raise BackendError(f"building {tag} failed: {_first_line(exc)}; {ENGINE_FIX}") from None
        return str(image.id)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
