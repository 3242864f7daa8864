"""Export a committed checkpoint as something `from_pretrained` loads, in one process (DCP reshards the ranks'
`.distcp` files into a plain module); what is written is the domain's (`Domain.export`). For image diffusion:

    LoRA, default:   a peft adapter folder (adapter_config.json + adapter_model.safetensors):
                     PeftModel.from_pretrained(<the base denoiser>, folder); and the same LoRA in diffusers' form
                     (pytorch_lora_weights.safetensors): <PipelineClass>.from_pretrained(base).load_lora_weights(folder)
    --merged / full: the whole diffusers pipeline with the LoRA merged into the denoiser:
                     <PipelineClass>.from_pretrained(folder)
"""

from __future__ import annotations

import json
from pathlib import Path

from unirl_core.worker.checkpoint import STATE_FILE, CheckpointError, CheckpointManager, ModelState, RankCheckpoint

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


def load_checkpoint_policy(folder: Path):
    """(config, domain class, the policy of the checkpoint's recipe with the checkpoint's trained weights), on CPU in
    one process."""
    from unirl_core.config.schema import TrainConfig
    from unirl_core.domains.registry import domain_class

    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG_FILE} (written by training rounds); cannot rebuild the model")
    CheckpointManager.verify(folder)  # a damaged file is named before DCP reads it
    config = TrainConfig.model_validate_json(config_path.read_text())
    domain = domain_class(config.domain.name)
    policy = domain(domain.export_config(config), "cpu").build_policy()
    RankCheckpoint({"model": ModelState(policy.trainable)}).load(folder, weights_only=True)
    return config, domain, policy


def export_checkpoint(checkpoint: str | Path, out: str | Path, merged: bool = False) -> Path:
    """Write the export of `checkpoint` to `out` (replaced atomically: a temporary folder, then rename)."""
    import shutil

    folder = resolve_checkpoint(checkpoint)
    config, domain, policy = load_checkpoint_policy(folder)
    out = Path(out)
    staging = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    merged = domain.export(policy, config, staging, merged)
    record = json.loads((folder / STATE_FILE).read_text())
    provenance = {"checkpoint": str(folder), "step": record["step"], "merged": merged}
    (staging / "unirl_export.json").write_text(json.dumps(provenance, indent=1))
    (staging / CONFIG_FILE).write_text(config.model_dump_json(indent=1))
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out
