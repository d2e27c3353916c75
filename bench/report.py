"""docs/benchmarks.json (every figure) and docs/benchmarks.md (the table, the calibration, the method, the
machine). The rounds' history (what was profiled, changed and measured, round by round) is bench/findings.md;
benchmarks.md only links to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.as_filed import COMMIT
from bench.calibration import (
    LOOP,
    LOOP_RUNS,
    START_RUNS,
    absolute_times,
    amount,
    describe,
    seconds_text,
    yardstick,
)
from bench.targets import Row, judge

FINDINGS = (
    "## Findings\n\nWhat each round profiled, changed and measured, and what bounds each figure: "
    "[bench/findings.md](../bench/findings.md)."
)

METHOD = """\
## Method

All traffic is on 127.0.0.1; the simulated 10.x addresses are only keys of each stack's network map,
from which the benchmark reads the real ports. Every stack runs under a temporary `NCPSIM_HOME` with a
unique name and is stopped at the end, as are nginx and dnsmasq. CPU times and memory come from psutil.

- **`ncpsim up` to first callback**: the clock starts when the `ncpsim up scenario=http-callback`
  (or `grpc-callback`) process is spawned and stops at the `ts` of the first `worker.callback.result`
  event with `ok: true` in `<state>/events/*.jsonl`. One cold run (fresh state folder: CAs and
  certificates are minted) and then {runs} warm runs on the same stack name (certificates kept, as a
  user's default stack keeps them); median and min-max of the warm runs.
- **Catalogue**: wall time of `ncpsim replay --all` (each scenario on a fresh stack), and of `ncpsim replay`
  of the 60 scenarios the catalogue had when issue 32 was filed.
- **Against the tree as filed**: issue 32's tree ({as_filed}) exported with `git archive`, byte-compiled and
  run with `python -m invoke` on the same interpreter and packages. `up` to the first callback, that
  tree's and this checkout's in turns ({as_filed_rounds} rounds, the order flipping, after a cold run each),
  judged on the median of the rounds' ratios; and its own `invoke replay --all -j auto` against this
  checkout's replay of the same 60 scenarios. Calibration units do not carry start-up between machines (round five's tree took
  0.44 s on its machine and 0.77 s on a later one whose loop was only a tenth slower); a ratio does.
- **Calibration**: `{loop}` in a fresh interpreter (timed inside it, best of {loop_runs}) and
  `python -c pass` (spawn to exit, best of {start_runs}), with the Python that runs the benchmark, at the
  start and at the end of the run; the best of each is the unit ("loops", "starts"), and every absolute
  time is also given in those units, so that two machines compare.
- **Keep-alive callbacks**: one invocation-service pod, no workers; the benchmark mints work (client
  `POST pexec` with `NVCF-POLL-SECONDS: 0`, work messages taken from the work bus) and then does each
  callback as worker-utils does: `GET` request-attach with the request token, echo, `POST` with the
  response token, while a status poll waits for the client's answer on a plain keep-alive connection to
  the pod. Serially on one kept-alive TLS connection to ncpsim's proxy (SNI `invocation.<workerDomain>`,
  absolute-form target), on one to nginx relaying the same way (below), and on one straight to the pod's
  8443 (SNI = the pod name, as the proxy uses), with the same client and the same pod; the routes take
  turns, round by round. `relay_cpu_ms_per_call` is the relay's CPU (the proxy's process, nginx's worker).
- **nginx**: Debian's nginx, one worker process, with the proxy's frontend certificate and upstream TLS
  re-encryption with verification (`proxy_ssl_verify on`, `proxy_ssl_trusted_certificate` = stack CA,
  `proxy_ssl_name` = the pod name, routing by a `map` of the target host), an upstream keep-alive pool
  (as Envoy pools), and the worker's connection kept alive as long as the worker keeps it (no request
  limit a run reaches, 300 s idle).
- **New-TLS-connection callbacks**: the same callbacks, {lanes} concurrent lanes, a new TLS connection
  per callback, through ncpsim's proxy and through the same nginx; also through nginx without the
  upstream pool.
