"""Layers that only look down: the import graph between dynamics' top-level packages.

Every module under ``src/dynamics`` is parsed with ``ast`` (nothing is imported), and each
``import`` / ``from ... import`` of a dynamics module, at module level or inside a function,
is an arrow from the importing package to the imported one. The packages, lowest first:

    core < data < runs < engine < integrations < experiments < report < commands < cli

``core`` is the method in numpy and scipy and imports no other dynamics package; ``cli``
is the command line and nothing imports it. An arrow may only point to a lower package,
except for the few listed in ``KNOWN_UPWARD`` with their reason. ``python -m
tests.test_layers`` prints the graph.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dynamics"

LAYERS = (
    "core",
    "data",
    "runs",
    "engine",
    "integrations",
    "experiments",
    "report",
    "commands",
    "cli",
)
"""Top-level packages (and the ``cli`` module), lowest first."""

KNOWN_UPWARD: dict[tuple[str, str], str] = {
    (
        "dynamics.experiments.demo",
        "report",
    ): "the demo writes its report (report.demo) once its runs finish",
    (
        "dynamics.experiments.sweep",
        "report",
    ): "a sweep labels its runs with report.sweep.method_label, the labels its report groups by",
}
"""(importing module, imported package) -> why this arrow points up."""

CORE_THIRD_PARTY = {"numpy", "scipy", "threadpoolctl"}
"""What ``core`` may import besides the standard library
(threadpoolctl caps BLAS threads in the solver)."""


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. dynamics.engine.run
    target: str  # the imported module or name, e.g. dynamics.core.solver
    names: tuple[str, ...]  # the names of a ``from target import ...``; empty for ``import``
    where: str  # path:line

    @property
    def source_package(self) -> str:
        return package_of(self.module)

    @property
    def target_package(self) -> str:
        return package_of(self.target)


def package_of(module: str) -> str:
    """The top-level package of ``dynamics.<package>...``; "" for ``dynamics`` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path, src: Path) -> str:
    parts = path.relative_to(src.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(src: Path = SRC) -> list[Import]:
    """Every import statement of every module under ``src`` (the dynamics package folder)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        module = module_name(path, src)
        where = str(path.relative_to(src.parent.parent))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found += [
                    Import(module, alias.name, (), f"{where}:{node.lineno}") for alias in node.names
                ]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the importing module's package upwards
                    package = (
                        module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    )
                    base = package[: len(package) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                names = tuple(alias.name for alias in node.names)
                found.append(Import(module, target, names, f"{where}:{node.lineno}"))
    return found


def internal(found: list[Import]) -> list[Import]:
    """The imports of dynamics modules from another top-level package."""
    return [
        imp
        for imp in found
        if imp.target.split(".")[0] == "dynamics"
        and imp.source_package
        and imp.target_package
        and imp.source_package != imp.target_package
    ]


def package_graph(found: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in internal(found):
        graph[imp.source_package].add(imp.target_package)
    return dict(graph)


def format_graph(graph: dict[str, set[str]]) -> str:
    order = {name: k for k, name in enumerate(LAYERS)}
    rows = []
    for source in sorted(graph, key=lambda p: order.get(p, -1)):
        targets = sorted(graph[source], key=lambda p: order.get(p, -1))
        rows.append(f"  {source} -> {', '.join(targets)}")
    return "\n".join(rows)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each package that lies on a cycle (as a path that returns to its start)."""
    found = []
    for start in sorted(graph):
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    found.append([*path, start])
                    stack = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return found


def upward(found: list[Import]) -> list[Import]:
    """Imports of a package that is not lower in ``LAYERS`` than the importing one."""
    order = {name: k for k, name in enumerate(LAYERS)}
    return [imp for imp in internal(found) if order[imp.target_package] > order[imp.source_package]]


def private_imports(found: list[Import]) -> list[Import]:
    """``from dynamics.x import _name`` (or a private module):
    a private name used by another module."""

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    return [
        imp
        for imp in found
        if imp.target.split(".")[0] == "dynamics"
        and (
            any(private(part) for part in imp.target.split("."))
            or any(private(n) for n in imp.names)
        )
    ]


def test_every_top_level_package_has_a_layer() -> None:
    top = {
        p.stem
        for p in SRC.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"
    }
    missing = sorted(top - set(LAYERS) - {"__init__"})
    assert not missing, (
        f"add {missing} to LAYERS in tests/test_layers.py, at its place in the order"
    )
    assert set(LAYERS) <= top, (
        f"LAYERS names packages that do not exist: {sorted(set(LAYERS) - top)}"
    )


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph(imports())
    print("import graph between dynamics packages:\n" + format_graph(graph))
    found = cycles(graph)
    assert not found, (
        "import cycles between packages:\n"
        + "\n".join("  " + " -> ".join(cycle) for cycle in found)
        + "\nthe graph:\n"
        + format_graph(graph)
    )


def test_packages_only_import_lower_layers() -> None:
    found = imports()
    violations = [
        imp for imp in upward(found) if (imp.module, imp.target_package) not in KNOWN_UPWARD
    ]
    assert not violations, (
        f"imports against the layer order {' < '.join(LAYERS)}:\n"
        + "\n".join(
            f"  {imp.where}: {imp.source_package} imports {imp.target}" for imp in violations
        )
        + "\nmove the shared code to a lower package (or, with a reason, add it to KNOWN_UPWARD)"
    )
    used = {(imp.module, imp.target_package) for imp in upward(found)}
    stale = sorted(set(KNOWN_UPWARD) - used)
    assert not stale, f"KNOWN_UPWARD lists arrows that no longer exist; remove them: {stale}"


def test_core_imports_only_numpy_and_scipy() -> None:
    outside = [
        imp
        for imp in imports()
        if imp.source_package == "core"
        and (root := imp.target.split(".")[0]) not in sys.stdlib_module_names
        and root not in CORE_THIRD_PARTY | {"dynamics"}
    ]
    assert not outside, "core imports beyond numpy and scipy:\n" + "\n".join(
        f"  {imp.where}: {imp.target}" for imp in outside
    )


def test_no_private_name_is_imported_from_another_module() -> None:
    found = private_imports(imports())
    assert not found, (
        "private names imported from another module (make them public or move them):\n"
        + "\n".join(
            f"  {imp.where}: from {imp.target} import {', '.join(imp.names)}" for imp in found
        )
    )


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """An upward import, a cycle and a private import in a made-up package are all caught."""
    src = tmp_path / "dynamics"
    for package, text in {
        "core": "from dynamics.engine.model import build\n",
        "engine": "from dynamics.core.solver import _grid\n",
    }.items():
        (src / package).mkdir(parents=True)
        (src / package / "__init__.py").write_text("")
        (src / package / "mod.py").write_text(text)
    found = imports(src)
    assert cycles(package_graph(found)) == [
        ["core", "engine", "core"],
        ["engine", "core", "engine"],
    ]
    assert [(imp.module, imp.target) for imp in upward(found)] == [
        ("dynamics.core.mod", "dynamics.engine.model")
    ]
    assert [imp.names for imp in private_imports(found)] == [("_grid",)]


if __name__ == "__main__":
    print(format_graph(package_graph(imports())))
    for imp in upward(imports()):
        print(f"upward: {imp.where}: {imp.source_package} imports {imp.target}")
