"""`imagereward`: ImageReward (THUDM/ImageReward), BLIP fine-tuned on human rankings of text-to-image outputs.

score = (head(h) - 0.16717362830052426) / 1.0333394966054072, h = the first ([CLS]) output of BLIP's BERT text
encoder reading the prompt (bert-base-uncased, padded and truncated to 35 tokens) with cross-attention over every
token of the image's BLIP ViT-L/16 encoding (224 x 224). head = Linear 768 -> 1024 -> 128 -> 64 -> 16 -> 1 with no
activations between (the published ReLUs are commented out; its dropouts are no-ops at inference). The constants
make the published model's scores about zero-mean, unit-variance on its training data; higher = preferred.
This is `ImageReward.score` of ImageReward/ImageReward.py (THUDM/ImageReward@c0b9080), batched.

Weights: the published `ImageReward.pt` (huggingface.co/THUDM/ImageReward), a state dict in the reference's own
module names, read with `torch.load(weights_only=True)` (no pickled code runs), or a `.safetensors` of the same dict:

    import torch, safetensors.torch
    state = torch.load("ImageReward.pt", map_location="cpu", weights_only=True)
    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, "ImageReward.safetensors")

The tokenizer is a local copy of bert-base-uncased's (vocab.txt or tokenizer.json). Nothing is downloaded.

The model is transformers' port of the same BLIP code (`BlipVisionModel`, and `BlipTextModel` with cross-attention
as in `BlipForImageTextRetrieval`). Reference keys are renamed onto it; the text encoder and head keep theirs:

| reference key                              | here                                                     |
|--------------------------------------------|----------------------------------------------------------|
| blip.visual_encoder.cls_token, .pos_embed  | visual_encoder.embeddings.class_/position_embedding      |
| blip.visual_encoder.patch_embed.proj.*     | visual_encoder.embeddings.patch_embedding.*              |
| blip.visual_encoder.blocks.{i}.norm{1,2}.* | visual_encoder.encoder.layers.{i}.layer_norm{1,2}.*      |
| blip.visual_encoder.blocks.{i}.attn.qkv.*  | visual_encoder.encoder.layers.{i}.self_attn.qkv.*        |
| blip.visual_encoder.blocks.{i}.attn.proj.* | visual_encoder.encoder.layers.{i}.self_attn.projection.* |
| blip.visual_encoder.blocks.{i}.mlp.fc*.*   | visual_encoder.encoder.layers.{i}.mlp.fc*.*              |
| blip.visual_encoder.norm.*                 | visual_encoder.post_layernorm.*                          |
| blip.text_encoder.*                        | text_encoder.*                                           |
| mlp.layers.{0,2,4,6,7}.*                   | mlp.layers.{0,2,4,6,7}.*                                 |

Ignored, as the reference's non-strict load leaves them unused: blip.vision_proj.*, blip.text_proj.* (BLIP's
contrastive projections) and the buffer blip.text_encoder.embeddings.position_ids. Any other key, or a missing one,
is an error. Where transformers' port differs from the reference, the reference's value is used: the ViT's
LayerNorm eps is 1e-6 (BLIP's vit.py), not BlipVisionConfig's 1e-5; the text encoder has 12 heads (med_config.json),
not BlipTextConfig's 8; images are resized (shorter side, bicubic) and center-cropped as the reference's torchvision
transform does, not squashed to a square as BlipImageProcessor does. The tokenizer gets the reference's [DEC] and
[ENC] special tokens (ids 30522, 30523), but, as in `score`, the first token stays [CLS]: no [ENC] substitution.
Padded prompt tokens are masked with -10000 there and the dtype's minimum here: the same softmax in float32.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from unirl_core.rewards.checkpoints import check_keys, read_tensors
from unirl_core.rewards.clip import in_batches

SCORE_MEAN = 0.16717362830052426
SCORE_STD = 1.0333394966054072
MAX_PROMPT_TOKENS = 35
IMAGE_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)  # CLIP's, as the reference's
IMAGE_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
HEAD_LINEAR_INDICES = (0, 2, 4, 6, 7)  # the reference's nn.Sequential: dropouts at 1, 3, 5
UNUSED_KEYS = re.compile(r"blip\.(vision_proj|text_proj)\.(weight|bias)|blip\.text_encoder\.embeddings\.position_ids")
CHECKPOINT_HINT = "ImageReward.pt from huggingface.co/THUDM/ImageReward (a state dict), or a .safetensors of it"


@dataclass(frozen=True)
class ImageRewardArch:
    """Sizes of the model; the defaults are the published ImageReward-v1.0's (only tests change them).
    MLP widths are 4 x the hidden width in both encoders, as published."""

    image_size: int = 224
    patch_size: int = 16
    vision_width: int = 1024
    vision_layers: int = 24
    vision_heads: int = 16
    text_vocab_size: int = 30524  # bert-base-uncased's 30522 + [DEC] + [ENC]
    text_width: int = 768
    text_layers: int = 12
    text_heads: int = 12
    text_max_positions: int = 512
    head_widths: tuple[int, ...] = (1024, 128, 64, 16)  # between text_width and the single score

    def __post_init__(self):
        object.__setattr__(self, "head_widths", tuple(self.head_widths))
        if len(self.head_widths) != 4:
            raise ValueError(f"head_widths {self.head_widths}: the ImageReward head has 4 hidden widths")

    @classmethod
    def from_source(cls, source: str | Path | Mapping[str, Any] | None) -> ImageRewardArch:
        """The published sizes (None), or those in a dict or a JSON file of these fields."""
        if source is None:
            return cls()
        fields = dict(source) if isinstance(source, Mapping) else json.loads(Path(source).read_text())
        unknown = sorted(set(fields) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"ImageReward arch {source!r}: unknown fields {unknown}")
        return cls(**fields)

    def vision_config(self):
        from transformers import BlipVisionConfig

        width = self.vision_width
        return BlipVisionConfig(
            hidden_size=width,
            intermediate_size=4 * width,
            num_hidden_layers=self.vision_layers,
            num_attention_heads=self.vision_heads,
            image_size=self.image_size,
            patch_size=self.patch_size,
            layer_norm_eps=1e-6,  # BLIP's vit.py (timm); BlipVisionConfig's default is 1e-5
        )

    def text_config(self):
        from transformers import BlipTextConfig

        return BlipTextConfig(
            vocab_size=self.text_vocab_size,
            hidden_size=self.text_width,
            encoder_hidden_size=self.vision_width,
            intermediate_size=4 * self.text_width,
            num_hidden_layers=self.text_layers,
            num_attention_heads=self.text_heads,
            max_position_embeddings=self.text_max_positions,
            layer_norm_eps=1e-12,
            pad_token_id=0,
            bos_token_id=self.text_vocab_size - 2,  # [DEC] (unused by the score)
            is_decoder=True,  # builds the cross-attention layers; the forward runs bidirectional (is_decoder=False)
        )

    def reference_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every key of the reference's ImageReward module that the score uses, with its shape."""
        return {**self._vision_shapes(), **self._text_shapes(), **self._head_shapes()}

    def _vision_shapes(self) -> dict[str, tuple[int, ...]]:
        c, p, n = self.vision_width, self.patch_size, (self.image_size // self.patch_size) ** 2
        shapes = {"cls_token": (1, 1, c), "pos_embed": (1, n + 1, c), **_linear("patch_embed.proj", c, 3, p, p)}
        for i in range(self.vision_layers):
            block = f"blocks.{i}."
            shapes |= _norm(block + "norm1", c) | _linear(block + "attn.qkv", 3 * c, c)
            shapes |= _linear(block + "attn.proj", c, c) | _norm(block + "norm2", c)
            shapes |= _linear(block + "mlp.fc1", 4 * c, c) | _linear(block + "mlp.fc2", c, 4 * c)
        shapes |= _norm("norm", c)
        return {f"blip.visual_encoder.{key}": shape for key, shape in shapes.items()}

    def _text_shapes(self) -> dict[str, tuple[int, ...]]:
        h = self.text_width
        shapes = {"embeddings.word_embeddings.weight": (self.text_vocab_size, h)}
        shapes |= {"embeddings.position_embeddings.weight": (self.text_max_positions, h)}
        shapes |= _norm("embeddings.LayerNorm", h)
        for i in range(self.text_layers):
            layer = f"encoder.layer.{i}."
            for part, key_width in (("attention.", h), ("crossattention.", self.vision_width)):
                shapes |= _linear(layer + part + "self.query", h, h)
                shapes |= _linear(layer + part + "self.key", h, key_width)
                shapes |= _linear(layer + part + "self.value", h, key_width)
                shapes |= _linear(layer + part + "output.dense", h, h) | _norm(layer + part + "output.LayerNorm", h)
            shapes |= _linear(layer + "intermediate.dense", 4 * h, h) | _linear(layer + "output.dense", h, 4 * h)
            shapes |= _norm(layer + "output.LayerNorm", h)
        return {f"blip.text_encoder.{key}": shape for key, shape in shapes.items()}

    def _head_shapes(self) -> dict[str, tuple[int, ...]]:
        widths = (self.text_width, *self.head_widths, 1)
        shapes = {}
        for index, fan_in, out in zip(HEAD_LINEAR_INDICES, widths[:-1], widths[1:], strict=True):
            shapes |= _linear(f"mlp.layers.{index}", out, fan_in)
        return shapes


def _linear(name: str, out: int, *fan_in: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (out, *fan_in), f"{name}.bias": (out,)}


def _norm(name: str, width: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (width,), f"{name}.bias": (width,)}


_VISION_RENAMES = (
    (r"cls_token", "embeddings.class_embedding"),
    (r"pos_embed", "embeddings.position_embedding"),
    (r"patch_embed\.proj\.(\w+)", r"embeddings.patch_embedding.\1"),
    (r"blocks\.(\d+)\.norm([12])\.(\w+)", r"encoder.layers.\1.layer_norm\2.\3"),
    (r"blocks\.(\d+)\.attn\.qkv\.(\w+)", r"encoder.layers.\1.self_attn.qkv.\2"),
    (r"blocks\.(\d+)\.attn\.proj\.(\w+)", r"encoder.layers.\1.self_attn.projection.\2"),
    (r"blocks\.(\d+)\.mlp\.(fc[12])\.(\w+)", r"encoder.layers.\1.mlp.\2.\3"),
    (r"norm\.(\w+)", r"post_layernorm.\1"),
)


def model_key(reference_key: str) -> str:
    """The name in `ImageRewardModel` of the reference's parameter `reference_key` (a key of `reference_shapes`)."""
    if reference_key.startswith("blip.visual_encoder."):
        tail = reference_key.removeprefix("blip.visual_encoder.")
        for pattern, replacement in _VISION_RENAMES:
            if re.fullmatch(pattern, tail):
                return "visual_encoder." + re.sub(pattern, replacement, tail)
        raise AssertionError(f"no rename rule for {reference_key}")
    return reference_key.removeprefix("blip.")


class ImageRewardHead(torch.nn.Module):
    """The reference's MLP: Linear layers at layers.{0,2,4,6,7}, dropouts between, no activations. [B, D] -> [B]."""

    def __init__(self, widths: Sequence[int]):
        super().__init__()
        linears = [torch.nn.Linear(fan_in, out) for fan_in, out in zip(widths[:-1], widths[1:], strict=True)]
        first, second, third, fourth, last = linears
        self.layers = torch.nn.Sequential(
            first, torch.nn.Dropout(0.2), second, torch.nn.Dropout(0.2), third, torch.nn.Dropout(0.1), fourth, last
        )

    def forward(self, features_BD: torch.Tensor) -> torch.Tensor:
        return self.layers(features_BD).squeeze(-1)


class ImageRewardModel(torch.nn.Module):
    """BLIP ViT + BERT with cross-attention + head, under the names `model_key` gives: (pixels, tokens) -> scores."""

    def __init__(self, arch: ImageRewardArch):
        from transformers import BlipTextModel, BlipVisionModel

        super().__init__()
        self.visual_encoder = BlipVisionModel(arch.vision_config())
        self.text_encoder = BlipTextModel(arch.text_config(), add_pooling_layer=False)
        self.mlp = ImageRewardHead((arch.text_width, *arch.head_widths, 1))

    def forward(self, pixels_BCHW: torch.Tensor, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor):
        """[B] normalized scores."""
        image_BND = self.visual_encoder(pixel_values=pixels_BCHW).last_hidden_state
        image_mask_BN = torch.ones(image_BND.shape[:-1], dtype=torch.long, device=image_BND.device)
        text_BTD = self.text_encoder(
            input_ids=input_ids_BT,
            attention_mask=attention_mask_BT,
            encoder_hidden_states=image_BND,
            encoder_attention_mask=image_mask_BN,
        ).last_hidden_state
        return (self.mlp(text_BTD[:, 0, :].float()) - SCORE_MEAN) / SCORE_STD


def preprocess(images: Sequence[Image.Image], size: int) -> torch.Tensor:
    """[B, 3, size, size]: the reference's transform (torchvision Resize(size, BICUBIC), CenterCrop(size), RGB,
    ToTensor, Normalize(CLIP mean, std)), in the same order, with PIL and numpy."""
    pixels = []
    for image in images:
        width, height = image.size
        # The shorter side becomes `size`, the longer one int(size * long / short), as torchvision computes it.
        new_size = (size, int(size * height / width)) if width <= height else (int(size * width / height), size)
        if new_size != image.size:
            image = image.resize(new_size, Image.BICUBIC)
        left, top = int(round((new_size[0] - size) / 2.0)), int(round((new_size[1] - size) / 2.0))
        rgb_HWC = np.asarray(image.crop((left, top, left + size, top + size)).convert("RGB"), dtype=np.float32) / 255
        pixels.append((rgb_HWC - IMAGE_MEAN) / IMAGE_STD)
    return torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).contiguous()


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors in a `.pt`/`.pth` state dict (torch.load with weights_only=True) or a `.safetensors` file."""
    return read_tensors(path, "ImageReward checkpoint", CHECKPOINT_HINT)


def model_state(state: Mapping[str, torch.Tensor], arch: ImageRewardArch, source: str) -> dict[str, torch.Tensor]:
    """`state` (reference names) checked against `arch` and renamed for `ImageRewardModel`, as float32."""
    expected = arch.reference_shapes()
    mismatch = f"ImageReward checkpoint {source!r} does not fit the model ({{problems}}): give {CHECKPOINT_HINT}"
    check_keys(state, expected, mismatch, ignored=UNUSED_KEYS)
    return {model_key(key): state[key].float() for key in expected}


def load_tokenizer(folder: str, vocab_size: int):
    """bert-base-uncased's tokenizer from `folder` with the reference's [DEC] (bos) and [ENC] tokens added."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    if len(tokenizer) != vocab_size:
        raise ValueError(
            f"tokenizer {folder!r} has {len(tokenizer)} tokens with [DEC] and [ENC] but the text encoder embeds "
            f"{vocab_size}: use bert-base-uncased's tokenizer (30522 + 2)"
        )
    return tokenizer


