"""Fuzzing what `ncpsim up` and `ncpsim replay` read (issue 16, acceptance: the fuzz run).

Mutated values files (a customer's, and the values blocks of the catalogue) and mutated scenario files (the
catalogue's own) go through the same loading `up` and `replay` call: `customer_layers` (each `-f`), then
`load_scenario` with those layers, `idle_scenario` (`up` without a scenario), the unknown-key warnings and
the Topology. Mutations: byte flips, truncation, duplicated lines, deep nesting, aliases (bombs and loops),
huge numbers, wrong types, odd keys and characters. Each case has a time limit. Nothing may escape but an
NcpsimError (the command line's one line and exit 2), and each refusal is one line.

The long run (10,000 of each) is marked `long`; the default suite runs a quick 300 of each, and passes a
few refused files through the real command line to see exit 2.
"""

from __future__ import annotations

import collections
import random
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from cli_support import ncpsim

from scenarios.devenv import idle_scenario
from scenarios.load import customer_layers, load_scenario
from scenarios.lookup import CATALOGUE
from scenarios.report import values_warnings
from sim.errors import NcpsimError

CASE_LIMIT = 5.0  # seconds one case may take (a refusal takes milliseconds; a hang is what this catches)
QUICK_CASES, LONG_CASES = 300, 10_000
SEED = 16  # issue 16: the same cases every run
CUSTOMER = """\
# values.yaml attached to a ticket: the customer's self-hosted NVCF worker callback proxy
workerCallbackProxy:
  enabled: true
  workerDomain: callbacks.customer.example  # the wildcard their DNS rewrites to the proxy
  service:
    type: LoadBalancer
  tls:
    frontend:
      existingSecret: customer-frontend-tls
      certificate:
        issuerRef: null
  invocation:
    upstreamTls:
      enabled: true
    connect:
      enabled: false
  image:
    registry: docker.io
    repository: envoyproxy/envoy
    tag: v1.31-latest
global:
  workerEndpoints:
    invocationProxyURL: https://invocation.callbacks.customer.example:10084
    invocationServiceURL: ""
  nvcaOperator:
    agent:
      workerCallbackCaPem: ""
nats:
  workerAuth: nkey
  podAnnotations:
    team: platform
invocation:
  podAnnotations: {}
adminIssuerProxy:
  enabled: true
  gateway:
    enabled: true
"""


# -- mutations --------------------------------------------------------------------------------------------
def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True) or ["\n"]


