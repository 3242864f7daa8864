"""Real model sizes without weights: each variant's components as published (class and config), built on the meta
device by `unirl plan` to count parameters and estimate memory, in seconds and without a download.

    meta_pipeline("sd3.5-medium")     -> {"transformer": <meta SD3Transformer2DModel>, "text_encoder": ..., ...}
    meta_pipeline("/models/flux-dev") -> the same from a pipeline folder's config.json files (no weights read)

The configs are the published `config.json` values of each component (Hugging Face model repos); the parameter
counts they give are checked against the published totals in tests/unit/test_memory_plan.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def _variants() -> dict[str, dict]:
    """Every family folder's `real_size.VARIANTS`: variant -> family, components {name: (library, class, config
    class or None, config)}, conditioning tokens (the text's; `reference_image`: an edit model's condition image adds
    as many tokens as the image)."""
    import importlib
    import pkgutil

    from unirl_core.models import families

    found: dict[str, dict] = {}
    for folder in pkgutil.iter_modules(families.__path__):
        if folder.ispkg and importlib.util.find_spec(f"{families.__name__}.{folder.name}.real_size"):
            found |= importlib.import_module(f"{families.__name__}.{folder.name}.real_size").VARIANTS
    return found


VARIANTS = _variants()


class UnknownVariantError(ValueError):
    """A variant name that is not in VARIANTS (and not a pipeline folder)."""


def variant_names(family: str | None = None) -> list[str]:
    return sorted(name for name, v in VARIANTS.items() if family is None or v["family"] == family)


def _build(library: str, class_name: str, config_class: str | None, config) -> torch.nn.Module:
    if isinstance(config, tuple):  # ("family", name, variant): the family file's published config
        from unirl_core.models.registry import family_class

        config = family_class(config[1]).denoiser_configs[config[2]]
    module = __import__(library)
    cls = getattr(module, class_name)
    if library == "transformers":
        return cls(getattr(module, config_class)(**config))
    return cls.from_config(config)


def meta_pipeline(source: str) -> dict[str, torch.nn.Module]:
    """The components (nn.Modules only) of a variant, or of a pipeline folder from its configs, on the meta device."""
    if source in VARIANTS:
        specs = VARIANTS[source]["components"]
    elif (Path(source) / "model_index.json").is_file():
        specs = _folder_specs(Path(source))
    else:
        raise UnknownVariantError(
            f"model {source!r} is neither a pipeline folder (with model_index.json) nor a known variant; "
            f"variants: {', '.join(variant_names())}"
        )
    with torch.device("meta"):
        return {name: _build(*spec) for name, spec in specs.items()}


def _folder_specs(folder: Path) -> dict[str, tuple]:
    import transformers

    specs = {}
    for name, entry in json.loads((folder / "model_index.json").read_text()).items():
        if not (isinstance(entry, list) and entry[0] in ("diffusers", "transformers") and entry[1]):
            continue
        library, class_name = entry
        config_file = folder / name / "config.json"
        if not config_file.is_file():
            continue  # tokenizers, schedulers, processors: no weights
        if library == "transformers":
            config = transformers.AutoConfig.from_pretrained(str(folder / name))
            specs[name] = (library, class_name, type(config).__name__, config.to_diff_dict())
        else:
            config = json.loads(config_file.read_text())
            specs[name] = (library, class_name, None, {k: v for k, v in config.items() if not k.startswith("_")})
    return specs


def parameter_count(module: torch.nn.Module) -> int:
    """Parameters plus buffers (fixed position embeddings are buffers and take memory too)."""
    return sum(p.numel() for p in module.parameters()) + sum(b.numel() for b in module.buffers())
