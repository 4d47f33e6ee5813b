"""PynvmlBackend over the pynvml stand-in: unsupported calls degrade, bad GPUs are skipped."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

import pynvml  # only to pin our tables to the binding's constants
import pytest
from structlog.testing import capture_logs

from dra_driver.devices import backend, model, nvml, topology
from dra_driver.devices.fake import fakenvml, profiles

Discover = Callable[..., model.NodeDevices]  # the `discover` fixture (conftest.py)


def raises(error: type[Exception]) -> Any:
    def call(*_args: Any) -> Any:
        raise error()

    return call


# --- start-up -------------------------------------------------------------------------------


def test_library_not_found_is_one_clear_line() -> None:
    fake = fakenvml.FakeNvml(
        profiles.load_builtin("pcie-l4"), init_error=nvml.NVMLError_LibraryNotFound
    )
    with pytest.raises(backend.DiscoveryError) as info:
        nvml.PynvmlBackend.create(nvml=fake)
    message = str(info.value)
    assert "libnvidia-ml.so.1" in message
    assert "NVIDIA driver must be installed" in message
    assert "--fake PROFILE" in message
    assert "\n" not in message


def test_driver_not_loaded_and_other_init_failures() -> None:
    prof = profiles.load_builtin("pcie-l4")
    for error, words in [
        (nvml.NVMLError_DriverNotLoaded, "kernel driver is not loaded"),
        (nvml.NVMLError_LibRmVersionMismatch, "versions differ"),
        (nvml.NVMLError_NoPermission, "initialisation failed"),
    ]:
        with pytest.raises(backend.DiscoveryError, match=words) as info:
            nvml.PynvmlBackend.create(nvml=fakenvml.FakeNvml(prof, init_error=error))
        assert "--fake PROFILE" in str(info.value)


def test_real_pynvml_reports_gpus_or_the_clear_error() -> None:
    """On a GPU node this discovers real GPUs; elsewhere the real library is not found."""
    try:
        real = nvml.PynvmlBackend.create()
    except backend.DiscoveryError as exc:
        assert "libnvidia-ml.so.1" in str(exc) or "driver" in str(exc)
        assert "--fake PROFILE" in str(exc)
    else:
        try:
            assert real.discover().gpus
        finally:
            real.close()


def test_calls_before_init_fail_like_nvml() -> None:
    fake = fakenvml.FakeNvml(profiles.load_builtin("pcie-l4"))
    with pytest.raises(nvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    with pytest.raises(backend.DiscoveryError, match="cannot count"):
        nvml.PynvmlBackend(nvml=fake, sysfs=fakenvml.ProfileSysfs(fake.profile)).discover()


# --- unsupported calls degrade ----------------------------------------------------------------


def test_pcie_card_has_no_nvlink_fabric_or_mig(discover: Discover) -> None:
    devices = discover("pcie-l4")
    assert len(devices.gpus) == 4
    for gpu in devices.gpus:
        assert gpu.nvlinks == {} and not gpu.nvlink_switched
        assert gpu.fabric is None
        assert not gpu.mig_enabled and gpu.mig_devices == ()
    gpu = devices.gpu(0)
    assert gpu.product_name == "NVIDIA L4"
    assert gpu.brand == "Nvidia"
    assert gpu.architecture == "Ada Lovelace"
    assert gpu.cuda_compute_capability == "8.9"
    assert gpu.cuda_driver_version == "13.0"
    assert gpu.driver_version == "580.95.05"
    assert gpu.memory_bytes == 23034 << 20
    assert gpu.pci_bus_id == "0000:01:00.0"
    assert gpu.pcie_root == "pci0000:00"
    assert gpu.numa_node == 0


def test_every_optional_call_unsupported_still_reports_gpus(discover: Discover) -> None:
    optional = [
        "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetName",
        "nvmlDeviceGetBrand", "nvmlDeviceGetArchitecture", "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetMinorNumber", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetMigMode",
        "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo",
        "nvmlDeviceGetNvLinkState", "nvmlDeviceGetTopologyCommonAncestor",
    ]  # fmt: skip
    for error in (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
        devices = discover("gb200-nvl", overrides={name: raises(error) for name in optional})
        assert [g.index for g in devices.gpus] == [0, 1, 2, 3]
        gpu = devices.gpu(2)
        assert (gpu.product_name, gpu.brand, gpu.architecture) == ("Unknown",) * 3
        assert gpu.cuda_compute_capability == gpu.driver_version == gpu.cuda_driver_version == ""
        assert gpu.minor == 2  # falls back to the index
        assert gpu.numa_node == 1  # from sysfs
        assert gpu.fabric is None and gpu.nvlinks == {} and not gpu.mig_enabled
        # Without NVML's answer the PCIe path comes from root complex and NUMA node.
        assert devices.pcie_path(0, 1) is model.PathType.NODE
        assert devices.pcie_path(0, 2) is model.PathType.SYS


def test_functions_missing_from_an_older_binding_are_absent() -> None:
    prof = profiles.load_builtin("gb200-nvl")
    fake = fakenvml.FakeNvml(prof)

    class OldBinding:
        """Only what an old nvidia-ml-py had: no NUMA id, no versioned fabric call."""

        def __getattr__(self, name: str) -> Any:
            if name in ("nvmlDeviceGetNumaNodeId", "nvmlDeviceGetGpuFabricInfoV"):
                raise AttributeError(name)
            return getattr(fake, name)

    devices = nvml.PynvmlBackend.create(
        nvml=OldBinding(), sysfs=fakenvml.ProfileSysfs(prof)
    ).discover()
    assert devices.gpu(3).numa_node == 1
    fabric = devices.gpu(3).fabric  # read through the older, unversioned call
    assert fabric is not None and fabric.clique_id == 32766


def test_essential_call_unsupported_skips_only_that_gpu(discover: Discover) -> None:
    with capture_logs() as logs:
        devices = discover(
            "pcie-l4", fail_calls={(1, "nvmlDeviceGetUUID"): nvml.NVMLError_NotSupported}
        )
    assert [g.index for g in devices.gpus] == [0, 2, 3]
    [warning] = [e for e in logs if e["event"] == "GPU skipped"]
    assert warning["index"] == 1 and "nvmlDeviceGetUUID" in warning["error"]


# --- GPU-level failures -----------------------------------------------------------------------


@pytest.mark.parametrize("error", [nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown])
def test_lost_gpu_is_skipped_with_a_warning(discover: Discover, error: type[Exception]) -> None:
    with capture_logs() as logs:
        devices = discover("dgx-1-v100", fail={2: error})
    assert [g.index for g in devices.gpus] == [0, 1, 3, 4, 5, 6, 7]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0]["event"] == "GPU skipped"
    assert warnings[0]["index"] == 2
    assert error.__name__ in warnings[0]["error"]
    # The survivors keep their links to each other, none to the lost GPU.
    assert all(2 not in g.nvlinks for g in devices.gpus)
    assert devices.gpu(0).nvlinks == {1: 1, 3: 2, 4: 2}
    assert [i.gpu_indices for i in topology.build(devices).islands] == [(0, 1, 3, 4, 5, 6, 7)]


def test_gpu_lost_while_reading_nvlink_is_skipped(discover: Discover) -> None:
    lost = {(5, "nvmlDeviceGetNvLinkRemoteDeviceType"): nvml.NVMLError_GpuIsLost}
    with capture_logs() as logs:
        devices = discover("dgx-h100", fail_calls=lost)
    assert [g.index for g in devices.gpus] == [0, 1, 2, 3, 4, 6, 7]
    assert devices.gpu(0).nvlinks == {p: 18 for p in (1, 2, 3, 4, 6, 7)}
    assert [(e["event"], e["index"]) for e in logs] == [("GPU skipped", 5)]


def test_failing_mig_device_is_skipped_and_the_rest_reported(discover: Discover) -> None:
    def attributes(handle: Any) -> Any:
        if getattr(handle, "slot", None) == 1:
            raise nvml.NVMLError_Unknown()
        return original(handle)

    helper = fakenvml.FakeNvml(profiles.load_builtin("a100-mig"))
    helper.nvmlInit()
    original = helper.nvmlDeviceGetAttributes
    with capture_logs() as logs:
        devices = discover("a100-mig", overrides={"nvmlDeviceGetAttributes": attributes})
    # Only GPU 0 has a MIG device at index 1 (GPU 1 has a single one).
    assert [m.placement_start for m in devices.gpu(0).mig_devices] == [0, 3, 4]
    assert len(devices.gpu(1).mig_devices) == 1
    [warning] = logs
    assert warning["event"] == "MIG device skipped"
    assert (warning["index"], warning["mig_index"]) == (0, 1)


# --- MIG, fabric, NVSwitch, PCIe ---------------------------------------------------------------


def test_mig_devices_on_a100(discover: Discover) -> None:
    devices = discover("a100-mig")
    gpu = devices.gpu(0)
    assert gpu.mig_enabled
    summary = [
        (m.profile, m.placement_start, m.placement_size, m.multiprocessors, m.memory_bytes >> 20)
        for m in gpu.mig_devices
    ]
    assert summary == [
        ("2g.10gb", 0, 2, 28, 9856),
        ("1g.5gb", 2, 1, 14, 4864),
        ("1g.5gb", 3, 1, 14, 4864),
        ("3g.20gb", 4, 4, 42, 19968),
    ]
    assert [m.gpu_instance_id for m in gpu.mig_devices] == [1, 2, 3, 4]
    assert {m.compute_instance_id for m in gpu.mig_devices} == {0}
    assert all(m.uuid.startswith("MIG-") and m.parent_index == 0 for m in gpu.mig_devices)
    assert len({m.uuid for m in gpu.mig_devices}) == 4
    big = gpu.mig_devices[3]
    assert (big.copy_engines, big.decoders, big.encoders, big.jpeg_engines) == (3, 2, 0, 0)
    [whole] = devices.gpu(1).mig_devices
    assert (whole.profile, whole.placement_size, whole.ofa_engines) == ("7g.40gb", 8, 1)
    assert model.mig_device_name(gpu, gpu.mig_devices[1]) == "gpu-0-mig-1g-5gb-2"


def test_mig_profile_names_without_nvml_profile_table(discover: Discover) -> None:
    """Older drivers: no profile names from NVML, so names come from slices and memory."""
    unsupported = {"nvmlDeviceGetGpuInstanceProfileInfo": raises(nvml.NVMLError_NotSupported)}
    named = discover("a100-mig")
    derived = discover("a100-mig", overrides=unsupported)
    assert [g.mig_devices for g in derived.gpus] == [g.mig_devices for g in named.gpus]
    assert [g.mig_profiles for g in derived.gpus] == [(), ()]  # no table: nothing dynamic


@pytest.mark.parametrize(
    ("slices", "mib", "total", "name"),
    [
        (1, 4864, 40 << 30, "1g.5gb"),
        (3, 19968, 40 << 30, "3g.20gb"),
        (7, 40192, 40 << 30, "7g.40gb"),
        (1, 9728, 80 << 30, "1g.10gb"),
        (1, 11008, 95830 << 20, "1g.12gb"),  # H100 NVL
        (2, 9856, 0, "2g.10gb"),  # total unknown: plain GiB
    ],
)
def test_mig_profile_name(slices: int, mib: int, total: int, name: str) -> None:
    assert nvml.mig_profile_name(slices, mib, total) == name


def test_fabric_info_on_gb200(discover: Discover) -> None:
    devices = discover("gb200-nvl")
    for gpu in devices.gpus:
        assert gpu.fabric == model.FabricInfo(
            cluster_uuid="3f2a8c1e-5b7d-4e90-a1c2-6d8e9f0a1b2c", clique_id=32766,
            state="completed",
        )  # fmt: skip
        assert gpu.nvlink_switched and gpu.active_links == 18
        assert gpu.architecture == "Blackwell" and gpu.cuda_compute_capability == "10.0"


def test_fabric_state_not_supported_is_absent(discover: Discover) -> None:
    def not_supported(_handle: Any, info: Any) -> int:
        info.contents.clusterUuid = (pynvml.c_uint8 * 16)(*uuid.UUID(int=0).bytes)
        info.contents.state = nvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        return nvml.NVML_SUCCESS

    devices = discover("gb200-nvl", overrides={"nvmlDeviceGetGpuFabricInfoV": not_supported})
    assert all(g.fabric is None for g in devices.gpus)


def test_nvswitch_pairs_get_the_narrower_side(discover: Discover) -> None:
    """GPU 5 has only 12 of its 18 links up: every pair with it gets 12."""
    fake = fakenvml.FakeNvml(profiles.load_builtin("dgx-h100"))
    fake.nvmlInit()

    def state(handle: Any, link: int) -> int:
        up = fake.nvmlDeviceGetNvLinkState(handle, link)
        return nvml.NVML_FEATURE_DISABLED if handle.index == 5 and link >= 12 else up

    devices = discover("dgx-h100", overrides={"nvmlDeviceGetNvLinkState": state})
    topo = topology.build(devices)
    assert devices.gpu(5).active_links == 12
    assert all(topo.links(5, p) == 12 for p in range(8) if p != 5)
    assert topo.links(0, 1) == 18 and topo.links(6, 7) == 18
    assert len(topo.islands) == 1


@pytest.mark.parametrize(
    ("level", "path"),
    [
        (nvml.NVML_TOPOLOGY_INTERNAL, model.PathType.PIX),
        (nvml.NVML_TOPOLOGY_SINGLE, model.PathType.PIX),
        (nvml.NVML_TOPOLOGY_MULTIPLE, model.PathType.PXB),
        (nvml.NVML_TOPOLOGY_HOSTBRIDGE, model.PathType.PHB),
        (nvml.NVML_TOPOLOGY_NODE, model.PathType.NODE),
        (nvml.NVML_TOPOLOGY_SYSTEM, model.PathType.SYS),
    ],
)
def test_topology_levels_map_to_paths(discover: Discover, level: int, path: model.PathType) -> None:
    answer = {"nvmlDeviceGetTopologyCommonAncestor": lambda *_: level}
    devices = discover("pcie-l4", overrides=answer)
    assert set(devices.pcie_paths.values()) == {path}
    assert len(devices.pcie_paths) == 6


# --- small conversions and pinned facts -------------------------------------------------------


def test_conversions() -> None:
    assert nvml.sysfs_bus_id("00000000:17:00.0") == "0000:17:00.0"
    assert nvml.sysfs_bus_id("0000000A:B1:00.0") == "000a:b1:00.0"
    assert nvml.sysfs_bus_id("0000:ca:00.0") == "0000:ca:00.0"
    assert nvml.cuda_version(12080) == "12.8"
    assert nvml.cuda_version(13000) == "13.0"
    assert nvml.cuda_version(12020) == "12.2"


def test_name_tables_match_the_binding() -> None:
    brands = {"UNKNOWN": "Unknown", "TESLA": "Tesla", "NVIDIA": "Nvidia", "GEFORCE": "GeForce",
              "QUADRO_RTX": "QuadroRTX", "NVIDIA_RTX": "NvidiaRTX"}  # fmt: skip
    for const, name in brands.items():
        assert nvml.BRAND_NAMES[getattr(pynvml, f"NVML_BRAND_{const}")] == name
    archs = {"VOLTA": "Volta", "AMPERE": "Ampere", "ADA": "Ada Lovelace", "HOPPER": "Hopper",
             "BLACKWELL": "Blackwell", "KEPLER": "Kepler", "TURING": "Turing"}  # fmt: skip
    for const, name in archs.items():
        assert nvml.ARCH_NAMES[getattr(pynvml, f"NVML_DEVICE_ARCH_{const}")] == name
    assert nvml.NVMLError_NotSupported is pynvml.NVMLError_NotSupported


def test_stand_in_returns_pynvml_structs() -> None:
    fake = fakenvml.FakeNvml(profiles.load_builtin("dgx-1-v100"))
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(4)
    pci = fake.nvmlDeviceGetPciInfo(handle)
    assert isinstance(pci, pynvml.nvmlPciInfo_t)
    assert pci.busId == "00000000:85:00.0" and pci.bus == 0x85
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    remote = fake.nvmlDeviceGetNvLinkRemotePciInfo(handle, 0)
    assert remote.busId == "00000000:06:00.0"  # GPU 4's first link goes to GPU 0
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetNvLinkState(handle, 6)  # a V100 has 6 links
    with pytest.raises(nvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetMigMode(handle)
    with pytest.raises(nvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetGpuFabricInfoV(handle, None)
    fake.nvmlShutdown()
    l4 = fakenvml.FakeNvml(profiles.load_builtin("pcie-l4"))
    l4.nvmlInit()
    l4_handle = l4.nvmlDeviceGetHandleByIndex(0)
    for call in (l4.nvmlDeviceGetNvLinkState, l4.nvmlDeviceGetNvLinkRemoteDeviceType):
        with pytest.raises(nvml.NVMLError_NotSupported):
            call(l4_handle, 0)  # a PCIe card without NVLink
    with pytest.raises(nvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetHandleByIndex(0)


def test_stand_in_rejects_what_nvml_cannot_report() -> None:
    l4 = profiles.load_builtin("pcie-l4")
    prof = dataclasses.replace(l4, defaults=dataclasses.replace(l4.defaults, brand="Acme"))
    with pytest.raises(profiles.ProfileError, match=r"unknown brand 'Acme'.*Tesla"):
        fakenvml.FakeNvml(prof)
    with pytest.raises(ValueError, match="no function nvmlDeviceGetColour"):
        fakenvml.FakeNvml(profiles.load_builtin("pcie-l4"), overrides={"nvmlDeviceGetColour": id})


def test_mig_profile_name_comes_from_nvml_when_it_has_one() -> None:
    """Names such as ``1g.10gb+me`` cannot be derived from slices and memory alone."""
    text = """\
