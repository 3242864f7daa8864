"""`hpsv2`: HPSv2 / HPSv2.1 (tgxs002/HPSv2), OpenCLIP ViT-H-14 fine-tuned on human choices between generated images.

score = cosine(image embedding, prompt embedding) of the HPS model: both L2-normalized, their dot product, no logit
scale; about 0.2-0.35 on real images (papers print it x100), higher = preferred. This is `score` of
hpsv2/img_score.py (tgxs002/HPSv2@708ffb3), batched and in float32 (the reference runs under CUDA fp16 autocast).

Images get the reference's `preprocess_val`, built by its open_clip fork with `light_augmentation=True` (hpsv2 1.2.0,
src/open_clip/transform.py), not open_clip's usual resize-and-center-crop: RGB, to [0, 1], the longer side resized to
224 (bicubic, antialiased, on the float tensor), centred on a black 224 x 224 square, normalized with CLIP's mean and
std. Nothing is cut off. The reference skips the padding when the longer side is already 224 and so fails on such a
non-square image; here it is padded too.

Prompts: CLIP's BPE from a local CLIP tokenizer folder (laion/CLIP-ViT-H-14-laion2B-s32B-b79K's, the one PickScore's
processor folder holds), 77 tokens: start, up to 75 BPE tokens, end. Before it, open_clip's `basic_clean`: HTML
entities unescaped and curly quotes straightened (ftfy's fix the reference applies most often; ftfy's other repairs,
of mojibake, ligatures and full-width letters, are not made).

Weights: HPS_v2.1_compressed.pt (HPS_v2_compressed.pt for HPSv2.0), huggingface.co/xswu/HPSv2, a dict whose
`state_dict` is open_clip's CLIP state dict; a flat state dict (keys may start with DDP's `module.`) or a
`.safetensors` of it also loads. Read with torch.load(weights_only=True): a file with pickled objects besides tensors is
refused, never run. Nothing is downloaded. To convert once, in a trusted environment:

    import torch, safetensors.torch
    state = torch.load("HPS_v2.1_compressed.pt", map_location="cpu", weights_only=True)["state_dict"]
    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, "HPS_v2.1.safetensors")

`arch` is ViT-H-14 (open_clip's model_configs/ViT-H-14.json, built in) or the path of an open_clip model-config JSON
with a ViT image tower and open_clip's own text tower. The model is transformers' CLIPModel, the same network (exact
GELU, LayerNorm eps 1e-5, class-token and end-of-text pooling), the open_clip keys renamed (checked against the CLIP
of open_clip 3.3.0 and of hpsv2 1.2.0: same keys and shapes for ViT-H-14, the same scores on a tiny model):

| open_clip key                                  | CLIPModel key                                            |
|------------------------------------------------|----------------------------------------------------------|
| visual.conv1.weight                            | vision_model.embeddings.patch_embedding.weight           |
| visual.class_embedding                         | vision_model.embeddings.class_embedding                  |
| visual.positional_embedding                    | vision_model.embeddings.position_embedding.weight        |
| visual.ln_pre.*, visual.ln_post.*              | vision_model.pre_layrnorm.*, vision_model.post_layernorm.* |
| visual.transformer.resblocks.{i}.(block)       | vision_model.encoder.layers.{i}.(block)                  |
| token_embedding.weight                         | text_model.embeddings.token_embedding.weight             |
| positional_embedding                           | text_model.embeddings.position_embedding.weight          |
| transformer.resblocks.{i}.(block)              | text_model.encoder.layers.{i}.(block)                    |
| ln_final.*                                     | text_model.final_layer_norm.*                            |
| visual.proj, text_projection [W, E]            | visual_projection.weight, text_projection.weight [E, W]  |
| logit_scale                                    | logit_scale (not used by the score)                      |
| (block) ln_1.*, ln_2.*                         | layer_norm1.*, layer_norm2.*                             |
| (block) attn.in_proj_weight, _bias [3W, ...]   | self_attn.{q,k,v}_proj.weight, .bias (its thirds)        |
| (block) attn.out_proj.*                        | self_attn.out_proj.*                                     |
| (block) mlp.c_fc.*, mlp.c_proj.*               | mlp.fc1.*, mlp.fc2.*                                     |
"""

