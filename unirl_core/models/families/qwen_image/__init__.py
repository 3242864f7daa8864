"""Qwen-Image and Qwen-Image-Edit (MMDiT with a Qwen2.5-VL text encoder): `family.py`, `tiny.py`,
`real_size.py`."""

FAMILIES = {"qwen_image": "QwenImageFamily", "qwen_image_edit": "QwenImageEditFamily"}
