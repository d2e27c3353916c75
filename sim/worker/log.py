"""The worker's own log line for a callback that failed: what `kubectl logs` of a function pod shows.

worker-utils logs with zap; its console encoder writes `TIME<TAB>LEVEL<TAB>message<TAB>{fields}`, which is
what customers paste into tickets beside the error. A callback that succeeds logs nothing here (its
record is in the events); one that fails leaves this line in the worker host's log, the cluster's pods'
logs side by side.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO


def callback_failed(worker: str, callback: str, result: dict[str, Any], out: TextIO | None = None) -> None:
    if result.get("ok"):
        return
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    fields = {
        "worker": worker,
        "callback": callback,
        "requestId": result.get("requestId"),
        "status": result.get("status"),
        "error": result.get("error"),
    }
    print(f"{stamp}\tERROR\tcallback failed\t{json.dumps(fields)}", file=out or sys.stderr, flush=True)
