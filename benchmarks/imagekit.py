"""Run the agent as the container image and the chart run it, for the benchmarks (issue 46).

Why it exists: an agent's speed and memory depend on how it is installed and started, not only on
its code. Measured on a real API server, the same tree took 57.6 MiB installed with pip and 64.5
MiB with the chart's ``PYTHONOPTIMIZE=2`` where no level-2 byte-code existed; a checkout with the
dev venv (``rich``, editable install, ``PYTHONPATH``) is another thing again. So the prepare and
fleet benchmarks run the agent from what this builds:

* **the install**: a fresh venv of the base interpreter with ``pip install -c constraints.txt
  TREE`` — non-editable, runtime dependencies only — as the Dockerfile's build stage does;
* **the byte-code**: ``compileall`` at levels 0 and 2 of the standard library and the venv, as
  the image's final stage does (``--bytecode pip`` leaves what pip alone compiles, level 0
  only: the state the issue measured);
* **the environment**: the final stage's ``ENV`` lines, read from the Dockerfile, and the
  chart's ``python.optimize`` as ``PYTHONOPTIMIZE``, read from the chart's values; nothing of
  the caller's Python environment (``PYTHONPATH``, ``VIRTUAL_ENV``) leaks in;
* **the entry point**: the venv's ``dra-driver`` script, started outside the source tree.

Venvs are cached under ``/tmp/dra-image-venvs`` by the hash of the tree's installable files, so
a second run of a benchmark reuses them (~25 s to build one).

Run: ``python benchmarks/imagekit.py [--tree DIR] [--bytecode image|pip]`` builds (or finds) the
venv and prints its path and the environment the agents get.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path("/tmp/dra-image-venvs")
# The image's compileall: both levels, the test folders left out (Dockerfile).
SKIP = ["-x", "/(test|tests|idle_test)/"]
LEVELS = ["-o", "0", "-o", "2"]
# What the caller's environment must not hand the agents (the image has none of them).
DROPPED = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONPYCACHEPREFIX", "PYTHONSTARTUP")
VALUES = "deployments/helm/dra-driver/values.yaml"  # the chart's values, in a tree


def base_python() -> str:
    """The interpreter the venvs are made from: the one behind this (possibly venv) Python."""
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3"):
        candidate = Path(sys.base_prefix) / "bin" / name
        if candidate.exists():
            return str(candidate)
    return sys.executable


def dockerfile_env(tree: Path = REPO) -> dict[str, str]:
    """The final stage's ``ENV`` settings of ``tree``'s Dockerfile (``PATH`` left out: the
    caller sets its own), e.g. ``PYTHONDONTWRITEBYTECODE=1``, ``MALLOC_ARENA_MAX=2``."""
    text = (tree / "Dockerfile").read_text(encoding="utf-8")
    final = text.rsplit("\nFROM ", 1)[-1].replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            for key, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", line[4:]):
                if key != "PATH":
                    env[key] = value.strip("\"'")
    return env


def chart_optimize(tree: Path = REPO) -> int:
    """The chart's ``python.optimize`` (what it sets as ``PYTHONOPTIMIZE``)."""
    values = (tree / "deployments/helm/dra-driver/values.yaml").read_text(encoding="utf-8")
    found = re.search(r"^python:\n(?:[ \t]+#.*\n)*[ \t]+optimize:[ \t]*(\d+)", values, re.M)
    return int(found.group(1)) if found else 0


def chart_log_level(tree: Path = REPO) -> str:
    """The chart's ``logging.level`` (``LOG_LEVEL``): the agents log every claim at ``info``."""
    values = (tree / "deployments/helm/dra-driver/values.yaml").read_text(encoding="utf-8")
    found = re.search(r"^logging:\n(?:[ \t]+#.*\n)*[ \t]+level:[ \t]*(\w+)", values, re.M)
    return found.group(1) if found else "info"


def chart_metadata_dir(tree: Path = REPO) -> str | None:
    """The chart's ``kubeletPlugin.metadataDir`` (``METADATA_DIR``: the claim metadata files on
    a tmpfs), or None where it is empty or the chart has none (a tree from before issue 46)."""
    values = (tree / VALUES).read_text(encoding="utf-8")
    block = re.search(r"^kubeletPlugin:\n((?:[ \t]+.*\n|[ \t]*\n)*)", values, re.M)
    found = re.search(r"^  metadataDir:[ \t]*(.*?)[ \t]*$", block.group(1), re.M) if block else None
    value = found.group(1).split(" #", 1)[0].strip().strip("\"'") if found else ""
    return value or None