@dataclass(frozen=True)
class LoadedImageReward:
    """An ImageRewardModel (eval mode, float32, no grad) and its tokenizer on one device."""

    model: ImageRewardModel
    tokenizer: Any  # transformers.BertTokenizer with [DEC] and [ENC]
    arch: ImageRewardArch
    device: torch.device

    @torch.inference_mode()
    def score(self, pairs: Sequence[tuple[Image.Image, str]]) -> torch.Tensor:
        """[B] scores of (image, prompt) pairs. Prompts are padded to 35 tokens: a score ignores its batch-mates."""
        images, prompts = zip(*pairs, strict=True)
        pixels_BCHW = preprocess(images, self.arch.image_size).to(self.device)
        tokens = self.tokenizer(
            list(prompts), padding="max_length", truncation=True, max_length=MAX_PROMPT_TOKENS, return_tensors="pt"
        ).to(self.device)
        return self.model(pixels_BCHW, tokens["input_ids"], tokens["attention_mask"])


def load_imagereward(
    checkpoint_path: str | Path,
    tokenizer_path: str | Path,
    device: str | torch.device = "cpu",
    arch: str | Path | Mapping[str, Any] | None = None,
) -> LoadedImageReward:
    """The ImageReward checkpoint and tokenizer on `device`, loaded on the first call and shared by later ones."""
    checkpoint = Path(checkpoint_path).expanduser().resolve()
    if not checkpoint.is_file():
        raise FileNotFoundError(
            f"ImageReward checkpoint {str(checkpoint_path)!r} does not exist: give the local {CHECKPOINT_HINT}; "
            "nothing is downloaded"
        )
    tokenizer = Path(tokenizer_path).expanduser().resolve()
    if not any((tokenizer / name).is_file() for name in ("vocab.txt", "tokenizer.json")):
        raise FileNotFoundError(
            f"ImageReward tokenizer folder {str(tokenizer_path)!r} has no vocab.txt or tokenizer.json: give a local "
            "copy of bert-base-uncased's tokenizer (as the reference uses); nothing is downloaded"
        )
    return _load(str(checkpoint), str(tokenizer), ImageRewardArch.from_source(arch), str(torch.device(device)))


