"""JSON lines with file descriptors on an AF_UNIX stream socket: how the launcher and its zygote talk.

Light on purpose (the standard library only): `ncpsim up` starts a zygote before its own imports.
A stream may hand over two lines in one read (the launcher sends the launch's kinds without waiting
for their answer), so lines are buffered; the descriptors that came with them queue in order, and
a message says how many of them are its own (``"fds"``, added by `Channel.send`).
"""

from __future__ import annotations

import json
import os
import select
import socket
from typing import Any

MAX_MESSAGE = 64 * 1024
MAX_FDS = 16  # per read: more than any message carries, so none is cut off (MSG_CTRUNC)


class Channel:
    """One end of the socket pair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._data = b""
        self._fds: list[int] = []

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        if fds:
            message = {**message, "fds": len(fds)}
        data = (json.dumps(message) + "\n").encode()
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.sendall(data)

    def receive(self) -> tuple[dict[str, Any] | None, list[int]]:
        """The next JSON line and its descriptors; (None, []) once the peer has closed."""
        while b"\n" not in self._data:
            chunk, got, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
            self._fds += got
            if not chunk:
                self.close_fds()
                return None, []
            self._data += chunk
        line, self._data = self._data.split(b"\n", 1)
        message = json.loads(line)
        count = message.pop("fds", 0)
        fds, self._fds = self._fds[:count], self._fds[count:]
        return message, fds

    def pending(self) -> bool:
        """A message (or the peer's close) is waiting: buffered already, or readable on the socket."""
        return b"\n" in self._data or bool(select.select([self.sock], [], [], 0)[0])

    def close_fds(self) -> None:
        while self._fds:
            os.close(self._fds.pop())

    def close(self) -> None:
        self.close_fds()
        self.sock.close()
