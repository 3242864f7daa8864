"""Wan 2.1 text-to-video (`WanPipeline`: a 3-D DiT predicting the flow velocity over video latents [B, C, F, h, w],
umT5 text, the causal video VAE `AutoencoderKLWan`): `family.py` the family, `tiny.py` its tiny pipeline,
`real_size.py` its published variants for `unirl plan`."""

FAMILIES = {
    "wan": "WanFamily",
    "wan_i2v": "WanI2VFamily",
    "wan2_2": "Wan22Family",
}  # name -> class in family.py: what the registry finds here (nothing heavy imported)
