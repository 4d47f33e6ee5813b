"""What the prepare benchmarks share: a fake GPU node, claims, an API server and the plugin process.

Why it exists: ``prepare.py``, ``soak.py`` and ``ingredients.py`` must measure the same path the
kubelet drives — gRPC over the unix socket into the real plugin process, which GETs each claim
from an API server through the real client adapter — so they build it the same way here:

* the API server is the in-memory API behind a real HTTP server in its own process, by default
  over TLS with a client certificate (a throw-away CA, RSA 2048 like kubeadm's), optionally
  answering every claim GET ``delay_ms`` late and closing connections idle for
  ``idle_timeout_s`` (kube-apiserver: 90 s); it counts accepted connections and resumed TLS
  sessions (``/fakeapi/stats``);
* the plugin is ``python -m dra_driver kubelet-plugin`` on a fake node (real CDI and checkpoint
  files with fsync; CDI specs on a tmpfs as on a node, and the claim metadata files next to
  them, ``--metadata-dir``, where the tree's chart puts them on a tmpfs), optionally from
  another source tree (``tree``: e.g. an export of ``main`` for a before/after comparison;
  settings that older trees do not know go through environment variables, which they ignore).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPUS = 32
DRIVER = "gpu.nvidia.com"
NODE = "bench-node"


def profile_yaml(gpus: int = GPUS) -> str:
    rows = "\n".join(
        f'  - {{pciBusId: "0000:{0x10 + i // 8:02x}:{i % 8:02x}.0", '
        f"pcieRoot: pci0000:{i // 8:02x}, numaNode: {i * 2 // gpus}}}"
        for i in range(gpus)
    )
    return (
        f"name: bench-{gpus}\ndescription: {gpus} PCIe GPUs for the prepare benchmarks\n"
        'driverVersion: "580.95.05"\ncudaDriverVersion: "13.0"\n'
        "defaults:\n  productName: NVIDIA L4\n  brand: Nvidia\n  architecture: Ada Lovelace\n"
        '  cudaComputeCapability: "8.9"\n  memory: 23034Mi\n'
        f"gpus:\n{rows}\n"
    )


def claim(name: str, device: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": str(uuid.uuid4())},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
                    ],
                    "config": [
                        {
                            "source": "FromClass",
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {
                                    "apiVersion": "gpu.nvidia.com/v1",
                                    "kind": "GpuConfig",
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


REAL_WIRE = REPO.parent / "shared" / "reference" / "real-wire"


def real_claim_template() -> dict[str, Any] | None:
    """The claim GET a real kube-apiserver v1.36.2 answered (``../shared/reference/real-wire/``:
    managedFields, finalizers, reservedFor, nodeSelector), or None where that folder is missing."""
    path = REAL_WIRE / "resourceclaim-allocated-get.json"
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text()))


def real_claim(template: dict[str, Any], name: str, device: str) -> dict[str, Any]:
    """A claim shaped and sized as the real server's body: ``template``'s metadata (its three
    managedFields entries, its finalizer), spec (a ``firstAvailable`` request) and status (its
    nodeSelector, allocationTimestamp and a reservedFor entry), renamed, on this node, with
    ``device`` as its one result (one GPU per claim, as the other benchmark claims)."""
    obj = json.loads(json.dumps(template))
    meta = obj["metadata"]
    meta.update(name=name, namespace="bench", uid=str(uuid.uuid4()))
    meta.pop("resourceVersion", None)  # the in-memory server sets its own
    status = obj["status"]
    result = dict(status["allocation"]["devices"]["results"][0], pool=NODE, device=device)
    status["allocation"]["devices"]["results"] = [result]
    for term in status["allocation"].get("nodeSelector", {}).get("nodeSelectorTerms", []):
        for field in term.get("matchFields", []):
            field["values"] = [NODE]
    for reserved in status.get("reservedFor", []):
        reserved.update(name=name, uid=str(uuid.uuid4()))
    return dict(obj)


def bound_pod(claim: dict[str, Any]) -> dict[str, Any]:
    """The pod its ``reservedFor`` names, bound to this node (the agent's allocation watch
    reads the claim when it sees it, as on a real node)."""
    meta = claim["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": claim["status"]["reservedFor"][0]["name"],
            "namespace": meta["namespace"],
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "c", "image": "busybox"}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": meta["name"]}],
        },
    }


def make_node(base: Path, gpus: int = GPUS) -> Path:
    """The fake node's profile and driver root under ``base``; returns the profile."""
    profile = base / "profile.yaml"
    profile.write_text(profile_yaml(gpus))
    lib = base / "driver-root/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "libcuda.so.580.95.05").write_text("x")
    if not (lib / "libcuda.so.1").is_symlink():
        (lib / "libcuda.so.1").symlink_to("libcuda.so.580.95.05")
    return profile


