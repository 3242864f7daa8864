"""The docs stay true (tools/docs.py): the generated pages (docs/index.md from the README, the command and recipe
references) equal what the code gives now; the README and the written pages name only `unirl` commands, recipe keys,
files and test functions that exist; the site builds in mkdocs' strict mode (every page in the nav, every link and
anchor resolves)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import docs  # noqa: E402


def test_generated_pages_equal_what_the_code_gives_now():
    stale = [name for name, build in docs.PAGES.items() if (docs.DOCS / name).read_text(encoding="utf-8") != build()]
    assert not stale, f"stale generated docs: {stale}; run `make docs`"


def test_readme_and_docs_name_only_commands_keys_files_and_tests_that_exist():
    assert docs.stale_references() == []


def test_a_page_naming_what_does_not_exist_is_caught(monkeypatch):
    page = ROOT / "docs" / ".test-stale-page.md"  # in the repository: paths are resolved against it
    page.write_text(
        "Run `unirl trian demo`, `unirl bagel exprt t2i` or `unirl train demo --set train.sampling.hieght=64`;\n"
        "see `unirl_core/no_such.py` and `tests/unit/test_docs.py::test_that_was_renamed`.\n"
        "```bash\nunirl validate demo --set train.reward.weights.clip_score=1 --set precache.encodings.0.key=x\n```\n"
    )
    monkeypatch.setattr(docs, "WRITTEN", [page])
    try:
        found = docs.stale_references()
    finally:
        page.unlink()
    name = "docs/.test-stale-page.md"
    assert found == [
        f"{name}: `tests/unit/test_docs.py::test_that_was_renamed` is not a test there",
        f"{name}: `unirl bagel exprt` is not a command",
        f"{name}: `unirl trian` is not a command",
        f"{name}: `unirl_core/no_such.py` does not exist",
        f"{name}: recipe key `train.sampling.hieght` does not exist",
    ], found  # the open keys (reward weights, list items) and the real commands pass


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    result = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "recipe" / "index.html").is_file()
