"""Hostile input to `step`, `set`, `up` and `replay` (issue 31, item 4): each case is one line and exit 2, or
the documented behaviour, never a traceback or a hang.

Every case runs the command in-process, through the same Program as the `ncpsim` console script (as
tests/test_program.py does), so a table of cases costs no interpreter starts; the words are given as a user
types them (`set KEY=VALUE`, `replay FILE`). `step` and `set` act on one running stack for the module; `up` and `replay` cases are refused before any stack exists: NCPSIM_HOME names a
file, so a case that got past its check would stop at the state folder with a message the row does not expect.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_program import one_line_usage_error, run

from sim.model.layering import defaults_layer, layer, parse_set
from sim.model.values_file import file_layer

LONG_LABEL = "a" * 64 + ".example.com"  # one label past DNS's 63
LONG_NAME = ".".join(["a" * 60] * 5)  # 304 characters, past DNS's 253
HUGE = "a" * 10_000


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # {dir}: the test's folder; {stack}: the running stack's name
    says: str  # what the one line must contain
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written to {dir} first


def step(name: str, fault: str, says: str) -> Case:
    return Case(
        name, ("step", f"{{dir}}/{name}.yaml"), says, ((f"{name}.yaml", f"name: s\nfault: {fault}\n"),)
    )


# -- on a running stack ---------------------------------------------------------------------------------
ON_STACK = [
    # Mistyped faults (the round-three list): the schema and scenarios.fault_args refuse each at its line.
    step("scale-as-integer", "{scale: 3}", "fault.scale: 3 is not of type 'object'"),
    step("link-empty", "{link: {}}", "fault.link.from: is required"),
    step("link-empty-string", '{link: ""}', "fault.link: '' is not of type 'object'"),
    step("latency-text", "{link: {from: ncpsim-compute-1, to: 10.100.0.10, latencyMs: abc}}", "latencyMs"),
    step("latency-negative", "{link: {from: ncpsim-compute-1, to: 10.100.0.10, latencyMs: -5}}", "minimum"),
    step("expire-as-list", "{expire: [frontend]}", "fault.expire: ['frontend'] is not one of"),
    step("pod-cert-issuer", "{pod-cert: {pod: invocation, issuer: evil}}", "fault.pod-cert.issuer: 'evil'"),
    # A pod certificate's names as trustme issues them: an IDNAError halfway through the step, before.
    step(
        "pod-cert-long-label", f'{{pod-cert: {{pod: invocation, names: ["{LONG_LABEL}"]}}}}', "Label too long"
    ),
    step(
        "pod-cert-long-name", f'{{pod-cert: {{pod: invocation, names: ["{LONG_NAME}"]}}}}', "Domain too long"
    ),
    step("pod-cert-space", '{pod-cert: {pod: invocation, names: ["a b"]}}', "pod-cert.names: 'a b'"),
    step("pod-cert-inner-star", '{pod-cert: {pod: invocation, names: ["*.*.x"]}}', "U+002A"),
    # A Secret name is a folder of the stack's: `..` climbed out of certs/secrets (then raised on redeploy).
    Case(
        "set-existing-secret-climbs",
        ("set", "workerCallbackProxy.tls.frontend.existingSecret=../../x"),
        'existingSecret: the string "../../x" is not a Secret name',
    ),
    Case(
        "set-existing-secret-too-long",
        ("set", f"workerCallbackProxy.tls.frontend.existingSecret={'a' * 300}"),
        "must be no more than 253 characters",
    ),
    Case(
        "set-domain-label-too-long",
        ("set", f"workerCallbackProxy.workerDomain={LONG_LABEL}"),
        "must be 1-63 of a-z",  # not "must be lower case", which it said of 64 lower-case letters
    ),
    Case(  # accepted, then every worker failed on it: `ncpsim worker error: ValueError` (idna, as SNI)
        "set-proxy-url-label-too-long",
        (
            "set",
            f"global.workerEndpoints.invocationProxyURL=https://{'a' * 70}.grpc-worker.example.com:10084",
        ),
        "invocationProxyURL: host",
    ),
    Case(
        "set-domain-huge",
        ("set", f"workerCallbackProxy.workerDomain={HUGE}"),
        "needs at least two labels",
    ),
]

# -- before any stack ----------------------------------------------------------------------------------
SCENARIO = """name: hostile
summary: a scenario from a ticket
values:
  workerCallbackProxy: {{enabled: true, workerDomain: grpc-worker.example.com}}
topology:
  invocationReplicas: 1
  grpcProxyReplicas: 0
{extra}  computeClusters:
    - {cluster}workers:
        - {{count: 1, trust: stack}}
steps:
  - name: call
    invoke: {{function: http-echo}}
