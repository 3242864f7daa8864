"""What the registered model version says about itself: a description, tags and an `MLmodel` file whose signature
MLflow's model version page shows ("prompt" in, an image out).

The `MLmodel` file declares no flavor: the folder is a PEFT LoRA adapter (or a merged diffusers pipeline) loaded
with diffusers, not through `mlflow.pyfunc`, and the file says so; it is there for the signature and the metadata.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from unirl_core.tracking.mlflow_ui import metric_key

FINAL_METRIC = "reward_mean"


@dataclass(frozen=True)
class ModelCard:
    run_name: str  # the recipe name (the run's name)
    family: str  # model family key (sd3, flux, ...)
    base_model: str  # the base model's path or hub id
    algorithm: str  # algorithm key (grpo, ...)
    steps: int  # RL steps trained
    warmup_steps: int  # supervised warm-up steps before them
    height: int  # pixels of a generated image
    width: int
    format: str  # "peft-lora-adapter" or "diffusers-pipeline" (image diffusion), or another domain's
    load_with: str = ""  # how the folder loads (empty: the diffusion formats' sentence)

    def result_line(self, run) -> str:
        """The final reward (the last logged step's `reward_mean`) and the inputs' digests."""
        final = run.data.metrics.get(metric_key(FINAL_METRIC))
        reward = f"final {FINAL_METRIC} {final:.4g}" if final is not None else f"no {FINAL_METRIC} logged"
        data = ", ".join(f"{d.dataset.name} `{d.dataset.digest[:12]}`" for d in run.inputs.dataset_inputs)
        return f"{reward}; data {data or 'not recorded'}"

    def version_card(self, run) -> tuple[str, dict[str, str]]:
        """(description, tags) of the model version registered from `run`."""
        kind = "LoRA adapter" if self.format == "peft-lora-adapter" else "merged pipeline"
        description = (
            f"{self.run_name}: {kind} for `{self.base_model}` ({self.family}), {self.algorithm}, {self.warmup_steps} "
            f"warm-up + {self.steps} RL steps; {self.result_line(run)}. MLflow run `{run.info.run_id}`."
        )
        tags = {"family": self.family, "algorithm": self.algorithm, "steps": str(self.steps),
                "base_model": self.base_model, "format": self.format}  # fmt: skip
        for key, name in (("unirl.version", "unirl.version"), ("mlflow.source.git.commit", "git_commit")):
            if key in run.data.tags:
                tags[name] = run.data.tags[key]
        if (final := run.data.metrics.get(metric_key(FINAL_METRIC))) is not None:
            tags[f"final_{FINAL_METRIC}"] = f"{final:.6g}"
        return description, tags

    def mlmodel(self, run_id: str, artifact_path: str) -> str:
        """The `MLmodel` file: no flavor, a signature (a prompt string -> an RGB uint8 image), the metadata."""
        import mlflow
        import numpy as np
        import yaml
        from mlflow.models.signature import ModelSignature
        from mlflow.types.schema import ColSpec, Schema, TensorSpec

        signature = ModelSignature(
            inputs=Schema([ColSpec("string", "prompt")]),
            outputs=Schema([TensorSpec(np.dtype("uint8"), (-1, self.height, self.width, 3), "image")])
            if self.height
            else Schema([ColSpec("string", "output")]),  # a domain without images: text out
        )
        body = {
            "artifact_path": artifact_path,
            "flavors": {},
            "run_id": run_id,
            "utc_time_created": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
            "mlflow_version": mlflow.__version__,
            "signature": {k: v for k, v in signature.to_dict().items() if v is not None},
            "metadata": asdict(self) | {"load_with": self.load_with or _LOAD_WITH[self.format]},
        }
        return yaml.safe_dump(body, sort_keys=False, width=120)


_LOAD_WITH = {
    "peft-lora-adapter": "diffusers: pipeline.load_lora_weights(<this folder>) on the base model (not mlflow.pyfunc)",
    "diffusers-pipeline": "diffusers: DiffusionPipeline.from_pretrained(<this folder>) (not mlflow.pyfunc)",
}

__all__ = ["ModelCard"]