def flip_bytes(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data or b" ")
    for _ in range(rng.randint(1, 8)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def duplicate(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data.decode("utf-8", "replace"))
    start = rng.randrange(len(lines))
    chunk = lines[start : start + rng.randint(1, 6)]
    at = rng.randrange(len(lines) + 1)
    return "".join(lines[:at] + chunk * rng.randint(1, 3) + lines[at:]).encode()


def _replace_value(rng: random.Random, data: bytes, new: Callable[[], str]) -> bytes:
    """Replace the value after a random `key:` (or a list item) with what `new` gives."""
    lines = _lines(data.decode("utf-8", "replace"))
    slots = [i for i, line in enumerate(lines) if re.match(r"\s*(- |[^#\s][^:]*:\s)", line)]
    if not slots:
        return data + f"x: {new()}\n".encode()
    i = rng.choice(slots)
    head = re.match(r"(\s*(?:- )?(?:[^#\s][^:]*:\s)?)", lines[i]).group(1)  # type: ignore[union-attr]
    lines[i] = f"{head}{new()}\n"
    return "".join(lines).encode()


def deep_nesting(rng: random.Random, data: bytes) -> bytes:
    depth = rng.choice([8, 63, 64, 65, 100, 999, 5000])
    if rng.random() < 0.5:
        return _replace_value(rng, data, lambda: "[" * depth + "1" + "]" * depth)
    return _replace_value(rng, data, lambda: "{a: " * depth + "1" + "}" * depth)


def aliases(rng: random.Random, data: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:  # an alias bomb, at the top or under any key
        levels = rng.randint(2, 10)
        bomb = ['b0: &b0 ["x","x","x","x","x","x","x","x","x"]']
        bomb += [f"b{i}: &b{i} [{','.join([f'*b{i - 1}'] * 9)}]" for i in range(1, levels)]
        return data + ("\n" + "\n".join(bomb) + "\n").encode()
    if kind == 1:  # an alias inside itself
        return _replace_value(rng, data, lambda: "&loop [*loop]")
    if kind == 2:  # an alias to nothing
        return _replace_value(rng, data, lambda: "*nowhere")
    anchored = [0]  # an anchor, then aliases to it elsewhere

    def anchor() -> str:
        anchored[0] += 1
        return "&one {k: v, l: [1, 2]}" if anchored[0] == 1 else "*one"

    for _ in range(rng.randint(2, 5)):
        data = _replace_value(rng, data, anchor)
    return data


def huge_numbers(rng: random.Random, data: bytes) -> bytes:
    digits = rng.choice([20, 64, 65, 4300, 4301, 5000, 100_000])
    choices = [
        "9" * digits,
        "-" + "1" * digits,
        "0x" + "f" * digits,
        "1e99999",
        "-.inf",
        ".nan",
        "0o" + "7" * digits,
        ":".join(["59"] * min(digits, 3000)),
        "1_000_000",
        "0b" + "1" * digits,
    ]
    return _replace_value(rng, data, lambda: rng.choice(choices))


WRONG = [
    "[]",
    "{}",
    "null",
    "~",
    "true",
    "no",
    "on",
    "''",
    "[a, b]",
    "{a: 1}",
    "2001-12-14",
    "2001-13-45",
    "2001-12-14t21:59:43.10-99:00",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!!str",
    "!custom x",
    "!!python/object/apply:os.system [id]",
    "|\n  block\n  text",
    ">-\n  folded",
    "- a\n- b",
    "? complex",
    "'",
    '"\\x00"',
    '"\\ud800"',
    "<<: *nowhere",
    "<<: [1, 2]",
    "=",
    "%TAG",
    "@reserved",
    "`tick",
    "\t",
    "a: b: c",
]


def wrong_types(rng: random.Random, data: bytes) -> bytes:
    return _replace_value(rng, data, lambda: rng.choice(WRONG))


def odd_keys(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data.decode("utf-8", "replace"))
    i = rng.randrange(len(lines))
    indent = re.match(r"\s*", lines[i]).group(0)  # type: ignore[union-attr]
    key = rng.choice(
        [
            "1",
            "null",
            "true",
            "[a, b]",
            "{a: 1}",
            "? [x]\n" + indent,
            "<<",
            "2001-01-01",
            "''",
            "1.5",
            "!!binary aGk=",
            "a.b",
            "a[0]",
            '"\\u0000"',
            "x" * 5000,
            "é",
        ]
    )
    lines.insert(i, f"{indent}{key}: value\n")
    return "".join(lines).encode()


def odd_bytes(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    junk = rng.choice(
        [
            b"\x00",
            b"\xff\xfe",
            b"\xef\xbb\xbf",
            b"\r",
            b"\x1b[2J",
            b"\xc3",
            b"\xe2\x80\xa8",
            b"\t",
            b"\x85",
            b"&",
            b"*",
            b"!",
            b"%",
            b"|",
            b">",
            b"---\n",
            b"...\n",
            b"\n---\nsecond: doc\n",
        ]
    )
    return data[:at] + junk + data[at:]


def splice(rng: random.Random, data: bytes, other: bytes) -> bytes:
    a, b = _lines(data.decode("utf-8", "replace")), _lines(other.decode("utf-8", "replace"))
    i, j = rng.randrange(len(a)), rng.randrange(len(b))
    return "".join(a[:i] + b[j : j + rng.randint(1, 10)] + a[i:]).encode()


ODD_VALUES: list[object] = [
    None,
    True,
    False,
    0,
    -1,
    65536,
    2**63,
    1.5,
    float("inf"),
    "",
    " ",
    "x" * 300,
    [],
    {},
    ["a"],
    {"a": 1},
    [[[]]],
    "*",
    "${HOME}",
    "{podIp}",
    "{nope}",
    "10.0.0.1",
    "-1s",
    "http://",
    "https://user@host:0/",
    "*.example.com",
    "é",
    "\u2028",
    "a\nb",
]


def structural(rng: random.Random, data: bytes) -> bytes:
    """Valid YAML with the wrong things in it: a random value swapped for an odd one, a key dropped or
    renamed, a list emptied. It reaches past the reader into the schema, the values rules and the Topology."""
    try:
        tree = yaml.safe_load(data)  # the test's own reading of an earlier mutation may fail in any way
    except Exception:  # noqa: BLE001
        return data
    if not isinstance(tree, (dict, list)):
        return data
    for _ in range(rng.randint(1, 4)):
        parent, key = _random_slot(rng, tree)
        if parent is None:
            break
        action = rng.randrange(4)
        if action == 0 or isinstance(parent, list):
            parent[key] = rng.choice(ODD_VALUES)
        elif action == 1:
            del parent[key]
        elif action == 2:
            parent[key + rng.choice(["x", "_", "s", ""]) if isinstance(key, str) else key] = parent.pop(key)
        else:
            parent[key] = [parent[key]] * rng.randint(0, 3)
    try:
        return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True).encode()
    except Exception:  # noqa: BLE001 -- a value the dumper cannot write back: keep the file as it was
        return data


def _random_slot(rng: random.Random, tree: object) -> tuple[object, object]:
    """A random (container, key) in the tree, found by a short random walk from the top."""
    parent, key = None, None
    node = tree
    for _ in range(rng.randint(1, 6)):
        if isinstance(node, dict) and node:
            parent, key = node, rng.choice(list(node))
        elif isinstance(node, list) and node:
            parent, key = node, rng.randrange(len(node))
        else:
            break
        node = parent[key]  # type: ignore[index]
    return parent, key


MUTATIONS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "flip": flip_bytes,
    "truncate": truncate,
    "duplicate": duplicate,
    "nest": deep_nesting,
    "alias": aliases,
    "number": huge_numbers,
    "type": wrong_types,
    "key": odd_keys,
    "bytes": odd_bytes,
    "structure": structural,
    "structure ": structural,  # twice the weight: it reaches deepest
}


def mutate(rng: random.Random, seed_file: bytes, corpus: list[bytes]) -> tuple[bytes, list[str]]:
    data, applied = seed_file, []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        if rng.random() < 0.08:
            data, name = splice(rng, data, rng.choice(corpus)), "splice"
        else:
            name = rng.choice(list(MUTATIONS))
            data = MUTATIONS[name](rng, data)
        applied.append(name)
    return data, applied


# -- running one case ---------------------------------------------------------------------------------------
class CaseTimeout(BaseException):
    """Raised by the alarm: the case hung (a BaseException, so no `except Exception` in the code swallows it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def alarm(signum: int, frame: object) -> None:
        raise CaseTimeout()

    # pytest-timeout may be using the same timer for the whole test: borrow it, and give back what is left.
    previous = signal.signal(signal.SIGALRM, alarm)
    outer, interval = signal.getitimer(signal.ITIMER_REAL)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer) if outer else seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001), interval)


def load_as_values(path: Path, scenario: str) -> None:
    """What `ncpsim up -f FILE scenario=...`, `ncpsim up -f FILE` and `ncpsim replay -f FILE` reach for."""
    customer = customer_layers([path])
    loaded = load_scenario(scenario, allow_expected_error=True, customer=customer)
    values_warnings([loaded])
    if loaded.config_error is None:
        loaded.build_topology("fuzz")
    idle = idle_scenario([path])
    values_warnings([idle])
    idle.build_topology("fuzz")


def load_as_scenario(path: Path, scenario: str) -> None:
    """What `ncpsim up PATH` and `ncpsim replay PATH` reach for."""
    loaded = load_scenario(str(path), allow_expected_error=True)
    values_warnings([loaded])
    if loaded.config_error is None:
        loaded.build_topology("fuzz")


KINDS = [
    ("alias", "alias"),
    ("deep", "nested too deep"),
    ("integer", "huge integer"),
    ("UTF-8", "not UTF-8"),
    ("is not allowed in YAML", "forbidden character"),
    ("too large", "too large"),
    ("read as", "key not text"),
    ("a key must be", "key not text"),
    ("not supported", "unsupported tag"),
    ("cannot read", "unreadable value"),
    ("top level must be", "not a mapping"),
    ("fix the YAML syntax", "YAML syntax"),
    ("check the indentation", "YAML syntax"),
    ("close the quote", "YAML syntax"),
    ("spaces, not tabs", "YAML syntax"),
]


def kind_of(exc: NcpsimError) -> str:
    text = str(exc)
    for word, kind in KINDS:
        if word in text:
            return kind
    return f"{type(exc).__name__} (schema or values rule)"


@dataclass
class Tally:
    cases: int = 0
    accepted: int = 0
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    slowest: float = 0.0
    slowest_case: str = ""
    failures: list[str] = field(default_factory=list)
    examples: dict[str, Path] = field(default_factory=dict)  # a refused file of each kind, for the CLI check


def fuzz(
    tmp_path: Path,
    cases: int,
    seed_files: list[tuple[str, bytes]],
    load: Callable[[Path, str], None],
    seed: int,
) -> Tally:
    rng, tally = random.Random(seed), Tally()
    corpus = [data for _, data in seed_files]
    for n in range(cases):
        scenario, original = rng.choice(seed_files)
        data, applied = mutate(rng, original, corpus)
        path = tmp_path / f"case-{n % 50}.yaml"  # reused: a case's file lives until it is judged
        path.write_bytes(data)
        start = time.monotonic()
        try:
            with time_limit(CASE_LIMIT):
                load(path, scenario)
            tally.accepted += 1
        except NcpsimError as exc:
            kind = kind_of(exc)
            tally.refused[kind] += 1
            if "\n" in str(exc) or not str(exc).strip():
                tally.failures.append(
                    f"case {n} ({'+'.join(applied)}): refusal not one line: {str(exc)!r:.300}"
                )
            if kind not in tally.examples:
                keep = tmp_path / f"example-{len(tally.examples)}.yaml"
                keep.write_bytes(data)
                tally.examples[kind] = keep
        except CaseTimeout:
            tally.failures.append(f"case {n} ({'+'.join(applied)}): no answer in {CASE_LIMIT} s")
        except Exception as exc:  # noqa: BLE001 -- exactly what the fuzz looks for
            tally.failures.append(f"case {n} ({'+'.join(applied)}): {type(exc).__name__}: {str(exc)[:200]}")
            (tmp_path / f"failure-{len(tally.failures)}.yaml").write_bytes(data)
        if time.monotonic() - start > tally.slowest:
            tally.slowest, tally.slowest_case = time.monotonic() - start, "+".join(applied)
        tally.cases += 1
    return tally


def report(what: str, tally: Tally, seconds: float) -> str:
    kinds = ", ".join(f"{kind} {count}" for kind, count in tally.refused.most_common())
    return (
        f"{what}: {tally.cases} cases in {seconds:.1f} s (slowest {tally.slowest * 1000:.0f} ms, {tally.slowest_case}), "
        f"accepted {tally.accepted}, refused {sum(tally.refused.values())}: {kinds}"
    )


# -- the seed files -------------------------------------------------------------------------------------------
def scenario_seeds() -> list[tuple[str, bytes]]:
    return [(path.stem, path.read_bytes()) for path in sorted(CATALOGUE.glob("*.yaml"))]


def values_seeds() -> list[tuple[str, bytes]]:
    """The customer's file, and each catalogue scenario's own values block as a file, each with its scenario
    (so `load_scenario` lays the file over the scenario it came from, as a support engineer would)."""
    seeds = [("http-callback", CUSTOMER.encode())]
    for name, raw in scenario_seeds():
        values = (yaml.safe_load(raw) or {}).get("values")
        if values:
            seeds.append((name, yaml.safe_dump(values, sort_keys=False).encode()))
    return seeds


def run_fuzz(tmp_path: Path, cases: int, seed: int) -> tuple[Tally, Tally]:
    results = []
    for what, seeds, load in (
        ("values files", values_seeds(), load_as_values),
        ("scenario files", scenario_seeds(), load_as_scenario),
    ):
        folder = tmp_path / what.replace(" ", "-")
        folder.mkdir()
        start = time.monotonic()
        tally = fuzz(folder, cases, seeds, load, seed)
        print(report(what, tally, time.monotonic() - start))
        results.append(tally)
    return results[0], results[1]


def check(tally: Tally) -> None:
    assert not tally.failures, f"{len(tally.failures)} failures:\n" + "\n".join(tally.failures[:20])
    assert tally.refused and tally.accepted, "the mutations should both pass and fail some files"


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Loading touches no state folder; should it ever, it is this test's own."""
    monkeypatch.setenv("NCPSIM_HOME", str(tmp_path / "state"))
    return tmp_path


def test_fuzz_quick(isolated_home: Path) -> None:
    values, scenarios = run_fuzz(isolated_home, QUICK_CASES, SEED)
    check(values)
    check(scenarios)
    # The command line itself: a refused file of a few kinds is one line on stderr and exit code 2.
    guard = isolated_home / "guard-not-a-folder"  # should a file be accepted after all, nothing starts
    guard.write_text("not a folder\n")
    examples = list(values.examples.values())[:3]
    for path in examples:
        run = ncpsim("up", "-f", str(path), home=guard)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.long
@pytest.mark.timeout(1800)  # 20,000 cases take minutes; the suite's 120 s limit is for normal tests
def test_fuzz_long(isolated_home: Path) -> None:
    values, scenarios = run_fuzz(isolated_home, LONG_CASES, SEED + 1)
    check(values)
    check(scenarios)
