"""A development stand-in cluster: the in-memory API server over HTTPS and N fake GPU nodes,
each running the real node agent as its own process (``dra-driver dev-cluster``).

Why it exists: ``doctor``, ``capacity``, ``publish``, ``kubelet-plugin`` and kubectl need an API
server, and a newcomer has none at hand. This puts together what the tests and the fleet
benchmark already use: :class:`~dra_driver.testing.fakeapi.fakeserver.FakeApiServer` with a
throw-away CA (client certificates, as a real API server authenticates agents), one Node object
per node, the driver's DeviceClasses, and per node ``dra-driver kubelet-plugin`` on a fake GPU
profile, publishing its ResourceSlices over the real client. A scheduler stand-in
(:meth:`DevCluster.schedule`) allocates the ResourceClaims created in it, so the kubelet
stand-in can prepare them. It is test kit, not Kubernetes: no kubelet, no controllers, nothing
persisted, and only the API paths the driver and kubectl's discovery use.

The agents run in sessions of their own, so a terminal's Ctrl-C reaches only the command, which
stops them in order (SIGTERM, then SIGKILL past a deadline) and removes its directory unless it
was given one; on Linux an agent also gets SIGTERM when the command dies by SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver import deviceclasses, records
from dra_driver.testing import kubeletsim
from dra_driver.testing.fakeapi import bundle, fakeserver, memory, opensslca

STOP_TIMEOUT_S = 20.0
SOCKET_PATH_MAX = 107  # sun_path: 108 bytes with the terminating NUL


class DevClusterError(Exception):
    """The stand-in cluster cannot start; the message says why."""


@records.record
class Node:
    name: str
    agent: kubeletsim.PluginProcess

    @property
    def dra_socket(self) -> Path:
        return self.agent.dra_socket


# Run first in the agent's process (then exec'd away): SIGTERM when this process dies, even by
# SIGKILL (Linux's PR_SET_PDEATHSIG; kept across exec), unless it is gone already.
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 15)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(0)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class _Agent(kubeletsim.PluginProcess):
    """The kit's agent runner, its process in a session of its own (no terminal signals) and,
    on Linux, told to stop when this process dies however it dies."""

    def start(self) -> _Agent:
        argv = list(self.argv)
        if sys.platform == "linux":
            argv = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        return self


class DevCluster:
    """Start with :meth:`start`, end with :meth:`stop` (idempotent)."""

    def __init__(
        self,
        *,
        nodes: int,
        fake: str | None = None,
        fake_file: Path | None = None,
        directory: Path | None = None,
        kubeconfig: Path | None = None,
        driver_name: str = deviceclasses.DEFAULT_DRIVER_NAME,
        prefix: str = "node",
        port: int = 0,
        agent_args: Sequence[str] = (),
    ) -> None:
        if nodes < 1:
            raise DevClusterError(f"--nodes {nodes}: at least one node")
        self._own_dir = directory is None
        self.directory = directory or Path(tempfile.mkdtemp(prefix="dra-dev-"))
        self.kubeconfig = kubeconfig or self.directory / "kubeconfig"
        self.driver_name = driver_name
        self._fake, self._fake_file = fake, fake_file
        self._count, self._prefix, self._port = nodes, prefix, port
        self._agent_args = tuple(agent_args)
        self.server: fakeserver.FakeApiServer | None = None
        self.nodes: list[Node] = []
        self._unfit: set[str] = set()  # claims the scheduler stand-in found to fit nowhere

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None else ""

    def start(self, *, ready_timeout_s: float = 120.0) -> DevCluster:
        """Serve, start every agent at once, and return once each has registered and its
        whole pool of ResourceSlices is stored; :class:`DevClusterError` otherwise (what was
        started is stopped)."""
        try:
            self._start(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, ready_timeout_s: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tls = throwaway_ca()
        try:
            self.server = fakeserver.FakeApiServer(
                memory.InMemoryApi(), tls=tls, port=self._port
            ).start()
        except OSError as exc:
            raise DevClusterError(f"cannot listen on 127.0.0.1:{self._port}: {exc}") from exc
        api = self.server.api
        api.put_namespace("default")
        for name in deviceclasses.names():
            api.create_device_class(deviceclasses.load(name, driver_name=self.driver_name))
        self.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        self.server.write_kubeconfig(self.kubeconfig)
        width = len(str(self._count - 1))
        for i in range(self._count):
            name = f"{self._prefix}-{i:0{width}d}"
            api.put_node(name, uid=str(uuid.uuid4()))
            base = self.directory / f"n{i}"  # short: unix socket paths are limited
            longest = base / "plugins" / self.driver_name / "dra.sock"
            if len(str(longest).encode()) > SOCKET_PATH_MAX:
                raise DevClusterError(
                    f"{self.directory} is too deep for the agents' unix sockets ({longest} is "
                    f"over {SOCKET_PATH_MAX} bytes): choose a shorter --dir or TMPDIR"
                )
            base.mkdir(parents=True, exist_ok=True)
            agent = _Agent(
                base=base,
                kubeconfig=self.kubeconfig,
                node=name,
                driver=self.driver_name,
                fake=self._fake or "dgx-h100",
                fake_file=self._fake_file,
                publish=True,
                extra=self._agent_args,
            )
            self.nodes.append(Node(name=name, agent=agent))
        for node in self.nodes:
            node.agent.start()
        deadline = time.monotonic() + ready_timeout_s
        for node in self.nodes:
            try:
                node.agent.wait_ready(max(1.0, deadline - time.monotonic()))
            except (RuntimeError, TimeoutError) as exc:
                raise DevClusterError(
                    f"the agent of {node.name} did not start: {str(exc).splitlines()[0]} "
                    f"{_worst_line(node.agent.log())} (log: {node.agent.log_path})"
                ) from exc
        for node in self.nodes:
            while not self._published(node.name):
                if time.monotonic() > deadline:
                    raise DevClusterError(f"the agent of {node.name} published no ResourceSlice")
                time.sleep(0.05)

    def _published(self, node: str) -> bool:
        assert self.server is not None
        slices, _ = self.server.api.list_resource_slices(driver=self.driver_name, node_name=node)
        pools = {
            (s["spec"]["pool"]["resourceSliceCount"], s["spec"]["pool"]["generation"])
            for s in slices
        }
        return len(pools) == 1 and next(iter(pools))[0] == len(slices)

    def slices(self) -> list[dict[str, Any]]:
        assert self.server is not None
        return self.server.api.all_resource_slices()

    def schedule(self) -> list[str]:
        """The scheduler stand-in: every ResourceClaim without an allocation gets one on the
        first node where it fits (the structured-parameters allocator that ``simulate`` runs,
        :mod:`dra_driver.allocation.allocator`), reserved for a made-up Pod, as kube-scheduler
        would write it. One line per claim allocated, or found to fit nowhere (said once)."""
        from dra_driver.allocation import allocator, claim, pools, simulator

        assert self.server is not None
        api = self.server.api
        every, _ = api.list_resource_claims(None)
        done = [c for c in every if (c.get("status") or {}).get("allocation")]
        pending = [c for c in every if c not in done and c["metadata"]["uid"] not in self._unfit]
        if not pending:
            return []
        slices = api.all_resource_slices()
        used = pools.allocated_ids([c["status"]["allocation"]["devices"] for c in done])
        classes = simulator.builtin_classes(driver_name=self.driver_name)
        lines = []
        for obj in pending:
            meta = obj["metadata"]
            ref = f"{meta['namespace']}/{meta['name']}"
            why = "no node"
            for node in self.nodes:
                try:
                    outcome = allocator.allocate(
                        obj, slices=slices, classes=classes, node_name=node.name, allocated=used
                    )
                except (claim.ClaimError, pools.SliceError) as exc:
                    why = str(exc)
                    break
                if outcome.allocation is None:
                    why = next(iter(outcome.explanation), why)
                    continue
                used |= pools.allocated_ids([outcome.allocation["devices"]])
                pod = {"resource": "pods", "name": f"{meta['name']}-pod", "uid": str(uuid.uuid4())}
                status = {"allocation": outcome.allocation, "reservedFor": [pod]}
                api.put_resource_claim({**obj, "status": status})
                devices = ", ".join(r["device"] for r in outcome.allocation["devices"]["results"])
                lines.append(
                    f"scheduler stand-in: allocated ResourceClaim {ref} on {node.name}: {devices}; "
                    f"the kubelet stand-in prepares it with: python -m "
                    f"dra_driver.testing.kubeletcli --registry-dir {node.agent.registry_dir} "
                    f"prepare {ref} --uid {meta['uid']}"
                )
                break
            else:
                why = f"fits no node ({why})"
            if not any(ref in line for line in lines):
                self._unfit.add(meta["uid"])
                lines.append(f"scheduler stand-in: cannot allocate ResourceClaim {ref}: {why}")
        return lines

    def dead(self) -> list[tuple[str, int]]:
        """Nodes whose agent has exited, with its exit code."""
        return [
            (n.name, n.agent.proc.returncode)
            for n in self.nodes
            if n.agent.proc is not None and n.agent.proc.poll() is not None
        ]

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, int]:
        """SIGTERM every agent, SIGKILL any still running after ``timeout_s``; stop the server;
        remove the directory if it is ours. Returns each agent's exit code."""
        running = [n for n in self.nodes if n.agent.proc is not None]
        for node in running:
            if node.agent.proc is not None and node.agent.proc.poll() is None:
                node.agent.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int] = {}
        for node in running:
            proc = node.agent.proc
            assert proc is not None
            try:
                codes[node.name] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[node.name] = proc.wait(timeout=10)
        self.nodes = []
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._own_dir and self.directory.exists():
            shutil.rmtree(self.directory, ignore_errors=True)
        return codes

    def pids(self) -> list[int]:
        return [n.agent.proc.pid for n in self.nodes if n.agent.proc is not None]


