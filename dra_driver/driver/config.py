"""Our opaque device configuration (``gpu.nvidia.com/v1`` ``GpuConfig``), decoded strictly.

DeviceClasses and ResourceClaims carry driver-specific parameters as opaque JSON that the API
server never looks inside, so this is the only place a typo can be caught. Decoding is strict
(unknown fields are errors naming the claim, the config entry and the field) rather than
forgiving: a silently ignored ``sharng:`` would give a user exclusive GPUs they did not ask for.

The format, kept deliberately small::

    apiVersion: gpu.nvidia.com/v1
    kind: GpuConfig
    sharing:                      # optional
      strategy: Exclusive | TimeSlicing
      timeSlicing:                # only with strategy TimeSlicing
        interval: Default | Short | Medium | Long
    env:                          # optional, extra environment for the containers
      NAME: value

Several configs can apply to one device (class configs first, then claim configs); they are
merged in that order: a later ``sharing`` replaces an earlier one, ``env`` entries are merged
with later values winning.

This module only decodes and merges. The merged ``sharing`` is applied to the GPU at prepare by
:mod:`dra_driver.driver.sharing` (and restored at unprepare), ``env`` goes into the claim's CDI
spec (:mod:`dra_driver.driver.cdi`); the user-facing description is ``docs/config.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, Literal

import pydantic
import pydantic_core

from dra_driver.driver import claims

API_VERSION: Final = "gpu.nvidia.com/v1"
KIND: Final = "GpuConfig"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STRICT = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ConfigError(claims.ClaimError):
    """An opaque config of our driver does not decode; names the claim, entry and field."""


class TimeSlicing(pydantic.BaseModel):
    model_config = _STRICT
    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


class Sharing(pydantic.BaseModel):
    model_config = _STRICT
    strategy: Literal["Exclusive", "TimeSlicing"]
    time_slicing: TimeSlicing | None = pydantic.Field(default=None, alias="timeSlicing")

    @pydantic.model_validator(mode="after")
    def _slicing_only_when_time_slicing(self) -> Sharing:
        if self.time_slicing is not None and self.strategy != "TimeSlicing":
            raise ValueError("timeSlicing may only be set with strategy TimeSlicing")
        return self


class GpuConfig(pydantic.BaseModel):
    """One decoded config entry (or the merge of several)."""

    model_config = _STRICT
    api_version: Literal["gpu.nvidia.com/v1"] = pydantic.Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: Sharing | None = None
    env: dict[str, str] = pydantic.Field(default_factory=dict)

    @pydantic.field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return env

    def to_json(self) -> dict[str, object]:
        """The JSON form (as a user would write it), for the checkpoint."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


DEFAULT = GpuConfig(apiVersion=API_VERSION, kind=KIND)


def decode(entry: claims.OpaqueConfig, *, ref: claims.ClaimRef) -> GpuConfig:
    """Decode one opaque config entry; :class:`ConfigError` names the claim, entry and field."""
    where = f"{ref}: opaque {entry.describe()}"
    params = entry.parameters
    if params.get("apiVersion") != API_VERSION or params.get("kind") != KIND:
        raise ConfigError(
            f"{where}: unsupported apiVersion/kind {params.get('apiVersion')!r}/"
            f"{params.get('kind')!r} (this driver understands {API_VERSION} {KIND})"
        )
    try:
        return GpuConfig.model_validate(dict(params))
    except pydantic.ValidationError as exc:
        problems = "; ".join(_describe(err) for err in exc.errors())
        raise ConfigError(f"{where}: {problems}") from None


def effective(entries: Iterable[claims.OpaqueConfig], *, ref: claims.ClaimRef) -> GpuConfig:
    """Decode and merge, in order, every config applying to one device."""
    merged = DEFAULT
    for entry in entries:
        cfg = decode(entry, ref=ref)
        merged = GpuConfig(
            apiVersion=API_VERSION,
            kind=KIND,
            sharing=cfg.sharing if cfg.sharing is not None else merged.sharing,
            env={**merged.env, **cfg.env},
        )
    return merged


def _describe(err: pydantic_core.ErrorDetails) -> str:
    field = ".".join(str(part) for part in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"field {field}: unknown field"
    if err["type"] == "missing":
        return f"field {field}: required field is missing"
    return f"field {field}: {err['msg']}"