def image_env(tree: Path = REPO, *, optimize: int | None = None) -> dict[str, str]:
    """What the image and the chart give the agent's process: the Dockerfile's ``ENV`` and the
    chart's ``PYTHONOPTIMIZE`` (``optimize`` overrides the chart's level; 0 leaves it unset, as
    the chart does)."""
    env = dockerfile_env(tree)
    level = chart_optimize(tree) if optimize is None else optimize
    if level:
        env["PYTHONOPTIMIZE"] = str(level)
    return env


def process_env(venv: Path, tree: Path = REPO, *, optimize: int | None = None) -> dict[str, str]:
    """The whole environment of an agent process run as the image runs it."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env.update(image_env(tree, optimize=optimize))
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def tree_key(tree: Path, bytecode: str) -> str:
    """The cache key: the tree's installable files, the interpreter and the byte-code mode."""
    digest = hashlib.sha256(f"{base_python()} {sys.version} {bytecode}".encode())
    files = [tree / "pyproject.toml", tree / "constraints.txt", tree / "README.md"]
    files += sorted(p for p in (tree / "dra_driver").rglob("*") if p.is_file() and _shipped(p))
    for path in files:
        if path.exists():
            digest.update(str(path.relative_to(tree)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _shipped(path: Path) -> bool:
    return "__pycache__" not in path.parts and path.suffix not in {".pyc", ".pyo"}


def runtime_venv(tree: Path = REPO, *, bytecode: str = "image", quiet: bool = True) -> Path:
    """The venv ``tree`` is installed into as the image installs it (built once, then cached).
    ``bytecode``: ``image`` (levels 0 and 2 of everything, the standard library included, as
    the Dockerfile compiles) or ``pip`` (only what pip compiles on install: level 0 of
    site-packages)."""
    if bytecode not in ("image", "pip"):
        raise ValueError(f"bytecode must be 'image' or 'pip', not {bytecode!r}")
    tree = tree.resolve()
    venv = CACHE / f"{tree_key(tree, bytecode)}-{bytecode}"
    if (venv / ".complete").exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Two benchmarks of the same tree (two worktrees at one commit) build the same venv: one
    # builds, the other waits and reuses it; without the lock each removed the other's half.
    with open(venv.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            _build(venv, tree, bytecode, quiet=quiet)
    return venv


def _build(venv: Path, tree: Path, bytecode: str, *, quiet: bool) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    out = subprocess.DEVNULL if quiet else None
    # The build stage's own environment: no pip cache in the image (a local one speeds this up
    # and changes nothing installed), byte-code not written by the build's own Python runs.
    build_env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    build_env.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    subprocess.run([base_python(), "-m", "venv", str(venv)], check=True, env=build_env)
    pip = [str(venv / "bin/pip"), "install", "-q", "-c", str(tree / "constraints.txt")]
    # Built from a copy: pip's in-tree build leaves build/ and egg-info in the tree otherwise.
    source = venv.with_suffix(".src")
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(
        tree,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", "build"),
    )
    try:
        subprocess.run([*pip, str(source)], check=True, env=build_env, stdout=out)
    finally:
        shutil.rmtree(source, ignore_errors=True)
    if bytecode == "image":
        compileall = [str(venv / "bin/python"), "-m", "compileall", "-q", "-j", "0", *LEVELS]
        subprocess.run(
            [*compileall, *SKIP, stdlib(venv), str(venv / "lib")],
            check=False,  # the base interpreter's folders may not be writable: best effort
            env=build_env,
            stdout=out,
            stderr=out,
        )
    else:  # pip's own level-0 byte-code only: take away what any other run left
        for stale in (venv / "lib").rglob("*.opt-*.pyc"):
            stale.unlink()
    subprocess.run(
        [str(venv / "bin/dra-driver"), "--version"], check=True, env=build_env, stdout=out
    )
    (venv / ".complete").write_text(str(tree) + "\n")


def stdlib(venv: Path) -> str:
    where = "import sysconfig; print(sysconfig.get_path('stdlib'))"
    return subprocess.run(
        [str(venv / "bin/python"), "-c", where], capture_output=True, text=True, check=True
    ).stdout.strip()


def agent_command(venv: Path) -> list[str]:
    """The image's entry point (``ENTRYPOINT ["dra-driver"]``), from the venv."""
    return [str(venv / "bin/dra-driver")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=REPO, help="the source tree to install")
    parser.add_argument("--bytecode", choices=("image", "pip"), default="image")
    args = parser.parse_args(argv)
    venv = runtime_venv(args.tree, bytecode=args.bytecode, quiet=False)
    print(venv)
    for key, value in sorted(image_env(args.tree).items()):
        print(f"  {key}={value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
