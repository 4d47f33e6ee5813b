"""The work kube-scheduler's DRA allocator does, counted loop iteration by loop iteration.

Why it exists: what a node publishes costs the *scheduler* time, not only our simulator:
kube-scheduler runs the structured allocator's ``Allocate(node, claims)`` on every node it
filters for a pod (``staging/src/k8s.io/dynamic-resource-allocation/structured/internal/
incubating/allocator_incubating.go``), and its cost grows with the slices it gathers and the
devices its search walks through. To compare slice designs at cluster scale
(``benchmarks/scheduler_scale.py``) the emulation counts the iterations of the upstream loops
that scale with what nodes publish. Each counter mirrors one upstream loop or call:

* ``slices_gathered``: ResourceSlices converted to the allocator's internal form
  (``Convert_v1_ResourceSlice_To_api_ResourceSlice``): by ``addSlice`` in ``GatherPools`` and by
  ``buildPool`` for a pool's slices that do not target the node (:mod:`.gatherwork`);
* ``devices_converted``: the devices in those converted slices;
* ``slices_scanned``: iterations of ``checkSlicesInPool`` over all the cluster's slices, once
  per pool that looked incomplete from the node (:mod:`.gatherwork`);
* ``devices_visited``: iterations of ``allocateOne``'s device loop (pools, their
  ``DeviceSlicesTargetingNode``, their devices), in-use devices included (:mod:`.firstfit`);
* ``cel_evaluations``: selector expressions evaluated by ``selectorsMatch`` (class selectors,
  then the request's, each expression one evaluation, stopping at the first false), only on a
  miss of ``isSelectable``'s per-(request, device) cache ``deviceMatchesRequest``
  (:mod:`.selection`);
* ``counter_checks``: calls of ``checkAvailableCounters`` (``allocateDevice``, for a device
  that consumes counters) (:mod:`.firstfit`).

Counting is opt-in: the search and the selector cache take an optional :class:`Work` and do
nothing extra without one.
"""

from __future__ import annotations

import dataclasses

FIELDS = (
    "slices_gathered",
    "devices_converted",
    "slices_scanned",
    "devices_visited",
    "cel_evaluations",
    "counter_checks",
)


@dataclasses.dataclass(slots=True)
class Work:
    """Iterations of the allocator's loops (see the module docstring for what each counts)."""

    slices_gathered: int = 0
    devices_converted: int = 0
    slices_scanned: int = 0
    devices_visited: int = 0
    cel_evaluations: int = 0
    counter_checks: int = 0

    @property
    def total(self) -> int:
        """All counters summed: one unit per loop iteration or call, whatever its kind."""
        return (
            self.slices_gathered
            + self.devices_converted
            + self.slices_scanned
            + self.devices_visited
            + self.cel_evaluations
            + self.counter_checks
        )

    def add(self, other: Work) -> None:
        """Add ``other``'s counts to these (in place)."""
        self.slices_gathered += other.slices_gathered
        self.devices_converted += other.devices_converted
        self.slices_scanned += other.slices_scanned
        self.devices_visited += other.devices_visited
        self.cel_evaluations += other.cel_evaluations
        self.counter_checks += other.counter_checks

    def __add__(self, other: Work) -> Work:
        out = dataclasses.replace(self)
        out.add(other)
        return out

    def as_dict(self) -> dict[str, int]:
        """Every counter by name, and ``total``."""
        return {**{f: int(getattr(self, f)) for f in FIELDS}, "total": self.total}
