"""Flags and helpers several subcommands share: choosing the discovery backend, output."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dra_driver import inputfile
from dra_driver.devices import backend, gpuselect, migprofiles, passthrough
from dra_driver.slices import shares

# The fake backend (its NVML stand-in, the profiles) is imported where a flag needs it: the
# subcommands that never discover GPUs (capacity, doctor) do not pay for it at start-up.

AUTO = "auto"


class UsageError(Exception):
    """Bad flags or input files; printed as one line, exit code 2."""


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    """``--fake PROFILE`` / ``--fake-file FILE``; neither = real NVML."""
    from dra_driver.cli import env_default

    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--fake",
        metavar="PROFILE",
        default=env_default("FAKE_PROFILE"),
        help=f"use a built-in fake GPU profile ({', '.join(backend.builtin_fake_profiles())}); "
        "env FAKE_PROFILE",
    )
    group.add_argument(
        "--fake-file",
        metavar="FILE",
        type=inputfile.path,
        default=env_default("FAKE_PROFILE_FILE"),
        help="use a fake GPU profile from a YAML file (docs/profiles.md); env FAKE_PROFILE_FILE",
    )


KUBECONFIG_HELP = (
    "kubeconfig file; default as kubectl: the files in KUBECONFIG (a :-separated list, merged), "
    "else ~/.kube/config, else the in-cluster service account"
)


def add_kubeconfig(parser: argparse.ArgumentParser, *, what: str = "") -> None:
    """``--kubeconfig`` and ``--context`` of the subcommands that talk to the API server, with
    kubectl's defaults (:mod:`dra_driver.kube.configfiles`: ``KUBECONFIG``, ``~/.kube/config``,
    in-cluster); ``what`` starts the help (e.g. "kubeconfig for the labels")."""
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help=(what + "; " if what else "") + KUBECONFIG_HELP,
    )
    parser.add_argument(
        "--context",
        default=None,
        help="the kubeconfig context to use (default: its current-context)",
    )


def add_namespace(parser: argparse.ArgumentParser, *, env: str, help: str) -> None:
    """``--namespace/-n`` (env twin ``env``): unset, the kubeconfig context's namespace (else
    the pod's own, in-cluster), as kubectl takes it: :func:`namespace_from`."""
    from dra_driver.cli import env_default

    parser.add_argument("--namespace", "-n", default=env_default(env), help=help)


def namespace_from(args: argparse.Namespace) -> str | None:
    """``--namespace`` (or its env twin), else the context's namespace, else the pod's."""
    if args.namespace:
        return str(args.namespace)
    from dra_driver.kube import clientconfig

    try:
        return clientconfig.namespace(args.kubeconfig, args.context)
    except clientconfig.ConfigError:
        return None  # connecting says what is wrong with the kubeconfig


def add_shareable_flag(parser: argparse.ArgumentParser) -> None:
    """``--shareable none|all|<product regex>`` (env SHAREABLE): GPUs shared by consumable
    capacity (docs/sharing.md)."""
    from dra_driver.cli import env_default

    parser.add_argument(
        "--shareable",
        metavar="none|all|REGEX|auto:SEL",
        default=env_default("SHAREABLE", "none"),
        help="publish these GPUs as shareable (memory and compute shares enforced with MPS): "
        "none, all, or a regular expression searched in the product name, e.g. H100; "
        "auto:all or auto:REGEX only where the API server keeps consumable capacity "
        "(env SHAREABLE; default none)",
    )


def shareable_from(args: argparse.Namespace) -> shares.Shareable:
    try:
        return shares.Shareable.parse(args.shareable)
    except shares.ShareableError as exc:
        raise UsageError(str(exc)) from None


def add_dynamic_mig_flag(parser: argparse.ArgumentParser) -> None:
    """``--dynamic-mig none|all|REGEX`` (env ``DYNAMIC_MIG``): which MIG-capable GPUs are
    published as partitionable devices whose MIG instances are made at prepare time."""
    from dra_driver.cli import env_default

    parser.add_argument(
        "--dynamic-mig",
        metavar="none|all|REGEX|auto:SEL",
        default=env_default("DYNAMIC_MIG", migprofiles.NONE),
        help="MIG-capable GPUs to publish as dynamic MIG (every profile placement, instances "
        "created at prepare): none, all, or a regular expression over the product name; "
        "auto:all or auto:REGEX only where the API server keeps shared counters "
        "(env DYNAMIC_MIG; default none; docs/mig.md)",
    )


