"""The ComputeDomain controller: what it creates for a domain, status from the nodes' reports,
clean-up on delete (also when it was down at the time, or restarted half-way), and one leader
among several controllers."""

from __future__ import annotations

import threading
import time
from typing import cast

import pytest

from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import controller, controlloop, leader, manifests
from dra_driver.kube import api
from dra_driver.kube.objects import (
    COMPUTE_DOMAINS,
    DAEMON_SETS,
    LEASES,
    RESOURCE_CLAIM_TEMPLATES,
    Kind,
    ObjectApi,
)
from dra_driver.testing.fakeapi import memory

from . import cdkit
from .cdkit import DRIVER_NS, NS


def _names(mem: memory.InMemoryApi, kind: Kind) -> list[tuple[str, str]]:
    return sorted(
        (o["metadata"]["namespace"], o["metadata"]["name"]) for o in mem.objects.all(kind)
    )


def _everything(mem: memory.InMemoryApi) -> list[tuple[str, str]]:
    return [
        *_names(mem, RESOURCE_CLAIM_TEMPLATES),
        *_names(mem, DAEMON_SETS),
        *_names(mem, COMPUTE_DOMAINS),
    ]


def test_a_domain_gets_its_templates_daemonset_finalizer_and_status() -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=2, mode="All")
    uid = dom["metadata"]["uid"]
    assert dom["metadata"]["finalizers"] == [cd.FINALIZER]
    assert dom["status"]["status"] == "NotReady"
    imex = f"imex-{uid}"
    assert _names(mem, RESOURCE_CLAIM_TEMPLATES) == [(DRIVER_NS, imex), (NS, "job-channel")]
    workload = mem.objects.get(RESOURCE_CLAIM_TEMPLATES, "job-channel", namespace=NS)
    assert workload["metadata"]["ownerReferences"][0]["uid"] == uid
    devices = workload["spec"]["spec"]["devices"]
    assert devices["requests"] == [
        {
            "name": "channel",
            "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"},
        }
    ]
    assert devices["config"][0]["opaque"] == {
        "driver": "compute-domain.nvidia.com",
        "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainChannelConfig",
            "domainID": uid,
            "allocationMode": "All",
        },
    }
    ds = mem.objects.get(DAEMON_SETS, imex, namespace=DRIVER_NS)
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {cd.NODE_LABEL: uid}
    assert pod["resourceClaims"] == [{"name": "daemon", "resourceClaimTemplateName": imex}]
    assert pod["hostNetwork"] is True
    daemon = mem.objects.get(RESOURCE_CLAIM_TEMPLATES, imex, namespace=DRIVER_NS)
    assert (
        daemon["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["kind"]
        == "ComputeDomainDaemonConfig"
    )
    before = mem.resource_version
    cdkit.reconcile(mem)  # a second round changes nothing
    assert mem.resource_version == before


def _report(mem: memory.InMemoryApi, nodes: dict[str, str]) -> None:
    obj = mem.objects.get(COMPUTE_DOMAINS, "job", namespace=NS)
    entries = [
        cdapi.DomainNode(n, f"10.0.0.{i}", "c.1", i, s) for i, (n, s) in enumerate(nodes.items())
    ]
    mem.objects.update_status(COMPUTE_DOMAINS, cdapi.with_nodes(obj, entries))


def _status(mem: memory.InMemoryApi) -> str:
    return str(mem.objects.get(COMPUTE_DOMAINS, "job", namespace=NS)["status"]["status"])


def test_status_follows_the_nodes_as_they_scale_up_and_down() -> None:
    mem = cdkit.cluster()
    cdkit.domain(mem, num_nodes=2)
    ctl = cdkit.control(mem)
    _report(mem, {"a1": "Ready"})
    ctl.reconcile_all()
    assert _status(mem) == "NotReady"
    _report(mem, {"a1": "Ready", "a2": "NotReady"})
    ctl.reconcile_all()
    assert _status(mem) == "NotReady"
    _report(mem, {"a1": "Ready", "a2": "Ready"})
    ctl.reconcile_all()
    assert _status(mem) == "Ready"
    assert (
        ctl.metrics.registry.get_sample_value("dra_driver_compute_domains", {"status": "Ready"})
        == 1
    )
    _report(mem, {"a2": "Ready"})  # a1 left
    ctl.reconcile_all()
    assert _status(mem) == "NotReady"


def test_numnodes_zero_is_ready_once_every_joined_node_is() -> None:
    mem = cdkit.cluster()
    cdkit.domain(mem, num_nodes=0)
    _report(mem, {"a1": "Ready", "a2": "Ready", "a3": "Ready"})
    cdkit.reconcile(mem)
    assert _status(mem) == "Ready"


def test_deleting_a_domain_removes_everything_then_the_finalizer() -> None:
    mem = cdkit.cluster()
    cdkit.domain(mem)
    mem.objects.delete(COMPUTE_DOMAINS, "job", namespace=NS)
    assert _names(mem, COMPUTE_DOMAINS) == [(NS, "job")]  # held by the finalizer
    cdkit.reconcile(mem)
    cdkit.reconcile(mem)
    assert _everything(mem) == []


def test_a_domain_deleted_while_no_controller_ran_is_cleaned_up_by_the_next() -> None:
    mem = cdkit.cluster()
    cdkit.domain(mem)
    mem.objects.delete(COMPUTE_DOMAINS, "job", namespace=NS)  # the controller is down
    cdkit.reconcile(mem)  # a new one starts
    cdkit.reconcile(mem)
    assert _everything(mem) == []


def test_objects_whose_domain_vanished_without_the_finalizer_are_swept() -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem)
    gone = {**dom, "metadata": {**dom["metadata"], "finalizers": []}}
    mem.objects.update(COMPUTE_DOMAINS, gone)  # someone removed the finalizer by hand
    mem.objects.delete(COMPUTE_DOMAINS, "job", namespace=NS)
    assert _names(mem, DAEMON_SETS)  # not garbage collected: another namespace
    cdkit.reconcile(mem)
    assert _everything(mem) == []


