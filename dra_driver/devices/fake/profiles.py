"""Fake GPU topology profiles: the documented YAML format users describe hardware in.

A profile is what lets the whole driver run on a laptop or CI machine: the fake NVML stand-in
(:mod:`dra_driver.devices.fake.fakenvml`) answers NVML calls from it. Built-in profiles ship as
package data; ``--fake-file FILE`` loads a user's own. The format is documented in
``docs/profiles.md``; every mistake is reported with the file and the field at fault. The models
are frozen dataclasses read by :mod:`~dra_driver.devices.fake.strict` (a fake agent has no need
of pydantic, as an agent on real GPUs has none).
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

from dra_driver import records
from dra_driver.devices import backend, migtables
from dra_driver.devices.fake import strict
from dra_driver.devices.fake.strict import rules

_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_BYTES = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti)?$")


class ProfileError(Exception):
    """A profile could not be found or does not follow the documented format."""


def parse_bytes(value: object) -> int:
    """``80Gi`` / ``23034Mi`` / ``1024`` → bytes (binary suffixes only, as NVML reports)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _BYTES.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a byte size like 80Gi, 4864Mi or 1024")
    return int(match.group(1)) * _UNITS[match.group(2) or ""]


Bytes = Annotated[int, strict.Parser(parse_bytes)]


@records.record(kw_only=True)
class Fabric:
    cluster_uuid: str = field(metadata=rules(alias="clusterUUID"))
    clique_id: int = field(metadata=rules(alias="cliqueId", ge=0))
    state: str = "completed"


@records.record(kw_only=True)
class MigSpec:
    """One MIG device (GPU instance + compute instance) on a GPU in MIG mode."""

    profile: str = field(metadata=rules(pattern=r"^[0-9]+g\.[0-9]+gb(\+[a-z0-9]+)*$"))
    placement_start: int = field(metadata=rules(alias="placementStart", ge=0))
    placement_size: int = field(metadata=rules(alias="placementSize", ge=1))
    memory: Bytes
    multiprocessors: int = field(metadata=rules(ge=1))
    copy_engines: int = field(default=1, metadata=rules(alias="copyEngines", ge=0))
    decoders: int = field(default=0, metadata=rules(ge=0))
    encoders: int = field(default=0, metadata=rules(ge=0))
    jpeg_engines: int = field(default=0, metadata=rules(alias="jpegEngines", ge=0))
    ofa_engines: int = field(default=0, metadata=rules(alias="ofaEngines", ge=0))
    uuid: str | None = None


TelemetryValue = Literal["utilization", "memory", "power", "temperature"]


@records.record(kw_only=True)
class Telemetry:
    """What the fake NVML reports as a GPU's telemetry; unset values are derived from the GPU's
    index (deterministic). ``notSupported``: values NVML refuses for it (NotSupported)."""

    gpu_utilization: int | None = field(
        default=None, metadata=rules(alias="gpuUtilization", ge=0, le=100)
    )
    memory_utilization: int | None = field(
        default=None, metadata=rules(alias="memoryUtilization", ge=0, le=100)
    )
    memory_used: Bytes | None = field(default=None, metadata=rules(alias="memoryUsed"))
    power_watts: float | None = field(default=None, metadata=rules(alias="powerWatts", ge=0))
    temperature: int | None = field(default=None, metadata=rules(ge=0, le=150))
    not_supported: tuple[TelemetryValue, ...] = field(
        default=(), metadata=rules(alias="notSupported")
    )


@records.record(kw_only=True)
class GpuDefaults:
    """Fields shared by all GPUs of a profile unless a GPU overrides them."""

    product_name: str | None = field(default=None, metadata=rules(alias="productName"))
    brand: str | None = None
    architecture: str | None = None
    cuda_compute_capability: str | None = field(
        default=None, metadata=rules(alias="cudaComputeCapability", pattern=r"^[0-9]+\.[0-9]+$")
    )
    memory: Bytes | None = None
    fabric: Fabric | None = None
    # MIG support with MIG mode off (NVML reports the mode as disabled instead of NotSupported).
    # A GPU with ``mig`` is MIG-capable whatever this says.
    mig_capable: bool | None = field(default=None, metadata=rules(alias="migCapable"))
    # MIG-capable: the built-in profile table of this GPU model (dra_driver/devices/migtables.py).
    mig_profiles: str | None = field(default=None, metadata=rules(alias="migProfiles"))
    # Fake telemetry (utilization, memory used, power, temperature) and what NVML refuses.
    telemetry: Telemetry | None = None


