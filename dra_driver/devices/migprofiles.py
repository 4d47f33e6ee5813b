"""Dynamic MIG over the device model: which GPUs are dynamic, and the placements they offer.

Why it exists: publishing (one device per profile placement, counters), preparing (create the
instance at the allocated placement) and recovery must agree on the same facts — which GPUs the
operator handed to dynamic MIG (``--dynamic-mig none|all|<product regex>``), the placements of
each, their names (the names existing MIG devices get, :func:`model.mig_placement_name`), and
the memory and compute slices of a GPU. This module is those facts and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable

from dra_driver import records
from dra_driver.devices import gpuselect, model

NONE = gpuselect.NONE
ALL = gpuselect.ALL
AUTO_PREFIX = gpuselect.AUTO_PREFIX  # on where the API server keeps the fields, else off


class SelectorError(ValueError):
    """A ``--dynamic-mig`` value that is neither none, all nor a valid regular expression
    (alone or after ``auto:``)."""


@records.record
class DynamicMig:
    """Which MIG-capable GPUs are dynamic: ``none``, ``all`` or a product-name regex.
    ``auto`` (written ``auto:<all|regex>``): only where the API server keeps shared counters;
    where it drops them the selection is off instead of refused
    (:func:`dra_driver.slices.serverfeatures.resolve`)."""

    spec: str = NONE
    auto: bool = False

    @classmethod
    def parse(cls, text: str | None) -> DynamicMig:
        """The grammar the publishing flags share (:mod:`dra_driver.devices.gpuselect`)."""
        try:
            chosen = gpuselect.GpuSelection.parse(
                text, flag="--dynamic-mig", needs="shared counters"
            )
        except gpuselect.SelectionError as exc:
            raise SelectorError(str(exc)) from None
        return cls(chosen.spec, auto=chosen.auto)

    @property
    def text(self) -> str:
        """As the flag is written (``auto:all``, ``H100``); parses back to the same value."""
        return f"{AUTO_PREFIX}{self.spec}" if self.auto else self.spec

    @property
    def enabled(self) -> bool:
        return self.spec != NONE

    def wants(self, gpu: model.Gpu) -> bool:
        """Whether the operator asked for ``gpu`` (MIG-capable or not)."""
        return gpuselect.GpuSelection(self.spec, auto=self.auto).wants(gpu)

    def selects(self, gpu: model.Gpu) -> bool:
        """Whether ``gpu`` is dynamic: asked for, and NVML listed profiles with placements."""
        return self.wants(gpu) and capable(gpu)

    def dynamic_gpus(self, gpus: Iterable[model.Gpu]) -> list[model.Gpu]:
        return [g for g in gpus if self.selects(g)]


STATIC = DynamicMig()  # the default: no GPU is dynamic


def capable(gpu: model.Gpu) -> bool:
    return any(p.placements for p in gpu.mig_profiles)


@records.record
class Placement:
    """One profile at one place on one GPU: what a dynamic MIG device stands for."""

    gpu: model.Gpu
    profile: model.MigProfile
    start: int
    size: int

    @property
    def name(self) -> str:
        return model.mig_placement_name(self.gpu.minor, self.profile.name, self.start)

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.size)


def placements(gpu: model.Gpu) -> list[Placement]:
    """Every placement of every profile, in NVML's profile order, then by start."""
    return [
        Placement(gpu=gpu, profile=profile, start=start, size=size)
        for profile in sorted(gpu.mig_profiles, key=lambda p: p.slot)
        for start, size in profile.placements
    ]


def memory_slices(gpu: model.Gpu) -> int:
    """Memory slices of the GPU (8 on A100 and H100): the end of the furthest placement."""
    return max((s + n for p in gpu.mig_profiles for s, n in p.placements), default=0)


def compute_slices(gpu: model.Gpu) -> int:
    """Compute slices of the GPU (7 on A100 and H100): those of its largest profile."""
    return max((p.slices for p in gpu.mig_profiles if p.placements), default=0)


def whole(gpu: model.Gpu) -> model.MigProfile | None:
    """The profile spanning the whole GPU (its totals are the GPU's engines and memory)."""
    spanning = [
        p for p in gpu.mig_profiles if any(n == memory_slices(gpu) for _, n in p.placements)
    ]
    return max(spanning, key=lambda p: (p.slices, p.memory_bytes), default=None)


def health_keys(
    devices: model.NodeDevices, dynamic: DynamicMig, keys: dict[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """``keys`` (published device → UUIDs whose failure makes it unhealthy) with dynamic GPUs'
    placements: each follows its GPU (an instance lives and dies with it); existing MIG devices
    of a dynamic GPU go by their placement's name, so they are replaced."""
    out = dict(keys)
    for gpu in dynamic.dynamic_gpus(devices.gpus):
        for mig in gpu.mig_devices:
            out.pop(model.mig_device_name(gpu, mig), None)
        out.update({p.name: (gpu.uuid,) for p in placements(gpu)})
    return out