def add_gpu_sets_flag(parser: argparse.ArgumentParser) -> None:
    """``--gpu-sets true|false|auto`` (env ``GPU_SETS``): mark every GPU with its set ranks
    (the ``setRanks`` attribute, docs/topology.md) for the topology-best claims of ``dra-driver
    claim``. Plain int attributes, which every API server keeps: ``auto`` (the default) is on;
    false publishes plain GPUs only."""
    from dra_driver.cli import env_default

    parser.add_argument(
        "--gpu-sets",
        type=parse_gpu_sets,
        nargs="?",
        const="true",
        default=env_default("GPU_SETS", "auto"),
        metavar="true|false|auto",
        help="mark each GPU with its rank among the best free sets of N GPUs (setRanks "
        "attribute) for the topology-best claims of `dra-driver claim`; plain attributes "
        "every API server keeps, so auto means on; false publishes plain GPUs "
        "(env GPU_SETS; default auto; docs/topology.md)",
    )


def parse_gpu_sets(value: str) -> bool | str:
    """``auto``, or a boolean as :func:`~dra_driver.cli.labelflags.parse_bool` reads it."""
    from dra_driver.cli import labelflags

    if value.strip().lower() == AUTO:
        return AUTO
    return labelflags.parse_bool(value)


def gpu_sets_from(args: argparse.Namespace) -> bool:
    """Whether set ranks are published: ``auto`` is on (no feature gate can drop them)."""
    value = args.gpu_sets
    if isinstance(value, str):  # the default comes unparsed from the environment
        value = parse_gpu_sets(value)
    return value is True or value == AUTO


def dynamic_mig(args: argparse.Namespace) -> migprofiles.DynamicMig:
    try:
        return migprofiles.DynamicMig.parse(args.dynamic_mig)
    except migprofiles.SelectorError as exc:
        raise UsageError(str(exc)) from exc


def add_passthrough_flag(parser: argparse.ArgumentParser) -> None:
    """``--passthrough none|all|REGEX|auto:SEL`` (env ``PASSTHROUGH``): GPUs offered for VFIO
    passthrough to VMs as well (docs/passthrough.md)."""
    from dra_driver.cli import env_default

    parser.add_argument(
        "--passthrough",
        metavar="none|all|REGEX|auto:SEL",
        default=env_default("PASSTHROUGH", "none"),
        help="GPUs to offer for VFIO passthrough to VMs as well (each also published as "
        "gpu-vfio-<minor>, DeviceClass vfio.gpu.nvidia.com; the scheduler picks per claim): "
        "none, all, or a regular expression over the product name; auto:all or auto:REGEX only "
        "where the API server keeps shared counters (env PASSTHROUGH; default none; "
        "docs/passthrough.md)",
    )


def passthrough_from(args: argparse.Namespace) -> passthrough.Passthrough:
    try:
        return passthrough.Passthrough.parse(getattr(args, "passthrough", "none"))
    except gpuselect.SelectionError as exc:
        raise UsageError(str(exc)) from None


def make_backend(args: argparse.Namespace) -> backend.Backend:
    """The backend the flags ask for. Raises UsageError / DiscoveryError with clear messages."""
    from dra_driver.devices import fake
    from dra_driver.devices.fake import profiles

    try:
        if args.fake_file:
            return fake.FakeBackend.from_file(Path(args.fake_file))
        if args.fake:
            return fake.FakeBackend.from_name(args.fake)
    except profiles.ProfileError as exc:
        raise UsageError(str(exc)) from exc
    from dra_driver.devices import nvml

    return nvml.PynvmlBackend.create()


def fail(message: str, code: int = 2) -> int:
    """Print one clear error line for the operator and return the exit code (a message of
    several lines, a YAML parser's with its excerpt, is joined into one)."""
    text = "; ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"dra-driver: error: {text}", file=sys.stderr)
    return code
