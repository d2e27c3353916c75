"""Issue 17's targets (and issue 13's redelivery), each measured figure judged against its target (pure:
results in, rows out)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from bench.as_filed import COMMIT
from bench.calibration import yardstick


@dataclass(frozen=True)
class Row:
    figure: str
    target: str
    measured: str
    met: bool | None  # None: not measured (skipped or failed), or a figure without a target

    @property
    def verdict(self) -> str:
        return {True: "met", False: "MISSED", None: "-"}[self.met]


def _get(results: dict[str, Any], *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _seconds(value: float | None, spread: tuple[float | None, float | None] = (None, None)) -> str:
    if value is None:
        return "not measured"
    low, high = spread
    return f"{value:.2f} s" + (f" ({low:.2f}-{high:.2f})" if low is not None and high is not None else "")


def _in_units(results: dict[str, Any], seconds: float | None) -> str:
    """The time in the run's calibration units, as " = 1.4 loops, 22 starts" (nothing when unmeasured)."""
    stick = yardstick(results)
    return "" if stick is None or seconds is None else f" = {stick.text(seconds)}"


def _first(results: dict[str, Any], key: str, label: str, limit: float) -> Row:
    r = _get(results, "startup", key) or {}
    median = r.get("median")
    measured = _seconds(median, (r.get("min"), r.get("max"))) + _in_units(results, median)
    if r.get("cold_seconds") is not None:
        measured += f"; cold {r['cold_seconds']:.2f} s"
    met = None if median is None else median <= limit and not r.get("failed_runs")
    return Row(
        f"`ncpsim up` to first {label} callback (median of warm runs, min-max)",
        f"<= {limit} s",
        measured,
        met,
    )


CATALOGUE = "catalogue replay (`ncpsim replay --all -j auto`), every scenario on a fresh stack"
CATALOGUE_LIMIT = 15.0


def _catalogue(results: dict[str, Any]) -> Row:
    r = _get(results, "catalogue")
    target = f"<= {CATALOGUE_LIMIT:.0f} s, all pass"
    if not r or r.get("skipped"):
        return Row(CATALOGUE, target, "skipped (quick run)", None)
    if r.get("error"):
        return Row(CATALOGUE, target, f"failed: {r['error']}", False)
    tail = " ".join(r.get("output_tail") or [])[:160]
    passed = (
        f"{r.get('passed')}/{r.get('total')} passed" if r.get("total") else f"exit {r.get('exit')}: {tail}"
    )
    measured = f"{r['seconds']:.1f} s{_in_units(results, r['seconds'])}, {passed}"
    if lib := r.get("library"):
        measured += (
            f"; the same catalogue through scenarios.replay.replay_many: {lib['seconds']:.1f} s, "
            f"{lib.get('passed')}/{lib.get('total')} passed"
        )
    met = r["seconds"] <= CATALOGUE_LIMIT and r.get("exit") == 0
    return Row(CATALOGUE, target, measured, met)


AS_FILED = f"catalogue as filed (its 60 scenarios of {COMMIT}, `ncpsim replay NAME... -j auto`)"
AS_FILED_LOOPS = 54.0  # 14.6 s at round five's loop of about 0.27 s (0.25-0.29)


def _passed(r: dict[str, Any]) -> str:
    return f"{r.get('passed')}/{r.get('total')} passed" if r.get("total") else f"exit {r.get('exit')}"


def _catalogue_as_filed(results: dict[str, Any]) -> Row:
    """Judged against the tree as filed replaying its own catalogue in the same run, when it did so whole;
    else in the run's loops against the 14.6 s it took when filed."""
    r = _get(results, "catalogue", "as_filed")
    tree = _get(results, "as_filed", "catalogue") or {}
    if not r or r.get("seconds") is None:
        return Row(AS_FILED, f"<= {AS_FILED_LOOPS:.0f} loops, all pass", "not measured", None)
    measured = f"{r['seconds']:.1f} s{_in_units(results, r['seconds'])}, {_passed(r)}"
    ok = r.get("exit") == 0
    if tree.get("seconds"):
        ratio = r["seconds"] / tree["seconds"]
        measured += (
            f"; the tree as filed (`invoke replay --all -j auto` there): {tree['seconds']:.1f} s, "
            f"{_passed(tree)}: {ratio:.2f} of it"
        )
        if tree.get("exit") == 0:
            return Row(
                AS_FILED, "<= 1.0 of the tree as filed in this run, all pass", measured, ok and ratio <= 1
            )
    stick = yardstick(results)
    met = None if stick is None else stick.loops(r["seconds"]) <= AS_FILED_LOOPS and ok
    return Row(AS_FILED, f"<= {AS_FILED_LOOPS:.0f} loops, all pass (14.6 s when filed)", measured, met)


