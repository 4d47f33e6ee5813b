"""The kubelet stand-in from a shell: ``python -m dra_driver.testing.kubeletcli``.

Why it exists: :mod:`dra_driver.testing.kubeletsim` drives a node agent's real unix sockets as
the kubelet does, for the demo and the tests; ``dra-driver dev-cluster`` runs agents that a
developer wants to poke by hand. ``info`` registers with an agent as the kubelet's plugin
watcher does (``GetInfo``, then ``NotifyRegistrationStatus``) and prints what it advertises;
``prepare`` and ``unprepare`` call ``NodePrepareResources`` / ``NodeUnprepareResources`` for a
ResourceClaim already allocated in the API server (its UID given, as the kubelet knows it) and
print the CDI devices or the error. Test kit, not a kubelet.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc

from dra_driver.driver import claims
from dra_driver.testing import kubeletsim


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_driver.testing.kubeletcli")
    parser.add_argument(
        "--registry-dir",
        type=Path,
        required=True,
        help="the kubelet's plugin registry directory the agent registers in",
    )
    parser.add_argument("--driver-name", default="gpu.nvidia.com")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="register the agent and print what it advertises")
    for name in ("prepare", "unprepare"):
        one = sub.add_parser(name, help=f"Node{name.capitalize()}Resources for one claim")
        one.add_argument("claim", metavar="NAMESPACE/NAME")
        one.add_argument("--uid", required=True, help="the ResourceClaim's metadata.uid")
    args = parser.parse_args(argv)
    kubelet = kubeletsim.KubeletSim(args.registry_dir)
    try:
        info = kubelet.register(args.driver_name, timeout_s=5.0)
        if args.command == "info":
            print(f"plugin {info.name}: endpoint {info.endpoint}")
            print(f"versions: {', '.join(info.supported_versions)} (using {kubelet.version})")
            return 0
        namespace, _, name = args.claim.partition("/")
        if not namespace or not name:
            parser.error(f"{args.claim!r}: NAMESPACE/NAME expected")
        ref = claims.ClaimRef(namespace=namespace, name=name, uid=args.uid)
        call = kubelet.prepare if args.command == "prepare" else kubelet.unprepare
        answer = call([ref]).claims[ref.uid]
    except (TimeoutError, kubeletsim.RegistrationRefused, grpc.RpcError) as exc:
        print(f"kubeletcli: error: {exc}", file=sys.stderr)
        return 2
    finally:
        kubelet.close()
    if answer.error:
        print(f"kubeletcli: {args.command} {args.claim}: {answer.error}", file=sys.stderr)
        return 1
    for device in getattr(answer, "devices", ()):
        print(f"{device.device_name}: CDI {', '.join(device.cdi_device_ids)}")
    print(f"{args.command}d {args.claim}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
