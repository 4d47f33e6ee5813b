"""A node's labels in NVIDIA GPU Feature Discovery's names and formats, from the device model.

Why it exists: clusters pick the kind of GPU for ``limits: nvidia.com/gpu`` pods with node
labels (``nvidia.com/gpu.product In [...]``), and tools (dashboards, node pools) read the same
labels. This is the one place that derives them, as a pure function of the discovered devices,
the sharing and MIG-strategy settings, and device health; both agents and ``dra-driver labels``
use it. The table of labels and where we differ from GFD is ``docs/labels.md``. In short:

* one GPU product per node, like GFD (which labels one product, chosen by Go's random map
  order, when several are present): the product with the most GPUs, whole (non-MIG) GPUs before
  GPUs in MIG mode, then the lowest GPU index; a warning names the others;
* ``*.count`` counts *healthy* devices (GFD counts all), so the labels follow health;
* MIG strategies ``single`` (MIG devices replace ``nvidia.com/gpu.*``; a layout single cannot
  serve gives ``<model>-MIG-INVALID`` with count 0) and ``mixed`` (``nvidia.com/mig-<profile>.*``
  per MIG profile, named like our device plugin's resources);
* time-slicing replicas > 1: ``-SHARED`` product suffix, ``replicas``, ``sharing-strategy``.

Every key is under ``nvidia.com/`` and every value passes the API server's label rules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable

from dra_driver import records
from dra_driver.devices import model
from dra_driver.nodelabels import values

PREFIX = "nvidia.com/"
GPU = "nvidia.com/gpu"
MIG_STRATEGIES = ("none", "single", "mixed")
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


class LabelError(ValueError):
    """The settings cannot describe a node (unknown MIG strategy, replicas out of range)."""


@records.record
class Settings:
    """How the node's GPUs are offered: what GFD reads from the device plugin's config.

    ``replicas`` > 1 is time-slicing; ``mig_strategy`` is the device plugin's (``none`` for the
    DRA agent, whose ResourceSlices list whole GPUs and MIG devices side by side).
    """

    mig_strategy: str = "none"
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.mig_strategy not in MIG_STRATEGIES:
            raise LabelError(
                f"MIG strategy {self.mig_strategy!r} is not one of {', '.join(MIG_STRATEGIES)}"
            )
        if self.replicas < 1:
            raise LabelError(f"replicas must be at least 1, got {self.replicas}")

    @property
    def shared(self) -> bool:
        return self.replicas > 1

    @property
    def sharing_strategy(self) -> str:
        return "time-slicing" if self.shared else "none"


@records.record
class LabelSet:
    """The labels, plus what an operator should know about how they were chosen."""

    labels: dict[str, str]
    warnings: tuple[str, ...] = ()


def compute(
    devices: model.NodeDevices,
    settings: Settings | None = None,
    *,
    unhealthy: Container[str] = frozenset(),
) -> LabelSet:
    """The node's labels; ``unhealthy`` holds GPU/MIG UUIDs left out of the counts."""
    settings = settings or Settings()
    if not devices.gpus:
        return LabelSet(labels={})  # GFD labels nothing on a node without GPUs
    warnings: list[str] = []
    labels: dict[str, str] = {
        f"{GPU}.present": "true",
        f"{GPU}.machine": values.text(devices.machine_type),
        "nvidia.com/mig.capable": _bool(any(g.mig_capable for g in devices.gpus)),
        "nvidia.com/mps.capable": "false",  # we never run MPS
    }
    labels |= _versions(devices.gpus[0], warnings)
    labels |= _whole_gpus(devices.gpus, settings, unhealthy, warnings)
    if settings.mig_strategy != "none":
        labels["nvidia.com/mig.strategy"] = settings.mig_strategy
    if settings.mig_strategy == "single":
        labels |= _mig_single(devices.gpus, settings, unhealthy, warnings)
    elif settings.mig_strategy == "mixed":
        labels |= _mig_mixed(devices.gpus, settings, unhealthy)
    clique = _clique(devices.gpus, warnings)
    if clique:
        labels[f"{GPU}.clique"] = clique
    return LabelSet(labels=dict(sorted(labels.items())), warnings=tuple(warnings))


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _versions(gpu: model.Gpu, warnings: list[str]) -> dict[str, str]:
    """Driver (``cuda.driver.*``, GFD's name for it) and CUDA (``cuda.runtime.*``) versions,
    in GFD's deprecated and current spellings."""
    out: dict[str, str] = {}
    driver = values.driver_parts(gpu.driver_version)
    if driver is not None:
        major, minor, rev = driver
        out |= {
            "nvidia.com/cuda.driver.major": major,
            "nvidia.com/cuda.driver.minor": minor,
            "nvidia.com/cuda.driver.rev": rev,
            "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor,
            "nvidia.com/cuda.driver-version.revision": rev,
            "nvidia.com/cuda.driver-version.full": gpu.driver_version,
        }
    elif gpu.driver_version:
        warnings.append(f"driver version {gpu.driver_version!r} is not X.Y[.Z]; not labelled")
    cuda = values.version_pair(gpu.cuda_driver_version)
    if cuda is not None:
        out |= {
            "nvidia.com/cuda.runtime.major": str(cuda[0]),
            "nvidia.com/cuda.runtime.minor": str(cuda[1]),
            "nvidia.com/cuda.runtime-version.major": str(cuda[0]),
            "nvidia.com/cuda.runtime-version.minor": str(cuda[1]),
            "nvidia.com/cuda.runtime-version.full": f"{cuda[0]}.{cuda[1]}",
        }
    return out


