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

Two more counters weigh what those loops copy, because the real allocator's cost per device grows
with the device's attributes and capacities ("entries"):

* ``entries_converted``: the entries of the converted devices (the conversion copies every
  attribute and capacity, interning names);
* ``cel_entries``: the entries of the device per selector evaluation: ``selectorsMatch`` converts
  the device back to v1 for *each* expression (``Convert_api_Device_To_v1_Device``) and
  ``cel.DeviceMatches`` builds the map of all its attributes and capacities before evaluating
  (``dynamic-resource-allocation/cel/compile.go``: "avoid building these maps ... TODO").

:attr:`Work.cost` is the weighted sum the benchmark compares designs by: every loop iteration or
call one unit (:attr:`Work.total`), every entry a converted device copies one unit, every entry
a selector evaluation copies twice (conversion and map). It reproduces what a real v1.36.2
kube-scheduler measured at 1,000 DGX H100 nodes: set ranks (20-21 entries per GPU, a class and
a rank selector per device) 4.4 pods/s against 8.7 for plain GPUs (14 entries, one selector):
0.51x measured, 0.47x by cost (docs/topology.md).

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
WEIGHTS = ("entries_converted", "cel_entries")


@dataclasses.dataclass(slots=True)
class Work:
    """Iterations of the allocator's loops (see the module docstring for what each counts)."""

    slices_gathered: int = 0
    devices_converted: int = 0
    slices_scanned: int = 0
    devices_visited: int = 0
    cel_evaluations: int = 0
    counter_checks: int = 0
    entries_converted: int = 0
    cel_entries: int = 0

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

    @property
    def cost(self) -> int:
        """The loop units plus the entries copied: each entry of a converted device once, each
        entry of a device a selector is evaluated on twice (see the module docstring)."""
        return self.total + self.entries_converted + 2 * self.cel_entries

    def add(self, other: Work) -> None:
        """Add ``other``'s counts to these (in place)."""
        self.slices_gathered += other.slices_gathered
        self.devices_converted += other.devices_converted
        self.slices_scanned += other.slices_scanned
        self.devices_visited += other.devices_visited
        self.cel_evaluations += other.cel_evaluations
        self.counter_checks += other.counter_checks
        self.entries_converted += other.entries_converted
        self.cel_entries += other.cel_entries

    def __add__(self, other: Work) -> Work:
        out = dataclasses.replace(self)
        out.add(other)
        return out

    def as_dict(self) -> dict[str, int]:
        """Every counter by name, ``total`` and ``cost``."""
        return {
            **{f: int(getattr(self, f)) for f in (*FIELDS, *WEIGHTS)},
            "total": self.total,
            "cost": self.cost,
        }
