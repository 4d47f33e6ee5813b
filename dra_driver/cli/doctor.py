"""``dra-driver doctor``: can this driver work on the cluster at hand, and how well?

A kube-apiserver with a DRA feature gate off stores our ResourceSlices without that gate's fields
and answers 201 all the same, so an agent cannot tell from its writes that its GPUs' taints,
counters or shares never reached the scheduler. This command asks the server (through
:mod:`dra_driver.kube.features`: API discovery, ``/version``, a dry-run create of probe slices
that stores nothing, access reviews) and prints, one line each, what the server serves, which of
our optional fields it keeps or drops and what that means for this driver, and the RBAC the
credentials have. Run it in the agent's pod to see the agent's own service account.

Exit codes: 0 when the driver can work (whatever it dropped); 1 when it cannot at all
(``resource.k8s.io/v1`` not served); 2 when it cannot run: a kubeconfig it cannot load, a server it
cannot reach or that is not a Kubernetes API server (one line on stderr).
"""

from __future__ import annotations

import argparse
from typing import Any

from dra_driver import cli
from dra_driver.cli import common, output
from dra_driver.kube import client, features
from dra_driver.slices import validate

# Per feature: label, Features field, gate, what kept and dropped mean for this driver.
FEATURES = (
    (
        "device taints",
        "device_taints",
        "DRADeviceTaints",
        "an unhealthy GPU is tainted in its slice, so no new claim gets it",
        "an unhealthy GPU cannot be tainted; the agent withdraws it from its slice instead",
    ),
    (
        "shared counters",
        "shared_counters",
        "DRAPartitionableDevices",
        "dynamic MIG (--dynamic-mig) can be published",
        "dynamic MIG (--dynamic-mig) cannot be published",
    ),
    (
        "consumable capacity",
        "consumable_capacity",
        "DRAConsumableCapacity",
        "GPU shares (--shareable) can be published",
        "GPU shares (--shareable) cannot be published",
    ),
)
PROBE_NODE = "dra-driver-doctor"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from dra_driver.cli import env_default
    from dra_driver.slices import build

    parser = sub.add_parser(
        "doctor",
        help=cli.SUMMARIES["doctor"],
        description="Check what the API server serves and keeps of this driver's "
        "ResourceSlices (a dry-run create: nothing is stored) and the RBAC the credentials "
        "have. Exit 0: the driver can work; 1: it cannot (resource.k8s.io/v1 not served); "
        "2: it cannot run (a kubeconfig it cannot load, a server it cannot reach or that is "
        "not a Kubernetes API server; one line on stderr).",
    )
    common.add_kubeconfig(parser)
    parser.add_argument(
        "--node-name",
        default=env_default("NODE_NAME", PROBE_NODE),
        help=f"node the probe slices name (nothing is stored; env NODE_NAME; default {PROBE_NODE})",
    )
    parser.add_argument(
        "--driver-name",
        default=env_default("DRIVER_NAME", build.DEFAULT_DRIVER_NAME),
        help=f"DRA driver name (env DRIVER_NAME; default {build.DEFAULT_DRIVER_NAME})",
    )
    output.add_flag(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        kube = client.KubeClient.connect(args.kubeconfig, context=args.context)
    except client.ConfigError as exc:
        return common.fail(str(exc))
    try:
        try:
            for probe_slice in features.probe_slices(args.node_name, args.driver_name):
                validate.check(probe_slice)
            found = features.probe(kube, args.node_name, args.driver_name)
        except features.ProbeError as exc:
            return common.fail(str(exc))
        except validate.SliceInvalid as exc:  # a node or driver name no slice can carry
            return common.fail(f"--node-name/--driver-name: {exc}")
        access = features.rbac(kube)
        if output.fmt(args) != output.TABLE:
            output.emit(document(kube.server, found, access), output.fmt(args))
        else:
            print("\n".join(report(kube.server, found, access, args.node_name, args.driver_name)))
        return 0 if found.v1_served else 1
    finally:
        kube.close()


def document(server: str, found: features.Features, access: features.Rbac) -> dict[str, Any]:
    """What ``-o json|yaml`` prints (docs/cli-output.md)."""
    return {
        "server": server,
        "serverVersion": found.server_version,
        "resourceApi": {
            "served": list(found.served_versions),
            "preferred": found.preferred_version,
            "v1Served": found.v1_served,
        },
        "probed": not found.not_probed,
        "notProbed": found.not_probed,
        # Per feature gate: true kept, false dropped (gate off), null not probed.
        "features": {gate: getattr(found, field) for _, field, gate, _, _ in FEATURES},
        "rbac": {
            "complete": access.complete,
            "unknown": access.unknown,
            "resources": [
                {"resource": r.resource, "allowed": list(r.allowed), "denied": list(r.denied)}
                for r in access.rows
            ],
        },
    }


def report(
    server: str, found: features.Features, access: features.Rbac, node: str, driver: str
) -> list[str]:
    """The lines ``doctor`` prints."""
    lines = [
        f"API server: {server}",
        f"server version: {found.server_version}",
        f"{features.GROUP}: {_served(found)}",
    ]
    if found.not_probed:
        lines.append(f"probe: not run — {found.not_probed}")
    else:
        lines.append(
            f"probe: dry-run create of 2 ResourceSlices (node {node}, driver {driver}); "
            "nothing stored"
        )
    for label, field, gate, if_kept, if_dropped in FEATURES:
        kept: bool | None = getattr(found, field)
        if kept is None:
            lines.append(f"{label}: unknown — {gate} not probed")
        elif kept:
            lines.append(f"{label}: kept — {gate} enabled: {if_kept}")
        else:
            lines.append(f"{label}: dropped — {gate} disabled: {if_dropped}")
    lines += [
        "set ranks: plain attributes, always kept: dra-driver claim gets topology-optimal GPUs",
        "binding conditions: not published by this driver (DRADeviceBindingConditions not needed)",
    ]
    if access.unknown:
        lines.append(f"RBAC: unknown ({access.unknown})")
        return lines
    verdict = "all the agent needs" if access.complete else "NOT all the agent needs"
    lines.append(f"RBAC of these credentials: {verdict}")
    for row in access.rows:
        parts = [f"{', '.join(row.allowed)} allowed"] if row.allowed else []
        parts += [f"{', '.join(row.denied)} DENIED"] if row.denied else []
        lines.append(f"  {row.resource}: {'; '.join(parts)}")
    return lines


def _served(found: features.Features) -> str:
    if not found.served_versions:
        return (
            "not served — this server has no DRA API; the driver needs resource.k8s.io/v1 "
            "(Kubernetes >= 1.34): it cannot work here"
        )
    listed = ", ".join(found.served_versions)
    if not found.v1_served:
        return (
            f"v1 NOT served (served: {listed}) — the driver needs resource.k8s.io/v1 "
            "(Kubernetes >= 1.34): it cannot work here"
        )
    return f"v1 served (served: {listed}; preferred {found.preferred_version})"
