"""The label set of each built-in profile, mixed products, MIG strategies, time-slicing, health,
and the guarantee that every key and value is one the API server accepts."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.apimachinery import names
from dra_driver.deviceplugin import inventory
from dra_driver.devices import health, model
from dra_driver.devices.fake import profiles
from dra_driver.nodelabels import compute

from .nodes import builtin, bus, node

DGX1 = {
    "nvidia.com/cuda.driver-version.full": "535.216.01",
    "nvidia.com/cuda.driver-version.major": "535",
    "nvidia.com/cuda.driver-version.minor": "216",
    "nvidia.com/cuda.driver-version.revision": "01",
    "nvidia.com/cuda.driver.major": "535",
    "nvidia.com/cuda.driver.minor": "216",
    "nvidia.com/cuda.driver.rev": "01",
    "nvidia.com/cuda.runtime-version.full": "12.2",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "2",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "2",
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.family": "volta",
    "nvidia.com/gpu.machine": "DGX-1-with-V100-32",
    "nvidia.com/gpu.memory": "32768",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/mig.capable": "false",
    "nvidia.com/mps.capable": "false",
}

# profile: (product, count, memory MiB, family, compute major.minor, machine, mig.capable,
#           driver major.minor.rev, CUDA major.minor, clique or None)
EXPECTED = {
    "a100-mig": ("NVIDIA-A100-SXM4-40GB", 2, 40960, "ampere", "8.0", "unknown", "true",
                 "570.172.08", "12.8", None),
    "dgx-1-v100": ("Tesla-V100-SXM2-32GB", 8, 32768, "volta", "7.0", "DGX-1-with-V100-32",
                   "false", "535.216.01", "12.2", None),
    "dgx-h100": ("NVIDIA-H100-80GB-HBM3", 8, 81920, "hopper", "9.0", "DGX-H100", "true",
                 "580.95.05", "13.0", None),
    "h100-mig": ("NVIDIA-H100-80GB-HBM3", 2, 81920, "hopper", "9.0", "unknown", "true",
                 "580.95.05", "13.0", None),
    "gb200-nvl": ("NVIDIA-GB200", 4, 189471, "blackwell", "10.0", "unknown", "true",
                  "580.95.05", "13.0", "3f2a8c1e-5b7d-4e90-a1c2-6d8e9f0a1b2c.32766"),
    "h100-nvl-pairs": ("NVIDIA-H100-NVL", 4, 96256, "hopper", "9.0", "unknown", "true",
                       "580.95.05", "13.0", None),
    "hgx-16-mesh": ("Tesla-V100-SXM2-32GB", 16, 32768, "volta", "7.0", "unknown", "false",
                    "535.216.01", "12.2", None),
    "pcie-l4": ("NVIDIA-L4", 4, 23034, "ada-lovelace", "8.9", "g6.12xlarge", "false",
                "580.95.05", "13.0", None),
    "pcie-l4-shared-iommu": ("NVIDIA-L4", 4, 23034, "ada-lovelace", "8.9", "g6.12xlarge",
                             "false", "580.95.05", "13.0", None),
}  # fmt: skip


def assert_valid(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        assert key.startswith("nvidia.com/"), key
        assert names.qualified_name(key) == [], key
        assert names.label_value(value) == [], (key, value)


def test_dgx_1_v100_exactly() -> None:
    result = compute.compute(builtin("dgx-1-v100"))
    assert result.labels == DGX1
    assert result.warnings == ()


def test_every_builtin_profile_is_covered() -> None:
    assert sorted(EXPECTED) == profiles.builtin_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_profile_labels(name: str) -> None:
    product, count, memory, family, cc, machine, mig, driver, cuda, clique = EXPECTED[name]
    labels = compute.compute(builtin(name)).labels
    assert_valid(labels)
    major, minor, rev = driver.split(".")
    want = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.compute.major": cc.split(".")[0],
        "nvidia.com/gpu.compute.minor": cc.split(".")[1],
        "nvidia.com/gpu.machine": machine,
        "nvidia.com/mig.capable": mig,
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.runtime.major": cuda.split(".")[0],
        "nvidia.com/cuda.runtime.minor": cuda.split(".")[1],
        "nvidia.com/cuda.runtime-version.full": cuda,
    }
    assert {k: labels.get(k) for k in want} == want
    assert labels.get("nvidia.com/gpu.clique") == clique
    assert "nvidia.com/mig.strategy" not in labels  # GFD writes it only for single/mixed


def test_no_gpus_no_labels() -> None:
    empty = builtin("pcie-l4").__class__(gpus=())
    assert compute.compute(empty).labels == {}


# ---- invalid characters and length ------------------------------------------------------------


def test_names_nvml_reports_are_made_valid() -> None:
    devices = node(
        f"""\
        - {{pciBusId: {bus(0)}, productName: "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition (Rev/2)"}}
        """,  # noqa: E501
        head='machineType: "ThinkSystem SR675 V3 [7D9Q] / 2024"\n',
    )
    labels = compute.compute(devices).labels
    assert_valid(labels)
    assert labels["nvidia.com/gpu.product"] == (
        "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition-Rev2"
    )
    assert labels["nvidia.com/gpu.machine"] == "ThinkSystem-SR675-V3-7D9Q-2024"


def test_a_long_product_keeps_sharing_and_mig_suffixes() -> None:
    long_name = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    devices = node(
        f"""\
        - pciBusId: {bus(0)}
          productName: {long_name}
          mig: [{{profile: 1g.24gb, placementStart: 0, placementSize: 1, memory: 24Gi,
                  multiprocessors: 24}}]
        """
    )
    settings = compute.Settings(mig_strategy="single", replicas=2)
    labels = compute.compute(devices, settings).labels
    assert_valid(labels)
    assert labels["nvidia.com/gpu.product"] == (
        "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstat-MIG-1g.24gb-SHARED"
    )


# ---- several products on one node ------------------------------------------------------------


MIXED = f"""\
- {{pciBusId: {bus(0)}, productName: NVIDIA L4, memory: 23034Mi, cudaComputeCapability: "8.9"}}
- {{pciBusId: {bus(1)}}}
- {{pciBusId: {bus(2)}}}
- {{pciBusId: {bus(3)}, productName: NVIDIA L4, memory: 23034Mi, cudaComputeCapability: "8.9"}}
- {{pciBusId: {bus(4)}}}
"""


def test_mixed_products_label_the_most_numerous() -> None:
    result = compute.compute(node(MIXED))
    labels = result.labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "3"  # GPUs of that product, as GFD counts
    assert labels["nvidia.com/gpu.memory"] == "81920"  # and its memory and architecture
    assert labels["nvidia.com/gpu.family"] == "hopper"
    (warning,) = result.warnings
    assert "NVIDIA H100 80GB HBM3 (3 GPUs)" in warning and "NVIDIA L4 (2)" in warning


def test_mixed_products_tie_goes_to_the_lowest_gpu_index() -> None:
    devices = node(
        f"""\
        - {{pciBusId: {bus(0)}, productName: NVIDIA L4, memory: 23034Mi}}
        - {{pciBusId: {bus(1)}}}
        - {{pciBusId: {bus(2)}}}
        - {{pciBusId: {bus(3)}, productName: NVIDIA L4, memory: 23034Mi}}
        """
    )
    assert compute.compute(devices).labels["nvidia.com/gpu.product"] == "NVIDIA-L4"


def test_whole_gpus_win_over_gpus_in_mig_mode() -> None:
    # GFD: labels of whole GPUs override those of MIG-mode GPUs, whatever the numbers.
    mig = "mig: [{profile: 7g.80gb, placementStart: 0, placementSize: 8, memory: 80Gi, multiprocessors: 132}]"  # noqa: E501
    devices = node(
        f"""\
        - {{pciBusId: {bus(0)}, {mig}}}
        - {{pciBusId: {bus(1)}, {mig}}}
        - {{pciBusId: {bus(2)}, productName: NVIDIA L4, memory: 23034Mi}}
        """
    )
    labels = compute.compute(devices, compute.Settings(replicas=2)).labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.replicas"]) == ("1", "2")


# ---- MIG strategies ----------------------------------------------------------------------------

SINGLE = """\
- pciBusId: {bus}
  productName: NVIDIA A100-SXM4-40GB
  memory: 40Gi
  mig:
    - {{profile: 1g.5gb, placementStart: 0, placementSize: 1, memory: 4864Mi,
        multiprocessors: 14, copyEngines: 1, jpegEngines: 0}}
    - {{profile: 1g.5gb, placementStart: 1, placementSize: 1, memory: 4864Mi,
        multiprocessors: 14, copyEngines: 1}}
