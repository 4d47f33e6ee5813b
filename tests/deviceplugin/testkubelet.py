"""The device-plugin tests' kubelet: :mod:`dra_driver.deviceplugin.kubeletsim` (the fault suite
drives it too)."""

from dra_driver.deviceplugin.kubeletsim import FakeKubelet

__all__ = ["FakeKubelet"]
