"""Names of the NATS things work travels through, and what a worker may touch.

Why one module: invocation-service, grpc-proxy, the auth callout and the workers
must agree on these names, and the callout's permissions must match them exactly,
so they are derived in one place. Facts from the public NVCF source:

- stream ``rq_<region>_<fvid>`` holds subjects ``rq.<region>.<fvid>.>``; a message's
  subject ends with its request id (``rq.<region>.<fvid>.<reqId>``), one message
  per subject; HTTP work is published into it, and gRPC work uses the same
  subject family, so the stream captures it too;
- the durable pull consumer is ``<stream>_workers``;
- STREAMING functions use ``llsrq.<region>.<fvid>.<reqId>`` (core request/reply).
"""

from __future__ import annotations

import re
from typing import Literal

from .jwt import Permissions

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def _token(kind: str, value: str) -> str:
    """A subject token must not contain dots, wildcards or spaces."""
    if not _TOKEN.match(value):
        raise ValueError(f"{kind} {value!r} is not a valid NATS subject token")
    return value


def stream_name(region: str, fvid: str) -> str:
    return f"rq_{_token('region', region)}_{_token('function version id', fvid)}"


def consumer_name(region: str, fvid: str) -> str:
    return f"{stream_name(region, fvid)}_workers"


def stream_subjects(region: str, fvid: str) -> str:
    """The wildcard the stream captures."""
    return f"rq.{_token('region', region)}.{_token('function version id', fvid)}.>"


def work_subject(region: str, fvid: str, req_id: str) -> str:
    """Where one request's work message goes (HTTP via JetStream, gRPC alike)."""
    return (
        f"rq.{_token('region', region)}.{_token('function version id', fvid)}.{_token('request id', req_id)}"
    )


def streaming_subject(region: str, fvid: str, req_id: str) -> str:
    return f"llsrq.{_token('region', region)}.{_token('function version id', fvid)}.{_token('request id', req_id)}"


def worker_user_id(fvid: str) -> str:
    """The user name the callout gives a token-mode worker (seen in its log lines)."""
    return f"worker-{fvid}"


def worker_permissions(
    fvid: str, regions: tuple[str, ...], scope: Literal["own", "source"] = "own"
) -> Permissions:
    """What a token-mode worker may publish and subscribe to.

    ``own`` (the default) limits the JetStream API to the worker's own consumers, so
    a worker cannot pull another function's work. ``source`` reproduces the public
    NVCF API's list, which scopes core subjects to the function but allows
    ``$JS.API.CONSUMER.MSG.NEXT.*.*`` and ``$JS.ACK.>``, i.e. any consumer.
    """
    _token("function version id", fvid)
    common = (
        f"rq.*.{fvid}.>",
        f"llsrq.*.{fvid}.>",
        f"nvcf.cancel.{fvid}",
        "rq_polling.*",
        "_INBOX.>",
    )
    if scope == "source":
        js: tuple[str, ...] = (
            "$JS.API.STREAM.INFO.*",
            "$JS.API.STREAM.PURGE.*",
            "$JS.API.CONSUMER.INFO.>",
            "$JS.API.CONSUMER.MSG.NEXT.*.*",
            "$JS.ACK.>",
        )
    else:
        js = tuple(
            subject
            for region in regions
            for subject in (
                f"$JS.API.STREAM.INFO.{stream_name(region, fvid)}",
                f"$JS.API.CONSUMER.INFO.{stream_name(region, fvid)}.{consumer_name(region, fvid)}",
                f"$JS.API.CONSUMER.MSG.NEXT.{stream_name(region, fvid)}.{consumer_name(region, fvid)}",
                f"$JS.ACK.{stream_name(region, fvid)}.{consumer_name(region, fvid)}.>",
            )
        )
    allowed = common + js
    return Permissions(pub_allow=allowed, sub_allow=allowed, resp_max=1)