def test_a_controller_restarted_half_way_finishes_the_job() -> None:
    mem = cdkit.cluster()
    obj = {
        "apiVersion": cd.API_VERSION,
        "kind": "ComputeDomain",
        "metadata": {"name": "job", "namespace": NS},
        "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}},
    }
    mem.objects.create(COMPUTE_DOMAINS, obj)
    mem.fail_next("create_daemonsets", 500)
    first = cdkit.control(mem)
    first.reconcile_all()  # died after the templates
    assert (
        first.metrics.registry.get_sample_value(
            "dra_driver_compute_domain_reconciles_total", {"result": "error"}
        )
        == 1
    )
    assert _names(mem, DAEMON_SETS) == []
    cdkit.reconcile(mem)  # the restarted one
    assert len(_names(mem, DAEMON_SETS)) == 1 and len(_names(mem, RESOURCE_CLAIM_TEMPLATES)) == 2
    mem.objects.delete(COMPUTE_DOMAINS, "job", namespace=NS)
    mem.fail_next("delete_resourceclaimtemplates", 500)
    cdkit.reconcile(mem)  # deleting, died half-way
    assert _names(mem, COMPUTE_DOMAINS) == [(NS, "job")]
    cdkit.reconcile(mem)
    cdkit.reconcile(mem)
    assert _everything(mem) == []


