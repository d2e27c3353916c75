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

import asyncio
import contextlib
import os
import zlib
from collections.abc import Sequence
from typing import Any

from nats import errors
from nats.aio.client import Client
from nats.nuid import NUID


class NotSignedIn(errors.Error):
    """The server did not confirm the sign-in in time."""


def spread(servers: Sequence[str], name: str) -> list[str]:
    """``servers`` rotated by a stable hash of ``name``: where this client tries first (pure)."""
    if not servers:
        return []
    start = zlib.crc32(name.encode()) % len(servers)
    return [*servers[start:], *servers[:start]]


# The keys of the server's INFO that nats-py reads once connected (tests/test_nats_cluster.py reads them
# from its source); a connected client keeps only these.
INFO_READ = frozenset(
    {"headers", "nonce", "tls_required", "version", "max_payload", "client_id", "client_ip"}
)

# One inbox generator for the clients of a process. nats-py gives each client its own NUID, whose
# random.Random holds 2.5 KiB of state: 25 MiB across a fleet of ten thousand workers. Inboxes stay unique
# (one sequence, one random prefix) and a server sees the same: a random ``_INBOX.<nuid>`` per
# subscription. Drawn afresh in each process: components are forked from one zygote, and a generator
# inherited from it would hand two worker hosts the same inboxes (their messages would cross).
_inboxes: tuple[int, NUID] | None = None


def inbox_generator() -> NUID:
    global _inboxes
    if _inboxes is None or _inboxes[0] != os.getpid():
        _inboxes = (os.getpid(), NUID())
    return _inboxes[1]


def new_client() -> Client:
    """A nats-py client that draws its inboxes from the process's generator (nats-py has no option for it:
    tests/test_nats_cluster.py pins the attribute, and the INFO keys nats-py reads)."""
    nc = Client()
    nc._nuid = inbox_generator()
    return nc


async def connect_once(url: str | Sequence[str], *, reconnect: bool = True, **options: Any) -> Client:
    nc = new_client()
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
            await close_client(nc)
        raise
    # The server's INFO, as kept: only what nats-py reads once connected (a reconnect reads a new INFO
    # whole). The rest, about 2 KiB a client, was a tenth of a worker's NATS memory.
    nc._server_info = {k: v for k, v in nc._server_info.items() if k in INFO_READ}
    if reconnect:
        nc.options["allow_reconnect"] = True
        nc.options["max_reconnect_attempts"] = -1
    return nc


async def close_client(nc: Client) -> None:
    """``nc.close()`` carried to its end even when the caller is cancelled meanwhile, however often; the
    caller's cancellation is raised once the client is closed. ncpsim closes its clients through here.

    nats-py's close marks the client closed, cancels its tasks and yields once (``asyncio.sleep(0)``)
    before it closes the socket. A cancellation landing on that yield left the socket open for good (every
    later close returns at once on a client marked closed): an "unclosed transport" and "loop is closed"
    ResourceWarning when the garbage collector found it, in whatever test was running. Seen under load in
    tests/test_h3_pool.py: sim.worker.nats_links.cancel_all cancels a link's task again every 0.2 s, and
    one such cancellation reached the task's ``finally`` as it closed the link's client
    (tests/test_nats_close.py)."""
    closing = asyncio.ensure_future(nc.close())
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        while not closing.done():  # shielded from this and any further cancellation
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({closing})
        if not closing.cancelled():
            closing.exception()  # retrieved: the caller gets its cancellation, not the close's error
        raise
