"""BAGEL's packer on synthetic samples (tiny images, a word -> id encoder, small caps): caps, no lost sample, mandatory
groups, weights, the exact layout of t2i / edit / video samples, attention, CFG dropout, determinism, packs without
VAE or ViT images, and resume."""

from __future__ import annotations

import collections
import json
import random

import numpy as np
import pytest
import torch
from PIL import Image

from unirl_core.data.bagel.batch_check import batch_keys, validate_batch
from unirl_core.data.bagel.packing import Packer, PackGroup, PackingConfig, patchify
from unirl_core.data.bagel.plans import SampleBuilder
from unirl_core.data.bagel.tokenizer import SpecialTokens
from unirl_core.data.bagel.transforms import ImageTransformArgs

SPECIAL = SpecialTokens(bos_token_id=1, eos_token_id=2, start_of_image=3, end_of_image=4)
VAE = ImageTransformArgs(image_stride=16, max_image_size=64, min_image_size=16, max_pixels=64 * 64)
VIT = ImageTransformArgs(image_stride=14, max_image_size=56, min_image_size=14, max_pixels=56 * 56)
SMALL = {"expected_num_tokens": 600, "max_num_tokens": 700, "max_num_tokens_per_sample": 400,
         "prefer_buffer_before": 300, "max_buffer_size": 5}  # fmt: skip
SIZES = [(32, 32), (64, 48), (48, 32), (32, 64), (64, 64)]
TIGHT = {"max_buffer_size": 2, "prefer_buffer_before": 350}  # a small buffer: packs also emit with a carried sample
NEG_INF = float("-inf")


def encode(text: str) -> list[int]:
    return [10 + sum(map(ord, word)) % 1000 for word in text.split()]


def picture(rng: random.Random, size: tuple[int, int] | None = None) -> Image.Image:
    pixels = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (*(size or rng.choice(SIZES))[::-1], 3))
    return Image.fromarray(pixels.astype(np.uint8))


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(f"w{rng.randrange(50)}" for _ in range(rng.randint(low, high)))


# ---- synthetic sample kinds (rng -> builder) ------------------------------------------------------------------------


def t2i(rng, builder):
    builder.add_text(words(rng, 3, 30), need_loss=False)
    builder.add_image(picture(rng), need_loss=True, need_vae=False, need_vit=False)


def edit(rng, builder):
    builder.add_image(picture(rng), need_loss=False, need_vae=True, need_vit=True)
    builder.add_text(words(rng, 2, 12), need_loss=False)
    builder.add_image(picture(rng), need_loss=True, need_vae=False, need_vit=False)


def vlm(rng, builder):
    builder.add_image(picture(rng), need_loss=False, need_vae=False, need_vit=True, enable_cfg=False)
    builder.add_text(words(rng, 3, 20), need_loss=False, enable_cfg=False)
    builder.add_text(words(rng, 5, 60), need_loss=True, enable_cfg=False)


def chat(rng, builder):
    builder.add_text(words(rng, 5, 40), need_loss=False, enable_cfg=False)
    builder.add_text(words(rng, 5, 40), need_loss=True, enable_cfg=False)


def long(rng, builder):  # about one in five over the 400-token per-sample cap
    builder.add_text(words(rng, 40, 480), need_loss=True, enable_cfg=False)


class FakeReader:
    """An endless GroupReader: sample i is built from a generator seeded with (name, i); records what it returned."""

    def __init__(self, name: str, kind, position: int = -1):
        self.dataset_name, self.kind, self.position = name, kind, position
        self.skipped: collections.Counter = collections.Counter()
        self.drawn: list[tuple[tuple[str, int], int]] = []  # (key, packed tokens)

    def __next__(self):
        self.position += 1
        sample = self.sample_at({"dataset_name": self.dataset_name, "index": self.position})
        self.drawn.append(((self.dataset_name, self.position), sample.packed_tokens()))
        return sample

    def state(self) -> dict:
        return {"position": self.position}

    def sample_at(self, data_indexes: dict):
        builder = SampleBuilder(encode, vae=VAE, vit=VIT)
        self.kind(random.Random(f"{self.dataset_name}:{data_indexes['index']}"), builder)
        return builder.build(dict(data_indexes))


