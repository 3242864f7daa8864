"""Stable Diffusion 1.x (UNet, epsilon prediction, DDIM): `family.py`, `tiny.py`, `real_size.py`."""

FAMILIES = {"sd15": "SD15Family"}
