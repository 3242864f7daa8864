"""Model families by name: the recipe's `train.model.family` -> a `Family` subclass.

    family_class("sd3")                       -> SD3Family (built-ins are imported on first use)
    family_class("my_pkg.families:MyFamily")  -> a family in any importable module (Ray workers import it too)
    register(MyFamily)                        -> MyFamily under MyFamily.name, in this process
    build_family(model, sampling, device)     -> the loaded model the loop drives
    resolve_model_path("tiny:sd3")            -> a tiny pipeline folder in the workspace (built once)
    model_path_problems("sd3", path)          -> why `train.model.path` cannot load as the family's pipeline

Adding a family: one folder in `models/families/` (see its __init__.py); BUILT_IN finds it.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import torch

from unirl_core.models.family import Family
from unirl_core.models.parts.text import text_encoder_placement
from unirl_core.plugins import load_class


def _discover() -> dict[str, str]:
    """{family name: "module:Class"} of every family folder in `models/families/` (their `FAMILIES`)."""
    import pkgutil

    from unirl_core.models import families

    found = {}
    for folder in pkgutil.iter_modules(families.__path__):
        if folder.ispkg:
            package = importlib.import_module(f"{families.__name__}.{folder.name}")
            found |= {
                name: f"{package.__name__}.family:{cls}" for name, cls in getattr(package, "FAMILIES", {}).items()
            }
    return found


BUILT_IN = _discover()
_REGISTERED: dict[str, type[Family]] = {}


class UnknownFamilyError(ValueError):
    """A family name that is neither built in, registered, nor an importable `module:Class`."""


def register(cls: type[Family]) -> type[Family]:
    """Make `cls` available under `cls.name` in this process (usable as a class decorator)."""
    _REGISTERED[cls.name] = cls
    return cls


def family_names() -> list[str]:
    return sorted(set(BUILT_IN) | set(_REGISTERED))


def family_class(name: str) -> type[Family]:
    target = _REGISTERED.get(name) or BUILT_IN.get(name) or (name if ":" in name else None)
    if target is None:
        raise UnknownFamilyError(
            f"model family {name!r} is unknown: choose one of {', '.join(family_names())}, or name a Family "
            "subclass as 'package.module:ClassName'"
        )
    if isinstance(target, type):
        return target
    return load_class(target, Family, f"model family {name!r}", UnknownFamilyError)


def build_tiny_pipeline(family: str, seed: int = 0):
    """The tiny pipeline of `family`, its weights drawn from `seed` (same seed, same weights)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return family_class(family).build_tiny()


def write_tiny_model(out_dir: str | Path, family: str, seed: int = 0) -> Path:
    """Write a complete diffusers pipeline folder that `DiffusionPipeline.from_pretrained(out_dir)` loads (for a
    tiny causal LM of the autoregressive domain, `qwen3` or `qwen2`: a transformers model folder)."""
    from unirl_core.models.tiny_lm import TINY_LMS, write_tiny_lm

    if family in TINY_LMS:
        return write_tiny_lm(out_dir, family, seed)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new folder or remove it")
    build_tiny_pipeline(family, seed).save_pretrained(out, safe_serialization=True)
    return out


def resolve_model_path(path: str) -> str:
    """`tiny:<family>` -> a tiny pipeline (or causal LM: `tiny:qwen3`) folder in the workspace (built once); anything
    else is used as is."""
    if not path.startswith("tiny:"):
        return path
    from unirl_core.workspace import workspace

    family = path.split(":", 1)[1]
    folder = workspace().root / "models" / f"tiny-{family}-seed0"
    if not folder.exists():  # written aside, then renamed: ranks building at once never read a half-written folder
        import shutil
        import tempfile

        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                # transformers writes weights on rank 0 only once a process group exists: build in a fresh process
                import subprocess
                import sys

                code = "import sys; from unirl_core.models.registry import write_tiny_model as w; w(*sys.argv[1:])"
                subprocess.run([sys.executable, "-c", code, str(partial), family], check=True, capture_output=True)
            else:
                write_tiny_model(partial, family, seed=0)
            partial.chmod(0o755)  # mkdtemp made it private
            partial.rename(folder)
        except OSError:
            if not any((folder / name).exists() for name in ("model_index.json", "config.json")):  # not another
                # process's complete folder: a real error
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return str(folder)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
MODEL_PATH = "train.model.path"


