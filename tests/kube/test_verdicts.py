"""Agreement with a real kube-apiserver on every recorded case (issue 9).

ResourceSlices: the local validator (the one the publisher runs before sending), the in-memory
API and the real client over the fake HTTP server all reach the server's verdict, and where we
reject, we name the field path the server named. ResourceClaims and DeviceClasses: the
in-memory API agrees, stores the server's defaults (``storedSpec``), and the allocator's CEL
compiler rejects exactly the selectors the server rejected, naming the expression.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import refdata

from dra_driver.allocation import cel
from dra_driver.apimachinery import fielderrors
from dra_driver.kube import api, client
from dra_driver.slices import validate
from dra_driver.testing.fakeapi import fakeserver, memory

from . import verdicts

pytestmark = refdata.MARK

SLICES = verdicts.params("resourceslices")
CLAIMS = verdicts.params("resourceclaims")
CLASSES = verdicts.params("deviceclasses")


def fresh_api() -> memory.InMemoryApi:
    mem = memory.InMemoryApi()
    for name, labels in verdicts.NAMESPACE_LABELS.items():
        mem.put_namespace(name, labels)
    return mem


def outcome(call: Any, obj: dict[str, Any]) -> tuple[int, str, dict[str, Any] | None]:
    try:
        stored = call(copy.deepcopy(obj))
    except api.ApiError as exc:
        return exc.status, str(exc), None
    return 201, "", stored


@pytest.fixture(scope="module")
def http_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[client.KubeClient]:
    with fakeserver.FakeApiServer(fresh_api()) as server:
        kubeconfig = server.write_kubeconfig(Path(tmp_path_factory.mktemp("kc")) / "config")
        kube = client.KubeClient.connect(kubeconfig)
        yield kube
        kube.close()


def test_every_verdict_file_contributes_cases() -> None:
    assert len(SLICES) >= 35 and len(CLAIMS) >= 18 and len(CLASSES) >= 12


@pytest.mark.parametrize("case", SLICES)
def test_slice_validator_agrees_with_server(case: dict[str, Any]) -> None:
    errors = validate.validate(case["object"])
    assert (not errors) == case["accepted"], [str(e) for e in errors]
    if errors:
        status, message = fielderrors.status_message("ResourceSlice", "x", errors)
        verdicts.assert_same_verdict(case, status, message)


@pytest.mark.parametrize("case", SLICES)
def test_memory_api_agrees_on_slices(case: dict[str, Any]) -> None:
    mem = fresh_api()
    status, message, stored = outcome(mem.create_resource_slice, case["object"])
    verdicts.assert_same_verdict(case, status, message)
    if stored is not None and "storedSpec" in case:
        assert stored["spec"] == case["storedSpec"]
    assert len(mem.all_resource_slices()) == (1 if case["accepted"] else 0)


@pytest.mark.parametrize("case", SLICES)
def test_real_client_over_http_agrees_on_slices(
    case: dict[str, Any], http_client: client.KubeClient
) -> None:
    obj = copy.deepcopy(case["object"])
    obj["metadata"] = {"generateName": "verdict-"}  # the shared server keeps every slice
    status, message, stored = outcome(http_client.create_resource_slice, obj)
    verdicts.assert_same_verdict(case, status, message.replace('"verdict-"', '"x"'))
    if stored is not None and "storedSpec" in case:
        assert stored["spec"] == case["storedSpec"]


@pytest.mark.parametrize("case", CLAIMS)
def test_memory_api_agrees_on_claims_and_defaults_them(case: dict[str, Any]) -> None:
    status, message, stored = outcome(fresh_api().create_resource_claim, case["object"])
    verdicts.assert_same_verdict(case, status, message)
    if stored is not None:
        assert stored["spec"] == case["storedSpec"]


@pytest.mark.parametrize("case", CLASSES)
def test_memory_api_agrees_on_device_classes(case: dict[str, Any]) -> None:
    status, message, stored = outcome(fresh_api().create_device_class, case["object"])
    verdicts.assert_same_verdict(case, status, message)
    if stored is not None:
        assert stored["spec"] == case["storedSpec"]


def _selectors(obj: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field path, expression) of every CEL selector in a claim or class."""
    spec = obj.get("spec") or {}
    for i, sel in enumerate(spec.get("selectors") or ()):
        yield f"spec.selectors[{i}].cel.expression", sel["cel"]["expression"]
    for i, req in enumerate((spec.get("devices") or {}).get("requests") or ()):
        base = f"spec.devices.requests[{i}]"
        for j, sel in enumerate((req.get("exactly") or {}).get("selectors") or ()):
            yield f"{base}.exactly.selectors[{j}].cel.expression", sel["cel"]["expression"]
        for k, sub in enumerate(req.get("firstAvailable") or ()):
            for j, sel in enumerate(sub.get("selectors") or ()):
                path = f"{base}.firstAvailable[{k}].selectors[{j}].cel.expression"
                yield path, sel["cel"]["expression"]


@pytest.mark.parametrize("case", CLAIMS + CLASSES)
def test_cel_compiler_rejects_exactly_what_the_server_rejected(case: dict[str, Any]) -> None:
    rejected = set() if case["accepted"] else set(verdicts.paths(case["message"]))
    for path, expression in _selectors(case["object"]):
        if path in rejected:
            with pytest.raises(cel.CelCompileError) as info:
                cel.compile_selector(expression)
            assert expression in str(info.value) or repr(expression)[1:-1] in str(info.value)
        else:
            cel.compile_selector(expression)
