"""Export a committed checkpoint as something `from_pretrained` loads, in one process (DCP reshards the ranks'
`.distcp` files into a plain module).

    LoRA, default:   a peft adapter folder (adapter_config.json + adapter_model.safetensors):
                     PeftModel.from_pretrained(<the base denoiser>, folder)
    --merged / full: the whole diffusers pipeline with the LoRA merged into the denoiser:
                     <PipelineClass>.from_pretrained(folder)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from unirl_core.train.checkpoint import STATE_FILE, CheckpointError, CheckpointManager

CONFIG_FILE = "train_config.json"


def resolve_checkpoint(path: str | Path) -> Path:
    """A step folder, a `checkpoints/` folder or a training output_dir -> the committed checkpoint to use."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    for root in (path, path / "checkpoints"):
        latest = CheckpointManager(root).latest()
        if latest is not None:
            return latest
    raise CheckpointError(
        f"{path}: no committed checkpoint (a step_NNNNNNNN folder with {STATE_FILE}); pass a training output_dir, "
        "its checkpoints/ folder or one step folder"
    )


def load_checkpoint_adapter(folder: Path):
    """The adapter of the checkpoint's recipe with the checkpoint's trained weights (CPU, one process)."""
    from unirl_core.config.schema import TrainConfig
    from unirl_core.models.adapters import build_adapter

    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG_FILE} (written by training rounds); cannot rebuild the model")
    config = TrainConfig.model_validate_json(config_path.read_text())
    model = config.model.model_copy(update={"text_embedding_cache": None})
    adapter = build_adapter(model, config.sampling, device="cpu")
    optimizer = torch.optim.AdamW(adapter.parameters(), lr=0.0)
    CheckpointManager(folder.parent).load(folder, adapter.trainable, optimizer, weights_only=True)
    return config, adapter


def export_checkpoint(checkpoint: str | Path, out: str | Path, merged: bool = False) -> Path:
    """Write the export of `checkpoint` to `out` (replaced atomically: a temporary folder, then rename)."""
    import shutil

    from unirl_core.models.adapters import resolve_model_path

    folder = resolve_checkpoint(checkpoint)
    config, adapter = load_checkpoint_adapter(folder)
    out = Path(out)
    staging = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if adapter.has_lora and not merged:
        _write_peft_adapter(adapter, staging, resolve_model_path(config.model.path))
    else:
        _write_merged_pipeline(adapter, staging, resolve_model_path(config.model.path))
    record = json.loads((folder / STATE_FILE).read_text())
    provenance = {"checkpoint": str(folder), "step": record["step"], "merged": merged or not adapter.has_lora}
    (staging / "unirl_export.json").write_text(json.dumps(provenance, indent=1))
    (staging / CONFIG_FILE).write_text(config.model_dump_json(indent=1))
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def _write_peft_adapter(adapter, folder: Path, base_path: str) -> None:
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = get_peft_model_state_dict(adapter.trainable, adapter_name="default")
    # PeftModel's own layout: keys under base_model.model., the config with the base model's location
    save_file({f"base_model.model.{k}": v.contiguous() for k, v in state.items()},
              str(folder / "adapter_model.safetensors"))  # fmt: skip
    peft_config = adapter.trainable.peft_config["default"]
    peft_config.base_model_name_or_path = f"{base_path}/{adapter.denoiser_name}"
    peft_config.save_pretrained(str(folder))


def _write_merged_pipeline(adapter, folder: Path, base_path: str) -> None:
    """The pipeline with the denoiser's LoRA merged into its base weights, saved with `save_pretrained`."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    denoiser = adapter.trainable
    merged = {}
    if adapter.has_lora:
        for module in denoiser.modules():
            if isinstance(module, BaseTunerLayer):
                module.merge()
        for key, value in denoiser.state_dict().items():
            if "lora_" in key:
                continue
            merged[key.replace(".base_layer.", ".")] = value
    else:
        merged = denoiser.state_dict()
    base = type(adapter)(base_path, dtype=str(adapter.dtype).removeprefix("torch."), lora=None)
    getattr(base.pipeline, adapter.denoiser_name).load_state_dict(merged, strict=True)
    base.pipeline.save_pretrained(str(folder))
