"""Example ResourceClaims (each with the Pod that uses it), shipped as package data.

Why it exists: the same examples serve users (``deployments/examples/``, copies a test keeps
identical to these files), the ``demo`` command and the tests, which run every one through the
claim simulator. The YAML files here are the one source.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import yaml


class ExampleError(Exception):
    """No shipped example has that name."""


def names() -> list[str]:
    """Names of the shipped examples (file name without ``.yaml``), sorted."""
    folder = importlib.resources.files(__name__)
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def text(name: str) -> str:
    """The YAML text of one example."""
    if name not in names():
        raise ExampleError(f"no example {name!r}; shipped: {', '.join(names())}")
    return (importlib.resources.files(__name__) / f"{name}.yaml").read_text(encoding="utf-8")


def load(name: str) -> list[dict[str, Any]]:
    """The objects of one example (a ResourceClaim or template, then a Pod)."""
    return [doc for doc in yaml.safe_load_all(text(name)) if doc]
