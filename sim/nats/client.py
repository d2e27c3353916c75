"""One way to sign in to NATS: a single attempt that cleans up after itself, then (optionally)
reconnection for ever, across the servers of the cluster.

Why not plain ``nats.connect``: with reconnection on, nats-py retries a refused first login for ever
(every one a line in the callout's log, and no error for the caller); with it off, a refused login
raises but leaves the socket open. Here a refusal raises at once with the socket closed, and a
client that got in reconnects without limit once its connection drops (nats-py reads these options
only then).

A client is given every server of the cluster (the servers' ``no_advertise`` keeps them from telling it
more), in an order of its own: the list is rotated by the client's name rather than shuffled at random as
nats-py would, so clients spread over the servers and a replay repeats which client lands where.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Sequence
from typing import Any

from nats import errors
from nats.aio.client import Client


class NotSignedIn(errors.Error):
    """The server did not confirm the sign-in in time."""


def spread(servers: Sequence[str], name: str) -> list[str]:
    """``servers`` rotated by a stable hash of ``name``: where this client tries first (pure)."""
    if not servers:
        return []
    start = zlib.crc32(name.encode()) % len(servers)
    return [*servers[start:], *servers[:start]]


async def connect_once(url: str | Sequence[str], *, reconnect: bool = True, **options: Any) -> Client:
    nc = Client()
    servers = [url] if isinstance(url, str) else spread(url, str(options.get("name", "")))
    try:
        await nc.connect(servers, allow_reconnect=False, dont_randomize=True, **options)
        if not nc.is_connected:
            # nats-server PINGs a new connection about 2 s after it opens; when the sign-in (the auth
            # callout) takes longer, nats-py reads that PING where it expects the PONG to its CONNECT and
            # returns half connected, for good. Treat it as not signed in: the caller tries again.
            raise NotSignedIn(
                f"nats: sign-in to {servers[0] if len(servers) == 1 else servers} not confirmed in time (the auth callout is slow or down)"
            )
    except BaseException:
        with contextlib.suppress(Exception):
            await nc.close()
        raise
    if reconnect:
        nc.options["allow_reconnect"] = True
        nc.options["max_reconnect_attempts"] = -1
    return nc
