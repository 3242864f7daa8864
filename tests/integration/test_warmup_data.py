"""Supervised warm-up data: a real precache (tiny SD3 VAE + the pipeline's own prompt conditioning) read back as
training batches equal to what the adapter computes, resumable exactly, and a denoising loss that learns."""

from __future__ import annotations

import re

import image_cases as cases
import pytest
import torch
from warmup_cache import CAPTIONS, make_warmup_cache

from unirl_core.domains.diffusion.warmup import WarmupData, split_batch
from unirl_core.models.families.sd3.family import SD3Family
from unirl_core.models.families.sd15.family import SD15Family
from unirl_core.models.registry import resolve_model_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """8 samples (32 px PNG + caption) in 2 source shards, precached with the tiny SD3 VAE and prompt encoder."""
    return make_warmup_cache(tmp_path_factory.mktemp("warmup"), latent_key="sd3_latent", text_key="sd3_prompt")


@pytest.fixture(scope="module")
def sd3():
    return SD3Family(resolve_model_path("tiny:sd3"), guidance_scale=1.0)


def warmup(config, batch_size=4, **kwargs) -> WarmupData:
    return WarmupData(config, batch_size, latent_key="sd3_latent", text_key="sd3_prompt", **kwargs)


def test_batches_equal_what_the_adapter_computes(cache, sd3):
    config, sources = cache
    data = warmup(config)
    seen = []
    for _ in range(data.batches_per_epoch):
        batch = data.next_batch()
        assert batch["latents"].dtype == torch.float32 and batch["latents"].shape == (4, 4, 16, 16)
        for i, key in enumerate(batch["keys"]):
            image, caption = sources[key]
            expected = sd3.encode_texts([caption])
            torch.testing.assert_close(batch["cond"]["embeds"][i], expected["embeds"][0], atol=1e-5, rtol=0)
            torch.testing.assert_close(batch["cond"]["pooled"][i], expected["pooled"][0], atol=1e-5, rtol=0)
            torch.testing.assert_close(batch["latents"][i], sd3.encode_images([image])[0], atol=1e-4, rtol=0)
        seen += batch["keys"]
    assert sorted(seen) == sorted(sources)  # one epoch visits every sample once

    shares = split_batch(batch, 2)
    assert [s["keys"] for s in shares] == [batch["keys"][:2], batch["keys"][2:]]
    assert torch.equal(shares[1]["cond"]["pooled"], batch["cond"]["pooled"][2:])
    with pytest.raises(ValueError, match=r"4 samples does not split evenly over 3 ranks \(4 % 3 = 1\)"):
        split_batch(batch, 3)


def test_family_image_encoder_stores_the_latents_the_family_computes(cache, sd3, tmp_path):
    """`PipelineImageEncoder` (any family's own VAE normalization) gives SD3 the same latents as the
    AutoencoderKLEncoder cache, shifted and scaled on read."""
    config, sources = make_warmup_cache(tmp_path, latent_key="sd3_latent", text_key="sd3_prompt", family="sd3")
    batch = warmup(config, shuffle=False).next_batch()
    reference = warmup(cache[0], shuffle=False).next_batch()
    assert batch["keys"] == reference["keys"]
    torch.testing.assert_close(batch["latents"], reference["latents"], atol=1e-6, rtol=0)
    image, _ = sources[batch["keys"][0]]
    torch.testing.assert_close(batch["latents"][0], sd3.encode_images([image])[0], atol=1e-4, rtol=0)


def test_resume_continues_with_exactly_the_next_batch(cache):
    config, _ = cache
    data = warmup(config, batch_size=3, seed=7)  # 2 batches per epoch: crosses epochs
    for _ in range(3):
        data.next_batch()
    state = data.state_dict()
    expected = [data.next_batch() for _ in range(4)]

    resumed = warmup(config, batch_size=3, seed=7)
    resumed.load_state_dict(state)
    for want in expected:
        got = resumed.next_batch()
        assert got["keys"] == want["keys"] and torch.equal(got["latents"], want["latents"])
        assert all(torch.equal(got["cond"][k], want["cond"][k]) for k in want["cond"])
    assert expected[0]["keys"] != expected[2]["keys"]  # epochs are reshuffled

    with pytest.raises(ValueError, match=r"seed: 7 then, 8 now"):
        warmup(config, batch_size=3, seed=8).load_state_dict(state)


def test_errors_name_the_cache_and_what_it_has(cache):
    config, _ = cache
    with pytest.raises(
        ValueError, match=rf"{re.escape(config.output_dir)} holds 8 samples, fewer than the warm-up batch size 9"
    ):
        warmup(config, batch_size=9).next_batch()
    with pytest.raises(ValueError, match=r"no encoding 'clip_text'; it has \['sd3_latent', 'sd3_prompt'\]"):
        WarmupData(config, 4, latent_key="sd3_latent", text_key="clip_text")
    with pytest.raises(
        ValueError,
        match=r"encodings\[sd3_prompt\] is built by .*PipelinePromptEncoder; warm-up needs .*AutoencoderKLEncoder",
    ):
        WarmupData(config, 4, latent_key="sd3_prompt", text_key="sd3_latent")


