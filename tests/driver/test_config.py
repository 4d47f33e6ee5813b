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
        (base(sharing={"strategy": "MPS"}), "field sharing.strategy"),
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
