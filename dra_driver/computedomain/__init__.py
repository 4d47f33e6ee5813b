"""ComputeDomains: multi-node NVLink (IMEX) for workloads that span the nodes of one NVL rack.

Why it exists: on GB200/GB300 NVL racks the GPUs of many nodes share one NVLink fabric, and a
job reaches its peers' GPU memory only through IMEX channels, which need an IMEX daemon per node
configured with its peers and a channel device in each workload container. NVIDIA's DRA driver
serves this with the ``ComputeDomain`` API (``resource.nvidia.com/v1beta1``); this package
serves the same API so users' manifests apply unchanged:

- :mod:`.api` — the CRD (our own schema, written from NVIDIA's documented fields), its
  validation and a typed view of a ComputeDomain;
- :mod:`.controller` (with :mod:`.controlloop`, :mod:`.leader` and :mod:`.manifests`) —
  ``dra-driver controller``: per domain the workload ResourceClaimTemplate and the IMEX daemon
  DaemonSet, the domain's overall status, and the clean-up when it goes;
- the node side, a second DRA driver ``compute-domain.nvidia.com`` in the node agent:
  :mod:`.nodedriver` (prepare / unprepare), :mod:`.membership` (the node's status entry and
  label), :mod:`.nodestate` (its checkpoint), :mod:`.cdspecs` (CDI), :mod:`.imexconfig` (the IMEX
  daemon's files), :mod:`.monitor` (nodes config and readiness), :mod:`.cdslices` (the channel
  and daemon devices), :mod:`.settings` (its settings; the wiring into the node agent is
  :mod:`dra_driver.cdagent`, a composition root above this package);
- :mod:`.imexdaemon` — what the daemon pods run on real nodes (``dra-driver imex-daemon``):
  NVIDIA's ``nvidia-imex`` supervised, its readiness from ``nvidia-imex-ctl -q``.

The names below are NVIDIA's, so claims and DeviceClasses written for their driver select ours.
"""

from __future__ import annotations

DRIVER_NAME = "compute-domain.nvidia.com"
GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
# The node label that binds a node to a domain (value: the domain's UID); the domain's IMEX
# daemon DaemonSet selects it.
NODE_LABEL = "resource.nvidia.com/computeDomain"
# The controller's finalizer on a ComputeDomain: what garbage collection cannot remove (the
# DaemonSet and daemon claim template live in the driver's namespace) is removed first.
FINALIZER = "resource.nvidia.com/computeDomain"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS = "compute-domain-daemon.nvidia.com"
CHANNEL_CONFIG_KIND = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND = "ComputeDomainDaemonConfig"
# Where a channel appears in a container, and the /proc/devices name of its major number.
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
CHANNEL_DEVICE_NAME = "nvidia-caps-imex-channels"
# "All" allocation mode: every channel an IMEX domain can have.
MAX_CHANNELS = 2048
# Where the IMEX daemon container sees its domain's directory (config, nodes config, status).
DAEMON_DIR = "/imexd"
DEFAULT_IMEX_PORT = 50000


def channel_path(channel: int) -> str:
    return f"{CHANNEL_DIR}/channel{channel}"