def learns(adapter, latents, cond, steps=15) -> tuple[float, float]:
    """Mean loss over 8 fixed draws before and after `steps` Adam steps on the fixed batch."""

    def evaluate() -> float:
        with torch.no_grad():
            draws = [adapter.denoising_loss(latents, cond, torch.Generator().manual_seed(100 + s)) for s in range(8)]
        return torch.stack(draws).mean().item()

    before = evaluate()
    optimizer = torch.optim.Adam(adapter.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        optimizer.zero_grad()
        adapter.denoising_loss(latents, cond, generator).backward()
        optimizer.step()
    return before, evaluate()


def test_sd3_denoising_loss_learns_on_a_warmup_batch(cache):
    config, _ = cache
    batch = warmup(config).next_batch()
    adapter = SD3Family(resolve_model_path("tiny:sd3"), guidance_scale=1.0)  # full fine-tuning: its own copy
    first = adapter.denoising_loss(batch["latents"], batch["cond"], torch.Generator().manual_seed(1))
    again = adapter.denoising_loss(batch["latents"], batch["cond"], torch.Generator().manual_seed(1))
    assert first.ndim == 0 and first.dtype == torch.float32 and torch.equal(first, again)
    before, after = learns(adapter, batch["latents"], batch["cond"])
    assert after < 0.8 * before, (before, after)


def test_sd15_denoising_loss_learns():
    adapter = SD15Family(resolve_model_path("tiny:sd15"), guidance_scale=1.0)
    latents = adapter.encode_images([cases.procedural(32, 32, seed=s) for s in range(4)])
    cond = adapter.encode_texts(CAPTIONS[:4])
    before, after = learns(adapter, latents, cond)
    assert after < 0.8 * before, (before, after)


def _recording(forward, sizes: list):
    def record(x0, cond, generators):
        sizes.append(len(x0))
        return forward(x0, cond, generators)

    return record


def test_micro_batches_and_batch_splits_give_the_same_warmup_step(cache):
    """Per-sample draws from (seed, step, key): accumulating micro-batches of 1 or 3 samples, or splitting the batch
    over two ranks and averaging their gradients (FSDP's reduce), gives the full batch's gradients and loss."""
    from unirl_core.config.schema import WarmupConfig
    from unirl_core.data.noise import sample_seed
    from unirl_core.domains.diffusion.stack import WarmupStack

    config, _ = cache
    batch = warmup(config).next_batch()

    def generators(keys):
        return [torch.Generator().manual_seed(sample_seed(0, f"3:{key}")) for key in keys]

    def fresh(micro):
        torch.manual_seed(0)
        adapter = SD3Family(resolve_model_path("tiny:sd3"), guidance_scale=1.0)
        return adapter, WarmupStack(adapter, WarmupConfig(micro_batch_size=micro), max_grad_norm=1e9)

    def grads(adapter):
        return [p.grad.clone() for p in adapter.parameters() if p.grad is not None]

    adapter, stack = fresh(None)
    loss = stack.train(batch["latents"], batch["cond"], generators(batch["keys"]), step=3)["loss"]
    full = grads(adapter)
    assert len(full) > 10
    for micro, sizes in ((1, [1, 1, 1, 1]), (3, [3, 1])):
        adapter, stack = fresh(micro)
        seen = []
        adapter.denoising_loss = _recording(adapter.denoising_loss, seen)
        metrics = stack.train(batch["latents"], batch["cond"], generators(batch["keys"]), step=3)
        assert seen == sizes and metrics["loss"] == pytest.approx(loss, rel=1e-5), micro
        for a, b in zip(full, grads(adapter), strict=True):
            torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)
    adapter, _ = fresh(None)
    ranks = []
    for share in split_batch(batch, 2):
        for parameter in adapter.parameters():
            parameter.grad = None
        adapter.denoising_loss(share["latents"], share["cond"], generators(share["keys"])).backward()
        ranks.append(grads(adapter))
    for a, *per_rank in zip(full, *ranks, strict=True):
        torch.testing.assert_close(sum(per_rank) / 2, a, atol=1e-6, rtol=1e-4)


def test_batches_read_by_offset_from_s3_equal_the_local_ones(cache, s3_endpoint):
    """The index keeps where each sample lies; a batch reads its members by range request on S3."""
    import fsspec

    config, _ = cache
    fsspec.filesystem("s3").put(config.output_dir.rstrip("/") + "/", "unirl-test/warmup-cache/", recursive=True)
    remote = config.model_copy(update={"output_dir": "s3://unirl-test/warmup-cache"})
    local, s3 = warmup(config, seed=3), warmup(remote, seed=3)
    for _ in range(3):  # crosses an epoch (2 batches each)
        want, got = local.next_batch(), s3.next_batch()
        assert got["keys"] == want["keys"] and torch.equal(got["latents"], want["latents"])
        assert all(torch.equal(got["cond"][k], want["cond"][k]) for k in want["cond"])
