"""A small finished precache for warm-up tests: procedural PNGs + captions in 2 source shards, encoded with the tiny
SD3 VAE (`AutoencoderKLEncoder`) and the pipeline's own prompt conditioning (`PipelinePromptEncoder`)."""

from __future__ import annotations

from pathlib import Path

import image_cases as cases

from unirl_core.config.precache import PrecacheConfig
from unirl_core.io.tars import TarShardWriter
from unirl_core.precache.stages import run_task

CAPTIONS = ["a red square", "two blue circles", "a green gradient at dusk", "stripes", "a small house", "", "x" * 90]


def make_warmup_cache(
    folder: Path,
    latent_key: str = "image_latent",
    text_key: str = "prompt_conditioning",
    per_shard: int = 4,
    family: str | None = None,
) -> tuple[PrecacheConfig, dict]:
    """Returns the PrecacheConfig (its output_dir holds the finished cache) and {sample key: (image, caption)}.
    `family`: latents from that family's `PipelineImageEncoder` (and its prompt conditioning) instead of the tiny
    SD3's `AutoencoderKLEncoder`."""
    sources = {}
    for shard in range(2):
        with TarShardWriter(str(folder / "src" / f"{shard:05d}.tar")) as writer:
            for i in range(per_shard):
                number = per_shard * shard + i
                image, caption = cases.procedural(32, 32, seed=number), CAPTIONS[number % len(CAPTIONS)]
                writer.write(f"{number:09d}", {"png": cases.encode(image, "PNG"), "txt": caption.encode()})
                sources[f"{shard:05d}.tar/{number:09d}"] = (image, caption)
            writer.commit()
    latent_encoder = {"cls": "unirl_core.precache.encoders.AutoencoderKLEncoder", "pretrained": "tiny:sd3"}
    if family:
        latent_encoder = {"cls": "unirl_core.precache.encoders.PipelineImageEncoder", "pretrained": f"tiny:{family}",
                          "family": family}  # fmt: skip
    config = PrecacheConfig.model_validate(
        {
            "input_dir": str(folder / "src"),
            "output_dir": str(folder / "out"),
            "batch_size_per_GPU": 3,
            "dataloader_num_workers": 0,
            "image_transform": {"size": 32},
            "encodings": [
                {"modality": "image", "extension": "png", "key": latent_key, "precision": 32,
                 "encoder_config": latent_encoder},
                {"modality": "text", "extension": "txt", "key": text_key, "precision": 32,
                 "encoder_config": {"cls": "unirl_core.precache.encoders.PipelinePromptEncoder",
                                    "pretrained": f"tiny:{family or 'sd3'}", "family": family or "sd3"}},
            ],
        }
    )  # fmt: skip
    run_task(config, 0, 1)
    return config, sources
