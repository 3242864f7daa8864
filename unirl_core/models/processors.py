"""The processor of a transformers VLM folder, on any machine: `AutoProcessor`, except that a Qwen-VL folder
(Qwen2-VL, Qwen2.5-VL, Qwen3-VL) on a machine without torchvision gets its processor class built from the folder's
image processor (the PIL one) and tokenizer, without the video processor (whose classes need torchvision). Images
then work as with the stock processor; videos are refused. Used by the autoregressive domain's VLM policy and the
`vlm_judge` reward.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

MROPE_MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")  # 3-D rotary positions (M-RoPE)


def model_type(path) -> str:
    """The `model_type` in the folder's config.json."""
    return json.loads((Path(path) / "config.json").read_text()).get("model_type", "")


def is_vlm_folder(path) -> bool:
    """Whether the model folder at `path` holds a vision-language model (its config.json has a vision config)."""
    return "vision_config" in json.loads((Path(path) / "config.json").read_text())


def load_processor(path, **kwargs):
    """`AutoProcessor.from_pretrained(path)`; for a Qwen-VL folder on a machine without torchvision (its video
    processor needs it), the same processor class built from the folder's image processor and tokenizer, without a
    video processor: images work as with the stock processor, videos are refused. `kwargs` go to each
    `from_pretrained` (e.g. local_files_only)."""
    from transformers import AutoProcessor

    kind = model_type(path)
    if kind not in MROPE_MODELS or importlib.util.find_spec("torchvision") is not None:
        return AutoProcessor.from_pretrained(path, **kwargs)
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    class ImagesOnly(getattr(transformers, PROCESSOR_MAPPING_NAMES[kind])):
        def check_argument_for_proper_class(self, name, argument):
            return None if argument is None else super().check_argument_for_proper_class(name, argument)

    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    return ImagesOnly(image_processor=AutoImageProcessor.from_pretrained(path, **kwargs), tokenizer=tokenizer,
                      video_processor=None, chat_template=tokenizer.chat_template)  # fmt: skip