name: a100-me
driverVersion: "580.95.05"
cudaDriverVersion: "13.0"
defaults: {productName: NVIDIA A100-SXM4-80GB, brand: Nvidia, architecture: Ampere,
           cudaComputeCapability: "8.0", memory: 80Gi}
gpus:
  - pciBusId: "0000:07:00.0"
    mig:
      - {profile: 1g.10gb+me, placementStart: 0, placementSize: 1, memory: 9728Mi,
         multiprocessors: 14}
      - {profile: 1g.10gb, placementStart: 1, placementSize: 1, memory: 9728Mi,
         multiprocessors: 14}
"""
    prof = profiles.parse(text, source="test")
    sysfs = fakenvml.ProfileSysfs(prof)
    named = nvml.PynvmlBackend.create(nvml=fakenvml.FakeNvml(prof), sysfs=sysfs).discover()
    assert [m.profile for m in named.gpu(0).mig_devices] == ["1g.10gb+me", "1g.10gb"]
    no_table = {"nvmlDeviceGetGpuInstanceProfileInfo": raises(nvml.NVMLError_NotSupported)}
    fake = fakenvml.FakeNvml(prof, overrides=no_table)
    derived = nvml.PynvmlBackend.create(nvml=fake, sysfs=sysfs).discover()
    assert [m.profile for m in derived.gpu(0).mig_devices] == ["1g.10gb", "1g.10gb"]


def test_mig_capable_gpu_with_mig_mode_off() -> None:
    """A100/H100 class GPUs answer their MIG mode (disabled) where older ones say NotSupported."""
    prof = profiles.load_builtin("dgx-h100")
    fake = fakenvml.FakeNvml(prof)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetMigMode(handle) == [
        nvml.NVML_DEVICE_MIG_DISABLE,
        nvml.NVML_DEVICE_MIG_DISABLE,
    ]
    with pytest.raises(nvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetMaxMigDeviceCount(handle)  # no MIG devices to walk while it is off
    devices = nvml.PynvmlBackend(nvml=fake, sysfs=fakenvml.ProfileSysfs(prof)).discover()
    assert all(g.mig_capable and not g.mig_enabled for g in devices.gpus)
    assert devices.machine_type == "DGX H100"
    l4 = nvml.PynvmlBackend.create(
        nvml=fakenvml.FakeNvml(profiles.load_builtin("pcie-l4")),
        sysfs=fakenvml.ProfileSysfs(profiles.load_builtin("pcie-l4")),
    ).discover()
    assert not any(g.mig_capable for g in l4.gpus)
    mig = nvml.PynvmlBackend.create(
        nvml=fakenvml.FakeNvml(profiles.load_builtin("a100-mig")),
        sysfs=fakenvml.ProfileSysfs(profiles.load_builtin("a100-mig")),
    ).discover()
    assert all(g.mig_capable and g.mig_enabled for g in mig.gpus)
