"""The text-embedding cache for prompt files: `unirl precache prompts FILE --recipe R`, hits and misses."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.config import load_recipe
from unirl_core.precache.prompt_cache import CachedTextEncoder, prompt_digest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    from unirl_core.models.registry import write_tiny_model

    folder = tmp_path_factory.mktemp("prompt-cache")
    model = write_tiny_model(folder / "sd3", "sd3")
    text = {"cls": "unirl_core.precache.encoders.T5TextEncoder", "pretrained": str(model), "max_length": 32}
    path = folder / "recipe.yaml"
    path.write_text(json.dumps({"precache": {"input_dir": str(folder), "device": "cpu", "encodings": [
        {"modality": "text", "extension": "txt", "key": "t5_text", "store_pad_tokens": False, "encoder_config": text}]}}))  # fmt: skip
    return str(path)


def test_cli_fills_the_cache_then_hits_it(recipe, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na blue square\na red circle\n")
    args = ["precache", "prompts", str(prompts), "--recipe", recipe, "--cache-dir", str(tmp_path / "cache")]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "t5_text: 2 prompts, 0 cached already, 2 computed" in first.stdout
    second = CliRunner().invoke(app, args)
    assert "t5_text: 2 prompts, 2 cached already, 0 computed" in second.stdout
    files = sorted(p.name for p in (tmp_path / "cache").rglob("*.safetensors"))
    assert files == sorted(f"{prompt_digest(p)}.safetensors" for p in ("a red circle", "a blue square"))


def test_cached_embeddings_equal_fresh_ones_and_are_keyed_by_encoder(recipe, tmp_path):
    config = load_recipe(recipe).precache
    spec = config.encodings[0]
    writer = CachedTextEncoder(spec, str(tmp_path), torch.device("cpu"), torch.float32)
    (fresh,) = writer.embed(["a cat on a mat"])
    reader = CachedTextEncoder(spec, str(tmp_path), torch.device("cpu"), torch.float32, write_back=False)
    (cached,) = reader.embed(["a cat on a mat"])
    assert reader.hits == 1 and torch.equal(cached["hidden"], fresh["hidden"])
    assert fresh["hidden"].shape[0] == len(b"a cat on a mat") + 1  # unpadded: ByT5 bytes + EOS
    other = spec.model_copy(deep=True)
    other.encoder_config.max_length = 16  # another encoder setting: another identity, no stale hit
    different = CachedTextEncoder(other, str(tmp_path), torch.device("cpu"), torch.float32)
    different.embed(["a cat on a mat"])
    assert different.misses == 1 and different.cache.digest != writer.cache.digest


def test_prompts_mode_needs_a_file_and_a_recipe():
    result = CliRunner().invoke(app, ["precache", "prompts"])
    assert result.exit_code == 2 and "usage: unirl precache RECIPE | unirl precache prompts" in result.stderr