- **QUIC path**: `bench.grpc_path` on a proxied stack and on the same stack with the proxy disabled
  (workers in the control-plane cluster), both up at once and taking five turns each, the order flipping
  each round: gRPC unary calls/s through the whole path (judged on the median of the rounds' ratios), and
  callback exchanges (new QUIC session + `POST /v1/proxy`) via the proxy vs straight to the pod.
- **Scale**: `sim.model.topology.build` with the compute clusters and workers shown; the benchmark drives
  invocations (`NVCF-POLL-SECONDS: 60`) over bounded concurrent keep-alive lanes to the two pods; a
  callback is lost when its invocation does not return 200 with its own body. Peak memory is judged on
  the largest sum of PSS of the stack's processes (every component's process group and the stack's
  supervisor, the zygote that forked them; sampled each second): each page shared among the forks counts
  once, split among the processes that map it, so the sum is what the fleet takes from the machine. Also
  shown: the largest sum of RSS (sampled every 200 ms), which counts every page the forked components
  share from the zygote once in each of them, and the machine's used memory (MemTotal - MemAvailable) at
  its largest less before `up`, which adds the kernel's share (page tables, socket buffers, slab), the
  benchmark's own client and anything else the machine did meanwhile; each with its split by role (the
  worker hosts are `ncpsim-compute`).
- **DNS**: a UDP load generator (window of {window} queries in flight, bounded count and time) against
  the stack's resolver (compute-cluster view) and dnsmasq on the same machine with the same rewrite
  (`--address=/<workerDomain>/<proxy LB>`, `--local`, no upstream), taking turns in five rounds (the
  order flips each round); judged on the median of the per-round ratios. Mix: {mix}.
