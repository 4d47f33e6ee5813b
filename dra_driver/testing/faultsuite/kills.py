"""SIGKILL at random points of prepare/unprepare cycles (and of start-up recovery).

Two rows. ``kills`` forks the driver core (the same objects the plugin builds, over real files)
once per trial: the child recovers from what the last one left, reports "recovered", then runs
random prepare/unprepare batches, acknowledging each answer over a pipe, until the parent
SIGKILLs it at a random moment (one trial in eight, already during recovery). Forking makes a
trial cost milliseconds, so hundreds of kills fit in seconds. ``kills (plugin process)`` does
the same to the real plugin process over its gRPC sockets, fewer times (a process start costs a
second). After every recovery the disk is audited against what was acknowledged
(:func:`~dra_driver.testing.faultsuite.rig.audit`); claims whose call was cut short may be either
way.
The fork needs a parent without threads: run this scenario before any that starts grpc.
"""

from __future__ import annotations

import os
import random
import select
import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from dra_driver import app, logs
from dra_driver.testing.faultsuite import Row, rig

RECOVER_DEADLINE_S = 30.0


def run(size: int, rng: random.Random, workdir: Path) -> Row:
    """``size`` kills of the forked driver core."""
    row = Row("kills (SIGKILL mid-prepare/unprepare)")
    objs = rig.standard_claims()
    api = rig.api_with(objs)
    refs = [rig.ref_of(o) for o in objs]
    where = rig.settings(workdir / "kills", serial=False)
    node = rig.devices()
    told: dict[str, bool] = {}  # uid → what the last acknowledged answer said (prepared?)
    uncertain: set[str] = set()  # uids whose last call was cut short
    for trial in range(size + 1):
        last = trial == size  # one more start: recover and check, no kill
        early = not last and rng.random() < 0.125
        pid, ack_r, go_w = _fork(where, api, refs, seed=rng.randrange(1 << 30))
        reader = _Acks(ack_r, uncertain)
        recovered = reader.wait_recovered(0 if early else RECOVER_DEADLINE_S, rng)
        if not early and recovered is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            row.trials += 1
            row.fail(f"trial {trial}: recovery did not finish", hang=1)
            continue
        if recovered:
            found = rig.audit(where, told=_certain(told, uncertain), node=node)
            _settle(told, found.prepared, uncertain)
            if not found.ok:
                row.fail(
                    f"trial {trial}: {found.describe()}",
                    leaked=len(found.leaked),
                    lost=len(found.lost),
                )
            if last:
                os.write(go_w, b"q")
                os.waitpid(pid, 0)
                break
            os.write(go_w, b"g")
            time.sleep(rng.uniform(0.0, 0.04))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        row.trials += 1
        reader.drain(told)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            row.fail(f"trial {trial}: the child died on its own ({status})", crash=1)
        if reader.errors:
            row.fail(f"trial {trial}: a valid claim failed: {reader.errors[0]}")
        os.close(ack_r)
        os.close(go_w)
    # Finally everything unprepares and nothing is left behind.
    driver = app.build_driver(where, devices=node, api=api, log=logs.get("faults"))
    errors = [e for e in driver.unprepare(refs).values() if e]
    driver.close()
    found = rig.audit(where, told=dict.fromkeys(told, False), node=node)
    if errors or found.prepared or not found.ok:
        row.fail(f"final unprepare: {errors[:1]} {found.describe()}", leaked=len(found.leaked))
    return row


def _fork(
    where: app.PluginSettings, api: Any, refs: list[Any], *, seed: int
) -> tuple[int, int, int]:
    ack_r, ack_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns
        code = 0
        try:
            os.close(ack_r)
            os.close(go_w)
            _child(where, api, refs, seed, ack_w, go_r)
        except BaseException:
            code = 70
        os._exit(code)
    os.close(ack_w)
    os.close(go_r)
    return pid, ack_r, go_w


def _child(
    where: app.PluginSettings, api: Any, refs: list[Any], seed: int, ack: int, go: int
) -> None:
    driver = app.build_driver(where, devices=rig.devices(), api=api, log=logs.get("faults"))
    os.write(ack, b"R\n")
    if os.read(go, 1) != b"g":
        return
    rng = random.Random(seed)
    while True:
        batch = rng.sample(refs, rng.randint(1, 3))
        prepare = rng.random() < 0.5
        uids = ",".join(r.uid for r in batch)
        os.write(ack, f"B {uids}\n".encode())
        if prepare:
            answers = {uid: r.error for uid, r in driver.prepare(batch).items()}
        else:
            answers = dict(driver.unprepare(batch))
        line = " ".join(f"{uid}={'ok' if not e else 'err'}" for uid, e in answers.items())
        os.write(ack, f"{'P' if prepare else 'U'} {line}\n".encode())
        if any(answers.values()):
            os.write(ack, f"E {next(e for e in answers.values() if e)[:300]}\n".encode())