def _first_as_filed(results: dict[str, Any], key: str, label: str) -> Row:
    figure = (
        f"`ncpsim up` to first {label} callback, this checkout / the tree as filed ({COMMIT}), "
        "in turns (median of the rounds' ratios)"
    )
    target = "<= 1.0 (no slower than when filed)"
    r = _get(results, "as_filed", "startup", key) or {}
    if r.get("round_ratio_median") is None:
        why = _get(results, "as_filed", "skipped") or _get(results, "as_filed", "error")
        return Row(figure, target, "not measured" + (f": {why}" if why else ""), None)
    low, high = r["round_ratio_range"]
    medians = r["median"]
    measured = (
        f"{r['round_ratio_median']:.2f} (rounds {low:.2f}-{high:.2f}; medians {medians['current']:.2f} s "
        f"against {medians['as_filed']:.2f} s)"
    )
    failed = r.get("failed_runs") or {}
    if failed.get("as_filed"):  # the old tree's runs say nothing about this checkout: no verdict
        measured += (
            f"; the tree as filed had {failed['as_filed']} runs without a callback (logs: up-*-as-*.log)"
        )
        return Row(figure, target, measured, None)
    if failed.get("current"):
        measured += f"; this checkout had {failed['current']} runs without a callback"
    return Row(figure, target, measured, r["round_ratio_median"] <= 1.0 and not failed.get("current"))


def _ratio_row(figure: str, r: dict[str, Any], names: tuple[str, str], floor: float | None) -> Row:
    """Judged on the median of the per-round ratios when the routes took turns (a burst of other load
    then spoils one round, not the figure), else on the ratio of the overall rates. No `floor`: a figure
    shown for reference, judged against nothing."""
    target = "none (for reference)" if floor is None else f">= {floor}"
    a, b, ratio = r.get(names[0]), r.get(names[1]), r.get("ratio")
    if ratio is None or not isinstance(a, dict) or not isinstance(b, dict) or "per_second" not in b:
        return Row(figure, target, "not measured", None)
    overall = f"{a['per_second']:.0f}/s {names[0]} vs {b['per_second']:.0f}/s {names[1]}"
    median = r.get("round_ratio_median")
    judged = ratio if median is None else median
    if median is None:
        measured = f"{ratio:.2f} ({overall})"
    else:
        low, high = r["round_ratio_range"]
        measured = f"{median:.2f} (rounds {low:.2f}-{high:.2f}; overall {ratio:.2f}: {overall})"
    return Row(figure, target, measured, None if floor is None else judged >= floor)


def _relay_rows(results: dict[str, Any]) -> list[Row]:
    keep = _get(results, "relay", "keepalive") or {}
    new = _get(results, "relay", "new_connection") or {}
    return [
        _ratio_row(
            "keep-alive callbacks/s, proxy / nginx (median of 5 alternating rounds)",
            keep,
            ("proxy", "nginx"),
            1.0,
        ),
        _ratio_row(
            "keep-alive callbacks/s, proxy / direct to pod (median of 5 alternating rounds)",
            (keep.get("vs_direct") or {}) | {k: keep[k] for k in ("proxy", "direct") if k in keep},
            ("proxy", "direct"),
            None,
        ),
        _ratio_row(
            "new-TLS-connection callbacks/s, proxy / nginx (median of 5 alternating rounds)",
            new,
            ("proxy", "nginx"),
            1.0,
        ),
    ]


