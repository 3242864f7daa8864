"""The house rules of ARCHITECTURE.md and STANDARDS, checked: arrows point down, each service in its room, no network."""

from __future__ import annotations

import ast
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
