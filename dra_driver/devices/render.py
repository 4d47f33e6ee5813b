"""The ``discover`` table: one row per GPU and MIG device, the link matrix, the NVLink islands.

Why it exists apart from the ``discover`` command: the demo shows the same table, and a scene of
the demo must not reach up into the CLI layer for it. Pure rendering of the device model (and,
where given, a health view keyed by UUID); nothing here asks NVML or a running agent.
"""

from __future__ import annotations

from typing import Any

from dra_driver.devices import model, topology

# UUID → {"health", "conditions": [{kind, value, effect, message}], "source", ...}
HealthView = dict[str, dict[str, Any]]


def render_table(
    devices: model.NodeDevices, topo: topology.Topology, view: HealthView | None = None
) -> str:
    """The table; with ``view`` a HEALTH column (``Unhealthy (xid=79)``)."""
    rows = [["DEVICE", "PRODUCT", "MEMORY", "UUID", "PCI", "NUMA", "NVLINK", "ISLAND", "HEALTH"]]
    for g in devices.gpus:
        rows.append(
            [
                g.name
                + (" (MIG)" if g.mig_enabled else " (MIG-capable)" if g.mig_profiles else ""),
                g.product_name,
                _gib(g.memory_bytes),
                g.uuid,
                g.pci_bus_id,
                "-" if g.numa_node is None else str(g.numa_node),
                str(g.active_links),
                topo.island_of.get(g.index, "-"),
                _health_cell(view, g.uuid),
            ]
        )
        for m in g.mig_devices:
            rows.append(
                [
                    "  " + model.mig_device_name(g, m),
                    m.profile,
                    _gib(m.memory_bytes),
                    m.uuid,
                    "",
                    "",
                    "",
                    "",
                    _health_cell(view, m.uuid),
                ]
            )
    if view is None:
        rows = [r[:-1] for r in rows]
    out = [columns(rows), ""]
    header = [""] + [f"GPU{i}" for i in topo.indices] + ["NUMA"]
    matrix = [header]
    for i, row in zip(topo.indices, topology.matrix(topo), strict=True):
        numa = topo.numa_of.get(i)
        matrix.append([f"GPU{i}", *row, "-" if numa is None else str(numa)])
    out.append(columns(matrix))
    out.append("")
    if topo.islands:
        for isl in topo.islands:
            out.append(f"NVLink {isl.id}: GPUs {', '.join(str(i) for i in isl.gpu_indices)}")
    else:
        out.append("NVLink islands: none")
    out.append(
        "Legend: X = self, NV# = # NVLink links, PIX = one PCIe switch, "
        "PXB = several PCIe switches, PHB = PCIe host bridge, NODE = same NUMA node, "
        "SYS = across NUMA nodes"
    )
    return "\n".join(out)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _health_cell(view: HealthView | None, uuid: str) -> str:
    entry = (view or {}).get(uuid)
    if entry is None:
        return "-"
    status = str(entry["health"])
    if not entry["conditions"]:
        return status
    kinds = ",".join(
        f"{c['kind']}={c['value']}" if c["value"] else c["kind"] for c in entry["conditions"]
    )
    return f"{status} ({kinds})"


def columns(rows: list[list[str]]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