class ListReader(FakeReader):
    """Fixed samples, cycled."""

    def __init__(self, name: str, samples: list):
        super().__init__(name, kind=None)
        self.samples = samples

    def sample_at(self, data_indexes: dict):
        return self.samples[data_indexes["index"] % len(self.samples)]


MIXTURE = [("long", long, 1.0, True), ("t2i", t2i, 2.0, False), ("edit", edit, 1.0, False), ("vlm", vlm, 2.0, False)]


def mixture(state: dict | None = None, **settings) -> Packer:
    positions = {name: s["position"] for name, s in state["groups"].items()} if state else {}
    groups = [PackGroup(name, weight, mandatory, FakeReader(name, kind, positions.get(name, -1)))
              for name, kind, weight, mandatory in MIXTURE]  # fmt: skip
    return Packer(groups, SPECIAL, PackingConfig(**(SMALL | settings)), state)


def single(sample, **settings) -> dict:
    """The first pack of a packer over one sample (the target set to its size: one sample per pack)."""
    config = {"expected_num_tokens": 1, "max_num_tokens": 4096, "max_num_tokens_per_sample": 4096} | settings
    packer = Packer([PackGroup("one", 1.0, False, ListReader("one", [sample]))], SPECIAL, PackingConfig(**config))
    batch = next(packer)
    validate_batch(batch, packer.config)
    return batch


def build(*steps) -> object:
    builder = SampleBuilder(encode, vae=VAE, vit=VIT)
    for step in steps:
        step(builder)
    return builder.build({"dataset_name": "one", "index": 0})


def allowed(mask: torch.Tensor) -> torch.Tensor:
    return mask == 0


# ---- the loop -------------------------------------------------------------------------------------------------------


def test_packs_respect_caps_and_every_drawn_sample_is_packed_once_or_skipped():
    packer = mixture(**TIGHT)
    packed, carried, buffered = collections.Counter(), 0, 0
    for _ in range(80):
        batch = next(packer)
        validate_batch(batch, packer.config)
        assert batch["sequence_length"] <= 700
        datasets = [d["dataset_name"] for d in batch["batch_data_indexes"]]
        assert "long" in datasets  # the mandatory group starts every pack
        packed.update((d["dataset_name"], d["index"]) for d in batch["batch_data_indexes"])
        carried += packer.carry is not None
        buffered += len(packer.buffer) > 0
    state = packer.state()
    pending = {(e["group"], e["data_indexes"]["index"]) for e in [*state["buffer"], state["carry"]] if e}
    num_over_cap = 0
    for group in packer.groups:
        for key, tokens in group.reader.drawn:
            if tokens > 400:
                num_over_cap += 1
                assert key not in packed and key not in pending
            else:
                assert packed[key] + (key in pending) == 1, key
    assert sum(packed.values()) == sum(len(group.reader.drawn) for group in packer.groups) - num_over_cap - len(pending)
    assert num_over_cap > 0 and state["skipped"] == {"long": {"over_sample_cap": num_over_cap}}
    assert carried > 0 and buffered > 0  # both the buffer and the carried-over sample were exercised
    summary = packer.stats.summary()
    assert summary["packs"] == 80 and 0.5 < summary["fill_ratio"] <= 700 / 600
    print(f"mean fill ratio {summary['fill_ratio']:.3f}, tokens per pack {summary['tokens_per_pack']:.1f}")


def test_group_weights_are_respected():
    groups = [PackGroup(name, weight, False, FakeReader(name, chat)) for name, weight in (("a", 3.0), ("b", 1.0))]
    packer = Packer(groups, SPECIAL, PackingConfig(**SMALL))
    for _ in range(150):
        next(packer)
    counts = packer.stats.num_samples
    assert counts["a"] / (counts["a"] + counts["b"]) == pytest.approx(0.75, abs=0.03)


def test_config_and_groups_are_validated():
    with pytest.raises(ValueError, match="max_num_tokens_per_sample"):
        PackingConfig(max_num_tokens_per_sample=40000)
    with pytest.raises(ValueError, match="attention"):
        PackingConfig(attention="flex")
    with pytest.raises(ValueError, match="text_cond_dropout_prob"):
        PackingConfig(text_cond_dropout_prob=1.5)
    with pytest.raises(ValueError, match="unknown packing keys"):
        PackingConfig.from_dict({"expected_num_token": 10})
    two_mandatory = [PackGroup(n, 1.0, True, FakeReader(n, chat)) for n in ("a", "b")]
    with pytest.raises(ValueError, match="mandatory"):
        Packer(two_mandatory, SPECIAL, PackingConfig(**SMALL))


