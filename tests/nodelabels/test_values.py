"""Label values: GFD's sanitising, and always valid for the API server (63 characters)."""

from __future__ import annotations

import pytest

from dra_driver.apimachinery import names
from dra_driver.nodelabels import values


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("Tesla V100-SXM2-32GB", "Tesla-V100-SXM2-32GB"),
        ("NVIDIA TITAN X (Pascal)", "NVIDIA-TITAN-X-Pascal"),  # parentheses dropped
        ("  NVIDIA   H100 NVL ", "NVIDIA-H100-NVL"),  # space runs → one '-'
        ("NVIDIA H100\tNVL", "NVIDIA-H100NVL"),  # GFD drops a tab like any other character
        ("GeForce RTX™ 4090 /OEM", "GeForce-RTX-4090-OEM"),
    ],
)
def test_sanitize_like_gfd(raw: str, want: str) -> None:
    assert values.sanitize(raw) == want


def test_product_joins_parts_and_marks_sharing() -> None:
    assert values.product(["NVIDIA A100-SXM4-40GB"], shared=False) == "NVIDIA-A100-SXM4-40GB"
    assert (
        values.product(["NVIDIA A100-SXM4-40GB", "MIG", "1g.5gb"], shared=True)
        == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    )
    assert values.product(["(?)"], shared=True) == ""  # nothing left: no SHARED alone


def test_long_product_cuts_only_the_model_and_keeps_the_suffix() -> None:
    model = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    # GFD would write NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition-MIG-1g.24gb (67)
    full = values.product([model, "MIG", "1g.24gb"], shared=False)
    assert full == "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edi-MIG-1g.24gb"
    shared = values.product([model, "MIG", "1g.24gb"], shared=True)
    assert shared == "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstat-MIG-1g.24gb-SHARED"
    for value in (full, shared):
        assert len(value) == 63 and names.label_value(value) == [], value


def test_a_cut_never_leaves_a_separator_at_the_end() -> None:
    # 51 characters of model, so the cut to make room for "-MIG-1g.10gb" lands right after '-'
    model = "A" * 50 + "-" + "B" * 20
    value = values.product([model, "MIG", "1g.10gb"], shared=False)
    assert value == "A" * 50 + "-MIG-1g.10gb"
    assert names.label_value(value) == []


def test_a_value_without_a_suffix_is_cut_at_63() -> None:
    value = values.product(["X" * 80], shared=False)
    assert value == "X" * 63


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("DGX H100", "DGX-H100"),
        ("PowerEdge XE9680 (Rev. A)", "PowerEdge-XE9680-Rev.-A"),
        ("--Standard PC (Q35 + ICH9, 2009)--", "Standard-PC-Q35-ICH9-2009"),
        ("", "unknown"),
        (None, "unknown"),
        ("()", "unknown"),
        ("x" * 100, "x" * 63),
    ],
)
def test_free_text_is_always_a_valid_value(raw: str | None, want: str) -> None:
    value = values.text(raw)
    assert value == want
    assert names.label_value(value) == []


@pytest.mark.parametrize(
    ("cc", "family"),
    [
        ("3.7", "kepler"),
        ("6.0", "pascal"),
        ("7.0", "volta"),
        ("7.5", "turing"),
        ("8.0", "ampere"),
        ("8.6", "ampere"),
        ("8.9", "ada-lovelace"),
        ("9.0", "hopper"),
        ("10.0", "blackwell"),
        ("12.0", "blackwell"),
        ("11.0", "undefined"),
        ("", "undefined"),
    ],
)
def test_family_from_compute_capability(cc: str, family: str) -> None:
    assert values.family(cc) == family


def test_driver_version_parts() -> None:
    assert values.driver_parts("580.95.05") == ("580", "95", "05")
    assert values.driver_parts("550.54") == ("550", "54", "")
    assert values.driver_parts("580") is None
    assert values.driver_parts("1.2.3.4") is None
    assert values.driver_parts("580.95.05-custom") is None
