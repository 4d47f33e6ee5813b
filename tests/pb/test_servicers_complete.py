"""Every generated servicer base we serve is fully overridden by our own class.

The generated ``*_pb2_grpc.py`` base classes answer every method with ``NotImplementedError``;
this test makes sure none of our services ever falls back to one of those defaults.
"""

from __future__ import annotations

import inspect

import pytest

from dra_driver.deviceplugin import service
from dra_driver.kubelet import dra_service, health_service, registration

OURS = [
    cls
    for mod in (dra_service, registration, health_service, service)
    for _, cls in inspect.getmembers(mod, inspect.isclass)
    if cls.__module__ == mod.__name__
    and any(b.__module__.startswith("dra_driver.pb") for b in cls.__mro__[1:])
]


def test_all_served_apis_have_a_servicer() -> None:
    bases = {
        (b.__module__, b.__name__)
        for cls in OURS
        for b in cls.__mro__[1:]
        if b.__module__.startswith("dra_driver.pb")
    }
    assert len(bases) == 6, bases  # DRA v1, v1beta1, registration, health v1, v1alpha1, DP


@pytest.mark.parametrize("cls", OURS, ids=lambda c: c.__name__)
def test_no_method_falls_back_to_the_generated_default(cls: type) -> None:
    for base in cls.__mro__[1:]:
        if not base.__module__.startswith("dra_driver.pb"):
            continue
        missing = [
            name
            for name, member in vars(base).items()
            if callable(member) and not name.startswith("_") and getattr(cls, name) is member
        ]
        assert missing == [], f"{cls.__name__} leaves {missing} to {base.__name__}"