# ---------------------------------------------------------------- the API server process


def serve_api(argv: list[str]) -> int:
    """Subprocess mode: ``CLAIMS KUBECONFIG DELAY_MS IDLE_S TLS_DIR|-``."""
    from dra_driver.kube import api
    from dra_driver.testing.fakeapi import certs, fakeserver, memory

    claims_file, kubeconfig, delay, idle, tls_dir = argv
    delay_ms, idle_s = float(delay), float(idle)
    bundle = None
    if tls_dir != "-":
        d = Path(tls_dir)
        bundle = certs.Bundle(*(d.joinpath(n).read_bytes() for n in certs_names()))
    server = fakeserver.FakeApiServer(
        memory.InMemoryApi(use_default_cel=False),
        tls=bundle,
        idle_timeout_s=idle_s if idle_s > 0 else None,
    )
    objs = json.loads(Path(claims_file).read_text())
    from dra_driver.kube.objects import PODS

    if any(o.get("kind") == "Pod" for o in objs):  # a node with pods: its Node object too
        server.api.put_node(NODE, uid=str(uuid.uuid4()))
    pods = {  # bound pods first: a claim's reservedFor names them by the UID the server gives
        made["metadata"]["name"]: made["metadata"]["uid"]
        for made in (server.api.objects.create(PODS, o) for o in objs if o.get("kind") == "Pod")
    }
    for obj in (o for o in objs if o.get("kind") != "Pod"):
        for entry in (obj.get("status") or {}).get("reservedFor") or ():
            entry["uid"] = pods.get(entry["name"], entry["uid"])
        server.api.put_resource_claim(obj)
    if delay_ms > 0:
        real_get = server.api.get_resource_claim

        def slow_get(namespace: str, name: str) -> api.Obj:
            time.sleep(delay_ms / 1000)
            return real_get(namespace, name)

        server.api.get_resource_claim = slow_get  # type: ignore[method-assign]
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    server.start()
    tmp = Path(kubeconfig).with_suffix(".tmp")
    server.write_kubeconfig(tmp)
    tmp.replace(kubeconfig)
    done.wait()
    server.stop()
    return 0


def certs_names() -> tuple[str, ...]:
    return ("ca.pem", "server.crt", "server.key", "client.crt", "client.key")


class Api:
    """The API server subprocess; ``stats()`` reads its connection counters over TLS/HTTP."""

    def __init__(
        self,
        base: Path,
        claims_file: Path,
        *,
        tls: bool = True,
        delay_ms: float = 0.0,
        idle_timeout_s: float = 0.0,
        name: str = "api",
    ) -> None:
        from dra_driver.kube import transport

        self.tls = tls
        self.kubeconfig = base / f"kubeconfig-{name}"
        tls_dir = "-"
        context = None
        if tls:
            from dra_driver.testing.fakeapi import certs

            bundle = certs.make_bundle(client_name=f"system:node:{NODE}")
            d = base / f"tls-{name}"
            d.mkdir(exist_ok=True)
            pems = (
                bundle.ca_pem,
                bundle.server_cert_pem,
                bundle.server_key_pem,
                bundle.client_cert_pem,
                bundle.client_key_pem,
            )
            for n, data in zip(certs_names(), pems, strict=True):
                d.joinpath(n).write_bytes(data)
            tls_dir, context = str(d), bundle.client_context()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve-api",
                str(claims_file),
                str(self.kubeconfig),
                str(delay_ms),
                str(idle_timeout_s),
                tls_dir,
            ],
            cwd=REPO,
        )
        deadline = time.monotonic() + 60
        while not self.kubeconfig.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("API server did not start")
            time.sleep(0.02)
        url = __import__("yaml").safe_load(self.kubeconfig.read_text())["clusters"][0]
        host, port = url["cluster"]["server"].rsplit("/", 1)[-1].rsplit(":", 1)
        self._http = transport.Transport(
            transport.Endpoint(host=host, port=int(port), tls=context), timeouts=(5.0, 10.0)
        )

    def cpu_s(self) -> float:
        """CPU time the API server process has used so far (its threads' run time)."""
        return _cpu_s(self.proc.pid)

    def stats(self) -> dict[str, int]:
        """Connections accepted and TLS sessions resumed so far (this call's included)."""
        response = self._http.request("GET", "/fakeapi/stats")
        return dict(json.loads(response.body))

    def stop(self) -> None:
        self._http.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)


