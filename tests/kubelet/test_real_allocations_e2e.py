"""Issue 9, end to end: the claims a real scheduler allocated (``real-allocations.json``), served
by the in-memory API over loopback HTTP, prepared and unprepared by the plugin subprocess over its
real sockets, one case per claim in the file."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import refdata

from dra_driver.driver import claims
from dra_driver.testing.fakeapi import fakeserver, memory
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

pytestmark = refdata.MARK

DATA: dict[str, Any] = refdata.real_allocations()
NODE = DATA["node"]
DRIVER = DATA["slice"]["spec"]["driver"]
CLAIMS = {c["metadata"]["name"]: c for c in DATA["claims"]}


class Session:
    def __init__(self, base: Path) -> None:
        self.server = fakeserver.FakeApiServer(memory.InMemoryApi(use_default_cel=False)).start()
        for claim in DATA["claims"]:
            self.server.api.put_resource_claim(claim)
        kubeconfig = self.server.write_kubeconfig(base / "kubeconfig")
        self.plugin = PluginProcess(
            base=base, kubeconfig=kubeconfig, node=NODE, driver=DRIVER, fake="dgx-h100"
        ).start()
        self.plugin.wait_ready()
        self.kubelet = KubeletSim(self.plugin.registry_dir)
        self.kubelet.register(DRIVER)

    def close(self) -> None:
        self.kubelet.close()
        self.plugin.signal(signal.SIGTERM)
        self.plugin.wait()
        self.server.stop()


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    s = Session(base)
    yield s
    s.close()
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("name", sorted(CLAIMS) if refdata.available() else refdata.placeholder())
def test_recorded_claim_prepares_over_the_sockets(session: Session, name: str) -> None:
    claim = CLAIMS[name]
    meta = claim["metadata"]
    ref = claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])
    results = [
        r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == DRIVER
    ]
    response = session.kubelet.prepare([ref])
    got = response.claims[ref.uid]
    assert got.error == ""
    assert [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
        for d in got.devices
    ] == [
        (
            [r["request"].split("/")[0]],
            r["pool"],
            r["device"],
            [f"k8s.{DRIVER}/claim={ref.uid}-{r['device']}"],
        )
        for r in results
    ]
    spec_file = session.plugin.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json"
    spec = json.loads(spec_file.read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{ref.uid}-{r['device']}" for r in results]
    record = json.loads(
        (session.plugin.plugins_dir / DRIVER / "claims" / f"{ref.uid}.json").read_text()
    )
    if name == "two-requests-with-config":
        by_device = {d["deviceName"]: d["config"] for d in record["devices"]}
        assert by_device["gpu-5"]["sharing"] == {"strategy": "TimeSlicing"}
        assert "sharing" not in by_device["gpu-4"]
    response = session.kubelet.unprepare([ref])
    assert response.claims[ref.uid].error == ""
    assert not spec_file.exists()


def test_all_recorded_claims_at_once(session: Session) -> None:
    refs = [
        claims.ClaimRef(
            uid=c["metadata"]["uid"],
            namespace=c["metadata"]["namespace"],
            name=c["metadata"]["name"],
        )
        for c in DATA["claims"]
    ]
    response = session.kubelet.prepare(refs)
    assert {uid: c.error for uid, c in response.claims.items()} == {r.uid: "" for r in refs}
    assert sum(len(c.devices) for c in response.claims.values()) == 8  # each GPU exactly once
    assert {c.error for c in session.kubelet.unprepare(refs).claims.values()} == {""}
