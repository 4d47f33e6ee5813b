"""The Pod an MPS control daemon runs in: its name, labels and spec, and what its status says.

Why its own module: :mod:`~dra_driver.driver.mps.mpspod` drives the Pod's life through the API
server; what the Pod *is* is a pure function of the node, the daemon and the agent's
configuration, and every agent instance of the node must derive the same name from the same
daemon (that is how a new agent finds the daemons an old one started). The spec follows what the
daemon needs and nothing more:

* pinned to this node (``nodeName``: no scheduler), tolerating every taint, priority
  ``system-node-critical``, ``restartPolicy: Never`` — the agent is the only supervisor, so a
  daemon that dies is noticed, logged and counted before it is replaced;
* the program the agent would run itself (the driver root's ``nvidia-cuda-mps-control -f``, or
  the stand-in on fake nodes) in the image given by ``--mps-daemon-image``;
* its pipe and log directories (host paths under ``<plugin dir>/mps/``, mounted at the same
  paths so one ``CUDA_MPS_PIPE_DIRECTORY`` serves the daemon and the agent's ``quit``), its shm
  directory as ``/dev/shm`` (clients get the same one), the driver root read-only, the device
  nodes of its GPUs (with fake GPUs ``/dev/null`` stands in for each, as in CDI specs), and a
  small in-memory ``/tmp`` (the root filesystem is read-only);
* privileged only with real GPUs (the device cgroup grants ``/dev/nvidia*`` to privileged
  containers only); with fake GPUs no capabilities at all. The compute mode is set by the agent,
  never by the daemon. No service-account token: the daemon never calls the API;
* a readiness probe that asks the daemon over its control socket (``get_server_list``).

It is owned by the Node (``controller: true``, as the node's ResourceSlices are): it is collected
when the Node goes, never when an agent Pod or the DaemonSet is replaced (docs/sharing.md).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from dra_driver import records
from dra_driver.driver import cdi
from dra_driver.driver.mps import mpsprocess
from dra_driver.driver.mps.mpsrecords import DaemonDevice, Dirs

Obj = dict[str, Any]
CONTAINER: Final = "mps-control-daemon"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
COMPONENT: Final = "mps-control-daemon"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "dra-driver"
DRIVER_LABEL: Final = "gpu.nvidia.com/mps-driver"
NODE_LABEL: Final = "gpu.nvidia.com/mps-node"
DAEMON_LABEL: Final = "gpu.nvidia.com/mps-daemon"
DAEMON_ANNOTATION: Final = "gpu.nvidia.com/mps-daemon"
DEVICES_ANNOTATION: Final = "gpu.nvidia.com/mps-devices"
PROBE: Final = 'echo get_server_list | "$@" >/dev/null'
# Waiting reasons that will not go away by themselves within a prepare's deadline.
FATAL_WAITING: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@records.record
class PodTemplate:
    """What every daemon Pod of this agent shares."""

    driver_name: str
    node_name: str
    namespace: str
    image: str
    command: tuple[str, ...]  # the program (client and, with -f, daemon)
    env: Mapping[str, str]  # the program's extra environment (LD_LIBRARY_PATH)
    device_nodes: Callable[[DaemonDevice], Sequence[str]]  # container paths of a GPU's nodes
    fake_device_node: str | None = None  # fake GPUs: the host node behind every device node
    driver_root: tuple[str, str] | None = None  # (host path, where the program sees it)
    privileged: bool = True
    priority_class: str = "system-node-critical"


def pod_name(driver_name: str, node_name: str, daemon_id: str) -> str:
    """``mps-<node>-<daemon>-<hash>``: a DNS-1123 label (at most 63 characters) that only this
    driver's daemon ``daemon_id`` on ``node_name`` has; every agent of the node derives it."""
    digest = hashlib.sha256(f"{driver_name}/{node_name}/{daemon_id}".encode()).hexdigest()[:8]
    readable = re.sub(r"[^a-z0-9-]+", "-", f"mps-{node_name}-{daemon_id}".lower())
    return f"{readable[: 63 - 9].strip('-')}-{digest}"


def label_value(text: str) -> str:
    """``text`` when it is a valid label value, else a stable stand-in (``h-<hash>``)."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def labels(template: PodTemplate, daemon_id: str) -> dict[str, str]:
    return {
        COMPONENT_LABEL: COMPONENT,
        MANAGED_BY_LABEL: MANAGED_BY,
        DRIVER_LABEL: label_value(template.driver_name),
        NODE_LABEL: label_value(template.node_name),
        DAEMON_LABEL: label_value(daemon_id),
    }


def selector(template: PodTemplate) -> str:
    """The label selector of this node's daemon Pods (of this driver)."""
    mine = labels(template, "")
    return ",".join(f"{k}={mine[k]}" for k in (COMPONENT_LABEL, DRIVER_LABEL, NODE_LABEL))


