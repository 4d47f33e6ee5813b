"""The parts of the fleet benchmark (``fleet.py``): the API server process and the agents.

Why it exists apart from ``fleet.py`` (the phases and the tables): running N real node agents
against one API server needs a server that can be taken down and brought back on the same port
with its store intact (an API server restart: etcd keeps the objects), that counts what it is
asked, and that says per node whether its slices are complete and when its agent last opened a
watch; and agents as processes in one process group, each with its own node name and
directories, whose memory, CPU and ``/metrics`` can be read. The benchmark must not load the
server with its own questions: in fake mode it asks the server process over a pipe, not HTTP.

* ``python benchmarks/fleetkit.py --serve-api DIR NODE...``: the fake API server (TLS with a
  client certificate, like kubeadm's) for these nodes; writes ``DIR/kubeconfig`` and answers
  one JSON line per command read from stdin: ``stats``, ``down``, ``up``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DRIVER = "gpu.nvidia.com"
WRITES = ("create", "update", "delete", "patch")


# ---------------------------------------------------------------- the API server process


def serve_api(directory: Path, nodes: list[str]) -> int:
    """Subprocess mode: the fake API server, driven by commands on stdin."""
    from dra_driver.testing.fakeapi import certs, fakeserver, memory, requestlog

    mem = memory.InMemoryApi(use_default_cel=False)
    for node in nodes:
        mem.put_node(node)
    watches_open: collections.Counter[str] = collections.Counter()
    last_watch: dict[str, float] = {}
    lock = threading.Lock()
    real_watch = mem.watch_resource_slices

    def watch(**kw: Any) -> Iterator[Any]:
        events = real_watch(**kw)  # a resourceVersion too old raises here, before the 200
        return counted(str(kw.get("node_name") or ""), events)

    def counted(node: str, events: Iterator[Any]) -> Iterator[Any]:
        with lock:
            watches_open[node] += 1
            last_watch[node] = time.time()
        try:
            yield from events
        finally:
            with lock:
                watches_open[node] -= 1

    mem.watch_resource_slices = watch  # type: ignore[method-assign,assignment]
    bundle = certs.make_bundle(client_name="system:node:fleet")
    log = requestlog.RequestLog()
    server = fakeserver.FakeApiServer(mem, tls=bundle, requests=log).start()
    port = int(server.url.rsplit(":", 1)[1])
    kubeconfig = directory / "kubeconfig"
    server.write_kubeconfig(kubeconfig.with_suffix(".tmp")).replace(kubeconfig)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for line in sys.stdin:
        command = line.strip()
        if command == "down":
            server.stop()
            answer: dict[str, Any] = {"down": time.time()}
        elif command == "up":
            server = fakeserver.FakeApiServer(mem, tls=bundle, port=port, requests=log).start()
            answer = {"up": time.time()}
        elif command == "stats":
            with lock:
                watching = {n: (watches_open[n], last_watch.get(n, 0.0)) for n in nodes}
            answer = {"requests": log.snapshot(), "nodes": node_states(mem, watching)}
        else:
            answer = {"error": f"unknown command {command!r}"}
        print(json.dumps(answer), flush=True)
    server.stop()
    return 0


def node_states(mem: Any, watching: dict[str, tuple[int, float]]) -> dict[str, Any]:
    """Per node: its slices complete (one generation, as many as the pool says), their UIDs,
    and its open watches / last watch opened (wall clock)."""
    slices: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for obj in mem.all_resource_slices():
        if obj["spec"].get("driver") == DRIVER:
            slices[str(obj["spec"].get("nodeName"))].append(obj)
    states = {}
    for node, (open_, last) in watching.items():
        own = slices.get(node, [])
        states[node] = {
            "complete": complete(own),
            "uids": sorted(o["metadata"]["uid"] for o in own),
            "watches": open_,
            "lastWatch": last,
        }
    return states


def complete(own: list[dict[str, Any]]) -> bool:
    pools = {
        (o["spec"]["pool"]["generation"], o["spec"]["pool"]["resourceSliceCount"]) for o in own
    }
    return len(pools) == 1 and next(iter(pools))[1] == len(own)


class FakeServer:
    """The server process and its pipe."""

    def __init__(self, directory: Path, nodes: list[str], *, group: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-api", str(directory), *nodes],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO,
            process_group=group,
            text=True,
        )
        self.kubeconfig = directory / "kubeconfig"
        deadline = time.monotonic() + 120
        while not self.kubeconfig.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the fake API server did not start")
            time.sleep(0.05)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fake API server process is gone")
        answer: dict[str, Any] = json.loads(line)
        return answer


class ClusterServer:
    """A real cluster (``--kubeconfig``): node states from a list of the driver's slices;
    request counts from the server's ``apiserver_request_total`` (every client of the server,
    the scheduler's too; no bytes), when the credentials may read ``/metrics``."""

    def __init__(self, kubeconfig: Path) -> None:
        from dra_driver.kube import client

        self.kubeconfig = kubeconfig
        self._kube = client.KubeClient.connect(kubeconfig)

    def requests(self) -> list[dict[str, Any]] | None:
        http = getattr(self._kube, "_transport", None)
        if http is None:
            return None
        try:
            response = http.request("GET", "/metrics")
        except Exception:
            return None
        if response.status != 200:
            return None
        return parse_request_totals(response.body.decode(errors="replace"))

    def ask(self, command: str) -> dict[str, Any]:
        if command != "stats":
            raise RuntimeError(f"{command}: only the fake API server can do that")
        requests = self.requests()
        items, _ = self._kube.list_resource_slices(driver=DRIVER, node_name="")
        slices: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for obj in items:
            slices[str(obj["spec"].get("nodeName"))].append(obj)
        nodes = {
            node: {
                "complete": complete(own),
                "uids": sorted(o["metadata"]["uid"] for o in own),
                "watches": -1,
                "lastWatch": 0.0,
            }
            for node, own in slices.items()
        }
        return {"requests": requests, "nodes": nodes}