# ---- the layout of one sample ---------------------------------------------------------------------------------------


def test_t2i_layout():
    image = picture(random.Random(0), (48, 32))  # W x H: latent grid 2 x 3
    sample = build(lambda b: b.add_text_ids([11, 12, 13], need_loss=False),
                   lambda b: b.add_image(image, need_loss=True, need_vae=False, need_vit=False))  # fmt: skip
    batch = single(sample, text_cond_dropout_prob=0.0)
    assert batch["sequence_length"] == 13 and batch["sample_lens"] == [13]
    assert batch["packed_text_ids"].tolist() == [1, 11, 12, 13, 2, 3, 4]
    assert batch["packed_text_indexes"].tolist() == [0, 1, 2, 3, 4, 5, 12]
    assert batch["packed_vae_token_indexes"].tolist() == list(range(6, 12))
    assert batch["mse_loss_indexes"].tolist() == list(range(6, 12))
    assert batch["packed_position_ids"].tolist() == [0, 1, 2, 3, 4] + [5] * 8
    timesteps = batch["packed_timesteps"]
    assert torch.isfinite(timesteps).all() and (timesteps == timesteps[0]).all()
    assert batch["patchified_vae_latent_shapes"] == [(2, 3)]
    assert batch["packed_latent_position_ids"].tolist() == [0, 1, 2, 32, 33, 34]  # BAGEL's max_latent_size 32
    assert torch.equal(batch["padded_images"][0], sample.image_tensor_list[0])
    # BAGEL's to_tensor leaves out the CE and ViT keys of a pack without text loss or ViT images
    assert not {"ce_loss_indexes", "packed_label_ids", "ce_loss_weights", "packed_vit_tokens"} & set(batch)
    ok = allowed(batch["nested_attention_masks"][0])
    assert torch.equal(ok[:5, :5], torch.ones(5, 5, dtype=torch.bool).tril())  # text: causal
    assert ok[5:, :].all()  # the image sees the caption and all of itself


def edit_like(image_size=(32, 32)):
    rng = random.Random(1)
    start, target = picture(rng, image_size), picture(rng, image_size)
    return build(lambda b: b.add_image(start, need_loss=False, need_vae=True, need_vit=True),
                 lambda b: b.add_text_ids([21, 22], need_loss=False),
                 lambda b: b.add_image(target, need_loss=True, need_vae=False, need_vit=False),
                 lambda b: b.add_text_ids([31, 32, 33], need_loss=True, enable_cfg=False))  # fmt: skip


def test_edit_layout():
    sample = edit_like()  # VAE 32x32: 2x2 latents; ViT 28x28: 2x2 patches
    batch = single(sample, text_cond_dropout_prob=0.0, vit_cond_dropout_prob=0.0, vae_cond_dropout_prob=0.0)
    # clean VAE 0..5 (pos 0) | ViT 6..11 (pos 1) | text 12..15 (pos 2..5) | noised VAE 16..21 (pos 6) | text 22..26
    assert batch["sequence_length"] == 27
    assert batch["packed_position_ids"].tolist() == [0] * 6 + [1] * 6 + [2, 3, 4, 5] + [6] * 6 + [6, 7, 8, 9, 10]
    assert batch["packed_text_ids"].tolist() == [3, 4, 3, 4, 1, 21, 22, 2, 3, 4, 1, 31, 32, 33, 2]
    assert batch["packed_vae_token_indexes"].tolist() == [1, 2, 3, 4, 17, 18, 19, 20]
    assert batch["packed_vit_token_indexes"].tolist() == [7, 8, 9, 10]
    assert batch["vit_token_seqlens"].tolist() == [4]
    assert batch["packed_vit_position_ids"].tolist() == [0, 1, 70, 71]
    assert torch.equal(batch["packed_vit_tokens"], patchify(sample.image_tensor_list[1], 14))
    assert batch["mse_loss_indexes"].tolist() == [17, 18, 19, 20]
    timesteps = batch["packed_timesteps"].tolist()
    assert timesteps[:4] == [NEG_INF] * 4 and all(t == timesteps[4] != NEG_INF for t in timesteps[4:])
    assert batch["ce_loss_indexes"].tolist() == [22, 23, 24, 25]
    assert batch["packed_label_ids"].tolist() == [31, 32, 33, 2]
    assert batch["ce_loss_weights"].tolist() == [0.5] * 4
    ok = allowed(batch["nested_attention_masks"][0])
    assert not ok[22:, 16:22].any()  # the noised target is invisible to every later token
    assert ok[16:22, :16].all() and ok[16:22, 16:22].all()  # it sees the conditions and all of itself
    assert ok[6:12, 6:12].all() and not ok[:6, 6:].any()  # ViT: full within, nothing of the future
    assert torch.equal(ok[22:, 22:], torch.ones(5, 5, dtype=torch.bool).tril()) and ok[22:, :16].all()