"""


def single_node() -> model.NodeDevices:
    return node(SINGLE.format(bus=bus(0)) + SINGLE.format(bus=bus(1)))


def test_mig_single_replaces_the_gpu_labels_with_the_mig_device() -> None:
    labels = compute.compute(single_node(), compute.Settings(mig_strategy="single")).labels
    assert_valid(labels)
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.") or "mig." in k} == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.machine": "unknown",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "4864",
        "nvidia.com/gpu.multiprocessors": "14",
        "nvidia.com/gpu.slices.gi": "1",
        "nvidia.com/gpu.slices.ci": "1",
        "nvidia.com/gpu.engines.copy": "1",
        "nvidia.com/gpu.engines.decoder": "0",
        "nvidia.com/gpu.engines.encoder": "0",
        "nvidia.com/gpu.engines.jpeg": "0",
        "nvidia.com/gpu.engines.ofa": "0",
        "nvidia.com/gpu.family": "hopper",  # from the whole-GPU labels (the profile's default)
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
    }


def test_mig_single_on_a_layout_it_cannot_serve_says_invalid() -> None:
    result = compute.compute(builtin("a100-mig"), compute.Settings(mig_strategy="single"))
    labels = result.labels
    assert (
        labels["nvidia.com/gpu.product"],
        labels["nvidia.com/gpu.count"],
        labels["nvidia.com/gpu.replicas"],
        labels["nvidia.com/gpu.memory"],
    ) == ("NVIDIA-A100-SXM4-40GB-MIG-INVALID", "0", "0", "0")
    (warning,) = result.warnings
    assert "several MIG profiles (1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb)" in warning


def test_mig_single_without_gpus_in_mig_mode_is_none_plus_the_strategy() -> None:
    plain = compute.compute(builtin("dgx-h100")).labels
    single = compute.compute(builtin("dgx-h100"), compute.Settings(mig_strategy="single")).labels
    assert single == plain | {"nvidia.com/mig.strategy": "single"}


def test_mig_mixed_labels_each_profile_like_its_resource() -> None:
    labels = compute.compute(builtin("a100-mig"), compute.Settings(mig_strategy="mixed")).labels
    assert_valid(labels)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    counts = {k: v for k, v in labels.items() if k.endswith(".count")}
    assert counts == {
        "nvidia.com/gpu.count": "2",
        "nvidia.com/mig-1g.5gb.count": "2",
        "nvidia.com/mig-2g.10gb.count": "1",
        "nvidia.com/mig-3g.20gb.count": "1",
        "nvidia.com/mig-7g.40gb.count": "1",
    }
    assert labels["nvidia.com/mig-3g.20gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert labels["nvidia.com/mig-3g.20gb.memory"] == "19968"
    assert labels["nvidia.com/mig-7g.40gb.engines.ofa"] == "1"


def test_mixed_keys_name_the_device_plugins_resources() -> None:
    for profile in ("1g.5gb", "1g.10gb+me", "2g.20gb+gfx"):
        assert compute.mig_resource(profile) == inventory.mig_resource_name("nvidia.com", profile)
    assert compute.mig_name("1g.10gb+me") == "1g.10gb.me"  # in the product value, as GFD


# ---- time-slicing ------------------------------------------------------------------------------


def test_time_slicing_replicas_mark_the_product_shared() -> None:
    labels = compute.compute(builtin("pcie-l4"), compute.Settings(replicas=4)).labels
    assert (
        labels["nvidia.com/gpu.product"],
        labels["nvidia.com/gpu.count"],
        labels["nvidia.com/gpu.replicas"],
        labels["nvidia.com/gpu.sharing-strategy"],
    ) == ("NVIDIA-L4-SHARED", "4", "4", "time-slicing")


def test_gpus_in_mig_mode_are_never_labelled_shared() -> None:
    labels = compute.compute(builtin("a100-mig"), compute.Settings(replicas=4)).labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"


@pytest.mark.parametrize(
    ("kw", "needle"),
    [({"mig_strategy": "all"}, "MIG strategy 'all'"), ({"replicas": 0}, "at least 1")],
)
def test_bad_settings_are_refused(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(compute.LabelError, match=needle):
        compute.Settings(**kw)


# ---- health --------------------------------------------------------------------------------


def test_counts_leave_out_unhealthy_devices() -> None:
    devices = builtin("dgx-h100")
    sick = {devices.gpus[3].uuid: "XID 79", devices.gpus[5].uuid: "XID 48"}
    labels = compute.compute(devices, unhealthy=sick).labels
    assert labels["nvidia.com/gpu.count"] == "6"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # the hardware stays


def test_a_mig_device_is_unhealthy_with_its_parent() -> None:
    devices = builtin("a100-mig")
    board = health.HealthBoard()
    board.mark_unhealthy(devices.gpus[0].uuid)  # parent of 1g.5gb x2, 2g.10gb, 3g.20gb
    board.mark_unhealthy(devices.gpus[1].mig_devices[0].uuid)  # the 7g.40gb
    labels = compute.compute(
        devices, compute.Settings(mig_strategy="mixed"), unhealthy=board.snapshot().unhealthy
    ).labels
    counts = {k: v for k, v in labels.items() if k.endswith(".count")}
    assert counts == {
        "nvidia.com/gpu.count": "1",
        "nvidia.com/mig-1g.5gb.count": "0",
        "nvidia.com/mig-2g.10gb.count": "0",
        "nvidia.com/mig-3g.20gb.count": "0",
        "nvidia.com/mig-7g.40gb.count": "0",
    }


# ---- NVLink fabric clique ----------------------------------------------------------------------


def test_gpus_in_different_cliques_get_no_clique_label() -> None:
    fabric = "{{clusterUUID: 3f2a8c1e-5b7d-4e90-a1c2-6d8e9f0a1b2c, cliqueId: {}, state: {}}}"
    devices = node(
        f"""\
        - {{pciBusId: {bus(0)}, fabric: {fabric.format(1, "completed")}}}
        - {{pciBusId: {bus(1)}, fabric: {fabric.format(2, "completed")}}}
        """
    )
    result = compute.compute(devices)
    assert "nvidia.com/gpu.clique" not in result.labels
    assert any("several NVLink fabric cliques" in w for w in result.warnings)


def test_a_fabric_still_registering_is_no_clique() -> None:
    fabric = "{clusterUUID: 3f2a8c1e-5b7d-4e90-a1c2-6d8e9f0a1b2c, cliqueId: 7, state: in-progress}"
    devices = node(f"- {{pciBusId: {bus(0)}, fabric: {fabric}}}\n")
    assert "nvidia.com/gpu.clique" not in compute.compute(devices).labels