"""


def _table(rows: list[Row]) -> str:
    lines = ["| figure | target | measured | verdict |", "|---|---|---|---|"]
    lines += [f"| {r.figure} | {r.target} | {r.measured} | {r.verdict} |" for r in rows]
    return "\n".join(lines)


def _machine(m: dict[str, Any]) -> str:
    return (
        f"- date: {m['date']}\n- machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB memory, "
        f"{m['os']}\n- Python {m['python']} (components on {m.get('event_loop', 'asyncio')}); "
        f"{m.get('nginx') or 'nginx: not installed'}; "
        f"{m.get('dnsmasq') or 'dnsmasq: not installed'}\n"
        f"- load average at start {m['load_average_start']}, at end {m.get('load_average_end')}"
        + (f"\n- note: {m['note']}" if m.get("note") else "")
    )


def _calibration(results: dict[str, Any]) -> str:
    stick = yardstick(results)
    failed = "".join(
        f" At the {when} it failed: {end['failed']}."
        for when, end in (results.get("calibration") or {}).items()
        if isinstance(end, dict) and end.get("failed")
    )
    if stick is None:
        return f"## Calibration\n\nNot measured in this run: the absolute times above do not travel.{failed}"
    lines = [
        "## Calibration",
        "",
        describe(stick) + "." + failed,
        "",
        "| figure | measured | loops | starts |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {label} | {seconds_text(t)} | {amount(stick.loops(t))} | {amount(stick.starts(t))} |"
        for label, t in absolute_times(results)
    ]
    return "\n".join(lines)


def _details(results: dict[str, Any]) -> str:
    lines = ["## Details", ""]
    for section in (_startup_lines, _relay_lines, _dns_lines, _quic_lines, _scale_lines):
        lines += section(results)
    errors = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and v.get("error")}
    lines += [f"- **{name} failed**: {error}" for name, error in errors.items()]
    return "\n".join(lines)


def _scale_lines(results: dict[str, Any]) -> list[str]:
    scale, lines = results.get("scale") or {}, []
    if cpu := scale.get("cpu_seconds"):
        lines.append(f"- scale, CPU seconds by component during the callbacks: {cpu}")
    if pss := scale.get("peak_pss_mib_by_role"):
        lines.append(f"- scale, peak PSS (MiB) by role at the peak (the verdict's figure): {pss}")
    if memory := scale.get("peak_rss_mib_by_role"):
        lines.append(
            f"- scale, peak RSS (MiB) by role at the peak (ncpsim-compute: the worker hosts): {memory}"
        )
    if (machine := scale.get("peak_machine_used_mib")) is not None:
        kernel = scale.get("kernel_mib_at_machine_peak") or "not read"
        lines.append(
            f"- scale, the machine's used memory at its peak less before `up`: {machine} MiB; the kernel's "
            f"allocations then (MiB): {kernel}"
        )
    if (freed := scale.get("freed_by_down_mib")) is not None:
        lines.append(
            f"- scale, memory the machine got back at `down`: {freed} MiB, against a PSS sum of "
            f"{scale.get('end_pss_mib')} MiB just before it, {scale.get('end_pss_anon_mib')} MiB of it "
            "anonymous (the rest is code the page cache keeps); the kernel's part of it (MiB): "
            f"{scale.get('kernel_freed_by_down_mib')}"
        )
    return lines


def _startup_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for kind, r in (results.get("startup") or {}).items():
        if isinstance(r, dict) and r.get("phases"):
            steps = ", ".join(f"{k.replace('_', ' ')} {v} s" for k, v in r["phases"].items())
            lines.append(f"- `ncpsim up` {kind}, median seconds after spawn: {steps}")
        if isinstance(r, dict) and r.get("cli_cpu_median") is not None:
            lines.append(
                f"- `ncpsim up` {kind}, CPU of the command line and its zygote: {r['cli_cpu_median']} s"
            )
    return lines


def _relay_lines(results: dict[str, Any]) -> list[str]:
    lines, relay = [], results.get("relay") or {}
    for kind in ("keepalive", "new_connection"):
        for name, r in (relay.get(kind) or {}).items():
            if isinstance(r, dict) and "per_second" in r:
                cpu = (
                    f", relay CPU {r['relay_cpu_ms_per_call']} ms/callback"
                    if "relay_cpu_ms_per_call" in r
                    else ""
                )
                rounds = f", per round {r['round_rates']}" if r.get("round_rates") else ""
                lines.append(
                    f"- {kind} {name}: {r.get('ok')}/{r.get('calls')} ok, {r['per_second']}/s{cpu}{rounds}"
                )
    ratios = (
        ("keepalive", None, "proxy / nginx"),
        ("keepalive", "vs_direct", "proxy / direct"),
        ("new_connection", None, "proxy / nginx"),
        ("new_connection", "vs_no_upstream_keepalive", "proxy / nginx without its upstream pool"),
    )
    for kind, key, label in ratios:
        r = relay.get(kind) or {}
        if key:
            r = r.get(key) or {}
        if r.get("round_ratio_median") is not None:
            lines.append(
                f"- {kind} {label} per round: median {r['round_ratio_median']}, range {r['round_ratio_range']}"
            )
    return lines


def _dns_lines(results: dict[str, Any]) -> list[str]:
    dns = results.get("dns") or {}
    return [
        f"- DNS {name}: {r['answered']}/{r['sent']} answered, {r['per_second']}/s, "
        f"server CPU {r['server_cpu_us_per_query']} us/query (load generator's "
        f"{r.get('client_cpu_us_per_query', '?')}), rcodes {r['rcodes']}"
        for name in ("resolver", "dnsmasq")
        if (r := dns.get(name))
    ] + (
        [f"- DNS per round: median {dns['round_ratio_median']}, range {dns['round_ratio_range']}"]
        if "round_ratio_median" in dns
        else []
    )


def _quic_lines(results: dict[str, Any]) -> list[str]:
    lines, quic = [], results.get("quic") or {}
    for stack in ("via_proxy", "direct_stack"):
        if r := quic.get(stack):
            rates = {k: v["per_second"] for k, v in r.items() if isinstance(v, dict) and "per_second" in v}
            lines.append(
                f"- QUIC {stack.replace('_', ' ')}: per second {rates}"
                + (f", proxy CPU {r['proxy_cpu_seconds']} s" if "proxy_cpu_seconds" in r else "")
            )
    return lines


def markdown(results: dict[str, Any], command: str) -> str:
    params = results.get("parameters", {})
    return (
        "\n\n".join(
            [
                "# ncpsim benchmarks",
                (
                    f"Written by `{command}` in {results.get('total_seconds')} s; every figure is also in "
                    "`docs/benchmarks.json`."
                ),
                _machine(results["machine"]),
                _table(judge(results)),
                _calibration(results),
                METHOD.format(
                    as_filed=COMMIT,
                    as_filed_rounds=params.get("as_filed_rounds"),
                    runs=params.get("startup_runs"),
                    lanes=params.get("newconn_lanes"),
                    window=params.get("dns_window"),
                    mix=params.get("dns_mix"),
                    loop=LOOP,
                    loop_runs=LOOP_RUNS,
                    start_runs=START_RUNS,
                ).rstrip(),
                _details(results),
                FINDINGS,
            ]
        )
        + "\n"
    )


def write(results: dict[str, Any], out_dir: Path, command: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    results["targets"] = [r.__dict__ | {"verdict": r.verdict} for r in judge(results)]
    (out_dir / "benchmarks.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out_dir / "benchmarks.md").write_text(markdown(results, command))
