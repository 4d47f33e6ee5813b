"""An honest stand-in for the ``pynvml`` module, answering NVML calls from a topology profile.

The fake backend runs the real discovery code (:class:`~dra_driver.devices.nvml.PynvmlBackend`)
over this object, so laptops, CI and tests exercise the same code path as a GPU node. It offers
exactly the functions the backend calls, returns pynvml's own struct types, and raises pynvml's
own exception classes (re-exported by :mod:`dra_driver.devices.nvml`; this module never imports
pynvml) where real NVML would: NotSupported for NVLink on cards without it, fabric info on GPUs
outside a multi-node fabric, a NUMA id the profile does not give, MIG on GPUs that are neither in
MIG mode (``mig``) nor MIG-capable (``migCapable``).
Tests inject failures: an init error, a failing GPU, a failing call, or any function replaced.
Run-time GPU failures (NVML events, lost GPUs, ...) are the mixin :mod:`.fakefaults`.
"""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dra_driver import records
from dra_driver.devices import nvml
from dra_driver.devices.fake import fakefaults, fakelifecycle, fakemig, fakemigdev, profiles

Failure = Exception | type[Exception]
_UNKNOWN_ARCH = 0xFFFFFFFF
_NO_TELEMETRY = profiles.Telemetry()


@records.record
class _Device:
    index: int
    pos: int
    uuid: str = ""  # the GPU looked up: the handle follows it when others come and go


def _raise(failure: Failure) -> None:
    raise failure() if isinstance(failure, type) else failure


def _nvml_bus_id(bus_id: str) -> str:
    """Any bus id → NVML's ``00000000:17:00.0`` form (8-digit domain, upper case)."""
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


def _reverse(names: Mapping[int, str], what: str, value: str, source: str) -> int:
    lookup = {name.lower(): code for code, name in names.items()}
    try:
        return lookup[value.lower()]
    except KeyError:
        known = ", ".join(sorted(set(names.values())))
        raise profiles.ProfileError(
            f"profile {source}: unknown {what} {value!r}; NVML knows: {known}"
        ) from None


