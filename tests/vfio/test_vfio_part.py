"""Passthrough on the fake kernel: a GPU goes to vfio-pci for a claim and back, refusals change
nothing, and a crash before any sysfs write or journal write of a prepare or an unprepare is
finished or undone by the next start (no GPU left on vfio-pci without a prepared claim)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from dra_driver.devices import fake, model, passthrough, vfiohost
from dra_driver.driver import atomicfile, checkpoint, claims, vfio
from dra_driver.testing import fakesysfs

LOG = structlog.get_logger()
REF = claims.ClaimRef(uid="11111111-2222-3333-4444-555555555555", namespace="vm", name="gpu")
CRASHED = 86


def node_of(profile: str) -> model.NodeDevices:
    return passthrough.mark(
        fake.FakeBackend.from_name(profile).discover(), passthrough.Passthrough.parse("all")
    )


@pytest.fixture
def dgx(tmp_path: Path) -> Iterator[tuple[fakesysfs.FakeKernel, model.NodeDevices]]:
    devices = node_of("pcie-l4")
    with fakesysfs.running(tmp_path / "host", fakesysfs.groups_of(devices)) as kernel:
        yield kernel, devices


def part(
    kernel: fakesysfs.FakeKernel,
    devices: model.NodeDevices,
    processes: Callable[[str], list[int]] | None = None,
) -> vfio.VfioPart:
    return vfio.VfioPart(
        host=vfiohost.VfioHost(kernel.root, wait_s=0.5),
        directory=kernel.root / "plugin" / "vfio",
        node=devices,
        processes=processes,
        log=LOG,
    )


def record(state: str, device: str = "gpu-vfio-0") -> checkpoint.ClaimRecord:
    dev = checkpoint.DeviceRecord(
        requestNames=("vm",), poolName="n1", deviceName=device, cdiDeviceIds=()
    )
    return checkpoint.ClaimRecord(
        uid=REF.uid, namespace=REF.namespace, name=REF.name, state=state,  # type: ignore[arg-type]
        bootId="b", devices=(dev,), cdiSpec={},
    )  # fmt: skip


def clean(kernel: fakesysfs.FakeKernel, bdf: str) -> bool:
    """Back on nvidia with nothing of ours left."""
    return (
        kernel.driver_of(bdf) == "nvidia"
        and (kernel.device(bdf) / "driver_override").read_text().strip() == ""
        and not (kernel.root / "plugin" / "vfio" / f"{bdf}.json").exists()
    )


def test_prepare_binds_to_vfio_and_unprepare_gives_it_back(dgx: Any) -> None:
    kernel, devices = dgx
    p = part(kernel, devices)
    [target] = p.targets(["gpu-vfio-0"])
    nodes = p.apply(REF, [target])
    bdf = devices.gpus[0].pci_bus_id
    assert kernel.driver_of(bdf) == "vfio-pci"
    assert nodes == {"gpu-vfio-0": (f"/dev/vfio/{devices.gpus[0].iommu_group}", "/dev/vfio/vfio")}
    assert p.passed_through() == {devices.gpus[0].uuid}
    assert kernel.driver_of(devices.gpus[1].pci_bus_id) == "nvidia"
    p.release(REF, [target])
    assert clean(kernel, bdf)
    assert p.passed_through() == frozenset()
    p.release(REF, [target])  # idempotent


def test_iommufd_nodes(tmp_path: Path) -> None:
    devices = node_of("pcie-l4")
    with fakesysfs.running(tmp_path, fakesysfs.groups_of(devices), iommufd=True) as kernel:
        p = part(kernel, devices)
        nodes = p.apply(REF, p.targets(["gpu-vfio-2"]))
        assert nodes == {"gpu-vfio-2": ("/dev/vfio/devices/vfio0", "/dev/iommu")}


def test_the_fake_kernel_makes_the_vfio_nodes_before_it_links_the_driver(tmp_path: Path) -> None:
    """As vfio-pci's probe does: whoever sees the driver link sees the nodes. The other order
    let ``wait_nodes`` see the group node without the cdev yet and answer the legacy nodes
    (once, test_iommufd_nodes in a clone-alone run)."""
    devices = node_of("pcie-l4")
    with fakesysfs.running(tmp_path, fakesysfs.groups_of(devices), iommufd=True) as kernel:
        at_link: list[tuple[bool, list[str]]] = []
        link = kernel._link

        def observed(bdf: str, driver: str) -> None:
            if driver == "vfio-pci":
                vdev = kernel.device(bdf) / "vfio-dev"
                group = kernel.root / "dev" / "vfio" / str(kernel.groups[bdf])
                at_link.append((group.exists(), sorted(os.listdir(vdev))))
            link(bdf, driver)

        kernel._link = observed  # type: ignore[method-assign]
        p = part(kernel, devices)
        p.apply(REF, p.targets(["gpu-vfio-2"]))
        assert at_link == [(True, ["vfio0"])]


def test_a_gpu_sharing_its_iommu_group_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    devices = node_of("pcie-l4-shared-iommu")
    with fakesysfs.running(tmp_path, fakesysfs.groups_of(devices)) as kernel:
        p = part(kernel, devices)
        with pytest.raises(vfio.VfioError) as err:
            p.apply(REF, p.targets(["gpu-vfio-0"]))
        assert "IOMMU group 20 also holds 0000:02:00.0" in str(err.value)
        assert str(REF) in str(err.value)
        assert clean(kernel, "0000:01:00.0") and kernel.events == []
        assert p.apply(REF, p.targets(["gpu-vfio-2"]))  # a GPU alone in its group is fine


def test_a_gpu_with_processes_is_refused_naming_them(dgx: Any) -> None:
    kernel, devices = dgx
    p = part(kernel, devices, processes=lambda uuid: [4242, 4343])
    with pytest.raises(
        vfio.VfioError, match=r"gpu-0 \(0000:01:00.0\) is in use by process\(es\) 4242, 4343"
    ):
        p.apply(REF, p.targets(["gpu-vfio-0"]))
    assert clean(kernel, devices.gpus[0].pci_bus_id) and kernel.events == []


def test_ebusy_unbind_gives_one_line_naming_the_gpu_and_nothing_half_done(dgx: Any) -> None:
    kernel, devices = dgx
    bdf = devices.gpus[0].pci_bus_id
    kernel.hold(bdf, [777])
    seen = iter([[], [777]])  # NVML saw nothing at the check, the process at the unbind
    p = part(kernel, devices, processes=lambda uuid: next(seen))
    with pytest.raises(vfio.VfioError) as err:
        p.apply(REF, p.targets(["gpu-vfio-0"]))
    line = str(err.value)
    assert "\n" not in line and bdf in line and "777" in line and "EBUSY" in line
    assert clean(kernel, bdf)
    assert p.passed_through() == frozenset()


def test_a_bind_whose_node_never_appears_is_undone(dgx: Any) -> None:
    kernel, devices = dgx
    bdf = devices.gpus[1].pci_bus_id
    kernel.no_node(bdf)
    p = part(kernel, devices)
    with pytest.raises(
        vfio.VfioError, match=f"/dev/vfio/{devices.gpus[1].iommu_group} did not appear"
    ):
        p.apply(REF, p.targets(["gpu-vfio-1"]))
    assert clean(kernel, bdf)


def test_a_gpu_on_vfio_without_journal_is_given_back_at_start(dgx: Any) -> None:
    kernel, devices = dgx
    host = vfiohost.VfioHost(kernel.root, wait_s=0.5)
    bdf = devices.gpus[3].pci_bus_id
    host.unbind(bdf)
    host.set_override(bdf, "vfio-pci")
    host.bind(bdf, "vfio-pci")
    assert part(kernel, devices).recover([]) == set()
    assert clean(kernel, bdf)


def _crashing(crash_at: int, work: Callable[[], None]) -> int:
    """Run ``work`` in a child that dies before its ``crash_at``-th sysfs or journal write."""
    pid = os.fork()
    if pid == 0:
        count = [0]
        real_attr, real_bytes = vfiohost.write_attribute, atomicfile.write_bytes

        def gate() -> None:
            if count[0] == crash_at:
                os._exit(CRASHED)
            count[0] += 1

        def attr(path: Path, text: str) -> None:
            gate()
            real_attr(path, text)

        def journal(*args: Any, **kwargs: Any) -> None:
            gate()
            real_bytes(*args, **kwargs)

        vfiohost.write_attribute = attr  # type: ignore[assignment]
        atomicfile.write_bytes = journal  # type: ignore[assignment]
        try:
            work()
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_killed_at_every_step_of_prepare_the_next_start_undoes_it(dgx: Any) -> None:
    kernel, devices = dgx
    bdf = devices.gpus[0].pci_bus_id
    steps = 0
    while True:
        code = _crashing(
            steps,
            lambda: part(kernel, devices).apply(REF, part(kernel, devices).targets(["gpu-vfio-0"])),
        )
        # The claim record is still PrepareStarted: a restart rolls the claim back.
        assert part(kernel, devices).recover([record(checkpoint.PREPARE_STARTED)]) == set()
        assert clean(kernel, bdf), (steps, kernel.events[-4:])
        if code == 0:
            break
        assert code == CRASHED
        steps += 1
    assert steps == 5  # journal, unbind, override, bind, journal


def test_killed_at_every_step_of_unprepare_the_claim_stays_prepared_or_is_finished(
    dgx: Any,
) -> None:
    kernel, devices = dgx
    bdf = devices.gpus[0].pci_bus_id
    steps = 0
    while True:
        p = part(kernel, devices)
        p.apply(REF, p.targets(["gpu-vfio-0"]))
        code = _crashing(
            steps,
            lambda: part(kernel, devices).release(
                REF, part(kernel, devices).targets(["gpu-vfio-0"])
            ),
        )
        fresh = part(kernel, devices)
        unprepared = fresh.recover([record(checkpoint.PREPARE_COMPLETED)])
        if unprepared:  # the release had begun: finished, the caller rolls the claim back
            assert unprepared == {REF.uid} and clean(kernel, bdf)
        else:  # the release had not begun (or was done): either way consistent
            assert (kernel.driver_of(bdf) == "vfio-pci" and fresh.passed_through()) or clean(
                kernel, bdf
            )
        fresh.release(REF, fresh.targets(["gpu-vfio-0"]))
        assert clean(kernel, bdf)
        if code == 0:
            break
        assert code == CRASHED
        steps += 1
    assert steps == 4  # journal, unbind, override clear, bind


def test_a_prepared_claim_keeps_its_gpu_across_a_restart(dgx: Any) -> None:
    kernel, devices = dgx
    p = part(kernel, devices)
    p.apply(REF, p.targets(["gpu-vfio-0"]))
    fresh = part(kernel, devices)
    assert fresh.recover([record(checkpoint.PREPARE_COMPLETED)]) == set()
    assert kernel.driver_of(devices.gpus[0].pci_bus_id) == "vfio-pci"
    assert fresh.passed_through() == {devices.gpus[0].uuid}