def test_patchify_order():
    image = torch.arange(3 * 4 * 6, dtype=torch.float32).reshape(3, 4, 6)
    tokens = patchify(image, 2)  # 2 x 3 patches of 2 x 2 x 3 values
    assert tokens.shape == (6, 12)
    assert torch.equal(tokens[4].reshape(2, 2, 3), image[:, 2:4, 2:4].permute(1, 2, 0))  # patch (1, 1)


def test_video_split_shares_a_timestep_and_advances_by_frame_delta():
    rng = random.Random(2)
    frames = [picture(rng, (32, 32)) for _ in range(3)]
    sample = build(lambda b: b.add_text_ids([40], need_loss=False, enable_cfg=False),
                   lambda b: b.add_video(frames, [0, 2, 5], need_loss=True),
                   lambda b: b.add_text_ids([41], need_loss=False, enable_cfg=False))  # fmt: skip
    for attention in ("masks", "splits"):
        batch = single(sample, attention=attention)
        # text 0..2 (pos 0..2) | frames 3..8 (pos 3), 9..14 (pos 5), 15..20 (pos 8) | text 21..23 (pos 8..10)
        assert batch["packed_position_ids"].tolist() == [0, 1, 2] + [3] * 6 + [5] * 6 + [8] * 6 + [8, 9, 10]
        timesteps = batch["packed_timesteps"]
        assert len(timesteps) == 12 and torch.isfinite(timesteps).all() and (timesteps == timesteps[0]).all()
        if attention == "splits":
            assert batch["split_lens"] == [3, 18, 3, 4096 - 24] and batch["attn_modes"] == [
                "causal",
                "full",
                "causal",
                "causal",
            ]
            assert batch["sample_lens"] == [24, 4096 - 24]


# ---- attention ------------------------------------------------------------------------------------------------------


def reference_allowed(split_lens: list[int], attn_modes: list[str]) -> torch.Tensor:
    """One sample's attention, token by token: a query sees earlier keys, or any key of its own split when that split
    is not causal; a key inside a "noise" split is seen only from inside that split."""
    split_id = torch.repeat_interleave(torch.arange(len(split_lens)), torch.tensor(split_lens))
    mode = [attn_modes[i] for i in split_id.tolist()]
    non_causal = torch.tensor([m != "causal" for m in mode])
    noise = torch.tensor([m == "noise" for m in mode])
    same = split_id[:, None] == split_id[None, :]
    length = len(split_id)
    rule = torch.ones(length, length, dtype=torch.bool).tril() | (same & non_causal[:, None])
    return rule & ~(noise[None, :] & ~same)


def test_masks_and_splits_describe_the_same_attention():
    masks_packer, splits_packer = mixture(), mixture(attention="splits")
    for _ in range(5):
        with_masks, with_splits = next(masks_packer), next(splits_packer)
        validate_batch(with_splits, splits_packer.config)
        assert torch.equal(with_masks["packed_timesteps"], with_splits["packed_timesteps"])  # same draws
        split_lens, modes = with_splits["split_lens"][:-1], with_splits["attn_modes"][:-1]
        start = 0
        for mask, sample_len in zip(with_masks["nested_attention_masks"], with_masks["sample_lens"], strict=True):
            count, total = 0, 0
            while total < sample_len:
                total += split_lens[start + count]
                count += 1
            expected = reference_allowed(split_lens[start : start + count], modes[start : start + count])
            assert torch.equal(allowed(mask), expected)
            start += count
        assert start == len(split_lens)


