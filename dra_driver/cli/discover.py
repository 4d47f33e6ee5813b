"""``dra-driver discover``: show what the driver sees on this node.

The first thing an operator runs on a new node: one row per GPU and MIG device with its health,
the NVLink/PCIe matrix like ``nvidia-smi topo -m``, and the NVLink islands. ``--output json|yaml``
gives the full device model with stable field names (docs/discover.md). Health is what NVML shows
right now (lost, pages pending retirement, row remapping, fabric, recovery action); pointed at a
running node agent (its ``--kubelet-plugins-dir`` or ``--device-plugin-dir``) it is the agent's
view instead: XIDs seen, hold times, recoveries (docs/health.md). ``--claims`` lists the claims
the agent prepared (read from its checkpoint in the plugin directory, never changed) with the
physical GPUs behind their devices.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from dra_driver import cli, healthcontrol
from dra_driver.cli import agentflags, common
from dra_driver.devices import backend, health, model, render, topology, vfiohost

HealthView = render.HealthView
PASSED_THROUGH = "PassedThrough"  # bound to vfio-pci for a VM: its health checks pause
render_table = render.render_table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("discover", help=cli.SUMMARIES["discover"])
    common.add_backend_flags(parser)
    parser.add_argument("--output", "-o", choices=("table", "json", "yaml"), default="table")
    agentflags.add(parser, explicit_only=True)
    parser.add_argument(
        "--claims",
        action="store_true",
        help="list the claims the DRA agent prepared on this node, from its checkpoint under "
        f"--kubelet-plugins-dir (default {agentflags.DEFAULT_PLUGINS_DIR}) and --driver-name, "
        "with their devices and physical GPUs (UUID, minor)",
    )
    parser.add_argument(
        "--vfio-root",
        type=Path,
        default=Path("/"),
        help="where the host's sys/ is: a GPU bound to vfio-pci there (passed through to a VM, "
        "docs/passthrough.md) shows health PassedThrough (default /)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        source = common.make_backend(args)
        devices = source.discover()
    except (common.UsageError, backend.DiscoveryError) as exc:
        return common.fail(str(exc))
    if args.claims:
        return _claims(args, devices)
    try:
        view = health_view(args, source, devices)
    except healthcontrol.ControlError as exc:
        return common.fail(str(exc), code=1)
    topo = topology.build(devices)
    if args.output == "table":
        print(render_table(devices, topo, view))
    else:
        doc = as_document(devices, topo, view)
        if args.output == "json":
            print(json.dumps(doc, indent=2, sort_keys=False))
        else:
            print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0


def health_view(
    args: argparse.Namespace, source: backend.Backend, devices: model.NodeDevices
) -> HealthView:
    """Each GPU's and MIG device's health: from the node agent when pointed at one, else what
    NVML shows now. A MIG device also carries its GPU's conditions."""
    from dra_driver import nodehealth

    own: dict[str, list[dict[str, Any]]] = {}
    extra: dict[str, dict[str, Any]] = {}
    if agentflags.given(args):
        path = agentflags.sockets(args)[0]
        for status in healthcontrol.request(path, {"op": "status"})["devices"]:
            own[status["uuid"]] = status["conditions"]
            extra[status["uuid"]] = {
                "recoveries": status["recoveries"],
                "holdLeftSeconds": status["holdLeftSeconds"],
            }
        origin = "agent"
    else:
        api = getattr(source, "nvml_api", None)
        found = nodehealth.probe(api, devices) if api is not None else {}
        own = {u: [dataclasses.asdict(c) for c in cs] for u, cs in found.items()}
        origin = "nvml" if api is not None else "none"
    view: HealthView = {}
    host = vfiohost.VfioHost(getattr(args, "vfio_root", Path("/")))
    for gpu in devices.gpus:
        if host.driver(gpu.pci_bus_id) == vfiohost.VFIO:  # NVML cannot see it: no verdict
            view[gpu.uuid] = {"health": PASSED_THROUGH, "conditions": [], "source": "sysfs"}
            continue
        for uuid, conditions in [(gpu.uuid, own.get(gpu.uuid, []))] + [
            (m.uuid, own.get(m.uuid, []) + own.get(gpu.uuid, [])) for m in gpu.mig_devices
        ]:
            view[uuid] = {
                "health": health.UNHEALTHY if conditions else health.HEALTHY,
                "conditions": conditions,
                "source": origin,
                **extra.get(uuid, {}),
            }
    return view


