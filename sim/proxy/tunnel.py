"""The CONNECT tunnel's byte pump: both directions until either side closes or the tunnel goes idle."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass


@dataclass
class Spliced:
    up: int = 0  # bytes from the worker to the pod
    down: int = 0  # bytes from the pod to the worker
    idle: bool = False  # ended by the idle timeout
    last: float = 0.0  # monotonic time of the last byte either way


async def splice(
    worker: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    pod: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    idle_timeout: float,
) -> Spliced:
    """Copy bytes both ways until either side closes, or nothing moves either way for `idle_timeout`
    (Envoy's idle timeout counts both directions: a long one-way download is not idle)."""
    result = Spliced(last=time.monotonic())

    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, upward: bool) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                result.last = time.monotonic()
                if upward:
                    result.up += len(data)
                else:
                    result.down += len(data)
                dst.write(data)
                await dst.drain()
        with contextlib.suppress(OSError, RuntimeError):
            if dst.can_write_eof():
                dst.write_eof()

    pumps = [
        asyncio.create_task(copy(worker[0], pod[1], True), name="tunnel-up"),
        asyncio.create_task(copy(pod[0], worker[1], False), name="tunnel-down"),
    ]
    try:
        while not all(p.done() for p in pumps):
            remaining = result.last + idle_timeout - time.monotonic()
            if remaining <= 0:
                result.idle = True
                break
            await asyncio.wait(pumps, timeout=remaining, return_when=asyncio.ALL_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        for pump in pumps:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
        pod[1].close()
    return result