def test_noised_targets_are_never_seen_later_in_mixture_packs():
    packer = mixture()
    for _ in range(5):
        batch = next(packer)
        offset = 0
        mse = set(batch["mse_loss_indexes"].tolist())
        for mask, sample_len in zip(batch["nested_attention_masks"], batch["sample_lens"], strict=True):
            ok = allowed(mask)
            for key in (k - offset for k in mse if offset <= k < offset + sample_len):
                end_of_image = key
                while end_of_image + offset in mse:
                    end_of_image += 1  # past the target's last latent slot
                assert not ok[end_of_image + 1 :, key].any()
            offset += sample_len


# ---- CFG dropout ----------------------------------------------------------------------------------------------------


def test_cfg_dropout_everything_but_the_noised_target():
    sample = edit_like()
    batch = single(sample, text_cond_dropout_prob=1.0, vit_cond_dropout_prob=1.0, vae_cond_dropout_prob=1.0)
    # dropped: clean VAE (pos 0 -> 1), ViT (-> 2), instruction (no change); kept: target at pos 2, answer (no cfg)
    assert batch["packed_text_ids"].tolist() == [3, 4, 1, 31, 32, 33, 2]
    assert batch["packed_position_ids"].tolist() == [2] * 6 + [2, 3, 4, 5, 6]
    assert batch["mse_loss_indexes"].tolist() == [1, 2, 3, 4] and "packed_vit_tokens" not in batch
    assert torch.isfinite(batch["packed_timesteps"]).all() and batch["padded_images"].shape[0] == 1
    kept = single(sample, text_cond_dropout_prob=0.0, vit_cond_dropout_prob=0.0, vae_cond_dropout_prob=0.0)
    assert kept["sequence_length"] == 27 and kept["padded_images"].shape[0] == 2


def test_enable_cfg_0_is_never_dropped():
    rng = random.Random(3)
    builder = SampleBuilder(encode, vae=VAE, vit=VIT)
    vlm(rng, builder)
    sample = builder.build({"dataset_name": "one", "index": 0})
    batch = single(sample, text_cond_dropout_prob=1.0, vit_cond_dropout_prob=1.0, vae_cond_dropout_prob=1.0)
    assert batch["sequence_length"] == sample.packed_tokens()


# ---- determinism, empty parts, resume -------------------------------------------------------------------------------


def assert_same_batch(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), key
        elif key == "nested_attention_masks":
            assert all(torch.equal(x, y) for x, y in zip(value, b[key], strict=True)), key
        else:
            assert value == b[key], key


def test_seeded_determinism():
    first, second, other = mixture(seed=7), mixture(seed=7), mixture(seed=8)
    batches = [next(first) for _ in range(4)]
    for batch in batches:
        assert_same_batch(batch, next(second))
    assert any(not torch.equal(b["packed_timesteps"], next(other)["packed_timesteps"]) for b in batches)


CORE = {"sequence_length", "sample_lens", "packed_text_ids", "packed_text_indexes", "packed_position_ids",
        "batch_data_indexes"}  # fmt: skip
ATTENTION = {"masks": {"nested_attention_masks"}, "splits": {"split_lens", "attn_modes"}}
VIT_KEYS = {"packed_vit_tokens", "packed_vit_position_ids", "packed_vit_token_indexes", "vit_token_seqlens"}
VAE_KEYS = {"padded_images", "patchified_vae_latent_shapes", "packed_latent_position_ids", "packed_vae_token_indexes",
            "packed_timesteps", "mse_loss_indexes"}  # fmt: skip
CE_KEYS = {"packed_label_ids", "ce_loss_indexes", "ce_loss_weights"}


@pytest.mark.parametrize("attention", ["masks", "splits"])
@pytest.mark.parametrize("kind, parts", [(vlm, VIT_KEYS | CE_KEYS), (chat, CE_KEYS), (t2i, VAE_KEYS),
                                         (edit, VAE_KEYS | VIT_KEYS)])  # fmt: skip
def test_target_bagel_packs_carry_bagels_key_sets(kind, parts, attention):
    """BAGEL's to_tensor keys, fact by fact: a VLM-only pack has no VAE keys (its trainer passes `padded_images` to
    the model unless visual_gen), a t2i-only pack no CE keys (empty ones make its CE 0 / 0 with visual_und off)."""
    config = PackingConfig(**SMALL, attention=attention, vae_cond_dropout_prob=0.0, vit_cond_dropout_prob=0.0)
    packer = Packer([PackGroup("g", 1.0, True, FakeReader("g", kind))], SPECIAL, config)
    batch = next(packer)
    validate_batch(batch, packer.config)
    assert set(batch) == CORE | ATTENTION[attention] | parts