def as_document(
    devices: model.NodeDevices, topo: topology.Topology, view: HealthView | None = None
) -> dict[str, Any]:
    """The full model plus derived topology and health, as documented in docs/discover.md."""
    gpus = [model.to_dict(g) for g in devices.gpus]
    if view is not None:
        for gpu, doc in zip(devices.gpus, gpus, strict=True):
            doc["health"] = view.get(gpu.uuid)
            for mig, mig_doc in zip(gpu.mig_devices, doc["mig_devices"], strict=True):
                mig_doc["health"] = view.get(mig.uuid)
    return {
        "gpus": gpus,
        "topology": {
            "islands": [{"id": isl.id, "gpus": list(isl.gpu_indices)} for isl in topo.islands],
            "pairs": [
                {"gpus": [a, b], "nvlinks": topo.links(a, b), "path": topo.path(a, b)}
                for i, a in enumerate(topo.indices)
                for b in topo.indices[i + 1 :]
            ],
        },
    }


def prepared_claims(plugin_dir: Path, devices: model.NodeDevices) -> list[dict[str, Any]]:
    """The claim records in the agent's checkpoint under ``plugin_dir`` (read only: nothing is
    moved, deleted or locked), each with its devices and the physical GPUs behind them."""
    from dra_driver.driver import checkpoint, claiminfo, inventory

    claims_dir = plugin_dir / "claims"
    index = inventory.build(devices, mig_minors=None)
    found: list[dict[str, Any]] = []
    for path in sorted(claims_dir.glob("*.json")) if claims_dir.is_dir() else []:
        try:
            record = checkpoint.decode_record(checkpoint.read_file(path), what=path.name)
        except (ValueError, OSError, RecursionError):
            continue  # a spare, a torn write, another format: the agent moves those aside
        if path.name != f"{record.uid}.json":
            continue
        gpus = claiminfo.physical_gpus(record, index)
        found.append(
            {
                "namespace": record.namespace,
                "name": record.name,
                "uid": record.uid,
                "state": record.state,
                "devices": [
                    {
                        "device": dev.deviceName,
                        "requests": list(dev.requestNames),
                        "gpus": [
                            {"uuid": g.gpu_uuid, "minor": g.gpu_minor, "mig_uuid": g.mig_uuid}
                            for g in gpus
                            if g.device == dev.deviceName
                        ],
                    }
                    for dev in record.devices
                ],
            }
        )
    return sorted(found, key=lambda c: (c["namespace"], c["name"], c["uid"]))


def _claims(args: argparse.Namespace, devices: model.NodeDevices) -> int:
    from dra_driver.cli import env_default

    plugins = args.kubelet_plugins_dir or Path(
        env_default("KUBELET_PLUGINS_DIR", agentflags.DEFAULT_PLUGINS_DIR)
        or agentflags.DEFAULT_PLUGINS_DIR
    )
    plugin_dir = Path(plugins) / args.driver_name
    if not (plugin_dir / "claims").is_dir():
        return common.fail(
            f"no checkpoint at {plugin_dir / 'claims'}: is the DRA agent's --kubelet-plugins-dir "
            f"{plugins} and --driver-name {args.driver_name}?",
            code=1,
        )
    found = prepared_claims(plugin_dir, devices)
    if args.output == "json":
        print(json.dumps({"claims": found}, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump({"claims": found}, sort_keys=False), end="")
    else:
        print(render_claims(found))
    return 0


def render_claims(found: list[dict[str, Any]]) -> str:
    """One row per physical GPU of each prepared device (a device on no known GPU: one row)."""
    if not found:
        return "no prepared claims"
    rows = [["CLAIM", "UID", "STATE", "DEVICE", "GPU UUID", "MINOR", "MIG UUID"]]
    for claim in found:
        for dev in claim["devices"]:
            for gpu in dev["gpus"] or [{"uuid": "-", "minor": "-", "mig_uuid": ""}]:
                rows.append(
                    [
                        f"{claim['namespace']}/{claim['name']}",
                        claim["uid"],
                        claim["state"],
                        dev["device"],
                        gpu["uuid"],
                        str(gpu["minor"]),
                        gpu["mig_uuid"] or "-",
                    ]
                )
    return render.columns(rows)
