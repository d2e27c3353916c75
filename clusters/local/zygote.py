"""The launcher's end of `sim.runtime.zygote`: start it, ask it for components, stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from sim.errors import BackendError
from sim.runtime.zygote import receive, send

from .process import Forked

STOP_TIMEOUT = 3.0


class Zygote:
    """One launch's zygote: started at once, so its imports overlap the launcher's own preparation."""

    def __init__(self, state_dir: Path, timeout: float):
        self.timeout = timeout
        ours, theirs = socket.socketpair()
        self._sock: socket.socket | None = ours
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sim.runtime.zygote", "--state", str(state_dir)]
                + ["--socket-fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # it reports on the socket; a child's output goes to its log
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C on the terminal is the launcher's, not the zygote's
                cwd=state_dir,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._ready = False

    def fork(self, argv: list[str], ready_fd: int, log_fd: int) -> Forked:
        """A component running `sim.runtime.run` with `argv`; its ready pipe and log are passed along."""
        sock = self._sock
        if sock is None:
            raise BackendError("the zygote is closed")
        sock.settimeout(self.timeout)
        try:
            if not self._ready:
                self._answer(sock)
                self._ready = True
            send(sock, {"argv": argv}, [ready_fd, log_fd])
            return Forked(self._answer(sock)["pid"])
        except (OSError, ValueError) as exc:
            raise BackendError(f"the zygote did not answer: {exc}") from exc

    def _answer(self, sock: socket.socket) -> dict:
        message, fds = receive(sock)
        for fd in fds:
            os.close(fd)
        if message is None:
            raise BackendError(f"the zygote exited ({self.process.wait(STOP_TIMEOUT)}) before it answered")
        if "error" in message:
            raise BackendError(f"the zygote could not start a component:\n{message['error']}")
        return message

    def close(self, kill: bool = False) -> None:
        """Close the socket, and the zygote ends on its own (killed if it has not within the grace
        period); with `kill`, at once (an interrupted launch: it may still be importing)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        try:
            self.process.wait(0 if kill else STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