def build(
    template: PodTemplate,
    daemon_id: str,
    devices: Sequence[DaemonDevice],
    dirs: Dirs,
    owner: Obj,
) -> Obj:
    """The Pod of daemon ``daemon_id`` serving ``devices`` from ``dirs``, owned by ``owner``
    (an ownerReference)."""
    env = {
        **template.env,
        "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
        "CUDA_VISIBLE_DEVICES": ",".join(d.uuid for d in devices),
        mpsprocess.MARKER: str(dirs.pipe),
    }
    volumes: list[Obj] = []
    mounts: list[Obj] = []

    def mount(name: str, host: str, path: str, kind: str, *, read_only: bool = False) -> None:
        volumes.append({"name": name, "hostPath": {"path": host, "type": kind}})
        mounts.append(
            {"name": name, "mountPath": path, **({"readOnly": True} if read_only else {})}
        )

    mount("pipe", str(dirs.pipe), str(dirs.pipe), "Directory")
    mount("log", str(dirs.log), str(dirs.log), "Directory")
    mount("shm", str(dirs.shm), "/dev/shm", "Directory")
    volumes.append({"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}})
    mounts.append({"name": "tmp", "mountPath": "/tmp"})  # the root filesystem is read-only
    if template.driver_root is not None:
        host, seen = template.driver_root
        mount("driver-root", host, seen, "Directory", read_only=True)
    nodes = sorted({n for d in devices for n in template.device_nodes(d)} | set(cdi.CONTROL_NODES))
    for i, node in enumerate(nodes):
        mount(f"dev-{i}", template.fake_device_node or node, node, "CharDevice")
    container: Obj = {
        "name": CONTAINER,
        "image": template.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [*template.command, "-f"],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "readinessProbe": {
            "exec": {"command": ["sh", "-c", PROBE, "probe", *template.command]},
            "periodSeconds": 1,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "securityContext": _security(template.privileged),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(template.driver_name, template.node_name, daemon_id),
            "namespace": template.namespace,
            "labels": labels(template, daemon_id),
            "annotations": {
                DAEMON_ANNOTATION: daemon_id,
                DEVICES_ANNOTATION: json.dumps(
                    [d.model_dump(mode="json") for d in devices], separators=(",", ":")
                ),
            },
            "ownerReferences": [owner],
        },
        "spec": {
            "nodeName": template.node_name,
            "restartPolicy": "Never",
            "priorityClassName": template.priority_class,
            "terminationGracePeriodSeconds": 10,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
            "volumes": volumes,
        },
    }


def _security(privileged: bool) -> Obj:
    if privileged:  # real GPUs: the device cgroup lets only privileged containers open them
        return {"privileged": True, "runAsUser": 0, "runAsGroup": 0, "readOnlyRootFilesystem": True}
    return {  # fake GPUs: root only to write the root-owned host directories, no capabilities
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "runAsUser": 0,
        "runAsGroup": 0,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def devices_of(pod: Obj) -> tuple[DaemonDevice, ...]:
    """The devices a daemon Pod serves (its annotation; none when it does not decode)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(DEVICES_ANNOTATION, "[]")
    try:
        return tuple(DaemonDevice.model_validate(d) for d in json.loads(raw))
    except (ValueError, TypeError):
        return ()


def daemon_of(pod: Obj) -> str:
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(DAEMON_ANNOTATION, ""))


@records.record
class PodState:
    """What a daemon Pod's status says: ``ready`` (the probe passes), ``ended`` (phase Failed or
    Succeeded), ``deleting`` (a deletionTimestamp), ``problem`` (a waiting reason that will not
    go away), and ``summary`` for messages."""

    ready: bool
    ended: bool
    deleting: bool
    problem: str
    summary: str


def state(pod: Obj) -> PodState:
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    details: list[str] = [f"phase {phase}"]
    problem = ""
    for container in status.get("containerStatuses") or ():
        st = container.get("state") or {}
        waiting, ended = st.get("waiting") or {}, st.get("terminated") or {}
        if waiting.get("reason"):
            text = f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
            details.append(f"waiting ({text})")
            if waiting["reason"] in FATAL_WAITING:
                problem = text
        if ended:
            code = ended.get("exitCode")
            why = ended.get("reason") or "Terminated"
            message = " ".join(str(ended.get("message") or "").split())[-300:]
            details.append(
                f"terminated ({why}, exit code {code}{': ' + message if message else ''})"
            )
    for condition in status.get("conditions") or ():
        ready_false = condition.get("type") == "Ready" and condition.get("status") != "True"
        if ready_false and condition.get("message"):
            details.append(f"not ready: {condition['message']}")
    return PodState(
        ready=ready and phase == "Running",
        ended=phase in ("Failed", "Succeeded"),
        deleting=bool((pod.get("metadata") or {}).get("deletionTimestamp")),
        problem=problem,
        summary="; ".join(details),
    )
