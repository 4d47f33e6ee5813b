"""``dra-driver demo``: the whole node pipeline on fake GPUs, as a readable walk-through.

Why it exists: it is the project's main job on a machine with no cluster and no GPU. Nothing in
it is mocked beyond what cannot run here: the GPUs come from a fake profile through the same
NVML code path as real ones, the Kubernetes API is the in-memory API server behind real HTTP on
loopback, and the kubelet is :mod:`dra_driver.kubelet.sim` talking gRPC over the plugin's real
unix sockets. The node agent runs as its own process, exactly as in the DaemonSet.

Steps: discover → the agent publishes ResourceSlices → the example claims are allocated (the
structured-parameters allocator playing the scheduler) → the kubelet registers the plugin,
prepares every allocated claim (CDI specs appear), unprepares them (specs go) → SIGTERM.
The exit code is 0 only when every step did what it must.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import yaml

from dra_driver import examples
from dra_driver.allocation import allocator, pools, simulator
from dra_driver.cli import discover
from dra_driver.devices import fake, topology
from dra_driver.driver import claims
from dra_driver.fakeapi import fakeserver, memory
from dra_driver.kube import api as kube
from dra_driver.kubelet import sim

DEFAULT_PROFILE = "dgx-h100"
# The shipped examples in two waves of pods: the first wave's pods finish (their claims are
# unprepared and deleted) before the second wave arrives, as on a busy node.
WAVES = (
    ("one-gpu", "two-gpus-nvlink", "gpus-one-numa-node"),
    ("h100-40gi", "shared-by-two-containers", "h100-or-any-gpu", "mig-1g", "cannot-fit"),
)
NAMESPACE = "demo"


@dataclasses.dataclass
class Report:
    """Prints the walk-through and remembers every check that failed."""

    out: TextIO
    problems: list[str] = dataclasses.field(default_factory=list)
    step: int = 0

    def section(self, title: str) -> None:
        self.step += 1
        self.out.write(f"\n== {self.step}. {title}\n")

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def block(self, text: str, indent: str = "    ") -> None:
        for line in text.rstrip("\n").splitlines():
            self.out.write(indent + line + "\n")

    def check(self, ok: bool, text: str) -> bool:
        self.out.write(f"  [{'ok' if ok else 'FAILED'}] {text}\n")
        if not ok:
            self.problems.append(text)
        return ok


@dataclasses.dataclass
class Claim:
    """One example claim as the demo handles it."""

    example: str
    obj: dict[str, Any]
    outcome: allocator.Outcome | None = None

    @property
    def ref(self) -> claims.ClaimRef:
        meta = self.obj["metadata"]
        return claims.ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def run(
    *,
    backend: fake.FakeBackend,
    node_name: str,
    driver_name: str,
    out: TextIO,
    keep: Path | None = None,
) -> int:
    """Run the walk-through; returns the exit code (0 = every check passed)."""
    report = Report(out=out)
    with _workdir(keep) as base:
        report.say(
            f"dra-driver demo: node {node_name!r}, driver {driver_name!r}, "
            f"fake profile {backend.profile.name!r}; working directory {base}"
        )
        devices = backend.discover()
        report.section("Discover the node's GPUs (fake NVML, same code path as real GPUs)")
        report.block(discover.render_table(devices, topology.build(devices)))

        server = fakeserver.FakeApiServer(memory.InMemoryApi()).start()
        try:
            server.api.put_node(node_name, uid=str(uuid.uuid4()))
            server.api.put_namespace(NAMESPACE)
            kubeconfig = server.write_kubeconfig(base / "kubeconfig")
            profile_file = base / "profile.yaml"
            profile_file.write_text(
                yaml.safe_dump(
                    backend.profile.model_dump(mode="json", by_alias=True, exclude_none=True)
                ),
                encoding="utf-8",
            )
            plugin = sim.PluginProcess(
                base=base,
                kubeconfig=kubeconfig,
                node=node_name,
                driver=driver_name,
                fake_file=profile_file,
                publish=True,
            )
            plugin.start()
            try:
                _pipeline(
                    report,
                    server.api,
                    plugin,
                    devices_count=len(devices.gpus),
                    node_name=node_name,
                    driver_name=driver_name,
                    node_devices=devices,
                )
            finally:
                _stop_plugin(report, plugin)
        finally:
            server.stop()
    if report.problems:
        report.say(f"\ndemo FAILED: {len(report.problems)} check(s) failed:")
        for problem in report.problems:
            report.say(f"  - {problem}")
        return 1
    report.say("\ndemo OK: every step did what it must.")
    return 0


def _pipeline(
    report: Report,
    api: memory.InMemoryApi,
    plugin: sim.PluginProcess,
    *,
    devices_count: int,
    node_name: str,
    driver_name: str,
    node_devices: Any,
) -> None:
    report.section("Start the node agent (kubelet plugin + ResourceSlice publisher)")
    plugin.wait_ready()
    report.say(
        f"  dra-driver kubelet-plugin running as pid {plugin.proc.pid if plugin.proc else '?'}"
        f"; log: {plugin.log_path}"
    )
    slices = _wait_for_slices(api, driver_name=driver_name, node_name=node_name)
    published = sum(len(s["spec"].get("devices", [])) for s in slices)
    report.check(
        bool(slices),
        f"published {len(slices)} ResourceSlice(s) with {published} "
        f"device(s) for pool {node_name!r}",
    )
    writes = api.writes
    time.sleep(0.3)
    report.check(api.writes == writes, "no further API writes while nothing changes")
    report.section("The ResourceSlices as the API server stores them")
    for obj in slices:
        report.block(yaml.safe_dump(_trim(obj), sort_keys=False))

    kubelet = sim.KubeletSim(plugin.registry_dir)
    try:
        report.section("Kubelet: register the plugin (plugin registration over the real socket)")
        info = kubelet.register(driver_name)
        report.say(f"  GetInfo: type={info.type} name={info.name} endpoint={info.endpoint}")
        report.say(f"           supported_versions={list(info.supported_versions)}")
        report.check(kubelet.version == "v1.DRAPlugin", f"kubelet picked {kubelet.version}")
        for wave, names in enumerate(WAVES, start=1):
            report.section(
                f"Wave {wave} of pods: allocate their claims (the structured-"
                "parameters allocator playing kube-scheduler)"
            )
            demo_claims = _allocate(
                report,
                api,
                slices,
                names,
                node_name=node_name,
                driver_name=driver_name,
                node_devices=node_devices,
            )
            allocated = [c for c in demo_claims if c.outcome and c.outcome.allocation]
            _prepare_all(report, kubelet, plugin, allocated, wave=wave)
            _unprepare_all(report, kubelet, plugin, allocated, wave=wave)
            for claim in demo_claims:
                api.delete_resource_claim(NAMESPACE, claim.obj["metadata"]["name"])
    finally:
        kubelet.close()


def _allocate(
    report: Report,
    api: memory.InMemoryApi,
    slices: list[dict[str, Any]],
    names: tuple[str, ...],
    *,
    node_name: str,
    driver_name: str,
    node_devices: Any,
) -> list[Claim]:
    classes = simulator.builtin_classes(driver_name=driver_name)
    used: set[pools.DeviceId] = set()
    out: list[Claim] = []
    for name in names:
        docs = examples.load(name)
        created = api.create_resource_claim(_claim_from(docs, example=name))
        claim = Claim(example=name, obj=created)
        outcome = allocator.allocate(
            created,
            slices=slices,
            classes=classes,
            node_name=node_name,
            allocated=used,
            node_devices=node_devices,
        )
        claim.outcome = outcome
        out.append(claim)
        report.say(
            f"\n  -- example {name} (ResourceClaim {NAMESPACE}/{created['metadata']['name']})"
        )
        report.block(_request_summary(created), indent="     ")
        report.say(f"     used by {_pod_summary(docs)}")
        if outcome.allocation is None:
            report.block(simulator.render(outcome, node_name=node_name), indent="     ")
            report.check(bool(outcome.explanation), "unsatisfiable, with an explanation")
            continue
        results = outcome.allocation["devices"]["results"]
        report.say(
            "     allocated: "
            + ", ".join(f"{r['device']} (request {r['request']})" for r in results)
        )
        if outcome.score is not None and len(results) > 1:
            links, numa, root = outcome.score
            report.say(
                f"     placement: {links} NVLink links inside the set, {numa} pair(s) on "
                f"one NUMA node, {root} pair(s) under one PCIe root"
            )
        used |= pools.allocated_ids([outcome.allocation["devices"]])
        status = {
            "allocation": outcome.allocation,
            "reservedFor": [{"resource": "pods", "name": name, "uid": str(uuid.uuid4())}],
        }
        claim.obj = api.put_resource_claim({**created, "status": status})
    return out


def _prepare_all(
    report: Report,
    kubelet: sim.KubeletSim,
    plugin: sim.PluginProcess,
    allocated: list[Claim],
    *,
    wave: int,
) -> None:
    report.section(
        f"Wave {wave}: kubelet calls NodePrepareResources for each pod's claim "
        "(DRA v1 over dra.sock)"
    )
    for claim in allocated:
        ref = claim.ref
        started = time.perf_counter()
        answer = kubelet.prepare([ref]).claims[ref.uid]
        ms = (time.perf_counter() - started) * 1000
        if not report.check(
            not answer.error,
            f"{claim.example}: prepared in {ms:.1f} ms"
            + (f" — error: {answer.error}" if answer.error else ""),
        ):
            continue
        for dev in answer.devices:
            report.say(
                f"      {dev.device_name}: requests {list(dev.request_names) or ['(all)']}"
                f", CDI {list(dev.cdi_device_ids)}"
            )
        spec = _spec_file(plugin, ref.uid)
        report.check(spec is not None, f"{claim.example}: CDI spec written")
    if allocated and wave == 1:
        first = allocated[0].ref
        again = kubelet.prepare([first]).claims[first.uid]
        report.check(not again.error, "preparing the first claim again is idempotent")
        shown = next((c for c in allocated if c.example == "two-gpus-nvlink"), allocated[0])
        spec = _spec_file(plugin, shown.ref.uid)
        if spec is not None:
            report.say(f"\n  CDI spec of {shown.example}: {spec}")
            report.block(json.dumps(json.loads(spec.read_text()), indent=2), indent="    ")


def _unprepare_all(
    report: Report,
    kubelet: sim.KubeletSim,
    plugin: sim.PluginProcess,
    allocated: list[Claim],
    *,
    wave: int,
) -> None:
    report.section(f"Wave {wave}: the pods finish; kubelet calls NodeUnprepareResources")
    refs = [c.ref for c in allocated]
    answer = kubelet.unprepare(refs) if refs else None
    for claim in allocated:
        error = answer.claims[claim.ref.uid].error if answer else ""
        report.check(
            not error and _spec_file(plugin, claim.ref.uid) is None,
            f"{claim.example}: unprepared, CDI spec removed"
            + (f" — error: {error}" if error else ""),
        )
    if refs:
        again = kubelet.unprepare(refs[:1]).claims[refs[0].uid]
        report.check(not again.error, "unpreparing again is a no-op success")


def _stop_plugin(report: Report, plugin: sim.PluginProcess) -> None:
    if plugin.proc is None or plugin.proc.poll() is not None:
        report.check(False, f"node agent still running at the end\n{plugin.log()[-2000:]}")
        return
    report.section("Stop the node agent (SIGTERM)")
    plugin.signal(signal.SIGTERM)
    try:
        code = plugin.wait(20)
    except Exception:
        plugin.kill()
        code = -1
    report.check(code == 0, f"exited with code {code}")
    report.check(
        not plugin.registration_socket.exists() and not plugin.dra_socket.exists(),
        "its sockets are removed",
    )


def _claim_from(docs: list[dict[str, Any]], *, example: str) -> dict[str, Any]:
    """A ResourceClaim from an example's first document (a claim or a template)."""
    first = docs[0]
    spec = first["spec"]["spec"] if first.get("kind") == "ResourceClaimTemplate" else first["spec"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": example, "namespace": NAMESPACE},
        "spec": spec,
    }


