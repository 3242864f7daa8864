"""A family is one folder under `unirl_core/models/families/`: the registry finds its names there (`FAMILIES` in its
`__init__.py`), its tiny builder and its real-size variants beside it, and no central list is edited. A folder
added at test time (on the package's search path, as a new folder in the source tree is) is found the same way."""

from __future__ import annotations

import importlib
import sys

from unirl_core.models import families


def test_every_built_in_family_lives_in_its_folder_with_its_tiny_builder_and_variants():
    from unirl_core.models.real_sizes import VARIANTS
    from unirl_core.models.registry import BUILT_IN, family_class

    assert len(BUILT_IN) == 14
    for name, target in BUILT_IN.items():
        cls = family_class(name)
        folder = target.split(":")[0].rsplit(".", 1)[0]  # unirl_core.models.families.<folder>
        assert cls.__module__ == f"{folder}.family" and cls.name == name
        assert importlib.util.find_spec(f"{folder}.tiny") is not None
    assert {v["family"] for v in VARIANTS.values()} == set(BUILT_IN)  # every family has a published variant


def test_a_new_folder_is_found_without_editing_any_list(tmp_path, monkeypatch):
    from unirl_core.models import registry

    folder = tmp_path / "my_sd3"
    folder.mkdir()
    (folder / "__init__.py").write_text('FAMILIES = {"my_sd3": "MySD3Family"}\n')
    (folder / "family.py").write_text(
        "from unirl_core.models.families.sd3.family import SD3Family\n\n\n"
        'class MySD3Family(SD3Family):\n    name = "my_sd3"\n'
    )
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    monkeypatch.setitem(registry.BUILT_IN, "my_sd3", registry._discover()["my_sd3"])
    try:
        cls = registry.family_class("my_sd3")
        assert cls.__name__ == "MySD3Family" and "my_sd3" in registry.family_names()
    finally:
        for module in [m for m in sys.modules if m.startswith("unirl_core.models.families.my_sd3")]:
            del sys.modules[module]
