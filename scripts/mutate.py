"""Mutation testing (mutmut) over the driver's core modules, one module group at a time.

Why it exists: a green suite says the code runs; mutation testing says the tests would notice
if it were wrong. ``make mutate`` (or ``make mutate MODULE=slices``) runs mutmut for each
group below in its own scratch workspace under ``build/mutate/<group>/``, with only the test
files that exercise that group (fast, in-process tests: no subprocess or container suites, and
no fixture tests, since ``../shared`` is not beside the workspace), then prints the score:
killed / survived / other, per group. Not part of ``make test`` or CI: it takes a long time on
two cores. ``docs/mutation.md`` records the last score and the survivors judged equivalent.

Usage: ``python scripts/mutate.py [GROUP ...] [--max-children N]``; ``--list`` shows groups.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "build" / "mutate"

# group -> (files to mutate, test files/directories that exercise them)
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "driver": (
        ["dra_driver/driver/*"],
        [
            "tests/driver/test_checkpoint.py",
            "tests/driver/test_checkpoint_faults.py",
            "tests/driver/test_claims.py",
            "tests/driver/test_claim_fields.py",
            "tests/driver/test_ownership.py",
            "tests/driver/test_cdi.py",
            "tests/driver/test_config.py",
            "tests/driver/test_driver.py",
            "tests/driver/test_driverfiles.py",
            "tests/driver/test_instances.py",
            "tests/driver/test_sharing.py",
            "tests/driver/test_atomicfile.py",
        ],
    ),
    "slices": (
        ["dra_driver/slices/*"],
        [
            "tests/slices/test_build.py",
            "tests/slices/test_split.py",
            "tests/slices/test_validate.py",
            "tests/slices/test_publisher.py",
            "tests/slices/test_publisher_loop.py",
            "tests/fakeapi/test_admission.py",
        ],
    ),
    "placement": (
        ["dra_driver/allocation/placement.py"],
        [
            "tests/allocation/test_placement.py",
            "tests/allocation/test_allocator.py",
            "tests/allocation/test_solver.py",
            "tests/allocation/test_explain.py",
        ],
    ),
    "schema": (
        ["dra_driver/apimachinery/schema.py"],
        ["tests/apimachinery/test_schema.py", "tests/slices/test_validate.py", "tests/fakeapi"],
    ),
    "deviceplugin": (["dra_driver/deviceplugin/*"], ["tests/deviceplugin"]),
}


def workspace(group: str) -> Path:
    """A scratch copy of the package and the tests with a mutmut config for ``group``."""
    mutate, tests = GROUPS[group]
    root = WORK / group
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shutil.copytree(REPO / "dra_driver", root / "dra_driver")
    shutil.copytree(REPO / "tests", root / "tests")
    # pytest settings without the project's [tool.*] sections, so mutmut reads setup.cfg.
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\naddopts = "-p no:cacheprovider"\n'
    )
    lines = [
        "[mutmut]",
        "source_paths=dra_driver",
        "only_mutate=",
        *(f"    {m}" for m in mutate),
        "also_copy=",
        "    tests",
        "pytest_add_cli_args_test_selection=",
        *(f"    {t}" for t in tests),
        "pytest_add_cli_args=",
        "    -q",
        "    -x",
    ]
    (root / "setup.cfg").write_text("\n".join(lines) + "\n")
    return root


def run(group: str, max_children: int) -> dict[str, int]:
    root = workspace(group)
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # fixture tests: skipped
    mutmut = [sys.executable, "-m", "mutmut"]
    subprocess.run(
        [*mutmut, "run", "--max-children", str(max_children)], cwd=root, env=env, check=False
    )
    out = root / "mutants" / "mutmut-cicd-stats.json"
    subprocess.run([*mutmut, "export-cicd-stats"], cwd=root, env=env, check=False)
    stats: dict[str, int] = json.loads(out.read_text()) if out.is_file() else {}
    return stats


def score_line(group: str, stats: dict[str, int]) -> str:
    killed, survived = stats.get("killed", 0), stats.get("survived", 0)
    other = {k: v for k, v in stats.items() if k not in ("killed", "survived", "total") and v}
    judged = killed + survived
    pct = f"{100 * killed / judged:.1f}%" if judged else "n/a"
    return f"{group:13} killed {killed:5}  survived {survived:4}  score {pct:>6}  other {other}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", help=f"of {', '.join(GROUPS)} (default: all)")
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutants")
    parser.add_argument("--list", action="store_true", help="list the groups and exit")
    args = parser.parse_args()
    if args.list:
        for name, (mutate, tests) in GROUPS.items():
            print(f"{name}: mutates {' '.join(mutate)}; tests {' '.join(tests)}")
        return 0
    unknown = set(args.groups) - set(GROUPS)
    if unknown:
        parser.error(f"unknown group(s): {', '.join(sorted(unknown))}")
    lines = [score_line(g, run(g, args.max_children)) for g in args.groups or list(GROUPS)]
    print("\nmutation score (killed / (killed + survived)):")
    print("\n".join(lines))
    print(f"survivors: cd {WORK}/<group> && python -m mutmut results; mutmut show <name>")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
