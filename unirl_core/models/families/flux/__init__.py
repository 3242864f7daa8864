"""FLUX.1 dev, schnell and Kontext (guidance-distilled flow transformers): `family.py`, `tiny.py`,
`real_size.py`."""

FAMILIES = {"flux": "FluxFamily", "flux_schnell": "FluxSchnellFamily", "flux_kontext": "FluxKontextFamily"}
