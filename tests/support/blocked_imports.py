"""Run a command with some top-level packages unimportable, as on a machine that does not have them (a bare GPU node
without Ray or Prefect):

    python tests/support/blocked_imports.py ray,prefect -m flows.cli train demo --local
    python tests/support/blocked_imports.py ray,prefect -m pytest --collect-only -m gpu

Any `import ray` (or `ray.x`) raises ModuleNotFoundError, as it would there; the rest of the command runs as usual
(`-m module args...` or `script args...`)."""

from __future__ import annotations

import importlib.abc
import runpy
import sys


class Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked: not installed here)", name=fullname)
        return None


def main() -> None:
    names, *command = sys.argv[1:]
    sys.meta_path.insert(0, Blocker(set(names.split(","))))
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = command
        runpy.run_path(command[0], run_name="__main__")


if __name__ == "__main__":
    main()
