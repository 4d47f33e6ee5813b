"""Concurrent calls with duplicates and contested GPUs, against the plugin process.

Rounds of two phases. Prepare: several kubelet connections at once send batches of claims, each
batch with repeats, where three claims want each of six GPUs exclusively (only one can have it).
Afterwards every claim that was answered "prepared" must be prepared on disk with the devices it
was told, every answer for one claim must be the same, no GPU may be held by two claims, and a
claim refused as busy must not be prepared. Unprepare: the same claims, concurrently and
repeated, all go; nothing may be left. Each call is a trial.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
from pathlib import Path
from typing import Any

import grpc

from dra_driver.testing.faultsuite import Row, rig

WORKERS = 8


def run(size: int, rng: random.Random, workdir: Path) -> Row:
    """About ``size`` calls in all."""
    from dra_driver.testing.fakeapi import fakeserver
    from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

    row = Row("concurrent calls (duplicates, contested GPUs)")
    base = workdir / "cc"
    base.mkdir(parents=True, exist_ok=True)
    objs = [rig.claim(f"g{gpu}-{n}", [f"gpu-{gpu}"]) for gpu in range(6) for n in range(3)]
    objs.append(rig.claim("pair", ["gpu-6", "gpu-7"], interval="Medium"))
    objs.append(rig.claim("pair-admin", ["gpu-6", "gpu-7"], interval="Medium", admin=True))
    refs = [rig.ref_of(o) for o in objs]
    gpu_of = {rig.ref_of(o).uid: o["status"]["allocation"]["devices"]["results"] for o in objs}
    server = fakeserver.FakeApiServer(rig.api_with(objs)).start()
    plugin = PluginProcess(base=base, kubeconfig=server.write_kubeconfig(base / "kc")).start()
    kubelets: list[Any] = []
    try:
        plugin.wait_ready(timeout_s=60)
        for _ in range(WORKERS):
            kubelet = KubeletSim(plugin.registry_dir)
            kubelet.register(rig.DRIVER)
            kubelets.append(kubelet)
        per_phase = max(WORKERS, size // 4)
        rounds = max(1, size // (2 * per_phase))
        for _ in range(rounds):
            answers = _phase(row, kubelets, refs, rng, per_phase, prepare=True)
            _check_prepared(row, answers, rig.audit(rig.settings(base)), gpu_of)
            _phase(row, kubelets, refs, rng, per_phase, prepare=False)
            found = rig.audit(rig.settings(base))
            if found.prepared or not found.ok:
                row.fail(
                    f"after unpreparing everything: {found.describe() or found.prepared}",
                    leaked=len(found.leaked),
                )
    except (RuntimeError, TimeoutError) as exc:
        row.fail(f"plugin did not start: {str(exc)[:300]}", crash=1)
    finally:
        alive = plugin.proc is not None and plugin.proc.poll() is None
        for kubelet in kubelets:
            kubelet.close()
        plugin.kill()
        server.stop()
    if not alive:
        row.fail("the plugin process died", crash=1)
    return row


def _phase(
    row: Row, kubelets: list[Any], refs: list[Any], rng: random.Random, calls: int, *, prepare: bool
) -> dict[str, list[tuple[str, ...] | str]]:
    """``calls`` batches over all connections at once; claim uid → every answer (the device
    IDs, or the error)."""
    answers: dict[str, list[tuple[str, ...] | str]] = {}
    lock = threading.Lock()
    batches = []
    for i in range(calls):
        batch = rng.sample(refs, rng.randint(1, 4))
        batch += rng.sample(batch, rng.randint(0, len(batch)))  # repeats within the call
        batches.append((kubelets[i % len(kubelets)], batch))
    if not prepare:  # every claim at least once, so the phase ends with nothing prepared
        batches += [(kubelets[0], refs)]

    def call(kubelet: Any, batch: list[Any]) -> None:
        try:
            response = (kubelet.prepare if prepare else kubelet.unprepare)(batch)
        except grpc.RpcError as exc:
            hang = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            row.fail(f"call failed: {exc.code().name}: {(exc.details() or '')[:200]}", hang=hang)
            return
        with lock:
            for uid, entry in response.claims.items():
                if prepare and not entry.error:
                    ids = tuple(i for d in entry.devices for i in d.cdi_device_ids)
                    answers.setdefault(uid, []).append(ids)
                elif prepare and "already prepared for claim" in entry.error:
                    answers.setdefault(uid, []).append("busy")
                elif entry.error:
                    row.fail(f"unexpected error: {entry.error[:200]}")

    with concurrent.futures.ThreadPoolExecutor(len(kubelets)) as pool:
        for future in [pool.submit(call, k, b) for k, b in batches]:
            future.result()
    row.trials += len(batches)
    return answers


def _check_prepared(
    row: Row,
    answers: dict[str, list[tuple[str, ...] | str]],
    found: rig.Audit,
    results: dict[str, list[dict[str, Any]]],
) -> None:
    if not found.ok:
        row.fail(found.describe(), leaked=len(found.leaked), lost=len(found.lost))
    for uid, told in answers.items():
        kinds = set(told)
        if len(kinds) > 1:
            row.fail(f"claim {uid} got different answers: {sorted(map(str, kinds))[:2]}")
        prepared = "busy" not in kinds
        if prepared and uid not in found.prepared:
            row.fail(f"claim {uid} was told prepared but is not", lost=1)
        if not prepared and uid in found.prepared:
            row.fail(f"claim {uid} was refused as busy but is prepared")
    for problem in rig.double_allocations(found, results):
        row.fail(problem)