# kube-apiserver's reported verbs, as the fake's log names them.
_VERBS = {"POST": "create", "PUT": "update", "APPLY": "patch", "WATCHLIST": "watch"}
_TOTAL = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_request_totals(text: str) -> list[dict[str, Any]]:
    """``apiserver_request_total`` by (verb, resource, dry run), as the fake's log reports
    it (kube-apiserver's ``POST``/``PUT``/``APPLY`` are ``create``/``update``/``patch``)."""
    totals: collections.Counter[tuple[str, str, bool]] = collections.Counter()
    for line in text.splitlines():
        match = _TOTAL.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        verb = _VERBS.get(labels.get("verb", ""), labels.get("verb", "").lower())
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += f"/{labels['subresource']}"
        totals[(verb, resource or "(non-resource)", bool(labels.get("dry_run")))] += int(
            float(match["value"])
        )
    return [
        {"verb": v, "resource": r, "dryRun": d, "requests": n, "bytesIn": 0, "bytesOut": 0}
        for (v, r, d), n in sorted(totals.items())
    ]


# ---------------------------------------------------------------- the agents


class Agent:
    """One ``dra-driver kubelet-plugin --fake PROFILE`` process for one node."""

    def __init__(
        self,
        base: Path,
        node: str,
        profile: str,
        kubeconfig: Path,
        group: int,
        *,
        tree: Path = REPO,
        python: str = sys.executable,
        optimize: int = 0,
        image: Path | None = None,
    ) -> None:
        """``tree``: the source tree to run (e.g. an export of ``main``, for before/after);
        ``python``: the interpreter (e.g. of a venv with the runtime dependencies only, as the
        container image has: no ``rich``, which structlog loads when it is there);
        ``optimize``: its ``PYTHONOPTIMIZE`` (the chart runs the agents with 2);
        ``image``: a venv of ``imagekit.py`` — the agent then runs as the container image and the
        chart run it (the venv's ``dra-driver``, outside the tree, the image's environment with
        ``optimize``) and ``tree`` and ``python`` are not used."""
        self.base, self.node, self.profile = base, node, profile
        self.kubeconfig, self.group = kubeconfig, group
        self.tree, self.python, self.optimize = tree, python, optimize
        self.image = image
        self.proc: subprocess.Popen[bytes] | None = None
        self.pod_uid = ""
        self.started = 0.0
        self.generation = 0
        self._port: int | None = None

    @property
    def log_path(self) -> Path:
        return self.base / f"agent-{self.generation}.log"

    def start(self, pod_uid: str) -> Agent:
        """Start (again) as pod ``pod_uid``: the same node and directories."""
        self.generation += 1
        self.pod_uid, self._port = pod_uid, None
        if self.image is not None:
            import imagekit

            head = imagekit.agent_command(self.image)
            env = imagekit.process_env(self.image, self.tree, optimize=self.optimize)
            cwd = self.base
        else:
            head = [self.python, "-m", "dra_driver"]
            env = {
                **os.environ,
                "PYTHONPATH": str(self.tree),
                "PYTHONOPTIMIZE": str(self.optimize) if self.optimize else "",
                "MALLOC_ARENA_MAX": "2",  # as the container image sets it
            }
            cwd = self.tree
        argv = [
            *head,
            "--log-format",
            "json",
            "kubelet-plugin",
            "--node-name",
            self.node,
            "--kubelet-registry-dir",
            str(self.base / "registry"),
            "--kubelet-plugins-dir",
            str(self.base / "plugins"),
            "--cdi-root",
            str(self.base / "cdi"),
            "--kubeconfig",
            str(self.kubeconfig),
            "--fake",
            self.profile,
            "--pod-uid",
            pod_uid,
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            "0",
        ]
        self.base.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                process_group=self.group,
                env=env,
            )
        return self

    def successor(self) -> Agent:
        """The instance a rolling update starts beside this one (same node and directories)."""
        new = Agent(
            self.base,
            self.node,
            self.profile,
            self.kubeconfig,
            self.group,
            tree=self.tree,
            python=self.python,
            optimize=self.optimize,
            image=self.image,
        )
        new.generation = self.generation
        return new

    def registered(self) -> bool:
        """Its registration socket is there (the kubelet would register it now)."""
        registry = self.base / "registry"
        if not registry.is_dir():
            return False
        short = hashlib.sha256(f"{DRIVER}/{self.pod_uid}".encode()).hexdigest()[:16]
        return any(self.pod_uid in p.name or short in p.name for p in registry.glob("*reg.sock"))

    def send(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def port(self) -> int | None:
        """The metrics port, from the agent's log (it listens on port 0)."""
        if self._port is None and self.log_path.exists():
            match = re.search(
                r'"port": (\d+)[^\n]*"health server listening"|'
                r'"health server listening"[^\n]*"port": (\d+)',
                self.log_path.read_text(errors="replace"),
            )
            if match:
                self._port = int(match.group(1) or match.group(2))
        return self._port

    def publishes(self) -> int:
        """Successful reconcile passes so far (``/metrics``); -1 when it does not answer."""
        port = self.port()
        if port is None:
            return -1
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return -1
        match = re.search(r'resourceslice_publish_total\{result="success"\} (\S+)', text)
        return int(float(match.group(1))) if match else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        """User + system CPU of the process so far (exited threads included)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# ---------------------------------------------------------------- figures


def requests_between(
    before: list[dict[str, Any]] | None, after: list[dict[str, Any]] | None
) -> dict[tuple[str, str, bool], dict[str, int]] | None:
    """Requests, bytes in and out per (verb, resource, dry run) between two snapshots."""
    if before is None or after is None:
        return None
    base = {(r["verb"], r["resource"], r["dryRun"]): r for r in before}
    out: dict[tuple[str, str, bool], dict[str, int]] = {}
    for row in after:
        key = (row["verb"], row["resource"], row["dryRun"])
        old = base.get(key, {})
        delta = {k: row[k] - int(old.get(k, 0)) for k in ("requests", "bytesIn", "bytesOut")}
        if delta["requests"]:
            out[key] = delta
    return out


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-api"]:
        raise SystemExit(serve_api(Path(sys.argv[2]), sys.argv[3:]))
    print("usage: fleetkit.py --serve-api DIR NODE...  (run by fleet.py)")
    raise SystemExit(0 if sys.argv[1:2] in (["--help"], ["-h"]) else 2)