class _Acks:
    """The child's side of the story, read from its pipe."""

    def __init__(self, fd: int, uncertain: set[str]) -> None:
        self.fd = fd
        self.buffer = b""
        self.uncertain = uncertain
        self.errors: list[str] = []

    def wait_recovered(self, timeout_s: float, rng: random.Random) -> bool | None:
        """True once the child said so; None on timeout; False for an early kill."""
        if timeout_s == 0:
            time.sleep(rng.uniform(0.0, 0.03))  # somewhere inside recovery
            return False
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line == b"R"

    def drain(self, told: dict[str, bool]) -> None:
        while True:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                break
            self.buffer += chunk
        for raw in self.buffer.split(b"\n"):
            kind, _, rest = raw.decode().partition(" ")
            if kind == "B":
                self.uncertain.update(rest.split(","))
            elif kind in ("P", "U"):
                for item in rest.split():
                    uid, _, outcome = item.partition("=")
                    if outcome == "ok":
                        told[uid] = kind == "P"
                        self.uncertain.discard(uid)
            elif kind == "E":
                self.errors.append(rest)
        self.buffer = b""


def _certain(told: dict[str, bool], uncertain: set[str]) -> dict[str, bool]:
    return {uid: prepared for uid, prepared in told.items() if uid not in uncertain}


def _settle(told: dict[str, bool], prepared: set[str], uncertain: set[str]) -> None:
    """Claims whose last call was cut short are whatever recovery made of them."""
    for uid in uncertain:
        told[uid] = uid in prepared
    uncertain.clear()


# ---- the real plugin process over gRPC --------------------------------------------------------


def run_process(size: int, rng: random.Random, workdir: Path) -> Row:
    """``size`` SIGKILLs of ``dra-driver kubelet-plugin`` while a kubelet stand-in calls it."""
    from dra_driver.testing.fakeapi import fakeserver
    from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

    row = Row("kills (plugin process, gRPC)")
    base = workdir / "pk"
    base.mkdir(parents=True, exist_ok=True)
    objs = rig.standard_claims()
    refs = [rig.ref_of(o) for o in objs]
    server = fakeserver.FakeApiServer(rig.api_with(objs)).start()
    kubeconfig = server.write_kubeconfig(base / "kubeconfig")
    where = rig.settings(base)  # the paths PluginProcess uses under ``base``
    told: dict[str, bool] = {}
    uncertain: set[str] = set()
    try:
        for trial in range(size + 1):
            plugin = PluginProcess(base=base, kubeconfig=kubeconfig).start()
            try:
                plugin.wait_ready(timeout_s=60)
            except (RuntimeError, TimeoutError) as exc:
                row.trials += 1
                row.fail(f"start {trial}: {str(exc)[:200]}", crash=1)
                plugin.kill()
                continue
            found = rig.audit(where, told=_certain(told, uncertain))
            _settle(told, found.prepared, uncertain)
            if not found.ok:
                row.fail(
                    f"after kill {trial}: {found.describe()}",
                    leaked=len(found.leaked),
                    lost=len(found.lost),
                )
            kubelet = KubeletSim(plugin.registry_dir)
            kubelet.register(rig.DRIVER)
            if trial == size:
                answers = kubelet.unprepare(refs)
                bad = [c.error for c in answers.claims.values() if c.error]
                if bad:
                    row.fail(f"final unprepare: {bad[0][:200]}")
                kubelet.close()
                plugin.kill()
                break
            stop = threading.Event()
            churn = threading.Thread(
                target=_churn, args=(kubelet, refs, rng, stop, told, uncertain, row)
            )
            churn.start()
            time.sleep(rng.uniform(0.05, 0.5))
            plugin.signal(signal.SIGKILL)
            plugin.wait()
            stop.set()
            churn.join(timeout=60)
            kubelet.close()
            row.trials += 1
    finally:
        server.stop()
    final = rig.audit(where)
    if final.prepared or not final.ok:
        row.fail(f"left behind: {final.describe() or final.prepared}", leaked=len(final.leaked))
    return row


def _churn(
    kubelet: Any,
    refs: list[Any],
    rng: random.Random,
    stop: threading.Event,
    told: dict[str, bool],
    uncertain: set[str],
    row: Row,
) -> None:
    while not stop.is_set():
        batch = rng.sample(refs, rng.randint(1, len(refs)))
        prepare = rng.random() < 0.5
        uncertain.update(r.uid for r in batch)
        try:
            response = (kubelet.prepare if prepare else kubelet.unprepare)(batch)
        except grpc.RpcError:
            return  # killed under the call: these claims may be either way
        for uid, entry in response.claims.items():
            if entry.error:
                row.fail(f"a valid claim failed: {entry.error[:200]}")
            else:
                told[uid] = prepare
                uncertain.discard(uid)
