"""NVIDIA's ``resource.nvidia.com/v1beta1`` configs: strict decoding, NVIDIA's defaults and
meaning, and which kind of device each applies to."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.driver import claims, config

REF = claims.ClaimRef(uid="u-1", namespace="ns", name="c")


def entry(params: Any, requests: tuple[str, ...] = (), index: int = 0) -> claims.OpaqueConfig:
    return claims.OpaqueConfig(
        index=index, source="FromClaim", requests=requests, parameters=params
    )


def gpu(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", **fields}


def mig(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", **fields}


def sharing_of(params: dict[str, Any], kind: str = "gpu") -> dict[str, Any] | None:
    cfg = config.effective([entry(params)], ref=REF, kind=kind)
    return cfg.to_json().get("sharing")


def test_gpu_config_defaults_are_nvidias() -> None:
    # No sharing, or TimeSlicing without an interval: time-slicing with the Default interval.
    default = {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}}
    assert sharing_of(gpu()) == default
    assert sharing_of(gpu(sharing={"strategy": "TimeSlicing"})) == default
    assert sharing_of(gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {}})) == default
    assert sharing_of(
        gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
    ) == {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}
    assert sharing_of(gpu(sharing={"strategy": "MPS"})) == {"strategy": "MPS", "mps": {}}


def test_mps_config_maps_to_our_limits() -> None:
    params = gpu(
        sharing={
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 30,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"0": "4Gi", "GPU-1234": 2147483648},
            },
        }
    )
    assert sharing_of(params) == {
        "strategy": "MPS",
        "mps": {
            "activeThreadPercentage": 30,
            "pinnedDeviceMemoryLimit": "10Gi",
            "perDevicePinnedMemoryLimits": {"0": "4Gi", "GPU-1234": "2147483648"},
        },
    }


def test_mig_device_config_time_slicing_is_a_no_op_and_mps_runs_a_daemon() -> None:
    assert sharing_of(mig(sharing={"strategy": "TimeSlicing"}), "mig") == {"strategy": "Exclusive"}
    assert sharing_of(
        mig(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}), "mig"
    ) == {"strategy": "MPS", "mps": {"activeThreadPercentage": 50}}


def test_config_kinds_apply_to_their_own_devices_only() -> None:
    # Applying to the whole claim: the other kind's config is skipped.
    assert config.effective([entry(mig(sharing={"strategy": "MPS"}))], ref=REF) == config.DEFAULT
    assert config.effective([entry(gpu())], ref=REF, kind="mig") == config.DEFAULT
    # Naming the request: an error, as in NVIDIA's driver.
    with pytest.raises(config.ConfigError) as err:
        config.effective([entry(gpu(), requests=("small",))], ref=REF, kind="mig")
    assert "GpuConfig is for full GPUs and cannot be applied to request(s) small" in str(err.value)
    with pytest.raises(config.ConfigError) as err:
        config.effective(
            [entry(mig(sharing={"strategy": "MPS"}), requests=("big",))], ref=REF, kind="gpu"
        )
    assert "MigDeviceConfig is for MIG devices" in str(err.value)


def test_later_config_replaces_sharing_whatever_its_api() -> None:
    ours = {"apiVersion": "gpu.nvidia.com/v1", "kind": "GpuConfig", "env": {"A": "1"}}
    merged = config.effective(
        [
            entry({**ours, "sharing": {"strategy": "TimeSlicing"}}, index=0),
            entry(gpu(sharing={"strategy": "MPS"}), index=1),
        ],
        ref=REF,
    )
    assert merged.env == {"A": "1"}
    assert merged.sharing is not None and merged.sharing.strategy == "MPS"


@pytest.mark.parametrize(
    ("params", "expect"),
    [
        # unknown fields (strict decoding, as NVIDIA's decoder)
        (gpu(sharng={}), "field sharng: unknown field"),
        (gpu(metadata={"name": "x"}), "field metadata: unknown field"),
        (gpu(sharing={"strategy": "MPS", "mpsConfig": {"maxConnections": 2}}), "maxConnections"),
        (
            gpu(
                sharing={"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimits": {}}}
            ),
            "defaultPerDevicePinnedMemoryLimits: unknown field",
        ),
        (mig(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {}}), "timeSlicingConfig"),
        # wrong types
        (gpu(sharing={"strategy": 1}), "field sharing.strategy: Input should be a valid string"),
        (gpu(sharing="MPS"), "field sharing"),
        (
            gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 5.5}}),
            "defaultActiveThreadPercentage: Input should be a valid integer",
        ),
        (
            gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": True}}),
            "must be a quantity string",
        ),
        (
            gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": 2}}),
            "interval: Input should be a valid string",
        ),
        # invalid values (NVIDIA's validation)
        (gpu(sharing={"strategy": "Fabric"}), "fabric GPU sharing strategy is not enabled"),
        (gpu(sharing={"strategy": "Spatial"}), "unknown GPU sharing strategy: Spatial"),
        (
            gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Huge"}}),
            "unknown time-slice interval: Huge",
        ),
        (
            gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}}),
            "active thread percentage must not be negative",
        ),
        (
            gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
            "must not be greater than 100",
        ),
        (
            gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1k"}}),
            "value set too low",
        ),
        (
            gpu(sharing={"strategy": "MPS", "timeSlicingConfig": {"interval": "Short"}}),
            "cannot use TimeSlicingConfig with the 'MPS' strategy",
        ),
        (
            gpu(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}),
            "cannot use MpsConfig with the 'TimeSlicing' strategy",
        ),
        (mig(), "field sharing: no sharing strategy set"),
        (gpu(kind="ComputeDomain"), "unsupported kind 'ComputeDomain'"),
        ({**gpu(), "apiVersion": "resource.nvidia.com/v1"}, "unsupported apiVersion/kind"),
    ],
)
def test_bad_nvidia_configs_fail_naming_claim_entry_and_field(
    params: dict[str, Any], expect: str
) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.decode(entry(params, index=2), ref=REF)
    text = str(err.value)
    assert expect in text, text
    assert "ns/c" in text and "config[2] (FromClaim)" in text


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        (
            gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": 1.5}}),
            "field sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "
            "must be a quantity string such as 10Gi",
        ),
        (
            gpu(kind="ComputeDomain"),
            "unsupported kind 'ComputeDomain' of resource.nvidia.com/v1beta1 "
            "(this driver understands GpuConfig and MigDeviceConfig)",
        ),
        (
            mig(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}),
            "field sharing.mpsConfig: cannot use MpsConfig with the 'TimeSlicing' strategy",
        ),
        (
            {**gpu(), "apiVersion": "resource.nvidia.com/v1"},
            "unsupported apiVersion/kind 'resource.nvidia.com/v1'/'GpuConfig' (this driver "
            "understands gpu.nvidia.com/v1 GpuConfig, and resource.nvidia.com/v1beta1 GpuConfig "
            "and MigDeviceConfig)",
        ),
        (
            gpu(
                sharing={
                    "strategy": "MPS",
                    "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1Mi-1"},
                }
            ),
            "field sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: '1Mi-1' is not a quantity",
        ),
    ],
)
def test_config_errors_an_operator_reads_are_exact(params: dict[str, Any], reason: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.decode(entry(params, index=2), ref=REF)
    assert str(err.value).startswith(f"{REF}: opaque config[2] (FromClaim): {reason}"), err.value


def test_pinned_memory_limits_are_whole_mib_and_at_least_one() -> None:
    def limit(value: object) -> dict[str, Any] | None:
        return sharing_of(
            gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": value}})
        )

    assert limit("1Mi") == {"strategy": "MPS", "mps": {"pinnedDeviceMemoryLimit": "1Mi"}}
    assert limit(1048576) == {"strategy": "MPS", "mps": {"pinnedDeviceMemoryLimit": "1048576"}}
    for low in ("1048575", "1Mi-", "0.5Mi"):
        with pytest.raises(config.ConfigError, match=r"value set too low|is not a quantity"):
            limit(low)
    assert config.memory_limit("1Mi") == 1 << 20
    with pytest.raises(ValueError, match=r"^'1048575': value set too low \(MPS limits are whole"):
        config.memory_limit("1048575")
