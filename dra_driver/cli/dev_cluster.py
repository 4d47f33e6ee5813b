"""``dra-driver dev-cluster``: try the cluster commands without a cluster.

Starts the test kit's in-memory API server over HTTPS with ``--nodes`` fake GPU nodes, each
running the real node agent as its own process (:mod:`dra_driver.testing.devcluster`), writes a
kubeconfig for it, prints how to use it (kubectl, ``doctor``, ``capacity``, ``simulate
--slices``, the kubelet stand-in), allocates the ResourceClaims created in it (a scheduler
stand-in), and runs until Ctrl-C or SIGTERM, then stops the agents and the server and removes
what it made. A development stand-in, not Kubernetes, and it says so.
Exit codes: 0 stopped by a signal; 1 an agent died while it ran; 2 it cannot start.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from dra_driver import cli, inputfile
from dra_driver.cli import common
from dra_driver.devices.fake import profiles

if TYPE_CHECKING:
    from dra_driver.testing.devcluster import DevCluster

DEFAULT_PROFILE = "dgx-h100"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "dev-cluster",
        help=cli.SUMMARIES["dev-cluster"],
        description="A development stand-in, not Kubernetes: the test kit's in-memory API "
        "server over HTTPS (no kubelet or controllers, a scheduler stand-in for ResourceClaims "
        "only; nothing persisted) with N "
        "fake GPU nodes, each running the real node agent. It writes a kubeconfig, prints how "
        "to use it, and runs until Ctrl-C or SIGTERM. Exit codes: 0 stopped by a signal; 1 an "
        "agent died while it ran; 2 it cannot start.",
    )
    parser.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--fake",
        metavar="PROFILE",
        default=DEFAULT_PROFILE,
        help=f"the nodes' fake GPU profile (default {DEFAULT_PROFILE}; one of "
        f"{', '.join(profiles.builtin_names())})",
    )
    group.add_argument(
        "--fake-file",
        metavar="FILE",
        type=inputfile.path,
        help="a fake GPU profile file (docs/profiles.md)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="work in DIR and keep it (agents' sockets, CDI specs, logs); default: a temporary "
        "directory, removed at the end",
    )
    parser.add_argument(
        "--write-kubeconfig",
        metavar="FILE",
        type=Path,
        default=None,
        help="write the kubeconfig here (default: DIR/kubeconfig)",
    )
    parser.add_argument(
        "--port", type=int, default=0, help="the API server's port on 127.0.0.1 (default: any)"
    )
    parser.add_argument("--node-prefix", default="node", help="node names: PREFIX-0, PREFIX-1, ...")
    parser.add_argument(
        "--driver-name", default="gpu.nvidia.com", help="DRA driver name (default gpu.nvidia.com)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dra_driver.devices import fake
    from dra_driver.testing import devcluster

    if args.nodes < 1:
        return common.fail(f"--nodes {args.nodes}: at least one node")
    try:  # a bad profile is a usage error before anything starts
        if args.fake_file:
            fake.FakeBackend.from_file(args.fake_file)
        else:
            fake.FakeBackend.from_name(args.fake)
    except profiles.ProfileError as exc:
        return common.fail(str(exc))
    cluster = devcluster.DevCluster(
        nodes=args.nodes,
        fake=None if args.fake_file else args.fake,
        fake_file=args.fake_file.resolve() if args.fake_file else None,
        directory=args.dir.resolve() if args.dir else None,
        kubeconfig=args.write_kubeconfig.resolve() if args.write_kubeconfig else None,
        driver_name=args.driver_name,
        prefix=args.node_prefix,
        port=args.port,
    )
    stop = threading.Event()
    started = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not started:
            raise KeyboardInterrupt  # while starting: unwind, stopping what was started
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(
            f"dra-driver dev-cluster: starting {args.nodes} fake node(s), a development "
            "stand-in ...",
            file=sys.stderr,
            flush=True,
        )
        try:
            cluster.start()
        except devcluster.DevClusterError as exc:
            return common.fail(str(exc))
        except KeyboardInterrupt:
            print("dra-driver dev-cluster: interrupted while starting; stopped", file=sys.stderr)
            return 130
        started = True
        describe(cluster, args, sys.stdout)
        while not stop.wait(0.5):
            for line in cluster.schedule():
                print(f"dra-driver dev-cluster: {line}", file=sys.stderr, flush=True)
            dead = cluster.dead()
            if dead:
                names = ", ".join(f"{name} (exit code {code})" for name, code in dead)
                cluster.stop()
                return common.fail(f"the agent of {names} died; stopped the rest", code=1)
        codes = cluster.stop()
        bad = {name: code for name, code in codes.items() if code != 0}
        if bad:
            listed = ", ".join(f"{n}: {c}" for n, c in bad.items())
            return common.fail(f"agents stopped with exit codes {listed}", code=1)
        print(
            f"dra-driver dev-cluster: stopped {len(codes)} agent(s) and the API server"
            + ("" if args.dir else f"; removed {cluster.directory}"),
            file=sys.stderr,
        )
        return 0
    finally:
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def describe(cluster: DevCluster, args: argparse.Namespace, out: TextIO) -> None:
    """What is running and how to use it (stdout)."""
    from dra_driver.testing import devcluster

    slices = cluster.slices()
    profile = args.fake_file or args.fake
    kubeconfig = cluster.kubeconfig
    first = cluster.nodes[0]
    lines = [
        "A DEVELOPMENT STAND-IN, not a Kubernetes cluster: the test kit's in-memory API server",
        "(no kubelet, no controllers, a scheduler stand-in for ResourceClaims only; nothing",
        "persisted), with fake GPU nodes each running the real node agent.",
        "",
        f"API server:  {cluster.url} (TLS with client certificates)",
        f"kubeconfig:  {kubeconfig}",
        f"nodes:       {len(cluster.nodes)} x {profile}: {devcluster.gpus_of(slices)} devices "
        f"in {len(slices)} ResourceSlice(s)",
    ]
    for node in cluster.nodes:
        proc = node.agent.proc
        lines.append(
            f"  {node.name}: agent pid {proc.pid if proc else '?'}, DRA socket "
            f"{node.dra_socket}, log {node.agent.log_path}"
        )
    lines += [
        "",
        "Try, in another shell:",
        f"  export KUBECONFIG={kubeconfig}",
        "  kubectl get resourceslices",
        "  dra-driver doctor",
        "  dra-driver capacity --by-node",
        "  kubectl get resourceslices -o yaml > slices.yaml",
        "  dra-driver simulate deployments/examples/two-best-gpus.yaml --slices slices.yaml "
        f"--node-name {first.name}",
        "  # a claim: the scheduler stand-in here allocates it and prints how to prepare it",
        "  dra-driver claim --gpus 2 | kubectl create --validate=false -f -",
        "  # the kubelet stand-in (dra_driver/testing/kubeletsim.py) on an agent's sockets:",
        f"  python -m dra_driver.testing.kubeletcli --registry-dir {first.agent.registry_dir} info",
        "",
        "Ctrl-C (or SIGTERM) stops the agents and the server"
        + ("." if args.dir else f", and removes {cluster.directory}."),
    ]
    print("\n".join(lines), file=out, flush=True)
