"""The device-plugin tests' kubelet: :mod:`dra_driver.testing.dpkubeletsim` (the fault suite
drives it too)."""

from dra_driver.testing.dpkubeletsim import FakeKubelet

__all__ = ["FakeKubelet"]
