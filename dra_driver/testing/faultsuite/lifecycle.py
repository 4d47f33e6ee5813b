"""The NVIDIA driver unloaded and reloaded at random points of prepare and unprepare bursts.

Rounds of two phases against the plugin process (fake DGX H100), as in :mod:`.contention`:
several kubelet connections send batches of claims (three claims want each of six GPUs),
first preparing, then unpreparing them all. Meanwhile a thread unloads the fake driver and
loads it again (a new version each time) at random moments, through the agent's health socket
(what ``dra-driver fake-event --driver-unload`` sends). Each call is a trial.

The promises checked (docs/lifecycle.md):

- a prepare is either done, refused as busy, or refused with the outage's one retryable error;
  nothing else;
- a claim told prepared is prepared on disk (0 lost claims);
- no GPU is held by two claims (0 double allocations);
- after the unprepare phase nothing is left: no record, no CDI spec (0 leaked specs), whether
  the driver was away or not: unprepare never needs NVML.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from dra_driver import driverwatch, healthcontrol
from dra_driver.testing.faultsuite import Row, rig

WORKERS = 6
SPREAD_S = 1.2  # a phase's calls start at random moments within this


def run(size: int, rng: random.Random, workdir: Path) -> Row:
    """About ``size`` calls in all."""
    from dra_driver.testing.fakeapi import fakeserver
    from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

    row = _Row("driver unload/reload during bursts")
    base = workdir / "lc"
    base.mkdir(parents=True, exist_ok=True)
    objs = [rig.claim(f"d{gpu}-{n}", [f"gpu-{gpu}"]) for gpu in range(6) for n in range(3)]
    refs = [rig.ref_of(o) for o in objs]
    gpu_of = {rig.ref_of(o).uid: o["status"]["allocation"]["devices"]["results"] for o in objs}
    server = fakeserver.FakeApiServer(rig.api_with(objs)).start()
    plugin = PluginProcess(base=base, kubeconfig=server.write_kubeconfig(base / "kc")).start()
    kubelets: list[Any] = []
    flips = _Flipper(rng)
    try:
        plugin.wait_ready(timeout_s=60)
        flips.socket = plugin.settings.health_socket
        for _ in range(WORKERS):
            kubelet = KubeletSim(plugin.registry_dir)
            kubelet.register(rig.DRIVER)
            kubelets.append(kubelet)
        per_phase = max(WORKERS, size // 4)
        rounds = max(1, size // (2 * per_phase))
        for _ in range(rounds):
            with flips.running():
                answers = _phase(row, kubelets, refs, rng, per_phase, prepare=True)
            _check_prepared(row, answers, rig.audit(rig.settings(base)), gpu_of)
            with flips.running():
                _phase(row, kubelets, refs, rng, per_phase, prepare=False)
            found = rig.audit(rig.settings(base))
            if found.prepared or not found.ok:
                row.fail(
                    f"after unpreparing everything: {found.describe() or found.prepared}",
                    leaked=len(found.leaked),
                )
        row.scenario += f" ({flips.flips} reloads, {row.refused} prepares refused meanwhile)"
        if rounds * per_phase >= 60 and not row.refused:
            row.fail("no prepare met an outage: the scenario tested nothing")
        if flips.errors:
            row.fail(f"the driver could not be flipped: {flips.errors[0]}")
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


class _Row(Row):
    """The row, counting the prepares the outage refused (0 in a full run: a hollow run)."""

    refused: int = 0


class _Flipper:
    """Unloads and reloads the fake driver at random moments while a phase runs; the driver is
    loaded again when the phase ends."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = random.Random(rng.random())
        self.socket: Path | None = None
        self.errors: list[str] = []
        self.flips = 0

    def running(self) -> Any:
        flipper = self

        class _Running:
            def __enter__(self) -> None:
                self.stop = threading.Event()
                self.thread = threading.Thread(target=flipper._run, args=(self.stop,))
                self.thread.start()

            def __exit__(self, *exc: object) -> None:
                self.stop.set()
                self.thread.join(30)
                flipper._send("driver-load")

        return _Running()

    def _run(self, stop: threading.Event) -> None:
        loaded = True
        while not stop.wait(self._rng.uniform(0.1, 0.9)):
            self._send("driver-load" if not loaded else "driver-unload")
            loaded = not loaded

    def _send(self, action: str) -> None:
        if self.socket is None:
            return
        req: dict[str, Any] = {"op": "lifecycle", "action": action}
        if action == "driver-load":
            self.flips += 1
            req["driverVersion"] = f"590.{self.flips}.0"
        else:
            req["mode"] = self._rng.choice(["not-loaded", "uninitialized", "mismatch"])
        try:
            healthcontrol.request(self.socket, req)
        except healthcontrol.ControlError as exc:
            self.errors.append(str(exc))


def _phase(
    row: _Row,
    kubelets: list[Any],
    refs: list[Any],
    rng: random.Random,
    calls: int,
    *,
    prepare: bool,
) -> dict[str, list[tuple[str, ...] | str]]:
    """``calls`` batches over all connections at once; claim uid → every answer."""
    answers: dict[str, list[tuple[str, ...] | str]] = {}
    lock = threading.Lock()
    batches = []
    for i in range(calls):
        batch = rng.sample(refs, rng.randint(1, 4))
        batches.append((kubelets[i % len(kubelets)], batch, rng.uniform(0.0, SPREAD_S)))
    if not prepare:  # every claim at least once, so the phase ends with nothing prepared
        batches += [(kubelets[0], refs, SPREAD_S)]

    def call(kubelet: Any, batch: list[Any], delay_s: float) -> None:
        time.sleep(delay_s)  # calls spread over the phase: some meet the driver away
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
                elif prepare and driverwatch.DRIVER_GONE_MESSAGE in entry.error:
                    row.refused += 1
                    if "\n" in entry.error:
                        row.fail(f"the outage error is more than one line: {entry.error[:200]}")
                elif entry.error:
                    row.fail(f"unexpected error: {entry.error[:200]}")

    with concurrent.futures.ThreadPoolExecutor(len(kubelets)) as pool:
        for future in [pool.submit(call, k, b, d) for k, b, d in batches]:
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
        if len({t for t in told if t != "busy"}) > 1:
            row.fail(f"claim {uid} got different devices: {sorted(map(str, set(told)))[:2]}")
        if any(t != "busy" for t in told) and uid not in found.prepared:
            row.fail(f"claim {uid} was told prepared but is not", lost=1)
    for problem in rig.double_allocations(found, results):
        row.fail(problem)
