"""gRPC fuzz: thousands of odd calls to the kubelet plugin and the device plugin, as processes.

Semantic calls are well-formed messages with odd content: claims that exist, do not exist, are
not ours or not allocated, invalid or enormous UIDs and names, duplicates, empty fields; device
IDs unknown, huge, repeated; sizes out of range. Raw calls are random bytes sent to every method
(and to methods that do not exist). Every call must end within its deadline; a semantic call
must never fail as a whole (DRA answers per claim) or with an internal error, and its per-claim
errors must never be "internal error"; the process must survive and keep logging one JSON object
per line; and at the end every claim it prepared unprepares with nothing left behind.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from dra_driver.testing.faultsuite import Row, rig

DEADLINE_S = 10.0
DRA = "/k8s.io.kubelet.pkg.apis.dra.{}.DRAPlugin/{}"
HEALTH = "/k8s.io.kubelet.pkg.apis.dra_health.{}.DRAResourceHealth/NodeWatchResources"
DP = "/v1beta1.DevicePlugin/{}"


def _odd_text(rng: random.Random) -> str:
    return rng.choice(
        [
            "",
            "x" * rng.choice([1, 63, 64, 254, 10_000]),
            "UPPER",
            "dots.and/slashes",
            "ünïcødé-☃",
            "\x00nul",
            str(uuid.uuid4()),
            "../../etc/passwd",
        ]
    )


def run(size: int, rng: random.Random, workdir: Path) -> list[Row]:
    """``size`` calls, three quarters to the kubelet plugin, a quarter to the device plugin."""
    dra_calls = size * 3 // 4
    return [_dra(dra_calls, rng, workdir), _device_plugin(size - dra_calls, rng, workdir)]


# ---- the kubelet plugin ----------------------------------------------------------------------


def _dra(size: int, rng: random.Random, workdir: Path) -> Row:
    from dra_driver.testing.fakeapi import fakeserver
    from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

    row = Row("gRPC fuzz (kubelet plugin)")
    base = workdir / "fz"
    base.mkdir(parents=True, exist_ok=True)
    good = rig.standard_claims()
    odd = [
        rig.claim("other-pool", ["gpu-0"]),
        rig.claim("not-ours", ["gpu-1"]),
        rig.claim("no-such-gpu", ["gpu-99"]),
        rig.claim("contested", ["gpu-2"], interval="Long"),  # gpu-2 is c2's too
    ]
    odd[0]["status"]["allocation"]["devices"]["results"][0]["pool"] = "elsewhere"
    odd[1]["status"]["allocation"]["devices"]["results"][0]["driver"] = "other.example.com"
    unallocated = rig.claim("unallocated", ["gpu-3"])
    del unallocated["status"]
    odd.append(unallocated)
    server = fakeserver.FakeApiServer(rig.api_with(good + odd)).start()
    plugin = PluginProcess(base=base, kubeconfig=server.write_kubeconfig(base / "kc")).start()
    good_refs = [rig.ref_of(o) for o in good]
    odd_refs = [rig.ref_of(o) for o in odd]
    prepared: set[str] = set()
    try:
        plugin.wait_ready(timeout_s=60)
        kubelet = KubeletSim(plugin.registry_dir)
        kubelet.register(rig.DRIVER)
        kubelet.dra()
        channel = kubelet._dra_channel
        assert channel is not None
        for _ in range(size):
            row.trials += 1
            if rng.random() < 0.3:
                _raw_dra(channel, rng, row)
                continue
            pb, stub = kubelet.dra(rng.choice(["v1", "v1beta1"]) + ".DRAPlugin")
            claims = _claims(rng, pb, good_refs, odd_refs)
            prepare = rng.random() < 0.6
            try:
                if prepare:
                    request = pb.NodePrepareResourcesRequest(claims=claims)
                    response = stub.NodePrepareResources(request, timeout=DEADLINE_S)
                else:
                    request = pb.NodeUnprepareResourcesRequest(claims=claims)
                    response = stub.NodeUnprepareResources(request, timeout=DEADLINE_S)
            except grpc.RpcError as exc:
                died = plugin.proc is not None and plugin.proc.poll() is not None
                row.fail(
                    f"{'prepare' if prepare else 'unprepare'}: {exc.code().name}: "
                    f"{(exc.details() or '')[:200]}",
                    hang=exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED,
                    crash=died,
                )
                if died:
                    break
                continue
            _check_answers(row, response, claims, prepare, {r.uid for r in good_refs}, prepared)
        row.trials += 1
        answers = kubelet.unprepare(good_refs).claims
        if any(c.error for c in answers.values()):
            row.fail(f"final unprepare: {[c.error for c in answers.values() if c.error][:1]}")
        kubelet.close()
    except (RuntimeError, TimeoutError) as exc:
        row.fail(f"plugin did not start: {str(exc)[:300]}", crash=1)
    finally:
        alive = plugin.proc is not None and plugin.proc.poll() is None
        plugin.kill()
        server.stop()
    if not alive:
        row.fail("the plugin process died", crash=1)
    _check_log(row, plugin.log())
    found = rig.audit(rig.settings(base), told=dict.fromkeys(prepared, False))
    if found.prepared or not found.ok:
        row.fail(f"after the fuzz: {found.describe() or found.prepared}", leaked=len(found.leaked))
    return row


def _claims(rng: random.Random, pb: Any, good: list[Any], odd: list[Any]) -> list[Any]:
    claims = []
    for _ in range(rng.choice([0, 1, 1, 2, 3, 8, 40])):
        kind = rng.random()
        if kind < 0.45:
            ref = rng.choice(good)
            claims.append(pb.Claim(namespace=ref.namespace, uid=ref.uid, name=ref.name))
        elif kind < 0.6:
            ref = rng.choice(odd)
            claims.append(pb.Claim(namespace=ref.namespace, uid=ref.uid, name=ref.name))
        elif kind < 0.75:  # right name, wrong UID (a replaced claim), or unknown name
            ref = rng.choice(good)
            name = ref.name if rng.random() < 0.5 else f"nope-{rng.randrange(99)}"
            claims.append(pb.Claim(namespace=ref.namespace, uid=str(uuid.uuid4()), name=name))
        else:
            claims.append(
                pb.Claim(namespace=_odd_text(rng), uid=_odd_text(rng), name=_odd_text(rng))
            )
    if claims and rng.random() < 0.2:
        claims.append(rng.choice(claims))  # a claim listed twice
    return claims


def _check_answers(
    row: Row, response: Any, claims: list[Any], prepare: bool, good: set[str], prepared: set[str]
) -> None:
    """Per-claim answers: one per claim asked, never an internal error; a valid claim fails
    only when a contested GPU is held by another claim; no device twice."""
    asked = {c.uid for c in claims}
    if set(response.claims) != asked:
        row.fail(f"answer covers {len(response.claims)} claims, {len(asked)} were asked")
        return
    for uid, entry in response.claims.items():
        error = entry.error
        if "internal error" in error:
            row.fail(f"internal error: {error[:200]}")
        elif uid not in good:
            continue
        elif error and not (prepare and "already prepared for claim" in error):
            row.fail(f"a valid claim failed: {error[:200]}")
        elif prepare and not error:
            names = [d.device_name for d in entry.devices]
            if len(names) != len(set(names)):
                row.fail(f"devices repeated in an answer: {names}")
            prepared.add(uid)
        elif not error:
            prepared.discard(uid)


def _raw_dra(channel: grpc.Channel, rng: random.Random, row: Row) -> None:
    version = rng.choice(["v1", "v1beta1"])
    method = rng.choice(
        [
            DRA.format(version, "NodePrepareResources"),
            DRA.format(version, "NodeUnprepareResources"),
            DRA.format(version, "NoSuchMethod"),
            "/pluginregistration.Registration/GetInfo",
        ]
    )
    _raw(channel, method, rng, row, stream=False)
    if rng.random() < 0.05:
        _raw(channel, HEALTH.format(rng.choice(["v1", "v1alpha1"])), rng, row, stream=True)


def _raw(channel: grpc.Channel, method: str, rng: random.Random, row: Row, *, stream: bool) -> None:
    data = rng.randbytes(rng.choice([0, 1, 7, 64, 1000, 20_000]))
    try:
        if stream:
            call = channel.unary_stream(method, None, None)(data, timeout=DEADLINE_S)
            next(iter(call))
            call.cancel()  # type: ignore[no-untyped-call]
        else:
            channel.unary_unary(method, None, None)(data, timeout=DEADLINE_S)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            row.fail(f"raw call to {method} hung", hang=1)
    except StopIteration:
        pass


def _check_log(row: Row, log: str) -> None:
    for line in log.splitlines():
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError:
            row.fail(f"log line is not JSON: {line[:200]}")
            return


# ---- the device plugin -----------------------------------------------------------------------


def _device_plugin(size: int, rng: random.Random, workdir: Path) -> Row:
    from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
    from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc
    from dra_driver.testing.dpkubeletsim import FakeKubelet

    row = Row("gRPC fuzz (device plugin)")
    base = workdir / "dpf"
    base.mkdir(parents=True, exist_ok=True)
    kubelet = FakeKubelet(base).start()
    proc, log = start_device_plugin(base, profile="h100-nvl-pairs", replicas=2)
    try:
        (request,) = kubelet.wait_requests(1, timeout=60)
        channel = kubelet.plugin_channel(request.endpoint)
        stub = pb_grpc.DevicePluginStub(channel)
        first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=DEADLINE_S)))
        ids = [d.ID for d in first.devices]
        for _ in range(size):
            row.trials += 1
            _device_call(rng, stub, channel, pb, ids, row)
            if proc.poll() is not None:
                break
        channel.close()
    except Exception as exc:  # a broken start, or an assertion about it
        row.fail(f"device plugin run: {type(exc).__name__}: {str(exc)[:300]}", crash=1)
    finally:
        alive = proc.poll() is None
        proc.kill()
        proc.wait(10)
        kubelet.stop()
    if not alive:
        row.fail("the device plugin process died", crash=1)
    _check_log(row, log.read_text(errors="replace"))
    return row


def _device_call(
    rng: random.Random, stub: Any, channel: grpc.Channel, pb: Any, ids: list[str], row: Row
) -> None:
    def some_ids() -> list[str]:
        picked = [rng.choice(ids) for _ in range(rng.randint(0, 4))]
        if rng.random() < 0.4:
            picked.append(_odd_text(rng))
        return picked

    kind = rng.random()
    call: Callable[[], Any]
    if kind < 0.25:
        method = DP.format(rng.choice(["Allocate", "GetPreferredAllocation", "Nope"]))
        _raw(channel, method, rng, row, stream=False)
        return
    if kind < 0.6:
        req = pb.AllocateRequest()
        for _ in range(rng.randint(0, 3)):
            req.container_requests.add(devices_ids=some_ids())
        call = lambda: stub.Allocate(req, timeout=DEADLINE_S)  # noqa: E731
    elif kind < 0.9:
        req = pb.PreferredAllocationRequest()
        for _ in range(rng.randint(0, 2)):
            req.container_requests.add(
                available_deviceIDs=some_ids(),
                must_include_deviceIDs=some_ids()[:1],
                allocation_size=rng.choice([-1, 0, 1, 2, 3, 100, 2**31 - 1]),
            )
        call = lambda: stub.GetPreferredAllocation(req, timeout=DEADLINE_S)  # noqa: E731
    else:
        call = lambda: stub.GetDevicePluginOptions(pb.Empty(), timeout=DEADLINE_S)  # noqa: E731
    try:
        call()
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            row.fail("device plugin call hung", hang=1)
        elif code not in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION,
        ):
            row.fail(f"device plugin call: {code.name}: {(exc.details() or '')[:200]}")


def start_device_plugin(
    base: Path, *, profile: str, replicas: int = 1
) -> tuple[subprocess.Popen[bytes], Path]:
    """``dra-driver device-plugin`` on fake GPUs in ``base`` (JSON log in ``base/dp.log``)."""
    log = base / "dp.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dra_driver",
                "--log-format",
                "json",
                "device-plugin",
                "--device-plugin-dir",
                str(base),
                "--cdi-root",
                str(base / "cdi"),
                "--fake",
                profile,
                "--replicas",
                str(replicas),
                "--metrics-address",
                "127.0.0.1",
                "--metrics-port",
                "0",
            ],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return proc, log
