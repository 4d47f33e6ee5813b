"""deployments/static/ is the chart rendered with default values, byte for byte."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import yaml


def test_static_manifests_match_the_chart(rc: ModuleType) -> None:
    assert rc.STATIC.is_file(), f"{rc.STATIC} missing: run scripts/render_chart.py --write-static"
    assert rc.STATIC.read_text() == rc.static_text(), (
        "deployments/static/dra-driver.yaml is stale: run scripts/render_chart.py --write-static"
    )


def test_static_manifests_are_valid_objects(rc: ModuleType) -> None:
    docs = [d for d in yaml.safe_load_all(rc.STATIC.read_text()) if d is not None]
    kinds = [d["kind"] for d in docs]
    assert kinds.index("ValidatingAdmissionPolicy") < kinds.index("DaemonSet")
    assert {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DeviceClass",
        "ValidatingAdmissionPolicyBinding",
    } <= set(kinds)
    manifests = [rc.Manifest(source="static", text="", obj=d) for d in docs]
    assert rc.validate(manifests) == []


def test_check_static_cli_reports_drift(
    rc: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "dra-driver.yaml"
    stale.write_text(rc.static_text().replace("maxUnavailable: 1", "maxUnavailable: 2"))
    monkeypatch.setattr(rc, "STATIC", stale)
    monkeypatch.setattr(rc, "REPO", tmp_path)
    assert rc.main(["--check-static"]) == 1
    assert rc.main(["--write-static"]) == 0
    assert rc.main(["--check-static"]) == 0
