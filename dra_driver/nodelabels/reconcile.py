"""Keep this node's GPU labels on its Node object: one PATCH when they differ, nothing otherwise.

Why it exists: the labels (:mod:`dra_driver.nodelabels.compute`) are only useful on the Node,
and a Node is shared with the kubelet, cloud controllers, operators and admins, who all label it
too. The rules this controller follows:

* It only ever writes keys under ``nvidia.com/`` and the annotation :data:`OWNED_ANNOTATION`,
  which lists (comma-separated) the label keys it set. A key it computes is its own: missing or
  different → set. A key in the annotation that it no longer computes → removed. Every other
  label, including ``nvidia.com/`` labels someone else set that were never in our set, is left
  exactly as it is.
* One JSON merge patch per change (labels and the annotation together), no patch when the Node
  already matches: at steady state a pass is one GET and no write.
* It re-checks on :meth:`NodeLabeler.trigger` (health changed) and every ``resync_s`` (someone
  removed or changed our labels: they come back within one period). A GET, not a watch, so the
  agent needs only ``get`` and ``patch`` on nodes.
* Failures back off exponentially with jitter and are logged once per attempt.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dra_driver.kube import api
from dra_driver.nodelabels.compute import PREFIX
from dra_driver.slices.publisher import Backoff

OWNED_ANNOTATION = "gpu.nvidia.com/node-labels"


class Log(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...
    def warning(self, event: str, **kw: Any) -> Any: ...


def owned(node: api.Obj) -> set[str]:
    """Label keys our annotation says we set (only ``nvidia.com/`` ones are ever believed)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    listed = str(annotations.get(OWNED_ANNOTATION) or "")
    return {k.strip() for k in listed.split(",") if k.strip().startswith(PREFIX)}


def plan(node: api.Obj, desired: Mapping[str, str]) -> api.Obj | None:
    """The merge patch that makes ``node`` carry ``desired``, or None when it already does."""
    bad = [k for k in desired if not k.startswith(PREFIX)]
    if bad:
        raise ValueError(f"refusing to manage labels outside {PREFIX}: {bad}")
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    changes: dict[str, str | None] = {k: v for k, v in desired.items() if labels.get(k) != v}
    changes |= {k: None for k in sorted(owned(node) - set(desired)) if k in labels}
    listing = ",".join(sorted(desired)) or None
    current = (meta.get("annotations") or {}).get(OWNED_ANNOTATION)
    patch: dict[str, Any] = {}
    if changes:
        patch["labels"] = changes
    if current != listing:
        patch["annotations"] = {OWNED_ANNOTATION: listing}
    return {"metadata": patch} if patch else None


@dataclasses.dataclass(slots=True)
class Outcome:
    """What one pass did: labels set (added or changed) and removed; ``patched`` = one PATCH."""

    patched: bool = False
    set: list[str] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)


class LabelSyncError(Exception):
    """A GET or PATCH of the Node failed; ``cause`` is the API error."""

    def __init__(self, op: str, node: str, cause: api.ApiError) -> None:
        super().__init__(f"{op} Node {node!r} failed: {cause}")
        self.op, self.cause = op, cause


class NodeLabeler:
    """Reconciles one Node's labels with ``desired()``; :meth:`start` runs it in a thread."""

    def __init__(
        self,
        *,
        kube: api.KubeApi,
        node_name: str,
        desired: Callable[[], Mapping[str, str]],
        log: Log,
        resync_s: float = 60.0,
        backoff: Backoff | None = None,
        on_pass: Callable[[Outcome | None], None] | None = None,
    ) -> None:
        """``on_pass`` hears about every pass of the loop (None = it failed); tests wait on it."""
        self._api, self.node_name, self._desired = kube, node_name, desired
        self.log, self._resync_s = log, resync_s
        self._backoff = backoff or Backoff(initial_s=1.0, max_s=60.0)
        self._on_pass = on_pass
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0

    def trigger(self) -> None:
        """Recompute and reconcile now (the hardware or its health changed)."""
        self._wake.set()

    def reconcile_once(self) -> Outcome:
        """One GET, and one PATCH if the Node differs; raises :class:`LabelSyncError`."""
        desired = dict(self._desired())
        try:
            node = self._api.get_node(self.node_name)
        except api.ApiError as exc:
            raise LabelSyncError("get", self.node_name, exc) from exc
        patch = plan(node, desired)
        self.passes += 1
        if patch is None:
            return Outcome()
        changes = patch["metadata"].get("labels") or {}
        try:
            self._api.patch_node(self.node_name, patch)
        except api.ApiError as exc:
            raise LabelSyncError("patch", self.node_name, exc) from exc
        outcome = Outcome(
            patched=True,
            set=sorted(k for k, v in changes.items() if v is not None),
            removed=sorted(k for k, v in changes.items() if v is None),
        )
        self.log.info("node labels updated", set=outcome.set, removed=outcome.removed)
        return outcome

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="node-labels", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        """Reconcile until stopped: after a success wait for a trigger or the resync period,
        after a failure the backoff delay (a trigger cuts either short)."""
        while not self._stop.is_set():
            self._wake.clear()
            try:
                outcome: Outcome | None = self.reconcile_once()
            except LabelSyncError as exc:
                outcome = None
                delay = self._backoff.next_delay()
                self.log.warning(
                    "cannot keep the node's GPU labels",
                    op=exc.op,
                    status=exc.cause.status,
                    error=str(exc.cause),
                    retry_in_s=round(delay, 3),
                    attempt=self._backoff.step,
                )
            else:
                delay = self._resync_s
                self._backoff.reset()
            self._notify(outcome)
            self._wake.wait(delay)

    def _notify(self, outcome: Outcome | None) -> None:
        if self._on_pass is None:
            return
        try:
            self._on_pass(outcome)
        except Exception as exc:  # an observer never stops the labels
            self.log.warning("node label observer failed", error=repr(exc))
