"""The layering rule, enforced: the driver core (discovery, slices, preparation, CDI, checkpoint)
and the API machinery below it import neither gRPC nor protobuf nor the Kubernetes client, not
even through one of our own modules; the allocation layer imports neither gRPC nor the client,
and reaches protobuf only through its CEL engine (cel-expr-python's values are protobuf
messages). Two checks: the static import graph of our sources (every ``import``, also inside
functions, followed through our own modules, the chain shown on failure), and what importing
each layer really loads in a fresh interpreter. And the folders' imports run one way: no folder
(package directory) imports a folder that imports it back, at the first level under
``dra_driver/`` and for every nested folder; a module directly in ``dra_driver/`` counts as a
folder of its own."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dra_driver"
GRPC, PROTOBUF, CLIENT = "grpc", "google.protobuf", "kubernetes"
CORE = ("devices", "slices", "driver", "apimachinery")
# Our own adapter packages: the gRPC servers and stubs, and the Kubernetes client wrapper.
ADAPTERS = (
    "dra_driver.pb",
    "dra_driver.kubelet",
    "dra_driver.deviceplugin",
    "dra_driver.kube.client",
)
# Where the allocation layer may reach protobuf: its CEL environment, nothing else.
CEL_ENGINE = "dra_driver.allocation.cel_env"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def sources() -> dict[str, Path]:
    return {
        module_name(p): p
        for p in PACKAGE.rglob("*.py")
        if "pb" not in p.relative_to(PACKAGE).parts[:1]
    }


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = importer.split(".")
    is_package = sources()[importer].name == "__init__.py"
    base = package if is_package else package[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


@functools.cache
def imports(module: str) -> frozenset[str]:
    """Everything ``module`` imports (modules, not attributes), ``TYPE_CHECKING`` included."""
    tree = ast.parse(sources()[module].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            found.add(base)
            for alias in node.names:  # ``from pkg import module``
                if f"{base}.{alias.name}" in sources():
                    found.add(f"{base}.{alias.name}")
    return frozenset(found)


def chains(start: str) -> dict[str, list[str]]:
    """Every module reachable from ``start`` (ours and third-party), with one import chain."""
    seen: dict[str, list[str]] = {start: [start]}
    todo = [start]
    while todo:
        current = todo.pop()
        for target in sorted(imports(current)):
            if target in seen:
                continue
            seen[target] = [*seen[current], target]
            if target in sources():
                todo.append(target)
    return seen


def layer_modules(package: str) -> list[str]:
    return sorted(m for m in sources() if m == package or m.startswith(package + "."))


def offenders(reach: dict[str, list[str]], banned: tuple[str, ...]) -> list[str]:
    return [
        " -> ".join(chain)
        for target, chain in reach.items()
        if any(target == b or target.startswith(b + ".") for b in banned)
    ]


@pytest.mark.parametrize("layer", CORE)
def test_core_imports_no_grpc_protobuf_or_kubernetes_client(layer: str) -> None:
    modules = layer_modules(f"dra_driver.{layer}")
    assert modules, layer
    bad = [
        chain
        for module in modules
        for chain in offenders(chains(module), (GRPC, PROTOBUF, CLIENT, *ADAPTERS))
    ]
    assert bad == [], "the driver core must not import these:\n" + "\n".join(bad)


def test_allocation_imports_no_grpc_or_client_and_protobuf_only_for_cel() -> None:
    bad = []
    for module in layer_modules("dra_driver.allocation"):
        reach = chains(module)
        bad += offenders(reach, (GRPC, CLIENT, *ADAPTERS))
        bad += [c for c in offenders(reach, (PROTOBUF,)) if CEL_ENGINE not in c.split(" -> ")[-2:]]
    assert bad == [], "\n".join(bad)


def test_the_graph_sees_imports_inside_functions_and_follows_our_modules() -> None:
    # The checks above are only as good as the graph: some imports are made lazily.
    assert "dra_driver.devices.nvml" in imports("dra_driver.cli.common")  # inside a function
    assert "google.protobuf" in chains(CEL_ENGINE)
    assert offenders(chains("dra_driver.kubelet.server"), (GRPC,))


LOADED = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("grpc", "kubernetes")
                        or m.startswith("google.protobuf"))))
"""


