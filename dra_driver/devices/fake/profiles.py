"""Fake GPU topology profiles: the documented YAML format users describe hardware in.

A profile is what lets the whole driver run on a laptop or CI machine: the fake NVML stand-in
(:mod:`dra_driver.devices.fake.fakenvml`) answers NVML calls from it. Built-in profiles ship as
package data; ``--fake-file FILE`` loads a user's own. The format is documented in
``docs/profiles.md``; every mistake is reported with the file and the field at fault.
"""

from __future__ import annotations

import importlib.resources
import re
import uuid as uuidlib
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml

from dra_driver.devices import migtables

_CAMEL = pydantic.ConfigDict(extra="forbid", populate_by_name=True, frozen=True)
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


Bytes = Annotated[int, pydantic.BeforeValidator(parse_bytes)]


class Fabric(pydantic.BaseModel):
    model_config = _CAMEL
    cluster_uuid: str = pydantic.Field(alias="clusterUUID")
    clique_id: int = pydantic.Field(alias="cliqueId", ge=0)
    state: str = "completed"


class MigSpec(pydantic.BaseModel):
    """One MIG device (GPU instance + compute instance) on a GPU in MIG mode."""

    model_config = _CAMEL
    profile: str = pydantic.Field(pattern=r"^[0-9]+g\.[0-9]+gb(\+[a-z0-9]+)*$")
    placement_start: int = pydantic.Field(alias="placementStart", ge=0)
    placement_size: int = pydantic.Field(alias="placementSize", ge=1)
    memory: Bytes
    multiprocessors: int = pydantic.Field(ge=1)
    copy_engines: int = pydantic.Field(default=1, alias="copyEngines", ge=0)
    decoders: int = pydantic.Field(default=0, ge=0)
    encoders: int = pydantic.Field(default=0, ge=0)
    jpeg_engines: int = pydantic.Field(default=0, alias="jpegEngines", ge=0)
    ofa_engines: int = pydantic.Field(default=0, alias="ofaEngines", ge=0)
    uuid: str | None = None


TelemetryValue = Literal["utilization", "memory", "power", "temperature"]


class Telemetry(pydantic.BaseModel):
    """What the fake NVML reports as a GPU's telemetry; unset values are derived from the GPU's
    index (deterministic). ``notSupported``: values NVML refuses for it (NotSupported)."""

    model_config = _CAMEL
    gpu_utilization: int | None = pydantic.Field(default=None, alias="gpuUtilization", ge=0, le=100)
    memory_utilization: int | None = pydantic.Field(
        default=None, alias="memoryUtilization", ge=0, le=100
    )
    memory_used: Bytes | None = pydantic.Field(default=None, alias="memoryUsed")
    power_watts: float | None = pydantic.Field(default=None, alias="powerWatts", ge=0)
    temperature: int | None = pydantic.Field(default=None, ge=0, le=150)
    not_supported: tuple[TelemetryValue, ...] = pydantic.Field(default=(), alias="notSupported")


class GpuDefaults(pydantic.BaseModel):
    """Fields shared by all GPUs of a profile unless a GPU overrides them."""

    model_config = _CAMEL
    product_name: str | None = pydantic.Field(default=None, alias="productName")
    brand: str | None = None
    architecture: str | None = None
    cuda_compute_capability: str | None = pydantic.Field(
        default=None, alias="cudaComputeCapability", pattern=r"^[0-9]+\.[0-9]+$"
    )
    memory: Bytes | None = None
    fabric: Fabric | None = None
    # MIG support with MIG mode off (NVML reports the mode as disabled instead of NotSupported).
    # A GPU with ``mig`` is MIG-capable whatever this says.
    mig_capable: bool | None = pydantic.Field(default=None, alias="migCapable")
    # MIG-capable: the built-in profile table of this GPU model (dra_driver/devices/migtables.py).
    mig_profiles: str | None = pydantic.Field(default=None, alias="migProfiles")
    # Fake telemetry (utilization, memory used, power, temperature) and what NVML refuses.
    telemetry: Telemetry | None = None


