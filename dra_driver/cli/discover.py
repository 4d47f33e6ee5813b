"""``dra-driver discover``: show what the driver sees on this node.

The first thing an operator runs on a new node: one row per GPU and MIG device, the NVLink/PCIe
matrix like ``nvidia-smi topo -m``, and the NVLink islands. ``--output json|yaml`` gives the full
device model with stable field names (docs/discover.md).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from dra_driver import cli
from dra_driver.cli import common
from dra_driver.devices import backend, model, topology


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("discover", help=cli.SUMMARIES["discover"])
    common.add_backend_flags(parser)
    parser.add_argument("--output", "-o", choices=("table", "json", "yaml"), default="table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        devices = common.make_backend(args).discover()
    except (common.UsageError, backend.DiscoveryError) as exc:
        return common.fail(str(exc))
    topo = topology.build(devices)
    if args.output == "table":
        print(render_table(devices, topo))
    else:
        doc = as_document(devices, topo)
        if args.output == "json":
            print(json.dumps(doc, indent=2, sort_keys=False))
        else:
            print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0


def as_document(devices: model.NodeDevices, topo: topology.Topology) -> dict[str, Any]:
    """The full model plus derived topology, as documented in docs/discover.md."""
    return {
        "gpus": [model.to_dict(g) for g in devices.gpus],
        "topology": {
            "islands": [{"id": isl.id, "gpus": list(isl.gpu_indices)} for isl in topo.islands],
            "pairs": [
                {"gpus": [a, b], "nvlinks": topo.links(a, b), "path": topo.path(a, b)}
                for i, a in enumerate(topo.indices)
                for b in topo.indices[i + 1 :]
            ],
        },
    }


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def render_table(devices: model.NodeDevices, topo: topology.Topology) -> str:
    rows = [["DEVICE", "PRODUCT", "MEMORY", "UUID", "PCI", "NUMA", "NVLINK", "ISLAND"]]
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
                ]
            )
    out = [_columns(rows), ""]
    header = [""] + [f"GPU{i}" for i in topo.indices] + ["NUMA"]
    matrix = [header]
    for i, row in zip(topo.indices, topology.matrix(topo), strict=True):
        numa = topo.numa_of.get(i)
        matrix.append([f"GPU{i}", *row, "-" if numa is None else str(numa)])
    out.append(_columns(matrix))
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


def _columns(rows: list[list[str]]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
