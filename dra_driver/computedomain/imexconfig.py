"""The files an IMEX daemon runs on, one directory per ComputeDomain on each node.

Why it exists: the node agent prepares the domain's daemon claim by writing these files, and the
daemon pod sees the directory at ``/imexd`` (a CDI mount). Three files:

- ``imexd.cfg`` — the daemon's configuration (IMEX's ``KEY=value`` format): its port and where
  its nodes config is;
- ``nodes.cfg`` — IMEX's nodes config: one peer address per line, the domain's nodes *of this
  node's clique* in index order (a daemon can only reach peers on its NVLink fabric). The agent
  rewrites it as nodes join and leave (:mod:`.monitor`);
- ``status.json`` — written by the daemon side: ``{"state": "READY"|"NOT_READY", "time": ...}``.
  The agent reads it to report the node's readiness; a status older than ``STALE_S`` (the
  daemon died or hangs) counts as not ready.

Every write is atomic (temporary file + rename), so a daemon never reads half a file, and a
crash leaves either the old or the new file. Also here: the major number of the IMEX channel
devices, from ``/proc/devices``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from dra_driver import computedomain as cd
from dra_driver.driver import atomicfile

CONFIG = "imexd.cfg"
NODES = "nodes.cfg"
STATUS = "status.json"
READY_STATE = "READY"
STALE_S = 10.0


def write_config(directory: Path, *, port: int, domain: str) -> None:
    """``imexd.cfg`` for the daemon of ``domain`` (its description, for the comment)."""
    directory.mkdir(parents=True, exist_ok=True)
    text = (
        f"# IMEX daemon configuration of {domain}, written by the dra-driver node agent.\n"
        f"SERVER_PORT={port}\n"
        f"IMEX_NODE_CONFIG_FILE={cd.DAEMON_DIR}/{NODES}\n"
        "IMEX_CMD_ENABLED=1\n"
        # In the foreground: the wrapper (``dra-driver imex-daemon``) supervises it as its child
        # (nvidia-imex daemonizes by default).
        "DAEMONIZE=0\n"
        f"IMEX_CMD_PORT={port + 5}\n"
    )
    atomicfile.write_bytes(directory / CONFIG, text.encode(), durable=False)


def read_config(directory: Path) -> dict[str, str]:
    """``imexd.cfg`` as key → value (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in (directory / CONFIG).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def write_nodes(directory: Path, addresses: Sequence[str]) -> bool:
    """Replace ``nodes.cfg`` with ``addresses``; False when it already said that."""
    text = "".join(f"{a}\n" for a in addresses)
    path = directory / NODES
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except FileNotFoundError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    atomicfile.write_bytes(path, text.encode(), durable=False)
    return True


def read_nodes(directory: Path) -> list[str]:
    try:
        text = (directory / NODES).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def write_status(directory: Path, state: str, **detail: object) -> None:
    """The daemon side's report (the stand-in IMEX daemon writes it)."""
    atomicfile.write_json(
        directory / STATUS, {"state": state, "time": time.time(), **detail}, durable=False
    )


def daemon_ready(directory: Path, *, now: float | None = None) -> bool:
    """Whether the daemon reported READY within the last ``STALE_S`` seconds."""
    try:
        status = json.loads((directory / STATUS).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return False
    if not isinstance(status, dict) or status.get("state") != READY_STATE:
        return False
    stamp = status.get("time")
    moment = time.time() if now is None else now
    return isinstance(stamp, int | float) and moment - stamp <= STALE_S


REMOVE_ATTEMPTS = 50


def remove(directory: Path) -> None:
    """Remove a domain's directory, whatever the daemon writes into it meanwhile.

    The daemon writes its status file every interval (a temp file, then a rename): a file made
    after ``rmtree`` listed the directory keeps it from being removed, and the directory, the
    daemon watching it and the nodes config would outlive the claim. So: again until it is gone
    (the daemon writes once per interval; it cannot win every one of these in a row)."""
    for _ in range(REMOVE_ATTEMPTS):
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.lexists(directory):
            return


class NoChannelDevice(Exception):
    """The NVIDIA driver has no IMEX channel device (``/proc/devices`` does not list it)."""


def channel_major(proc_devices: Path) -> int:
    """The character major of ``nvidia-caps-imex-channels`` in ``proc_devices``."""
    try:
        text = proc_devices.read_text(encoding="utf-8")
    except OSError as exc:
        raise NoChannelDevice(f"cannot read {proc_devices}: {exc}") from exc
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_char = stripped == "Character devices:"
            continue
        parts = stripped.split()
        if (
            in_char
            and len(parts) == 2
            and parts[1] == cd.CHANNEL_DEVICE_NAME
            and parts[0].isdigit()
        ):
            return int(parts[0])
    raise NoChannelDevice(
        f"{proc_devices} lists no {cd.CHANNEL_DEVICE_NAME} character device: the NVIDIA kernel "
        "driver on this node has no IMEX channel support (R550 or later is needed)"
    )