from __future__ import annotations

import copy
import functools
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from unirl_core.rewards.checkpoints import check_keys, read_tensors
from unirl_core.rewards.clip import in_batches

# open_clip's model_configs/ViT-H-14.json: the architecture of HPSv2 and HPSv2.1.
VIT_H_14 = {
    "embed_dim": 1024,
    "vision_cfg": {"image_size": 224, "layers": 32, "width": 1280, "head_width": 80, "patch_size": 14},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 1024, "heads": 16, "layers": 24},
}
BUILTIN_ARCHS = {"ViT-H-14": VIT_H_14}
# What the conversion supports; other keys change the network (timm or HF towers, layer scale, attentional pooling).
_ARCH_KEYS = {"embed_dim", "vision_cfg", "text_cfg", "quick_gelu"}
_VISION_KEYS = {"image_size", "layers", "width", "head_width", "patch_size", "mlp_ratio", "patch_dropout"}
_TEXT_KEYS = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"}

CLIP_MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)  # open_clip's OPENAI_DATASET_MEAN
CLIP_STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)
# ftfy's uncurl_quotes: the characters of its SINGLE_QUOTE_RE and DOUBLE_QUOTE_RE.
_STRAIGHT_QUOTES = str.maketrans(
    {**dict.fromkeys("\u02bc\u2018\u2019\u201a\u201b", "'"), **dict.fromkeys("\u201c\u201d\u201e\u201f", '"')}
)

CHECKPOINT_HINT = (
    "HPS_v2.1_compressed.pt (or HPS_v2_compressed.pt) from huggingface.co/xswu/HPSv2, or a .safetensors of its "
    "state dict (see unirl_core/rewards/hpsv2.py)"
)


def load_arch(arch: str) -> dict[str, Any]:
    """The open_clip model config named `arch` (built in) or in the JSON file at path `arch`."""
    if arch in BUILTIN_ARCHS:
        return copy.deepcopy(BUILTIN_ARCHS[arch])
    path = Path(arch).expanduser()
    if path.suffix != ".json" or not path.is_file():
        raise ValueError(
            f"unknown HPSv2 arch {arch!r}: give {' or '.join(BUILTIN_ARCHS)} (HPSv2 and HPSv2.1) or the path of an "
            "open_clip model-config JSON file (embed_dim, vision_cfg, text_cfg)"
        )
    raw = json.loads(path.read_text())
    config = raw.get("model_cfg", raw)  # an open_clip_config.json nests it
    problems = _arch_problems(config)
    if problems:
        raise ValueError(
            f"HPSv2 arch {arch!r} is not an open_clip ViT CLIP config this reward can build ({'; '.join(problems)}): "
            "it needs embed_dim, vision_cfg {image_size, layers, width, patch_size} and text_cfg {context_length, "
            "vocab_size, width, heads, layers}, as in open_clip's ViT-H-14.json"
        )
    return config


def _arch_problems(config: Mapping) -> list[str]:
    vision, text = config.get("vision_cfg", {}), config.get("text_cfg", {})
    parts = (
        ("the config", config, {"embed_dim", "vision_cfg", "text_cfg"}, _ARCH_KEYS),
        ("vision_cfg", vision, {"image_size", "layers", "width", "patch_size"}, _VISION_KEYS),
        ("text_cfg", text, {"context_length", "vocab_size", "width", "heads", "layers"}, _TEXT_KEYS),
    )
    problems = []
    for what, part, needed, allowed in parts:
        if needed - part.keys():
            problems.append(f"{what} lacks {sorted(needed - part.keys())}")
        if part.keys() - allowed:
            problems.append(f"{what} has unsupported {sorted(part.keys() - allowed)}")
    return problems


def _mlp_width(tower: Mapping) -> int:
    return int(tower["width"] * tower.get("mlp_ratio", 4.0))


