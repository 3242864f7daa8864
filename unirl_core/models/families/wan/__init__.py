"""Wan (`WanPipeline`, `WanImageToVideoPipeline`: a 3-D DiT predicting the flow velocity over video latents
[B, C, F, h, w], umT5 text, the causal video VAE `AutoencoderKLWan`): `family.py` the families (Wan 2.1 text- and
image-to-video, Wan 2.2 A14B's two experts, Wan 2.2 TI2V-5B), `tiny.py` their tiny pipelines, `real_size.py` the
published variants for `unirl plan`."""

FAMILIES = {
    "wan": "WanFamily",
    "wan_i2v": "WanI2VFamily",
    "wan2_2": "Wan22Family",
    "wan_ti2v": "WanTI2VFamily",
}  # name -> class in family.py: what the registry finds here (nothing heavy imported)
