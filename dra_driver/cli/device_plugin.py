"""``dra-driver device-plugin``: serve ``nvidia.com/gpu`` over the kubelet device plugin API.

The legacy mode for clusters and charts that still ask for ``resources.limits: nvidia.com/gpu``
(docs/device-plugin.md). It discovers GPUs like every other subcommand, then runs
:class:`dra_driver.deviceplugin.app.DevicePluginApp` until SIGTERM/SIGINT, removing its sockets
on the way out. It also serves ``/metrics``, ``/healthz`` and ``/readyz`` (ready once every
resource is registered). Given ``--node-name`` (env NODE_NAME, set by the chart) it keeps the
Node's GPU labels too (docs/labels.md), the only thing it asks the API server for. Exit codes:
0 clean shutdown, 1 the kubelet refused us or the metrics port is taken, 2 bad flags or input.
"""

from __future__ import annotations

import argparse
import enum
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

from dra_driver import cli, health_server, healthcontrol, logs, metrics, nodehealth
from dra_driver.cli import common, healthflags, labelflags
from dra_driver.deviceplugin import allocate, app, cdi, inventory, registrar
from dra_driver.deviceplugin import lifecycle as dplifecycle
from dra_driver.devices import backend, health, model
from dra_driver.driver import inventory as preparable
from dra_driver.nodelabels import agent as nodelabels
from dra_driver.nodelabels import compute as labels_compute

if TYPE_CHECKING:
    from dra_driver.kube import client

_log = logs.get("cli.device_plugin")
_E = TypeVar("_E", bound=enum.StrEnum)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from dra_driver.cli import env_default

    parser = sub.add_parser(
        "device-plugin",
        help=cli.SUMMARIES["device-plugin"],
        description="Legacy device-plugin mode (docs/device-plugin.md). Do not run it on a node "
        "where the DRA kubelet plugin serves the same GPUs.",
    )
    common.add_backend_flags(parser)
    parser.add_argument(
        "--resource-name",
        default=env_default("RESOURCE_NAME", "nvidia.com/gpu"),
        help="extended resource to serve (env RESOURCE_NAME; default nvidia.com/gpu)",
    )
    parser.add_argument(
        "--device-plugin-dir",
        type=Path,
        default=env_default("DEVICE_PLUGIN_DIR", "/var/lib/kubelet/device-plugins"),
        help="kubelet device plugin directory holding kubelet.sock (env DEVICE_PLUGIN_DIR)",
    )
    parser.add_argument(
        "--device-list-strategy",
        default=env_default("DEVICE_LIST_STRATEGY", "cdi"),
        help="cdi: answer Allocate with CDI device names; envvar: NVIDIA_VISIBLE_DEVICES and "
        "device specs (env DEVICE_LIST_STRATEGY; default cdi)",
    )
    parser.add_argument(
        "--cdi-root",
        type=Path,
        default=env_default("CDI_ROOT", "/var/run/cdi"),
        help="where the static CDI spec is written (env CDI_ROOT; default /var/run/cdi)",
    )
    parser.add_argument(
        "--cdi-kind",
        default=env_default("CDI_KIND", cdi.DEFAULT_KIND),
        help=f"CDI vendor/class of the spec (env CDI_KIND; default {cdi.DEFAULT_KIND})",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=env_default("GPU_REPLICAS", "1"),
        help="replicas per GPU, shared by --sharing-strategy; IDs become <uuid>::<n> "
        "(env GPU_REPLICAS)",
    )
    parser.add_argument(
        "--sharing-strategy",
        default=env_default("SHARING_STRATEGY", "time-slicing"),
        help="how the --replicas of a GPU share it: time-slicing (no limits) or mps (one MPS "
        "daemon per GPU, each replica 1/N of its memory and SMs; env SHARING_STRATEGY)",
    )
    parser.add_argument(
        "--mps-dir",
        type=Path,
        default=env_default("MPS_DIR", "/run/dra-driver/mps"),
        help="host directory for the MPS daemons' pipe, log and shm directories (env MPS_DIR)",
    )
    parser.add_argument(
        "--driver-root",
        type=Path,
        default=env_default("DRIVER_ROOT", "/"),
        help="where the NVIDIA driver's files are (nvidia-cuda-mps-control for MPS replicas; "
        "env DRIVER_ROOT)",
    )
    parser.add_argument(
        "--mig-strategy",
        default=env_default("MIG_STRATEGY", "none"),
        help="none | single | mixed (env MIG_STRATEGY; default none)",
    )
    health_server.add_flags(parser)
    healthflags.add_flags(parser)
    labelflags.add_flags(parser, api_access=True)
    common.add_kubeconfig(parser, what="kubeconfig for the labels")
    parser.set_defaults(handler=run)