class GpuSpec(GpuDefaults):
    """One GPU. Index defaults to its position in the list, minor to its index."""

    index: int | None = pydantic.Field(default=None, ge=0)
    minor: int | None = pydantic.Field(default=None, ge=0)
    uuid: str | None = None
    pci_bus_id: str = pydantic.Field(
        alias="pciBusId", pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"
    )
    pcie_root: str | None = pydantic.Field(
        default=None, alias="pcieRoot", pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}$"
    )
    pcie_switch: str | None = pydantic.Field(default=None, alias="pcieSwitch")
    numa_node: int | None = pydantic.Field(default=None, alias="numaNode", ge=0)
    mig: list[MigSpec] | None = None  # present (even empty) = MIG mode on, with these instances


class NvlinkPair(pydantic.BaseModel):
    model_config = _CAMEL
    gpus: tuple[int, int]
    links: int = pydantic.Field(ge=1)


class Nvlink(pydantic.BaseModel):
    """Exactly one of: ``switched`` (links per GPU into NVSwitches), ``matrix``, ``pairs``."""

    model_config = _CAMEL
    switched: int | None = pydantic.Field(default=None, ge=1)
    matrix: list[list[int]] | None = None
    pairs: list[NvlinkPair] | None = None

    @pydantic.model_validator(mode="after")
    def _one_kind(self) -> Nvlink:
        given = [k for k in ("switched", "matrix", "pairs") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of switched, matrix, pairs (got {given or 'none'})")
        return self


class Profile(pydantic.BaseModel):
    """A whole node: driver versions, per-GPU facts and the NVLink wiring."""

    model_config = _CAMEL
    name: str = pydantic.Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    description: str = ""
    driver_version: str = pydantic.Field(alias="driverVersion", pattern=r"^[0-9]+(\.[0-9]+)+$")
    # The DMI product name (/sys/class/dmi/id/product_name); absent = the platform reports none.
    machine_type: str | None = pydantic.Field(
        default=None, alias="machineType", min_length=1, max_length=256
    )
    cuda_driver_version: str = pydantic.Field(
        alias="cudaDriverVersion", pattern=r"^[0-9]+\.[0-9]+$"
    )
    defaults: GpuDefaults = GpuDefaults()
    gpus: list[GpuSpec] = pydantic.Field(min_length=1)
    nvlink: Nvlink | None = None

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> Profile:
        n = len(self.gpus)
        for i, gpu in enumerate(self.gpus):
            for field in (
                "product_name",
                "brand",
                "architecture",
                "cuda_compute_capability",
                "memory",
            ):
                if getattr(gpu, field) is None and getattr(self.defaults, field) is None:
                    raise ValueError(f"gpus[{i}]: {field} is not set and has no default")
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
        return self

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


def builtin_names() -> list[str]:
    """Names of the profiles shipped with the package."""
    folder = importlib.resources.files("dra_driver.devices.fake") / "profiles"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load_builtin(name: str) -> Profile:
    """Load a shipped profile by name (``dgx-h100``, ``pcie-l4``, ...)."""
    if name not in builtin_names():
        raise ProfileError(
            f"unknown fake profile {name!r}; built-in profiles: {', '.join(builtin_names())}"
        )
    resource = importlib.resources.files("dra_driver.devices.fake") / "profiles" / f"{name}.yaml"
    return parse(resource.read_text(encoding="utf-8"), source=f"built-in profile {name}")


def load_file(path: Path) -> Profile:
    """Load a user's profile file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc.strerror}") from exc
    return parse(text, source=str(path))


def parse(text: str, *, source: str) -> Profile:
    """Parse and validate profile YAML; errors name the source and the field path."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile must be a YAML mapping")
    try:
        return Profile.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<profile>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ProfileError(f"{source}: invalid profile: {problems}") from exc
