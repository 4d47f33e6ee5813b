"""HostSysfs over a real directory tree laid out like /sys, and the backend reading it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_driver.devices import nvml, sysfs
from dra_driver.devices.fake import fakenvml, profiles


def make_sys(root: Path, bus_id: str, chain: list[str], numa: str | None) -> None:
    """``root/devices/<chain...>/<bus_id>`` plus the ``bus/pci/devices`` symlink to it."""
    device = root.joinpath("devices", *chain, bus_id)
    device.mkdir(parents=True)
    if numa is not None:
        (device / "numa_node").write_text(numa + "\n")
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    (links / bus_id).symlink_to(device)


def test_pcie_root_and_numa_node(tmp_path: Path) -> None:
    make_sys(tmp_path, "0000:18:00.0", ["pci0000:15", "0000:15:01.0", "0000:16:00.0"], "1")
    make_sys(tmp_path, "0000:3a:00.0", ["pci0000:37", "0000:37:01.0"], "-1")
    make_sys(tmp_path, "0000:5d:00.0", ["pci0000:5c"], "garbage")
    host = sysfs.HostSysfs(root=tmp_path)
    assert host.pcie_root("0000:18:00.0") == "pci0000:15"
    assert host.numa_node("0000:18:00.0") == 1
    assert host.pcie_root("0000:3a:00.0") == "pci0000:37"
    assert host.numa_node("0000:3a:00.0") is None  # platform without NUMA reports -1
    assert host.numa_node("0000:5d:00.0") is None
    assert host.pcie_root("0000:99:00.0") is None
    assert host.numa_node("0000:99:00.0") is None


def test_backend_falls_back_to_sysfs_for_numa(tmp_path: Path) -> None:
    prof = profiles.load_builtin("h100-nvl-pairs")
    for gpu, numa in zip(prof.gpus, ["0", "0", "1", "-1"], strict=True):
        bus = nvml.sysfs_bus_id(gpu.pci_bus_id)
        make_sys(tmp_path, bus, [f"pci0000:{bus[5:7]}", f"0000:{bus[5:7]}:01.0"], numa)

    def no_numa(_handle: Any) -> int:
        raise nvml.NVMLError_NotSupported()

    fake = fakenvml.FakeNvml(prof, overrides={"nvmlDeviceGetNumaNodeId": no_numa})
    backend = nvml.PynvmlBackend.create(nvml=fake, sysfs=sysfs.HostSysfs(root=tmp_path))
    devices = backend.discover()
    assert [g.numa_node for g in devices.gpus] == [0, 0, 1, None]
    assert [g.pcie_root for g in devices.gpus] == [
        "pci0000:17", "pci0000:31", "pci0000:b1", "pci0000:ca",
    ]  # fmt: skip
    backend.close()


def test_machine_type_from_dmi(tmp_path: Path) -> None:
    host = sysfs.HostSysfs(root=tmp_path)
    assert host.machine_type() is None  # no DMI (a VM without it, a container without /sys)
    dmi = tmp_path / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "product_name").write_text("   \n")
    assert host.machine_type() is None
    (dmi / "product_name").write_text("DGX H100\n")
    assert host.machine_type() == "DGX H100"
    prof = profiles.load_builtin("pcie-l4")
    backend = nvml.PynvmlBackend.create(nvml=fakenvml.FakeNvml(prof), sysfs=host)
    assert backend.discover().machine_type == "DGX H100"  # the host's, not the profile's
