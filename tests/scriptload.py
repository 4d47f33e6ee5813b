"""Import a ``scripts/<name>.py`` file as a module: the scripts are not a package, and tests of
the chart renderer, the mutation runner and the log catalogue all need one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` once (the module is registered as ``_scripts_<name>``)."""
    path = SCRIPTS / f"{name}.py"
    module_name = f"_scripts_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
