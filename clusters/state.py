"""The state folder on the laptop: where it is, what makes a folder ours, and how we write into it.

The state root is `NCPSIM_HOME`, or `./.ncpsim` when it is unset; each stack has a folder under it. Three
rules keep a hostile or mistaken setup from turning ncpsim against the user's own files:
- The root must be usable: `NCPSIM_HOME` empty (which would put state in the current folder), a file, or
  a folder that cannot be written is one line naming it, never a traceback.
- A stack folder carries a marker written when ncpsim creates it; `down --purge` deletes only a real
  folder (not a link) with that marker, so `--stack sim` from a clone can never delete the source package.
- Nothing of ours is reached through a symbolic link: the stack folder, `topology.json`, `status.json`,
  `logs/`, `events/`, `reports/`, `certs/` ... planted as links are refused, files are opened with
  O_NOFOLLOW, and the folder is owner-only.
A per-stack lock (flock on `<stack>/.lock`) serialises `up`, `down` and redeploys; the kernel drops it when
its holder dies, so a SIGKILLed `up` never leaves the stack locked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sim.errors import ConfigError
from sim.runtime.supervisor import SOCKET as SUPERVISOR_SOCKET

MARKER = ".ncpsim-stack"  # written at creation: this folder is an ncpsim stack folder
LOCK = ".lock"
MIN_FREE = 512 * 1024  # bytes a command needs free to run on a stack (a whole stack writes ~250 KiB)
LOCK_POLL = 0.05  # seconds between tries while a command waits for the stack's lock
# Every name ncpsim writes directly under a stack folder; none may be a symbolic link.
OURS = (
    MARKER,
    LOCK,
    "topology.json",
    "values-origins.json",
    "status.json",
    "netmap.json",
    "netmap.tmp",
    "faults.json",
    ".faults.json.tmp",
    "logs",
    "events",
    "reports",
    "certs",
    "pids",
    "nats",
    "rendered",
    SUPERVISOR_SOCKET,
)


STACK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")


def state_dir(stack: str, root: Path | None = None) -> Path:
    if not STACK_NAME.match(stack):
        raise ConfigError(f"stack name {stack!r}: use lower-case letters, digits and dashes (at most 40)")
    return (root or state_root()) / stack


def state_root() -> Path:
    """The folder every stack's folder is under, checked once here for every command: one that exists must be
    a folder ncpsim can list (`/proc/1/fdinfo`, a folder of another user's, ... are one line, not a traceback
    from whichever command touched it first)."""
    raw = os.environ.get("NCPSIM_HOME")
    if raw is None:
        try:
            root, said = Path.cwd() / ".ncpsim", "./.ncpsim"
        except OSError as exc:  # the current folder was deleted under the shell
            raise ConfigError(
                f"the current folder: {exc.strerror or exc}; cd to a folder or set NCPSIM_HOME"
            ) from None
    elif not raw.strip():
        raise ConfigError("NCPSIM_HOME is set but empty: unset it (state goes to ./.ncpsim) or name a folder")
    else:
        root, said = Path(raw).expanduser(), f"NCPSIM_HOME={raw}"
    try:
        if root.exists() and not root.is_dir():
            raise ConfigError(f"{said}: not a folder; name a folder for ncpsim's state")
        if root.is_dir():
            with os.scandir(root):
                pass
    except OSError as exc:
        raise ConfigError(
            f"{said}: {exc.strerror or exc}; name a folder for ncpsim's state you can read"
        ) from None
    return root


def refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise ConfigError(
            f"{path} is a symbolic link where ncpsim keeps its own state; "
            f"refusing to follow it (remove the link)"
        )


def check_links(stack_dir: Path) -> None:
    """The stack folder and everything of ours in it are real files and folders, not planted links."""
    refuse_link(stack_dir)
    for name in OURS:
        refuse_link(stack_dir / name)
    escaping = link_out_of(stack_dir / "certs")
    if escaping is not None:
        raise ConfigError(
            f"{escaping} is a symbolic link out of its Secret folder; refusing to follow it (remove the link)"
        )


def link_out_of(folder: Path) -> Path | None:
    """A link under `folder` that can lead out of its own folder. Secret folders hold links of their own
    (`..data -> ..<timestamp>`, `tls.crt -> ..data/tls.crt`, as a kubelet writes them): relative, with no
    `..` step, so they stay inside; a planted link to anywhere else is what this finds."""
    for where, folders, files in os.walk(
        folder
    ):  # not following links: a linked folder is listed, not entered
        for name in folders + files:
            path = Path(where) / name
            if path.is_symlink():
                target = os.readlink(path)
                if os.path.isabs(target) or ".." in Path(target).parts:
                    return path
    return None


def require_room(folder: Path, need: int = MIN_FREE) -> None:
    """One line, before anything starts, when the filesystem holding `folder` is (nearly) full: a stack
    writes its certificates, events, logs and reports there, and a write cut short mid-run is a traceback or
    a half-written file, never a clear answer."""
    place = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if place is None:
        return
    try:
        stats = os.statvfs(place)
    except OSError:
        return
    free = stats.f_bavail * stats.f_frsize
    if free < need:
        raise ConfigError(
            f"no space left for the stack in {folder} ({free // 1024} KiB free, {need // 1024} KiB needed): "
            f"free some space (`ncpsim down --all --purge` removes stopped stacks), or set NCPSIM_HOME elsewhere"
        )


def create_stack_dir(stack_dir: Path) -> None:
    """Create the stack folder (owner-only, with its marker), or check an existing one is ours."""
    require_room(stack_dir)
    root = stack_dir.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied")
        check_links(stack_dir)
        stack_dir.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"state folder {stack_dir}: {exc.strerror or exc}; set NCPSIM_HOME to a folder you can write"
        ) from None
    if not stack_dir.is_dir():
        raise ConfigError(f"{stack_dir} is not a folder; pick another --stack name or NCPSIM_HOME")
    if not adopt(stack_dir):
        raise ConfigError(
            f"{stack_dir} exists but ncpsim did not create it (no {MARKER}); "
            f"pick another --stack name or NCPSIM_HOME"
        )


def adopt(stack_dir: Path) -> bool:
    """True when `stack_dir` is a stack folder: marked, or holding nothing but what ncpsim writes there (a
    folder from before the marker, or one `ncpsim certs` made), which then gets its marker. A folder with
    anything else in it -- a clone's `sim/` package -- is never ours."""
    if is_stack_dir(stack_dir):
        return True
    if stack_dir.is_symlink() or not stack_dir.is_dir():
        return False
    entries = list(stack_dir.iterdir())
    if any(not _ours(entry.name) or entry.is_symlink() for entry in entries):
        return False
    write_file(stack_dir / MARKER, json.dumps({"ncpsim": "stack", "name": stack_dir.name}) + "\n")
    return True