@functools.cache
def _load(checkpoint: str, tokenizer_folder: str, arch: ImageRewardArch, device: str) -> LoadedImageReward:
    state = model_state(read_state_dict(checkpoint), arch, checkpoint)
    model = ImageRewardModel(arch)
    model.load_state_dict(state, strict=True)
    tokenizer = load_tokenizer(tokenizer_folder, arch.text_vocab_size)
    return LoadedImageReward(model.to(device).eval().requires_grad_(False), tokenizer, arch, torch.device(device))


class ImageRewardScore:
    """The `imagereward` reward: ImageReward's normalized preference score of each (image, prompt)."""

    def __init__(
        self,
        checkpoint_path: str | Path,
        tokenizer_path: str | Path,
        device: str | torch.device = "cpu",
        batch_size: int = 16,
        arch: str | Path | Mapping[str, Any] | None = None,
    ):
        self.loaded = load_imagereward(checkpoint_path, tokenizer_path, device, arch)
        self.batch_size = batch_size

    def __call__(
        self, images: Sequence[Image.Image], prompts: Sequence[str], sample_ids: Sequence[str] = ()
    ) -> np.ndarray:
        if len(prompts) != len(images):
            raise ValueError(f"imagereward needs one prompt per image; got {len(prompts)} for {len(images)} images")
        if not images:
            return np.zeros(0)
        pairs = list(zip(images, prompts, strict=True))
        return in_batches(self.loaded.score, pairs, self.batch_size).cpu().double().numpy()