def _base(
    key: str, count: int, parts: Iterable[str], *, replicas: int, shared: bool, strategy: str
) -> dict[str, str]:
    """GFD's product / count / replicas / sharing-strategy quartet for one resource."""
    return {
        f"{key}.product": values.product(list(parts), shared=shared),
        f"{key}.count": str(count),
        f"{key}.replicas": str(replicas),
        f"{key}.sharing-strategy": strategy,
    }


def _whole_gpus(
    gpus: tuple[model.Gpu, ...],
    settings: Settings,
    unhealthy: Container[str],
    warnings: list[str],
) -> dict[str, str]:
    """``nvidia.com/gpu.*`` for the chosen product (see the module docstring)."""
    totals = Counter(g.product_name for g in gpus)
    first = {g.product_name: g for g in reversed(gpus)}  # lowest index per product
    whole = [g for g in gpus if not g.mig_enabled]
    pool = whole or list(gpus)
    chosen = min({g.product_name for g in pool}, key=lambda n: (-totals[n], first[n].index))
    if len(totals) > 1:
        others = ", ".join(f"{n} ({c})" for n, c in sorted(totals.items()) if n != chosen)
        warnings.append(
            f"several GPU products on this node; labelled with {chosen} "
            f"({totals[chosen]} GPUs), not {others}"
        )
    gpu = first[chosen]
    sharing = bool(whole)  # GFD: GPUs in MIG mode are labelled without sharing
    healthy = sum(1 for g in gpus if g.product_name == chosen and g.uuid not in unhealthy)
    out = _base(
        GPU,
        healthy,
        [gpu.product_name],
        replicas=settings.replicas if sharing else 0,
        shared=sharing and settings.shared,
        strategy=settings.sharing_strategy if sharing else "none",
    )
    if gpu.memory_bytes >> 20:
        out[f"{GPU}.memory"] = str(gpu.memory_bytes >> 20)
    capability = values.version_pair(gpu.cuda_compute_capability)
    if capability is not None and capability[0] > 0:
        out |= {
            f"{GPU}.family": values.family(gpu.cuda_compute_capability),
            f"{GPU}.compute.major": str(capability[0]),
            f"{GPU}.compute.minor": str(capability[1]),
        }
    return out


def mig_name(profile: str) -> str:
    """A MIG profile as a name part: ``1g.10gb+me`` → ``1g.10gb.me`` (GFD's spelling)."""
    return profile.replace("+", ".")


def mig_resource(profile: str) -> str:
    """The mixed strategy's resource (and label key prefix), as our device plugin names it."""
    return f"nvidia.com/mig-{profile.replace('+', '-')}"


Unit = tuple[model.Gpu, model.MigDevice]  # a MIG device with its parent GPU