def gpus_of(slices: Sequence[dict[str, Any]]) -> int:
    """The GPU devices in ``slices`` (full GPUs and MIG devices as published)."""
    return sum(len(s["spec"].get("devices") or []) for s in slices)


def throwaway_ca(client_name: str = "dev-cluster-admin") -> bundle.Bundle:
    """A throw-away CA: with the ``cryptography`` package (a development dependency) if it is
    installed, else with the ``openssl`` command; :class:`DevClusterError` with neither."""
    try:
        from dra_driver.testing.fakeapi import certs
    except ImportError:
        try:
            return opensslca.make_bundle(client_name=client_name)
        except opensslca.OpensslError as exc:
            raise DevClusterError(
                "the stand-in API server's throw-away CA needs the cryptography package "
                f"(pip install cryptography; make test's venv has it) or openssl ({exc})"
            ) from exc
    return certs.make_bundle(client_name=client_name)


def _worst_line(log: str) -> str:
    """The agent's last error line (its event), else its last line, for a one-line report."""
    lines = log.strip().splitlines()
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("level") in ("error", "critical"):
            detail = event.get("error") or event.get("exc_info") or ""
            return f"{event.get('event')}{': ' + str(detail) if detail else ''}"[:300]
    return (lines[-1] if lines else "(no log)")[:300]
