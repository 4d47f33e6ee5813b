"""Reconnecting after an API server outage, as a fleet of agents does it: jittered, bounded
retries (a thousand agents must not come back in the same 100 ms), and no rewrite of slices that
did not change (a real agent process, the fake API server over HTTP stopped and restarted)."""

from __future__ import annotations

import re
from pathlib import Path

from dra_driver.slices import publisher
from dra_driver.testing import kubeletsim, polling
from dra_driver.testing.fakeapi import fakeserver, memory, requestlog

WRITES = {"create", "update", "delete"}


def test_a_fleets_first_retries_are_jittered_and_every_retry_is_bounded() -> None:
    """The backoffs a publisher really uses: its reconcile retries and its watch's."""
    mem = memory.InMemoryApi()
    agents = [
        publisher.Publisher(kube=mem, driver_name="gpu.nvidia.com", node_name=f"n{i}")
        for i in range(100)
    ]
    for pick in (lambda p: p._backoff, lambda p: p._watch_backoff):
        first = [pick(p).next_delay() for p in agents]
        assert max(first) - min(first) > 0.1, "100 agents' first retries within 100 ms"
        initial = pick(agents[0]).initial_s
        assert all(initial / 2 <= d <= initial for d in first)
        later = [pick(agents[0]).next_delay() for _ in range(30)]
        assert max(later) <= pick(agents[0]).max_s  # bounded, however long the outage
        assert later[-1] >= pick(agents[0]).max_s / 2


def test_an_agent_rewrites_no_unchanged_slice_after_the_api_server_restarts(
    tmp_path: Path,
) -> None:
    """The restarted server has lost the watch history (as a restarted watch cache): the
    agent's watch is refused as too old, it lists again and reconciles — and writes nothing."""
    mem = memory.InMemoryApi(history=4)
    mem.put_node("n1")
    log = requestlog.RequestLog()
    server = fakeserver.FakeApiServer(mem, requests=log).start()
    port = int(server.url.rsplit(":", 1)[1])
    agent = kubeletsim.PluginProcess(
        base=tmp_path,
        kubeconfig=server.write_kubeconfig(tmp_path / "kc"),
        node="n1",
        publish=True,
    ).start()
    try:
        polling.wait_for(lambda: published(agent) >= 1, what="the first publish", timeout_s=60)
        writes, lists = count(log, WRITES), count(log, {"list"})
        assert writes >= 1  # the first publish
        passes = published(agent)
        server.stop()
        for i in range(6):  # meanwhile the history the agent's watch would resume from goes
            mem.put_node(f"other-{i}")
            mem.put_resource_slice(other_slice(i))
        server = fakeserver.FakeApiServer(mem, port=port, requests=log).start()
        polling.wait_for(
            lambda: published(agent) > passes, what="a pass after the reconnect", timeout_s=60
        )
        assert count(log, {"list"}) > lists  # it did re-read its slices after the reconnect
        assert count(log, WRITES) == writes  # and wrote none of them again
    finally:
        agent.kill()
        server.stop()


def count(log: requestlog.RequestLog, verbs: set[str]) -> int:
    return sum(
        r["requests"]
        for r in log.snapshot()
        if r["resource"] == "resourceslices" and r["verb"] in verbs and not r["dryRun"]
    )


def published(agent: kubeletsim.PluginProcess) -> int:
    """The agent's successful reconcile passes (its /metrics)."""
    try:
        _, text = agent.http_get("/metrics", timeout_s=30)
    except OSError:
        return -1
    match = re.search(r'resourceslice_publish_total\{result="success"\} (\S+)', text)
    return int(float(match.group(1))) if match else 0


def other_slice(i: int) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"other-{i}"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": f"other-{i}",
            "pool": {"name": f"other-{i}", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }
