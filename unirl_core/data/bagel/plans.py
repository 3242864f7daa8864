"""Samples and their sequence plans: BAGEL's three-token system, its t2i caption choice, edit trajectories and VLM
conversations (seeds/bagel-dataset-types.md; FORMATS.md 5 corrects the seed where they differ).

A sample is a list of elements in order. Each element is one sequence-plan entry:

    {"type": "text" | "vae_image" | "vit_image", "enable_cfg": 0|1, "loss": 0|1,
     "special_token_loss": 0|1, "special_token_label": None | token id,
     # video frames only: "split_start", "split_end", "frame_delta"}

An image can appear three times: a noised VAE target (`loss` 1, MSE, never CFG-dropped), a clean VAE condition
(`loss` 0, timestep -inf) and ViT tokens (understanding). `text_ids_list` holds one id list per text element and
`image_tensor_list` one [3, H, W] tensor per image element, both in plan order. `num_tokens` counts text ids plus
`H*W // stride^2` per image element; the packer adds 2 per plan entry (BOS/EOS, start/end of image).

Randomness (caption choice, edit trajectory, concatenated vs sequential) comes from an `rng` the dataset seeds per
sample from (seed, epoch, sample index), so a sample is the same however it is reached: on first pass, after a
resume, or when the packer rebuilds its overflow buffer.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from unirl_core.data.bagel.transforms import ImageTransformArgs, transform

TEXT, VAE_IMAGE, VIT_IMAGE = "text", "vae_image", "vit_image"

Encode = Callable[[str], list[int]]


class SkipSample(ValueError):
    """A row that cannot become a sample; `reason` is the counter key (e.g. "no_loss", "bad_image")."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def plan_entry(kind: str, *, enable_cfg: bool, loss: bool, **video: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "enable_cfg": int(enable_cfg),
        "loss": int(loss),
        "special_token_loss": 0,
        "special_token_label": None,
        **video,
    }


@dataclass
class Sample:
    """One sample in BAGEL's layout (the packer's input)."""

    image_tensor_list: list[torch.Tensor]
    text_ids_list: list[list[int]]
    sequence_plan: list[dict[str, Any]]
    num_tokens: int
    data_indexes: dict[str, Any] = field(default_factory=dict)  # {"data_indexes", "worker_id", "dataset_name", ...}

    def packed_tokens(self) -> int:
        """Tokens this sample takes in a pack: its own plus 2 per plan entry."""
        return self.num_tokens + 2 * len(self.sequence_plan)

    def has_loss(self) -> bool:
        return any(entry["loss"] for entry in self.sequence_plan)


def open_image(data: bytes | str) -> Image.Image:
    """Decoded image from bytes or a path; a file that does not decode raises SkipSample("bad_image")."""
    try:
        image = Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)
        image.load()
    except FileNotFoundError as error:
        raise SkipSample("missing_image", str(error)) from error
    except Exception as error:  # Pillow raises many types for broken files
        raise SkipSample("bad_image", f"{type(error).__name__}: {error}") from error
    return image


