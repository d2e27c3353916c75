"""gRPC callbacks that share one QUIC dial keep that dial's DNS answer (issue 26, "traces keep the DNS answer").

The worker library dials once per host and callbacks arriving meanwhile wait for that dial
(sim.worker.quic_cache): they look nothing up themselves, yet each trace must show the lookup its connection
came from, so `dnsRcode` expectations do not depend on which callback happened to dial. In process, with a
stand-in worker whose resolver holds its answer until every callback is waiting."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from dns.client import NameNotResolved
from sim.protocols.grpc_callback import parse_connect_url
from sim.worker.grpc_callback import _attempt

HOST = "10-42-0-41.grpc-worker.example.com"


class Resolver:
    def __init__(self) -> None:
        self.asked = 0
        self.release = asyncio.Event()

    async def resolve(self, name: str) -> list[str]:
        self.asked += 1
        await self.release.wait()
        raise NameNotResolved(name, "NXDOMAIN")


def stand_in(resolver: Resolver) -> Any:
    events = SimpleNamespace(emit=lambda *a, **k: None)
    return SimpleNamespace(
        spec=SimpleNamespace(name="worker-1-0", worker_utils="1.4.0"),
        ctx=SimpleNamespace(resolve=resolver.resolve, events=events),
        dns_address="10.53.0.10:53",
        quic=None,
    )


def test_callbacks_waiting_on_one_dial_each_keep_its_nxdomain() -> None:
    async def go() -> list[tuple[dict[str, Any], Any]]:
        resolver = Resolver()
        worker, target = stand_in(resolver), parse_connect_url(f"https://{HOST}/v1/proxy")
        answers: list[dict[str, Any]] = [{} for _ in range(3)]
        attempts = [
            asyncio.create_task(_attempt(worker, target, {"requestId": f"r{n}"}, answers[n], []))
            for n in range(3)
        ]
        while resolver.asked == 0:  # the first callback dials; the others find the dial under way
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        resolver.release.set()
        outcomes = await asyncio.gather(*attempts)
        assert resolver.asked == 1  # one lookup for the three: two callbacks looked nothing up themselves
        return list(zip(answers, outcomes, strict=True))

    for dns, outcome in asyncio.run(go()):
        assert dns == {"name": HOST, "rcode": "NXDOMAIN"}
        assert (outcome.stage, outcome.error) == ("dns", f"lookup {HOST} on 10.53.0.10:53: no such host")
