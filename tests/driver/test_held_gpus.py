"""The node agent's set ranks follow the claims it prepares, wired as ``app.run`` wires them: the
real claim state over real checkpoint files tells a held-GPU board, and the node publisher over
an in-memory API re-publishes from it. A claim of four GPUs moves rank 1 to the other four and
its unprepare moves it back; a restarted agent publishes its checkpointed claims' ranks from its
first write; a batch of claims is a few slice writes; what each kind of device holds."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dra_driver import app, logs
from dra_driver.devices import fake, health, holdings
from dra_driver.driver import checkpoint, inventory, recovery
from dra_driver.slices import build, nodepublisher
from dra_driver.testing.fakeapi import memory

from .conftest import DRIVER, NODE, Node, claim_obj, new_uid

QUAD = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")
Obj = dict[str, Any]


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def ranks(api: memory.InMemoryApi, size: int) -> dict[str, int]:
    slices = api.list_resource_slices(driver=DRIVER, node_name=NODE)[0]
    return {
        d["name"]: d["attributes"]["setRanks"]["int"] // 10 ** (size - 1) % 10
        for s in slices
        for d in s["spec"].get("devices") or ()
        if "setRanks" in d["attributes"]
    }


def expected(profile: str, size: int, taken: tuple[str, ...] = ()) -> dict[str, int]:
    devices = fake.FakeBackend.from_name(profile).discover()
    slices = build.build(devices, node_name=NODE, driver_name=DRIVER, taken=taken).slices
    return {
        d["name"]: d["attributes"]["setRanks"]["int"] // 10 ** (size - 1) % 10
        for s in slices
        for d in s["spec"].get("devices") or ()
        if "setRanks" in d["attributes"]
    }


@dataclasses.dataclass
class Agent:
    node: Node
    held: holdings.HeldGpus
    api: memory.InMemoryApi  # where the slices go
    publisher: nodepublisher.NodePublisher

    def stop(self) -> None:
        self.publisher.stop()
        self.node.driver.close()


@pytest.fixture
def start_agent() -> Iterator[Callable[..., Agent]]:
    started: list[Agent] = []

    def start(node: Node, api: memory.InMemoryApi | None = None, *, go: bool = True) -> Agent:
        """``node``'s claim state rebuilt from its directories (recovered) and its publisher;
        ``go=False``: the publisher not started (its first pass is the caller's)."""
        api = api or node.api
        api.put_node(NODE, uid="uid-n1")  # the same Node each time: the slices' owner
        devices = fake.FakeBackend.from_name(node.profile).discover()
        held = holdings.HeldGpus()
        node.driver.close()
        node.driver = app.build_driver(
            node.settings, devices=devices, api=node.api, log=logs.get("test"), held_gpus=held
        )
        settings = dataclasses.replace(node.settings, publish=True)
        if go:
            publisher = app.start_publisher(
                settings, devices=devices, api=api, log=logs.get("test"), held=held
            )
        else:
            publisher = nodepublisher.NodePublisher(
                driver_name=DRIVER,
                node_name=NODE,
                devices=devices,
                api=api,
                lock_file=settings.plugin_dir / "publisher.lock",
                grace_s=60.0,
                watch_timeout_s=30.0,
                log=logs.get("test"),
                board=health.HealthBoard(),
                held=held,
            )
        assert publisher is not None
        agent = Agent(node=node, held=held, api=api, publisher=publisher)
        started.append(agent)
        if go:
            wait_for(publisher.publisher.synced.is_set)
        return agent

    yield start
    for agent in started:
        agent.publisher.stop()


def prepare(node: Node, *devices: str, results: list[Obj] | None = None) -> str:
    uid = new_uid()
    ref = node.add(claim_obj(name=f"c-{uid[:8]}", uid=uid, devices=list(devices), results=results))
    result = node.driver.prepare([ref])[ref.uid]
    assert result.error == ""
    return ref.uid


def test_a_prepared_claim_of_four_gpus_moves_rank_one_and_its_unprepare_moves_it_back(
    node: Node, start_agent: Callable[..., Agent]
) -> None:
    agent = start_agent(node)
    free = expected("dgx-h100", 4)
    assert ranks(agent.api, 4) == free and free["gpu-0"] == 1 and free["gpu-4"] == 2
    ref = node.add(claim_obj(name="quad", uid=new_uid(), devices=list(QUAD)))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    assert agent.held.snapshot().held == frozenset(QUAD)  # marked at once, published later
    wait_for(lambda: ranks(agent.api, 4) != free, timeout=2.0)
    assert ranks(agent.api, 4) == {
        **{g: 0 for g in QUAD},
        **{f"gpu-{i}": 1 for i in range(4, 8)},
    }
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert agent.held.snapshot().held == frozenset()
    wait_for(lambda: ranks(agent.api, 4) == free, timeout=2.0)


def test_a_restarted_agent_publishes_its_checkpointed_claims_ranks_from_its_first_write(
    node: Node, start_agent: Callable[..., Agent]
) -> None:
    first = start_agent(node)
    prepare(node, *QUAD)
    held = expected("dgx-h100", 4, QUAD)
    wait_for(lambda: ranks(first.api, 4) == held, timeout=2.0)
    first.stop()  # the agent goes away; its claim stays prepared (checkpoint, CDI spec)

    # Restarted against the same API: the slices are already right, nothing is written.
    writes = first.api.writes
    again = start_agent(node)
    assert again.held.snapshot().held == frozenset(QUAD)  # recovered from the checkpoint
    assert ranks(again.api, 4) == held and again.api.writes == writes
    again.stop()

    # Restarted where the slices are gone: the very first write carries the ranks.
    fresh = memory.InMemoryApi()
    third = start_agent(node, fresh, go=False)
    third.publisher.publisher.reconcile_once()
    assert fresh.writes == 1 and ranks(fresh, 4) == held


def test_a_batch_of_claims_prepared_and_unprepared_at_once_is_a_few_slice_writes(
    node_factory: Callable[..., Node],
    start_agent: Callable[..., Agent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = node_factory("hgx-16-mesh")
    agent = start_agent(node)
    gpus = [f"gpu-{i}" for i in range(12)]
    refs = [node.add(claim_obj(name=g, uid=new_uid(), devices=[g])) for g in gpus]
    writes = agent.api.writes
    # 12 prepares in one kubelet call, prepared in parallel, then their 12 unprepares. The
    # claims' GETs take 0 to 88 ms, so the prepares finish one after the other, as they do.
    get = node.api.get_resource_claim
    delay = {ref.name: i * 0.008 for i, ref in enumerate(refs)}

    def slow_get(namespace: str, name: str) -> Obj:
        time.sleep(delay[name])
        return get(namespace, name)

    monkeypatch.setattr(node.api, "get_resource_claim", slow_get)
    results = node.driver.prepare(refs)
    assert [r.error for r in results.values()] == [""] * len(refs)
    assert agent.held.snapshot().held == frozenset(gpus)
    taken = expected("hgx-16-mesh", 2, tuple(gpus))
    wait_for(lambda: ranks(agent.api, 2) == taken, timeout=3.0)
    wait_for(agent.publisher.publisher.synced.is_set)
    assert 1 <= agent.api.writes - writes <= 3
    assert ranks(agent.api, 3) == expected("hgx-16-mesh", 3, tuple(gpus))

    writes = agent.api.writes
    assert set(node.driver.unprepare(refs).values()) == {""}
    free = expected("hgx-16-mesh", 2)
    wait_for(lambda: ranks(agent.api, 2) == free, timeout=3.0)
    wait_for(agent.publisher.publisher.synced.is_set)
    assert 1 <= agent.api.writes - writes <= 3
    assert agent.publisher.follower is not None
    assert agent.publisher.follower.rebuilds <= 4  # for 24 claim operations


def test_what_each_kind_of_claim_holds(
    node: Node, node_factory: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    held = node.driver.state.held
    a_set = prepare(node, "gpus-4-5-6-7")  # an old GPU-set device: every member
    assert held.snapshot().held == {"gpu-4", "gpu-5", "gpu-6", "gpu-7"}
    admin = [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0", "adminAccess": True}
    ]
    prepare(node, results=admin)  # admin access: the GPU stays free for others
    assert held.snapshot().held == {"gpu-4", "gpu-5", "gpu-6", "gpu-7"}

    def full_disk(uid: str, spec: object, text: str | None = None) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(node.driver.state.specs, "write", full_disk)
    failed = node.add(claim_obj(name="failed", uid=new_uid(), devices=["gpu-1"]))
    assert "No space left" in node.driver.prepare([failed])[failed.uid].error
    assert held.snapshot().held == {"gpu-4", "gpu-5", "gpu-6", "gpu-7"}  # rolled back
    monkeypatch.undo()
    set_ref = next(r for r in node.driver.state.prepared_claims() if r.uid == a_set)
    assert node.driver.unprepare([set_ref]) == {a_set: ""}
    assert held.snapshot().held == frozenset()  # the admin claim holds nothing

    mig_node = node_factory("a100-mig")
    name = next(n for n, d in mig_node.driver.state.devices.devices.items() if d.kind == "mig")
    prepare(mig_node, name)  # a MIG device: its parent GPU
    parent = mig_node.driver.state.devices.devices[name].parent_minor
    assert mig_node.driver.state.held.snapshot().held == {f"gpu-{parent}"}

    share = checkpoint.DeviceRecord(
        requestNames=("gpu",), poolName=NODE, deviceName="gpu-2", cdiDeviceIds=(), shareId="s-1"
    )
    record = checkpoint.ClaimRecord(
        uid="u-1", namespace="ns", name="n", state=checkpoint.PREPARE_COMPLETED, bootId="b",
        devices=(share,), cdiSpec={},
    )  # fmt: skip
    devices = node.driver.state.devices
    assert isinstance(devices, inventory.Inventory)
    assert recovery.held_by(record, devices) == {"gpu-2"}  # a share holds its GPU


def test_claims_another_instance_prepared_are_held_after_the_periodic_clean_up(
    node: Node, start_agent: Callable[..., Agent]
) -> None:
    """A seamless upgrade: the kubelet prepares through the new instance while the old one
    publishes. The publisher's clean-up pass re-reads the shared checkpoint and re-ranks."""
    node.settings = dataclasses.replace(node.settings, pod_uid="old-pod")
    agent = start_agent(node)
    free = expected("dgx-h100", 4)
    devices = fake.FakeBackend.from_name(node.profile).discover()
    other = app.build_driver(
        dataclasses.replace(node.settings, pod_uid="new-pod"),
        devices=devices,
        api=node.api,
        log=logs.get("test"),
        held_gpus=holdings.HeldGpus(),
    )
    try:
        ref = node.add(claim_obj(name="quad", uid=new_uid(), devices=list(QUAD)))
        assert other.prepare([ref])[ref.uid].error == ""
        assert agent.held.snapshot().held == frozenset()  # the publisher has not seen it
        assert agent.node.driver.cleanup() == []
        assert agent.held.snapshot().held == frozenset(QUAD)
        wait_for(lambda: ranks(agent.api, 4) == expected("dgx-h100", 4, QUAD), timeout=2.0)
        assert other.unprepare([ref]) == {ref.uid: ""}
        agent.node.driver.cleanup()
        assert agent.held.snapshot().held == frozenset()
        wait_for(lambda: ranks(agent.api, 4) == free, timeout=2.0)
    finally:
        other.close()


def test_refresh_keeps_what_a_claim_being_prepared_here_holds(node: Node) -> None:
    """A claim whose record is not completed yet (prepare in flight in this instance) keeps
    its GPUs; a claim with no record at all loses them."""
    state = node.driver.state
    uid = prepare(node, "gpu-5")
    assert state.held.snapshot().held == frozenset({"gpu-5"})
    record = next(r for r in state.store.records() if r.uid == uid)
    state.store.put(dataclasses.replace(record, state=checkpoint.PREPARE_STARTED))
    state.held.hold("no-record", ["gpu-6"])
    assert recovery.refresh_held(state) is True
    assert state.held.claims() == {uid: frozenset({"gpu-5"})}
