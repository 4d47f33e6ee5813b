"""Where NVML is loaded from: the ``DRA_DRIVER_NVML_LIBRARY`` seam, which lets a test make a
node without a driver on any machine (GPU or not), and the split of the NVML modules."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pynvml  # the loader's state is pynvml's: read it, and put it back after a test
import pytest

from dra_driver.devices import backend, nvml, nvmlapi
from dra_driver.devices.fake import fakenvml, profiles


def test_a_named_library_that_does_not_exist_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "libnvidia-ml.so.1"
    loaded = pynvml.nvmlLib
    with pytest.raises(backend.DiscoveryError) as info:
        nvml.PynvmlBackend.create(library=str(missing))
    message = str(info.value)
    assert message.startswith(f"NVML library {missing} not found: ")
    assert "NVIDIA driver must be installed" in message and "--fake PROFILE" in message
    assert "\n" not in message
    assert pynvml.nvmlLib is loaded  # a failed load leaves pynvml as it was


def test_the_environment_names_the_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "elsewhere" / "libnvidia-ml.so.1"
    monkeypatch.setenv(nvmlapi.LIBRARY_ENV, str(missing))
    with pytest.raises(backend.DiscoveryError, match=f"NVML library {missing} not found"):
        nvml.PynvmlBackend.create()
    # The argument wins over the environment.
    other = tmp_path / "other.so"
    with pytest.raises(backend.DiscoveryError, match=f"NVML library {other} not found"):
        nvml.PynvmlBackend.create(library=str(other))


def test_a_file_that_is_no_library_is_not_found_either(tmp_path: Path) -> None:
    text = tmp_path / "libnvidia-ml.so.1"
    text.write_text("not an ELF file")
    with pytest.raises(nvmlapi.NVMLError_LibraryNotFound) as info:
        nvmlapi.load_library(str(text))
    assert isinstance(info.value.__cause__, OSError)


def test_pynvml_uses_the_named_library_unless_one_is_loaded_already(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    libc = ctypes.util.find_library("c")
    assert libc is not None
    monkeypatch.setattr(pynvml, "nvmlLib", None)  # restored after the test
    nvmlapi.load_library(libc)
    first = pynvml.nvmlLib
    assert first is not None and first._name == libc
    nvmlapi.load_library(libc)  # loadable, but pynvml keeps the library it has
    assert pynvml.nvmlLib is first


def test_a_stand_in_loads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nvmlapi.LIBRARY_ENV, str(tmp_path / "missing.so"))
    prof = profiles.load_builtin("pcie-l4")
    fake = nvml.PynvmlBackend.create(nvml=fakenvml.FakeNvml(prof), library=str(tmp_path / "x"))
    assert len(fake.discover().gpus) == 4


def test_the_backend_re_exports_the_facts_and_the_sampler() -> None:
    assert nvml.NVMLError is nvmlapi.NVMLError is pynvml.NVMLError
    assert nvml.optional is nvmlapi.optional and nvml.real_module() is pynvml
    assert nvml.NVML_DEVICE_MIG_ENABLE == pynvml.NVML_DEVICE_MIG_ENABLE
    assert nvml.NvmlSampler.__module__ == "dra_driver.devices.nvmlsampler"
