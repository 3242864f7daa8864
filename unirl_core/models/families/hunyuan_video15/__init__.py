"""HunyuanVideo 1.5 text-to-video (`HunyuanVideo15Pipeline`: a dual-stream 3-D DiT predicting the flow velocity over
video latents [B, C, F, h, w], Qwen2.5-VL text with a ByT5 glyph encoder, the causal video VAE
`AutoencoderKLHunyuanVideo15`): `family.py` the family, `tiny.py` its tiny pipeline, `real_size.py` its published
variants for `unirl plan`."""

FAMILIES = {"hunyuan_video15": "HunyuanVideo15Family"}  # name -> class in family.py (nothing heavy imported)
