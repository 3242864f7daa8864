"""Stable Diffusion XL (UNet, two CLIP encoders, DDIM sampler): `family.py`, `tiny.py`, `real_size.py`."""

FAMILIES = {"sdxl": "SDXLFamily"}
