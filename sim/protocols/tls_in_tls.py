"""TLS inside a stream that is already TLS: a legacy worker's own session to the pod through a CONNECT tunnel."""

from __future__ import annotations

import asyncio
import ssl


class TunnelTls:
    """The worker's own TLS session to the pod, run over the proxy's TLS session (TLS in TLS).

    Python 3.11's StreamWriter.start_tls over an SSL transport works until the inner handshake fails;
    then asyncio raises TypeError (SSLProtocol._abort) instead of the verification error. So the inner
    session is an ssl.SSLObject on memory BIOs, pumped over the outer stream. It offers the few stream
    methods H11Stream uses: read, write, drain, close.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
        server_hostname: str,
    ):
        self.reader, self.writer = reader, writer
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname=server_hostname)
        self.eof = False

    async def handshake(self, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    self.tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await self._flush()
                    await self._fill()
                except ssl.SSLError:
                    await self._flush()  # send the alert, as a TLS library would, then fail
                    raise
            await self._flush()

    async def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def _fill(self) -> None:
        data = await self.reader.read(65536)
        if data:
            self.incoming.write(data)
        else:
            self.incoming.write_eof()

    async def read(self, size: int) -> bytes:
        while True:
            try:
                return self.tls.read(size)
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self.eof = True
                return b""  # the pod closed the session: EOF, as a stream reader reports it

    def at_eof(self) -> bool:
        return self.eof

    def write(self, data: bytes) -> None:
        self.tls.write(data)
        self.writer.write(self.outgoing.read())

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()
