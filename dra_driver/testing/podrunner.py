"""A kubelet's pod-running half for tests and the demo: the Pods bound to a node, run as processes.

Why it exists: no kubelet runs here, yet the node agent runs its MPS control daemons as Pods
(:mod:`dra_driver.driver.mps.mpspod`) and waits for them to be Ready. :class:`PodKubelet` plays the
kubelet's part for one node against an :class:`~dra_driver.kube.objects.ObjectApi` (the
in-memory store, or any API server through the real client): it watches the Pods whose
``spec.nodeName`` is its node, runs each Pod's container (``command`` + ``args``, its ``env`` on
top of this process's environment — the "image" is this machine) as a process in a session of
its own, runs the readiness probe (``exec`` only) and writes the Pod's status as a kubelet does
(phase, conditions, container state), and ends the process when the Pod is deleted: SIGTERM, then
SIGKILL after the grace period. With ``restartPolicy: Never`` an exit ends the Pod (Succeeded or
Failed, exit code and log tail in the container's terminated state).

What it cannot do it says instead of pretending: hostPath volumes are checked as a kubelet does
(``Directory`` must exist, ``DirectoryOrCreate`` is made, ``CharDevice`` must be one), but a
mount whose ``mountPath`` differs from its host path is not performed (no mount namespace
here); such mounts are listed in :attr:`RunningPod.unmounted`. Probes run every
``probe_period_s`` (default 50 ms) until the container is Ready, to keep tests quick, then
every ``periodSeconds`` as a kubelet does.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dra_driver.kube import api
from dra_driver.kube.objects import PODS, ObjectApi
from dra_driver.testing import polling

Obj = api.Obj


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunningPod:
    """One Pod's container process, its probe and its status writes (a thread of its own)."""

    def __init__(self, kubelet: PodKubelet, pod: Obj) -> None:
        meta = pod["metadata"]
        self.kubelet = kubelet
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace") or ""
        self.uid: str = meta["uid"]
        self.spec: Obj = pod["spec"]
        self.container: Obj = (self.spec.get("containers") or [{}])[0]
        self.log_path = kubelet.base / f"{self.namespace}_{self.name}_{self.uid[:8]}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.unmounted: list[str] = []
        self.deleted = threading.Event()
        self.ready = False
        self.started_at = _now()
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    # ---- the life of the container -----------------------------------------------------------

    def _run(self) -> None:
        problem = self._volumes()
        if problem:
            self._status("Pending", waiting=("CreateContainerConfigError", problem))
            return
        env = {**os.environ, **self._env()}
        argv = [*(self.container.get("command") or ()), *(self.container.get("args") or ())]
        try:
            with self.log_path.open("ab") as out:
                self.proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=self.kubelet.base,
                )
        except OSError as exc:
            self._status("Failed", terminated=(128, "StartError", str(exc)))
            return
        self.kubelet.started.append((self.name, self.uid, self.proc.pid))
        self._status("Running")
        settings = self.container.get("readinessProbe") or {}
        probe = settings.get("exec")
        threshold = int(settings.get("failureThreshold") or 3)
        period = float(settings.get("periodSeconds") or 10)
        failures, due = 0, 0.0
        while self.proc.poll() is None and not self.deleted.is_set():
            if time.monotonic() >= due:
                ok = self._probe(probe["command"], env) if probe else True
                failures = 0 if ok else failures + 1
                if ok and not self.ready:
                    self.ready = True
                    self._status("Running")
                elif self.ready and failures >= threshold:
                    self.ready = False
                    self._status("Running")
                # Quick until Ready (tests wait on it), then at the Pod's own period.
                due = time.monotonic() + (period if self.ready else self.kubelet.probe_period_s)
            self.deleted.wait(self.kubelet.probe_period_s)
        if self.deleted.is_set():
            self._end()
            return
        code = self.proc.wait()
        code = 128 - code if code < 0 else code  # killed by a signal: 128 + its number
        self.ready = False
        phase = "Succeeded" if code == 0 else "Failed"
        self._status(phase, terminated=(code, "Completed" if code == 0 else "Error", self._tail()))

    def _probe(self, command: list[str], env: dict[str, str]) -> bool:
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, timeout=5, cwd=self.kubelet.base
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0

    def _end(self) -> None:
        """The Pod was deleted: SIGTERM, then SIGKILL after the grace period."""
        if self.proc is None:
            return
        grace = min(float(self.spec.get("terminationGracePeriodSeconds") or 30), 5.0)
        for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait_s)
        self.kubelet.ended.append((self.name, self.uid, self.proc.pid))

    def kill(self) -> None:
        """Test clean-up: SIGKILL the container's whole session now."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)

    # ---- what a kubelet checks and reports ---------------------------------------------------

    def _volumes(self) -> str:
        paths = {}
        for volume in self.spec.get("volumes") or ():
            host = volume.get("hostPath")
            if host is None:
                continue
            path, kind = Path(host["path"]), host.get("type") or ""
            if kind == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            elif kind == "Directory" and not path.is_dir():
                return f"hostPath type check failed: {path} is not a directory"
            elif kind == "CharDevice" and not (path.exists() and stat.S_ISCHR(path.stat().st_mode)):
                return f"hostPath type check failed: {path} is not a character device"
            paths[volume["name"]] = str(path)
        for mount in self.container.get("volumeMounts") or ():
            host = paths.get(mount["name"])
            if host is not None and host != mount["mountPath"]:
                self.unmounted.append(f"{host} -> {mount['mountPath']}")
        return ""

    def _env(self) -> dict[str, str]:
        fields = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": self.kubelet.node_name,
        }
        env: dict[str, str] = {}
        for item in self.container.get("env") or ():
            ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            env[item["name"]] = fields.get(ref, "") if ref else str(item.get("value", ""))
        return env

    def _tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-2000:]

    def _status(
        self,
        phase: str,
        *,
        waiting: tuple[str, str] | None = None,
        terminated: tuple[int, str, str] | None = None,
    ) -> None:
        ready = "True" if self.ready and phase == "Running" else "False"
        state: Obj = {"running": {"startedAt": self.started_at}}
        if waiting is not None:
            state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
        if terminated is not None:
            code, reason, message = terminated
            state = {
                "terminated": {
                    "exitCode": code,
                    "reason": reason,
                    "message": message,
                    "startedAt": self.started_at,
                    "finishedAt": _now(),
                }
            }
        status: Obj = {
            "phase": phase,
            "startTime": self.started_at,
            "hostIP": "127.0.0.1",
            "conditions": [
                {"type": t, "status": s, "lastTransitionTime": _now()}
                for t, s in (
                    ("PodScheduled", "True"),
                    ("Initialized", "True"),
                    ("ContainersReady", ready),
                    ("Ready", ready),
                )
            ],
            "containerStatuses": [
                {
                    "name": self.container.get("name", ""),
                    "image": self.container.get("image", ""),
                    "imageID": "",
                    "ready": ready == "True",
                    "restartCount": 0,
                    "started": waiting is None,
                    "state": state,
                }
            ],
        }
        self.kubelet.write_status(self, status)


class PodKubelet:
    """Runs the Pods bound to ``node_name`` (see the module doc); ``base`` holds their logs."""

    def __init__(
        self,
        objects: ObjectApi,
        *,
        node_name: str,
        base: Path,
        probe_period_s: float = 0.05,
    ) -> None:
        self.objects = objects
        self.node_name = node_name
        self.base = base
        self.probe_period_s = probe_period_s
        self.pods: dict[str, RunningPod] = {}  # by UID, every Pod ever run; changed under _lock
        self._lock = threading.Lock()  # the watch thread adds Pods while callers read them
        self.started: list[tuple[str, str, int]] = []  # (name, uid, pid)
        self.ended: list[tuple[str, str, int]] = []  # ended because the Pod was deleted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-kubelet", daemon=True)

    def start(self) -> PodKubelet:
        self.base.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self, *, kill: bool = True) -> None:
        """Stop watching; ``kill``: end every container still running (test clean-up)."""
        self._stop.set()
        self._thread.join(timeout=10)
        if kill:
            for pod in self._snapshot():
                pod.kill()

    def __enter__(self) -> PodKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def running(self) -> dict[str, RunningPod]:
        """Pods whose process runs now, by name."""
        return {
            p.name: p
            for p in self._snapshot()
            if p.proc is not None and p.proc.poll() is None and not p.deleted.is_set()
        }

    def _snapshot(self) -> list[RunningPod]:
        with self._lock:
            return list(self.pods.values())

    def wait(self, condition: Any, timeout_s: float = 20.0) -> bool:
        return polling.poll(condition, timeout_s, interval_s=0.02)

    def write_status(self, pod: RunningPod, status: Obj) -> None:
        """Replace the Pod's status (retried on conflicts; a Pod gone meanwhile is left)."""
        for _ in range(20):
            try:
                current = self.objects.get(PODS, pod.name, namespace=pod.namespace)
            except api.NotFound:
                return
            except api.ApiError:
                time.sleep(0.05)
                continue
            if current["metadata"]["uid"] != pod.uid:
                return
            current["status"] = status
            try:
                self.objects.update_status(PODS, current)
                return
            except api.NotFound:
                return
            except api.ApiError:
                time.sleep(0.02)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                pods, rv = self.objects.list(PODS, field_selector=f"spec.nodeName={self.node_name}")
            except api.ApiError:
                self._stop.wait(0.1)
                continue
            self._sync(pods)
            with contextlib.suppress(api.ApiError):
                for _ in self._events(rv):
                    break  # something changed: list again

    def _events(self, rv: str) -> Iterator[api.WatchEvent]:
        return self.objects.watch(
            PODS,
            field_selector=f"spec.nodeName={self.node_name}",
            resource_version=rv,
            timeout_s=0.5,
        )

    def _sync(self, pods: list[Obj]) -> None:
        alive = set()
        for pod in pods:
            meta = pod["metadata"]
            uid = meta["uid"]
            if meta.get("deletionTimestamp"):
                continue
            alive.add(uid)
            if uid in self.pods:
                continue
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue  # ended before we (a new kubelet) saw it
            running = RunningPod(self, pod)
            with self._lock:
                self.pods[uid] = running
            running.thread.start()
        with self._lock:
            known = list(self.pods.items())
        for uid, running in known:
            if uid not in alive and not running.deleted.is_set():
                running.deleted.set()
