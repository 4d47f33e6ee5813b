"""The node side of compute-domain.nvidia.com, in-process against the in-memory API: prepare
waits for the IMEX daemon then injects the channel, unprepare undoes everything, a domain across
cliques is refused, and a crash at any step leaves nothing behind once the claim is unprepared
or gone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import imexconfig, manifests, monitor, nodedriver
from dra_driver.driver import claims
from dra_driver.kube.objects import COMPUTE_DOMAINS
from dra_driver.testing.fakeapi import memory

from . import cdkit
from .cdkit import DRIVER_NS, NS, Crash


def _daemon_claim(
    mem: memory.InMemoryApi, dom: dict[str, Any], node: str, name: str = ""
) -> claims.ClaimRef:
    template = manifests.daemon_name(cdapi.Domain.from_obj(dom))
    return cdkit.claim(mem, template, name or f"imex-{node}", node, namespace=DRIVER_NS)


def _bring_up(
    mem: memory.InMemoryApi, drv: nodedriver.NodeDriver, dom: dict[str, Any], job: claims.ClaimRef
) -> dict[str, Any]:
    """Prepare ``job`` through the daemon: first refusal, daemon prepared, daemon ready."""
    first = drv.prepare([job])[job.uid]
    assert "waiting for the IMEX daemon" in first.error and "the kubelet retries" in first.error
    assert cdkit.label(mem, drv.node_name) == dom["metadata"]["uid"]
    assert cdkit.entries(mem) == {drv.node_name: "NotReady"}
    daemon = _daemon_claim(mem, dom, drv.node_name)
    answer = drv.prepare([daemon])[daemon.uid]
    assert answer.error == ""
    directory = drv.domain_dir(dom["metadata"]["uid"])
    imexconfig.write_status(directory, imexconfig.READY_STATE)  # what the daemon reports
    monitor.Monitor(driver=drv, interval_s=1, log=cdkit.LOG).step()
    assert cdkit.entries(mem) == {drv.node_name: "Ready"}
    return {"daemon": daemon, "dir": directory}


def test_prepare_waits_for_the_daemon_then_injects_the_channel(tmp_path: Path) -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=1)
    drv = cdkit.node_driver(mem, tmp_path, "a1", ip="10.0.0.1")
    job = cdkit.claim(mem, "job-channel", "job-0", "a1")
    up = _bring_up(mem, drv, dom, job)
    assert imexconfig.read_nodes(up["dir"]) == ["10.0.0.1"]
    config = imexconfig.read_config(up["dir"])
    assert (
        config["SERVER_PORT"] == "50000" and config["IMEX_NODE_CONFIG_FILE"] == "/imexd/nodes.cfg"
    )
    assert config["DAEMONIZE"] == "0"  # in the foreground, the wrapper's child
    daemon_spec = drv.specs.read(up["daemon"].uid)
    (dev,) = daemon_spec["devices"]
    assert dev["containerEdits"]["mounts"][0]["containerPath"] == "/imexd"
    assert dev["containerEdits"]["mounts"][0]["hostPath"] == str(up["dir"])
    assert f"COMPUTE_DOMAIN_UUID={dom['metadata']['uid']}" in dev["containerEdits"]["env"]

    answer = drv.prepare([job])[job.uid]
    assert answer.error == ""
    (device,) = answer.devices
    assert device.device_name == "channel-0"
    assert device.cdi_device_ids == (f"k8s.compute-domain.nvidia.com/claim={job.uid}-channel-0",)
    spec = json.loads(
        (
            tmp_path / "a1" / "cdi" / f"k8s.compute-domain.nvidia.com-claim_{job.uid}.json"
        ).read_text()
    )
    (dev,) = spec["devices"]
    assert dev["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia-caps-imex-channels/channel0", "hostPath": "/dev/null"}
    ]
    # prepared: answered again from the checkpoint, even with the daemon gone meanwhile
    assert drv.prepare([job])[job.uid] == answer


def test_real_nodes_get_the_channel_major_from_proc_devices_and_all_mode_every_channel(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "devices"
    proc.write_text(
        "Character devices:\n  1 mem\n195 nvidia\n234 nvidia-caps-imex-channels\n\n"
        "Block devices:\n  8 sd\n"
    )
    assert imexconfig.channel_major(proc) == 234
    (tmp_path / "none").write_text("Character devices:\n195 nvidia\n")
    with pytest.raises(imexconfig.NoChannelDevice, match="no IMEX channel support"):
        imexconfig.channel_major(tmp_path / "none")
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=1, mode="All")
    drv = cdkit.node_driver(mem, tmp_path, "a1", major=imexconfig.channel_major(proc))
    job = cdkit.claim(mem, "job-channel", "job-0", "a1")
    _bring_up(mem, drv, dom, job)
    assert drv.prepare([job])[job.uid].error == ""
    (dev,) = drv.specs.read(job.uid)["devices"]
    nodes = dev["containerEdits"]["deviceNodes"]
    assert len(nodes) == cd.MAX_CHANNELS
    assert nodes[5] == {
        "path": "/dev/nvidia-caps-imex-channels/channel5",
        "type": "c",
        "major": 234,
        "minor": 5,
        "permissions": "rw",
    }


def test_unprepare_leaves_the_domain_and_removes_the_imex_files(tmp_path: Path) -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=1)
    drv = cdkit.node_driver(mem, tmp_path, "a1")
    job = cdkit.claim(mem, "job-channel", "job-0", "a1")
    up = _bring_up(mem, drv, dom, job)
    assert drv.prepare([job])[job.uid].error == ""
    assert drv.unprepare([job]) == {job.uid: ""}
    assert cdkit.label(mem, "a1") is None and cdkit.entries(mem) == {}
    assert drv.specs.claim_uids_on_disk() == [up["daemon"].uid]
    assert drv.unprepare([up["daemon"]]) == {up["daemon"].uid: ""}
    assert not up["dir"].exists() and drv.specs.claim_uids_on_disk() == []
    assert drv.state.records == {}
    assert drv.unprepare([job]) == {job.uid: ""}  # again: nothing to do


def test_a_domain_across_cliques_is_refused_in_words_and_changes_nothing(tmp_path: Path) -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=2)
    a1 = cdkit.node_driver(mem, tmp_path, "a1", clique_id=32766)
    b1 = cdkit.node_driver(mem, tmp_path, "b1", clique_id=41)
    first = cdkit.claim(mem, "job-channel", "job-0", "a1")
    assert "waiting for the IMEX daemon" in a1.prepare([first])[first.uid].error
    other = cdkit.claim(mem, "job-channel", "job-1", "b1")
    error = b1.prepare([other])[other.uid].error
    assert (
        "spans NVLink cliques" in error and "a1" in error and ".41" in error and ".32766" in error
    )
    assert cdkit.label(mem, "b1") is None
    assert cdkit.entries(mem) == {"a1": "NotReady"}
    assert b1.state.records == {}
    assert b1.unprepare([other]) == {other.uid: ""}
    assert dom["metadata"]["uid"] == cdkit.label(mem, "a1")


def test_a_node_serves_one_domain_at_a_time(tmp_path: Path) -> None:
    mem = cdkit.cluster()
    cdkit.domain(mem, "job", num_nodes=1)
    cdkit.domain(mem, "other", num_nodes=1)
    drv = cdkit.node_driver(mem, tmp_path, "a1")
    mine = cdkit.claim(mem, "job-channel", "job-0", "a1")
    drv.prepare([mine])
    mem.objects.collect_garbage()
    # channel-0 is taken on a1: a second workload there cannot even be allocated
    with pytest.raises(Exception, match="other-0"):
        cdkit.claim(mem, "other-channel", "other-0", "a1")


def test_nodes_config_follows_peers_joining_and_leaving(tmp_path: Path) -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=2)
    a1 = cdkit.node_driver(mem, tmp_path, "a1", ip="10.0.0.1")
    a2 = cdkit.node_driver(mem, tmp_path, "a2", ip="10.0.0.2")
    j0 = cdkit.claim(mem, "job-channel", "job-0", "a1")
    up = _bring_up(mem, a1, dom, j0)
    j1 = cdkit.claim(mem, "job-channel", "job-1", "a2")
    assert "waiting" in a2.prepare([j1])[j1.uid].error
    watcher = monitor.Monitor(driver=a1, interval_s=1, log=cdkit.LOG)
    watcher.step()
    assert imexconfig.read_nodes(up["dir"]) == ["10.0.0.1", "10.0.0.2"]
    assert cdkit.entries(mem) == {"a1": "Ready", "a2": "NotReady"}
    imexconfig.write_status(up["dir"], "NOT_READY")  # waits for its new peer
    watcher.step()
    assert cdkit.entries(mem) == {"a1": "NotReady", "a2": "NotReady"}
    cdkit.reconcile(mem)
    assert (
        cdapi.Domain.from_obj(mem.objects.get(COMPUTE_DOMAINS, "job", namespace=NS)).status
        == "NotReady"
    )
    assert a2.unprepare([j1]) == {j1.uid: ""}
    watcher.step()
    assert imexconfig.read_nodes(up["dir"]) == ["10.0.0.1"]


CHANNEL_STEPS = ["recorded", "joined", "labelled", "spec-written"]
DAEMON_STEPS = ["recorded", "configured", "spec-written"]


@pytest.mark.parametrize("gone", [False, True], ids=["unprepared", "claim-deleted"])
@pytest.mark.parametrize("step", CHANNEL_STEPS)
def test_a_crash_at_any_step_of_a_channel_prepare_leaves_nothing(
    tmp_path: Path, step: str, gone: bool
) -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=1)
    drv = cdkit.node_driver(mem, tmp_path, "a1")
    job = cdkit.claim(mem, "job-channel", "job-0", "a1")
    daemon = None
    if step == "spec-written":  # the daemon is ready: the prepare goes on to the spec
        daemon = _bring_up(mem, drv, dom, job)["daemon"]
    crashing = cdkit.node_driver(mem, tmp_path, "a1", crash_at=step)
    crashing.recover()
    with pytest.raises(Crash):
        crashing.prepare([job])
    restarted = cdkit.node_driver(mem, tmp_path, "a1")
    if gone:
        mem.delete_resource_claim(NS, "job-0")
        restarted.recover()
    else:
        restarted.recover()
        assert restarted.unprepare([job]) == {job.uid: ""}
    if daemon is not None:
        assert restarted.unprepare([daemon]) == {daemon.uid: ""}
    assert cdkit.label(mem, "a1") is None
    assert cdkit.entries(mem) == {}
    assert restarted.specs.claim_uids_on_disk() == []
    assert restarted.state.records == {}


@pytest.mark.parametrize("gone", [False, True], ids=["unprepared", "claim-deleted"])
@pytest.mark.parametrize("step", DAEMON_STEPS)
def test_a_crash_at_any_step_of_a_daemon_prepare_leaves_no_imex_files(
    tmp_path: Path, step: str, gone: bool
) -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=1)
    drv = cdkit.node_driver(mem, tmp_path, "a1")
    job = cdkit.claim(mem, "job-channel", "job-0", "a1")
    drv.prepare([job])
    daemon = _daemon_claim(mem, dom, "a1")
    crashing = cdkit.node_driver(mem, tmp_path, "a1", crash_at=step)
    crashing.recover()
    with pytest.raises(Crash):
        crashing.prepare([daemon])
    restarted = cdkit.node_driver(mem, tmp_path, "a1")
    if gone:
        mem.delete_resource_claim(DRIVER_NS, daemon.name)
        restarted.recover()
    else:
        restarted.recover()
        assert restarted.unprepare([daemon]) == {daemon.uid: ""}
    assert not restarted.domains_dir.exists() or list(restarted.domains_dir.iterdir()) == []
    assert restarted.specs.claim_uids_on_disk() == []
    assert restarted.unprepare([job]) == {job.uid: ""}
    assert cdkit.label(mem, "a1") is None and cdkit.entries(mem) == {}


def test_claims_not_made_from_a_domain_template_are_refused(tmp_path: Path) -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=1)
    drv = cdkit.node_driver(mem, tmp_path, "a1")
    job = cdkit.claim(mem, "job-channel", "job-0", "a1")
    obj = mem.get_resource_claim(NS, "job-0")
    obj["status"]["allocation"]["devices"]["config"] = []
    mem.put_resource_claim(obj)
    assert "no ComputeDomainChannelConfig" in drv.prepare([job])[job.uid].error
    obj["status"]["allocation"]["devices"]["config"] = [
        {
            "source": "FromClaim",
            "requests": ["channel"],
            "opaque": {
                "driver": cd.DRIVER_NAME,
                "parameters": {
                    "apiVersion": cd.API_VERSION,
                    "kind": "ComputeDomainChannelConfig",
                    "domainID": "../../etc",
                },
            },
        }
    ]
    mem.put_resource_claim(obj)
    assert "is not a ComputeDomain UID" in drv.prepare([job])[job.uid].error
    obj["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["domainID"] = (
        "0" * 36
    )
    mem.put_resource_claim(obj)
    assert "does not exist" in drv.prepare([job])[job.uid].error
    assert cdkit.label(mem, "a1") is None and dom


def test_leaving_a_domain_deleted_between_read_and_write_is_done(tmp_path: Path) -> None:
    """The domain's finalizer can go (and the domain with it) between the node's read of the
    domain and its status write: leaving it is then done, not an unprepare error."""
    from dra_driver import logs
    from dra_driver.computedomain import membership

    mem = cdkit.cluster()
    dom = cdapi.Domain.from_obj(cdkit.domain(mem))
    member = membership.Membership(
        kube=mem,
        objects=mem.objects,
        node_name="a1",
        node_ip="10.0.0.1",
        clique="clique-a",
        log=logs.get("test"),
    )
    member.join(dom)
    real_update = mem.objects.update_status

    def deleted_first(kind: Any, obj: dict[str, Any]) -> dict[str, Any]:
        current = mem.objects.get(kind, obj["metadata"]["name"], namespace=NS)
        current["metadata"]["finalizers"] = []
        mem.objects.update(kind, current)  # the controller's last step: the domain is gone
        mem.objects.delete(kind, obj["metadata"]["name"], namespace=NS)
        return real_update(kind, obj)

    mem.objects.update_status = deleted_first  # type: ignore[method-assign]
    member.leave(dom.uid, dom.namespace, dom.name)  # no error
    assert mem.objects.all(COMPUTE_DOMAINS) == []