class SampleBuilder:
    """BAGEL's `_add_text` / `_add_image` / `_add_video` helpers, building one sample."""

    def __init__(self, encode: Encode, vae: ImageTransformArgs | None = None, vit: ImageTransformArgs | None = None):
        self.encode, self.vae, self.vit = encode, vae, vit
        self.images: list[torch.Tensor] = []
        self.texts: list[list[int]] = []
        self.plan: list[dict[str, Any]] = []
        self.num_tokens = 0

    def add_text_ids(self, ids: list[int], *, need_loss: bool, enable_cfg: bool = True) -> SampleBuilder:
        self.texts.append(list(ids))
        self.num_tokens += len(ids)
        self.plan.append(plan_entry(TEXT, enable_cfg=enable_cfg, loss=need_loss))
        return self

    def add_text(self, text: str, *, need_loss: bool, enable_cfg: bool = True) -> SampleBuilder:
        return self.add_text_ids(self.encode(text), need_loss=need_loss, enable_cfg=enable_cfg)

    def _add_tensor(self, tensor: torch.Tensor, stride: int, entry: dict[str, Any]) -> None:
        self.images.append(tensor)
        self.num_tokens += tensor.shape[1] * tensor.shape[2] // stride**2
        self.plan.append(entry)

    def add_image(
        self, image: Image.Image, *, need_loss: bool, need_vae: bool, need_vit: bool, enable_cfg: bool = True,
        image_count: int = 1,
    ) -> SampleBuilder:  # fmt: skip
        """Noised VAE target (loss), clean VAE condition, ViT tokens: in that order, each when asked for."""
        assert need_loss or need_vae or need_vit, "an image element needs at least one of loss, vae, vit"
        if need_loss or need_vae:
            vae_tensor = transform(image, self._args("vae"), image_count)
            if need_loss:
                self._add_tensor(vae_tensor, self.vae.image_stride, plan_entry(VAE_IMAGE, enable_cfg=False, loss=True))
            if need_vae:
                entry = plan_entry(VAE_IMAGE, enable_cfg=enable_cfg, loss=False)
                self._add_tensor(vae_tensor.clone(), self.vae.image_stride, entry)
        if need_vit:
            vit_tensor = transform(image, self._args("vit"), image_count)
            self._add_tensor(
                vit_tensor, self.vit.image_stride, plan_entry(VIT_IMAGE, enable_cfg=enable_cfg, loss=False)
            )
        return self

    def add_video(
        self, frames: list[Image.Image], frame_indexes: list[int], *, need_loss: bool, enable_cfg: bool = True
    ) -> SampleBuilder:
        """VAE frames of one split group: one timestep for the group, positions advanced by `frame_delta`."""
        for index, (frame, frame_index) in enumerate(zip(frames, frame_indexes, strict=True)):
            video = {"split_start": index == 0, "split_end": index == len(frames) - 1}
            if index < len(frames) - 1:
                video["frame_delta"] = frame_indexes[index + 1] - frame_index
            entry = plan_entry(VAE_IMAGE, enable_cfg=enable_cfg and not need_loss, loss=need_loss, **video)
            self._add_tensor(transform(frame, self._args("vae")), self.vae.image_stride, entry)
        return self

    def _args(self, which: str) -> ImageTransformArgs:
        args = self.vae if which == "vae" else self.vit
        if args is None:
            key = "image_transform_args" if which == "vae" else "vit_image_transform_args"
            raise ValueError(f"this dataset adds {which.upper()} images but its group config has no `{key}`")
        return args

    def build(self, data_indexes: dict[str, Any]) -> Sample:
        return Sample(self.images, self.texts, self.plan, self.num_tokens, data_indexes)


# ---- t2i_pretrain -------------------------------------------------------------------------------------------------


def t2i_sample(
    image: bytes, captions: str, encode: Encode, vae: ImageTransformArgs, rng: random.Random,
    data_indexes: dict[str, Any],
) -> Sample:  # fmt: skip
    """[caption text (CFG-droppable, no loss)] -> [noised VAE image (MSE)]. One caption picked per visit; none: " "."""
    try:
        caption_dict = json.loads(captions)
        texts = [str(value) for value in caption_dict.values()]
    except (TypeError, ValueError, AttributeError) as error:
        raise SkipSample("bad_captions", f"captions is not a JSON object: {error}") from error
    picture = open_image(image)
    builder = SampleBuilder(encode, vae=vae)
    builder.add_text(rng.choice(texts) if texts else " ", need_loss=False, enable_cfg=True)
    builder.add_image(picture, need_loss=True, need_vae=False, need_vit=False)
    return builder.build(data_indexes)


# ---- unified_edit -------------------------------------------------------------------------------------------------


def edit_trajectory(image_num: int, rng: random.Random) -> tuple[int, int, bool]:
    """(start, end, concatenated): 1 to 2 edit steps from a random start, BAGEL's draw order and edge rule."""
    if image_num < 2:
        raise SkipSample("too_few_images", f"an edit row needs at least 2 images, got {image_num}")
    start = rng.choice(range(image_num - 1))
    end = rng.choice(range(start + 1, min(start + 3, image_num)))
    concatenated = end - start > 1 and rng.random() < 0.5
    if concatenated and end == image_num - 1:
        end -= 1  # BAGEL's rule: a concatenated trajectory never ends on the row's last image
    return start, end, concatenated


