"""Mutation testing (mutmut) over the driver's core modules, one module group at a time.

Why it exists: a green suite says the code runs; mutation testing says the tests would notice
if it were wrong. ``make mutate`` (or ``make mutate MODULE=slices``) runs mutmut for each
group below in its own scratch workspace under ``build/mutate/<group>/``, with only the test
files that exercise that group (fast, in-process tests: no subprocess or container suites, and
no fixture tests, since ``../shared`` is not beside the workspace), then prints the score:
killed / survived / other, per group. Not part of ``make test`` or CI: it takes a long time on
two cores. ``docs/mutation.md`` records the last score and the survivors judged equivalent.

Usage: ``python scripts/mutate.py [GROUP ...] [--max-children N] [--again | --sample N]``;
``--list`` shows groups. ``--again`` keeps the group's last results and re-tests only what may
have changed: mutants of edited functions, those never checked, and the survivors (after new
tests). ``--sample N`` scores a uniform random sample of N mutants (``--seed``) and prints the
score with its 95 % Wilson interval: an estimate when a full run does not fit the time at hand.
Both together re-test only the sample's survivors, unchecked and changed mutants.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "build" / "mutate"

DRIVER_OUT_OF_PROCESS = {"test_crash_points", "test_crash_shares", "test_mig_crash", "test_podman"}
DEVICEPLUGIN_MODULES = (
    "allocate",
    "app",
    "cdi",
    "inventory",
    "mps",
    "preferred",
    "registrar",
    "service",
)
# group -> (files to mutate, test files/directories that exercise them)
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "driver": (
        ["dra_driver/driver/*"],
        # every in-process driver test: not the SIGKILL crash suites or podman (a mutant in a
        # child process or a container is invisible to mutmut)
        [
            *sorted(
                f"tests/driver/{p.name}"
                for p in (REPO / "tests" / "driver").glob("test_*.py")
                if p.stem not in DRIVER_OUT_OF_PROCESS
            ),
            "tests/kubelet/test_dra_service.py",  # the driver behind the in-process gRPC server
        ],
    ),
    "slices": (["dra_driver/slices/*"], ["tests/slices", "tests/fakeapi/test_admission.py"]),
    "placement": (["dra_driver/allocation/placement.py"], ["tests/allocation"]),
    "schema": (
        [
            "dra_driver/apimachinery/schema.py",
            "dra_driver/apimachinery/strictdecode.py",
            "dra_driver/apimachinery/rfc3339.py",
        ],
        ["tests/apimachinery/test_schema.py", "tests/slices/test_validate.py", "tests/fakeapi"],
    ),
    "shutdown": (
        # The agent's stop (its steps, their deadline) and the node labels' health follower.
        ["dra_driver/shutdown.py", "dra_driver/nodelabels/agent.py"],
        ["tests/test_shutdown.py", "tests/nodelabels/test_reconcile.py"],
    ),
    "footprint": (
        # What keeps an agent light (docs/fleet.md): the shared frozen methods, the JSON path.
        ["dra_driver/records.py", "dra_driver/kube/kubeconfig.py"],
        [
            "tests/test_records.py",
            "tests/kube/test_kubeconfig.py",
            "tests/kube/test_client_config.py",
        ],
    ),
    "deviceplugin": (
        # kubeletsim is a kubelet stand-in for tests and the fault suite, not product code.
        [f"dra_driver/deviceplugin/{m}.py" for m in DEVICEPLUGIN_MODULES],
        ["tests/deviceplugin"],
    ),
}
# What the tests read besides the package and themselves: the log catalogue (tests/logcheck.py),
# the hardware profiles, example claims and shipped DeviceClasses (allocation, slices tests).
SUPPORT = (
    "scripts/log_events.py",
    "docs/log-events.md",
    "benchmarks/profiles",
    "deployments/examples",
    "deployments/deviceclasses",
)
SURVIVED = 0  # mutmut's exit code of a mutant no test noticed
NO_TESTS = (5, 33)  # no test reaches the mutated function: nothing would notice either
LIST_ONLY = "__mutate_py_lists_mutants_only__"  # a name no mutant has: generate, test nothing


# A pytest plugin for the workspace. mutmut runs the clean tests inside its own process and
# then waits for *any* child (os.wait) to collect a mutant's result: a child the tests left
# behind (an MPS daemon killed but not reaped) crashes it with a KeyError.
REAPER = '''"""Ends and reaps every child process a test session leaves behind (see mutate.py)."""
import contextlib
import os
import signal
from pathlib import Path


def _children():
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                    found.append(int(entry.name))
    return found


def pytest_sessionfinish(session, exitstatus):
    for pid in _children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
'''


def workspace(group: str, *, keep_results: bool = False) -> Path:
    """A scratch copy of the package and the tests with a mutmut config for ``group``.

    ``keep_results``: refresh the copies but keep ``mutants/`` (mutmut's per-function results)."""
    mutate, tests = GROUPS[group]
    root = WORK / group
    if keep_results and (root / "mutants").is_dir():
        for part in ("dra_driver", "tests"):
            shutil.rmtree(root / part, ignore_errors=True)
            shutil.rmtree(root / "mutants" / part / "__pycache__", ignore_errors=True)
        for stale in ("tests", "scripts", "docs", "benchmarks", "deployments"):
            shutil.rmtree(root / "mutants" / stale, ignore_errors=True)
        # mutmut collects coverage only for test names it has not seen: a rewritten test that
        # kept its name would keep its old reach. One stats pass more, the right tests run.
        (root / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    else:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    shutil.copytree(REPO / "dra_driver", root / "dra_driver")
    shutil.copytree(REPO / "tests", root / "tests")
    for extra in SUPPORT:
        (root / extra).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / extra).is_dir():
            shutil.rmtree(root / extra, ignore_errors=True)
            shutil.copytree(REPO / extra, root / extra)
        else:
            shutil.copy2(REPO / extra, root / extra)
        # mutmut copies these into mutants/ without making their folders (mutmut 3.x)
        (root / "mutants" / extra).parent.mkdir(parents=True, exist_ok=True)
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
        "    mutate_reaper.py",
        *(f"    {extra}" for extra in SUPPORT),
        "pytest_add_cli_args_test_selection=",
        *(f"    {t}" for t in tests),
        "pytest_add_cli_args=",
        "    -p",
        "    mutate_reaper",
        "    -q",
        "    -x",
    ]
    (root / "setup.cfg").write_text("\n".join(lines) + "\n")
    (root / "mutate_reaper.py").write_text(REAPER)
    return root


