"""A rolling update as the node sees it: two plugin processes with different pod UIDs on the same
directories, each with its own sockets; the kubelet may prepare through one and unprepare through
the other; SIGTERM to one leaves the other's sockets and service alone."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim

UID_A, UID_B = str(uuid.uuid4()), str(uuid.uuid4())


@pytest.fixture
def pair(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> Iterator[tuple[PluginProcess, PluginProcess]]:
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    a = PluginProcess(base=short_dir, kubeconfig=kubeconfig, pod_uid=UID_A).start()
    b = PluginProcess(base=short_dir, kubeconfig=kubeconfig, pod_uid=UID_B).start()
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.kill()
        b.kill()


def kubelet_for(plugin: PluginProcess) -> KubeletSim:
    kubelet = KubeletSim(plugin.registry_dir)
    kubelet.register("gpu.nvidia.com", socket=plugin.registration_socket)
    return kubelet


def test_each_instance_has_its_own_sockets(pair: tuple[PluginProcess, PluginProcess]) -> None:
    a, b = pair
    assert {p.name for p in a.registry_dir.iterdir()} == {
        f"gpu.nvidia.com-{UID_A}-reg.sock",
        f"gpu.nvidia.com-{UID_B}-reg.sock",
    }
    assert a.dra_socket.name == f"dra-{UID_A}.sock" and a.dra_socket.is_socket()
    assert b.dra_socket.name == f"dra-{UID_B}.sock" and b.dra_socket.is_socket()
    ka, kb = kubelet_for(a), kubelet_for(b)
    assert (ka.info.endpoint, kb.info.endpoint) == (str(a.dra_socket), str(b.dra_socket))
    ka.close()
    kb.close()


def test_prepare_through_one_unprepare_through_the_other_then_sigterm_one(
    pair: tuple[PluginProcess, PluginProcess], apiserver: fakeserver.FakeApiServer
) -> None:
    a, b = pair
    ka, kb = kubelet_for(a), kubelet_for(b)
    x = put_claim(apiserver, "x", ["gpu-0"])
    spec = a.cdi_root / f"k8s.gpu.nvidia.com-claim_{x.uid}.json"
    record = a.plugins_dir / "gpu.nvidia.com" / "claims" / f"{x.uid}.json"

    first = ka.prepare([x]).claims[x.uid]
    assert first.error == "" and spec.exists() and record.exists()
    again = kb.prepare([x]).claims[x.uid]  # B answers from the checkpoint A wrote
    assert again.error == ""
    assert list(again.devices[0].cdi_device_ids) == list(first.devices[0].cdi_device_ids)

    assert kb.unprepare([x]).claims[x.uid].error == ""
    assert not spec.exists() and not record.exists()
    # A prepared gpu-0 for x and B released it: A must not refuse gpu-0 to the next claim.
    z = put_claim(apiserver, "z", ["gpu-0"])
    assert ka.prepare([z]).claims[z.uid].error == ""
    assert kb.unprepare([z]).claims[z.uid].error == ""

    # The same claim at once through both: prepared once, both answers alike.
    y = put_claim(apiserver, "y", ["gpu-1", "gpu-2"])
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda k: k.prepare([y]).claims[y.uid], [ka, kb]))
    assert [a.error for a in answers] == ["", ""]
    assert answers[0].devices == answers[1].devices
    assert len(list(a.cdi_root.glob(f"*{y.uid}*"))) == 1

    ka.close()
    a.signal(signal.SIGTERM)
    assert a.wait() == 0
    assert not a.registration_socket.exists() and not a.dra_socket.exists()
    assert b.registration_socket.is_socket() and b.dra_socket.is_socket()
    # B keeps serving, and can undo what A prepared.
    assert kb.unprepare([y]).claims[y.uid].error == ""
    assert list(b.cdi_root.iterdir()) == []
    kb.close()
    b.signal(signal.SIGTERM)
    assert b.wait() == 0
    assert list(b.registry_dir.iterdir()) == []

    events = [json.loads(line) for line in a.log().splitlines() if line.startswith("{")]
    assert any(e["event"] == "claim prepared" and e.get("claim_uid") == x.uid for e in events)
