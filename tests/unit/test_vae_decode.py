"""VAE decode at real size: `train.model.vae_decode_batch` images per decode call (same images whatever it is) and
`train.model.vae_tiling` (diffusers' tiled decode: bounded memory, images close to untiled). Images here are uint8
pixel values (0-255); tolerances are in those levels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from unirl_core.config.schema import ModelConfig, SamplingConfig
from unirl_core.models.registry import build_family, write_tiny_model


@pytest.fixture(scope="module")
def sd3_folder(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("tiny") / "sd3", "sd3", seed=0))


def _family(folder, **keys):
    return build_family(ModelConfig(path=folder, lora=None, **keys), SamplingConfig())


def _latents(n: int, side: int) -> torch.Tensor:
    return torch.randn((n, 4, side, side), generator=torch.Generator().manual_seed(0))


def _pixels(images) -> np.ndarray:
    return np.stack([np.asarray(image, dtype=np.int16) for image in images])


def _count_decodes(family) -> list[int]:
    sizes, vae, decode = [], family.pipeline.vae, family.pipeline.vae.decode

    def counting(z, *args, **kwargs):
        sizes.append(z.shape[0])
        return decode(z, *args, **kwargs)

    vae.decode = counting
    return sizes


def test_decode_batch_sets_the_images_per_vae_call_and_keeps_the_images(sd3_folder):
    latents = _latents(5, 16)
    small, large = _family(sd3_folder, vae_decode_batch=2), _family(sd3_folder)
    assert ModelConfig().vae_decode_batch == 8
    small_calls, large_calls = _count_decodes(small), _count_decodes(large)
    chunked, whole = _pixels(small.decode(latents)), _pixels(large.decode(latents))
    assert small_calls == [2, 2, 1] and large_calls == [5]
    # not bitwise: the VAE's float32 convolutions round differently by batch size on the CPU (oneDNN; ~1e-6), which
    # flips about 1 pixel value in 15,000 by one level of 255
    difference = np.abs(chunked - whole)
    assert difference.max() <= 1 and (difference > 0).mean() < 1e-3, (difference.max(), (difference > 0).mean())
    assert _count_decodes(small) == [] and len(small.decode(latents, chunk=5)) == 5  # an explicit chunk still wins


def test_decode_batch_must_be_positive():
    with pytest.raises(ValueError):
        ModelConfig(vae_decode_batch=0)


def test_tiling_decodes_in_tiles_close_to_untiled(sd3_folder):
    latents = _latents(2, 32)  # 64 px images
    plain, tiled = _family(sd3_folder), _family(sd3_folder, vae_tiling=True)
    vae = tiled.pipeline.vae
    assert vae.use_tiling and not plain.pipeline.vae.use_tiling
    # the tiny VAE's 64 px images (32 latent) in 2 x 2 overlapping tiles of 24 latent (48 px), blended over 25%
    vae.tile_sample_min_size, vae.tile_latent_min_size = 48, 24
    tiled_calls, decoder_calls = [], []
    tiled_decode = vae.tiled_decode

    def counting(z, *args, **kwargs):
        tiled_calls.append(z.shape)
        return tiled_decode(z, *args, **kwargs)

    vae.tiled_decode = counting
    vae.decoder.register_forward_hook(lambda module, args, output: decoder_calls.append(args[0].shape[-2:]))
    expected = _pixels(plain.decode(latents)).astype(np.float64)
    got = _pixels(tiled.decode(latents)).astype(np.float64)
    assert len(tiled_calls) == 1 and decoder_calls == [(24, 24), (24, 14), (14, 24), (14, 14)]
    assert not np.array_equal(got, expected)  # tiles really were decoded apart and blended
    # close, on a random-weight VAE whose mid-block attention sees the whole image untiled (a trained VAE is
    # smoother): mean |difference| < 6 levels of 255 (pixel std ~38), correlation > 0.98
    difference = np.abs(got - expected)
    correlation = np.corrcoef(got.ravel(), expected.ravel())[0, 1]
    assert difference.mean() < 6 and correlation > 0.98, (difference.mean(), correlation)
