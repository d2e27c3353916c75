"""The gateway stand-in as a real TLS HTTP/1.1 server on 127.0.0.1, and the two clients that hit it:
nvcf-cli's POST (a small blocking h11 client) and the runbook's ``curl --resolve`` edge check (real curl).

The server runs its own event loop in a named thread so blocking callers (curl, the CLI) can use it;
``running_gateway`` starts it on port 0, hands back the real port once listening, and always stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import h11
import trustme

from sim.protocols.http1 import H11Stream, PeerClosed, read_body, respond
from sim.runbooks.admin_issuer import KEYS_PATH, EdgeVerdict, Reply, interpret_edge, keys_host

Handler = Callable[[str, str, str], Reply]  # (method, host, path) -> reply
START_TIMEOUT = 5.0
REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True)
class EdgeTls:
    context: ssl.SSLContext
    ca_path: Path


def mint_edge_tls(folder: Path, names: tuple[str, ...]) -> EdgeTls:
    """A fresh CA and a server certificate for ``names``; the CA PEM is written for curl's --cacert."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca_path = folder / "edge-ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(*names).configure_cert(context)
    context.set_alpn_protocols(["http/1.1"])  # curl would otherwise offer h2, which the stand-in lacks
    return EdgeTls(context, ca_path)


class Gateway:
    def __init__(self, handler: Handler, tls: ssl.SSLContext) -> None:
        self.handler, self.tls = handler, tls
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task] = set()
        self.requests: list[tuple[str, str, str, int]] = []  # (method, host, path, status)

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.tls)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server:
            await self.server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer), name="gateway-conn")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = H11Stream(h11.SERVER, reader, writer)
        try:
            while True:
                event = await stream.next_event(REQUEST_TIMEOUT)
                if not isinstance(event, h11.Request):
                    return
                await read_body(stream, REQUEST_TIMEOUT)
                host = {k.lower(): v for k, v in event.headers}.get(b"host", b"").decode()
                method, path = event.method.decode(), event.target.decode()
                reply = self.handler(method, host.rsplit(":", 1)[0], path)
                self.requests.append((method, host, path, reply.status))
                headers = [("content-type", reply.content_type)] if reply.content_type else []
                await respond(stream, reply.status, reply.body, headers)
                if not stream.reusable():
                    return
                stream.next_cycle()
        except (h11.RemoteProtocolError, PeerClosed, ConnectionError, TimeoutError, ssl.SSLError):
            return  # a client that goes away or speaks garbage costs only its own connection
        finally:
            stream.close()


@dataclass
class RunningGateway:
    gateway: Gateway
    port: int


@contextlib.contextmanager
def running_gateway(handler: Handler, tls: ssl.SSLContext) -> Iterator[RunningGateway]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="gateway-loop", daemon=True)
    thread.start()
    gateway = Gateway(handler, tls)
    try:
        port = asyncio.run_coroutine_threadsafe(gateway.start(), loop).result(START_TIMEOUT)
        yield RunningGateway(gateway, port)
    finally:
        asyncio.run_coroutine_threadsafe(gateway.stop(), loop).result(START_TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(START_TIMEOUT)
        loop.close()


# -- clients ------------------------------------------------------------------------------------------
def post_admin_keys(
    port: int, server_name: str, ca_path: Path, address: str = "127.0.0.1"
) -> tuple[int, bytes]:
    """nvcf-cli's POST /v1/admin/keys: TLS to ``address`` with SNI and Host ``server_name``."""
    context = ssl.create_default_context(cafile=str(ca_path))
    conn = h11.Connection(h11.CLIENT)
    with (
        socket.create_connection((address, port), REQUEST_TIMEOUT) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        for sent in (
            h11.Request(
                method="POST", target=KEYS_PATH, headers=[("host", server_name), ("content-length", "0")]
            ),
            h11.EndOfMessage(),
        ):
            tls.sendall(conn.send(sent))
        status, chunks = 0, list[bytes]()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(tls.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, b"".join(chunks)


@dataclass(frozen=True)
class EdgeCheck:
    command: tuple[str, ...]
    exit_code: int
    status: str
    verdict: EdgeVerdict


def curl_edge_command(
    domain: str,
    address: str,
    port: int,
    ca_path: Path | None,
    insecure: bool = False,
    host_header: bool = False,
) -> tuple[str, ...]:
    """The runbook's check: --resolve (not -H Host) so the TLS server name is the route's hostname.

    ``host_header`` builds the mistaken form: the Host header does not set the TLS server name, so the
    certificate is checked against the load-balancer address."""
    host = keys_host(domain)
    command = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}\\n", "--max-time", "10"]
    if host_header:
        command += ["-H", f"Host: {host}", f"https://{address}:{port}{KEYS_PATH}"]
    else:
        command += ["--resolve", f"{host}:{port}:{address}", f"https://{host}:{port}{KEYS_PATH}"]
    if ca_path is not None:
        command += ["--cacert", str(ca_path)]  # the simulated edge's CA plays the public roots
    if insecure:
        command.append("-k")
    return tuple(command)


def run_edge_check(
    domain: str,
    port: int,
    ca_path: Path | None,
    insecure: bool = False,
    address: str = "127.0.0.1",
    host_header: bool = False,
) -> EdgeCheck:
    command = curl_edge_command(domain, address, port, ca_path, insecure, host_header)
    done = subprocess.run(command, capture_output=True, text=True, timeout=REQUEST_TIMEOUT + 5, check=False)
    status = done.stdout.strip() or "000"
    return EdgeCheck(command, done.returncode, status, interpret_edge(done.returncode, status))
