"""One way to sign in to nats-server: a single attempt that cleans up after itself, then (optionally)
reconnection for ever.

Why not plain ``nats.connect``: with reconnection on, nats-py retries a refused first login for ever
(every one a line in the callout's log, and no error for the caller); with it off, a refused login
raises but leaves the socket open. Here a refusal raises at once with the socket closed, and a
client that got in reconnects without limit once its connection drops (nats-py reads these options
only then).
"""

from __future__ import annotations

import contextlib
from typing import Any

from nats import errors
from nats.aio.client import Client


class NotSignedIn(errors.Error):
    """The server did not confirm the sign-in in time."""


async def connect_once(url: str, *, reconnect: bool = True, **options: Any) -> Client:
    nc = Client()
    try:
        await nc.connect(url, allow_reconnect=False, **options)
        if not nc.is_connected:
            # nats-server PINGs a new connection about 2 s after it opens; when the sign-in (the auth
            # callout) takes longer, nats-py reads that PING where it expects the PONG to its CONNECT and
            # returns half connected, for good. Treat it as not signed in: the caller tries again.
            raise NotSignedIn(
                f"nats: sign-in to {url} not confirmed in time (the auth callout is slow or down)"
            )
    except BaseException:
        with contextlib.suppress(Exception):
            await nc.close()
        raise
    if reconnect:
        nc.options["allow_reconnect"] = True
        nc.options["max_reconnect_attempts"] = -1
    return nc
