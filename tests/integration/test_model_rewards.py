"""Model rewards on a real tiny CLIP (transformers' CLIPModel, random weights, saved and loaded from a folder):
`clip_score` agrees with CLIP's own forward, does not depend on batching, loads once per process; `aesthetic`
scores with a safetensors head; a recipe's reward section builds the whole composite."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from unirl_core.config.schema import AestheticRewardConfig, ClipRewardConfig, RewardConfig
from unirl_core.models.tiny_clip import TINY_CLIP_EMBED_DIM, write_tiny_aesthetic_head, write_tiny_clip
from unirl_core.rewards.aesthetic import AestheticScore
from unirl_core.rewards.clip import ClipScore, load_clip
from unirl_core.rewards.service import RewardService

pytestmark = pytest.mark.slow  # real transformers models: about 10 s in all

PROMPTS = ["a red square", "a photo of a cat on a mat", "", "very long prompt " * 20]


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    return write_tiny_clip(tmp_path_factory.mktemp("tiny-clip") / "clip", seed=0)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in PROMPTS]


def test_tiny_clip_is_small_and_loads_offline(clip_folder):
    assert sum(f.stat().st_size for f in clip_folder.iterdir()) < 400_000
    assert load_clip(clip_folder).embed_dim == TINY_CLIP_EMBED_DIM


def test_clip_score_is_100_x_clip_cosine(clip_folder, images):
    scores = ClipScore(clip_folder)(images, PROMPTS)
    assert scores.shape == (4,) and np.isfinite(scores).all() and (np.abs(scores) <= 100).all()
    clip = load_clip(clip_folder)  # the reference: CLIPModel's own forward, logits = exp(logit_scale) x cosine
    inputs = clip.processor(text=PROMPTS, images=images, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = clip.model(**inputs).logits_per_image.diagonal() / clip.model.logit_scale.exp()
    assert np.allclose(scores, 100 * logits.numpy(), atol=1e-4)
    assert len(set(np.round(scores, 3))) == 4  # not a constant


def test_clip_score_is_deterministic_and_batch_invariant(clip_folder, images, tmp_path):
    batched = ClipScore(clip_folder, batch_size=4)(images, PROMPTS)
    one_by_one = ClipScore(clip_folder, batch_size=1)(images, PROMPTS)
    assert np.allclose(batched, one_by_one, atol=1e-4)
    same_seed = write_tiny_clip(tmp_path / "again", seed=0)
    assert np.array_equal(ClipScore(same_seed)(images, PROMPTS), batched)
    other_seed = write_tiny_clip(tmp_path / "other", seed=1)
    assert not np.allclose(ClipScore(other_seed)(images, PROMPTS), batched)


def test_clip_loads_once_per_folder_and_device(tmp_path, monkeypatch, images):
    from transformers import CLIPModel

    folder = write_tiny_clip(tmp_path / "clip", seed=0)
    loads = []
    original = CLIPModel.from_pretrained.__func__
    monkeypatch.setattr(
        CLIPModel, "from_pretrained", classmethod(lambda cls, *a, **k: loads.append(a) or original(cls, *a, **k))
    )
    first = ClipScore(folder)
    second = ClipScore(str(tmp_path / "." / "clip"), device=torch.device("cpu"), batch_size=1)
    head = write_tiny_aesthetic_head(tmp_path / "head.safetensors", TINY_CLIP_EMBED_DIM)
    shared = AestheticScore(folder, head)
    assert len(loads) == 1 and first.clip is second.clip is shared.clip
    assert not first.clip.model.training and not any(p.requires_grad for p in first.clip.model.parameters())


def test_clip_score_names_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json.*nothing is downloaded"):
        ClipScore(tmp_path / "nowhere")


def test_aesthetic_scores_normalized_clip_embeddings(clip_folder, images, tmp_path):
    head_path = write_tiny_aesthetic_head(tmp_path / "head.safetensors", TINY_CLIP_EMBED_DIM, seed=3)
    aesthetic = AestheticScore(clip_folder, head_path, batch_size=3)
    scores = aesthetic(images)
    assert scores.shape == (4,) and np.isfinite(scores).all() and len(set(np.round(scores, 6))) == 4
    expected = aesthetic.head(aesthetic.clip.embed_images(images))  # one batch, unit-norm embeddings
    assert np.allclose(scores, expected.numpy(), atol=1e-5)
    assert np.allclose(AestheticScore(clip_folder, head_path)(images[::-1]), scores[::-1], atol=1e-5)


def test_aesthetic_refuses_a_head_for_another_clip(clip_folder, tmp_path):
    head_path = write_tiny_aesthetic_head(tmp_path / "head.safetensors", embed_dim=768)
    with pytest.raises(ValueError, match="takes 768-d embeddings but the CLIP in .* makes 32-d ones"):
        AestheticScore(clip_folder, head_path)


def test_service_from_config_builds_model_rewards(clip_folder, images, tmp_path, caplog):
    head_path = write_tiny_aesthetic_head(tmp_path / "head.safetensors", TINY_CLIP_EMBED_DIM)
    config = RewardConfig(
        weights={"clip_score": 0.01, "jpeg_compressibility": 1.0},
        guards=["aesthetic"],
        clip=ClipRewardConfig(model_path=str(clip_folder)),
        aesthetic=AestheticRewardConfig(clip_model_path=str(clip_folder), head_path=str(head_path)),
    )
    ids = [f"prompt:{i}:sample:0" for i in range(4)]
    scored = RewardService.from_config(config).score(images, PROMPTS, ids)
    assert set(scored) == {"total", "clip_score", "jpeg_compressibility", "aesthetic"}
    assert np.allclose(scored["total"], 0.01 * scored["clip_score"] + scored["jpeg_compressibility"])
    unused = config.model_copy(update={"guards": []})
    RewardService.from_config(unused)
    assert "reward.aesthetic is set but aesthetic is neither weighted nor a guard" in caplog.text
    wrong = config.model_copy(update={"aesthetic": AestheticRewardConfig(clip_model_path=str(tmp_path / "nowhere"),
                                                                         head_path=str(head_path))})  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"^train.reward.aesthetic: CLIP model folder .*nowhere.* config.json"):
        RewardService.from_config(wrong)  # the recipe key, the folder and the layout it needs


@pytest.fixture(scope="module")
def pickscore_folders(tmp_path_factory):
    """PickScore's layout: the model folder without a processor, the CLIP-H processor in its own folder."""
    from unirl_core.models.tiny_clip import build_tiny_clip

    root = tmp_path_factory.mktemp("pickscore")
    model, processor = build_tiny_clip(seed=3)
    model.save_pretrained(root / "PickScore_v1", safe_serialization=True)
    processor.save_pretrained(root / "processor")
    return root / "PickScore_v1", root / "processor"