"""


def scenario(name: str, says: str, extra: str = "", cluster: str = "") -> Case:
    text = SCENARIO.format(extra=extra, cluster=cluster)
    return Case(name, ("replay", f"{{dir}}/{name}.yaml"), says, ((f"{name}.yaml", text),))


NO_STACK = [
    Case(
        "replay-junit-proc",
        ("replay", "http-callback", "--junit", "/proc/x.xml"),
        "--junit /proc/x.xml",
    ),
    Case(
        "replay-junit-proc-self",
        ("replay", "http-callback", "--junit", "/proc/self/x.xml"),
        "cannot be",
    ),
    scenario(
        "secret-name-label",
        "topology.secrets.x.names[0]",
        extra=f'  secrets: {{x: {{issuer: public, names: ["{LONG_LABEL}"]}}}}\n',
    ),
    scenario(
        "secret-name-space", "Codepoint U+0020", extra='  secrets: {x: {issuer: public, names: ["a b"]}}\n'
    ),
    scenario("secret-folder-too-long", "topology.secrets", extra=f"  secrets: {{{'a' * 300}: {{}}}}\n"),
    scenario("secret-folder-dots", "topology.secrets", extra='  secrets: {"a..b": {}}\n'),
    scenario(
        "rewrite-domain-too-long",
        "dnsRewrite: workerDomain",
        cluster=f"dnsRewrite: {{domain: {LONG_LABEL}, target: proxy}}\n      ",
    ),
    scenario(
        "rewrite-target-too-long",
        "is longer than DNS allows",
        cluster=f"dnsRewrite: {{domain: grpc-worker.example.com, target: {LONG_NAME}}}\n      ",
    ),
    Case("up-domain-huge", ("up", "--set", f"workerCallbackProxy.workerDomain={HUGE}"), "two labels"),
    Case(
        "up-domain-proxy-off",  # the stack issues *.<workerDomain> with the proxy off too: IDNAError there
        ("up", "-f", "{dir}/off.yaml", "--set", f"workerCallbackProxy.workerDomain={LONG_LABEL}"),
        "must be 1-63 of a-z",
        (("off.yaml", "workerCallbackProxy: {enabled: false}\n"),),
    ),
    Case(
        "up-domain-too-long",
        (
            "up",
            "--set",
            "workerCallbackProxy.enabled=true",
            "--set",
            f"workerCallbackProxy.workerDomain={LONG_NAME}",
        ),
        "longer than 253 characters",
    ),
    Case("up-secret-dots", ("up", "--secret", "..={dir}"), "--secret '..="),
    Case(
        "up-existing-secret-climbs",
        (
            "up",
            "--set",
            "workerCallbackProxy.enabled=true",
            "--set",
            "workerCallbackProxy.tls.frontend.existingSecret=../x",
        ),
        "is not a Secret name",
    ),
    # `--set a.b=x` over a file's `a: 5`: --set wins (Helm's precedence) and the chart's other keys stay; it
    # raised KeyError: 'workerDomain'. Accepted, the command goes on to the state folder, which is a file here.
    Case(
        "up-set-over-a-files-scalar",
        ("up", "-f", "{dir}/scalar.yaml", "--set", "workerCallbackProxy.enabled=true"),
        "not a folder",
        (("scalar.yaml", "workerCallbackProxy: 5\n"),),
    ),
]


def refused(case: Case, folder: Path, stack: str = "") -> str:
    for name, text in case.files:
        (folder / name).write_text(text)
    argv = [a.replace("{dir}", str(folder)) for a in case.argv]
    if stack:
        argv += ["--stack", stack]
    code, _, err = run(*argv)
    # `assumed:` and `warning:` lines are the report's notes on stderr, said before a stack starts.
    err = "".join(x for x in err.splitlines(keepends=True) if not x.startswith(("assumed: ", "warning: ")))
    line = one_line_usage_error(code, err)
    assert case.says in line, line
    assert len(line) < 1000, f"one line, but {len(line)} characters of it"
    return line


@pytest.fixture(scope="module")
def running(ncpsim_stack_module) -> Iterator[tuple[Path, str]]:  # type: ignore[no-untyped-def]
    stack = ncpsim_stack_module(
        # one NATS server: no command here is about the NATS cluster (three wait for JetStream's first leader)
        values={"nats": {"config": {"cluster": {"enabled": False}}}},
        topology={"invocationReplicas": 1, "computeClusters": [{"workers": [{"count": 1}]}]},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NCPSIM_HOME", str(stack.state_dir.parent))
        yield stack.state_dir, stack.name


@pytest.mark.parametrize("case", ON_STACK, ids=[c.name for c in ON_STACK])
def test_on_a_running_stack(case: Case, running: tuple[Path, str], tmp_path: Path) -> None:
    state, name = running
    before = (state / "topology.json").read_text()
    refused(case, tmp_path, name)
    assert (state / "topology.json").read_text() == before, "a refused command changed the stack"


@pytest.mark.parametrize("case", NO_STACK, ids=[c.name for c in NO_STACK])
def test_before_any_stack(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    guard = tmp_path / "guard-not-a-folder"
    guard.write_text("a case that passed its check stops here\n")
    monkeypatch.setenv("NCPSIM_HOME", str(guard))
    refused(case, tmp_path)


def test_set_over_a_files_scalar_keeps_the_charts_other_keys(tmp_path: Path) -> None:
    """The values the up case above accepted: Helm coalesces the chart's defaults under the user's values after
    merging them, so the mapping --set made still has workerDomain and the rest."""
    (tmp_path / "scalar.yaml").write_text("workerCallbackProxy: 5\n")
    merged = layer(
        [
            defaults_layer(),
            file_layer(tmp_path / "scalar.yaml"),
            parse_set("workerCallbackProxy.enabled=true"),
        ]
    )
    merged.check()
    proxy = merged.values["workerCallbackProxy"]
    assert proxy["enabled"] is True and proxy["workerDomain"] == "grpc-worker.example.com"
    assert str(merged.origins["workerCallbackProxy.enabled"]).startswith("--set")
    assert str(merged.origins["workerCallbackProxy.workerDomain"]) == "default"
    # Negative control: the file alone is still refused, in one line, at its key.
    with pytest.raises(Exception, match="workerCallbackProxy: must be a mapping"):
        layer([defaults_layer(), file_layer(tmp_path / "scalar.yaml")]).check()
