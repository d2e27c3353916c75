"""Entry point of every component process: `python -m sim.runtime.run KIND --state DIR --name NAME --cluster C`.

The launcher starts one process per pod, per compute cluster (hosting its workers), for the proxy,
the resolver, nats-server (a supervisor) and its auth callout. Each binds port 0, reports its virtual-to-real bindings as one JSON
line on the ready pipe (fd given by --ready-fd), closes it, and runs until SIGTERM or SIGINT.

The event loop is uvloop where it is installed (Linux and macOS wheels), else asyncio's own;
NCPSIM_EVENT_LOOP=asyncio chooses asyncio's (to compare the two, or to rule uvloop out of a bug).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from sim.model.topology import Topology
from sim.runtime.component import Context, Runner
from sim.runtime.log import one_line_logs

try:
    import uvloop
except ImportError:  # no wheel for this platform (Windows): asyncio's loop
    uvloop = None  # type: ignore[assignment]

EVENT_LOOPS = ("uvloop", "asyncio")

RUNNERS = {
    "resolver": "sim.pods.resolver:run",
    "nats": "sim.pods.nats.component:run",
    "nats-callout": "sim.pods.nats.callout_component:run",
    "invocation": "sim.pods.invocation:run",
    "grpc-proxy": "sim.pods.grpcproxy:run",
    "proxy": "sim.proxy.component:run",
    "workers": "sim.worker.host:run",
}


def load_runner(kind: str) -> Runner:
    module, func = RUNNERS[kind].split(":")
    return getattr(importlib.import_module(module), func)


async def main_async(kind: str, ctx: Context, ready_fd: int | None) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)

    def ready(bindings: dict[str, int]) -> None:
        ctx.events.emit("component.ready", bindings=bindings, pid=os.getpid())
        if ready_fd is not None:
            os.write(ready_fd, (json.dumps({"pid": os.getpid(), "bindings": bindings}) + "\n").encode())
            os.close(ready_fd)

    try:
        await load_runner(kind)(ctx, ready)
    except asyncio.CancelledError:
        ctx.events.emit("component.stopped")


def event_loop(choice: str | None) -> str:
    """The components' event loop: `choice` (NCPSIM_EVENT_LOOP) if given, else uvloop where it is installed
    (6-11 % less CPU and a fifth less memory at scale, measured back to back: bench/findings.md), else
    asyncio."""
    choice = choice or ("uvloop" if uvloop is not None else "asyncio")
    if choice not in EVENT_LOOPS:
        raise SystemExit(f"NCPSIM_EVENT_LOOP={choice!r}: choose one of {', '.join(EVENT_LOOPS)}")
    if choice == "uvloop" and uvloop is None:
        raise SystemExit("NCPSIM_EVENT_LOOP=uvloop, but uvloop is not installed here")
    return choice


def loop_factory(choice: str | None) -> Callable[[], asyncio.AbstractEventLoop]:
    return uvloop.new_event_loop if event_loop(choice) == "uvloop" else asyncio.new_event_loop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.runtime.run", description=__doc__)
    parser.add_argument("kind", choices=sorted(RUNNERS))
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args(argv)
    one_line_logs()  # this process's stderr is the component's log: one line a record, libraries' too
    new_loop = loop_factory(os.environ.get("NCPSIM_EVENT_LOOP"))
    topology = Topology.load(args.state)
    ctx = Context(args.state, topology, args.name, args.cluster)
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(main_async(args.kind, ctx, args.ready_fd))
    except KeyboardInterrupt:
        pass
    finally:
        ctx.events.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
