"""A gRPC client for grpc-proxy pods' client-facing h2c port (grpcio's asyncio API, bytes in and out)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import grpc

from sim.protocols.grpc_tunnel import STREAM, UNARY
from sim.wire import GRPC_CALL_TAG

# Never route loopback calls through an HTTP proxy from the environment.
CHANNEL_OPTIONS = (("grpc.enable_http_proxy", 0),)


@dataclass(frozen=True)
class CallOutcome:
    replies: list[bytes]
    request_id: str | None  # from the pod's `nvcf-reqid` initial metadata
    error: str | None = None


class EchoClient:
    """One channel to a pod, for many calls: `async with EchoClient(addr) as echo: await echo.unary(b"x")`."""

    def __init__(self, addr: tuple[str, int]):
        self.channel = grpc.aio.insecure_channel(f"{addr[0]}:{addr[1]}", options=CHANNEL_OPTIONS)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.channel.close()

    def _unary(self) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
        return self.channel.unary_unary(UNARY)  # no serializers: bytes in and out

    def _stream(self) -> grpc.aio.UnaryStreamMultiCallable[bytes, bytes]:
        return self.channel.unary_stream(STREAM)

    async def unary(self, payload: bytes, timeout: float = 10) -> bytes:
        return await self._unary()(payload, timeout=timeout)

    async def stream(self, text: str, count: int, timeout: float = 10) -> list[bytes]:
        request = json.dumps({"text": text, "count": count}).encode()
        return [message async for message in self._stream()(request, timeout=timeout)]

    async def traced(
        self,
        payload: bytes,
        stream_count: int | None = None,
        timeout: float = 10,
        on_request_id: Callable[[str], None] | None = None,
        call_tag: str | None = None,
    ) -> CallOutcome:
        """One unary (or server-streaming, with `stream_count`) call, keeping its request id and error.

        grpc's asyncio client hands a unary call's initial metadata (the request id) over only once the
        call ends; `call_tag`, sent as GRPC_CALL_TAG metadata, lets a watcher find the request meanwhile in
        the pod's grpc.token.minted event."""
        tagged = ((GRPC_CALL_TAG, call_tag),) if call_tag else None
        request_id = None
        try:
            if stream_count is None:
                call = self._unary()(payload, timeout=timeout, metadata=tagged)
                request_id = await _request_id(call, on_request_id)
                replies = [await call]
            else:
                request = json.dumps({"text": payload.decode(), "count": stream_count}).encode()
                streamed = self._stream()(request, timeout=timeout, metadata=tagged)
                request_id = await _request_id(streamed, on_request_id)
                replies = [m async for m in streamed]
        except grpc.aio.AioRpcError as exc:
            return CallOutcome([], request_id, f"{exc.code().name}: {exc.details()}")
        return CallOutcome(replies, request_id)


async def _request_id(call: grpc.aio.Call, on_request_id: Callable[[str], None] | None) -> str | None:
    """The pod's `nvcf-reqid`, from the call's initial metadata; told to `on_request_id` as soon as known."""
    request_id = dict(await call.initial_metadata() or ()).get("nvcf-reqid")
    if request_id and on_request_id:
        on_request_id(str(request_id))
    return None if request_id is None else str(request_id)


async def unary(addr: tuple[str, int], payload: bytes, timeout: float = 10) -> bytes:
    async with EchoClient(addr) as echo:
        return await echo.unary(payload, timeout)


async def stream(addr: tuple[str, int], text: str, count: int, timeout: float = 10) -> list[bytes]:
    async with EchoClient(addr) as echo:
        return await echo.stream(text, count, timeout)
