"""A UDP socket's waiting datagrams read, and answered, a batch at a time.

Under load a resolver's cost is mostly two system calls per query and the Python around them (a bytes object
and an address tuple built for each datagram, then the address parsed back for the reply). On Linux
`recvmmsg(2)` reads up to a batch of datagrams in one call and `sendmmsg(2)` sends the replies in one, each
reply to the address its query came from, kept as the kernel wrote it. Elsewhere (macOS has neither call)
`recvfrom`/`sendto` do the same one datagram at a time. Either way a reply that cannot be sent (a full send
buffer, a sender that went away) is dropped, as UDP may.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import socket
import sys
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

MAX_DATAGRAM = 65535  # what recvfrom(65535) read: every UDP payload fits


Answer = Callable[[bytes], "bytes | None"]  # a datagram's reply; None: no reply


class Datagrams(Protocol):
    def serve(self, answer: Answer) -> None:
        """Read the datagrams waiting (up to a batch), answer each with `answer`, send the replies (a reply
        longer than the limit the batch was made with is a bug in `answer`: logged, and not sent)."""


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.c_void_p),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", _Msghdr), ("len", ctypes.c_uint)]


# Where each field is, counted in 8-byte words (pointers, sizes) or 4-byte ints, as the memoryviews index.
_MSG_WORDS, _MSG_INTS = ctypes.sizeof(_Mmsghdr) // 8, ctypes.sizeof(_Mmsghdr) // 4
_NAME, _NAMELEN, _IOV, _IOVLEN = (
    _Msghdr.name.offset // 8,
    _Msghdr.namelen.offset // 4,
    _Msghdr.iov.offset // 8,
    _Msghdr.iovlen.offset // 8,
)
_LEN = _Mmsghdr.len.offset // 4  # the length of the datagram received
_IOV_WORDS = ctypes.sizeof(_Iovec) // 8
# recvmmsg writes each sender's address and its length (always this size for the socket's family, so the
# length it leaves is the one the next call offers).
_ADDRESS_SIZE = {socket.AF_INET: 16, socket.AF_INET6: 28}


def _libc_calls() -> tuple[Any, Any] | None:
    """recvmmsg and sendmmsg from the C library; None where they are not (not Linux, not 64-bit, no libc)."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        recv, send = libc.recvmmsg, libc.sendmmsg
    except (OSError, AttributeError):
        return None
    recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
    send.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    return recv, send


_CALLS = _libc_calls()
_MSG_DONTWAIT = 0x40  # Linux's value


