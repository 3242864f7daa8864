"""What a VLM adds to the autoregressive policy: its processor, per-image slices of its image inputs, and the 3-D
rotary positions (M-RoPE) of the Qwen-VL models.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL give each token three position ids (temporal, height, width): text tokens carry
the same id on all three, an image's tokens their grid coordinates, and the text after an image goes on from the
largest id before it. The model computes them itself only when it is given neither positions nor a cache it has
seen the prompt of; the policy computes them instead with the model's own `get_rope_index`, once for the prompt
(the decoding steps go on from each row's largest id) and once for [prompt | completion] at training geometry, so
that sampling and training place every token at the same position.

Their image inputs are flattened patches: `pixel_values` [sum of patches, D] with `image_grid_thw` [images, 3]
(patches of image i: the product of its row); LLaVA-style inputs are one tensor per image.
"""

from __future__ import annotations

import torch

from unirl_core.models.processors import MROPE_MODELS, is_vlm_folder, load_processor, model_type

__all__ = ["MROPE_MODELS", "MRope", "images_of", "is_vlm_folder", "load_processor", "model_type"]


def images_of(vision: dict, images: list[int]) -> dict:
    """The image inputs of images `images` (indices in batch order): patch rows for flattened-patch inputs (those
    with `image_grid_thw`), whole entries for per-image ones."""
    if "image_grid_thw" not in vision:
        return {key: value[images] for key, value in vision.items()}
    grid = vision["image_grid_thw"]
    ends = grid.prod(-1).cumsum(0).tolist()
    patches = [row for i in images for row in range(ends[i] - int(grid[i].prod()), ends[i])]
    return {"pixel_values": vision["pixel_values"][patches], "image_grid_thw": grid[images]}


class MRope:
    """The 3-D positions of a Qwen-VL model (`model`: the transformers model holding `get_rope_index`)."""

    def __init__(self, model, image_token_id: int, video_token_id: int | None):
        self.model, self.image_token_id, self.video_token_id = model, image_token_id, video_token_id

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, vision: dict) -> torch.Tensor:
        """[3, B, L] position ids of `ids` (left-padded prompts, or [prompt | completion]) with `vision`'s images."""
        types = (ids == self.image_token_id).int()
        if self.video_token_id is not None:
            types = types + 2 * (ids == self.video_token_id).int()
        positions, _ = self.model.get_rope_index(input_ids=ids, mm_token_type_ids=types, attention_mask=mask,
                                                 image_grid_thw=vision.get("image_grid_thw"))  # fmt: skip
        return positions

    @staticmethod
    def next(positions: torch.Tensor) -> torch.Tensor:
        """The positions [3, B, 1] of the token after `positions` [3, B, L]: each row's largest id plus one (the
        last token of a left-padded row is real and text, so its id is the row's largest)."""
        return positions[..., -1:] + 1
