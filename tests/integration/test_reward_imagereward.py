"""`imagereward` on a tiny random-weight ImageReward written in the reference's key layout: it equals the reference's
forward computed by hand on the same weights, does not depend on batching, applies the published normalization,
loads once per process, and names what is wrong with a missing or mismatched checkpoint."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from unirl_core.models.tiny_blip import write_tiny_imagereward
from unirl_core.rewards.imagereward import (
    SCORE_MEAN,
    SCORE_STD,
    ImageRewardArch,
    ImageRewardScore,
    load_imagereward,
    preprocess,
)

pytestmark = pytest.mark.slow  # real transformers BLIP modules: a few seconds in all

PROMPTS = ["a red square", "A photo of a cat on a mat!", "", "very long prompt " * 20]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_imagereward(tmp_path_factory.mktemp("imagereward") / "tiny", seed=0)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    shapes = [(40, 48), (64, 32), (32, 32), (50, 90)]  # (height, width): wide, tall, exact, wide
    return [Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)) for shape in shapes]


def scorer(folder, checkpoint="ImageReward.pt", **kwargs) -> ImageRewardScore:
    return ImageRewardScore(folder / checkpoint, folder / "tokenizer", arch=folder / "arch.json", **kwargs)


def reference_scores(state, arch: ImageRewardArch, pixels, input_ids, attention_mask) -> torch.Tensor:
    """ImageReward.score's math, written from the reference's modules on its own key names, in float64:
    BLIP's vit.py VisionTransformer (pre-LN blocks, fused qkv, exact GELU, LayerNorm eps 1e-6, final norm), med.py's
    BertModel in its default multimodal mode (post-LN, self-attention with a (1 - mask) x -10000 bias, then
    cross-attention to all image tokens, LayerNorm eps 1e-12), ImageReward.py's MLP on the first token's output, then
    (x - mean) / std."""
    s = {key: value.double() for key, value in state.items()}

    def linear(x, name):
        return F.linear(x, s[f"{name}.weight"], s[f"{name}.bias"])

    def norm(x, name, eps):
        return F.layer_norm(x, x.shape[-1:], s[f"{name}.weight"], s[f"{name}.bias"], eps)

    def heads(x, num_heads):  # [B, N, C] -> [B, heads, N, C / heads]
        return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)

    v = "blip.visual_encoder."
    x = F.conv2d(
        pixels.double(), s[v + "patch_embed.proj.weight"], s[v + "patch_embed.proj.bias"], stride=arch.patch_size
    )
    x = torch.cat([s[v + "cls_token"].expand(len(x), -1, -1), x.flatten(2).transpose(1, 2)], dim=1)
    x = x + s[v + "pos_embed"][:, : x.shape[1]]
    for i in range(arch.vision_layers):
        block, (batch, tokens, width) = f"{v}blocks.{i}.", x.shape
        qkv = linear(norm(x, block + "norm1", 1e-6), block + "attn.qkv")
        q, k, val = qkv.reshape(batch, tokens, 3, arch.vision_heads, -1).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) * (width // arch.vision_heads) ** -0.5).softmax(dim=-1)
        x = x + linear((attn @ val).transpose(1, 2).reshape(batch, tokens, width), block + "attn.proj")
        x = x + linear(F.gelu(linear(norm(x, block + "norm2", 1e-6), block + "mlp.fc1")), block + "mlp.fc2")
    image = norm(x, v + "norm", 1e-6)

    def attention(hidden, context, name, bias):
        q, k, val = (heads(linear(inp, f"{name}.self.{p}"), arch.text_heads) for inp, p in
                     ((hidden, "query"), (context, "key"), (context, "value")))  # fmt: skip
        probs = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias).softmax(dim=-1)
        out = linear((probs @ val).transpose(1, 2).flatten(2), f"{name}.output.dense")
        return norm(out + hidden, f"{name}.output.LayerNorm", 1e-12)

    t = "blip.text_encoder."
    x = s[t + "embeddings.word_embeddings.weight"][input_ids]
    x = norm(
        x + s[t + "embeddings.position_embeddings.weight"][: input_ids.shape[1]], t + "embeddings.LayerNorm", 1e-12
    )
    bias = (1.0 - attention_mask[:, None, None, :].double()) * -10000.0
    for i in range(arch.text_layers):
        layer = f"{t}encoder.layer.{i}."
        x = attention(x, x, layer + "attention", bias)
        x = attention(x, image, layer + "crossattention", 0.0)  # image_atts are all ones
        inner = F.gelu(linear(x, layer + "intermediate.dense"))
        x = norm(linear(inner, layer + "output.dense") + x, layer + "output.LayerNorm", 1e-12)
    h = x[:, 0, :]
    for index in (0, 2, 4, 6, 7):
        h = linear(h, f"mlp.layers.{index}")
    return ((h - SCORE_MEAN) / SCORE_STD).squeeze(-1)


def test_tiny_folder_is_small_and_in_the_reference_layout(tiny):
    assert sum(f.stat().st_size for f in tiny.rglob("*") if f.is_file()) < 2_000_000
    keys = torch.load(tiny / "ImageReward.pt", weights_only=True).keys()
    cross_key = "blip.text_encoder.encoder.layer.1.crossattention.self.key.weight"
    published_extras = {"blip.vision_proj.weight", "blip.text_proj.bias", "blip.text_encoder.embeddings.position_ids"}
    assert {"blip.visual_encoder.blocks.1.attn.qkv.weight", cross_key, "mlp.layers.7.bias"} | published_extras <= set(
        keys
    )


def test_imagereward_equals_the_reference_forward(tiny, images):
    """Compared: ImageRewardScore (the checkpoint renamed onto transformers' BlipVisionModel + BlipTextModel) against
    `reference_scores`, the reference's math written by hand on the checkpoint's own keys, on the same pixels and the
    same tokens (the reference's tokenizer call: bert-base-uncased + [DEC] + [ENC], max_length 35, padded; the first
    token stays [CLS]). Read: THUDM/ImageReward@c0b9080 ImageReward/ImageReward.py (score, MLP, _transform, mean, std)
    and @6d863e1 ImageReward/utils.py (load: a non-strict state dict); its BLIP files as THUDM's own copies
    train/src/models/{blip,blip_pretrain,med}.py @1beb4e4 (the index lacks ImageReward/models/BLIP/; a fork's copy,
    zeyuyang8/ImageReward@183f0e4, has the same med.py and init_tokenizer); salesforce/BLIP models/vit.py @7856669."""
    ours = scorer(tiny, batch_size=3)(images, PROMPTS)
    loaded = load_imagereward(tiny / "ImageReward.pt", tiny / "tokenizer", arch=tiny / "arch.json")
    tokens = loaded.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert tokens["input_ids"].shape == (4, 35) and (tokens["input_ids"][:, 0] == loaded.tokenizer.cls_token_id).all()
    state = torch.load(tiny / "ImageReward.pt", weights_only=True)
    expected = reference_scores(
        state, loaded.arch, preprocess(images, 32), tokens["input_ids"], tokens["attention_mask"]
    )
    assert np.allclose(ours, expected.numpy(), atol=1e-5), (ours, expected)
    assert len(set(np.round(ours, 3))) == 4 and ours.std() > 0.05


def test_imagereward_is_deterministic_and_batch_invariant(tiny, images, tmp_path):
    batched = scorer(tiny, batch_size=4)(images, PROMPTS)
    one_by_one = scorer(tiny, batch_size=1)(images, PROMPTS)
    assert np.allclose(batched, one_by_one, atol=1e-5)
    assert np.allclose(scorer(tiny)(images[::-1], PROMPTS[::-1]), batched[::-1], atol=1e-5)
    assert np.array_equal(scorer(write_tiny_imagereward(tmp_path / "again", seed=0))(images, PROMPTS), batched)
    assert not np.allclose(scorer(write_tiny_imagereward(tmp_path / "other", seed=1))(images, PROMPTS), batched)
    assert scorer(tiny)([], []).shape == (0,)
    with pytest.raises(ValueError, match="one prompt per image; got 1 for 4 images"):
        scorer(tiny)(images, PROMPTS[:1])


def test_imagereward_applies_the_published_normalization(tiny, images, tmp_path):
    """A head whose last layer outputs a constant 1.0 scores (1 - 0.16717...) / 1.03333... on every image: also a
    .safetensors copy of the state dict loads like the .pt."""
    from safetensors.torch import save_file

    state = torch.load(tiny / "ImageReward.pt", weights_only=True)
    state["mlp.layers.7.weight"], state["mlp.layers.7.bias"] = torch.zeros(1, 4), torch.ones(1)
    save_file(state, str(tmp_path / "constant.safetensors"))
    (tmp_path / "tokenizer").symlink_to(tiny / "tokenizer")
    (tmp_path / "arch.json").symlink_to(tiny / "arch.json")
    scores = scorer(tmp_path, "constant.safetensors")(images, PROMPTS)
    assert np.allclose(scores, (1.0 - 0.16717362830052426) / 1.0333394966054072, atol=1e-6)


def test_preprocess_center_crops_the_shorter_side_and_normalizes_like_clip():
    wide = np.zeros((32, 96, 3), dtype=np.uint8)
    wide[:, 32:64] = (255, 0, 128)  # the centre third: what a center crop keeps (a squash would mix in black)
    pixels = preprocess([Image.fromarray(wide), Image.fromarray(wide[:, 32:64]).resize((64, 64))], 32)
    expected = (np.array([1.0, 0.0, 128 / 255]) - [0.48145466, 0.4578275, 0.40821073]) / [
        0.26862954,
        0.26130258,
        0.27577711,
    ]
    assert pixels.shape == (2, 3, 32, 32)
    assert np.allclose(pixels.mean(dim=(2, 3)).numpy(), expected, atol=1e-5)
    assert np.allclose(pixels.std(dim=(2, 3)).numpy(), 0, atol=1e-5)


def test_the_default_arch_is_the_published_imagereward_v1():
    """ViT-L/16 at 224 (303.3 M parameters in transformers' BlipVisionModel) + BERT-base with cross-attention to
    1024-d image tokens (142.0 M in BlipTextModel) + the 768-1024-128-64-16-1 head (0.93 M)."""
    arch = ImageRewardArch()
    shapes = arch.reference_shapes()
    assert sum(math.prod(shape) for shape in shapes.values()) == 303_301_632 + 141_977_088 + 927_969
    assert shapes["blip.visual_encoder.pos_embed"] == (1, 197, 1024) and shapes["mlp.layers.0.weight"] == (1024, 768)
    vision, text = arch.vision_config(), arch.text_config()
    assert (vision.layer_norm_eps, text.num_attention_heads, text.encoder_hidden_size) == (1e-6, 12, 1024)


def test_imagereward_loads_once_per_checkpoint_and_device(tiny):
    arch = json.loads((tiny / "arch.json").read_text())  # the same sizes as a dict
    first = scorer(tiny)
    second = ImageRewardScore(str(tiny / "." / "ImageReward.pt"), tiny / "tokenizer", torch.device("cpu"), 2, arch)
    assert first.loaded is second.loaded
    model = first.loaded.model
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert first.loaded.tokenizer.convert_tokens_to_ids(["[DEC]", "[ENC]"]) == [122, 123]  # vocabulary + 0, + 1


def test_imagereward_names_missing_files(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere\.pt' does not exist.*ImageReward\.pt from .*THUDM/ImageReward"
                       r".*\.safetensors.*nothing is downloaded"):  # fmt: skip
        ImageRewardScore(tmp_path / "nowhere.pt", tiny / "tokenizer")
    with pytest.raises(
        FileNotFoundError, match="no vocab.txt or tokenizer.json.*bert-base-uncased.*nothing is downloaded"
    ):
        ImageRewardScore(tiny / "ImageReward.pt", tmp_path)


def test_imagereward_names_the_keys_a_checkpoint_lacks(tiny, tmp_path):
    state = torch.load(tiny / "ImageReward.pt", weights_only=True)
    state["blip.visual_encoder.blocks.0.attn.qkv_renamed.weight"] = state.pop(
        "blip.visual_encoder.blocks.0.attn.qkv.weight"
    )
    torch.save(state, tmp_path / "renamed.pt")
    with pytest.raises(ValueError, match=r"1 missing keys, e.g. blip.visual_encoder.blocks.0.attn.qkv.weight; "
                       r"1 unexpected keys, e.g. blip.visual_encoder.blocks.0.attn.qkv_renamed.weight"):  # fmt: skip
        ImageRewardScore(tmp_path / "renamed.pt", tiny / "tokenizer", arch=tiny / "arch.json")
    with pytest.raises(ValueError, match=r"wrong shapes, e.g. .*blip.visual_encoder.pos_embed \(1, 17, 32\) "
                       r"\(expected \(1, 197, 1024\)\)"):  # fmt: skip
        ImageRewardScore(tiny / "ImageReward.pt", tiny / "tokenizer")  # the published sizes: a tiny file does not fit


def test_imagereward_refuses_pickled_code(tiny, tmp_path):
    torch.save({"weights": torch.zeros(1), "not a tensor": Image.new("RGB", (1, 1))}, tmp_path / "pickled.pt")
    with pytest.raises(
        ValueError,
        match=r"is not loaded \(it holds a pickled \S*Image besides tensors, and unpickling that could run code",
    ):
        ImageRewardScore(tmp_path / "pickled.pt", tiny / "tokenizer", arch=tiny / "arch.json")
