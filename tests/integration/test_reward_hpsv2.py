"""The `hpsv2` reward on a tiny HPS-format model (open_clip's ViT CLIP layout, random weights, a torch.save'd
checkpoint): it scores as HPSv2's own steps do, does not depend on batching, loads every checkpoint form once, and
names what is wrong with a checkpoint, an arch or a path."""

from __future__ import annotations

import html

import numpy as np
import pytest
import regex
import torch
import torch.nn.functional as F
from PIL import Image
from transformers.convert_slow_tokenizer import bytes_to_unicode

from unirl_core.models.tiny_open_clip import TINY_ARCH, write_tiny_open_clip
from unirl_core.rewards.hpsv2 import HPSv2Score

pytestmark = pytest.mark.slow  # real transformers CLIP models: about 5 s in all

PROMPTS = ["a red square", "a cat’s “hat” &amp; a mat!", "", "very long prompt " * 30, " UPPER\tcase  spaces!!"]
SIZES = [(40, 48), (32, 32), (100, 30), (12, 20), (64, 64)]  # (height, width): padded, as is, down, up, down


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_open_clip(tmp_path_factory.mktemp("hps") / "tiny", seed=0)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)) for size in SIZES]


def hps(paths, checkpoint=None, **kwargs) -> HPSv2Score:
    return HPSv2Score(checkpoint or paths.checkpoint, paths.tokenizer, str(paths.arch), **kwargs)


# HPSv2's scoring, step by step, after hpsv2/img_score.py (tgxs002/HPSv2@708ffb3) and the open_clip fork it runs
# (hpsv2 1.2.0), in plain torch: open_clip needs torchvision, which has no CPU build to go with CPU torch.


def reference_pixels(image: Image.Image) -> torch.Tensor:
    """preprocess_val with light_augmentation=True: RGB, ToTensor, ResizeMaxSize(32, fill=0), Normalize."""
    tensor = torch.from_numpy(np.array(image.convert("RGB"), dtype=np.uint8)).permute(2, 0, 1).float().div(255)
    height, width = tensor.shape[1:]
    scale = 32 / float(max(height, width))
    if scale != 1.0:
        new_size = tuple(round(dim * scale) for dim in (height, width))
        tensor = F.interpolate(tensor[None], new_size, mode="bicubic", align_corners=False, antialias=True)[0]
        pad_h, pad_w = 32 - new_size[0], 32 - new_size[1]
        tensor = F.pad(tensor, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2], value=0)
    mean, std = torch.tensor([0.48145466, 0.4578275, 0.40821073]), torch.tensor([0.26862954, 0.26130258, 0.27577711])
    return (tensor - mean[:, None, None]) / std[:, None, None]


def reference_tokens(text: str) -> torch.Tensor:
    """open_clip's tokenize([text]) on the tiny vocabulary (no BPE merges: each character its byte symbol, the last
    one word-final); ftfy.fix_text reduced to its uncurl_quotes, the one of its fixes these prompts need."""
    text = regex.sub("[\u201c-\u201f]", '"', regex.sub("[\u02bc\u2018-\u201b]", "'", text))
    text = regex.sub(r"\s+", " ", html.unescape(html.unescape(text)).strip()).strip().lower()
    byte_ids = {byte: i for i, byte in enumerate(bytes_to_unicode())}  # the tiny vocabulary's order
    pattern = r"<start_of_text>|<end_of_text>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"
    encoded = []
    for word in regex.findall(pattern, text, regex.IGNORECASE):
        ids = [byte_ids[byte] for byte in word.encode("utf-8")]
        encoded += ids[:-1] + [256 + ids[-1]]  # the word-final symbols follow the 256 plain ones
    tokens = [512, *encoded, 513]  # <start_of_text>, ..., <end_of_text>
    if len(tokens) > 77:
        tokens = tokens[:77]
        tokens[-1] = 513
    return torch.tensor(tokens + [0] * (77 - len(tokens)))