def _request_summary(obj: dict[str, Any]) -> str:
    devices = obj["spec"]["devices"]
    return yaml.safe_dump(
        {k: devices[k] for k in ("requests", "constraints") if k in devices}, sort_keys=False
    )


def _pod_summary(docs: list[dict[str, Any]]) -> str:
    """Which containers of the example's Pod use which claim (and request)."""
    pod = next((d for d in docs if d.get("kind") == "Pod"), None)
    if pod is None:
        return "no pod"
    uses = []
    for container in pod["spec"].get("containers", []):
        for ref in (container.get("resources") or {}).get("claims", []):
            request = f"/{ref['request']}" if ref.get("request") else ""
            uses.append(f"container {container['name']} → claim {ref['name']}{request}")
    return f"pod {pod['metadata']['name']}: " + ("; ".join(uses) or "no container uses it")


def _wait_for_slices(
    api: kube.KubeApi, *, driver_name: str, node_name: str, timeout_s: float = 15.0
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        slices, _ = api.list_resource_slices(driver=driver_name, node_name=node_name)
        if slices or time.monotonic() > deadline:
            return sorted(slices, key=lambda s: s["metadata"]["name"])
        time.sleep(0.05)


def _trim(obj: dict[str, Any]) -> dict[str, Any]:
    """A slice without the server-managed metadata noise."""
    meta = obj["metadata"]
    keep = {k: meta[k] for k in ("name", "ownerReferences") if k in meta}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": keep,
        "spec": obj["spec"],
    }


def _spec_file(plugin: sim.PluginProcess, claim_uid: str) -> Path | None:
    matches = sorted(plugin.cdi_root.glob(f"*_{claim_uid}.json"))
    return matches[0] if matches else None


@contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    # Short path under /tmp: unix socket paths are limited to 108 bytes.
    base = Path(tempfile.mkdtemp(prefix="dra-demo-", dir="/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
