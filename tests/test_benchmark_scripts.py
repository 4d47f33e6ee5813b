"""Every benchmark script still imports and parses its flags (a moved module broke one once
unnoticed: benchmarks are not run by the test suite), and benchkit starts the agent with the
settings the chart gives it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "benchkit.py")


def test_the_scripts_are_found() -> None:
    assert {"prepare.py", "placement.py", "publish.py", "faults.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_imports_and_prints_its_help(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:")


def test_the_health_benchmark_runs_once_through() -> None:
    """A short real run (one repeat, ~6 s): the health benchmark reads slices as the agent
    publishes them (a counter slice without devices broke it once)."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "health_latency.py"), "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "worst failure-to-isolation:" in proc.stdout.splitlines()[-1]


def test_the_benchmark_plugin_keeps_metadata_files_where_the_chart_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """benchkit.Plugin runs the agent with ``--metadata-dir`` next to its CDI directory when the
    tree's chart sets ``kubeletPlugin.metadataDir`` (a tmpfs), and without it when the chart
    has none (an older tree, which has no such flag either)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import benchkit
    import imagekit

    values = yaml.safe_load((imagekit.REPO / imagekit.VALUES).read_text(encoding="utf-8"))
    assert imagekit.chart_metadata_dir() == values["kubeletPlugin"]["metadataDir"]
    seen: list[list[str]] = []

    class Started(Exception):
        pass

    def popen(argv: list[str], **_: object) -> None:
        seen.append(argv)
        raise Started

    monkeypatch.setattr(benchkit.subprocess, "Popen", popen)
    old = tmp_path / "old-tree"
    (old / imagekit.VALUES).parent.mkdir(parents=True)
    (old / imagekit.VALUES).write_text("kubeletPlugin:\n  cdiRoot: /var/run/cdi\n")
    for tree in (imagekit.REPO, old):
        with pytest.raises(Started):
            benchkit.Plugin(
                tmp_path, tmp_path / "kc", tmp_path / "p", cdi=tmp_path / "c", tree=tree
            )
    new, before = seen
    assert new[new.index("--metadata-dir") + 1] == str(tmp_path / "c-metadata")
    assert "--metadata-dir" not in before
