"""kubectl's conventions as processes: the commands that talk to a cluster find it through
``--kubeconfig``, else the ``KUBECONFIG`` list (merged), else ``~/.kube/config`` under a real
temp ``HOME``, else in-cluster; ``--context`` picks another context; a bad kubeconfig is one line
naming the file and the reason, exit 2. Two in-memory API servers tell which one was used."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cli
from dra_driver.cli import common
from dra_driver.testing.fakeapi import fakeserver

TOKEN = "t0ken"


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    first = fakeserver.FakeApiServer(token=TOKEN).start()
    second = fakeserver.FakeApiServer(token=TOKEN).start()
    try:
        yield first.url, second.url
    finally:
        first.stop()
        second.stop()


def kubeconfig(path: Path, current: str | None, **clusters: str) -> Path:
    """A kubeconfig with a cluster, user and context named after each keyword (its URL)."""
    doc: dict[str, Any] = {
        "clusters": [{"name": n, "cluster": {"server": url}} for n, url in clusters.items()],
        "users": [{"name": n, "user": {"token": TOKEN}} for n in clusters],
        "contexts": [{"name": n, "context": {"cluster": n, "user": n}} for n in clusters],
    }
    if current:
        doc["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def run(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
    }
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "HOME": str(home), **env},
    )


def server_used(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("API server: "), proc.stdout
    return first.removeprefix("API server: ")


def test_home_kubeconfig_is_read_without_flags(servers: tuple[str, str], tmp_path: Path) -> None:
    one, two = servers
    home = tmp_path / "home"
    kubeconfig(home / ".kube" / "config", "a", a=one)
    assert server_used(run(home, "doctor")) == one
    # --kubeconfig wins over ~/.kube/config, and KUBECONFIG over it too.
    other = kubeconfig(tmp_path / "other", "b", b=two)
    assert server_used(run(home, "doctor", "--kubeconfig", str(other))) == two
    assert server_used(run(home, "doctor", KUBECONFIG=str(other))) == two
    assert (
        server_used(
            run(home, "doctor", "--kubeconfig", str(home / ".kube/config"), KUBECONFIG=str(other))
        )
        == one
    )


def test_kubeconfig_list_merges_first_file_wins(servers: tuple[str, str], tmp_path: Path) -> None:
    one, two = servers
    home = tmp_path / "home"
    home.mkdir()
    # The first file sets cluster "shared" (and no current-context); the second sets
    # current-context "shared" and its own cluster "shared", which loses to the first's.
    first = kubeconfig(tmp_path / "first", None, shared=one)
    second = kubeconfig(tmp_path / "second", "shared", shared=two, other=two)
    listed = f"{tmp_path}/missing:{first}:{second}"
    assert server_used(run(home, "doctor", KUBECONFIG=listed)) == one
    assert server_used(run(home, "doctor", "--context", "other", KUBECONFIG=listed)) == two
    # slices asks the server when given --context (the kubeconfig found as kubectl finds it).
    proc = run(
        home,
        "slices",
        "--node-name",
        "n1",
        "--fake",
        "pcie-l4",
        "--context",
        "other",
        KUBECONFIG=listed,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(f"API server {two} ("), proc.stderr
    proc = run(home, "capacity", "--context", "other", KUBECONFIG=listed)
    assert proc.returncode == 0, proc.stderr  # an empty cluster: no nodes, nothing fits


def test_kubeconfig_errors_name_the_file_and_exit_2(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bad = tmp_path / "bad"
    bad.write_text("this: is: not: [valid\n")
    good = kubeconfig(tmp_path / "good", "a", a="https://127.0.0.1:1")
    cases = {
        f"{tmp_path}/x:{tmp_path}/y": f"KUBECONFIG names no file that exists ({tmp_path}/x, "
        f"{tmp_path}/y)",
        f"{good}:{bad}": f"cannot load kubeconfig {bad}: not valid YAML at line 1, column 9: "
        "mapping values are not allowed here",
    }
    for listed, reason in cases.items():
        for command in (
            ["doctor"],
            ["capacity"],
            ["publish", "--node-name", "n", "--fake", "dgx-h100"],
        ):
            proc = run(home, *command, KUBECONFIG=listed)
            assert proc.returncode == 2, (command, proc.stderr)
            assert proc.stderr.splitlines() == [f"dra-driver: error: {reason}"], command
    proc = run(home, "doctor", "--context", "nope", KUBECONFIG=str(good))
    assert proc.returncode == 2
    assert f"kubeconfig {good}: no context named 'nope'" in proc.stderr
    proc = run(home, "doctor")  # nothing to read, not in a pod
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert f"KUBECONFIG not set and no {home}/.kube/config" in proc.stderr


def test_every_cluster_command_has_context(tmp_path: Path) -> None:
    for command in (
        "doctor",
        "capacity",
        "publish",
        "slices",
        "kubelet-plugin",
        "device-plugin",
        "controller",
    ):
        proc = run(tmp_path, command, "--help")
        assert proc.returncode == 0, proc.stderr
        text = " ".join(proc.stdout.split())
        assert "--context CONTEXT" in text and "--kubeconfig KUBECONFIG" in text, command
    for command in ("controller", "kubelet-plugin"):
        text = run(tmp_path, command, "--help").stdout
        assert re.search(r"--namespace \w+, -n \w+", text), command


def test_the_controller_namespace_defaults_to_the_context_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    path = kubeconfig(tmp_path / ".kube" / "config", "a", a="https://127.0.0.1:1", b="https://b")
    doc = json.loads(path.read_text())
    doc["contexts"][1]["context"]["namespace"] = "team-b"
    path.write_text(json.dumps(doc))

    def namespace(*argv: str) -> str | None:
        args = cli.build_parser().parse_args(["controller", *argv])
        return common.namespace_from(args)

    assert namespace() is None  # context a names none (and this is no pod)
    assert namespace("--context", "b") == "team-b"
    assert namespace("--context", "b", "-n", "mine") == "mine"
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert namespace("--context", "b") == "from-env"
