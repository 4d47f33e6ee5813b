"""What an agent's start costs the API server in connections: its warm one, not one per worker.

Every node agent of a fleet starts at once in a rollout (docs/fleet.md): each connection it opens
at start is a TLS handshake at the API server and ~40 KiB the agent keeps. The real agent process
runs against the fake API server until it has published; the server counts what it accepted.
With the default (``--api-warm-connections 1``) that is the warm connection, the watches'
and what requests made side by side needed; asking for sixteen opens sixteen at start.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dra_driver.testing import polling
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import PluginProcess


@pytest.mark.parametrize(("warm", "fewest", "most"), [(None, 1, 8), ("16", 16, 30)])
def test_an_agent_opens_its_warm_connections_at_start_and_no_more(
    short_dir: Path,
    apiserver: fakeserver.FakeApiServer,
    warm: str | None,
    fewest: int,
    most: int,
) -> None:
    agent = PluginProcess(
        base=short_dir,
        kubeconfig=apiserver.write_kubeconfig(short_dir / "kubeconfig"),
        publish=True,
        env={"API_WARM_CONNECTIONS": warm} if warm else None,
    )
    agent.start()
    try:
        agent.wait_ready(timeout_s=60)
        polling.wait_for(
            lambda: bool(apiserver.api.all_resource_slices()),
            what="the first publish",
            timeout_s=60,
        )
        # The pool's start-up fill runs in the background, one connection after the other: on a
        # busy 2-core machine it may still be at it after the first publish. Wait until it has
        # opened the fewest it must, then give it time to open more than it should.
        polling.wait_for(
            lambda: apiserver.stats()["connections"] >= fewest,
            what=f"{fewest} connections",
            timeout_s=30,
        )
        time.sleep(1.0)
        opened = apiserver.stats()["connections"]
        assert fewest <= opened <= most, f"{opened} connections at start (warm: {warm or 1})"
    finally:
        agent.kill()