def _ours(name: str) -> bool:
    """A name ncpsim writes under a stack folder, or the temporary its marker is written to: two commands
    that start at once both create the folder, and one may look while the other's marker is on its way. Any
    other temporary is a write cut short, which write_file never leaves (the folder is then not ours)."""
    return name in OURS or (name.startswith(f".{MARKER}.") and name.endswith(".tmp"))


def is_stack_dir(stack_dir: Path) -> bool:
    marker = stack_dir / MARKER
    try:
        return (
            not stack_dir.is_symlink() and stack_dir.is_dir() and not marker.is_symlink() and marker.is_file()
        )
    except OSError as exc:  # a folder ncpsim may not look into cannot be told to be ours
        raise ConfigError(
            f"cannot read {stack_dir}: {exc.strerror or exc}; pick another --stack name or NCPSIM_HOME"
        ) from None


def write_file(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace the file at `path` atomically (a reader sees the old text or the new, never half of either),
    refusing a symbolic link planted there: the text goes to a new file beside it, then takes its name."""
    if path.is_symlink():
        raise ConfigError(
            f"{path} is a symbolic link where ncpsim keeps its own state; "
            f"refusing to follow it (remove the link)"
        )
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException as exc:  # Ctrl-C too: a half-written temporary would make the folder not ours
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def purge(stack_dir: Path) -> bool:
    """Delete a stack folder that is ours; False when there was nothing to delete. Refuses anything else."""
    if stack_dir.is_symlink():
        raise ConfigError(f"{stack_dir} is a symbolic link, not a stack folder: nothing removed")
    if not stack_dir.exists():
        return False
    if not is_stack_dir(stack_dir):
        raise ConfigError(f"{stack_dir} is not an ncpsim stack folder (no {MARKER}): nothing removed")
    shutil.rmtree(stack_dir)
    return True


class StackLock:
    """flock on `<stack>/.lock`, re-entrant within one holder (up's replay redeploys under up's lock)."""

    def __init__(self, stack_dir: Path):
        self.path = stack_dir / LOCK
        self._fd: int | None = None
        self._depth = 0

    @contextlib.contextmanager
    def held(self, wait: float = 0.0) -> Iterator[None]:
        """Hold the lock; with `wait`, wait that many seconds for another holder to let go (commands that
        change a running stack queue behind each other rather than fail)."""
        if self._depth == 0:
            self._acquire(wait)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._release()

    def _acquire(self, wait: float = 0.0) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ConfigError(
                    f"{self.path} is a symbolic link; refusing to follow it (remove the link)"
                ) from None
            raise ConfigError(f"cannot open {self.path}: {exc.strerror or exc}") from None
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(LOCK_POLL)  # another command holds the stack: its turn ends with its flock
                    continue
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise ConfigError(
                    f"stack folder {self.path.parent} is busy: `ncpsim up`, `down`, a redeploy or another "
                    f"command (pid {holder}) holds {self.path}; wait for it, or stop it"
                ) from None
        with contextlib.suppress(OSError):  # who holds it is a courtesy; a full disk must not stop `down`
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None