@records.record(kw_only=True)
class GpuSpec(GpuDefaults):
    """One GPU. Index defaults to its position in the list, minor to its index."""

    index: int | None = field(default=None, metadata=rules(ge=0))
    minor: int | None = field(default=None, metadata=rules(ge=0))
    uuid: str | None = None
    pci_bus_id: str = field(
        metadata=rules(
            alias="pciBusId", pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"
        )
    )
    pcie_root: str | None = field(
        default=None, metadata=rules(alias="pcieRoot", pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
    )
    pcie_switch: str | None = field(default=None, metadata=rules(alias="pcieSwitch"))
    numa_node: int | None = field(default=None, metadata=rules(alias="numaNode", ge=0))
    mig: list[MigSpec] | None = None  # present (even empty) = MIG mode on, with these instances
    # The IOMMU group; absent = a group of its own (docs/passthrough.md).
    iommu_group: int | None = field(default=None, metadata=rules(alias="iommuGroup", ge=0))


@records.record(kw_only=True)
class NvlinkPair:
    gpus: tuple[int, int]
    links: int = field(metadata=rules(ge=1))


@records.record(kw_only=True)
class Nvlink:
    """Exactly one of: ``switched`` (links per GPU into NVSwitches), ``matrix``, ``pairs``."""

    switched: int | None = field(default=None, metadata=rules(ge=1))
    matrix: list[list[int]] | None = None
    pairs: list[NvlinkPair] | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("switched", "matrix", "pairs") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of switched, matrix, pairs (got {given or 'none'})")


@records.record(kw_only=True)
class Profile:
    """A whole node: driver versions, per-GPU facts and the NVLink wiring."""

    name: str = field(metadata=rules(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
    description: str = ""
    driver_version: str = field(
        metadata=rules(alias="driverVersion", pattern=r"^[0-9]+(\.[0-9]+)+$")
    )
    # The DMI product name (/sys/class/dmi/id/product_name); absent = the platform reports none.
    machine_type: str | None = field(
        default=None, metadata=rules(alias="machineType", min_length=1, max_length=256)
    )
    cuda_driver_version: str = field(
        metadata=rules(alias="cudaDriverVersion", pattern=r"^[0-9]+\.[0-9]+$")
    )
    defaults: GpuDefaults = field(default_factory=GpuDefaults)
    gpus: list[GpuSpec] = field(metadata=rules(min_length=1))
    nvlink: Nvlink | None = None

    def __post_init__(self) -> None:
        """Cross-field checks (also for a profile built or changed in code)."""
        n = len(self.gpus)
        for i, gpu in enumerate(self.gpus):
            for name in (
                "product_name",
                "brand",
                "architecture",
                "cuda_compute_capability",
                "memory",
            ):
                if getattr(gpu, name) is None and getattr(self.defaults, name) is None:
                    raise ValueError(f"gpus[{i}]: {name} is not set and has no default")
        for i in range(n):
            _check_mig(i, self.resolved(i, "mig_profiles"), self.gpus[i].mig)
        indices = [g.index if g.index is not None else i for i, g in enumerate(self.gpus)]
        if sorted(indices) != list(range(n)):
            raise ValueError(f"GPU indices must be 0..{n - 1} without gaps, got {indices}")
        if self.nvlink and self.nvlink.matrix is not None:
            m = self.nvlink.matrix
            if len(m) != n or any(len(row) != n for row in m):
                raise ValueError(f"nvlink.matrix must be {n}x{n}")
            for a in range(n):
                for b in range(n):
                    if a != b and m[a][b] != m[b][a]:
                        raise ValueError(f"nvlink.matrix is not symmetric at [{a}][{b}]")
        if self.nvlink and self.nvlink.pairs is not None:
            for pair in self.nvlink.pairs:
                a, b = pair.gpus
                if a == b or not (0 <= a < n and 0 <= b < n):
                    raise ValueError(f"nvlink.pairs: bad GPU pair {list(pair.gpus)}")

    def gpu_index(self, position: int) -> int:
        gpu = self.gpus[position]
        return gpu.index if gpu.index is not None else position

    def resolved(self, position: int, field: str) -> Any:
        """A GPU field with the profile default applied."""
        value = getattr(self.gpus[position], field)
        return value if value is not None else getattr(self.defaults, field)

    def mig_capable(self, position: int) -> bool:
        """Whether NVML reports a MIG mode for this GPU (``mig``, ``migCapable`` or
        ``migProfiles`` given)."""
        return (
            self.gpus[position].mig is not None
            or bool(self.resolved(position, "mig_capable"))
            or self.resolved(position, "mig_profiles") is not None
        )

    def gpu_uuid(self, position: int) -> str:
        given = self.gpus[position].uuid
        if given:
            return given
        raw = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"dra-driver/{self.name}/gpu/{position}")
        return f"GPU-{raw}"

    def mig_uuid(self, position: int, mig: MigSpec) -> str:
        if mig.uuid:
            return mig.uuid
        key = f"dra-driver/{self.name}/gpu/{position}/mig/{mig.placement_start}"
        return f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, key)}"

    def links(self, a_pos: int, b_pos: int) -> int:
        """Direct NVLink links between two GPUs (by position), 0 for switched or none."""
        if self.nvlink is None or a_pos == b_pos:
            return 0
        if self.nvlink.matrix is not None:
            return self.nvlink.matrix[a_pos][b_pos]
        a, b = self.gpu_index(a_pos), self.gpu_index(b_pos)
        return sum(p.links for p in self.nvlink.pairs or () if set(p.gpus) == {a, b})


