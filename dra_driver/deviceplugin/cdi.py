"""The static CDI spec of device-plugin mode: one CDI device per GPU or MIG device, named by UUID.

Why static (unlike the DRA path's per-claim transient specs): the device plugin API hands out
whole devices, so one spec listing every GPU is enough; Allocate answers with fully qualified
names like ``k8s.device-plugin.nvidia.com/gpu=GPU-0f2c...`` and makes sure the file is still
there (an admin may have cleaned ``/var/run/cdi``). The kind is our own so it never collides
with a spec the NVIDIA Container Toolkit generated under ``nvidia.com/gpu``.

With a fake backend there are no ``/dev/nvidia*`` nodes; like the DRA path, every node is then
backed by a harmless host node (``/dev/null``) through ``hostPath``, so fake clusters still run
pods. A unit with a ``problem`` (MIG capability minors missing) is left out of the spec, so it
can never be injected without its capability nodes. Version selection and the final validity
check are the DRA path's (:func:`dra_driver.driver.cdi.minimum_version`,
:func:`dra_driver.driver.cdi.check`).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dra_driver.deviceplugin import inventory
from dra_driver.driver import atomicfile
from dra_driver.driver import cdi as dra_cdi

DEFAULT_KIND = "k8s.device-plugin.nvidia.com/gpu"
CONTROL_NODES = dra_cdi.CONTROL_NODES
FAKE_NODE = dra_cdi.FAKE_DEVICE_NODE  # what backs every device node with a fake backend

_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?$")  # no dots: kubelet's stricter rule


class CdiError(Exception):
    """A CDI kind or device name breaks the CDI naming rules, or the spec cannot be written."""


def check_kind(kind: str) -> str:
    """``vendor/class`` per the CDI rules (class without dots, as kubelet requires)."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not _VENDOR.match(vendor) or not _CLASS.match(cls):
        raise CdiError(
            f"CDI kind {kind!r} is not <vendor>/<class> (vendor like example.com, class of "
            "letters, digits, '_' and '-', e.g. k8s.device-plugin.nvidia.com/gpu)"
        )
    return kind


def qualified_name(kind: str, unit: inventory.Unit) -> str:
    """The fully qualified CDI device name of a unit: ``<kind>=<uuid>``."""
    return f"{kind}={unit.uuid}"


def device_nodes(unit: inventory.Unit) -> tuple[str, ...]:
    """The per-device nodes of a unit: a MIG device uses its parent's node plus its GPU and
    compute instance capability nodes (``/dev/nvidia-caps/nvidia-cap<N>``)."""
    return unit.device_nodes


def host_path(path: str, fake_node: str | None) -> str:
    """Where a container device node comes from on the host."""
    return path if fake_node is None else fake_node


def _node(path: str, fake_node: str | None) -> dict[str, str]:
    return {"path": path} if fake_node is None else {"path": path, "hostPath": fake_node}


def unit_env(unit: inventory.Unit) -> str:
    """A per-device variable naming the device, unique on the node (mergeable across devices)."""
    if unit.mig is None:
        return f"GPU_DEVICE_{unit.minor}={unit.uuid}"
    return f"GPU_DEVICE_{unit.minor}_MIG_{unit.mig.placement_start}={unit.uuid}"


def build_spec(
    units: Iterable[inventory.Unit], *, kind: str, fake_node: str | None
) -> dict[str, Any]:
    """The spec document; devices sorted by name so the file is stable across restarts.

    Units with a ``problem`` are left out (Allocate rejects them, naming the problem)."""
    check_kind(kind)
    unique = {u.uuid: u for u in units if not u.problem}
    devices = [
        {
            "name": name,
            "containerEdits": {
                "env": [unit_env(unique[name])],
                "deviceNodes": [_node(p, fake_node) for p in device_nodes(unique[name])],
            },
        }
        for name in sorted(unique)
    ]
    body: dict[str, Any] = {
        "kind": kind,
        "devices": devices,
        "containerEdits": {"deviceNodes": [_node(p, fake_node) for p in CONTROL_NODES]},
    }
    spec = {"cdiVersion": dra_cdi.minimum_version(body), **body}  # the version first in the file
    problems = dra_cdi.check(spec)
    if problems:
        raise CdiError(f"static CDI spec {kind} would be invalid: {'; '.join(problems)}")
    return spec


def spec_path(root: Path, kind: str) -> Path:
    """``<root>/<vendor>-<class>.json``, the CDI library's file name for a regular spec."""
    vendor, _, cls = check_kind(kind).partition("/")
    return root / f"{vendor}-{cls}.json"


class StaticSpec:
    """Keeps the spec file present and current; safe to call from many gRPC threads.

    A node without usable devices gets no spec (CDI forbids an empty one); nothing can name it.
    """

    def __init__(
        self, *, root: Path, kind: str, units: Sequence[inventory.Unit], fake_node: str | None
    ) -> None:
        self.path = spec_path(root, kind)
        usable = [u for u in units if not u.problem]
        self.spec = build_spec(usable, kind=kind, fake_node=fake_node) if usable else None
        self._lock = threading.Lock()

    def ensure(self) -> bool:
        """Write the file when missing or different; returns whether it was written."""
        if self.spec is None:
            return False
        with self._lock:
            try:
                if json.loads(self.path.read_text(encoding="utf-8")) == self.spec:
                    return False
            except (OSError, ValueError):
                pass
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomicfile.write_json(self.path, self.spec)
            except OSError as exc:
                raise CdiError(f"cannot write CDI spec {self.path}: {exc.strerror}") from exc
            return True
