"""Layers point one way (DESIGN.md §3): no import cycle between olingo's packages, `olingo/ray`
never imports the recipes, the trainer never imports the experiment layer, and only the ray
package imports ray. Every import counts, also one inside a function."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import olingo

ROOT = Path(olingo.__file__).parent


def package_of(module: str) -> str:
    """'olingo.trainer.callbacks.base' -> 'trainer'; 'olingo.report' -> 'report'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, top level or inside functions, absolute names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def module_imports() -> dict[str, set[str]]:
    graph = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("olingo", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
        graph[name] = imports_of(path)
    return graph


def package_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, imported in module_imports().items():
        for target in imported:
            if target.startswith("olingo.") and package_of(target) != package_of(module):
                edges[package_of(module)].add(package_of(target))
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [node])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node, [])):
            return cycle
    return None


def test_no_import_cycle_between_packages():
    assert find_cycle(package_graph()) is None, find_cycle(package_graph())


def test_ray_never_imports_recipes_and_trainer_never_imports_experiment():
    graph = package_graph()
    assert "recipes" not in graph["ray"]
    assert "experiment" not in graph["trainer"]
    assert not {"recipes", "experiment", "cli", "report"} & graph["trainer"]


def test_only_the_ray_package_imports_ray():
    for module, imported in module_imports().items():
        if package_of(module) != "ray":
            assert not any(name == "ray" or name.startswith("ray.") for name in imported), module


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
