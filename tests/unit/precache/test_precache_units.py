"""Precache pieces that need no model: NeMo's task slicing, the image transform, config checks, encoder contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from unirl_core.config import RecipeError, recipe_from_tree
from unirl_core.config.precache import PrecacheConfig
from unirl_core.precache.run import Encoders, PrecacheError
from unirl_core.precache.source import image_transform, task_plan, task_slice

ENCODING = {"modality": "text", "extension": "txt", "key": "t", "encoder_config": {"cls": "x.Y"}}


def config(**values) -> PrecacheConfig:
    return PrecacheConfig.model_validate({"input_dir": "/in", "output_dir": "/out", "encodings": [ENCODING], **values})


@pytest.mark.parametrize("files", [1, 7, 10, 23])
@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_slices_cover_every_file_exactly_once(files, count):
    names = [f"{i:05d}.tar" for i in range(files)]
    slices = [task_slice(names, t, count) for t in range(count)]
    assert [n for s in slices for n in s] == names
    assert max(map(len, slices)) - min(map(len, slices)) <= 1


def test_task_plans_follow_nemo():
    assert task_plan(config(node_array_size=4)) == ([0, 1, 2, 3], 4)
    assert task_plan(config(node_array_size="50-99", override_task_count=100)) == (list(range(50, 100)), 100)
    assert task_plan(config(node_array_size=1, override_task_id=0, override_task_count=100)) == ([0], 100)  # 0 is valid
    assert task_plan(config(node_array_size=1, override_task_id=67, override_task_count=100)) == ([67], 100)
    with pytest.raises(ValueError, match="outside 0..9"):
        task_plan(config(node_array_size="5-12", override_task_count=10))


@pytest.mark.parametrize(
    ("values", "path", "message"),
    [
        ({"node_array_size": "50-99"}, "precache.override_task_count", "needs the original override_task_count"),
        ({"node_array_size": "fifty"}, "precache.node_array_size", 'a range "A-B"'),
        ({"encodings": [{**ENCODING, "precision": 8}]}, "precache.encodings.0.precision", "16 or 32"),
        ({"encodings": [ENCODING, ENCODING]}, "precache.encodings", "its own key"),
        ({"encodings": [{**ENCODING, "key": "a.b"}]}, "precache.encodings.0.key", "letters, digits"),
        ({"pickle_encodings": True, "format": "safetensors"}, "precache.pickle_encodings", "format: nemo_pickle"),
    ],
)
def test_config_errors(values, path, message):
    tree = {"precache": {"input_dir": "/in", "output_dir": "/out", "encodings": [ENCODING], **values}}
    with pytest.raises(RecipeError) as info:
        recipe_from_tree(tree)
    found = {issue.path: str(issue) for issue in info.value.issues}
    assert message in found[path], found


def test_nemo_yaml_file_and_formats(tmp_path):
    nemo = tmp_path / "precache_sd.yaml"
    nemo.write_text(
        "batch_size_per_GPU: 64\ndataloader_num_workers: 16\nsave_original_in_tar: null\npickle_encodings: false\n"
        "encodings:\n  - modality: image\n    extension: jpg\n    key: autoencoderkl_image\n    precision: 16\n"
        "    encoder_config:\n      cls: nemo.collections.multimodal.models.AutoencoderKL\n      from_pretrained: /ckpt\n"
    )
    recipe = recipe_from_tree(
        {"precache": {"input_dir": "/in", "precache_config_path": str(nemo), "batch_size_per_GPU": 8}}
    )
    assert recipe.precache.batch_size_per_GPU == 8  # the recipe's own keys win
    assert recipe.precache.encodings[0].encoder_config.model_dump()["from_pretrained"] == "/ckpt"
    assert recipe.precache.output_format == "npy"  # NeMo's pickle_encodings: false layout
    assert recipe.precache.output_dir == "/precache"
    assert config().output_format == "safetensors"
    assert config(image_transform={"preset": "nemo"}).image_transform.size == 512


def test_image_transform_center_crops_to_minus_one_one():
    image = Image.fromarray(np.full((40, 80, 3), 255, np.uint8))
    image.paste((0, 0, 0), (0, 0, 10, 40))  # black left strip: cropped away by a centered square
    tensor = image_transform(image, config(image_transform={"size": 16}).image_transform)
    assert tensor.shape == (3, 16, 16) and tensor.dtype == torch.float32
    assert torch.allclose(tensor, torch.ones_like(tensor), atol=0.05)
    stretched = image_transform(image, config(image_transform={"size": 16, "mode": "resize"}).image_transform)
    assert stretched[:, :, 0].mean() < -0.9  # the black strip survives a stretch


class NoMaskText:
    def encode(self, texts):
        return torch.zeros(len(texts), 4, 8)


class ShrinkingBatch:
    def encode(self, texts):
        return torch.zeros(1, 4, 8)


class NaNs:
    def __call__(self, texts):
        return torch.full((len(texts), 4, 8), float("nan")), torch.ones(len(texts), 4)


@pytest.mark.parametrize(
    ("cls", "store_pad_tokens", "message"),
    [
        (NoMaskText, False, "returned no mask"),
        (ShrinkingBatch, True, r"returned \(1, 4, 8\) for a batch of 2"),
        (NaNs, True, r"NaN/Inf in the encoder output for \['s/0', 's/1'\]"),
    ],
)
def test_encoder_contract_violations_fail_the_shard(cls, store_pad_tokens, message):
    spec = {**ENCODING, "store_pad_tokens": store_pad_tokens, "encoder_config": {"cls": f"{__name__}.{cls.__name__}"}}
    encoders = Encoders(config(encodings=[spec], device="cpu"))
    batch = [{"key": f"s/{i}", "inputs": {"t": f"text {i}"}} for i in range(2)]
    with pytest.raises(PrecacheError, match=message):
        encoders.encode(batch)


def test_unknown_encoder_class():
    with pytest.raises(ValueError, match="encoder_config.cls='no.such.Encoder' cannot be imported"):
        Encoders(config(encodings=[{**ENCODING, "encoder_config": {"cls": "no.such.Encoder"}}], device="cpu"))
