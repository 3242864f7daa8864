"""Stable Diffusion 3 / 3.5 (MMDiT, flow matching): `family.py` the family, `tiny.py` its tiny pipeline,
`real_size.py` its published variants for `unirl plan`."""

FAMILIES = {"sd3": "SD3Family"}  # name -> class in family.py: what the registry finds here (nothing heavy imported)
