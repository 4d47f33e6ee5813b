"""Slices never hold more devices than the API allows: once a device that lowers the limit to
64 (taints, counters, list attributes) is in a chunk, the chunk stays within 64 however many
plain devices follow it."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.slices import build, validate

TAINT = [{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]


def devices(count: int, special: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": f"d{i}", **special.get(i, {})} for i in range(count)]


@pytest.mark.parametrize(
    ("count", "special", "sizes"),
    [
        (100, {0: {"taints": TAINT}}, [64, 36]),  # the first device lowers the limit
        (200, {0: {"taints": TAINT}}, [64, 128, 8]),  # and only for its own chunk
        (130, {1: {"attributes": {"l": {"ints": [1, 2]}}}}, [64, 66]),
        (
            100,
            {5: {"consumesCounters": [{"counterSet": "s", "counters": {"c": {"value": "1"}}}]}},
            [64, 36],
        ),
        (128, {}, [128]),
        (129, {}, [128, 1]),
    ],
)
def test_chunks_respect_the_limit_of_their_devices(
    count: int, special: dict[int, dict[str, Any]], sizes: list[int]
) -> None:
    chunks = build.split(devices(count, special))
    assert [len(c) for c in chunks] == sizes
    for chunk in chunks:
        limit = 64 if any(validate.uses_special_limit(d) for d in chunk) else 128
        assert len(chunk) <= limit
