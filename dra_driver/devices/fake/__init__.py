"""The fake discovery backend: a node's GPUs described by a topology profile.

Runs the driver without GPUs (laptops, CI, kind clusters). It does not build the device model
itself: it runs the real NVML backend over :class:`~dra_driver.devices.fake.fakenvml.FakeNvml`, a
pynvml stand-in answering from the profile, so fake and real discovery share one code path and
features a card lacks are absent exactly the way NVML reports them.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.devices import model, nvml
from dra_driver.devices.fake import fakenvml, profiles


class FakeBackend:
    """Discovery from a profile; ``nvml`` is the stand-in, open to failure injection."""

    def __init__(self, profile: profiles.Profile) -> None:
        self.profile = profile
        self.nvml = fakenvml.FakeNvml(profile)
        self._backend: nvml.PynvmlBackend | None = None

    @classmethod
    def from_name(cls, name: str) -> FakeBackend:
        return cls(profiles.load_builtin(name))

    @classmethod
    def from_file(cls, path: Path) -> FakeBackend:
        return cls(profiles.load_file(path))

    @property
    def nvml_api(self) -> fakenvml.FakeNvml:
        """The stand-in, for the health watcher (same calls as real NVML) and fake events."""
        return self.nvml

    def sampler(self) -> nvml.NvmlSampler:
        """GPU telemetry from the stand-in (the real sampler over fake NVML)."""
        return nvml.NvmlSampler(self.nvml)

    def close(self) -> None:
        """Release the NVML initialisation discovery took (a release for an upgrade)."""
        if self._backend is not None:
            self._backend.close()

    def discover(self) -> model.NodeDevices:
        if self._backend is None:
            self._backend = nvml.PynvmlBackend.create(
                nvml=self.nvml, sysfs=fakenvml.ProfileSysfs(self.profile)
            )
        return self._backend.discover()