def test_a_foreign_template_of_that_name_is_left_alone_and_an_outdated_one_replaced() -> None:
    mem = cdkit.cluster()
    mem.objects.create(
        RESOURCE_CLAIM_TEMPLATES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "job-channel", "namespace": NS},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        ]
                    }
                }
            },
        },
    )
    dom = cdkit.domain(mem)
    theirs = mem.objects.get(RESOURCE_CLAIM_TEMPLATES, "job-channel", namespace=NS)
    assert "ownerReferences" not in theirs["metadata"]
    assert dom["status"]["status"] == "NotReady"  # the rest is reconciled
    daemon = mem.objects.get(
        RESOURCE_CLAIM_TEMPLATES, f"imex-{dom['metadata']['uid']}", namespace=DRIVER_NS
    )
    daemon["metadata"]["annotations"][controller.HASH] = "stale"
    mem.objects.update(RESOURCE_CLAIM_TEMPLATES, daemon)
    cdkit.reconcile(mem)  # deleted (a template's spec is immutable) ...
    cdkit.reconcile(mem)  # ... and made anew
    fresh = mem.objects.get(
        RESOURCE_CLAIM_TEMPLATES, f"imex-{dom['metadata']['uid']}", namespace=DRIVER_NS
    )
    assert fresh["metadata"]["uid"] != daemon["metadata"]["uid"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _elector(mem: memory.InMemoryApi, name: str, clock: Clock) -> leader.LeaderElector:
    return leader.LeaderElector(
        mem.objects,
        namespace=DRIVER_NS,
        name="lease",
        identity=name,
        log=cdkit.LOG,
        lease_s=15,
        clock=clock,
    )


def test_two_candidates_one_leader_and_a_takeover_only_after_the_lease_expires() -> None:
    mem = cdkit.cluster()
    clock = Clock()
    a, b = _elector(mem, "a", clock), _elector(mem, "b", clock)
    assert a.step() and not b.step()
    clock.now += 10
    assert a.step() and not b.step()  # renewed
    clock.now += 14  # a stops renewing: b has seen the same record for 14 s
    assert not b.step()
    clock.now += 2
    assert b.step() and not a.is_leader()
    lease = mem.objects.get(LEASES, "lease", namespace=DRIVER_NS)
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert not a.step()  # a comes back: b's lease is fresh
    b.release()
    assert a.step()  # released: no need to wait it out


def test_racing_candidates_the_write_conflict_decides() -> None:
    mem = cdkit.cluster()
    clock = Clock()
    first = _elector(mem, "first", clock)
    first.step()
    first.release()  # free for the taking
    free = mem.objects.get(LEASES, "lease", namespace=DRIVER_NS)

    class Stale:  # b read the free lease just before a took it
        def __getattr__(self, name: str) -> object:
            return getattr(mem.objects, name)

        def get(self, *args: object, **kwargs: object) -> api.Obj:
            return free

    a = _elector(mem, "a", clock)
    b = leader.LeaderElector(
        cast(ObjectApi, Stale()),
        namespace=DRIVER_NS,
        name="lease",
        identity="b",
        log=cdkit.LOG,
        clock=clock,
    )
    assert a.step() is True
    assert b.step() is False and not b.is_leader()
    assert mem.objects.get(LEASES, "lease", namespace=DRIVER_NS)["spec"]["holderIdentity"] == "a"


def test_two_running_controllers_only_the_leader_reconciles() -> None:
    mem = cdkit.cluster()
    stop = threading.Event()
    loops = []
    for name in ("one", "two"):
        elector = leader.LeaderElector(
            mem.objects,
            namespace=DRIVER_NS,
            name=controlloop.LEASE_NAME,
            identity=name,
            log=cdkit.LOG,
            lease_s=2,
        )
        ctl = controller.Controller(
            mem.objects, settings=manifests.Settings(namespace=DRIVER_NS), log=cdkit.LOG
        )
        loops.append(
            controlloop.ControlLoop(
                objects=mem.objects,
                controller=ctl,
                elector=elector,
                log=cdkit.LOG,
                resync_s=0.2,
                renew_s=0.2,
            )
        )
    threads = [threading.Thread(target=loop.run, args=(stop,)) for loop in loops]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(loop.rounds for loop in loops):
            time.sleep(0.05)
        cdkit.domain(mem, num_nodes=1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not _names(mem, DAEMON_SETS):
            time.sleep(0.05)
        assert _names(mem, DAEMON_SETS)
        leaders = [loop for loop in loops if loop.elector.is_leader()]
        assert len(leaders) == 1
        follower = next(loop for loop in loops if loop is not leaders[0])
        assert follower.rounds == 0
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("value", ["", "bad"])
def test_controller_cli_refuses_missing_namespace(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dra_driver import cli

    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    argv = ["controller", "--renew-interval", "20"] + (["--namespace", value] if value else [])
    assert cli.main(argv) == 2
