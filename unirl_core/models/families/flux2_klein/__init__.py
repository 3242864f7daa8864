"""FLUX.2-Klein (4B / 9B, distilled and base): `family.py`, `tiny.py`, `real_size.py`."""

FAMILIES = {"flux2_klein": "Flux2KleinFamily"}
