"""One HTTP/3 request, as a worker's gRPC callback opens it, for people poking a running stack.

    python -m scenarios.h3get https://10-42-0-41.grpc-worker.example.com/v1/proxy \\
        --connect 127.0.0.1:PORT --cacert .ncpsim/default/certs/ca/stack/ca.crt

`--connect` plays DNS (the name stays the SNI and :authority, as with curl's --resolve). Without a
token the grpc-proxy pod answers through the proxy: 401 `HTTP CONNECT request is missing auth`.
Prints the status line, the headers and the body; exit 0 once a response arrived, 1 if none did.
(curl speaks HTTP/3 only when built with it; this needs only ncpsim's own aioquic glue.)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from urllib.parse import urlsplit

from sim.protocols.h3 import (
    HandshakeFailed,
    StreamError,
    client_configuration,
    close_client,
    connect,
    trust_pem,
)

TIMEOUT = 5.0  # handshake, and then the response: a running stack answers in milliseconds
BODY_LIMIT = 64 * 1024


async def request(url: str, connect_to: tuple[str, int], cacert: Path, method: str, token: str | None) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    authority = parts.netloc
    headers = [
        (":method", method),
        (":scheme", "https"),
        (":authority", authority),
        (":path", parts.path or "/"),
        ("user-agent", "ncpsim-h3get"),
    ]
    if token:
        headers.append(("authorization", f"Bearer {token}"))
    endpoint = await connect(connect_to, client_configuration(host, trust_pem([cacert])), timeout=TIMEOUT)
    try:
        stream = endpoint.open_request([(k.encode(), v.encode()) for k, v in headers])
        stream.end()
        async with asyncio.timeout(TIMEOUT):
            answer = await stream.headers
            body = b""
            while len(body) < BODY_LIMIT and (chunk := await stream.read()):
                body += chunk
    finally:
        close_client(endpoint)
    lines = [f"HTTP/3 {stream.status}"]
    lines += [f"{k.decode()}: {v.decode(errors='replace')}" for k, v in answer if not k.startswith(b":")]
    return "\n".join([*lines, "", body.decode(errors="replace")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scenarios.h3get", description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("--connect", required=True, help="HOST:PORT to send the QUIC packets to")
    parser.add_argument("--cacert", required=True, type=Path, help="PEM of the CA that signs the server")
    parser.add_argument("--method", default="POST")
    parser.add_argument("--token", help="a bearer token (a real one is single-use and 30 s long)")
    args = parser.parse_args(argv)
    host, _, port = args.connect.rpartition(":")
    if not port.isdigit():
        parser.error(f"--connect {args.connect}: expected HOST:PORT")
    try:
        print(asyncio.run(request(args.url, (host, int(port)), args.cacert, args.method, args.token)))
    except HandshakeFailed as exc:
        print(f"h3get: TLS handshake failed: {exc}", file=sys.stderr)
        return 1
    except (StreamError, TimeoutError, OSError) as exc:
        print(f"h3get: no response: {exc or 'timed out'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
