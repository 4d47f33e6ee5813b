"""API errors and outages through a fault-injecting proxy, against the publishing plugin process.

The plugin reaches the fake API server through :class:`~dra_driver.testing.fakeapi.faultproxy.
FaultProxy`. Each trial injects one fault — an outage (connections refused and reset), a burst
of resets, connections that go silent, HTTP errors (5xx, 429, 409, 410 on the watch), a slice
deleted or edited by someone else — sometimes several at once, then lifts it. During an outage
longer than the publish grace ``/readyz`` must say 503 and a prepare must fail with a clear
error; afterwards, within a deadline: the node's slices are back to what the plugin publishes,
the pool generation went up at most once per change someone else made, ``/readyz`` is 200 and a
claim prepares and unprepares. The plugin must not die.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from dra_driver.slices import compare
from dra_driver.testing import polling
from dra_driver.testing.faultsuite import Row, rig

GRACE_S = 1.0
CONVERGE_S = 30.0
WATCH_S = 3.0
FAULTS = ("outage", "resets", "silence", "http-5xx", "http-429", "conflict", "watch-410", "edit")


def run(size: int, rng: random.Random, workdir: Path, *, long_outage_s: float = 0.0) -> Row:
    """``size`` trials (plus one outage of ``long_outage_s`` when set)."""
    from dra_driver.testing.fakeapi import fakeserver, faultproxy
    from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

    row = Row("API errors and outages (fault proxy)")
    base = workdir / "api"
    base.mkdir(parents=True, exist_ok=True)
    objs = [rig.claim(f"c{i}", [f"gpu-{i}"]) for i in range(4)]
    refs = [rig.ref_of(o) for o in objs]
    server = fakeserver.FakeApiServer(rig.api_with(objs)).start()
    mem = server.api
    host, port = server.url.removeprefix("http://").split(":")
    proxy = faultproxy.FaultProxy((host, int(port))).start()
    plugin = PluginProcess(
        base=base,
        kubeconfig=fakeserver.write_kubeconfig(base / "kc", proxy.url),
        publish=True,
        extra=["--publish-grace", str(GRACE_S), "--watch-timeout", str(WATCH_S)],
    ).start()
    try:
        plugin.wait_ready(timeout_s=60)
        kubelet = KubeletSim(plugin.registry_dir)
        kubelet.register(rig.DRIVER)
        if not polling.poll(lambda: _ready(plugin) and bool(_ours(mem)), CONVERGE_S):
            row.fail("never published / ready before any fault", hang=1)
            return row
        baseline = {s["metadata"]["name"]: compare.content(s) for s in _ours(mem)}
        plan = [rng.choice(FAULTS) for _ in range(size)]
        if long_outage_s:
            plan.insert(len(plan) // 2, "long-outage")
        for index, fault in enumerate(plan):
            row.trials += 1
            before = _generation(mem)
            extra = [rng.choice(FAULTS)] if rng.random() < 0.25 else []
            changes = _inject(fault, rng, proxy, mem, plugin, kubelet, refs, row, long_outage_s)
            for also in extra:
                changes += _inject(also, rng, proxy, mem, plugin, kubelet, refs, row, 0.0)
            proxy.restore()
            mem.clear_faults()
            label = "+".join([fault, *extra])
            _converge(label, index, row, plugin, kubelet, mem, baseline, refs[index % len(refs)])
            bumps = _generation(mem) - before
            if bumps > changes:
                row.fail(f"{label}: generation +{bumps} for {changes} changes of content")
        kubelet.close()
    except (RuntimeError, TimeoutError) as exc:
        row.fail(f"plugin did not start: {str(exc)[:300]}", crash=1)
    finally:
        alive = plugin.proc is not None and plugin.proc.poll() is None
        plugin.kill()
        proxy.stop()
        server.stop()
    if not alive:
        row.fail("the plugin process died", crash=1)
    return row


def _inject(
    fault: str,
    rng: random.Random,
    proxy: Any,
    mem: Any,
    plugin: Any,
    kubelet: Any,
    refs: list[Any],
    row: Row,
    long_outage_s: float,
) -> int:
    """Inject ``fault``; returns how many changes of our slices' content someone else made."""
    ours = _ours(mem)
    name = rng.choice(ours)["metadata"]["name"] if ours else ""
    with_devices = [s["metadata"]["name"] for s in ours if s["spec"].get("devices")]
    if fault in ("outage", "long-outage"):
        proxy.outage()
        seconds = long_outage_s if fault == "long-outage" else rng.uniform(GRACE_S + 2.5, 5.0)
        deleted = bool(name) and rng.random() < 0.5
        if deleted:
            mem.remove_resource_slice(name)
        ref = rng.choice(refs)
        answer = kubelet.prepare([ref]).claims[ref.uid]
        if not answer.error or "internal error" in answer.error:
            row.fail(f"prepare during an outage answered {answer.error[:200]!r}")
        elif not answer.error.startswith("ResourceClaim"):
            row.fail(f"prepare error during an outage does not name the claim: {answer.error}")
        if not polling.poll(lambda: not _ready(plugin), seconds):
            row.fail(f"/readyz stayed 200 through {seconds:.1f}s of outage")
        time.sleep(max(0.0, seconds - GRACE_S))
        return int(deleted)
    if fault == "resets":
        for _ in range(rng.randint(2, 6)):
            proxy.reset_all()
            time.sleep(rng.uniform(0.0, 0.3))
        return 0
    if fault == "silence":
        proxy.blackhole_all()
        if name and rng.random() < 0.5:
            mem.remove_resource_slice(name)
            return 1
        return 0
    if fault in ("http-5xx", "http-429"):
        status = rng.choice([500, 502, 503, 504]) if fault == "http-5xx" else 429
        method = rng.choice(["*", "list_resource_slices", "update_resource_slice", "get_node"])
        mem.fail_next(method, status, times=rng.randint(1, 8))
        if name and rng.random() < 0.5:
            mem.remove_resource_slice(name)
            return 1
        return 0
    if fault == "conflict":
        mem.fail_next("update_resource_slice", 409, times=rng.randint(1, 5))
        mem.fail_next("create_resource_slice", 409, times=rng.randint(0, 2))
        return _edit(mem, rng.choice(with_devices) if with_devices else "")
    if fault == "watch-410":
        mem.fail_next("watch_resource_slices", 410, times=rng.randint(1, 4))
        proxy.reset_all()  # the open watch ends; the next ones are refused as expired
        if name:
            mem.remove_resource_slice(name)
            return 1
        return 0
    if fault == "edit":
        return _edit(mem, rng.choice(with_devices) if with_devices else "")
    raise ValueError(f"unknown fault {fault}")


