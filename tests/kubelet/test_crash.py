"""Crash safety: SIGKILL the plugin at random points of many prepare/unprepare cycles.

After every restart the test kubelet redoes its calls. At the end, with the plugin restarted once
more (recovery runs before its sockets appear), disk must be consistent: no CDI spec without a
prepared claim, no prepared claim without its spec (identical to the checkpointed one), nothing
half-done, and every claim must unprepare cleanly and prepare again.
"""

from __future__ import annotations

import functools
import json
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from dra_driver.driver import claims
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim

BUDGET_S = 10.0  # killing and restarting; the whole test stays near 20 s
MIN_CALLS = 3  # completed calls between the kills, however slow the machine (up to CAP_S)
CAP_S = 90.0


def _churn(
    kubelet: KubeletSim,
    refs: list[claims.ClaimRef],
    rng: random.Random,
    stop: threading.Event,
    outcome: dict[str, list[str]],
) -> None:
    """Random batches of prepare/unprepare until the plugin dies or ``stop`` is set."""
    while not stop.is_set():
        batch = rng.sample(refs, rng.randint(1, len(refs)))
        try:
            call = kubelet.prepare if rng.random() < 0.5 else kubelet.unprepare
            response = call(batch)
        except grpc.RpcError:
            outcome["interrupted"].append("killed under a call")
            return
        outcome["errors"] += [c.error for c in response.claims.values() if c.error]
        outcome["calls"].append("ok")


def kill_under_load(
    make_plugin: Callable[[], PluginProcess],
    refs: list[claims.ClaimRef],
    rng: random.Random,
    outcome: dict[str, list[str]],
    pause_s: tuple[float, float],
) -> int:
    """Start a plugin (``make_plugin``), churn prepare/unprepare, SIGKILL it after a random
    pause; again and again for ``BUDGET_S``, and on slow machines until at least three kills
    and ``MIN_CALLS`` completed calls (so that the run did work between kills), up to
    ``CAP_S``. The kill count."""
    kills = 0
    started = time.monotonic()

    def more() -> bool:
        elapsed = time.monotonic() - started
        enough = kills >= 3 and len(outcome["calls"]) >= MIN_CALLS
        return elapsed < CAP_S and (elapsed < BUDGET_S or not enough)

    while more():
        plugin = make_plugin().start()
        plugin.wait_ready()
        kubelet = KubeletSim(plugin.registry_dir)
        kubelet.register("gpu.nvidia.com")
        stop = threading.Event()
        churn = threading.Thread(target=_churn, args=(kubelet, refs, rng, stop, outcome))
        churn.start()
        time.sleep(rng.uniform(*pause_s))
        plugin.signal(signal.SIGKILL)
        plugin.wait()
        stop.set()
        churn.join(timeout=60)
        kubelet.close()
        kills += 1
    return kills


def test_sigkill_at_random_points_leaves_consistent_state(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    rng = random.Random(4)
    refs = [put_claim(apiserver, f"c{i}", [f"gpu-{i}"], namespace="crash") for i in range(8)]
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    outcome: dict[str, list[str]] = {"errors": [], "calls": [], "interrupted": []}
    make = functools.partial(PluginProcess, base=short_dir, kubeconfig=kubeconfig)
    kills = kill_under_load(make, refs, rng, outcome, (0.05, 0.4))
    assert kills >= 3
    assert outcome["errors"] == []
    assert len(outcome["interrupted"]) >= kills - 1  # the kills landed in the middle of calls
    assert len(outcome["calls"]) >= MIN_CALLS

    plugin = PluginProcess(base=short_dir, kubeconfig=kubeconfig).start()
    try:
        plugin.wait_ready()
        cdi = {p.name for p in plugin.cdi_root.glob("*.json")}
        records = {
            p.stem: json.loads(p.read_text())
            for p in (plugin.plugins_dir / "gpu.nvidia.com" / "claims").glob("*.json")
        }
        assert all(r["state"] == "PrepareCompleted" for r in records.values())
        assert cdi == {f"k8s.gpu.nvidia.com-claim_{uid}.json" for uid in records}
        for uid, rec in records.items():
            on_disk = json.loads(
                (plugin.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text()
            )
            assert on_disk == rec["cdiSpec"]
        assert not [p for p in plugin.cdi_root.iterdir() if p.name.startswith(".")]
        assert not list((plugin.plugins_dir / "gpu.nvidia.com" / "claims-aside").glob("*"))

        kubelet = KubeletSim(plugin.registry_dir)
        kubelet.register("gpu.nvidia.com")
        response = kubelet.unprepare(refs)
        assert {c.error for c in response.claims.values()} == {""}
        assert list(plugin.cdi_root.glob("*.json")) == []
        response = kubelet.prepare(refs)
        assert {c.error for c in response.claims.values()} == {""}, response
        assert len(list(plugin.cdi_root.glob("*.json"))) == len(refs)
        kubelet.close()
    finally:
        plugin.kill()