def config_from_args(args: argparse.Namespace) -> app.Config:
    """Settings from flags; raises UsageError naming the bad flag and the allowed values."""
    strategy = _choice(allocate.Strategy, args.device_list_strategy, "--device-list-strategy")
    mig = _choice(inventory.MigStrategy, args.mig_strategy, "--mig-strategy")
    sharing = _choice(app.SharingStrategy, args.sharing_strategy, "--sharing-strategy")
    return app.Config(
        resource_name=args.resource_name,
        plugin_dir=Path(args.device_plugin_dir),
        strategy=strategy,
        cdi_root=Path(args.cdi_root),
        cdi_kind=args.cdi_kind,
        replicas=args.replicas,
        mig_strategy=mig,
        fake_node=cdi.FAKE_NODE if (args.fake or args.fake_file) else None,
        sharing=sharing,
        mps_dir=Path(args.mps_dir),
        driver_root=Path(args.driver_root),
    )


def _check_plugin_dir(path: Path) -> None:
    """The kubelet makes its device-plugin directory when it starts; without it there is no
    kubelet to register with, and creating host directories is not ours to do."""
    if not path.is_dir():
        raise common.UsageError(
            f"--device-plugin-dir {path} is not a directory: the kubelet creates it when it "
            "starts (is one running on this node?); point --device-plugin-dir at the kubelet's"
        )


def _choice(enum_type: type[_E], value: str, flag: str) -> _E:
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(e.value for e in enum_type)
        raise common.UsageError(f"{flag} {value!r} is not one of: {allowed}") from None


def run(args: argparse.Namespace) -> int:
    registry = metrics.new()
    readiness = health_server.Readiness(conditions=health_server.DEVICE_PLUGIN_CONDITIONS)
    board = health.HealthBoard()
    try:
        config = config_from_args(args)
        policy = healthflags.policy_from(args)
        source = common.make_backend(args)
        try:
            devices = source.discover()
        except backend.DiscoveryError:
            registry.nvml_error("discover")
            raise
        _check_plugin_dir(config.plugin_dir)  # after the user's own input (flags, profile)
        plugin = app.DevicePluginApp(
            config=config,
            devices=devices,
            health_source=board,
            mig_minors=None if (args.fake or args.fake_file) else preparable.read_mig_minors(),
            readiness=readiness,
        )
    except (
        common.UsageError,
        backend.DiscoveryError,
        inventory.InventoryError,
        cdi.CdiError,
        registrar.RegistrationError,
    ) as exc:
        return common.fail(str(exc))
    try:
        node_labels = start_node_labels(args, config=config, devices=devices, source=board)
    except (common.UsageError, labels_compute.LabelError) as exc:
        return common.fail(str(exc))
    http = health_server.from_args(args, registry=registry.registry, readiness=readiness)
    try:
        http.start()
    except health_server.HealthServerError as exc:
        if node_labels is not None:
            node_labels.stop()
        return common.fail(str(exc), code=1)
    watching = nodehealth.start(
        policy=policy,
        nvml_api=getattr(source, "nvml_api", None),
        devices=devices,
        published={d.unit.uuid for r in plugin.resources for d in r.devices},
        board=board,
        log=logs.get("deviceplugin.health"),
        metrics=registry,
        socket=healthcontrol.device_plugin_socket(config.plugin_dir),
    )
    watch = dplifecycle.start(
        plugin,
        source=source,
        devices=devices,
        board=board,
        node_health=watching,
        readiness=readiness,
        metrics=registry,
        mig_minors=None if (args.fake or args.fake_file) else preparable.read_mig_minors(),
        health_enabled=policy.enabled,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        _log.info("shutting down", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        fatal = plugin.run(stop)
    except (cdi.CdiError, registrar.RegistrationError) as exc:
        return common.fail(str(exc), code=1)
    finally:
        if watch is not None:
            watch.stop()
        watching.stop()
        board.close()
        http.stop()
        if node_labels is not None:
            node_labels.stop()
    if fatal is not None:
        return common.fail(str(fatal), code=1)
    return 0


class _Labels:
    """The running labeler and the API client it owns (closed together)."""

    def __init__(self, running: nodelabels.Running, api: client.KubeClient) -> None:
        self.running, self.api = running, api

    def stop(self) -> None:
        self.running.stop()
        self.api.close()


def start_node_labels(
    args: argparse.Namespace,
    *,
    config: app.Config,
    devices: model.NodeDevices,
    source: health.HealthBoard,
) -> _Labels | None:
    """Keep the Node's GPU labels when ``--node-labels`` is on and ``--node-name`` is given."""
    if not args.node_labels:
        _log.info("not labelling the Node (disabled)")
        return None
    if not args.node_name:
        _log.info("not labelling the Node: no --node-name (env NODE_NAME)")
        return None
    settings = labels_compute.Settings(
        mig_strategy=config.mig_strategy.value, replicas=config.replicas
    )
    from dra_driver.kube import client

    try:
        api = client.KubeClient.connect(args.kubeconfig, context=args.context)
    except client.ConfigError as exc:
        raise common.UsageError(f"node labels need API access: {exc}") from exc
    running = nodelabels.start(
        kube=api,
        node_name=args.node_name,
        devices=devices,
        settings=settings,
        source=source,
        log=_log.bind(component="node-labels", node=args.node_name),
        resync_s=args.node_labels_resync,
    )
    return _Labels(running, api)
