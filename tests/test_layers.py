"""Layers point one way: no import cycle between olingo's packages, `olingo/ray`
never imports the recipes, the trainer never imports the experiment layer, and only the ray
package imports ray. Every import counts, also one inside a function."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import olingo

ROOT = Path(olingo.__file__).parent


def package_of(module: str) -> str:
    """'olingo.trainer.callbacks.base' -> 'trainer'; 'olingo.errors' -> 'errors'."""
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


def olingo_imports_of(package: str) -> dict[str, set[str]]:
    """Module -> the olingo modules it imports, for every module of `package`."""
    return {
        module: {name for name in imported if name == "olingo" or name.startswith("olingo.")}
        for module, imported in module_imports().items()
        if package_of(module) == package
    }


def test_the_rl_maths_is_pure_torch():
    """olingo/rl imports nothing of olingo but itself: no model, config or I/O in the maths."""
    rl = olingo_imports_of("rl")
    assert {f"olingo.rl.{n}" for n in ("kl", "advantages", "policy_loss", "preference")} <= set(rl)
    for module, imported in rl.items():
        assert {package_of(name) for name in imported} <= {"rl"}, (module, imported)


def test_reward_programs_import_no_task_and_tasks_are_the_bottom_layer():
    """The demo task's rewards live with the task, which the rewards name by import path only."""
    rewards = olingo_imports_of("rewards")
    assert {"olingo.rewards.registry", "olingo.rewards.verifiers"} <= rewards.keys()
    for module, imported in rewards.items():
        assert not any(package_of(name) == "tasks" for name in imported), (module, imported)
    for module, imported in olingo_imports_of("tasks").items():
        assert {package_of(name) for name in imported} <= {"tasks"}, (module, imported)


def test_models_reach_the_rl_maths_only_through_the_colossalchat_loss_names():
    """models/loss.py re-exports ColossalChat's loss classes from olingo.rl; nothing else in
    models uses the RL maths, and the maths never uses models."""
    models = olingo_imports_of("models")
    users = {module for module, imported in models.items() if "rl" in map(package_of, imported)}
    assert users == {"olingo.models.loss"}
    assert "models" not in package_graph()["rl"]


def test_no_private_named_module_is_imported_from_another_package():
    """A module whose name starts with '_' is its package's business only."""
    for module, imported in module_imports().items():
        for name in imported:
            parts = name.split(".")
            private = parts[0] == "olingo" and any(part.startswith("_") for part in parts[1:])
            assert not (private and package_of(name) != package_of(module)), (module, name)


def test_plan_and_report_sit_beside_the_cli_that_uses_them():
    moved = {f"olingo.cli.{name}" for name in ("plan", "report", "report_series", "report_figures", "report_experiment")}
    users = {module for module, imported in module_imports().items() if moved & imported}
    assert users and all(package_of(module) == "cli" for module in users), users