def edit_sample(
    images: list[bytes], instructions: list[list[str]], encode: Encode, vae: ImageTransformArgs,
    vit: ImageTransformArgs, rng: random.Random, data_indexes: dict[str, Any],
) -> Sample:  # fmt: skip
    """Clean VAE + ViT of the start image, then either one concatenated instruction and the final target, or each
    instruction followed by its noised target (intermediate targets also clean VAE + ViT, to condition the next)."""
    if len(instructions) != len(images) - 1:
        raise SkipSample(
            "instruction_count",
            f"{len(images)} images need {len(images) - 1} instruction lists, got {len(instructions)}",
        )
    start, end, concatenated = edit_trajectory(len(images), rng)
    builder = SampleBuilder(encode, vae=vae, vit=vit)
    builder.add_image(open_image(images[start]), need_loss=False, need_vae=True, need_vit=True)
    if concatenated:
        text = "".join(rng.choice(instructions[step - 1]) + ". " for step in range(start + 1, end + 1))
        builder.add_text(text.rstrip(), need_loss=False)
        builder.add_image(open_image(images[end]), need_loss=True, need_vae=False, need_vit=False)
        return builder.build(data_indexes)
    for step in range(start + 1, end + 1):
        builder.add_text(rng.choice(instructions[step - 1]), need_loss=False)
        last = step == end
        builder.add_image(open_image(images[step]), need_loss=True, need_vae=not last, need_vit=not last)
    return builder.build(data_indexes)


# ---- vlm_sft ------------------------------------------------------------------------------------------------------


def conversation_elements(
    conversations: list[dict[str, str]], num_images: int, target: str = "bagel"
) -> list[dict[str, Any]]:
    """Human turns split at `<image>` (at most `num_images` images), no loss; gpt turns are text with loss. Any other
    turn (`system`, ...): left out and the sample kept under `target: bagel` (BAGEL's `change_format` reads only
    human and gpt turns); the sample skipped as "bad_conversation" under `target: unirl`."""
    elements: list[dict[str, Any]] = []
    for turn in conversations:
        speaker, value = turn.get("from"), turn.get("value", "")
        if speaker == "gpt":
            elements.append({"type": "text", "has_loss": 1, "text": value})
            continue
        if speaker != "human":
            if target == "bagel":
                continue
            raise SkipSample("bad_conversation", f"turn speaker must be 'human' or 'gpt', got {speaker!r}")
        pieces = value.split("<image>")
        for index, piece in enumerate(pieces):
            if piece.strip():
                elements.append({"type": "text", "has_loss": 0, "text": piece.strip()})
            if index < len(pieces) - 1 and index < num_images:
                elements.append({"type": "image"})
    return elements


def expand_video(conversations: list[dict[str, str]], num_frames: int) -> list[dict[str, str]]:
    """The first `<video>` becomes one `<image>` per sampled frame."""
    out = [dict(turn) for turn in conversations]
    for turn in out:
        if "<video>" in turn.get("value", ""):
            turn["value"] = turn["value"].replace("<video>", "<image>" * num_frames)
            break
    return out


def vlm_sample(
    conversations: list[dict[str, str]], images: list[Image.Image], encode: Encode, vit: ImageTransformArgs,
    data_indexes: dict[str, Any], target: str = "bagel",
) -> Sample:  # fmt: skip
    """Text and ViT images in conversation order; only gpt answers carry loss; no CFG. No answer: SkipSample."""
    builder = SampleBuilder(encode, vit=vit)
    tensors = [transform(image, vit, image_count=len(images)) for image in images]
    for element in conversation_elements(conversations, len(tensors), target):
        if element["type"] == "text":
            ids = encode(element["text"])
            if ids:
                builder.add_text_ids(ids, need_loss=bool(element["has_loss"]), enable_cfg=False)
        else:
            entry = plan_entry(VIT_IMAGE, enable_cfg=False, loss=False)
            builder._add_tensor(tensors[len(builder.images)], vit.image_stride, entry)
    sample = builder.build(data_indexes)
    if not sample.has_loss():
        raise SkipSample("no_loss", "no gpt answer with text: nothing to learn from")
    return sample
