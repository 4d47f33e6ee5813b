"""Strict decoding of our opaque GpuConfig: every mistake names the claim, entry and field."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.driver import claims, config

REF = claims.ClaimRef(uid="u-1", namespace="ns", name="c")


def entry(params: Any, index: int = 0, source: str = "FromClaim") -> claims.OpaqueConfig:
    return claims.OpaqueConfig(index=index, source=source, requests=(), parameters=params)


def base(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "gpu.nvidia.com/v1", "kind": "GpuConfig", **fields}


def test_minimal_and_full_configs_decode() -> None:
    assert config.decode(entry(base()), ref=REF) == config.DEFAULT
    full = config.decode(
        entry(
            base(
                sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
                env={"MY_VAR": "1"},
            )
        ),
        ref=REF,
    )
    assert full.sharing is not None and full.sharing.time_slicing is not None
    assert full.sharing.time_slicing.interval == "Long"
    assert full.to_json() == base(
        sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
        env={"MY_VAR": "1"},
    )


@pytest.mark.parametrize(
    ("params", "expect"),
    [
        (base(sharng={"strategy": "TimeSlicing"}), "field sharng: unknown field"),
        (base(sharing={"strategy": "TimeSlicing", "slices": 4}), "field sharing.slices: unknown"),
        (base(sharing={"strategy": "Fabric"}), "field sharing.strategy"),
        (base(sharing={"strategy": 7}), "field sharing.strategy"),
        (
            base(sharing={"strategy": "MPS", "mps": {"activeThreadPercentage": "50"}}),
            "field sharing.mps.activeThreadPercentage: Input should be a valid integer",
        ),
        (
            base(sharing={"strategy": "MPS", "mps": {"activeThreadPercentage": 101}}),
            "field sharing.mps.activeThreadPercentage",
        ),
        (
            base(sharing={"strategy": "MPS", "mps": {"pinnedDeviceMemoryLimit": "lots"}}),
            "'lots' is not a quantity",
        ),
        (
            base(sharing={"strategy": "MPS", "mps": {"pinnedDeviceMemoryLimit": "512Ki"}}),
            "value set too low",
        ),
        (
            base(sharing={"strategy": "MPS", "mps": {"perDevicePinnedMemoryLimits": {"x": "1Gi"}}}),
            "'x' is neither a device UUID nor a device index",
        ),
        (base(sharing={"strategy": "MPS", "mps": {"threads": 5}}), "field sharing.mps.threads"),
        (
            base(sharing={"strategy": "TimeSlicing", "mps": {}}),
            "mps may only be set with strategy MPS",
        ),
        (base(sharing={}), "field sharing.strategy: required field is missing"),
        (
            base(sharing={"strategy": "Exclusive", "timeSlicing": {}}),
            "timeSlicing may only be set with strategy TimeSlicing",
        ),
        (base(env={"1BAD": "x"}), "'1BAD' is not a valid environment variable name"),
        (base(env={"A": 1}), "field env.A"),
        ({"apiVersion": "gpu.nvidia.com/v2", "kind": "GpuConfig"}, "unsupported apiVersion/kind"),
        ({"kind": "GpuConfig"}, "unsupported apiVersion/kind None/'GpuConfig'"),
        (base(kind="MigConfig"), "unsupported"),
    ],
)
def test_bad_configs_are_errors_naming_claim_entry_and_field(params: Any, expect: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.decode(entry(params, index=3), ref=REF)
    text = str(err.value)
    assert expect in text
    assert "ns/c" in text and "config[3] (FromClaim)" in text


def test_mps_config_decodes() -> None:
    cfg = config.decode(
        entry(
            base(
                sharing={
                    "strategy": "MPS",
                    "mps": {
                        "activeThreadPercentage": 40,
                        "pinnedDeviceMemoryLimit": "8Gi",
                        "perDevicePinnedMemoryLimits": {"1": "2Gi", "GPU-abc": "1Gi"},
                    },
                }
            )
        ),
        ref=REF,
    )
    assert cfg.sharing is not None and cfg.sharing.mps is not None
    assert cfg.sharing.mps.active_thread_percentage == 40
    assert cfg.sharing.mps.pinned_device_memory_limit == "8Gi"
    assert config.memory_limit("8Gi") == 8 << 30
    assert cfg.to_json()["sharing"]["mps"]["perDevicePinnedMemoryLimits"] == {
        "1": "2Gi",
        "GPU-abc": "1Gi",
    }


def test_merge_in_order_later_wins() -> None:
    merged = config.effective(
        [
            entry(
                base(sharing={"strategy": "Exclusive"}, env={"A": "1", "B": "1"}), 0, "FromClass"
            ),
            entry(base(env={"B": "2"}), 1),
            entry(base(sharing={"strategy": "TimeSlicing"}), 2),
        ],
        ref=REF,
    )
    assert merged.env == {"A": "1", "B": "2"}
    assert merged.sharing is not None and merged.sharing.strategy == "TimeSlicing"
    assert config.effective([], ref=REF) == config.DEFAULT