def model_path_problems(family: str, path: str) -> list[str]:
    """Why `path` (the recipe's `train.model.path`) cannot load as `family`'s pipeline, from the folder's
    model_index.json and subfolders alone (no weights read, no diffusers import): `unirl validate` and a round's
    start report them. `tiny:<family>` must name the same family; a hub id must be in the local Hugging Face cache."""
    cls = family_class(family)
    expected = f"a diffusers {cls.pipeline_class} folder (model_index.json, {cls.denoiser_name}/, vae/, ...)"
    if path.startswith("tiny:"):
        tiny = path.split(":", 1)[1]
        if tiny != family:
            return [f"{MODEL_PATH}: {path!r} is the tiny {tiny} model but train.model.family is {family!r}; use "
                    f"tiny:{family}"]  # fmt: skip
        return []
    folder = Path(path).expanduser()
    if not folder.exists() and _HUB_ID.fullmatch(path):
        cached = _hub_snapshot(path)
        if cached is None:
            return [f"{MODEL_PATH}: {path!r} is neither a local folder nor in the Hugging Face cache; download it "
                    f"(`hf download {path} --local-dir DIR`) and set {MODEL_PATH} to DIR"]  # fmt: skip
        folder = cached
    if not folder.is_dir():
        return [f"{MODEL_PATH}: {path!r} is not a folder; point it at {expected}"]
    index = folder / "model_index.json"
    try:
        components = json.loads(index.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"{MODEL_PATH}: {path!r} has no model_index.json, so it is not {expected}"]
    except (OSError, ValueError) as exc:
        return [f"{MODEL_PATH}: {index} cannot be read as JSON ({exc})"]
    problems = []
    if components.get("_class_name") != cls.pipeline_class:
        problems.append(f"{MODEL_PATH}: {path!r} is a {components.get('_class_name')} folder but family {family!r} "
                        f"loads {cls.pipeline_class}; set train.model.family to the folder's family")  # fmt: skip
    listed = {name for name, spec in components.items() if isinstance(spec, list) and spec and spec[0] is not None}
    missing = sorted({cls.denoiser_name} - set(components)) + sorted(n for n in listed if not (folder / n).is_dir())
    if missing:
        problems.append(f"{MODEL_PATH}: {path!r} lacks {', '.join(f'{name}/' for name in missing)} (a complete "
                        f"{cls.pipeline_class} folder has every component its model_index.json lists)")  # fmt: skip
    return problems


def _hub_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot folder of hub model `repo_id`, or None: nothing is downloaded."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None


def build_family(model_config, sampling_config, device: str = "cpu") -> Family:
    """The recipe's model (`train.model`, `train.sampling`) loaded on `device`, through the text-embedding cache
    when the recipe names one, its text encoders placed by `train.model.text_encoders` (`text_encoder_placement`),
    its VAE decoding `vae_decode_batch` images per call, tiled with `vae_tiling`."""
    cls = family_class(model_config.family)
    placement = text_encoder_placement(
        model_config.text_encoders, device, bool(model_config.text_embedding_cache), cls.text_only_conditioning
    )
    family = cls(
        resolve_model_path(model_config.path), device=device, dtype=model_config.dtype, lora=model_config.lora,
        guidance_scale=sampling_config.guidance_scale, negative_prompt=sampling_config.negative_prompt,
        text_encoders=placement, vae_decode_batch=model_config.vae_decode_batch, vae_tiling=model_config.vae_tiling,
        **({"experts": model_config.experts} if model_config.experts else {}),
    )  # fmt: skip
    if cls.outputs == "video":  # what the videos are made of (their length conditions image-to-video)
        family.fps = sampling_config.fps or family.fps
        family.num_frames = sampling_config.num_frames or 1
    if model_config.text_embedding_cache:
        family.attach_text_cache(model_config.text_embedding_cache)
    return family