def results(root: Path, group: str) -> dict[str, int | None]:
    """Every mutant of the group's files → its exit code (None: not checked yet)."""
    found: dict[str, int | None] = {}
    for meta in sorted((root / "mutants").rglob("*.py.meta")):
        source = meta.relative_to(root / "mutants").as_posix().removesuffix(".meta")
        if any(fnmatch.fnmatch(source, pattern) for pattern in GROUPS[group][0]):
            found.update(json.loads(meta.read_text()).get("exit_code_by_key", {}))
        else:  # a file the group no longer mutates: its old results must not count
            meta.unlink()
    return found


def run(
    group: str, max_children: int, *, again: bool = False, sample: int = 0, seed: int = 17
) -> dict[str, int]:
    root = workspace(group, keep_results=again or bool(sample))
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # fixture tests: skipped
    mutmut = [sys.executable, "-m", "mutmut"]
    base = [*mutmut, "run", "--max-children", str(max_children)]
    names: list[str] = []  # the mutants scored: all, or the sample
    retest: list[str] = []  # the mutants tested now (none named: mutmut's own choice)
    if again or sample:
        # Generate (re-using the results of unchanged functions) without testing anything.
        listed = subprocess.run(
            [*base, LIST_ONLY], cwd=root, env=env, check=False, capture_output=True, text=True
        )
        if "nothing matches" not in listed.stdout + listed.stderr:  # it failed before that
            sys.stderr.write(listed.stdout[-3000:] + listed.stderr[-3000:])
            raise SystemExit(f"{group}: mutmut failed before testing any mutant (output above)")
        codes = results(root, group)
        names = sorted(codes)
        if sample:
            names = random.Random(seed).sample(names, min(sample, len(names)))
        retest = names
        if again:  # a kill stands while its function is unchanged (mutmut resets changed ones)
            retest = [n for n in names if codes[n] in (None, SURVIVED, *NO_TESTS)]
        if not retest:
            print(f"{group}: nothing to re-test")
    if retest or not (again or sample):
        done = subprocess.run([*base, *retest], cwd=root, env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{group}: mutmut failed (exit {done.returncode}); see above")
    out = root / "mutants" / "mutmut-cicd-stats.json"
    subprocess.run([*mutmut, "export-cicd-stats"], cwd=root, env=env, check=False)
    stats: dict[str, int] = json.loads(out.read_text()) if out.is_file() else {}
    if sample:  # the score of the sample alone
        codes = results(root, group)
        stats = {
            "killed": sum(1 for n in names if codes.get(n) in (1, 3)),
            "survived": sum(1 for n in names if codes.get(n) == SURVIVED),
            "no_tests": sum(1 for n in names if codes.get(n) in NO_TESTS),
            "other": sum(1 for n in names if codes.get(n) not in (1, 3, SURVIVED, *NO_TESTS)),
            "total": len(codes),
        }
    return stats


def score_line(group: str, stats: dict[str, int]) -> str:
    killed, survived = stats.get("killed", 0), stats.get("survived", 0)
    survived += stats.get("no_tests", 0)  # unreached by any test: as unnoticed as a survivor
    counted = ("killed", "survived", "no_tests", "total")
    other = {k: v for k, v in stats.items() if k not in counted and v}
    judged = killed + survived
    pct = f"{100 * killed / judged:.1f}%" if judged else "n/a"
    low, high = wilson(killed, judged)
    return (
        f"{group:13} killed {killed:5}  survived {survived:4}  score {pct:>6}"
        f"  (95% {100 * low:.1f}-{100 * high:.1f}%)  other {other}"
    )


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion (what a sampled score can claim)."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", help=f"of {', '.join(GROUPS)} (default: all)")
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutants")
    parser.add_argument("--list", action="store_true", help="list the groups and exit")
    parser.add_argument(
        "--again", action="store_true", help="keep results; re-test changed, unchecked, survivors"
    )
    parser.add_argument("--sample", type=int, default=0, help="score N random mutants only")
    parser.add_argument("--seed", type=int, default=17, help="of the --sample draw")
    args = parser.parse_args()
    if args.list:
        for name, (mutate, tests) in GROUPS.items():
            print(f"{name}: mutates {' '.join(mutate)}; tests {' '.join(tests)}")
        return 0
    unknown = set(args.groups) - set(GROUPS)
    if unknown:
        parser.error(f"unknown group(s): {', '.join(sorted(unknown))}")
    lines = [
        score_line(
            g, run(g, args.max_children, again=args.again, sample=args.sample, seed=args.seed)
        )
        for g in args.groups or list(GROUPS)
    ]
    print("\nmutation score: killed / (killed + survived + no tests); timeouts left out:")
    print("\n".join(lines))
    print(f"survivors: cd {WORK}/<group> && python -m mutmut results; mutmut show <name>")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
