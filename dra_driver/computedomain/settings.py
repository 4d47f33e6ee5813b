"""How the node agent serves ComputeDomains (``dra-driver kubelet-plugin --compute-domains``).

Why its own module: :class:`~dra_driver.pluginsettings.PluginSettings` carries one of these
(None: the second driver is off), the CLI fills it (:mod:`dra_driver.cli.cdflags`) and
:mod:`dra_driver.cdagent` reads it; keeping it plain data keeps the settings module
free of the driver's wiring.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver import computedomain as cd
from dra_driver import records


@records.record
class ComputeDomainSettings:
    """``node_ip``: where this node's IMEX daemon listens, reported in the domains' status
    (the host IP: daemon pods use the host network). ``imex_port``: the IMEX daemons' port.
    ``check_interval_s``: how often the nodes config and the daemon's readiness are checked."""

    node_ip: str
    imex_port: int = cd.DEFAULT_IMEX_PORT
    check_interval_s: float = 1.0
    proc_devices: Path = Path("/proc/devices")