class FakeNvml(fakemigdev.FakeMigDevices, fakefaults.FakeHealth, fakelifecycle.FakeDriverLifecycle):
    """A pynvml look-alike for one profile; pass it to ``PynvmlBackend.create(nvml=...)``.

    ``init_error`` makes ``nvmlInit`` fail (e.g. ``nvml.NVMLError_LibraryNotFound``); ``fail``
    makes every call about a GPU index raise; ``fail_calls`` makes one function raise for one
    GPU index; ``overrides`` replaces functions by name. The MIG functions
    (:mod:`~dra_driver.devices.fake.fakemig`) keep their state in ``mig_state_file`` when given, so
    instances outlive the process as on a real card.
    """

    def __init__(
        self,
        profile: profiles.Profile,
        *,
        init_error: Failure | None = None,
        fail: Mapping[int, Failure] | None = None,
        fail_calls: Mapping[tuple[int, str], Failure] | None = None,
        overrides: Mapping[str, Callable[..., Any]] | None = None,
        mig_state_file: Path | None = None,
    ) -> None:
        self.profile = profile
        self.init_error = init_error
        self.fail = dict(fail or {})
        self.fail_calls = dict(fail_calls or {})
        self._inits = 0
        self._pos = {profile.gpu_index(p): p for p in range(len(profile.gpus))}
        self._init_health(len(profile.gpus))
        self._init_lifecycle()
        self._bus = [_nvml_bus_id(g.pci_bus_id) for g in profile.gpus]
        self._init_mig()
        if mig_state_file is not None:
            self.mig_state.use_file(mig_state_file)
        self._links = [self._link_table(p) for p in range(len(profile.gpus))]
        self._brand = [
            _reverse(nvml.BRAND_NAMES, "brand", profile.resolved(p, "brand"), profile.name)
            for p in range(len(profile.gpus))
        ]
        self._arch = [
            _reverse(
                nvml.ARCH_NAMES, "architecture", profile.resolved(p, "architecture"), profile.name
            )
            for p in range(len(profile.gpus))
        ]
        for p in range(len(profile.gpus)):
            fabric = profile.resolved(p, "fabric")
            if fabric is not None:
                _reverse(nvml.FABRIC_STATES, "fabric state", fabric.state, profile.name)
        for name, fn in (overrides or {}).items():
            if not callable(getattr(type(self), name, None)):
                raise ValueError(f"FakeNvml has no function {name} to override")
            setattr(self, name, fn)

    # --- tables built once from the profile ---------------------------------------------------
    def _link_table(self, pos: int) -> list[tuple[int, str]] | None:
        """Per link: remote device type and remote PCI bus id; None = card without NVLink."""
        prof = self.profile
        if prof.nvlink is None:
            return None
        if prof.nvlink.switched:
            return [
                (nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, f"0000FFFF:{link % 4:02X}:00.0")
                for link in range(prof.nvlink.switched)
            ]
        table: list[tuple[int, str]] = []
        for peer in range(len(prof.gpus)):
            table += [(nvml.NVML_NVLINK_DEVICE_TYPE_GPU, self._bus[peer])] * prof.links(pos, peer)
        return table

    # --- plumbing -----------------------------------------------------------------------------
    def _enter(self, name: str, handle: object = None) -> None:
        self._driver_check()
        if self._inits <= 0:
            raise nvml.NVMLError_Uninitialized()
        handle = self._resolve(handle)
        index = None
        if isinstance(handle, _Device):
            index = handle.index
        elif isinstance(handle, fakemig.MigHandle):
            index = handle.parent.index
        elif isinstance(handle, int):
            index = handle
        if index is not None:
            failure = self.fail_calls.get((index, name)) or self.fail.get(index)
            if failure is not None:
                _raise(failure)
            if index in self._pos:
                self._check_lost(self._pos[index])

    def _resolve(self, handle: object) -> object:
        """An event's ``c_nvmlDevice_t`` → the GPU handle it stands for."""
        pos = self._pointer_pos(handle)
        if pos is None or not 0 <= pos < len(self.profile.gpus):
            return handle
        return _Device(index=self.profile.gpu_index(pos), pos=pos)

    def _device(self, name: str, handle: object) -> _Device:
        self._enter(name, handle)
        handle = self._resolve(handle)
        if not isinstance(handle, _Device):
            raise nvml.NVMLError_InvalidArgument()
        gpus = self.profile.gpus
        if not handle.uuid or (
            handle.pos < len(gpus) and self.profile.gpu_uuid(handle.pos) == handle.uuid
        ):
            return handle
        for pos in range(len(gpus)):  # another GPU was removed or added: renumbered
            if self.profile.gpu_uuid(pos) == handle.uuid:
                return _Device(index=self.profile.gpu_index(pos), pos=pos, uuid=handle.uuid)
        raise nvml.NVMLError_GpuIsLost()  # its GPU is off the bus, as real NVML says

    def _spec(self, dev: _Device) -> profiles.GpuSpec:
        return self.profile.gpus[dev.pos]

    def _link(self, name: str, handle: object, link: int) -> tuple[int, str]:
        dev = self._device(name, handle)
        table = self._links[dev.pos]
        if table is None:
            raise nvml.NVMLError_NotSupported()
        if not 0 <= link < len(table):
            raise nvml.NVMLError_InvalidArgument()
        return table[link]

    # --- system -------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.init_calls += 1  # attempts too: a released agent must make none (fakelifecycle)
        self._driver_check(init=True)
        if self.init_error is not None:
            _raise(self.init_error)
        self._inits += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.profile.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        major, minor = self.profile.cuda_driver_version.split(".")
        return int(major) * 1000 + int(minor) * 10

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.profile.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Device:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if index not in self._pos:
            raise nvml.NVMLError_InvalidArgument()
        pos = self._pos[index]
        return _Device(index=index, pos=pos, uuid=self.profile.gpu_uuid(pos))

    # --- one GPU ------------------------------------------------------------------------------
    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        dev = self._device("nvmlDeviceGetMinorNumber", handle)
        minor = self._spec(dev).minor
        return dev.index if minor is None else minor

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> object:
        """A GPU's handle, or a MIG device's (looked up in one snapshot of the MIG state)."""
        self._enter("nvmlDeviceGetHandleByUUID")
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for pos in range(len(self.profile.gpus)):
            if self.profile.gpu_uuid(pos) == wanted:
                return self.nvmlDeviceGetHandleByIndex(self.profile.gpu_index(pos))
        state = self.mig_state.read()
        for pos in range(len(self.profile.gpus)):
            gpu = state.get(self.profile.gpu_uuid(pos))
            if gpu is None:
                continue
            for slot, (gi, ci) in enumerate(self._mig_devices(gpu)):
                inst = self._find_gi(gpu, gi)
                if any(c.id == ci and c.uuid == wanted for c in inst.computeInstances):
                    dev = self.nvmlDeviceGetHandleByIndex(self.profile.gpu_index(pos))
                    return fakemig.MigHandle(parent=dev, slot=slot, gi=gi, ci=ci)
        raise nvml.NVMLError_NotFound()

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        handle = self._resolve(handle)
        if isinstance(handle, fakemig.MigHandle):
            return self._mig_uuid(handle)
        return self.profile.gpu_uuid(self._device("nvmlDeviceGetUUID", handle).pos)

    def nvmlDeviceGetName(self, handle: object) -> str:
        dev = self._device("nvmlDeviceGetName", handle)
        return str(self.profile.resolved(dev.pos, "product_name"))

    def nvmlDeviceGetBrand(self, handle: object) -> int:
        return self._brand[self._device("nvmlDeviceGetBrand", handle).pos]

    def nvmlDeviceGetArchitecture(self, handle: object) -> int:
        return self._arch[self._device("nvmlDeviceGetArchitecture", handle).pos]

    def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:
        dev = self._device("nvmlDeviceGetCudaComputeCapability", handle)
        major, minor = str(self.profile.resolved(dev.pos, "cuda_compute_capability")).split(".")
        return int(major), int(minor)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Any:
        dev = self._device("nvmlDeviceGetMemoryInfo", handle)
        self._telemetry_supported(dev, "memory")
        total = int(self.profile.resolved(dev.pos, "memory"))
        used = min(total, self._telemetry(dev).memory_used or total // 100 * (3 + dev.index % 5))
        return nvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    # --- telemetry: from the profile's ``telemetry``, else derived from the GPU index ---------
    def _telemetry(self, dev: _Device) -> profiles.Telemetry:
        return self.profile.resolved(dev.pos, "telemetry") or _NO_TELEMETRY

    def _telemetry_supported(self, dev: _Device, value: str) -> None:
        if value in self._telemetry(dev).not_supported:
            raise nvml.NVMLError_NotSupported()

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Any:
        dev = self._device("nvmlDeviceGetUtilizationRates", handle)
        self._telemetry_supported(dev, "utilization")
        t = self._telemetry(dev)
        gpu = t.gpu_utilization if t.gpu_utilization is not None else (dev.index * 37 + 11) % 101
        memory = t.memory_utilization
        return nvml.c_nvmlUtilization_t(
            gpu=gpu, memory=memory if memory is not None else (dev.index * 23 + 5) % 101
        )

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        """Milliwatts, as NVML reports them."""
        dev = self._device("nvmlDeviceGetPowerUsage", handle)
        self._telemetry_supported(dev, "power")
        watts = self._telemetry(dev).power_watts
        return round((watts if watts is not None else 70.0 + 12.5 * dev.index) * 1000)

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        dev = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != nvml.NVML_TEMPERATURE_GPU:
            raise nvml.NVMLError_InvalidArgument()
        self._telemetry_supported(dev, "temperature")
        temperature = self._telemetry(dev).temperature
        return temperature if temperature is not None else 30 + 3 * dev.index

    def nvmlDeviceGetPciInfo(self, handle: object) -> Any:
        return self._pci(self._bus[self._device("nvmlDeviceGetPciInfo", handle).pos])

    @staticmethod
    def _pci(bus_id: str) -> Any:
        domain, bus, rest = bus_id.split(":")
        device = int(rest.split(".")[0], 16)
        legacy = f"{int(domain, 16) & 0xFFFF:04X}:{bus}:{rest}"
        return nvml.nvmlPciInfo_t(
            busIdLegacy=legacy.encode(),
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=device,
            busId=bus_id.encode(),
        )

    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int:
        node = self._spec(self._device("nvmlDeviceGetNumaNodeId", handle)).numa_node
        if node is None:
            raise nvml.NVMLError_NotSupported()
        return node

    def nvmlDeviceGetGpuFabricInfoV(self, handle: object, info: Any) -> int:
        return self._fill_fabric("nvmlDeviceGetGpuFabricInfoV", handle, info)

    def nvmlDeviceGetGpuFabricInfo(self, handle: object, info: Any) -> int:
        return self._fill_fabric("nvmlDeviceGetGpuFabricInfo", handle, info)

    def _fill_fabric(self, name: str, handle: object, info: Any) -> int:
        dev = self._device(name, handle)
        fabric = self.profile.resolved(dev.pos, "fabric")
        if fabric is None:
            raise nvml.NVMLError_NotSupported()
        target = info.contents if isinstance(info, ctypes._Pointer) else info
        raw = uuidlib.UUID(fabric.cluster_uuid).bytes
        target.clusterUuid = (ctypes.c_uint8 * len(raw))(*raw)
        target.status = nvml.NVML_SUCCESS
        target.cliqueId = fabric.clique_id
        target.state = _reverse(nvml.FABRIC_STATES, "fabric state", fabric.state, "")
        self._fabric_health(dev.pos, target)
        return nvml.NVML_SUCCESS

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: object, handle2: object) -> int:
        a = self._spec(self._device("nvmlDeviceGetTopologyCommonAncestor", handle1))
        b = self._spec(self._device("nvmlDeviceGetTopologyCommonAncestor", handle2))
        if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
            return nvml.NVML_TOPOLOGY_SINGLE
        if a.pcie_root is not None and a.pcie_root == b.pcie_root:
            return nvml.NVML_TOPOLOGY_HOSTBRIDGE
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return nvml.NVML_TOPOLOGY_NODE
        return nvml.NVML_TOPOLOGY_SYSTEM

    # --- NVLink -------------------------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        self._link("nvmlDeviceGetNvLinkState", handle, link)
        return nvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: object, link: int) -> int:
        return self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> Any:
        return self._pci(self._link("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)[1])


class ProfileSysfs:
    """The :class:`~dra_driver.devices.sysfs.Sysfs` seam answered from the profile."""

    def __init__(self, profile: profiles.Profile) -> None:
        self._gpus = {nvml.sysfs_bus_id(g.pci_bus_id): g for g in profile.gpus}
        self._machine_type = profile.machine_type
        self._positions = {nvml.sysfs_bus_id(g.pci_bus_id): i for i, g in enumerate(profile.gpus)}

    def pcie_root(self, bus_id: str) -> str | None:
        gpu = self._gpus.get(bus_id)
        return gpu.pcie_root if gpu is not None else None

    def numa_node(self, bus_id: str) -> int | None:
        gpu = self._gpus.get(bus_id)
        return gpu.numa_node if gpu is not None else None

    def machine_type(self) -> str | None:
        return self._machine_type

    def iommu_group(self, bus_id: str) -> int | None:
        """The profile's ``iommuGroup``; by default a group of its own per GPU (20 + position)."""
        gpu = self._gpus.get(bus_id)
        if gpu is None:
            return None
        return gpu.iommu_group if gpu.iommu_group is not None else 20 + self._positions[bus_id]
