"""Which GPUs are passed through to VMs right now: the one answer every part of the agent asks.

Why it exists: a GPU bound to ``vfio-pci`` is invisible to NVML — its events stop, its polls
fail, and on a real node NVML does not even list it. Health monitoring, the node labels, the
per-GPU metrics and any later rediscovery (a GPU gone from NVML) must not mistake that for a
lost or broken GPU, and must count it as in use. They consult :class:`PassedThrough` (fed from
:meth:`dra_driver.driver.vfio.VfioPart.passed_through`, which knows from the moment prepare
starts binding until the GPU is back on nvidia) instead of each reasoning about sysfs.

``/metrics`` says so too: ``dra_driver_gpu_passed_through{device,uuid}`` is 1 for a GPU
offered for passthrough while it is on vfio-pci for a claim, 0 otherwise (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from dra_driver.devices import model, passthrough

METRIC = "dra_driver_gpu_passed_through"


class PassedThrough:
    """GPU UUIDs on vfio-pci for a claim, asked of ``source`` each time (never cached)."""

    def __init__(self, source: Callable[[], Iterable[str]] | None = None) -> None:
        self._source = source

    def uuids(self) -> frozenset[str]:
        return frozenset(self._source()) if self._source is not None else frozenset()

    def contains(self, uuid: str) -> bool:
        """Whether the GPU ``uuid`` is passed through now (health checks pause for it)."""
        return uuid in self.uuids()


NOBODY = PassedThrough()


class _Gauge(Collector):
    def __init__(self, passed: PassedThrough, gpus: list[model.Gpu]) -> None:
        self._passed = passed
        self._gpus = gpus

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            METRIC,
            "1 while the GPU is bound to vfio-pci for a VM claim (NVML cannot see it: its health "
            "checks pause), 0 while it is the nvidia driver's",
            labels=["device", "uuid"],
        )
        now = self._passed.uuids()
        for gpu in self._gpus:
            family.add_metric([gpu.name, gpu.uuid], 1.0 if gpu.uuid in now else 0.0)
        yield family


def export(registry: CollectorRegistry, passed: PassedThrough, devices: model.NodeDevices) -> None:
    """Register the gauge for the GPUs offered for passthrough (none offered: no series)."""
    gpus = passthrough.marked(devices)
    if gpus:
        registry.register(_Gauge(passed, gpus))