def start_api(
    base: Path, claims_file: Path, delay_ms: float, *, tls: bool = True
) -> tuple[subprocess.Popen[bytes], Path]:
    """The API server as (process, kubeconfig); stop it with SIGTERM."""
    api = Api(base, claims_file, tls=tls, delay_ms=delay_ms, name=f"{delay_ms:g}ms")
    api._http.close()
    return api.proc, api.kubeconfig


def cdi_root(base: Path, on_disk: bool = False) -> Path:
    """Where the plugin writes CDI specs: a tmpfs like a node's /var/run/cdi, if there is one."""
    shm = Path("/dev/shm")
    if on_disk or not shm.is_dir() or not os.access(shm, os.W_OK):
        return base / "cdi"
    return shm / f"{base.name}-cdi"


# ---------------------------------------------------------------- the plugin process


class Plugin:
    """The kubelet plugin as a subprocess, and a gRPC client for it (as the kubelet)."""

    def __init__(
        self,
        base: Path,
        kubeconfig: Path,
        profile: Path,
        serial: bool = False,
        cdi: Path | None = None,
        *,
        tree: Path = REPO,
        env: dict[str, str] | None = None,
        label: str = "",
        image: Path | None = None,
        floor: bool = False,
        publish: bool = False,
    ) -> None:
        """``image``: a venv of :mod:`imagekit` — the agent then runs as the container image
        and the chart run it (its entry point, outside the tree, the image's environment and
        the chart's log level) instead of ``python -m dra_driver`` from ``tree``. ``floor``: run
        :mod:`floorplugin` instead of the agent (the same sockets, the same kubelet calls).
        ``publish``: publish slices and watch the node's pods, as users run it."""
        import imagekit

        self.base = base
        self.cdi = cdi or base / "cdi"
        # Where the chart of ``tree`` puts the claim metadata files (a tmpfs, METADATA_DIR):
        # next to the CDI specs here; None where its chart keeps them in the plugin directory.
        self.metadata = (
            self.cdi.with_name(f"{self.cdi.name}-metadata")
            if imagekit.chart_metadata_dir(tree)
            else None
        )
        for sub in (base / "registry", base / "plugins", self.cdi, self.metadata):
            if sub is not None:
                shutil.rmtree(sub, ignore_errors=True)
        if image is not None:
            head = [*imagekit.agent_command(image), "--log-level", imagekit.chart_log_level()]
            environ = {**imagekit.process_env(image, tree), **(env or {})}
            cwd = base
        else:
            head = [sys.executable, "-m", "dra_driver", "--log-level", "warning"]
            environ = {**os.environ, "PYTHONPATH": str(tree), **(env or {})}
            cwd = tree
        argv = [
            *head,
            "kubelet-plugin",
            "--node-name",
            NODE,
            "--driver-name",
            DRIVER,
            "--kubelet-registry-dir",
            str(base / "registry"),
            "--kubelet-plugins-dir",
            str(base / "plugins"),
            "--cdi-root",
            str(self.cdi),
            "--kubeconfig",
            str(kubeconfig),
            "--fake-file",
            str(profile),
            "--driver-root",
            str(base / "driver-root"),
            *([] if publish else ["--no-publish"]),
            "--cleanup-interval",
            "0",
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            "0",
            *(["--serial"] if serial else []),
            *(["--metadata-dir", str(self.metadata)] if self.metadata else []),
        ]
        if floor:
            python = str(image / "bin/python") if image is not None else sys.executable
            floor_script = Path(__file__).with_name("floorplugin.py")
            argv = [python, str(floor_script), "--kubeconfig", str(kubeconfig)]
            argv += ["--plugins-dir", str(base / "plugins"), "--cdi-root", str(self.cdi)]
            argv += ["--driver-name", DRIVER]
        elif os.environ.get("DRA_BENCH_PLUGIN_PREFIX"):  # e.g. "py-spy record -o F -f raw --"
            argv = [*os.environ["DRA_BENCH_PLUGIN_PREFIX"].split(), *argv]
        name = label or ("serial" if serial else "parallel")
        self.log = (base / f"plugin-{name}.log").open("wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log, cwd=cwd, env=environ)
        import grpc

        from dra_driver.pb.dra.v1 import dra_pb2, dra_pb2_grpc

        self.pb = dra_pb2
        sock = base / "plugins" / DRIVER / "dra.sock"
        reg = base / "registry" / f"{DRIVER}-reg.sock"
        deadline = time.monotonic() + 60
        while not (sock.exists() and (floor or reg.exists())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"plugin did not start; see {self.log.name}")
            time.sleep(0.01)
        self.channel = grpc.insecure_channel(f"unix://{sock}")
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.stub = dra_pb2_grpc.DRAPluginStub(self.channel)

    def _claims(self, objs: list[dict[str, Any]]) -> list[Any]:
        return [
            self.pb.Claim(namespace="bench", uid=o["metadata"]["uid"], name=o["metadata"]["name"])
            for o in objs
        ]

    def prepare(self, objs: list[dict[str, Any]]) -> float:
        """One call with all of ``objs``; its wall time."""
        start = time.perf_counter()
        response = self.stub.NodePrepareResources(
            self.pb.NodePrepareResourcesRequest(claims=self._claims(objs)), timeout=60
        )
        elapsed = time.perf_counter() - start
        errors = [c.error for c in response.claims.values() if c.error]
        if errors or len(response.claims) != len(objs):
            raise RuntimeError(f"prepare failed: {errors[:3]}")
        return elapsed

    def unprepare(self, objs: list[dict[str, Any]]) -> float:
        start = time.perf_counter()
        response = self.stub.NodeUnprepareResources(
            self.pb.NodeUnprepareResourcesRequest(claims=self._claims(objs)), timeout=60
        )
        elapsed = time.perf_counter() - start
        if any(c.error for c in response.claims.values()):
            raise RuntimeError("unprepare failed")
        return elapsed

    def burst(self, objs: list[dict[str, Any]], *, unprepare: bool = False) -> float:
        """One call per claim, all at once (as the kubelet does for separate pods); wall time
        from the first call sent to the last answer."""
        method = self.stub.NodeUnprepareResources if unprepare else self.stub.NodePrepareResources
        kind = (
            self.pb.NodeUnprepareResourcesRequest
            if unprepare
            else self.pb.NodePrepareResourcesRequest
        )
        requests = [kind(claims=self._claims([o])) for o in objs]
        start = time.perf_counter()
        futures = [method.future(r, timeout=120) for r in requests]
        responses = [f.result() for f in futures]
        elapsed = time.perf_counter() - start
        errors = [c.error for r in responses for c in r.claims.values() if c.error]
        if errors:
            what = "unprepare" if unprepare else "prepare"
            raise RuntimeError(f"{what} burst of {len(objs)}: {len(errors)} errors: {errors[:2]}")
        return elapsed

    def cpu_s(self) -> float:
        """CPU time the plugin's threads have used so far, in nanoseconds' resolution (the
        scheduler's run time of each live thread; /proc/PID/stat counts 10 ms ticks)."""
        return _cpu_s(self.proc.pid)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.channel.close()
        profiled = bool(os.environ.get("DRA_BENCH_PLUGIN_PREFIX"))  # the profiler writes on ^C
        self.proc.send_signal(signal.SIGINT if profiled else signal.SIGTERM)
        self.proc.wait(timeout=20)
        self.log.close()
        shutil.rmtree(self.cdi, ignore_errors=True)
        if self.metadata is not None:
            shutil.rmtree(self.metadata, ignore_errors=True)


def _cpu_s(pid: int) -> float:
    """A process's CPU time so far from its live threads' scheduler run time (ns resolution;
    /proc/PID/stat counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total / 1e9


def fs_type(path: Path) -> str:
    """The filesystem type ``path`` is on (from /proc/mounts, longest mount point wins)."""
    best, kind = "", "?"
    target = str(path.resolve() if path.exists() else path.parent.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1]
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(
            best
        ):
            best, kind = mount, fields[2]
    return kind


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-api"]:
        raise SystemExit(serve_api(sys.argv[2:]))
    raise SystemExit("usage: benchkit.py --serve-api CLAIMS KUBECONFIG DELAY_MS IDLE_S TLS_DIR|-")
