"""Rediscovery's comparison: GPUs matched by UUID and PCI address, hidden GPUs never vanished."""

from __future__ import annotations

from dra_driver.devices import rediscovery
from dra_driver.devices.fake import FakeBackend


def test_same_node_means_no_change() -> None:
    node = FakeBackend.from_name("dgx-h100")
    assert not rediscovery.compare(node.discover(), node.discover()).any


def test_a_new_driver_version_changes_every_gpu() -> None:
    node = FakeBackend.from_name("dgx-h100")
    before = node.discover()
    node.nvml.load(driver_version="590.10.01")
    changes = rediscovery.compare(before, node.discover())
    assert changes.driver_version == ("580.95.05", "590.10.01")
    assert len(changes.changed) == 8 and not changes.vanished and not changes.added


def test_removed_and_added_gpus_and_renumbering_alone_is_no_change() -> None:
    node = FakeBackend.from_name("pcie-l4")
    before = node.discover()
    gone = node.nvml.remove_gpu(0)
    changes = rediscovery.compare(before, node.discover())
    assert [g.uuid for g in changes.vanished] == [gone]
    assert not changes.added and not changes.changed  # the others were only renumbered
    _, new = node.nvml.add_gpu()
    changes = rediscovery.compare(before, node.discover())
    assert [g.uuid for g in changes.added] == [new]


def test_a_replaced_gpu_is_vanished_plus_added_never_the_same() -> None:
    node = FakeBackend.from_name("pcie-l4")
    before = node.discover()
    old = before.gpus[0]
    node.nvml.remove_gpu(0)
    node.nvml.add_gpu(uuid="GPU-11111111-2222-3333-4444-555555555555", pci_bus_id=old.pci_bus_id)
    changes = rediscovery.compare(before, node.discover())
    assert [g.uuid for g in changes.vanished] == [old.uuid]
    assert [(o.uuid, n.uuid) for o, n in changes.replaced] == [
        (old.uuid, "GPU-11111111-2222-3333-4444-555555555555")
    ]


def test_a_gpu_hidden_on_purpose_is_not_vanished_and_stays_known() -> None:
    node = FakeBackend.from_name("pcie-l4")
    before = node.discover()
    gone = node.nvml.remove_gpu(1)
    now = node.discover()
    changes = rediscovery.compare(before, now, hidden=lambda uuid: uuid == gone)
    assert not changes.vanished and [g.uuid for g in changes.hidden] == [gone]
    assert gone in {g.uuid for g in rediscovery.merged(before, now, changes).gpus}
    assert not rediscovery.vanished(gone, hidden=lambda uuid: uuid == gone)
    assert rediscovery.vanished(gone)