def _check_mig(i: int, table_name: str | None, instances: list[MigSpec] | None) -> None:
    """A GPU's listed MIG instances fit its profile table: known profile, possible placement,
    the table's sizes, no two sharing a memory slice."""
    if table_name is None:
        return
    table = migtables.lookup(table_name)
    if table is None:
        raise ValueError(
            f"gpus[{i}]: unknown migProfiles {table_name!r}; known: {', '.join(migtables.names())}"
        )
    rows = {r.name: r for r in table}
    used: set[int] = set()
    for j, mig in enumerate(instances or ()):
        where = f"gpus[{i}].mig[{j}]"
        row = rows.get(mig.profile)
        if row is None:
            raise ValueError(f"{where}: {mig.profile} is not a profile of {table_name}")
        if (mig.placement_start, mig.placement_size) not in row.placements:
            raise ValueError(
                f"{where}: {mig.profile} cannot be placed at {mig.placement_start}:"
                f"{mig.placement_size} (possible: {row.placements})"
            )
        if (mig.memory >> 20, mig.multiprocessors) != (row.memory_mib, row.multiprocessors):
            raise ValueError(
                f"{where}: {mig.profile} has {row.memory_mib}Mi and {row.multiprocessors} "
                f"multiprocessors in {table_name}"
            )
        slices = set(range(mig.placement_start, mig.placement_start + mig.placement_size))
        if used & slices:
            raise ValueError(f"{where}: overlaps another instance's memory slices")
        used |= slices


# The package's own files, read directly: importlib.resources would load its readers and
# zipfile into every fake agent (~0.4 MiB, docs/fleet.md) for a package never run from a zip.
_BUILTIN = backend.BUILTIN_FAKE_PROFILES


def builtin_names() -> list[str]:
    """Names of the profiles shipped with the package."""
    return backend.builtin_fake_profiles()


def load_builtin(name: str) -> Profile:
    """Load a shipped profile by name (``dgx-h100``, ``pcie-l4``, ...)."""
    if name not in builtin_names():
        raise ProfileError(
            f"unknown fake profile {name!r}; built-in profiles: {', '.join(builtin_names())}"
        )
    # Its JSON twin (scripts/gen_profiles.py), so a fake node's agent holds no YAML parser.
    data = json.loads((_BUILTIN / f"{name}.json").read_text(encoding="utf-8"))
    return _decode(data, source=f"built-in profile {name}")


def load_file(path: Path) -> Profile:
    """Load a user's profile file."""
    from dra_driver import inputfile

    try:
        text = inputfile.read_text(path)
    except inputfile.InputFileError as exc:
        raise ProfileError(str(exc)) from None
    return parse(text, source=str(path))


def parse(text: str, *, source: str) -> Profile:
    """Parse and validate profile YAML; errors name the source and the field path."""
    import yaml  # only for a user's profile file: the built-in ones are read from JSON

    from dra_driver import yamlload

    try:
        docs = yamlload.load_all(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{source}: not valid YAML: {exc}") from exc
    except RecursionError:
        raise ProfileError(f"{source}: nested too deeply to be a profile") from None
    if len(docs) > 1:
        raise ProfileError(f"{source}: a profile file holds one YAML document, not {len(docs)}")
    data = docs[0] if docs else None
    return _decode(data, source=source)


def _decode(data: Any, *, source: str) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile must be a YAML mapping")
    try:
        return strict.decode(Profile, data)
    except strict.DecodeError as exc:
        raise ProfileError(f"{source}: invalid profile: {exc}") from exc


def dump(profile: Profile) -> dict[str, Any]:
    """The profile as the mapping a profile file holds (camelCase keys, unset fields left out):
    ``yaml.safe_dump`` it to hand a changed profile to an agent process."""
    data: dict[str, Any] = strict.encode(profile, exclude_none=True)
    return data
