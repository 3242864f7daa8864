"""The autoregressive policy on a tiny Qwen3 (random weights, built from the real config class): the log-probs a
rollout records are those of a direct forward over the same tokens, with left-padded prompts of different lengths;
a sample's completion does not depend on the batch it is drawn in; completions end at the end token or a stop
string, and nothing after the end is attended or counted."""

from __future__ import annotations

import pytest
import torch

from unirl_core.config import load_recipe
from unirl_core.domains.ar.policy import LMPolicy, nucleus
from unirl_core.models.tiny_lm import write_tiny_lm

PROMPTS = ["3+4=", "a much longer prompt, so the first is left-padded: 1+2=", "9+0="]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny-qwen3")


def policy(folder, *overrides) -> LMPolicy:
    config = load_recipe("demo_llm", [f"train.model.path={folder}", "train.domain.max_new_tokens=8",
                                      *overrides]).train  # fmt: skip
    return LMPolicy(config, "cpu")


def generators(seed: int, n: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


@pytest.mark.parametrize("chat", [False, True])
def test_rollout_log_probs_equal_a_direct_forward_over_the_same_tokens(folder, chat):
    lm = policy(folder, f"train.domain.chat_template={str(chat).lower()}", "train.domain.temperature=0.7")
    out = lm.generate(PROMPTS, generators(0, len(PROMPTS)))
    assert out.prompt_mask[0].sum() < out.prompt_mask[1].sum() == out.prompt_ids.shape[1]  # left padding
    batched = lm.token_logp(out)  # training geometry: one forward over [prompt | completion], padded
    torch.testing.assert_close(batched * out.mask, out.logp, rtol=0, atol=1e-5)
    for i, prompt in enumerate(PROMPTS):  # each row alone, no padding at all
        length = int(out.mask[i].sum())
        ids = torch.cat([lm.encode([prompt])[0][0], out.ids[i, :length]])[None]
        logits = lm.trainable(input_ids=ids).logits[0, -length - 1 : -1].float() / 0.7
        direct = torch.log_softmax(logits, -1).gather(-1, ids[0, -length:, None])[:, 0]
        torch.testing.assert_close(out.logp[i, :length], direct, rtol=0, atol=1e-5)


def test_a_sample_draws_the_same_completion_alone_or_in_a_batch(folder):
    lm = policy(folder)
    together = lm.generate(PROMPTS, generators(7, 3))
    alone = lm.generate(PROMPTS[2:], generators(9, 1))  # the third prompt with the third generator
    length = int(alone.mask[0].sum())
    assert together.texts[2] == alone.texts[0] and int(together.mask[2].sum()) == length
    torch.testing.assert_close(together.logp[2, :length], alone.logp[0, :length], rtol=0, atol=1e-5)
    assert lm.generate(PROMPTS, generators(7, 3)).texts == together.texts  # same seeds, same completions


def test_completions_end_at_the_end_token_or_a_stop_string(folder):
    lm = policy(folder, "train.domain.max_new_tokens=24")
    out = lm.generate(PROMPTS * 4, generators(0, 12))
    for ids, mask, truncated in zip(out.ids, out.mask, out.truncated, strict=True):
        length = int(mask.sum())
        assert mask[:length].all() and not mask[length:].any()  # one run of 1s from the start
        assert (ids[length:] == lm.tokenizer.pad_token_id).all()
        assert truncated == (length == 24 and ids[length - 1].item() not in lm.end_ids)
    ended = [t for t, trunc in zip(out.texts, out.truncated, strict=True) if not trunc]
    assert ended, "no completion of 12 reached the end token in 24 tokens: draw more"

    stop = out.texts[0][:2]  # a string the first completion contains: drawn again, it ends there
    stopped = policy(folder, "train.domain.max_new_tokens=24", f"train.domain.stop=[{stop!r}]")
    again = stopped.generate(PROMPTS * 4, generators(0, 12))
    assert again.texts[0].endswith(stop) and len(again.texts[0]) <= len(out.texts[0])
    for ids, mask, text, truncated in zip(again.ids, again.mask, again.texts, again.truncated, strict=True):
        assert truncated or stop in text or ids[int(mask.sum()) - 1].item() in stopped.end_ids


def test_greedy_generation_takes_the_most_likely_token(folder):
    lm = policy(folder, "train.domain.max_new_tokens=1")
    out = lm.generate(PROMPTS, None)
    ids, mask, _ = lm.encode(PROMPTS)
    from unirl_core.domains.ar.policy import positions

    logits = lm.trainable(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits[:, -1]
    assert out.ids[:, 0].tolist() == logits.argmax(-1).tolist()


def test_top_p_keeps_the_smallest_set_that_reaches_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = nucleus(logits, 0.8).isfinite()[0].tolist()
    assert kept == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    assert nucleus(logits, 0.4).isfinite()[0].tolist() == [True, False, False, False]  # the top token always
    assert nucleus(logits, 1.0).isfinite().all()


QWEN_PLACEHOLDERS = ["<|image_pad|>", "<|video_pad|>"]
VLMS = {"llava": (32, ["<image>"]), "qwen2_5_vl": (56, QWEN_PLACEHOLDERS), "qwen3_vl": (64, QWEN_PLACEHOLDERS)}


@pytest.mark.parametrize("arch", VLMS)
def test_a_vlms_rollout_log_probs_equal_a_direct_forward_with_its_images(arch, tmp_path):
    """The tiny LLaVA (models/tiny_vlm.py) and the tiny Qwen2.5-VL (models/tiny_qwen_vl.py: 3-D rotary positions): a
    prompt with an image beside one without, left-padded; the log-probs recorded when drawn, those at training
    geometry (a subset of rows: the image inputs follow their rows) and those of the model's own forward over each
    row alone with its image (its own positions: Qwen-VL's from the token types, as its processor gives them) are
    equal."""
    from PIL import Image

    size, placeholders = VLMS[arch]
    folder = write_tiny_lm(tmp_path / f"tiny-{arch}", arch)
    lm = policy(folder, "train.model.lora=null")
    assert lm.is_vlm and len(lm.blocks()) == 2 and (lm.mrope is not None) == (arch != "llava")
    images = [Image.new("RGB", (size, size), "red"), None, Image.new("RGB", (size, size), "blue")]
    out = lm.generate(PROMPTS, generators(3, 3), images)
    assert out.has_image == [True, False, True] and out.vision_of(torch.tensor([2]))  # the blue image goes with row 2
    assert lm.blocked.tolist() == lm.tokenizer.convert_tokens_to_ids(placeholders)
    assert not torch.isin(lm.generate(PROMPTS * 8, generators(0, 24), images * 8).ids, lm.blocked).any()
    torch.testing.assert_close(lm.token_logp(out) * out.mask, out.logp, rtol=0, atol=1e-5)
    rows = torch.tensor([1, 2])  # the image-less row and the blue one: one image goes with them
    torch.testing.assert_close(lm.token_logp(out, rows) * out.mask[rows], out.logp[rows], rtol=0, atol=1e-5)
    for i in range(3):
        length = int(out.mask[i].sum())
        ids, _, vision = lm.encode([PROMPTS[i]], [images[i]])
        full = torch.cat([ids[0], out.ids[i, :length]])[None]
        types = {"mm_token_type_ids": torch.isin(full, lm.blocked[:1]).int()} if lm.mrope is not None else {}
        logits = lm.trainable(input_ids=full, **vision, **types).logits[0, -length - 1 : -1].float()
        logits[:, lm.blocked] = float("-inf")  # the image placeholder is never drawn (nor trained)
        direct = torch.log_softmax(logits, -1).gather(-1, full[0, -length:, None])[:, 0]
        torch.testing.assert_close(out.logp[i, :length], direct, rtol=0, atol=1e-5)
    red, blue = lm.generate(PROMPTS[:1] * 2, [torch.Generator().manual_seed(0) for _ in range(2)],
                            [images[0], images[2]]).logp  # fmt: skip
    assert not torch.equal(red, blue)  # the image reaches the tokens


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_qwen_vls_greedy_completions_equal_transformers_generate_on_a_left_padded_batch(arch, tmp_path):
    """Decoding with the KV cache goes on from each row's largest 3-D position: the tiny Qwen-VLs' greedy
    completions of a left-padded batch (rows with and without an image) equal those of the model's own `generate`
    (which tracks the positions through its rope deltas), with the placeholders banned there too."""
    from PIL import Image

    lm = policy(write_tiny_lm(tmp_path / "tiny-qwen-vl", arch), "train.model.lora=null",
                "train.domain.max_new_tokens=12")  # fmt: skip
    size = VLMS[arch][0]
    images = [Image.new("RGB", (size, size * 3 // 2), "red"), None, Image.new("RGB", (size, size), "blue")]
    ours = lm.generate(PROMPTS, None, images)
    texts = [lm.prompt_text(p, image is not None) for p, image in zip(PROMPTS, images, strict=True)]
    batch = lm.processor(text=texts, images=[images[0], images[2]], padding=True, return_tensors="pt")
    stock = lm.trainable.generate(**batch, do_sample=False, max_new_tokens=12, eos_token_id=lm.end_ids,
                                  pad_token_id=lm.tokenizer.pad_token_id,
                                  bad_words_ids=[[t] for t in lm.blocked.tolist()])  # fmt: skip
    stock = stock[:, batch["input_ids"].shape[1] :]
    for row in range(3):
        length = int(ours.mask[row].sum())
        assert ours.ids[row, :length].tolist() == stock[row, :length].tolist()


def test_the_rounds_start_refuses_a_folder_that_is_no_causal_lm(tmp_path):
    import json

    from unirl_core.domains.ar.domain import ARDomain

    def problems(path) -> list[str]:
        return ARDomain.start_problems(load_recipe("demo_llm", [f"train.model.path={path}"]).train)

    assert problems("tiny:qwen3") == [] and problems("tiny:llava") == [] and problems("tiny:qwen2_5_vl") == []
    assert (
        "the ar domain's tiny models are tiny:qwen3, tiny:qwen2, tiny:llava, tiny:qwen2_5_vl" in problems("tiny:sd3")[0]
    )
    assert "is not a folder" in problems(tmp_path / "missing")[0]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert "has no tokenizer.json or tokenizer_config.json" in problems(tmp_path)[0]
