"""``dra-driver controller``: the ComputeDomain controller the chart's Deployment runs.

For every ComputeDomain (``resource.nvidia.com/v1beta1``) it keeps the workload
ResourceClaimTemplate, the IMEX daemon DaemonSet and the domain's status, and removes them when
the domain goes (docs/computedomains.md). Replicas elect one leader on a Lease in ``--namespace``.
Serves ``/metrics``, ``/healthz`` and ``/readyz`` (ready once it has reached the API server).
The logic lives in :mod:`dra_driver.computedomain`.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading

from dra_driver import app, cli, health_server, logs
from dra_driver.cli import common
from dra_driver.computedomain import controller, controlloop, leader, manifests


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from dra_driver.cli import env_default

    parser = sub.add_parser("controller", help=cli.SUMMARIES["controller"])
    common.add_kubeconfig(parser)
    common.add_namespace(
        parser,
        env="POD_NAMESPACE",
        help="the driver's namespace: the leader Lease, the IMEX DaemonSets and their claim "
        "templates live here (env POD_NAMESPACE; default: the kubeconfig context's namespace, "
        "else the pod's own; required)",
    )
    parser.add_argument(
        "--identity",
        default=env_default("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
        help="this replica's name in the leader Lease (env POD_NAME; default host-pid)",
    )
    parser.add_argument(
        "--image",
        default=env_default("IMEX_DAEMON_IMAGE", "dra-driver:latest"),
        help="image of the IMEX daemon pods (env IMEX_DAEMON_IMAGE)",
    )
    parser.add_argument(
        "--driver-root",
        default=env_default("DRIVER_ROOT", "/"),
        help="the host directory of the NVIDIA driver's files, where the IMEX daemon pods find "
        "nvidia-imex and nvidia-imex-ctl (env DRIVER_ROOT; default /)",
    )
    parser.add_argument(
        "--fake-imex",
        action="store_true",
        default=env_default("FAKE_IMEX") == "true",
        help="daemon pods run the stand-in IMEX daemon (fake GPU nodes; env FAKE_IMEX=true)",
    )
    parser.add_argument(
        "--daemon-priority-class",
        default=env_default("IMEX_DAEMON_PRIORITY_CLASS", ""),
        help="priorityClassName of the IMEX daemon pods (env IMEX_DAEMON_PRIORITY_CLASS)",
    )
    parser.add_argument(
        "--resync",
        type=float,
        default=float(env_default("RESYNC_SECONDS", "30") or 30),
        help="seconds between full rounds over every ComputeDomain (env RESYNC_SECONDS)",
    )
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        help="seconds a leader Lease holds without renewal (standbys wait this long)",
    )
    parser.add_argument(
        "--renew-interval", type=float, default=5.0, help="seconds between Lease renewals"
    )
    health_server.add_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dra_driver.kube import client
    from dra_driver.kube.objectclient import ObjectClient

    log = logs.get("controller")
    args.namespace = common.namespace_from(args)
    if not args.namespace:
        return common.fail(
            "--namespace (or POD_NAMESPACE, or a namespace in the kubeconfig context) is required"
        )
    if not 0 < args.renew_interval < args.lease_duration:
        return common.fail("--renew-interval must be above 0 and below --lease-duration")
    try:
        kube = client.KubeClient.connect(args.kubeconfig, context=args.context)
    except client.ConfigError as exc:
        return common.fail(str(exc))
    objects = ObjectClient(kube)
    settings = manifests.Settings(
        namespace=args.namespace,
        image=args.image,
        command=manifests.FAKE_IMEX_COMMAND if args.fake_imex else manifests.IMEX_COMMAND,
        priority_class=args.daemon_priority_class,
        driver_root=args.driver_root,
    )
    metrics = controller.ControllerMetrics()
    readiness = health_server.Readiness(conditions=("lease_reachable",))
    elector = leader.LeaderElector(
        objects,
        namespace=args.namespace,
        name=controlloop.LEASE_NAME,
        identity=args.identity,
        lease_s=args.lease_duration,
        log=log.bind(component="leader"),
    )
    loop = controlloop.ControlLoop(
        objects=objects,
        controller=controller.Controller(objects, settings=settings, log=log, metrics=metrics),
        elector=elector,
        log=log,
        resync_s=max(1.0, args.resync),
        renew_s=args.renew_interval,
    )
    readiness.set_check("lease_reachable", lambda: elector.reachable)
    http = health_server.from_args(args, registry=metrics.registry, readiness=readiness)
    try:
        http.start()
    except health_server.HealthServerError as exc:
        kube.close()
        return common.fail(str(exc), code=1)
    stop = threading.Event()
    app.install_signal_handlers(stop)
    log.info("ComputeDomain controller starting", namespace=args.namespace, identity=args.identity)
    try:
        loop.run(stop)
    finally:
        http.stop()
        kube.close()
    log.info("stopped")
    return 0
