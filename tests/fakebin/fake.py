"""Fake `k3d`, `kubectl` and `docker` for the k3d backend's tests.

`install(bin_dir)` writes one small executable per tool into `bin_dir` (absolute interpreter path, so
the fakes work on a PATH that holds nothing else). Each run:
- appends its argv as a JSON line ``[tool, *args]`` to $NCPSIM_FAKE_LOG;
- exits 1 with an error when " ".join([tool, *args]) contains $NCPSIM_FAKE_FAIL;
- keeps what exists (clusters, networks, applied objects, the current context) in $NCPSIM_FAKE_STATE,
  so `k3d cluster list -o json`, `docker network ls` and `kubectl apply` answer like the real tools.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

TOOLS = ("k3d", "kubectl", "docker")
LB_IP = "172.30.0.3"  # the control plane's server node on the shared network


def install(bin_dir: Path, tools: tuple[str, ...] = TOOLS) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    for tool in tools:
        path = bin_dir / tool
        # -IS: isolated, no site-packages, so each fake starts in a few milliseconds (stdlib only below).
        path.write_text(
            f"#!{sys.executable} -IS\nimport sys\nsys.path.insert(0, {str(here)!r})\nimport fake\n"
            f"sys.exit(fake.main({tool!r}, sys.argv[1:]))\n"
        )
        path.chmod(0o755)
    return bin_dir


class Harness:
    """The fakes installed under `root`, their log and state, and the environment to run them with."""

    def __init__(self, root: Path, tools: tuple[str, ...] = TOOLS, inherit_path: bool = True):
        self.bin = install(root / "bin", tools)
        self.log = root / "fake-calls.jsonl"
        self.state_file = root / "fake-state.json"
        path = f"{self.bin}:{os.environ.get('PATH', '')}" if inherit_path else str(self.bin)
        self.env = {
            **os.environ,
            "PATH": path,
            "NCPSIM_FAKE_LOG": str(self.log),
            "NCPSIM_FAKE_STATE": str(self.state_file),
        }
        self.env.pop("NCPSIM_FAKE_FAIL", None)

    def calls(self) -> list[tuple[str, ...]]:
        if not self.log.exists():
            return []
        return [tuple(json.loads(line)) for line in self.log.read_text().splitlines()]

    def state(self) -> dict:
        return json.loads(self.state_file.read_text()) if self.state_file.exists() else {}

    def preset(self, **state: object) -> None:
        self.state_file.write_text(json.dumps(state))

    def fail_on(self, text: str | None) -> None:
        if text is None:
            self.env.pop("NCPSIM_FAKE_FAIL", None)
        else:
            self.env["NCPSIM_FAKE_FAIL"] = text


def _load() -> dict:
    path = Path(os.environ["NCPSIM_FAKE_STATE"])
    state = json.loads(path.read_text()) if path.exists() else {}
    state.setdefault("clusters", [])
    state.setdefault("networks", [])
    state.setdefault("objects", {})
    state.setdefault("context", "kind-elsewhere")
    return state


def _save(state: dict) -> None:
    Path(os.environ["NCPSIM_FAKE_STATE"]).write_text(json.dumps(state, indent=1, sort_keys=True))


def main(tool: str, args: list[str]) -> int:
    with open(os.environ["NCPSIM_FAKE_LOG"], "a") as log:
        log.write(json.dumps([tool, *args]) + "\n")
    fail = os.environ.get("NCPSIM_FAKE_FAIL")
    if fail and fail in " ".join([tool, *args]):
        print(f"Error: injected failure ({fail})", file=sys.stderr)
        return 1
    if os.environ.get("NCPSIM_FAKE_CLUSTER"):  # a customer's clusters, read by the bundle collector
        import cluster

        return {"kubectl": cluster.kubectl, "helm": cluster.helm}[tool](args)
    state = _load()
    code = {"k3d": _k3d, "docker": _docker, "kubectl": _kubectl}[tool](state, args)
    _save(state)
    return code


# -- k3d -----------------------------------------------------------------------------------------
def _k3d(state: dict, args: list[str]) -> int:
    if args == ["version"]:
        print("k3d version v5.7.4\nk3s version v1.30.4-k3s1 (default)")
    elif args[:2] == ["cluster", "list"]:
        print(json.dumps([{"name": n, "serversCount": 1, "serversRunning": 1} for n in state["clusters"]]))
    elif args[:2] == ["cluster", "create"]:
        text = Path(args[args.index("--config") + 1]).read_text()
        name = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("  name:"))
        if name in state["clusters"]:
            print(
                f"FATA[0000] Failed to create cluster '{name}' because a cluster with that name "
                "already exists",
                file=sys.stderr,
            )
            return 1
        state["clusters"].append(name)
        print(f"INFO[0020] Cluster '{name}' created successfully!")
    elif args[:2] == ["cluster", "delete"]:
        if args[2] in state["clusters"]:
            state["clusters"].remove(args[2])
        state["objects"].pop(f"k3d-{args[2]}", None)
        print(f"INFO[0002] Successfully deleted cluster {args[2]}!")
    elif args[:2] == ["image", "import"]:
        cluster = args[args.index("--cluster") + 1]
        if cluster not in state["clusters"]:
            print(f"ERRO[0000] Failed to get cluster {cluster}", file=sys.stderr)
            return 1
        print("INFO[0003] Successfully imported 1 image(s) into 1 cluster(s)")
    else:
        print(f"fake k3d: unsupported {args}", file=sys.stderr)
        return 2
    return 0


# -- docker --------------------------------------------------------------------------------------
def _docker(state: dict, args: list[str]) -> int:
    if args[:1] == ["version"]:
        print("27.1.1")
    elif args[:2] == ["network", "ls"]:
        print("\n".join(["bridge", "host", "none", *state["networks"]]))
    elif args[:2] == ["network", "create"]:
        name = args[-1]
        if name in state["networks"]:
            print(f"Error response from daemon: network with name {name} already exists", file=sys.stderr)
            return 1
        state["networks"].append(name)
        print(hashlib.sha256(name.encode()).hexdigest())
    elif args[:2] == ["network", "rm"]:
        state["networks"].remove(args[2])
        print(args[2])
    else:
        print(f"fake docker: unsupported {args}", file=sys.stderr)
        return 2
    return 0


# -- kubectl -------------------------------------------------------------------------------------
def _kubectl(state: dict, args: list[str]) -> int:
    context = state["context"]
    if args[:1] == ["--context"]:
        context, args = args[1], args[2:]
    namespace = "default"
    if args[:1] == ["-n"]:
        namespace, args = args[1], args[2:]
    objects = state["objects"].setdefault(context, {})
    verb = args[0]
    if verb == "version":
        print(json.dumps({"clientVersion": {"gitVersion": "v1.30.2"}}))
    elif verb == "config":
        if args[1] == "current-context":
            print(state["context"])
        else:
            state["context"] = args[2]
            print(f'Switched to context "{args[2]}".')
    elif verb == "apply":
        return _apply(objects, args)
    elif verb == "rollout":
        name = args[-1] if args[1] == "restart" else args[2].removeprefix("deployment/")
        if args[1] == "restart":
            print(f"deployment.apps/{name} restarted")
        else:
            print(f'deployment "{name}" successfully rolled out')
    elif verb == "get":
        return _get(objects, namespace, args)
    elif verb == "logs":
        path = os.environ.get("NCPSIM_FAKE_LOGS")
        print(Path(path).read_text() if path else "", end="")
    elif verb == "port-forward":
        port = int(args[2].lstrip(":"))
        print(f"Forwarding from 127.0.0.1:{40000 + port} -> {port}", flush=True)
        print(f"Forwarding from [::1]:{40000 + port} -> {port}", flush=True)
        time.sleep(60)  # until the test's runner stops the process group
    else:
        print(f"fake kubectl: unsupported {args}", file=sys.stderr)
        return 2
    return 0


KINDS = {"Deployment": "deployment.apps"}


def _documents(text: str) -> list[dict]:
    """kind, name and replicas of each YAML document, read the way the renderer writes them (no PyYAML:
    the fakes run without site-packages to start fast)."""
    docs = []
    for chunk in re.split(r"^---\s*$", text, flags=re.MULTILINE):
        kind = re.search(r"^kind: (\S+)$", chunk, re.MULTILINE)
        if not kind:
            continue
        meta = chunk[chunk.index("\nmetadata:") if "\nmetadata:" in chunk else chunk.index("metadata:") :]
        name = re.search(r"^  name: (\S+)$", meta, re.MULTILINE)
        spec = chunk[chunk.index("\nspec:") :] if "\nspec:" in chunk else ""
        replicas = re.search(r"^  replicas: (\d+)$", spec, re.MULTILINE)
        docs.append(
            {
                "kind": kind[1],
                "name": name[1] if name else "?",
                "text": chunk,
                "replicas": int(replicas[1]) if replicas else None,
            }
        )
    return docs


def _apply(objects: dict, args: list[str]) -> int:
    source = args[args.index("-f") + 1]
    text = sys.stdin.read() if source == "-" else Path(source).read_text()
    for doc in _documents(text):
        key = f"{KINDS.get(doc['kind'], doc['kind'].lower())}/{doc['name']}"
        digest = hashlib.sha256(doc["text"].strip().encode()).hexdigest()
        before = objects.get(key, {}).get("digest")
        verb = "created" if before is None else "unchanged" if before == digest else "configured"
        objects[key] = {"digest": digest, "replicas": doc["replicas"]}
        print(f"{key} {verb}")
    return 0


def _get(objects: dict, namespace: str, args: list[str]) -> int:
    kind = args[1]
    if kind == "pods":
        print(json.dumps({"items": _pods(objects)}))
        return 0
    name = args[2]
    if f"service/{name}" not in objects:
        print(f'Error from server (NotFound): services "{name}" not found', file=sys.stderr)
        return 1
    if args[-1] == "name":
        print(f"service/{name}")
    else:
        print(
            json.dumps(
                {
                    "metadata": {"name": name, "namespace": namespace},
                    "status": {"loadBalancer": {"ingress": [{"ip": LB_IP, "ipMode": "VIP"}]}},
                }
            )
        )
    return 0


def _pods(objects: dict) -> list[dict]:
    items = []
    for app, base in (("invocation-service", 11), ("grpc-proxy-deployment", 41)):
        replicas = objects.get(f"deployment.apps/{app}", {}).get("replicas") or 0
        for i in range(replicas):
            items.append(
                {
                    "metadata": {"name": f"{app}-7d9f8-{i}", "labels": {"app": app}},
                    "status": {
                        "phase": "Running",
                        "podIP": f"10.42.0.{base + 100 + i}",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }
            )
    return items
