"""The agent's health socket: one JSON line each way, bad requests answered without harm, the
socket served again when someone deletes it (the kubelet empties its device-plugin directory)."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dra_driver import healthcontrol


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def echo(request: Mapping[str, Any]) -> dict[str, Any]:
    if request.get("op") == "boom":
        raise RuntimeError("handler bug")
    return {"ok": request.get("op") == "status", "error": "not status", "got": dict(request)}


def raw(path: Path, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        sock.sendall(payload)
        return sock.makefile("rb").readline()


def test_requests_errors_and_a_deleted_socket(short_dir: Path) -> None:
    path = short_dir / "health.sock"
    server = healthcontrol.ControlServer(path, echo, check_s=0.05)
    server.start()
    try:
        assert healthcontrol.request(path, {"op": "status"})["got"] == {"op": "status"}
        with pytest.raises(healthcontrol.ControlError, match="not status"):
            healthcontrol.request(path, {"op": "other"})
        assert b'"bad request' in raw(path, b"not json\n")
        assert b"internal error" in raw(path, b'{"op": "boom"}\n')
        path.unlink()
        deadline = time.monotonic() + 10
        while not path.exists():
            assert time.monotonic() < deadline, "socket not served again"
            time.sleep(0.02)
        assert healthcontrol.request(path, {"op": "status"})["ok"]
    finally:
        server.stop()
    assert not path.exists()
    with pytest.raises(healthcontrol.ControlError, match="no node agent health socket"):
        healthcontrol.request(path, {"op": "status"})