@pytest.mark.parametrize("attention", ["masks", "splits"])
@pytest.mark.parametrize("kind", [vlm, chat])
def test_target_unirl_packs_without_vae_images_have_every_key(kind, attention):
    config = PackingConfig(**SMALL, attention=attention, target="unirl")
    packer = Packer([PackGroup("g", 1.0, True, FakeReader("g", kind))], SPECIAL, config)
    batch = next(packer)
    validate_batch(batch, packer.config)
    assert set(batch) == set(batch_keys(packer.config))
    assert batch["padded_images"].shape == (0, 3, 0, 0) and batch["padded_images"].dtype == torch.float32
    assert batch["patchified_vae_latent_shapes"] == []
    for key in ("packed_vae_token_indexes", "packed_latent_position_ids", "mse_loss_indexes"):
        assert batch[key].shape == (0,) and batch[key].dtype == torch.int64
    assert batch["packed_timesteps"].shape == (0,) and batch["packed_timesteps"].dtype == torch.float32
    assert batch["packed_vit_tokens"].shape[1] == 14 * 14 * 3
    if kind is chat:
        assert batch["packed_vit_tokens"].shape == (0, 588) and batch["vit_token_seqlens"].shape == (0,)
    assert len(batch["ce_loss_indexes"]) > 0


def test_validate_batch_catches_a_broken_pack():
    packer = mixture()
    batch = next(packer)
    validate_batch(batch, packer.config)
    broken = dict(batch, packed_timesteps=torch.zeros_like(batch["packed_timesteps"]))
    with pytest.raises(ValueError, match="timestep"):
        validate_batch(broken, packer.config)
    with pytest.raises(ValueError, match="ce keys .* all present or all absent"):
        validate_batch({k: v for k, v in batch.items() if k != "ce_loss_weights"}, packer.config)
    with pytest.raises(ValueError, match="empty vit part must be left out"):
        validate_batch(dict(batch, packed_vit_tokens=torch.zeros(0, 588), packed_vit_position_ids=torch.zeros(0),
                            packed_vit_token_indexes=torch.zeros(0), vit_token_seqlens=torch.zeros(0)),
                       packer.config)  # fmt: skip
    every = mixture(target="unirl")
    batch = next(every)
    with pytest.raises(ValueError, match="missing keys"):
        validate_batch({k: v for k, v in batch.items() if k != "ce_loss_weights"}, every.config)


def test_resume_gives_identical_packs():
    straight = mixture(**TIGHT)
    expected = [next(straight) for _ in range(10)]
    buffered, carried = False, False
    for stop in range(1, 10):
        first = mixture(**TIGHT)
        for _ in range(stop):
            next(first)
        state = json.loads(json.dumps(first.state()))
        buffered, carried = buffered or bool(state["buffer"]), carried or state["carry"] is not None
        resumed = mixture(state, **TIGHT)
        for batch in expected[stop:]:
            assert_same_batch(batch, next(resumed))
        assert resumed.stats.num_packs == 10
    assert buffered and carried  # some snapshots held buffered samples and a carried-over one: all rebuilt


def test_latent_position_ids_follow_max_latent_size_and_refuse_grids_beyond_it():
    """BAGEL's trainer lays latent ids out on max_latent_size (its default 32): i * 32 + j. A 34 x 2 latent grid does
    not fit a model built with 32 (BAGEL would index its position embedding out of range): refused by name."""
    wide = SampleBuilder(encode, vae=ImageTransformArgs(16, 544, 16, 544 * 544))
    wide.add_image(picture(random.Random(0), (544, 32)), need_loss=True, need_vae=False, need_vit=False)
    sample = wide.build({"dataset_name": "one", "index": 0})
    with pytest.raises(ValueError, match="34x2|2x34"):
        single(sample)
    batch = single(sample, max_latent_size=64)  # the released BAGEL-7B-MoT's size
    assert batch["packed_latent_position_ids"].tolist()[:3] == [0, 1, 2] and batch["patchified_vae_latent_shapes"] == [
        (2, 34)
    ]
    assert batch["packed_latent_position_ids"].tolist()[34:36] == [64, 65]
    assert PackingConfig().max_latent_size == 32 and PackingConfig(target="unirl").max_latent_size == 64
