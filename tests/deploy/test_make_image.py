"""``make image`` builds with docker or podman, whichever is installed, under the image name the
chart and the static manifest use by default; with neither it says so (exit 2).

The engines are fakes on ``PATH`` that record how they were called: no image is built (that
needs a base image from a registry), but the target's choice, tag and arguments are the real
Makefile's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deployments" / "helm" / "dra-driver"
STATIC = REPO / "deployments" / "static" / "dra-driver.yaml"


def _version() -> str:
    found = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert found is not None
    return found.group(1)


def _bin(tmp_path: Path, engines: tuple[str, ...]) -> Path:
    """A PATH directory with make, sh, git, sed and the fake engines (nothing else)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("make", "sh", "git", "sed", "env"):
        real = shutil.which(tool)
        assert real is not None, tool
        (bindir / tool).symlink_to(real)
    for engine in engines:
        script = bindir / engine
        script.write_text(f'#!/bin/sh\necho "{engine} $*" >> "$ENGINE_LOG"\n', encoding="utf-8")
        script.chmod(0o755)
    return bindir


def _make(tmp_path: Path, engines: tuple[str, ...], *args: str) -> tuple[int, str, str]:
    bindir = _bin(tmp_path, engines)
    log = tmp_path / "engine.log"
    env = {"PATH": str(bindir), "ENGINE_LOG": str(log), "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(bindir / "make"), "--no-print-directory", "-C", str(REPO), "image", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = log.read_text() if log.exists() else ""
    return done.returncode, done.stdout + done.stderr, calls


@pytest.mark.parametrize(
    ("engines", "used"),
    [(("podman",), "podman"), (("docker",), "docker"), (("docker", "podman"), "docker")],
)
def test_builds_with_the_engine_installed(
    tmp_path: Path, engines: tuple[str, ...], used: str
) -> None:
    rc, out, calls = _make(tmp_path, engines)
    assert rc == 0, out
    [call] = calls.splitlines()
    tag = f"dra-driver:{_version()}"
    assert call.startswith(f"{used} build -t {tag} --build-arg VERSION={_version()} "), call
    assert call.endswith(" ."), call
    assert f"building {tag} with {tmp_path / 'bin' / used}" in out


def test_image_and_engine_can_be_chosen(tmp_path: Path) -> None:
    rc, out, calls = _make(
        tmp_path,
        ("docker", "podman"),
        "IMAGE=registry.example.com/gpu/dra-driver:9",
        "CONTAINER_ENGINE=podman",
    )
    assert rc == 0, out
    assert calls.startswith("podman build -t registry.example.com/gpu/dra-driver:9 "), calls


def test_neither_engine_is_one_clear_line(tmp_path: Path) -> None:
    rc, out, calls = _make(tmp_path, ())
    assert rc == 2
    assert "make image: neither docker nor podman is installed" in out
    assert calls == ""


def test_chart_and_static_default_to_the_image_make_builds() -> None:
    """A user who runs ``make image`` has the image the defaults name (kind loads it as is)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    tag = values["image"]["tag"] or chart["appVersion"]
    made = f"dra-driver:{_version()}"
    assert f"{values['image']['repository']}:{tag}" == made
    images = {
        c["image"]
        for doc in yaml.safe_load_all(STATIC.read_text())
        if doc and doc.get("kind") in {"DaemonSet", "Deployment"}
        for c in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {made}


def test_make_help_lists_only_real_targets() -> None:
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    targets = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("make ")]
    assert {"demo", "test", "dev", "image"} <= set(targets)
    for target in targets:
        dry = subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(REPO), target],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "No rule to make target" not in dry.stderr, target