@pytest.mark.parametrize("layer", CORE)
def test_importing_the_core_loads_none_of_them(layer: str) -> None:
    modules = layer_modules(f"dra_driver.{layer}")
    out = subprocess.run(
        [sys.executable, "-c", LOADED, *modules],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == []


# ---------------------------------------------------------------------- product and test kit
KIT = "dra_driver.testing"
# Who may use the kit: the kit itself and the demo (it runs the node pipeline against the
# in-memory API server and the kubelet stand-in), through ``dra-driver demo``, and the
# development stand-in cluster of ``dra-driver dev-cluster``.
KIT_USERS = (
    "dra_driver.testing",
    "dra_driver.demo",
    "dra_driver.cli.demo",
    "dra_driver.cli.dev_cluster",
)
# What runs in a node agent or a controller: none of it may load the kit, not even indirectly.
AGENT_ENTRIES = (
    "dra_driver.app",
    "dra_driver.cli.kubelet_plugin",
    "dra_driver.cli.device_plugin",
    "dra_driver.cli.publish",
    "dra_driver.cli.labels",
    "dra_driver.deviceplugin.app",
    "dra_driver.kubelet.server",
)


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def kit_importers(modules: dict[str, frozenset[str]]) -> list[str]:
    """``module -> kit module`` for every product module that imports the kit directly."""
    return sorted(
        f"{m} -> {t}"
        for m, targets in modules.items()
        if not _within(m, KIT_USERS)
        for t in targets
        if _within(t, (KIT,))
    )


def test_product_modules_never_import_the_test_kit() -> None:
    assert kit_importers({m: imports(m) for m in sources()}) == []
    bad = [chain for entry in AGENT_ENTRIES for chain in offenders(chains(entry), (KIT,))]
    assert bad == [], "a node agent would load the test kit:\n" + "\n".join(bad)


def test_kit_rule_catches_a_product_import() -> None:
    graph = {m: imports(m) for m in sources()}
    graph["dra_driver.driver.claims"] = graph["dra_driver.driver.claims"] | {
        "dra_driver.testing.fakeapi.memory"
    }
    assert kit_importers(graph) == ["dra_driver.driver.claims -> dra_driver.testing.fakeapi.memory"]


def import_graph() -> dict[str, list[str]]:
    """Our modules and the modules of ours each imports, without a module's own ancestor
    packages (``from pkg import sibling`` runs ``pkg/__init__``, which may import its
    submodules: Python's package pattern, not a cycle between modules)."""
    src = sources()
    return {
        m: sorted(t for t in imports(m) if t in src and t != m and not m.startswith(t + "."))
        for m in src
    }


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(graph.get(step, ()))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycles_in_the_package() -> None:
    assert cycles(import_graph()) == []


def test_cycle_rule_catches_a_cycle() -> None:
    graph = import_graph()
    assert "dra_driver.devices.model" in graph["dra_driver.devices.topology"]
    graph["dra_driver.devices.model"] = [
        *graph["dra_driver.devices.model"],
        "dra_driver.devices.topology",
    ]
    added = ["dra_driver.devices.model", "dra_driver.devices.topology"]
    assert added in cycles(graph)
    assert added not in cycles(import_graph())
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


# ---------------------------------------------------------------------- folders, one way
def folder_of(module: str, *, top: bool) -> str:
    """The folder (package directory) ``module`` lives in; with ``top`` the first-level folder
    under ``dra_driver/`` (``devices/fake/`` counts as ``devices/``). A module directly in
    ``dra_driver/`` (the composition roots: ``app``, ``pluginsettings``, ...) stands alone."""
    parts = module.split(".")
    package = parts if sources()[module].name == "__init__.py" else parts[:-1]
    if len(package) == 1:
        return module
    return ".".join(package[:2] if top else package)


def folder_cycles(graph: dict[str, list[str]], *, top: bool) -> list[str]:
    """Each group of folders that import each other, with the module imports that do it."""
    edges: dict[str, dict[str, list[str]]] = {}
    for module, targets in graph.items():
        here = folder_of(module, top=top)
        for target in targets:
            there = folder_of(target, top=top)
            if there != here:
                edges.setdefault(here, {}).setdefault(there, []).append(f"{module} -> {target}")
    folders = {f: sorted(t) for f, t in edges.items()}
    found = []
    for component in cycles(folders):
        inside = [
            line
            for here in component
            for there, lines in sorted(edges.get(here, {}).items())
            if there in component
            for line in sorted(lines)
        ]
        found.append(" <-> ".join(component) + ":\n  " + "\n  ".join(inside))
    return found


@pytest.mark.parametrize("top", [True, False], ids=["first-level-folders", "every-folder"])
def test_no_folder_imports_a_folder_that_imports_it_back(top: bool) -> None:
    found = folder_cycles(import_graph(), top=top)
    assert found == [], (
        "folders that import each other (each folder's imports must run one way, "
        "docs/architecture.md):\n" + "\n".join(found)
    )


def test_folder_rule_catches_a_back_import() -> None:
    graph = import_graph()
    assert "dra_driver.kube.api" in graph["dra_driver.slices.publisher"]  # slices -> kube
    graph["dra_driver.kube.features"] = [
        *graph["dra_driver.kube.features"],
        "dra_driver.slices.validate",
    ]
    (found,) = folder_cycles(graph, top=True)
    assert found.startswith("dra_driver.kube <-> dra_driver.slices:\n")
    assert "  dra_driver.kube.features -> dra_driver.slices.validate\n" in found
    assert "  dra_driver.slices.publisher -> dra_driver.kube.api" in found
    # Root modules stand alone: app importing everything is no cycle; a root module and a
    # folder importing each other is.
    graph = import_graph()
    graph["dra_driver.computedomain.monitor"] = [
        *graph["dra_driver.computedomain.monitor"],
        "dra_driver.pluginsettings",
    ]
    assert folder_cycles(import_graph(), top=False) == []
    assert [f.split(":")[0] for f in folder_cycles(graph, top=False)] == [
        "dra_driver.computedomain <-> dra_driver.pluginsettings"
    ]


# ---------------------------------------------------------------------- the MPS package
MPS = "dra_driver.driver.mps"


def mps_importers(graph: dict[str, frozenset[str]]) -> list[str]:
    """``module -> MPS module`` for every module of the driver core importing ``driver/mps/``."""
    return sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if _within(m, ("dra_driver.driver",)) and not _within(m, (MPS,))
        for t in targets
        if _within(t, (MPS,))
    )


def test_the_driver_core_reaches_mps_only_through_its_interface() -> None:
    """``driver/mps/`` builds on the driver core; the core imports none of it, not even for
    types: the composition root hands it an ``MpsPart`` (``driver/mpspart.py``)."""
    graph = {m: imports(m) for m in sources()}
    assert mps_importers(graph) == []
    assert "dra_driver.driver.mpspart" in graph["dra_driver.driver.state"]
    assert graph[MPS] == frozenset()  # the package's __init__: lazymps loads alone
    graph["dra_driver.driver.state"] |= {f"{MPS}.lazymps"}
    assert mps_importers(graph) == [f"dra_driver.driver.state -> {MPS}.lazymps"]