def _quic_row(results: dict[str, Any]) -> Row:
    r = _get(results, "quic") or {}
    figure = "QUIC path: gRPC unary calls/s, proxy / direct (median of 5 alternating rounds)"
    via, direct = _get(r, "via_proxy", "unary"), _get(r, "direct_stack", "unary")
    if not via or not direct:
        return Row(figure, ">= 0.8", "not measured", None)
    turns = {k: r[k] for k in ("round_ratio_median", "round_ratio_range") if k in r}
    row = _ratio_row(
        figure, {"proxy": via, "direct": direct, "ratio": r["unary_ratio"], **turns}, ("proxy", "direct"), 0.8
    )
    return replace(row, measured=f"{row.measured}; callback exchanges {r.get('callback_ratio')}")


SCALE_TARGET = "0 lost, <= 300 s, <= 2 GiB"


def _scale_peak(r: dict[str, Any]) -> tuple[float, str]:
    """The peak the verdict is on, and how it reads: PSS (what the fleet takes from the machine) beside the
    RSS sum and the machine's delta; where the platform has no PSS, the RSS sum (it can only overstate)."""
    rss, pss, machine = r["peak_rss_mib"], r.get("peak_pss_mib"), r.get("peak_machine_used_mib")
    cross = f", machine +{machine:.0f}" if machine is not None else ""
    if (freed := r.get("freed_by_down_mib")) is not None:
        cross += f", down gave back {freed:.0f}"
    if not pss:
        return rss, f"peak RSS {rss:.0f} MiB (no PSS on this platform{cross})"
    return pss, f"peak PSS {pss:.0f} MiB (RSS sum {rss:.0f}{cross})"


def _scale_row(results: dict[str, Any]) -> Row:
    figure = "scale: lost, wall time (up + callbacks), peak memory of the stack"
    r = _get(results, "scale")
    if not r or "lost" not in r:
        return Row(figure, SCALE_TARGET, "not measured", None)
    done = f"{r['callbacks']}/{r['requested']} callbacks" + (
        " (deadline hit)" if r.get("deadline_hit") else ""
    )
    peak, peak_text = _scale_peak(r)
    measured = (
        f"{r['clusters']} clusters, {r['workers']} workers, {done}: {r['lost']} lost, "
        f"{r['wall_seconds']:.1f} s{_in_units(results, r['wall_seconds'])} ({r['up_seconds']:.1f} s up + "
        f"{r['seconds']:.1f} s callbacks), {peak_text}"
    )
    met = r["lost"] == 0 and r["callbacks"] == r["requested"] and r["wall_seconds"] <= 300 and peak <= 2048
    return Row(figure, SCALE_TARGET, measured, met)


def _redelivery_row(results: dict[str, Any]) -> Row:
    r = _get(results, "redelivery")
    figure = "redelivery: invocations while 10 workers are SIGKILLed mid-callback"
    if not r or "lost" not in r:
        return Row(figure, "0 lost, 0 answered twice", "not measured", None)
    measured = (
        f"{r['invocations']} invocations: {r['answered']} answered, {r['documented_error']} documented "
        f"401s, {r['lost']} lost, {r['answered_twice']} twice ({r['redelivered_messages']} redelivered)"
    )
    return Row(figure, "0 lost, 0 answered twice", measured, r["lost"] == 0 and r["answered_twice"] == 0)


def _dns_row(results: dict[str, Any]) -> Row:
    return _ratio_row(
        "DNS queries/s, resolver / dnsmasq (median of 5 alternating rounds)",
        _get(results, "dns") or {},
        ("resolver", "dnsmasq"),
        1.0,
    )


def judge(results: dict[str, Any]) -> list[Row]:
    rows: list[Callable[[dict[str, Any]], Row | list[Row]]] = [
        lambda r: _first(r, "http", "HTTP", 0.6),
        lambda r: _first(r, "grpc", "gRPC", 0.8),
        lambda r: _first_as_filed(r, "http", "HTTP"),
        lambda r: _first_as_filed(r, "grpc", "gRPC"),
        _catalogue,
        _catalogue_as_filed,
        _relay_rows,
        _quic_row,
        _scale_row,
        _redelivery_row,
        _dns_row,
    ]
    out: list[Row] = []
    for make in rows:
        made = make(results)
        out.extend(made if isinstance(made, list) else [made])
    return out
