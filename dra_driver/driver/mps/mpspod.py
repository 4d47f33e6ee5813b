"""MPS control daemons as Pods of their own: the runner the chart uses.

Why it exists: a daemon that runs inside the agent's container dies with it — every rolling
update, OOM kill or liveness restart of the agent would end the CUDA contexts of every shared-GPU
workload on the node (MPS clients do not reconnect). So, as NVIDIA's driver does, each daemon
runs in a Pod of its own on this node (:mod:`~dra_driver.driver.mps.mpspodspec` builds it), created
through the API server; a new agent finds it by its name, which derives from node and daemon.

The API server is the lock between agents: a Pod name exists once (a second create gets
AlreadyExists), every delete carries the UID the agent saw (it never removes a newer incarnation),
and :class:`~.daemons.MpsDaemons` already holds the daemon's file lock around each
step. A start whose create finds the Pod there (a crash between the create and the record of its
UID) takes that Pod over when it serves the same devices and still runs; anything else under the
name is deleted first. Stopping asks the daemon to ``quit`` over its control socket (the real
daemon exits on ``quit``), deletes the Pod by UID and returns only once the Pod is gone, so the
compute mode is restored only after the daemon ended.

Readiness is the Pod's Ready condition (its probe asks the daemon over the control socket),
polled within the ready timeout, which stays inside the kubelet's prepare deadline; a Pod that
cannot start (image, configuration, exit) fails the claim at once with the Pod's name and why.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Final, Literal

import structlog

from dra_driver.driver.mps import mpspodspec, mpsprocess
from dra_driver.driver.mps.mpsrecords import DaemonRecord, Dirs, MpsError
from dra_driver.driver.mps.mpsrunner import Launch, Liveness, Stray
from dra_driver.kube import api
from dra_driver.kube.objects import PODS, ObjectApi

Obj = api.Obj


class PodRunner:
    """:class:`~dra_driver.driver.mps.mpsrunner.DaemonRunner` of daemons in Pods of this node."""

    kind: Final[Literal["pod"]] = "pod"

    def __init__(
        self,
        *,
        objects: ObjectApi,
        template: mpspodspec.PodTemplate,
        owner: Callable[[], Obj],
        processes: mpsprocess.Processes,
        log: structlog.typing.FilteringBoundLogger,
        ready_timeout_s: float = 30.0,
        stop_timeout_s: float = 20.0,  # after a quit of up to 10 s: inside the kubelet's 45 s
        poll_s: float = 0.1,
    ) -> None:
        """``owner``: the Node object (read once, for the ownerReference); ``processes``: the
        program, whose client asks a daemon to ``quit``."""
        self.objects = objects
        self.template = template
        self.processes = processes
        self.log = log
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.poll_s = poll_s
        self._owner = owner
        self._owner_ref: Obj | None = None
        self._guard = threading.Lock()

    @property
    def namespace(self) -> str:
        return self.template.namespace

    def name(self, daemon_id: str) -> str:
        t = self.template
        return mpspodspec.pod_name(t.driver_name, t.node_name, daemon_id)

    def ref(self, name: str) -> str:
        return f"Pod {self.namespace}/{name}"

    # ---- the runner --------------------------------------------------------------------------

    def intent(self, record: DaemonRecord) -> DaemonRecord:
        return record.model_copy(update={"pod": self.name(record.id), "podUid": None})

    def start(self, launch: Launch, record: DaemonRecord) -> DaemonRecord:
        pod = mpspodspec.build(
            self.template, launch.daemon_id, launch.devices, launch.dirs, self._owner_reference()
        )
        name = pod["metadata"]["name"]
        try:
            made = self.objects.create(PODS, pod)
        except api.Conflict as exc:
            if exc.reason != "AlreadyExists":
                raise MpsError(f"cannot create {self.ref(name)}: {exc}") from None
            made = self._take_over(launch, pod)
        except api.ApiError as exc:
            raise MpsError(f"cannot create {self.ref(name)}: {_why(exc)}") from None
        uid = str(made["metadata"]["uid"])
        return record.model_copy(update={"state": "Running", "pod": name, "podUid": uid})

    def wait_ready(self, launch: Launch, record: DaemonRecord) -> None:
        name = record.pod or self.name(record.id)
        deadline = time.monotonic() + self.ready_timeout_s
        pause = self.poll_s
        while True:
            try:
                pod = self.objects.get(PODS, name, namespace=self.namespace)
            except api.NotFound:
                raise MpsError(f"{self.ref(name)} was deleted before it was ready") from None
            except api.ApiError as exc:
                pod, summary = None, f"cannot read it: {_why(exc)}"
            if pod is not None:
                uid = pod["metadata"].get("uid")
                if record.podUid and uid != record.podUid:
                    raise MpsError(f"{self.ref(name)} was replaced before it was ready")
                found = mpspodspec.state(pod)
                if found.ready and (launch.dirs.pipe / "control").exists():
                    return  # Ready, and its socket is in the pipe directory its clients get
                if found.ended or found.deleting:
                    raise MpsError(
                        f"{self.ref(name)} ended before it was ready ({found.summary}); "
                        f"daemon log: {_control_log(launch.dirs)}"
                    )
                if found.problem:
                    raise MpsError(f"{self.ref(name)} cannot start: {found.problem}")
                summary = found.summary
            if time.monotonic() >= deadline:
                raise MpsError(
                    f"{self.ref(name)} not ready after {self.ready_timeout_s:g}s ({summary}); "
                    f"daemon log: {_control_log(launch.dirs)}"
                )
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 1.0)

    def liveness(self, record: DaemonRecord) -> Liveness:
        if record.pod is None:
            return Liveness(alive=False, reason="deleted", detail="no Pod recorded")
        ref = self.ref(record.pod)
        try:
            pod = self.objects.get(PODS, record.pod, namespace=self.namespace)
        except api.NotFound:
            return Liveness(alive=False, reason="deleted", detail=f"{ref} is gone")
        except api.ApiError as exc:
            return Liveness(alive=None, detail=f"cannot read {ref}: {_why(exc)}")
        uid = pod["metadata"].get("uid")
        if record.podUid and uid != record.podUid:
            detail = f"{ref} was replaced (UID {uid}, recorded {record.podUid})"
            return Liveness(alive=False, reason="deleted", detail=detail)
        found = mpspodspec.state(pod)
        if found.deleting:
            return Liveness(alive=False, reason="deleted", detail=f"{ref} is being deleted")
        if found.ended:
            return Liveness(alive=False, reason="exited", detail=f"{ref}: {found.summary}")
        return Liveness(alive=True)

    def stop(self, record: DaemonRecord, dirs: Dirs) -> None:
        name = record.pod or self.name(record.id)
        self.processes.quit(dirs.pipe)  # the real daemon ends on quit, whatever SIGTERM does
        self._delete(name, uid=None)

    def strays(self, records: Mapping[str, DaemonRecord]) -> list[Stray]:
        try:
            pods, _ = self.objects.list(
                PODS,
                namespace=self.namespace,
                label_selector=mpspodspec.selector(self.template),
                field_selector=f"spec.nodeName={self.template.node_name}",
            )
        except api.ApiError as exc:
            raise MpsError(f"cannot list the MPS daemon Pods of this node: {_why(exc)}") from None
        found = []
        for pod in pods:
            meta = pod["metadata"]
            daemon_id = mpspodspec.daemon_of(pod)
            record = records.get(daemon_id)
            if record is not None and record.pod == meta["name"]:
                continue
            found.append(
                Stray(
                    daemon_id=daemon_id,
                    name=meta["name"],
                    uid=str(meta.get("uid") or ""),
                    devices=mpspodspec.devices_of(pod),
                )
            )
        return found

    def end_stray(self, stray: Stray) -> None:
        self._delete(stray.name, uid=stray.uid)

    def describe(self, record: DaemonRecord) -> dict[str, object]:
        return {"pod": record.pod, "pod_uid": record.podUid, "namespace": self.namespace}

    # ---- helpers -----------------------------------------------------------------------------

    def _take_over(self, launch: Launch, pod: Obj) -> Obj:
        """The create found a Pod under the name: keep it if it is this daemon's and runs
        (a crash came between its create and the record of its UID), else replace it."""
        name = pod["metadata"]["name"]
        try:
            there = self.objects.get(PODS, name, namespace=self.namespace)
        except api.NotFound:
            there = None
        except api.ApiError as exc:
            raise MpsError(f"cannot read {self.ref(name)}: {_why(exc)}") from None
        if there is not None:
            found = mpspodspec.state(there)
            same = mpspodspec.devices_of(there) == launch.devices
            answers = (launch.dirs.pipe / "control").exists()  # in the directory we hand out
            if same and answers and not (found.ended or found.deleting):
                self.log.warning(
                    "took over the MPS daemon Pod already there",
                    daemon=launch.daemon_id,
                    pod=name,
                    pod_uid=there["metadata"].get("uid"),
                )
                return there
            self._delete(name, uid=str(there["metadata"]["uid"]))
        try:
            return self.objects.create(PODS, pod)
        except api.ApiError as exc:  # AlreadyExists again: someone else is creating it
            raise MpsError(f"cannot create {self.ref(name)}: {_why(exc)}") from None

    def _delete(self, name: str, *, uid: str | None) -> None:
        """Delete Pod ``name`` (only incarnation ``uid`` when given, else whichever holds the
        name) and return once it is gone; MpsError when it is still there at the deadline."""
        deadline = time.monotonic() + self.stop_timeout_s
        asked: set[str] = set()
        while True:
            try:
                pod = self.objects.get(PODS, name, namespace=self.namespace)
            except api.NotFound:
                return
            except api.ApiError as exc:
                raise MpsError(f"cannot read {self.ref(name)}: {_why(exc)}") from None
            current = str(pod["metadata"]["uid"])
            if uid is not None and current != uid:
                return  # that incarnation is gone; the one there now is not ours to end
            if current not in asked and not pod["metadata"].get("deletionTimestamp"):
                try:
                    self.objects.delete(PODS, name, namespace=self.namespace, uid=current)
                    asked.add(current)
                except api.NotFound:
                    return
                except api.Conflict:
                    continue  # replaced meanwhile: look again
                except api.ApiError as exc:
                    raise MpsError(f"cannot delete {self.ref(name)}: {_why(exc)}") from None
                continue
            if time.monotonic() >= deadline:
                raise MpsError(
                    f"{self.ref(name)} is still there {self.stop_timeout_s:g}s after its "
                    f"deletion ({mpspodspec.state(pod).summary}); its GPUs keep their compute "
                    "mode until it is gone"
                )
            time.sleep(self.poll_s)

    def _owner_reference(self) -> Obj:
        with self._guard:
            if self._owner_ref is None:
                try:
                    node = self._owner()
                except api.ApiError as exc:
                    raise MpsError(
                        f"cannot read Node {self.template.node_name}, the owner of the MPS "
                        f"daemon Pods: {_why(exc)}"
                    ) from None
                meta = node["metadata"]
                self._owner_ref = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            return dict(self._owner_ref)


def _why(exc: api.ApiError) -> str:
    status = "unreachable" if exc.status == 0 else f"HTTP {exc.status}"
    return f"{exc} ({status})"


def _control_log(dirs: Dirs) -> str:
    """The end of the daemon's own log (``control.log`` in its log directory)."""
    try:
        text = (dirs.log / "control.log").read_text(errors="replace")
    except OSError:
        text = ""
    return " ".join(text.split())[-300:] or "empty"
