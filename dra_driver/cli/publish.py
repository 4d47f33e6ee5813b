"""``dra-driver publish``: run the ResourceSlice publisher on its own.

The node agent (``kubelet-plugin``) publishes slices itself; this command runs only that part,
for clusters that want slices without the kubelet plugin (scheduling experiments, simulators),
for debugging, and as a one-shot (``--once``) in scripts. It discovers the GPUs, builds the
desired slices, reconciles them through the real API client (kubeconfig, or in-cluster
credentials when none is given), and keeps them right until SIGTERM: rediscovering the hardware
periodically, recreating deleted slices, retrying API failures with backoff. Like the agent it
first asks the server which ResourceSlice fields it keeps (:mod:`dra_driver.kube.features`):
``--dynamic-mig`` or ``--shareable`` selecting GPUs on a server that drops their fields is
refused (an ``auto:`` selection is off instead), and a re-probe after an outage adapts what is
published.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from types import FrameType

from dra_driver import cli, logs
from dra_driver.cli import common
from dra_driver.cli import slices as slices_cli
from dra_driver.devices import backend
from dra_driver.kube import client, features
from dra_driver.slices import build, publisher, serverfeatures


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from dra_driver.cli import env_default

    parser = sub.add_parser("publish", help=cli.SUMMARIES["publish"])
    slices_cli.add_identity_flags(parser)
    common.add_backend_flags(parser)
    common.add_shareable_flag(parser)
    common.add_dynamic_mig_flag(parser)
    common.add_gpu_sets_flag(parser)
    common.add_kubeconfig(parser)
    parser.add_argument(
        "--once",
        action="store_true",
        help="reconcile once (retrying failures until --timeout) and exit",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="with --once: give up after this many seconds (default 60)",
    )
    parser.add_argument(
        "--rediscover-interval",
        type=float,
        default=float(env_default("REDISCOVER_INTERVAL", "60") or 60),
        help="seconds between hardware re-discoveries (env REDISCOVER_INTERVAL; default 60)",
    )
    parser.add_argument(
        "--resync-interval",
        type=float,
        default=float(env_default("RESYNC_INTERVAL", "600") or 600),
        help="seconds between full re-lists even without events (env RESYNC_INTERVAL)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        return common.fail("--node-name (or env NODE_NAME) is required")
    try:
        source = common.make_backend(args)
        _desired(source, args)  # bad flags or names fail before the server is asked
        kube = client.KubeClient.connect(args.kubeconfig, context=args.context)
    except (common.UsageError, backend.DiscoveryError, build.BuildError) as exc:
        return common.fail(str(exc))
    except client.ConfigError as exc:
        return common.fail(str(exc))
    try:
        found = serverfeatures.ServerFeatures(
            probe=lambda: features.probe(kube, args.node_name, args.driver_name),
            log=logs.get("publish").bind(component="features"),
            gpu_sets=common.gpu_sets_from(args),
            auto=serverfeatures.auto_flags(
                dynamic_mig=common.dynamic_mig(args), shareable=common.shareable_from(args)
            ),
        )
        refused = serverfeatures.refusal(
            found.start(),
            gpus=source.discover().gpus,
            dynamic_mig=common.dynamic_mig(args),
            shareable=common.shareable_from(args),
            server=kube.server,
        )
        if refused:
            return common.fail(refused, code=1)
        # As the agent does: an auto: dynamic MIG selection the server cannot take is off for
        # this run; GPU shares follow what re-probes find (serverfeatures.publishable).
        dynamic, _ = serverfeatures.resolve(
            found.kept, dynamic_mig=common.dynamic_mig(args), shareable=common.shareable_from(args)
        )
        args.dynamic_mig = dynamic.text
        desired = _desired(source, args, found.kept)
        pub = publisher.Publisher(
            kube=kube,
            driver_name=args.driver_name,
            node_name=args.node_name,
            resync_s=args.resync_interval,
            on_reconnect=found.reconnected,
            on_dropped=found.fields_dropped,
        )
        pub.set_desired(desired)
        found.subscribe(lambda kept: pub.set_desired(_desired(source, args, kept)))
        if args.once:
            return _once(pub, args.timeout)
        return _forever(pub, source, args, desired, found)
    except (backend.DiscoveryError, build.BuildError) as exc:
        return common.fail(str(exc))
    finally:
        kube.close()


def _desired(
    source: backend.Backend,
    args: argparse.Namespace,
    kept: serverfeatures.Kept = serverfeatures.ALL_KEPT,
) -> list[build.Obj]:
    devices, dynamic, shareable = serverfeatures.publishable(
        kept,
        source.discover(),
        dynamic_mig=common.dynamic_mig(args),
        shareable=common.shareable_from(args),
    )
    result = build.build(
        devices,
        node_name=args.node_name,
        driver_name=args.driver_name,
        shareable=shareable,
        dynamic_mig=dynamic,
        gpu_sets=common.gpu_sets_from(args),
        decorate=serverfeatures.withdrawer(kept),
    )
    log = logs.get("publish")
    for problem in result.problems:
        log.warning("device left out", problem=problem)
    return result.slices


def _once(pub: publisher.Publisher, timeout_s: float) -> int:
    log = logs.get("publish")
    backoff = publisher.Backoff(max_s=10.0)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            outcome = pub.reconcile_once()
        except publisher.PublishError as exc:
            delay = backoff.next_delay()
            if time.monotonic() + delay > deadline:
                return common.fail(f"giving up after {timeout_s:g}s: {exc}", code=1)
            log.warning("publishing failed; retrying", error=str(exc), retry_in_s=round(delay, 3))
            time.sleep(delay)
            continue
        if outcome.rejected:
            return common.fail(f"ResourceSlices failed validation: {outcome.rejected}", code=1)
        log.info(
            "ResourceSlices published",
            created=outcome.created,
            updated=outcome.updated,
            deleted=outcome.deleted,
            generation=outcome.generation,
        )
        return 0


def _forever(
    pub: publisher.Publisher,
    source: backend.Backend,
    args: argparse.Namespace,
    desired: list[build.Obj],
    found: serverfeatures.ServerFeatures,
) -> int:
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    log = logs.get("publish")
    pub.start()
    log.info("publishing ResourceSlices", node=args.node_name, driver=args.driver_name)
    while not stop.wait(args.rediscover_interval):
        try:
            fresh = _desired(source, args, found.kept)
        except (backend.DiscoveryError, build.BuildError) as exc:
            log.error("re-discovery failed; keeping the published slices", error=str(exc))
            continue
        if fresh != desired:  # hardware changed: hand over the new desired set
            desired = fresh
            pub.set_desired(desired)
    pub.stop()
    log.info("publisher stopped")
    return 0
