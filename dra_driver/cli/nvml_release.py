"""``dra-driver nvml-release``: make a running node agent let go of NVML before the NVIDIA kernel
module is unloaded for a driver upgrade (``--resume``: take it again now).

Why it exists: ``nvmlInit`` keeps ``/dev/nvidia*`` open, so ``rmmod nvidia`` fails while the
agent runs; draining the node only to stop the agent is what this avoids (docs/lifecycle.md).
The request goes over the agent's health socket (:mod:`dra_driver.healthcontrol`), like
``fake-event``, with the agent's own directory flags; it is local to the node, no API server
and no RBAC involved, so a driver manager's pre-unload hook or an operator on the node can run
it. The agent answers once its NVML is released (slices tainted, ``/readyz`` not ready), and
resumes by itself when the module is loaded again. Exit codes: 0 done, 1 the agent refused or
cannot be reached, 2 bad flags.
"""

from __future__ import annotations

import argparse

from dra_driver import cli
from dra_driver.cli import agentflags


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "nvml-release",
        help=cli.SUMMARIES["nvml-release"],
        description="Make the node agent release NVML (every nvmlInit it holds) so the NVIDIA "
        "kernel module can be unloaded for a driver upgrade without draining the node; it "
        "resumes when the module is loaded again.",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="initialise NVML again now instead of waiting for the driver to come back",
    )
    agentflags.add(parser, explicit_only=False)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return agentflags.send_each(args, {"op": "nvml-resume" if args.resume else "nvml-release"})
