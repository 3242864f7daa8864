"""Tiny model folders load offline with the same from_pretrained code real models use, and generate images."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.models.registry import family_names


def folder_digest(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_tiny_model_loads_offline_and_generates(tiny_model):
    from diffusers import DiffusionPipeline

    family, folder = tiny_model
    expected = {"sd3": "StableDiffusion3Pipeline", "sd15": "StableDiffusionPipeline"}[family]
    pipe = DiffusionPipeline.from_pretrained(folder)  # HF_HUB_OFFLINE=1: a hub lookup would raise
    assert type(pipe).__name__ == expected
    assert not list(folder.rglob("*.bin")) and not list(folder.rglob("*.pkl"))  # safetensors only, no pickle

    def generate():
        return pipe(
            ["a red circle", "a blue square"],
            num_inference_steps=3,
            height=32,
            width=32,
            guidance_scale=4.0,
            generator=torch.Generator().manual_seed(0),
        ).images

    images = generate()
    assert len(images) == 2 and images[0].size == (32, 32) and images[0].mode == "RGB"
    pixels = np.asarray(images[0], dtype=np.float32)
    assert pixels.std() > 1.0  # an image, not a constant
    assert np.array_equal(np.asarray(generate()[0]), np.asarray(images[0]))  # same seed, same image


@pytest.mark.parametrize("family", family_names())
def test_cli_writes_deterministic_folders(tmp_path, family):
    runner = CliRunner()
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        result = runner.invoke(app, ["tiny-models", str(tmp_path / name), "--family", family, "--seed", seed])
        assert result.exit_code == 0, result.output
        assert f"wrote tiny {family} pipeline (seed {seed}" in result.stdout
    a, b, c = (folder_digest(tmp_path / n) for n in "abc")
    assert a == b
    assert "model_index.json" in a and any(k.endswith(".safetensors") for k in a)
    assert {k for k in a if a[k] != c[k]}, "a different seed must give different weights"