def open_clip_shapes(config: Mapping) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the state dict of open_clip's `CLIP` built from `config` (ViT image tower, own text tower)."""
    vision, text, embed = config["vision_cfg"], config["text_cfg"], config["embed_dim"]
    vision_width, text_width, patch = vision["width"], text["width"], vision["patch_size"]
    shapes = {
        "positional_embedding": (text["context_length"], text_width),
        "text_projection": (text_width, embed),
        "logit_scale": (),
        "visual.class_embedding": (vision_width,),
        "visual.positional_embedding": ((vision["image_size"] // patch) ** 2 + 1, vision_width),
        "visual.proj": (vision_width, embed),
        "visual.conv1.weight": (vision_width, 3, patch, patch),
        "token_embedding.weight": (text["vocab_size"], text_width),
    }
    for norm, width in (("visual.ln_pre", vision_width), ("visual.ln_post", vision_width), ("ln_final", text_width)):
        shapes |= {f"{norm}.weight": (width,), f"{norm}.bias": (width,)}
    shapes |= _block_shapes("visual.transformer", vision["layers"], vision_width, _mlp_width(vision))
    return shapes | _block_shapes("transformer", text["layers"], text_width, _mlp_width(text))


def _block_shapes(prefix: str, layers: int, width: int, mlp: int) -> dict[str, tuple[int, ...]]:
    block = {
        "ln_1.weight": (width,), "ln_1.bias": (width,),
        "attn.in_proj_weight": (3 * width, width), "attn.in_proj_bias": (3 * width,),
        "attn.out_proj.weight": (width, width), "attn.out_proj.bias": (width,),
        "ln_2.weight": (width,), "ln_2.bias": (width,),
        "mlp.c_fc.weight": (mlp, width), "mlp.c_fc.bias": (mlp,),
        "mlp.c_proj.weight": (width, mlp), "mlp.c_proj.bias": (width,),
    }  # fmt: skip
    return {f"{prefix}.resblocks.{i}.{name}": shape for i in range(layers) for name, shape in block.items()}


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The open_clip state dict in `path` (`.safetensors`, or torch.save of {"state_dict": ...} or of the dict
    itself); a leading `module.` (DDP) is dropped from every key."""
    state = read_tensors(path, "HPSv2 checkpoint", CHECKPOINT_HINT)
    return {key.removeprefix("module."): value for key, value in state.items()}


def check_fits(state: Mapping[str, torch.Tensor], config: Mapping, source: str, arch: str) -> None:
    """A ValueError naming a few missing, unexpected and misshapen keys if `state` is not `arch`'s state dict."""
    mismatch = (
        f"HPSv2 checkpoint {source!r} does not match arch {arch!r} ({{problems}}): give the arch it was trained with "
        "(ViT-H-14 for the published HPSv2 and HPSv2.1 checkpoints)"
    )
    check_keys(state, open_clip_shapes(config), mismatch)


def _clip_model_key(key: str) -> str:
    renames = (
        ("visual.transformer.resblocks.", "vision_model.encoder.layers."),
        ("transformer.resblocks.", "text_model.encoder.layers."),
        ("visual.conv1.", "vision_model.embeddings.patch_embedding."),
        ("visual.class_embedding", "vision_model.embeddings.class_embedding"),
        ("visual.positional_embedding", "vision_model.embeddings.position_embedding.weight"),
        ("visual.ln_pre.", "vision_model.pre_layrnorm."),
        ("visual.ln_post.", "vision_model.post_layernorm."),
        ("token_embedding.", "text_model.embeddings.token_embedding."),
        ("positional_embedding", "text_model.embeddings.position_embedding.weight"),
        ("ln_final.", "text_model.final_layer_norm."),
    )
    for old, new in renames:
        if key.startswith(old):
            key = new + key[len(old) :]
            break
    for old, new in ((".ln_1.", ".layer_norm1."), (".ln_2.", ".layer_norm2."), (".attn.", ".self_attn.")):
        key = key.replace(old, new)
    return key.replace(".mlp.c_fc.", ".mlp.fc1.").replace(".mlp.c_proj.", ".mlp.fc2.")


def clip_model_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (open_clip keys, checked) renamed for transformers' CLIPModel (table in the module docstring)."""
    renamed = {
        "logit_scale": state["logit_scale"],
        "visual_projection.weight": state["visual.proj"].T,
        "text_projection.weight": state["text_projection"].T,
    }
    for key, value in state.items():
        if key in renamed or key in ("visual.proj", "text_projection"):
            continue
        key = _clip_model_key(key)
        if key.endswith(("in_proj_weight", "in_proj_bias")):
            stem, kind = key.rsplit(".in_proj_", 1)
            renamed |= {f"{stem}.{name}_proj.{kind}": third for name, third in zip("qkv", value.chunk(3), strict=True)}
        else:
            renamed[key] = value
    return renamed


def clip_config(config: Mapping, tokenizer: Any):
    """transformers' CLIPConfig of the open_clip `config`, with `tokenizer`'s special tokens."""
    from transformers import CLIPConfig

    vision, text = config["vision_cfg"], config["text_cfg"]
    common = dict(hidden_act="quick_gelu" if config.get("quick_gelu") else "gelu", layer_norm_eps=1e-5)
    return CLIPConfig(
        vision_config=dict(
            common,
            hidden_size=vision["width"],
            intermediate_size=_mlp_width(vision),
            num_hidden_layers=vision["layers"],
            num_attention_heads=vision["width"] // vision.get("head_width", 64),
            image_size=vision["image_size"],
            patch_size=vision["patch_size"],
        ),
        text_config=dict(
            common,
            vocab_size=text["vocab_size"],
            hidden_size=text["width"],
            intermediate_size=_mlp_width(text),
            num_hidden_layers=text["layers"],
            num_attention_heads=text["heads"],
            max_position_embeddings=text["context_length"],
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,  # the text is pooled at its first end-of-text token
            pad_token_id=tokenizer.pad_token_id,
        ),
        projection_dim=config["embed_dim"],
    )


def clean_prompt(text: str) -> str:
    """open_clip's basic_clean without ftfy, but for ftfy's curly-to-straight quotes (module docstring)."""
    return html.unescape(html.unescape(text.translate(_STRAIGHT_QUOTES))).strip()


def hpsv2_pixels(images: Sequence[Image.Image], size: int) -> torch.Tensor:
    """[B, 3, size, size]: HPSv2's preprocess_val (module docstring), image by image."""
    return torch.stack([_letterbox(image, size) for image in images])


def _letterbox(image: Image.Image, size: int) -> torch.Tensor:
    rgb_CHW = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1).float() / 255
    height, width = rgb_CHW.shape[1:]
    scale = size / max(height, width)
    new_height, new_width = round(height * scale), round(width * scale)
    if scale != 1.0:  # torchvision's F.resize of a float tensor, as the reference's ResizeMaxSize calls it
        rgb_CHW = F.interpolate(
            rgb_CHW[None], size=(new_height, new_width), mode="bicubic", align_corners=False, antialias=True
        )[0]
    pad_height, pad_width = size - new_height, size - new_width
    rgb_CHW = F.pad(
        rgb_CHW, (pad_width // 2, pad_width - pad_width // 2, pad_height // 2, pad_height - pad_height // 2)
    )
    return (rgb_CHW - CLIP_MEAN) / CLIP_STD


@dataclass(frozen=True)
class LoadedHPS:
    """An HPS model as a CLIPModel (eval mode, float32, no grad) and its tokenizer on one device; embeddings come
    back float32 and L2-normalized."""

    model: Any  # transformers.CLIPModel
    tokenizer: Any  # transformers.CLIPTokenizer
    image_size: int
    context_length: int
    device: torch.device

    @torch.inference_mode()
    def embed_images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """[B, D] unit-norm image embeddings."""
        pixels_BCHW = hpsv2_pixels(images, self.image_size).to(self.device)
        pooled = self.model.vision_model(pixel_values=pixels_BCHW).pooler_output
        return F.normalize(self.model.visual_projection(pooled), dim=-1)

    @torch.inference_mode()
    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """[B, D] unit-norm prompt embeddings; prompts past the context (75 BPE tokens) are truncated."""
        ids_BT = self.tokenizer(
            [clean_prompt(text) for text in texts],
            padding="max_length",
            truncation=True,
            max_length=self.context_length,
            # Special tokens written in a prompt are text to open_clip; and laion's CLIP tokenizers pad with "!",
            # which the tokenizer would otherwise split out of prompts as the pad token (id 0, not "!</w>").
            split_special_tokens=True,
            return_tensors="pt",
        )["input_ids"]
        # No padding mask, as in open_clip: the causal mask already keeps padding from the end-of-text token.
        pooled = self.model.text_model(input_ids=ids_BT.to(self.device)).pooler_output
        return F.normalize(self.model.text_projection(pooled), dim=-1)


def load_hpsv2(
    checkpoint_path: str | Path, tokenizer_path: str | Path, arch: str = "ViT-H-14", device: str | torch.device = "cpu"
) -> LoadedHPS:
    """The HPS model in `checkpoint_path` (open_clip `arch`) with the CLIP tokenizer in folder `tokenizer_path`, on
    `device`: loaded on the first call and shared by later ones."""
    checkpoint = Path(checkpoint_path).expanduser().resolve()
    if not checkpoint.is_file():
        raise FileNotFoundError(
            f"HPSv2 checkpoint {str(checkpoint_path)!r} not found: give the local path of {CHECKPOINT_HINT}; "
            "nothing is downloaded"
        )
    tokenizer = Path(tokenizer_path).expanduser().resolve()
    if not any((tokenizer / name).is_file() for name in ("tokenizer.json", "vocab.json")):
        raise FileNotFoundError(
            f"CLIP tokenizer folder {str(tokenizer_path)!r} has no tokenizer.json or vocab.json: give a folder written "
            "by CLIPTokenizer (or CLIPProcessor).save_pretrained, e.g. a copy of laion/CLIP-ViT-H-14-laion2B-s32B-b79K "
            "(PickScore's processor folder); nothing is downloaded"
        )
    arch_key = str(Path(arch).expanduser().resolve()) if arch.endswith(".json") else arch
    return _load_hpsv2(str(checkpoint), str(tokenizer), arch_key, str(torch.device(device)))


@functools.cache
def _load_hpsv2(checkpoint: str, tokenizer_folder: str, arch: str, device: str) -> LoadedHPS:
    from transformers import CLIPModel, CLIPTokenizer

    config = load_arch(arch)
    state = read_state_dict(Path(checkpoint))
    check_fits(state, config, checkpoint, arch)
    tokenizer = CLIPTokenizer.from_pretrained(tokenizer_folder, local_files_only=True)
    if len(tokenizer) > config["text_cfg"]["vocab_size"]:
        raise ValueError(
            f"CLIP tokenizer {tokenizer_folder!r} has {len(tokenizer)} tokens but arch {arch!r} embeds "
            f"{config['text_cfg']['vocab_size']}: give the tokenizer the model was trained with (CLIP's, 49408)"
        )
    model = CLIPModel(clip_config(config, tokenizer))  # float32; the checkpoint's float16 tensors are cast on load
    model.load_state_dict(clip_model_state(state))
    model = model.to(device).eval().requires_grad_(False)
    image_size, context_length = config["vision_cfg"]["image_size"], config["text_cfg"]["context_length"]
    return LoadedHPS(model, tokenizer, image_size, context_length, torch.device(device))


class HPSv2Score:
    """The `hpsv2` reward: cosine(image, prompt) of the HPSv2 (or HPSv2.1) model per sample."""

    def __init__(
        self,
        checkpoint_path: str | Path,
        tokenizer_path: str | Path,
        arch: str = "ViT-H-14",
        device: str | torch.device = "cpu",
        batch_size: int = 16,
    ):
        self.hps = load_hpsv2(checkpoint_path, tokenizer_path, arch, device)
        self.batch_size = batch_size

    def __call__(
        self, images: Sequence[Image.Image], prompts: Sequence[str], sample_ids: Sequence[str] = ()
    ) -> np.ndarray:
        if len(prompts) != len(images):
            raise ValueError(f"hpsv2 needs one prompt per image; got {len(prompts)} for {len(images)} images")
        if not images:
            return np.zeros(0)
        image_BD = in_batches(self.hps.embed_images, list(images), self.batch_size)
        text_BD = in_batches(self.hps.embed_texts, list(prompts), self.batch_size)
        return (image_BD * text_BD).sum(dim=-1).cpu().double().numpy()
