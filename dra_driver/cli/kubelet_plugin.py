"""``dra-driver kubelet-plugin``: the node agent the DaemonSet runs.

It registers with the kubelet, prepares and unprepares ResourceClaims (CDI specs, checkpoint),
and publishes this node's ResourceSlices. Every flag has an environment twin so the DaemonSet can
configure it from the downward API (``NODE_NAME``, ``POD_UID``) and its ConfigMap. It also serves
``/metrics``, ``/healthz`` and ``/readyz`` (:mod:`dra_driver.health_server`). The wiring itself
lives in :mod:`dra_driver.app`.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import threading
from pathlib import Path

import structlog

from dra_driver import app, bytecode, cli, health_server, logs, metrics, shutdown
from dra_driver.cli import cdflags, common, healthflags, labelflags, mpsflags
from dra_driver.devices import backend
from dra_driver.driver import checkpoint
from dra_driver.kubelet import server
from dra_driver.pluginsettings import ALLOCATION_SOURCES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from dra_driver.cli import env_default

    parser = sub.add_parser("kubelet-plugin", help=cli.SUMMARIES["kubelet-plugin"])
    parser.add_argument(
        "--node-name",
        default=env_default("NODE_NAME"),
        help="this node's name; also our ResourceSlice pool name (env NODE_NAME; required)",
    )
    parser.add_argument(
        "--driver-name",
        default=env_default("DRIVER_NAME", "gpu.nvidia.com"),
        help="DRA driver name (env DRIVER_NAME; default gpu.nvidia.com)",
    )
    parser.add_argument(
        "--kubelet-registry-dir",
        type=Path,
        default=env_default("KUBELET_REGISTRY_DIR", "/var/lib/kubelet/plugins_registry"),
        help="where the kubelet looks for plugin registration sockets (env KUBELET_REGISTRY_DIR)",
    )
    parser.add_argument(
        "--kubelet-plugins-dir",
        type=Path,
        default=env_default("KUBELET_PLUGINS_DIR", "/var/lib/kubelet/plugins"),
        help="parent of our DRA socket and checkpoint directory (env KUBELET_PLUGINS_DIR)",
    )
    parser.add_argument(
        "--cdi-root",
        type=Path,
        default=env_default("CDI_ROOT", "/var/run/cdi"),
        help="directory for the per-claim CDI specs (env CDI_ROOT; default /var/run/cdi)",
    )
    parser.add_argument(
        "--metadata-dir",
        type=Path,
        default=env_default("METADATA_DIR") or None,  # empty: the default
        help="absolute directory for the claims' metadata files, best on a tmpfs such as "
        "/run/dra-driver/claim-metadata: never fsynced, rebuilt from the checkpoint at start "
        "(env METADATA_DIR; default <plugins-dir>/<driver>/claim-metadata; docs/metadata.md)",
    )
    common.add_kubeconfig(parser)
    parser.add_argument(
        "--driver-root",
        type=Path,
        default=env_default("DRIVER_ROOT", "/"),
        help="host path of the NVIDIA driver's files, e.g. /run/nvidia/driver (env DRIVER_ROOT)",
    )
    parser.add_argument(
        "--driver-root-mount",
        type=Path,
        default=env_default("DRIVER_ROOT_MOUNT"),
        help="where this process sees --driver-root when not at the same path, e.g. /driver-root "
        "for a host root of /; CDI specs still name host paths (env DRIVER_ROOT_MOUNT)",
    )
    parser.add_argument(
        "--pod-uid",
        default=env_default("POD_UID", ""),
        help="this pod's UID: per-instance socket names so an old and a new pod can overlap in a "
        "rolling update (kubelet >= 1.33; env POD_UID from the downward API)",
    )
    parser.add_argument(
        "--cleanup-interval",
        type=float,
        default=float(env_default("CLEANUP_INTERVAL", "60") or 60),
        help="seconds between checks for prepared claims deleted from the API "
        "(env CLEANUP_INTERVAL; 0 = never)",
    )
    parser.add_argument(
        "--api-keepalive",
        type=float,
        default=float(env_default("API_KEEPALIVE", "30") or 30),
        help="seconds after which an idle API server connection gets a cheap request, so the "
        "server's idle cut-off (kube-apiserver: 90 s) never closes the warm pool "
        "(env API_KEEPALIVE; 0 = no keep-alive)",
    )
    parser.add_argument(
        "--api-warm-connections",
        type=int,
        default=int(env_default("API_WARM_CONNECTIONS", "1") or 1),
        help="API server connections opened at start and kept open while idle (a keep-alive "
        "request each per --api-keepalive); a burst of prepares opens more, one per gRPC worker, "
        "resuming the TLS session the kept one holds, and they close after --api-keepalive idle. "
        "Each kept one costs the API server a request per keep-alive period per node, and the "
        "agent ~40 KiB (env API_WARM_CONNECTIONS; default 1)",
    )
    parser.add_argument(
        "--serial",
        action="store_true",
        default=env_default("PREPARE_SERIAL") == "true",
        help="prepare the claims of one call one after the other (benchmarking; "
        "env PREPARE_SERIAL=true)",
    )
    parser.add_argument(
        "--no-publish", action="store_true", help="do not publish ResourceSlices (testing)"
    )
    parser.add_argument(
        "--publish-grace",
        type=_seconds,
        default=env_default("PUBLISH_GRACE", "60"),
        metavar="SECONDS",
        help="how long publishing ResourceSlices may fail (API server unreachable, writes "
        "refused) before /readyz turns 503; the next success turns it 200 again "
        "(env PUBLISH_GRACE; default 60)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=env_default("SHUTDOWN_TIMEOUT", "25"),
        metavar="SECONDS",
        help="after SIGTERM, exit at the latest this long after it even if a part has not "
        "stopped, logging the part and every thread's stack; keep it under the pod's "
        "terminationGracePeriodSeconds (env SHUTDOWN_TIMEOUT; default 25; 0 = no limit)",
    )
    # Test seam, not for operators.
    parser.add_argument("--boot-id-file", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--watch-timeout", type=_seconds, default=30.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--dev-root",
        type=Path,
        default=Path(env_default("DEV_ROOT", "/") or "/"),
        help="where this process sees the host's root for /dev/nvidia* checks, e.g. /host "
        "(env DEV_ROOT; default /)",
    )
    parser.add_argument(
        "--vfio-root",
        type=Path,
        default=Path(env_default("VFIO_ROOT", "/") or "/"),
        help="where this process sees the host's sys/ and dev/ for VFIO passthrough "
        "(--passthrough), e.g. /host (env VFIO_ROOT; default /)",
    )
    parser.add_argument(
        "--mps-check-interval",
        type=float,
        default=float(env_default("MPS_CHECK_INTERVAL", "10") or 10),
        help="seconds between checks of the MPS control daemons of shared GPUs: dead ones are "
        "restarted, unused ones stopped (env MPS_CHECK_INTERVAL; 0 = never)",
    )
    parser.add_argument(
        "--gpu-metrics-interval",
        type=_seconds,
        default=env_default("GPU_METRICS_INTERVAL", "15"),
        metavar="SECONDS",
        help="seconds between NVML passes for the per-claim GPU metrics on /metrics "
        "(utilization, memory, power, temperature; docs/metrics.md) "
        "(env GPU_METRICS_INTERVAL; default 15; 0 = off)",
    )
    parser.add_argument(
        "--nvidia-proc-dir",
        type=Path,
        default=env_default("NVIDIA_PROC_DIR"),
        help="the NVIDIA kernel module's /proc directory, whose version file is read while "
        "NVML is released for a driver upgrade (env NVIDIA_PROC_DIR; default "
        "/proc/driver/nvidia; docs/lifecycle.md)",
    )
    parser.add_argument(
        "--nvml-release-deadline",
        type=_seconds,
        default=env_default("NVML_RELEASE_DEADLINE", "900"),
        metavar="SECONDS",
        help="after `dra-driver nvml-release`, initialise NVML again after this long even if "
        "the driver was not reloaded (env NVML_RELEASE_DEADLINE; default 900)",
    )
    common.add_dynamic_mig_flag(parser)
    common.add_backend_flags(parser)
    common.add_shareable_flag(parser)
    common.add_gpu_sets_flag(parser)
    common.add_passthrough_flag(parser)
    parser.add_argument(
        "--watch-allocations",
        type=labelflags.parse_bool,
        nargs="?",
        const="true",
        default=env_default("WATCH_ALLOCATIONS", "true"),
        metavar="true|false",
        help="let the set ranks follow the claims the scheduler allocates on this node, before "
        "the kubelet prepares them: a watch of this node's Pods and a GET of the claims they "
        "name (needs list/watch of pods; env WATCH_ALLOCATIONS; default true; "
        "docs/topology.md)",
    )
    parser.add_argument(
        "--allocation-source",
        choices=ALLOCATION_SOURCES,
        default=env_default("ALLOCATION_SOURCE", "node"),
        help="how the allocation watch reads this node's Pods: 'node' acts as this node "
        "(constrained impersonation, Kubernetes 1.36+: the server lets it read only this "
        "node's Pods, as the kubelet); 'pods' uses the agent's own identity (needs list/watch "
        "of every Pod in the cluster; env ALLOCATION_SOURCE; default node; docs/security.md)",
    )
    health_server.add_flags(parser)
    healthflags.add_flags(parser)
    labelflags.add_flags(parser)
    cdflags.add_flags(parser)
    mpsflags.add_flags(parser)
    parser.set_defaults(handler=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more seconds")
    return value


def settings_from(args: argparse.Namespace) -> app.PluginSettings:
    if not args.node_name:
        raise common.UsageError("--node-name (or NODE_NAME) is required")
    common.dynamic_mig(args)  # a bad value is a usage error, before anything starts
    common.passthrough_from(args)
    if args.pod_uid and not checkpoint.valid_uid(args.pod_uid):
        raise common.UsageError(
            f"--pod-uid {args.pod_uid!r}: not a pod UID (letters, digits and '-' only)"
        )
    metadata_dir: Path | None = args.metadata_dir
    if metadata_dir is not None and not metadata_dir.is_absolute():
        raise common.UsageError(
            f"--metadata-dir (or METADATA_DIR) {str(metadata_dir)!r}: not an absolute path "
            "(the claims' CDI specs mount the files by host path)"
        )
    return app.PluginSettings(
        node_name=args.node_name,
        driver_name=args.driver_name,
        registry_dir=args.kubelet_registry_dir,
        plugins_dir=args.kubelet_plugins_dir,
        cdi_root=args.cdi_root,
        metadata_dir=metadata_dir,
        kubeconfig=args.kubeconfig,
        kube_context=args.context,
        driver_root=args.driver_root,
        driver_root_mount=args.driver_root_mount,
        pod_uid=args.pod_uid or "",
        fake=bool(args.fake or args.fake_file),
        dev_root=args.dev_root,
        boot_id_file=args.boot_id_file or checkpoint.BOOT_ID_FILE,
        serial=args.serial,
        api_keepalive_s=max(0.0, args.api_keepalive),
        api_warm_connections=max(0, args.api_warm_connections),
        cleanup_interval_s=args.cleanup_interval,
        publish=not args.no_publish,
        publish_grace_s=args.publish_grace,
        watch_timeout_s=args.watch_timeout,
        dynamic_mig=args.dynamic_mig,
        health=healthflags.policy_from(args),
        node_labels=args.node_labels,
        node_labels_resync_s=args.node_labels_resync,
        shareable=common.shareable_from(args),
        gpu_sets=common.gpu_sets_from(args),
        watch_allocations=args.watch_allocations,
        allocation_source=args.allocation_source,
        mps_check_interval_s=args.mps_check_interval,
        gpu_metrics_interval_s=args.gpu_metrics_interval,
        compute_domains=cdflags.settings_from(args),
        **mpsflags.settings_from(args),
        passthrough=common.passthrough_from(args).text,
        vfio_root=args.vfio_root,
        nvidia_proc_dir=args.nvidia_proc_dir,
        nvml_release_deadline_s=args.nvml_release_deadline,
    )


def run(args: argparse.Namespace) -> int:
    from dra_driver.kube import client, features

    log = logs.get("kubelet-plugin")
    try:
        settings = settings_from(args)
        devices = common.make_backend(args)
        api = client.KubeClient.connect(
            settings.kubeconfig,
            context=settings.kube_context,
            connections=settings.api_warm_connections,
            max_connections=max(settings.workers, settings.api_connections),
            keepalive_s=settings.api_keepalive_s,
            warm_connections=settings.api_warm_connections,
        )
    except (common.UsageError, backend.DiscoveryError, client.ConfigError) as exc:
        return common.fail(str(exc))
    registry = metrics.new()
    readiness = app.new_readiness(settings)
    http = health_server.from_args(args, registry=registry.registry, readiness=readiness)
    try:
        http.start()
    except health_server.HealthServerError as exc:
        api.close()
        return common.fail(str(exc), code=1)
    warn_missing_bytecode(log)
    stop = threading.Event()
    stopper = shutdown.Stopper(log=log, deadline_s=args.shutdown_timeout)
    app.install_signal_handlers(stop, on_signal=stopper.arm)
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # `kill -USR2`: stacks on stderr
    try:
        return app.run(
            settings,
            backend=devices,
            api=api,
            stop=stop,
            log=log,
            metrics=registry,
            readiness=readiness,
            probe=lambda: features.probe(api, settings.node_name, settings.driver_name),
            server_version=lambda: str(api.get_version().get("gitVersion") or ""),
            stopper=stopper,
        )
    except (app.StartupError, server.SocketError) as exc:
        return common.fail(str(exc), code=1)
    finally:
        stopper.run([("http", http.stop), ("api-client", api.close)])


def warn_missing_bytecode(log: structlog.typing.FilteringBoundLogger) -> None:
    """Say at start when this agent compiled its modules from source because no byte-code of
    its optimization level exists and none may be written (:mod:`dra_driver.bytecode`)."""
    report = bytecode.check()
    if report is not None and report.missing:
        log.warning(
            "no byte-code at this optimization level: modules compiled from source",
            optimize=report.level,
            missing=len(report.missing),
            checked=report.checked,
            examples=list(report.missing[:5]),
            advice=bytecode.advice(report),
        )