def reference_blocks(x_LBD: torch.Tensor, state: dict, prefix: str, tower: dict, mask=None) -> torch.Tensor:
    """open_clip's Transformer: ResidualAttentionBlocks (ln_1, attention, ln_2, c_fc, GELU, c_proj) on [L, B, D]."""
    heads = tower.get("heads") or tower["width"] // tower["head_width"]
    for i in range(tower["layers"]):
        p = f"{prefix}.resblocks.{i}."
        h = F.layer_norm(x_LBD, x_LBD.shape[-1:], state[p + "ln_1.weight"], state[p + "ln_1.bias"], 1e-5)
        x_LBD = x_LBD + F.multi_head_attention_forward(
            h, h, h, h.shape[-1], heads, state[p + "attn.in_proj_weight"], state[p + "attn.in_proj_bias"],
            None, None, False, 0.0, state[p + "attn.out_proj.weight"], state[p + "attn.out_proj.bias"],
            training=False, need_weights=False, attn_mask=mask,
        )[0]  # fmt: skip
        h = F.layer_norm(x_LBD, x_LBD.shape[-1:], state[p + "ln_2.weight"], state[p + "ln_2.bias"], 1e-5)
        h = F.gelu(F.linear(h, state[p + "mlp.c_fc.weight"], state[p + "mlp.c_fc.bias"]))
        x_LBD = x_LBD + F.linear(h, state[p + "mlp.c_proj.weight"], state[p + "mlp.c_proj.bias"])
    return x_LBD


def reference_features(state: dict, image_BCHW: torch.Tensor, text_BT: torch.Tensor):
    """CLIP.forward's image_features and text_features (encode_image/encode_text with normalize=True)."""
    vision, text = TINY_ARCH["vision_cfg"], TINY_ARCH["text_cfg"]
    x = F.conv2d(image_BCHW, state["visual.conv1.weight"], stride=vision["patch_size"]).flatten(2).permute(0, 2, 1)
    x = (
        torch.cat([state["visual.class_embedding"].expand(len(x), 1, -1), x], dim=1)
        + state["visual.positional_embedding"]
    )
    x = F.layer_norm(x, x.shape[-1:], state["visual.ln_pre.weight"], state["visual.ln_pre.bias"], 1e-5)
    x = reference_blocks(x.permute(1, 0, 2), state, "visual.transformer", vision)
    pooled = F.layer_norm(x[0], x.shape[-1:], state["visual.ln_post.weight"], state["visual.ln_post.bias"], 1e-5)
    image_features = F.normalize(pooled @ state["visual.proj"], dim=-1)
    t = state["token_embedding.weight"][text_BT] + state["positional_embedding"]
    causal = torch.full((text["context_length"],) * 2, float("-inf")).triu(1)
    t = reference_blocks(t.permute(1, 0, 2), state, "transformer", text, causal).permute(1, 0, 2)
    t = F.layer_norm(t, t.shape[-1:], state["ln_final.weight"], state["ln_final.bias"], 1e-5)
    eot = t[torch.arange(len(t)), text_BT.argmax(dim=-1)]  # end-of-text has the highest id
    return image_features, F.normalize(eot @ state["text_projection"], dim=-1)


def test_hpsv2_equals_the_reference_scorer(tiny, images):
    assert tiny.checkpoint.stat().st_size < 200_000
    ours = hps(tiny, batch_size=2)(images, PROMPTS)
    assert ours.dtype == np.float64 and ours.shape == (len(PROMPTS),) and np.isfinite(ours).all()
    checkpoint = torch.load(tiny.checkpoint, map_location="cpu")
    state = {key: value.float() for key, value in checkpoint["state_dict"].items()}  # load_state_dict: into float32
    reference = []
    with torch.no_grad():
        for image, prompt in zip(images, PROMPTS, strict=True):  # one at a time, as `score` does
            pixels, text = reference_pixels(image)[None], reference_tokens(prompt)[None]
            image_features, text_features = reference_features(state, pixels, text)
            reference.append(float(torch.diagonal(image_features @ text_features.T)[0]))
    assert np.allclose(ours, reference, atol=1e-5)
    assert len(set(np.round(ours, 4))) == len(PROMPTS)  # not a constant


def test_a_non_square_image_is_padded_not_cropped(tiny):
    narrow = Image.fromarray(np.random.default_rng(1).integers(0, 256, (32, 20, 3), dtype=np.uint8))
    on_black = Image.new("RGB", (32, 32))
    on_black.paste(narrow, (6, 0))  # centred: 12 columns of padding, 6 a side
    scores = hps(tiny)([narrow, on_black, narrow.crop((0, 6, 20, 26))], ["a cat"] * 3)
    assert scores[0] == pytest.approx(scores[1], abs=1e-6) and scores[0] != pytest.approx(scores[2], abs=1e-3)


