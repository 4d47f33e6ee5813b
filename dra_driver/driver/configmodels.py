"""The strict pydantic models of our ``gpu.nvidia.com/v1`` ``GpuConfig``.

Why its own module: most claims carry no opaque config, and a node agent that never decodes one
should not load pydantic and build these models (memory on every GPU node).
:mod:`dra_driver.driver.config` is where callers decode and merge configs (the format is
described there); it imports this module only when there is an entry to decode (or a recorded
``sharing`` to read back) and turns what this module validated into its plain dataclasses, so a
decoded config and the default one are the same type. The class names are part of the error
text (pydantic names the model it expected), so they are the format's own names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

import pydantic

from dra_driver.driver import nvidia_config

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STRICT = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TimeSlicing(pydantic.BaseModel):
    model_config = _STRICT
    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


class Mps(pydantic.BaseModel):
    model_config = _STRICT
    active_thread_percentage: int | None = pydantic.Field(
        default=None, alias="activeThreadPercentage", ge=0, le=100, strict=True
    )
    pinned_device_memory_limit: str | None = pydantic.Field(
        default=None, alias="pinnedDeviceMemoryLimit"
    )
    per_device_pinned_memory_limits: dict[str, str] | None = pydantic.Field(
        default=None, alias="perDevicePinnedMemoryLimits"
    )

    @pydantic.field_validator("pinned_device_memory_limit")
    @classmethod
    def _limit(cls, text: str | None) -> str | None:
        if text is not None:
            nvidia_config.memory_limit(text)
        return text

    @pydantic.field_validator("per_device_pinned_memory_limits")
    @classmethod
    def _limits(cls, limits: dict[str, str] | None) -> dict[str, str] | None:
        for key, text in (limits or {}).items():
            nvidia_config.device_key(key)
            nvidia_config.memory_limit(text)
        return limits


class Sharing(pydantic.BaseModel):
    model_config = _STRICT
    strategy: Literal["Exclusive", "TimeSlicing", "MPS"]
    time_slicing: TimeSlicing | None = pydantic.Field(default=None, alias="timeSlicing")
    mps: Mps | None = None

    @pydantic.model_validator(mode="after")
    def _settings_match_strategy(self) -> Sharing:
        if self.time_slicing is not None and self.strategy != "TimeSlicing":
            raise ValueError("timeSlicing may only be set with strategy TimeSlicing")
        if self.mps is not None and self.strategy != "MPS":
            raise ValueError("mps may only be set with strategy MPS")
        return self


class GpuConfig(pydantic.BaseModel):
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


class Invalid(ValueError):
    """A config does not decode; the message names every field and why."""


def gpu_config(params: Mapping[str, Any]) -> GpuConfig:
    """``params`` decoded strictly; :class:`Invalid` names every field that is wrong."""
    try:
        return GpuConfig.model_validate(dict(params))
    except pydantic.ValidationError as exc:
        raise Invalid("; ".join(nvidia_config.describe(err) for err in exc.errors())) from None


def sharing(raw: object) -> Sharing | None:
    """A recorded ``sharing`` (JSON) decoded; None when it does not decode."""
    try:
        return Sharing.model_validate(raw)
    except pydantic.ValidationError:
        return None
