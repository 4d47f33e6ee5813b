"""The kubelet's side of the DRA plugin protocols, and a runner for the plugin as a subprocess.

No kubelet can run here, so the demo, the tests and the benchmark use this stand-in to drive the
real plugin over its real unix sockets.

The stub does what the kubelet's plugin watcher and DRA manager do: find ``<driver>-reg.sock`` in
the registry directory, call ``GetInfo``, check the answer, report ``NotifyRegistrationStatus``,
then dial the advertised endpoint and call NodePrepareResources / NodeUnprepareResources with the
version it picked (the first advertised one it supports, like the kubelet). It can also open the
DRA health stream (``NodeWatchResources``) and read the plugin's ``/metrics`` and ``/readyz``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from dra_driver import pluginsettings
from dra_driver.driver import claims
from dra_driver.pb.dra.v1 import dra_pb2 as v1_pb2
from dra_driver.pb.dra.v1 import dra_pb2_grpc as v1_grpc
from dra_driver.pb.dra.v1beta1 import dra_pb2 as v1beta1_pb2
from dra_driver.pb.dra.v1beta1 import dra_pb2_grpc as v1beta1_grpc
from dra_driver.pb.dra_health.v1 import health_pb2 as health_v1_pb2
from dra_driver.pb.dra_health.v1 import health_pb2_grpc as health_v1_grpc
from dra_driver.pb.dra_health.v1alpha1 import health_pb2 as health_v1alpha1_pb2
from dra_driver.pb.dra_health.v1alpha1 import health_pb2_grpc as health_v1alpha1_grpc
from dra_driver.pb.pluginregistration.v1 import registration_pb2, registration_pb2_grpc

VERSIONS: dict[str, tuple[ModuleType, Any]] = {
    "v1.DRAPlugin": (v1_pb2, v1_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (v1beta1_pb2, v1beta1_grpc.DRAPluginStub),
}
HEALTH_VERSIONS: dict[str, tuple[ModuleType, Any]] = {
    "v1.DRAResourceHealth": (health_v1_pb2, health_v1_grpc.DRAResourceHealthStub),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1_pb2, health_v1alpha1_grpc.DRAResourceHealthStub),
}
TIMEOUT_S = 45.0  # the kubelet's per-call deadline


class RegistrationRefused(Exception):
    pass


class KubeletSim:
    def __init__(self, registry_dir: Path, *, supported: Sequence[str] = tuple(VERSIONS)) -> None:
        self.registry_dir = registry_dir
        self.supported = tuple(supported)
        self.info: Any = None
        self.version = ""
        self._channels: list[grpc.Channel] = []
        self._dra_channel: grpc.Channel | None = None

    def register(
        self,
        driver: str,
        *,
        accept: bool = True,
        timeout_s: float = 20.0,
        socket: Path | None = None,
    ) -> Any:
        """Register the plugin behind ``socket`` (default ``<driver>-reg.sock``)."""
        sock = socket or self.registry_dir / f"{driver}-reg.sock"
        channel = self._channel(sock, timeout_s)
        reg = registration_pb2_grpc.RegistrationStub(channel)
        info = reg.GetInfo(registration_pb2.InfoRequest(), timeout=5)
        problems = []
        if info.type != "DRAPlugin":
            problems.append(f"type {info.type!r}")
        if info.name != driver:
            problems.append(f"name {info.name!r}")
        if not os.path.isabs(info.endpoint):
            problems.append(f"endpoint {info.endpoint!r} not absolute")
        usable = [v for v in info.supported_versions if v in self.supported]
        if not usable:
            problems.append(f"no supported version in {list(info.supported_versions)}")
        error = "; ".join(problems) if problems else ("" if accept else "refused by the test")
        reg.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=not error, error=error),
            timeout=5,
        )
        if error:
            raise RegistrationRefused(error)
        self.info, self.version = info, usable[0]
        return info

    def _channel(self, sock: Path, timeout_s: float) -> grpc.Channel:
        deadline = time.monotonic() + timeout_s
        while not sock.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sock} did not appear within {timeout_s}s")
            time.sleep(0.02)
        channel = grpc.insecure_channel(f"unix:{sock}")
        grpc.channel_ready_future(channel).result(timeout=max(1.0, deadline - time.monotonic()))
        self._channels.append(channel)
        return channel

    def dra(self, version: str | None = None) -> tuple[ModuleType, Any]:
        """The DRA stub of ``version`` on the registered endpoint (one channel, dialed once)."""
        if self._dra_channel is None:
            self._dra_channel = self._channel(Path(self.info.endpoint), 10.0)
        pb, stub_type = VERSIONS[version or self.version]
        return pb, stub_type(self._dra_channel)

    def prepare(self, refs: Sequence[claims.ClaimRef], version: str | None = None) -> Any:
        pb, stub = self.dra(version)
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=r.namespace, uid=r.uid, name=r.name) for r in refs]
        )
        return stub.NodePrepareResources(request, timeout=TIMEOUT_S)

    def watch_health(self, version: str = "v1.DRAResourceHealth", timeout_s: float = 30) -> Any:
        """Open the health stream of ``version`` (advertised by GetInfo); iterate the result,
        ``cancel()`` it when done."""
        if version not in self.info.supported_versions:
            raise RegistrationRefused(f"{version} not advertised")
        if self._dra_channel is None:
            self.dra()
        pb, stub_type = HEALTH_VERSIONS[version]
        return stub_type(self._dra_channel).NodeWatchResources(
            pb.NodeWatchResourcesRequest(), timeout=timeout_s
        )

    def unprepare(self, refs: Sequence[claims.ClaimRef], version: str | None = None) -> Any:
        pb, stub = self.dra(version)
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=r.namespace, uid=r.uid, name=r.name) for r in refs]
        )
        return stub.NodeUnprepareResources(request, timeout=TIMEOUT_S)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        self._dra_channel = None


class PluginProcess:
    """``python -m dra_driver kubelet-plugin`` with paths under ``base`` (keep it short)."""

    def __init__(
        self,
        *,
        base: Path,
        kubeconfig: Path,
        node: str = "n1",
        driver: str = "gpu.nvidia.com",
        fake: str = "dgx-h100",
        fake_file: Path | None = None,
        publish: bool = False,
        pod_uid: str = "",
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env``: set in the plugin's environment over this process's (e.g.
        ``PYTHONOPTIMIZE``, as the chart runs the agents)."""
        self.base = base
        self.env = {**os.environ, **env} if env else None
        self.driver = driver
        self.registry_dir = base / "registry"
        self.plugins_dir = base / "plugins"
        self.cdi_root = base / "cdi"
        self.log_path = base / (f"plugin-{pod_uid}.log" if pod_uid else "plugin.log")
        self.settings = pluginsettings.PluginSettings(
            node_name=node,
            driver_name=driver,
            registry_dir=self.registry_dir,
            plugins_dir=self.plugins_dir,
            pod_uid=pod_uid,
        )
        self.argv = [
            sys.executable,
            "-m",
            "dra_driver",
            "--log-format",
            "json",
            "--log-level",
            "debug",
            "kubelet-plugin",
            "--node-name",
            node,
            "--driver-name",
            driver,
            "--kubelet-registry-dir",
            str(self.registry_dir),
            "--kubelet-plugins-dir",
            str(self.plugins_dir),
            "--cdi-root",
            str(self.cdi_root),
            "--kubeconfig",
            str(kubeconfig),
            *(["--fake-file", str(fake_file)] if fake_file else ["--fake", fake]),
            *([] if publish else ["--no-publish"]),
            "--cleanup-interval",
            "0",
            *(["--pod-uid", pod_uid] if pod_uid else []),
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            "0",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def registration_socket(self) -> Path:
        return self.settings.registration_socket

    @property
    def dra_socket(self) -> Path:
        return self.settings.dra_socket

    def http_get(self, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
        """GET ``path`` from the plugin's metrics/health server: (status, body)."""
        host, port = self._http_address(timeout_s)
        conn = http.client.HTTPConnection(host, port, timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    def _http_address(self, timeout_s: float) -> tuple[str, int]:
        """Where the server listens, from its log line (it was started on port 0)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log().splitlines():
                if '"health server listening"' in line:
                    event = json.loads(line)
                    return str(event["host"]), int(event["port"])
            time.sleep(0.02)
        raise TimeoutError(f"no health server in the plugin's log:\n{self.log()}")

    def start(self) -> PluginProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=self.env
        )
        log.close()
        return self

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"plugin exited with {self.proc.returncode}:\n{self.log()}")
            if self.registration_socket.exists() and self.dra_socket.exists() and self._answers():
                return
            time.sleep(0.02)
        raise TimeoutError(f"plugin not ready after {timeout_s}s:\n{self.log()}")

    def _answers(self) -> bool:
        """The sockets may be stale ones of a killed predecessor: ready = GetInfo answers."""
        with grpc.insecure_channel(f"unix:{self.registration_socket}") as channel:
            try:
                registration_pb2_grpc.RegistrationStub(channel).GetInfo(
                    registration_pb2.InfoRequest(), timeout=1
                )
            except grpc.RpcError:
                return False
        return True

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 20.0) -> int:
        """The exit code; past ``timeout_s`` the agent is asked for every thread's stack
        (SIGUSR2: faulthandler, in C, so also with a main thread that never returns to Python)
        and the error carries the end of its log: where a rare hang waits."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            self.proc.send_signal(signal.SIGUSR2)
            time.sleep(1.0)
            tail = self.log()[-20000:]
            exc.add_note(f"the agent's log, ending with its threads' stacks:\n{tail}")
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stuck_at_stop(self) -> str:
        """What the agent's shutdown deadline logged (:mod:`dra_driver.shutdown`), on one line:
        the part it was stopping and the main thread's innermost frames; "" if it did not fire."""
        return describe_stuck_stop(self.log())


def describe_stuck_stop(log: str, frames: int = 8) -> str:
    """The shutdown-deadline report in an agent's ``log`` (JSON lines, then faulthandler's
    dump of every thread), in one line: the part being stopped and, of the thread that was
    stopping it (the one that ran ``dra_driver``'s ``__main__``), the frame it waits in and
    our frames around it, innermost first."""
    lines = log.splitlines()
    at = next((i for i, line in enumerate(lines) if "shutdown did not finish" in line), None)
    if at is None:
        return ""
    try:
        part = json.loads(lines[at]).get("stopping")
    except ValueError:
        part = None
    blocks: list[list[str]] = [[]]
    for line in lines[at + 1 :]:
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
        elif line.startswith('  File "'):
            blocks[-1].append(line.strip())
    main = next((b for b in blocks if any("__main__" in frame for frame in b)), [])
    ours = [frame for frame in main[1:] if "/dra_driver/" in frame]
    shown = main[:1] + ours[: frames - 1]  # where it waits, then our frames around it
    stack = " < ".join(frame.removeprefix("File ") for frame in shown)
    return f"stuck stopping {part or '?'}; main thread: {stack or '?'}"