def test_hpsv2_is_deterministic_batch_invariant_and_loaded_once(tiny, images, tmp_path):
    batched = hps(tiny, batch_size=4)
    one_by_one = hps(tiny, batch_size=1)
    assert np.allclose(batched(images, PROMPTS), one_by_one(images, PROMPTS), atol=1e-6)
    assert batched.hps is one_by_one.hps
    model = batched.hps.model
    assert not model.training and not any(p.requires_grad or p.dtype != torch.float32 for p in model.parameters())
    same_seed = write_tiny_open_clip(tmp_path / "again", seed=0)
    assert np.array_equal(hps(same_seed, batch_size=4)(images, PROMPTS), batched(images, PROMPTS))
    other_seed = write_tiny_open_clip(tmp_path / "other", seed=1)
    assert not np.allclose(hps(other_seed)(images, PROMPTS), batched(images, PROMPTS), atol=1e-3)
    assert hps(tiny)([], []).shape == (0,)
    with pytest.raises(ValueError, match="one prompt per image; got 1 for 2 images"):
        batched(images[:2], PROMPTS[:1])


def test_flat_ddp_and_safetensors_checkpoints_score_the_same(tiny, images, tmp_path):
    from safetensors.torch import save_file

    state = torch.load(tiny.checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    torch.save({f"module.{key}": value for key, value in state.items()}, tmp_path / "ddp_flat.pt")
    save_file({key: value.contiguous() for key, value in state.items()}, str(tmp_path / "hps.safetensors"))
    expected = hps(tiny)(images, PROMPTS)
    for path in (tmp_path / "ddp_flat.pt", tmp_path / "hps.safetensors"):
        assert np.allclose(hps(tiny, checkpoint=path)(images, PROMPTS), expected, atol=1e-6)


def test_missing_files_are_named_and_nothing_is_downloaded(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"checkpoint '.*nowhere\.pt' not found: .*HPS_v2\.1_compressed\.pt.*"
                       r"xswu/HPSv2.*\.safetensors.*nothing is downloaded"):  # fmt: skip
        HPSv2Score(tmp_path / "nowhere.pt", tiny.tokenizer)
    with pytest.raises(
        FileNotFoundError, match="CLIP tokenizer folder .* has no tokenizer.json.*nothing is downloaded"
    ):
        HPSv2Score(tiny.checkpoint, tmp_path)


def test_a_checkpoint_of_another_arch_or_an_unknown_arch_is_refused(tiny, tmp_path):
    with pytest.raises(ValueError, match=r"does not match arch 'ViT-H-14' \(\d+ missing keys, e\.g\. .*wrong shapes"):
        HPSv2Score(tiny.checkpoint, tiny.tokenizer)  # the default arch: no ViT-H-14 is built to find out
    with pytest.raises(ValueError, match="unknown HPSv2 arch 'ViT-B-32': give ViT-H-14 .* open_clip model-config JSON"):
        HPSv2Score(tiny.checkpoint, tiny.tokenizer, "ViT-B-32")
    timm_arch = tmp_path / "timm.json"
    timm_arch.write_text('{"embed_dim": 16, "vision_cfg": {"timm_model_name": "vit"}, "text_cfg": {}}')
    with pytest.raises(ValueError, match=r"vision_cfg has unsupported \['timm_model_name'\]"):
        HPSv2Score(tiny.checkpoint, tiny.tokenizer, str(timm_arch))


class NotAWeight:
    """Anything torch.save pickles by reference; unpickling such a thing can run code."""


def test_a_checkpoint_with_pickled_objects_is_refused(tiny, tmp_path):
    state = torch.load(tiny.checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    torch.save({"state_dict": state, "args": NotAWeight()}, tmp_path / "pickled.pt")
    with pytest.raises(ValueError, match=r"is not loaded \(it holds a pickled \S*NotAWeight besides tensors"):
        hps(tiny, checkpoint=tmp_path / "pickled.pt")