def test_pickscore_equals_the_reference_scorer(pickscore_folders, images):
    """yuvalkirstain/PickScore's README (@013b54d) scorer, run as written on the same tiny weights: AutoProcessor
    and AutoModel, padding to the longest prompt, get_*_features, L2 norms, exp(logit_scale) x text @ image.T."""
    from transformers import AutoModel, AutoProcessor

    from unirl_core.rewards.clip import PickScore

    model_folder, processor_folder = pickscore_folders
    ours = PickScore(model_folder, processor_folder, batch_size=3)(images, PROMPTS)
    processor, model = AutoProcessor.from_pretrained(processor_folder), AutoModel.from_pretrained(model_folder)
    reference = []
    with torch.no_grad():
        for image, prompt in zip(images, PROMPTS, strict=True):
            image_inputs = processor(images=[image], padding=True, truncation=True, max_length=77, return_tensors="pt")
            text_inputs = processor(text=[prompt], padding=True, truncation=True, max_length=77, return_tensors="pt")
            image_embs = model.get_image_features(**image_inputs)
            image_embs = getattr(image_embs, "pooler_output", image_embs)
            image_embs = image_embs / torch.norm(image_embs, dim=-1, keepdim=True)
            text_embs = model.get_text_features(**text_inputs)
            text_embs = getattr(text_embs, "pooler_output", text_embs)
            text_embs = text_embs / torch.norm(text_embs, dim=-1, keepdim=True)
            reference.append(float(model.logit_scale.exp() * (text_embs @ image_embs.T)[0][0]))
    assert np.allclose(ours, reference, atol=1e-4) and len(set(np.round(ours, 3))) == 4


def test_pickscore_names_its_missing_processor(pickscore_folders):
    from unirl_core.rewards.clip import PickScore

    with pytest.raises(FileNotFoundError, match=r"CLIP processor folder .* has no \(pre\)processor_config.json"):
        PickScore(pickscore_folders[0])  # the processor is in its own folder: processor_path is needed
