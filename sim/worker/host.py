"""Function workers of one cluster (one process per compute cluster), as worker-utils behaves.

Each worker pulls its functions' work from NATS (JetStream); for each work message it calls back to the pod
that holds the request: through the proxy when the message carries a proxy address, else directly, on
connections it keeps alive from one callback to the next (sim.worker.pool).
Workers ignore HTTP(S)_PROXY: only the proxy address in the work message counts.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from sim.runtime.component import Context, Ready
from sim.worker.http_callback import handle_http_work
from sim.worker.nats_links import WorkerLinks
from sim.worker.runtime import WorkerRuntime, make_workers


async def handle_work(worker: WorkerRuntime, work: dict[str, Any]) -> None:
    if work.get("kind") == "grpc":
        from sim.worker.grpc_callback import handle_work as handle_grpc

        await handle_grpc(worker, work)
    else:
        await handle_http_work(worker, work)


async def run(ctx: Context, ready: Ready) -> None:
    if "grpc-echo" in ctx.topology.functions:
        import sim.worker.grpc_callback  # noqa: F401 - aioquic loads now, not on the first callback
    # Each worker signs in to NATS and pulls its functions' work; a message is acked when its callback
    # is done, so work held by a worker that dies is redelivered to another.
    workers = make_workers(ctx)
    links = WorkerLinks(ctx, workers, handle_work)
    try:
        await links.start()
        # The signed-in fleet (its NATS clients, pull loops, pools) is the host's long-lived state: frozen,
        # the collector's passes walk only what came after, where each full pass over a thousand workers'
        # objects was ~7 % of a host's CPU under load. The cost: a reference cycle among frozen objects
        # that becomes garbage (a worker's client replaced after a refused re-login) is never collected.
        gc.freeze()
        ready({})
        await asyncio.Event().wait()  # until stopped
    finally:
        await links.close()
        for worker in workers.values():
            worker.pool.close()
            if worker.quic is not None:
                await worker.quic.close()
