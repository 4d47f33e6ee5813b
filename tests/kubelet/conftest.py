"""Fixtures for the kubelet edge: a fake API server on loopback, short temp dirs for sockets."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.testing.fakeapi import fakeserver, memory


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temp dir under /tmp with a short name (unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def apiserver() -> Iterator[fakeserver.FakeApiServer]:
    server = fakeserver.FakeApiServer(memory.InMemoryApi(use_default_cel=False)).start()
    yield server
    server.stop()
