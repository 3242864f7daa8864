"""Typed recipe models: one config system from YAML to the Prefect UI form.

A recipe file holds up to three sections, `ingest`, `precache` and `train`, each optional. Every model refuses
unknown keys (a typo is an error, never a silently ignored setting) and documents each field with its meaning,
its unit, and whether it is global or per rank. The docstring under a field is its description: it shows in
`unirl validate`'s errors, in the JSON schema and in the Prefect UI form.

Batch arithmetic (global, per rollout):
    prompts_per_rollout x samples_per_prompt = samples per rollout, e.g. 4 x 4 = 16.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from unirl_core.config.ingest import IngestConfig
from unirl_core.config.precache import PrecacheConfig
from unirl_core.config.schema_base import Count, Problem, Seed, StrictModel


class DataConfig(StrictModel):
    """Where training prompts come from and how they are batched (the seed's `data_source`)."""

    source: str = "file"
    """Prompt source: `file` reads `data_path`, shuffles each epoch with `seed` and drops the last partial
    batch; `smoke` ignores `data_path` and cycles a few built-in prompts. A dotted class path
    (`package.module.Class`) selects a custom source."""

    data_path: str | None = None
    """Training prompt file: `.txt` (one prompt per line), `.jsonl` or `.json`; a local path or an fsspec URL
    (`s3://bucket/prompts.jsonl`). Required by the `file` source. Recipes usually read it from `${env:DATA_PATH}`."""

    eval_data_path: str | None = None
    """Optional eval prompt file (same formats), read in file order, never shuffled. Usually `${env:EVAL_DATA_PATH,}`."""

    prompt_key: str = "prompt"
    """Key holding the prompt text in JSON objects, when it is not `prompt` (`caption` is always accepted)."""

    prompts_per_rollout: Annotated[Count, Field(gt=0)] = 4
    """Global: distinct prompts per rollout (the loader's batch size). Prompts are not pre-duplicated; each is
    repeated `train.sampling.samples_per_prompt` times later, in the rollout."""

    shuffle: bool = True
    """Shuffle the prompt order each epoch (the `file` source). False keeps file order."""

    seed: Seed = 0
    """Seed of the epoch shuffle: epoch e uses the permutation drawn from (seed, e), so a resume is exact."""

    @field_validator("data_path", "eval_data_path", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value  # `${env:EVAL_DATA_PATH,}` with the variable unset

    def problems(self) -> Iterator[Problem]:
        from unirl_core.data.sources import SOURCES, source_class

        if self.source not in SOURCES:
            try:
                source_class(self.source)
            except ValueError as exc:
                yield "source", self.source, str(exc)
        if self.source == "file" and not self.data_path:
            yield (
                "data_path",
                self.data_path,
                "a prompt file path: the `file` source needs one (set DATA_PATH or --set train.data.data_path=...)",
            )


class SamplingConfig(StrictModel):
    """How each rollout samples images. Prompt rows can never set these (the seed: they come from cfg.sampling)."""

    samples_per_prompt: Annotated[Count, Field(ge=1)] = 4
    """Global: images generated per prompt, the GRPO group size. Siblings share a `group_id`."""

    num_inference_steps: Annotated[Count, Field(ge=1)] = 10
    """Denoising steps per image."""

    guidance_scale: Annotated[float, Field(ge=0.0)] = 4.5
    """Classifier-free guidance scale; 1.0 or less turns guidance off."""

    height: Annotated[Count, Field(gt=0, multiple_of=8)] = 512
    """Image height in pixels (a multiple of 8, the VAE's downsampling)."""

    width: Annotated[Count, Field(gt=0, multiple_of=8)] = 512
    """Image width in pixels (a multiple of 8, the VAE's downsampling)."""

    negative_prompt: str = ""
    """Negative prompt used for every sample when guidance is on; empty means the unconditional embedding."""

    seed: Seed = 0
    """Base seed of the initial noise; each sample's noise derives from (seed, step, sample index)."""


class LoraConfig(StrictModel):
    """LoRA through peft on the denoiser (the reference policy is the same model with the adapter disabled)."""

    rank: Annotated[Count, Field(ge=1)] = 8
    """LoRA rank r."""

    alpha: Annotated[float, Field(gt=0)] = 16.0
    """LoRA alpha (the update is scaled by alpha / rank)."""

    target_modules: list[str] = ["to_q", "to_k", "to_v", "to_out.0"]
    """Module names that get adapters (attention projections by default)."""


class ModelConfig(StrictModel):
    """The generator being trained."""

    family: Literal["sd3", "sd15"] = "sd3"
    """Model family (the adapter): `sd3` (flow matching, SDE sampler) or `sd15` (UNet + DDIM, eta sampler)."""

    path: str = "tiny:sd3"
    """A diffusers pipeline folder or hub id; `tiny:<family>` builds the tiny test model in the workspace."""

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype of the model (log-probs are always float32)."""

    lora: LoraConfig | None = LoraConfig()
    """LoRA settings; empty (null) means full fine-tuning of the denoiser."""


class AlgorithmConfig(StrictModel):
    """GRPO with PPO-clip on per-step log-probs (Flow-GRPO / DDPO)."""

    eta: Annotated[float, Field(ge=0)] = 0.7
    """Sampler noise level: flow SDE `eta` (sd3) or DDIM `eta` (sd15, 1.0 is DDPO's)."""

    timestep_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Fraction of the denoising steps (the early, high-noise ones) that are stochastic and trained."""

    clip_range: Annotated[float, Field(gt=0)] = 1e-4
    """PPO clip range epsilon on the per-step ratio."""

    adv_clip: Annotated[float, Field(gt=0)] = 5.0
    """Advantages are clipped to [-adv_clip, adv_clip]."""

    std_mode: Literal["group", "batch"] = "group"
    """Advantage normalization: per-group std, or one batch-wide std."""

    beta: Annotated[float, Field(ge=0)] = 0.0
    """KL weight to the reference policy (0: no KL term)."""

    learning_rate: Annotated[float, Field(gt=0)] = 3e-4
    """AdamW learning rate."""

    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    """Gradient clipping norm."""

    num_updates_per_batch: Annotated[Count, Field(ge=1)] = 1
    """Disjoint mini-batches (optimizer steps) per rollout; pi_old is frozen once per rollout."""

    micro_batch_size: Annotated[Count, Field(ge=1)] = 4
    """Samples per forward/backward inside a mini-batch (gradient accumulation)."""


class RewardConfig(StrictModel):
    """How images are scored."""

    weights: dict[str, float] = {"jpeg_compressibility": 1.0}
    """Reward name -> weight in the total (see unirl_core/rewards/functions.py for the names)."""

    guards: list[str] = ["brightness", "edge_density"]
    """Rewards scored and logged but not trained on (watch for reward hacking)."""


class TrainConfig(StrictModel):
    """Training: the model, the data and sampling, the algorithm and the reward."""

    output_dir: str | None = None
    """Folder for this training's checkpoints and samples (local path or fsspec URL). Empty: the workspace's
    `$UNIRL_HOME/outputs/<recipe name>`, filled in when the recipe is loaded. Recipes read it from `${env:OUTPUT_DIR,}`."""

    @field_validator("output_dir", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value

    data: DataConfig = DataConfig()
    """Prompt data source and rollout batch size."""

    sampling: SamplingConfig = SamplingConfig()
    """Sampling settings shared by every rollout."""

    model: ModelConfig = ModelConfig()
    """The generator and its LoRA."""

    algorithm: AlgorithmConfig = AlgorithmConfig()
    """GRPO settings."""

    reward: RewardConfig = RewardConfig()
    """Reward weights and guards."""

    steps: Annotated[Count, Field(ge=1)] = 10
    """RL steps (rollout -> reward -> advantage -> update) of a local run."""


class Recipe(StrictModel):
    """A unirl recipe: any of the three stages, each optional."""

    name: str | None = None
    """Short name of the recipe, used in run names. Empty: the recipe file's stem."""

    description: str | None = None
    """Free text shown by `unirl validate`."""

    ingest: IngestConfig | None = None
    """Dataset ingest: parquet to WebDataset shards."""

    precache: PrecacheConfig | None = None
    """Encoding precache: frozen encoders to embedding shards."""

    train: TrainConfig | None = None
    """Training rounds: supervised warm-up, then RL."""
