"""The stand-in IMEX daemon: ready once every peer of its nodes config answers for the same
domain, following the nodes config, exiting when its directory goes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.computedomain import fakeimex, imexconfig


@pytest.fixture
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _daemon(directory: Path, ip: str, domain: str) -> subprocess.Popen[bytes]:
    env = {"IMEX_NODE_IP": ip, "COMPUTE_DOMAIN_UUID": domain, "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dra_driver.computedomain.fakeimex",
            "--config-dir",
            str(directory),
            "--interval",
            "0.05",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _state(directory: Path) -> dict[str, object]:
    try:
        return dict(json.loads((directory / imexconfig.STATUS).read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def _until(check: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    running: list[subprocess.Popen[bytes]] = []
    yield running
    for proc in running:
        proc.kill()
        proc.wait(10)


def test_two_daemons_become_ready_together_and_follow_the_nodes_config(
    tmp_path: Path, port: int, procs: list[subprocess.Popen[bytes]]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for directory in (a, b):
        imexconfig.write_config(directory, port=port, domain="test")
        imexconfig.write_nodes(directory, ["127.0.0.61", "127.0.0.62"])
    procs.append(_daemon(a, "127.0.0.61", "d1"))
    _until(lambda: _state(a).get("state") == "NOT_READY")  # its peer does not answer yet
    assert not imexconfig.daemon_ready(a)
    procs.append(_daemon(b, "127.0.0.62", "d1"))
    _until(lambda: imexconfig.daemon_ready(a) and imexconfig.daemon_ready(b))
    assert _state(a)["peers"] == {"127.0.0.62": True}
    imexconfig.write_nodes(a, ["127.0.0.61", "127.0.0.62", "127.0.0.63"])  # a peer joins
    _until(lambda: _state(a).get("state") == "NOT_READY")
    imexconfig.write_nodes(a, ["127.0.0.61", "127.0.0.62"])  # ... and leaves
    _until(lambda: imexconfig.daemon_ready(a))
    imexconfig.remove(a)
    assert procs[0].wait(10) == 0  # its claim was unprepared: the daemon ends


def test_a_peer_of_another_domain_does_not_count(
    tmp_path: Path, port: int, procs: list[subprocess.Popen[bytes]]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for directory in (a, b):
        imexconfig.write_config(directory, port=port, domain="test")
        imexconfig.write_nodes(directory, ["127.0.0.64", "127.0.0.65"])
    procs.append(_daemon(a, "127.0.0.64", "d1"))
    procs.append(_daemon(b, "127.0.0.65", "d2"))
    # b answers for its own domain (once it listens), never for a's.
    _until(lambda: fakeimex.ask("127.0.0.65", port, "d2"))
    assert not fakeimex.ask("127.0.0.65", port, "d1")
    since = time.time()  # a round of a's after b listens still finds no peer of d1 there
    _until(lambda: float(_state(a).get("time") or 0) > since + 0.1)
    assert _state(a).get("peers") == {"127.0.0.65": False}
    assert not imexconfig.daemon_ready(a)


def test_a_stale_status_is_not_ready(tmp_path: Path) -> None:
    imexconfig.write_status(tmp_path, imexconfig.READY_STATE)
    assert imexconfig.daemon_ready(tmp_path)
    assert not imexconfig.daemon_ready(tmp_path, now=time.time() + imexconfig.STALE_S + 1)
