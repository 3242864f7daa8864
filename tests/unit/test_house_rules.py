"""The house rules of ARCHITECTURE.md and STANDARDS, checked: arrows point down, each service in its room, no network."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "unirl_core"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def offenders(top_level: str, allowed_room: str | None = None) -> list[str]:
    found = []
    for path in CORE.rglob("*.py"):
        room = path.relative_to(CORE).parts[0]
        if top_level in imported_modules(path) and room != allowed_room:
            found.append(str(path.relative_to(CORE)))
    return found


def test_core_never_imports_prefect_flows_or_tasks():
    assert sorted(CORE.rglob("*.py")), "the scan must see the core's files"
    assert offenders("prefect") == []
    assert offenders("flows") == []
    assert offenders("tasks") == []


def test_ray_and_mlflow_live_in_their_rooms():
    assert offenders("ray", allowed_room="distributed") == []
    assert offenders("mlflow", allowed_room="tracking") == []
    # the scan does see them where they belong
    assert "distributed/cluster.py" in offenders("ray")
    assert "tracking/mlflow_runs.py" in offenders("mlflow")


def test_tests_cannot_reach_the_network():
    import socket

    import pytest

    with socket.socket() as s, pytest.raises(RuntimeError, match="tests never download anything"):
        s.connect(("93.184.216.34", 443))


def module_name(path: Path, root: Path) -> str:
    """unirl_core/models/family.py -> unirl_core.models.family; a package's __init__.py -> the package."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str]):
    """The package's modules one import statement names: `import a.b` -> a.b; `from a import n` -> a.n where that is
    a module, else a (n is defined in a's __init__); relative imports resolved against the importer's package."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the package at `root` that it imports anywhere in its file: at module level, inside
    functions, under `if TYPE_CHECKING:`. Imports from outside the package are left out, and so is the implicit run of
    a parent package's __init__ when a submodule is imported (a package being initialised is not a dependency)."""
    files = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    modules, graph = set(files), {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[module].update(imported_targets(node, module, is_package, modules))
        graph[module] = {target for target in graph[module] if target in modules and target != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete cycle per strongly connected group of modules (a group of two or more imports itself in a
    circle), each starting at its smallest module name; [] when the graph has no cycle."""
    cycles = []
    for group in strongly_connected(graph):
        if len(group) < 2:
            continue
        subgraph = {module: sorted(graph[module] & group) for module in sorted(group)}  # sorted: the same cycle
        try:
            graphlib.TopologicalSorter(subgraph).prepare()
        except graphlib.CycleError as error:
            cycle = error.args[1][:0:-1]  # graphlib: [a, ..., a], each an import *of* the next: reversed
            start = cycle.index(min(cycle))
            cycles.append(cycle[start:] + cycle[:start])
    return sorted(cycles)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while not group or node not in group:
                group.add(stack.pop())
            on_stack.difference_update(group)
            groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_core_has_no_import_cycles():
    graph = import_graph(CORE)
    # the scan sees module-level and function-level imports
    assert "unirl_core.models.family" in graph["unirl_core.models.registry"]
    assert "unirl_core.workspace" in graph["unirl_core.models.registry"]  # inside resolve_model_path
    cycles = import_cycles(graph)
    groups = sorted(sorted(group) for group in strongly_connected(graph) if len(group) > 1)
    assert cycles == [], (
        "import cycles in unirl_core:\n"
        + "\n".join(" -> ".join([*cycle, cycle[0]]) for cycle in cycles)
        + f"\nmodules in a circle with one another: {groups}"
    )


def test_the_cycle_check_finds_a_circle_through_function_level_and_relative_imports(tmp_path):
    files = {
        "__init__.py": "VERSION = 1\n",
        "a.py": "from pkg import b\n",  # a name that is a submodule: an import of pkg.b
        "b.py": "def step():\n    from .sub.c import finish\n    return finish()\n",  # function level, relative
        "sub/__init__.py": "",
        "sub/c.py": "from .. import VERSION\n\ndef finish():\n    import pkg.a\n    return pkg.a\n",
        "d.py": "import os\nfrom . import a\n",  # imports into the circle, not part of it
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    graph = import_graph(tmp_path / "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg", "pkg.a"},
        "pkg.d": {"pkg.a"},
    }
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    (tmp_path / "pkg" / "sub" / "c.py").write_text("def finish():\n    return 1\n")
    assert import_cycles(import_graph(tmp_path / "pkg")) == []


def test_every_flow_takes_its_decorator_from_flows_engine():
    """flows/engine.py changes Prefect's engine for every flow; a flow module that took `flow` from prefect would
    still get the change, but only if another module imported flows.engine first."""
    flows = CORE.parent / "flows"
    assert len([p for p in flows.glob("*.py") if "@flow" in p.read_text()]) >= 5, "the scan must see the flows"
    direct = []
    for path in flows.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("prefect", "prefect.flows") and node.level == 0:
                direct += [f"{path.name}: from {node.module} import flow" for a in node.names if a.name == "flow"]
            elif isinstance(node, ast.Attribute) and node.attr == "flow" and getattr(node.value, "id", "") == "prefect":
                direct.append(f"{path.name}: prefect.flow")
    assert direct == ["engine.py: from prefect import flow"]  # the one place


# --- algorithms are looked up in their registry, never compared by name -------------------------------------------


def algorithm_name_comparisons(path: Path, names: set[str]) -> list[str]:
    """`file:line` of each comparison in `path` that tests an algorithm's name: a compared `.name` of anything
    called `algorithm` (`algorithm.name == ...`, `config.algorithm.name in {...}`), or a compared string (or set,
    tuple, list of strings) that is a built-in algorithm's name."""

    def names_algorithm(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "name" and "algorithm" in ast.unparse(node.value)

    def is_algorithm_literal(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, ast.Set | ast.Tuple | ast.List):
            return any(is_algorithm_literal(e) for e in node.elts)
        return False

    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare) and any(
            names_algorithm(side) or is_algorithm_literal(side) for side in [node.left, *node.comparators]
        ):
            found.append(f"{path}:{node.lineno}")
    return found


def test_no_algorithm_name_is_compared_outside_the_registry():
    """The loop reads an algorithm's capabilities (`unirl_core/algorithms/base.py`); a name compared elsewhere is a
    branch a new algorithm cannot reach without editing the core."""
    from unirl_core.algorithms.registry import BUILT_IN

    root = CORE.parent
    files = [p for top in ("unirl_core", "flows", "tasks") for p in sorted((root / top).rglob("*.py"))]
    allowed = {CORE / "algorithms" / "registry.py"}
    found = [hit for path in files if path not in allowed for hit in algorithm_name_comparisons(path, set(BUILT_IN))]
    assert found == []


def test_the_name_comparison_rule_sees_each_form(tmp_path):
    source = tmp_path / "branchy.py"
    source.write_text(
        'if config.algorithm.name == "x":\n    pass\n'
        "if algorithm.name in SINGLE_UPDATE:\n    pass\n"
        'y = name in {"mixgrpo", "other"}\n'
        'z = sampler == "cps"\n'  # a sampler, not an algorithm: allowed
    )
    assert algorithm_name_comparisons(source, {"mixgrpo", "grpo"}) == [f"{source}:1", f"{source}:3", f"{source}:5"]


TRAINING_CORE = ("controller", "worker", "domains", "algorithms", "distributed")
LONGEST_FUNCTION = 45  # lines, decorators and docstring included


def test_the_training_cores_functions_stay_short():
    """A function of the training core that outgrows a screen is split (issue 34's bound: under 45 lines)."""
    long = []
    for folder in TRAINING_CORE:
        for path in sorted((CORE / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (
                        node.end_lineno - (node.decorator_list[0].lineno if node.decorator_list else node.lineno) + 1
                    )
                    if lines >= LONGEST_FUNCTION:
                        long.append(f"{path.relative_to(CORE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], long


def test_the_quick_loop_selects_no_test_that_starts_a_service():
    """tests/conftest.py marks `slow` every test whose fixtures start a Prefect harness or a local Ray: the training
    rounds' file carries no mark of its own, and the quick loop (`-m "not slow"`) selects none of it."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/integration/test_train_rounds.py"],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "::" not in collected.stdout and "deselected" in collected.stdout, collected.stdout[-2000:]
    assert "pytestmark" not in (root / "tests/integration/test_train_rounds.py").read_text()  # the hook's doing
