"""One demo node: the in-memory API server on loopback HTTP and the node agent as its own process.

Why it exists: every demo scene needs the same rig (a fake API server with the Node and the demo
namespace, the agent started on a fake GPU profile, its published ResourceSlices, a stand-in
kubelet talking to its real sockets) and the same checked shutdown. Scenes differ only in the
profile, the agent's extra flags and what they do with the rig.
"""

from __future__ import annotations

import dataclasses
import signal
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from dra_driver.demo import report as reporting
from dra_driver.devices import fake
from dra_driver.devices.fake import profiles
from dra_driver.kube import api as kube
from dra_driver.testing import kubeletsim as sim
from dra_driver.testing.fakeapi import fakeserver, memory

NAMESPACE = "demo"


@dataclasses.dataclass
class Rig:
    """A running demo node: the API it publishes to and the agent process."""

    api: memory.InMemoryApi
    plugin: sim.PluginProcess
    node_name: str
    driver_name: str

    def slices(self, timeout_s: float = 15.0) -> list[dict[str, Any]]:
        """This node's ResourceSlices as the API server stores them (waits for the first)."""
        return wait_for_slices(
            self.api, driver_name=self.driver_name, node_name=self.node_name, timeout_s=timeout_s
        )

    def spec_file(self, claim_uid: str) -> Path | None:
        return spec_file(self.plugin, claim_uid)


@contextmanager
def node(
    report: reporting.Report,
    *,
    base: Path,
    backend: fake.FakeBackend,
    node_name: str,
    driver_name: str,
    publish: bool = True,
    extra: Sequence[str] = (),
) -> Iterator[Rig]:
    """Start the API server and the agent on ``backend``'s profile under ``base``; on exit stop
    the agent with SIGTERM (checked: exit code 0, sockets gone) and the server."""
    base.mkdir(parents=True, exist_ok=True)
    server = fakeserver.FakeApiServer(memory.InMemoryApi()).start()
    try:
        server.api.put_node(node_name, uid=str(uuid.uuid4()))
        server.api.put_namespace(NAMESPACE)
        kubeconfig = server.write_kubeconfig(base / "kubeconfig")
        profile_file = base / "profile.yaml"
        profile_file.write_text(
            yaml.safe_dump(profiles.dump(backend.profile)),
            encoding="utf-8",
        )
        plugin = sim.PluginProcess(
            base=base,
            kubeconfig=kubeconfig,
            node=node_name,
            driver=driver_name,
            fake_file=profile_file,
            publish=publish,
            extra=extra,
        )
        plugin.start()
        try:
            plugin.wait_ready()
            yield Rig(api=server.api, plugin=plugin, node_name=node_name, driver_name=driver_name)
        finally:
            stop_plugin(report, plugin)
    finally:
        server.stop()


def stop_plugin(report: reporting.Report, plugin: sim.PluginProcess) -> None:
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


def wait_for_slices(
    api: kube.KubeApi, *, driver_name: str, node_name: str, timeout_s: float = 15.0
) -> list[dict[str, Any]]:
    """The node's slices once the whole pool is there: every slice its count announces, all of
    one generation (not halfway through an update)."""
    deadline = time.monotonic() + timeout_s
    while True:
        slices, _ = api.list_resource_slices(driver=driver_name, node_name=node_name)
        pools = {
            (s["spec"]["pool"]["resourceSliceCount"], s["spec"]["pool"]["generation"])
            for s in slices
        }
        whole = len(pools) == 1 and next(iter(pools))[0] == len(slices)
        if whole or time.monotonic() > deadline:
            return sorted(slices, key=lambda s: s["metadata"]["name"])
        time.sleep(0.05)


def spec_file(plugin: sim.PluginProcess, claim_uid: str) -> Path | None:
    matches = sorted(plugin.cdi_root.glob(f"*_{claim_uid}.json"))
    return matches[0] if matches else None


def trim(obj: dict[str, Any]) -> dict[str, Any]:
    """A slice without the server-managed metadata noise."""
    meta = obj["metadata"]
    keep = {k: meta[k] for k in ("name", "ownerReferences") if k in meta}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": keep,
        "spec": obj["spec"],
    }


def claim_from(docs: list[dict[str, Any]], *, name: str) -> dict[str, Any]:
    """A ResourceClaim in the demo namespace from a document list's first document (a claim
    or a template)."""
    first = docs[0]
    spec = first["spec"]["spec"] if first.get("kind") == "ResourceClaimTemplate" else first["spec"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }
