"""JSON lines with file descriptors on an AF_UNIX stream socket: how the launcher and its zygote talk.

Light on purpose (the standard library only): `invoke up` starts a zygote before its own imports.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

MAX_MESSAGE = 64 * 1024


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = (json.dumps(message) + "\n").encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One JSON line and the descriptors that came with it; (None, []) when the peer closed."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, got, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 2)
        fds += got
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        data += chunk
    return json.loads(data), fds
