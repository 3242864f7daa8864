"""Model families, one folder each: `<folder>/__init__.py` names its families (`FAMILIES = {name: class}`, nothing
heavy imported), `family.py` holds the `Family` subclasses, `tiny.py` the tiny pipeline builders and `real_size.py`
the published variants `unirl plan` builds on the meta device. `unirl_core.models.registry` finds every folder here:
adding a family is adding a folder."""