class _Area:
    """Zeroed memory the kernel reads and writes (an anonymous mapping: only the pages used are resident),
    seen from Python through memoryviews and from C at `address`."""

    def __init__(self, size: int) -> None:
        self.map = mmap.mmap(-1, -(-size // 8) * 8)  # whole words; its slices are bytes
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.words = memoryview(self.map).cast("Q")
        self.ints = memoryview(self.map).cast("I")


class Batched:
    """recvmmsg and sendmmsg (Linux): receive message i reads into slot i of `_received` and its sender's
    address into name i; send message k sends slot k of `_replies` to the name of the query it answers.
    Only the pages a batch uses become resident: a page per query and one per reply, as queries are small."""

    def __init__(self, sock: socket.socket, size: int, reply_limit: int) -> None:
        if _CALLS is None:
            raise OSError("recvmmsg and sendmmsg are not available here (for_socket chooses OneByOne)")
        self._fd, self._size, (self._recvmmsg, self._sendmmsg) = sock.fileno(), size, _CALLS
        self._address_size = _ADDRESS_SIZE[sock.family]
        self._names = _Area(size * self._address_size)
        self._reply_limit = reply_limit
        self._received, self._replies = _Area(size * MAX_DATAGRAM), _Area(size * reply_limit)
        self._incoming, self._outgoing = _Area(size * _MSG_WORDS * 8), _Area(size * _MSG_WORDS * 8)
        incoming_iov, outgoing_iov = _Area(size * _IOV_WORDS * 8), _Area(size * _IOV_WORDS * 8)
        self._outgoing_iov = outgoing_iov.words
        for i in range(size):
            self._header(self._incoming, incoming_iov, i, self._received.address + i * MAX_DATAGRAM)
            self._header(self._outgoing, outgoing_iov, i, self._replies.address + i * reply_limit)
            incoming_iov.words[i * _IOV_WORDS + 1] = MAX_DATAGRAM
        self._iov_areas = (incoming_iov, outgoing_iov)  # the kernel reads them: they live as long as this

    def _header(self, messages: _Area, iov: _Area, i: int, slot: int) -> None:
        messages.words[i * _MSG_WORDS + _NAME] = self._names.address + i * self._address_size
        messages.ints[i * _MSG_INTS + _NAMELEN] = self._address_size
        messages.words[i * _MSG_WORDS + _IOV] = iov.address + i * _IOV_WORDS * 8
        messages.words[i * _MSG_WORDS + _IOVLEN] = 1
        iov.words[i * _IOV_WORDS] = slot

    def serve(self, answer: Answer) -> None:
        count = self._recvmmsg(self._fd, self._incoming.address, self._size, _MSG_DONTWAIT, None)
        if count < 0:
            code = ctypes.get_errno()
            if code not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                log.debug("DNS: UDP error %s", os.strerror(code))  # an ICMP error from a client that left
            return
        lengths, received, replies = self._incoming.ints, self._received.map, self._replies.map
        iov, headers, names, size = (
            self._outgoing_iov,
            self._outgoing.words,
            self._names.address,
            self._address_size,
        )
        limit = self._reply_limit
        pending = 0
        try:
            for i in range(count):
                start = i * MAX_DATAGRAM
                reply = answer(received[start : start + lengths[i * _MSG_INTS + _LEN]])
                if reply is not None and _fits(reply, limit):
                    start = pending * limit
                    replies[start : start + len(reply)] = reply
                    iov[pending * _IOV_WORDS + 1] = len(reply)
                    headers[pending * _MSG_WORDS + _NAME] = names + i * size  # to the query's sender
                    pending += 1
        finally:
            self._send(pending)  # what was answered goes out, before another batch is read over it

    def _send(self, pending: int) -> None:
        sent = 0
        while sent < pending:
            count = self._sendmmsg(
                self._fd, self._outgoing.address + sent * _MSG_WORDS * 8, pending - sent, 0
            )
            if count < 0:  # the first of these could not be sent: drop it, as UDP may, and send the rest
                log.debug("DNS: reply dropped: %s", os.strerror(ctypes.get_errno()))
                count = 1
            sent += count


class OneByOne:
    """recvfrom and sendto, where recvmmsg and sendmmsg are not: the same batch, a system call a datagram."""

    def __init__(self, sock: socket.socket, size: int, reply_limit: int) -> None:
        self._sock, self._size, self._reply_limit = sock, size, reply_limit

    def serve(self, answer: Answer) -> None:
        recvfrom, sendto = self._sock.recvfrom, self._sock.sendto
        for _ in range(self._size):
            try:
                data, sender = recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # an ICMP error from a client that left
                log.debug("DNS: UDP error %s", exc)
                continue
            reply = answer(data)
            if reply is not None and _fits(reply, self._reply_limit):
                try:  # noqa: SIM105 - contextlib.suppress is a context manager per datagram
                    sendto(reply, sender)
                except OSError:
                    pass  # a full send buffer drops the reply, as UDP may


def for_socket(sock: socket.socket, size: int, reply_limit: int) -> Datagrams:
    """Batched where the platform has recvmmsg and sendmmsg, else OneByOne; `sock` is non-blocking, and
    `answer` never returns more than `reply_limit` bytes."""
    kind = Batched if _CALLS is not None else OneByOne
    return kind(sock, size, reply_limit)


def _fits(reply: bytes, limit: int) -> bool:
    if len(reply) <= limit:
        return True
    log.error("DNS: a %d-byte UDP reply is over the %d-byte limit; not sent", len(reply), limit)
    return False