def _edit(mem: Any, name: str) -> int:
    """Someone else drops a device from our slice."""
    if not name:
        return 0
    changed = mem.get_resource_slice(name)
    changed["spec"]["devices"] = changed["spec"]["devices"][:-1]
    mem.put_resource_slice(changed)
    return 1


def _converge(
    label: str,
    index: int,
    row: Row,
    plugin: Any,
    kubelet: Any,
    mem: Any,
    baseline: dict[str, Any],
    ref: Any,
) -> None:
    def published() -> bool:
        return {s["metadata"]["name"]: compare.content(s) for s in _ours(mem)} == baseline

    if not polling.poll(published, CONVERGE_S):
        row.fail(f"trial {index} ({label}): slices not repaired within {CONVERGE_S:g}s", hang=1)
        return
    if not polling.poll(lambda: _ready(plugin), CONVERGE_S):
        row.fail(f"trial {index} ({label}): /readyz not 200 again within {CONVERGE_S:g}s", hang=1)
        return
    deadline = time.monotonic() + CONVERGE_S
    while True:  # the kubelet retries a failed prepare; the first try may meet a dead connection
        error = kubelet.prepare([ref]).claims[ref.uid].error
        if not error or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if error:
        row.fail(f"trial {index} ({label}): prepare after the fault: {error[:200]}")
    elif kubelet.unprepare([ref]).claims[ref.uid].error:
        row.fail(f"trial {index} ({label}): unprepare after the fault failed")


def _ours(mem: Any) -> list[dict[str, Any]]:
    return [
        s
        for s in mem.all_resource_slices()
        if s["spec"].get("nodeName") == rig.NODE and s["spec"].get("driver") == rig.DRIVER
    ]


def _generation(mem: Any) -> int:
    return max((int(s["spec"]["pool"]["generation"]) for s in _ours(mem)), default=0)


def _ready(plugin: Any) -> bool:
    try:
        status, body = plugin.http_get("/readyz", timeout_s=5)
    except OSError:
        return False
    return status == 200 and bool(json.loads(body)["ready"])
