"""What `unirl eval` can evaluate, resolved to the recipe that builds it and the weights it loads:

    checkpoint   a training output_dir, its checkpoints/ folder or one step folder: the recipe it trained with
                 (train_config.json) and the committed weights (DCP)
    export       a folder `unirl export` wrote (unirl_export.json): the merged pipeline, or the base model with the
                 exported LoRA (adapter_model.safetensors)
    registered   `models:/NAME@ALIAS` or `models:/NAME/VERSION`: that MLflow model version's export, downloaded
                 once into the workspace
    pipeline     a diffusers pipeline folder, `tiny:<family>` or a cached hub id: loaded as the recipe's
                 `train.model` with that path (no LoRA)

Images are generated as training's evaluation grid generates them (`Domain.evaluate`): eta 0, noise fixed per
prompt index and seed, at the evaluation's steps, guidance and size, with the sampler of the recipe's algorithm.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel

from unirl_core.config.schema import TrainConfig
from unirl_core.errors import UserError

EXPORT_FILE = "unirl_export.json"


class EvalModelError(UserError, ValueError):
    """A model reference `unirl eval` cannot resolve; the message names it and what would work."""


class EvalModel(BaseModel):
    ref: str  # as the user gave it
    kind: str  # checkpoint | export | pipeline
    folder: str  # the step folder, the export folder, or the pipeline path
    step: int | None  # the checkpoint's (or the export's) training step
    config: TrainConfig  # what builds it
    version: str | None = None  # a registered model's version (`models:/NAME@ALIAS`: the one the alias named)

    def identity(self) -> dict:
        """What names these weights in an evaluation's spec (a re-run with other weights is another evaluation)."""
        digest = hashlib.sha256(self.config.model_dump_json().encode()).hexdigest()[:16]
        return {"kind": self.kind, "folder": self.folder, "step": self.step, "config": digest}


def resolve(ref: str, recipe_train=None) -> EvalModel:
    """`ref` as an EvalModel; `recipe_train` (a TrainConfig) builds a pipeline reference."""
    from unirl_core.worker.checkpoint import STATE_FILE
    from unirl_core.worker.export import resolve_checkpoint

    path = Path(ref).expanduser()
    registered = None
    if ref.startswith("models:/"):
        from unirl_core.tracking.model_versions import download, parse

        if parse(ref) is None:
            raise EvalModelError(f"{ref}: a registered model is models:/NAME@ALIAS or models:/NAME/VERSION")
        path, registered = download(ref)
    if (path / EXPORT_FILE).is_file():
        provenance = json.loads((path / EXPORT_FILE).read_text())
        config = _recipe_of(path)
        if provenance.get("merged"):
            model = config.model.model_copy(update={"path": str(path.resolve()), "lora": None})
            config = config.model_copy(update={"model": model})
        return EvalModel(ref=ref, kind="export", folder=str(path.resolve()), step=provenance.get("step"),
                         version=registered, config=_for_eval(config))  # fmt: skip
    if registered is not None:
        raise EvalModelError(f"{ref}: version {registered} has no {EXPORT_FILE} (not registered by unirl training)")
    if path.is_dir() and not (path / "model_index.json").is_file():
        folder = resolve_checkpoint(path)  # a CheckpointError (a UserError) names what is missing
        config = _recipe_of(folder)
        step = json.loads((folder / STATE_FILE).read_text())["step"]
        return EvalModel(ref=ref, kind="checkpoint", folder=str(folder.resolve()), step=step, config=_for_eval(config))
    if recipe_train is None:
        raise EvalModelError(
            f"{ref}: a pipeline folder needs the recipe that says its family and sampling; pass --recipe RECIPE (or "
            "evaluate a training output_dir, a checkpoint or an export, which carry their recipe)"
        )
    model = recipe_train.model.model_copy(update={"path": ref, "lora": None})
    problems = _model_problems(recipe_train.domain.name, model)
    if problems:
        raise EvalModelError("; ".join(problems).replace("train.model.path", "the model"))
    folder = ref if ref.startswith("tiny:") or not path.exists() else str(path.resolve())
    config = _for_eval(recipe_train.model_copy(update={"model": model}))
    return EvalModel(ref=ref, kind="pipeline", folder=folder, step=None, config=config)


def _recipe_of(folder: Path) -> TrainConfig:
    """The recipe a checkpoint or export was trained with (its train_config.json)."""
    from pydantic import ValidationError

    from unirl_core.worker.export import CONFIG_FILE

    try:
        return TrainConfig.model_validate_json((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise EvalModelError(f"{folder}: no {CONFIG_FILE} (written by training rounds and exports), so its recipe "
                             "is unknown; evaluate the training output_dir or export it again") from None  # fmt: skip
    except ValidationError as exc:
        raise EvalModelError(f"{folder / CONFIG_FILE}: not a recipe this unirl reads ({exc.error_count()} problems, "
                             f"first: {exc.errors()[0]['msg']}); export the checkpoint again") from None  # fmt: skip


def _model_problems(domain: str, model) -> list[str]:
    if domain != "diffusion":
        return []
    from unirl_core.models.registry import model_path_problems

    return model_path_problems(model.family, model.path)


def _for_eval(config):
    """The config an evaluation builds the policy from: the export's (no text-embedding cache: its prompts are
    other prompts)."""
    from unirl_core.domains.registry import domain_class

    return domain_class(config.domain.name).export_config(config)


def with_sampling(model: EvalModel, steps: int, guidance: float, height: int, width: int, algorithm) -> EvalModel:
    """`model` generating at the evaluation's settings (shared by every model of one evaluation)."""
    config = model.config
    sampling = config.sampling.model_copy(
        update={"eval_num_inference_steps": steps, "eval_guidance_scale": guidance, "height": height, "width": width}
    )
    return model.model_copy(update={"config": config.model_copy(update={"sampling": sampling, "algorithm": algorithm})})


def load_policy(model: EvalModel, device: str):
    """(domain, policy) of `model` on `device` with its weights."""
    import torch

    from unirl_core.domains.registry import domain_class

    torch.manual_seed(model.config.sampling.seed)
    domain = domain_class(model.config.domain.name)(model.config, torch.device(device))
    policy = domain.build_policy()
    if model.kind == "checkpoint":
        from unirl_core.worker.checkpoint import CheckpointManager, ModelState, RankCheckpoint

        CheckpointManager.verify(Path(model.folder))  # a damaged file is named before DCP reads it
        RankCheckpoint({"model": ModelState(policy.trainable)}).load(Path(model.folder), weights_only=True)
    elif model.kind == "export" and model.config.model.lora is not None:
        _load_adapter(policy.trainable, Path(model.folder) / "adapter_model.safetensors")
    policy.trainable.eval()
    return domain, policy


def _load_adapter(module, file: Path) -> None:
    """The exported LoRA (PeftModel's layout: keys under base_model.model.) into `module`'s adapter."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = {k.removeprefix("base_model.model."): v for k, v in load_file(str(file)).items()}
    result = set_peft_model_state_dict(module, state, adapter_name="default")
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise EvalModelError(f"{file}: {len(unexpected)} LoRA tensors match no layer of the model (e.g. "
                             f"{unexpected[0]}); export it again from its checkpoint")  # fmt: skip
