"""The plain results the driver core hands to the kubelet adapter (no protobuf here).

They mirror the kubelet DRA API's per-claim answer: the devices of a prepared claim with the
request names they serve, their pool and name, and the CDI device IDs the runtime will resolve;
or an error string for that claim alone.
"""

from __future__ import annotations

from dra_driver import records


@records.record
class PreparedDevice:
    request_names: tuple[str, ...]  # main request names only (no "/subrequest")
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@records.record
class PrepareResult:
    """One claim's answer: ``error`` non-empty means it failed and ``devices`` is empty."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