def _by_profile(gpus: Iterable[model.Gpu]) -> dict[str, list[Unit]]:
    """MIG profile → its MIG devices on every GPU in MIG mode, in GPU and placement order."""
    grouped: dict[str, list[Unit]] = {}
    for gpu in gpus:
        if gpu.mig_enabled:
            for mig in sorted(gpu.mig_devices, key=lambda m: m.placement_start):
                grouped.setdefault(mig.profile, []).append((gpu, mig))
    return grouped


def _mig_labels(
    key: str, units: list[Unit], settings: Settings, unhealthy: Container[str]
) -> dict[str, str]:
    """Labels of one MIG resource: the quartet plus the MIG device's attributes (GFD's names)."""
    parent, mig = units[0]
    healthy = sum(1 for g, m in units if m.uuid not in unhealthy and g.uuid not in unhealthy)
    out = _base(
        key,
        healthy,
        [parent.product_name, "MIG", mig_name(mig.profile)],
        replicas=settings.replicas,
        shared=settings.shared,
        strategy=settings.sharing_strategy,
    )
    slices = mig.profile.split("g.", 1)[0]
    out |= {
        f"{key}.memory": str(mig.memory_bytes >> 20),
        f"{key}.multiprocessors": str(mig.multiprocessors),
        f"{key}.slices.gi": slices,
        f"{key}.slices.ci": slices,  # one compute instance spanning its GPU instance
        f"{key}.engines.copy": str(mig.copy_engines),
        f"{key}.engines.decoder": str(mig.decoders),
        f"{key}.engines.encoder": str(mig.encoders),
        f"{key}.engines.jpeg": str(mig.jpeg_engines),
        f"{key}.engines.ofa": str(mig.ofa_engines),
    }
    return out


def _mig_single(
    gpus: tuple[model.Gpu, ...],
    settings: Settings,
    unhealthy: Container[str],
    warnings: list[str],
) -> dict[str, str]:
    """Single: the one MIG profile replaces ``nvidia.com/gpu.*``; nothing without MIG GPUs."""
    in_mig = [g for g in gpus if g.mig_enabled]
    if not in_mig:
        return {}
    grouped = _by_profile(gpus)
    problems = []
    if any(not g.mig_devices for g in in_mig):
        problems.append("a GPU in MIG mode has no MIG devices")
    if len(in_mig) != len(gpus):
        problems.append("GPUs in and out of MIG mode")
    if len(grouped) > 1:
        problems.append(f"several MIG profiles ({', '.join(sorted(grouped))})")
    if problems:
        warnings.append("MIG strategy single cannot serve this node: " + "; ".join(problems))
        return {
            f"{GPU}.product": values.product(
                [in_mig[0].product_name, "MIG", "INVALID"], shared=False
            ),
            f"{GPU}.count": "0",
            f"{GPU}.replicas": "0",
            f"{GPU}.memory": "0",
        }
    (units,) = grouped.values()
    return _mig_labels(GPU, units, settings, unhealthy)


def _mig_mixed(
    gpus: tuple[model.Gpu, ...], settings: Settings, unhealthy: Container[str]
) -> dict[str, str]:
    """Mixed: ``nvidia.com/mig-<profile>.*`` for every MIG profile present."""
    out: dict[str, str] = {}
    for profile, units in _by_profile(gpus).items():
        out |= _mig_labels(mig_resource(profile), units, settings, unhealthy)
    return out


def _clique(gpus: tuple[model.Gpu, ...], warnings: list[str]) -> str:
    """``<cluster UUID>.<clique id>`` when the GPUs attached to a multi-node NVLink fabric agree
    on one (GFD's rule; attached = registration completed with a non-zero cluster UUID)."""
    attached = [
        g.fabric
        for g in gpus
        if g.fabric is not None
        and g.fabric.state == "completed"
        and g.fabric.cluster_uuid != _ZERO_UUID
    ]
    ids = {(f.cluster_uuid, f.clique_id) for f in attached}
    if len(ids) > 1:
        warnings.append(f"GPUs report several NVLink fabric cliques {sorted(ids)}; not labelled")
    if len(ids) != 1:
        return ""
    ((cluster, clique),) = ids
    return f"{cluster}.{clique}"
