"""The `precache` recipe section: NeMo's precache YAML as is, plus safe output formats and a configurable transform.

    precache:
      input_dir: /data/laion-mini/shards        # WebDataset shards (e.g. ingest's shards/)
      output_dir: /data/laion-mini/precache
      batch_size_per_GPU: 8                     # NeMo's fields from here on
      dataloader_num_workers: 2
      save_original_in_tar: [text]
      encodings:
        - {modality: image, extension: jpg, key: autoencoderkl_image, precision: 16,
           encoder_config: {cls: unirl_core.precache.encoders.AutoencoderKLEncoder, pretrained: /models/sd, subfolder: vae}}
        - {modality: text, extension: txt, key: clip_text, precision: 32, store_pad_tokens: false,
           encoder_config: {cls: unirl_core.precache.encoders.CLIPTextEncoder, pretrained: /models/sd,
                            subfolder: text_encoder, tokenizer_subfolder: tokenizer}}

The NeMo fields can also come from a standalone NeMo YAML named by `precache_config_path`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from unirl_core.config.schema_base import Count, OptionalStr, StrictModel
from unirl_core.precache.members import MERGEABLE_EXTENSIONS, TRUSTED_HINT, unmergeable, unsafe_extension_reason


class EncoderConfig(StrictModel):
    """NeMo's `encoder_config`: `cls` (dotted class path) plus the keyword arguments it is built with."""

    model_config = {**StrictModel.model_config, "extra": "allow"}  # kwargs of the encoder class

    cls: str
    """Dotted path of the encoder class; built with the other keys as kwargs, then put in eval mode with gradients
    off. It must have `encode(x)` or `__call__(x)` returning a tensor, or `(tensor, mask)` for text."""


class EncodingSpec(StrictModel):
    """One encoding stored per sample (NeMo's `encodings` entry). Several encoders per modality are allowed."""

    modality: Literal["image", "text", "video"]
    """What the encoder reads: `image` (decoded and transformed: [B, 3, H, W]), `video` (frames sampled and
    transformed by `video_transform`: [B, 3, F, H, W]) or `text` (the caption string)."""

    extension: str
    """Member extension read from the source tar (`jpg`, `png`, `mp4`, `txt`)."""

    key: str
    """Name of this encoding in the output (NeMo recommends `{model}-{variant}_{modality}`)."""

    precision: Literal[16, 32] = 32
    """Stored float precision in bits: 16 (float16) or 32 (float32)."""

    store_pad_tokens: bool = True
    """Text only: false stores only real tokens (the encoder must return `(encoded, mask)`) and their count."""

    encoder_config: EncoderConfig
    """The encoder class and its kwargs."""

    @field_validator("key")
    @classmethod
    def _key_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", value):
            raise ValueError("use letters, digits, `_` and `-` only (it becomes a member or tensor name)")
        return value


class ImageTransformConfig(StrictModel):
    """How source images become encoder input: resize, crop, scale to [-1, 1]. Part of the cache's identity."""

    preset: Literal["nemo"] | None = None
    """`nemo`: NeMo's hard-coded transform (short side 512, center crop 512). Overrides `size` and `mode`."""

    size: Annotated[Count, Field(ge=8)] = 256
    """Target size in pixels (the short side for `center_crop`, both sides for `resize`)."""

    mode: Literal["center_crop", "resize", "none"] = "center_crop"
    """`center_crop`: short side to `size`, then a centered square; `resize`: stretch to size x size; `none`."""

    @model_validator(mode="after")
    def _apply_preset(self):
        if self.preset == "nemo" and (self.size, self.mode) != (512, "center_crop"):
            object.__setattr__(self, "size", 512)
            object.__setattr__(self, "mode", "center_crop")
        return self


class VideoTransformConfig(StrictModel):
    """How source videos become encoder input: `num_frames` frames sampled at `fps` from the clip's start, each
    resized to cover `width` x `height` and center-cropped to it, scaled to [-1, 1]: [3, F, H, W]. Part of the
    cache's identity. Empty fields come from the recipe's `train.sampling` (`num_frames`, `fps` (else the family's
    native rate), `width`, `height`), so the latents have the shape rollouts sample.

    Frame i is the clip's frame showing at time i / fps: the last frame whose timestamp is at most that (frames
    are repeated when fps is above the clip's rate and dropped when below). A clip shorter than (num_frames - 1)
    / fps plus one frame is skipped as `too_short` (`short_clips: skip`, counted and listed), or padded by
    repeating its last frame (`short_clips: pad`)."""

    num_frames: Annotated[Count, Field(ge=1)] | None = None
    """Frames per clip (Wan: (num_frames - 1) % 4 == 0). Empty: `train.sampling.num_frames`."""

    fps: Annotated[float, Field(gt=0)] | None = None
    """Rate the frames are sampled at, frames per second. Empty: `train.sampling.fps`, else the family's."""

    width: Annotated[Count, Field(ge=8)] | None = None
    """Frame width in pixels. Empty: `train.sampling.width`."""

    height: Annotated[Count, Field(ge=8)] | None = None
    """Frame height in pixels. Empty: `train.sampling.height`."""

    short_clips: Literal["skip", "pad"] = "skip"
    """A clip too short for `num_frames` at `fps`: `skip` it (`too_short`), or `pad` it with its last frame."""

    @property
    def complete(self) -> bool:
        return None not in (self.num_frames, self.fps, self.width, self.height)


class PrecacheConfig(StrictModel):
    """Frozen-encoder precache of WebDataset shards into encoding shards (NeMo's precache_encodings stage)."""

    input_dir: OptionalStr = None
    """Folder or URL of the source shards (`*.tar`). Empty: the `shards/` folder of this recipe's ingest output."""

    output_dir: OptionalStr = None
    """Folder or URL for the encoding shards. Empty: `<input_dir>/../precache`."""

    precache_config_path: OptionalStr = None
    """A standalone NeMo precache YAML; its keys fill this section (keys set here win)."""

    batch_size_per_GPU: Annotated[Count, Field(ge=1)] = 8
    """Per rank: samples per encoder call."""

    dataloader_num_workers: Annotated[Count, Field(ge=0)] = 2
    """Per rank: DataLoader worker processes that read and decode (0: in the main process)."""

    save_original_in_tar: list[Literal["image", "text", "video"]] | None = None
    """Source members copied next to the encodings (the members of the encodings' own extensions)."""

    pickle_encodings: bool | None = None
    """NeMo's switch. False: NeMo's non-pickle layout (`format: npy`). True needs `format: nemo_pickle`."""

    format: Literal["safetensors", "npy", "nemo_pickle"] | None = None
    """Output format. `safetensors` (default): one `<key>.safetensors` member per sample; `npy`: one
    `<key>.<encoding>` np.save member per encoding (NeMo's pickle_encodings: false); `nemo_pickle`: NeMo's
    `<key>.pickle` of dict[str, ndarray] (readers refuse it unless told the shards are trusted)."""

    encodings: list[EncodingSpec] = []
    """The encodings stored for each sample."""

    merge_source_extensions: list[str] = []
    """NeMo's merge_source_tar (`source_extensions`): after precaching, copy these source members (`json`, `jpg`)
    next to each sample's encodings. Empty: the stage is skipped. Unless `trusted`, only images, `mp4` videos,
    `txt`, `json`, `safetensors` and `npy` (unirl_core/precache/members.py)."""

    trusted: bool = False
    """True only for shards you made (or trust who did): source samples holding pickle-like or executable members
    (`.pickle`, `.pth`, `.pyd`, `.so`, ...) are precached instead of skipped, merge_source_extensions may name any
    extension, and readers of the cache (training) load `nemo_pickle` encodings. Member names that could escape a
    folder (`..`, absolute, NUL, over-long) are refused even so."""

    image_transform: ImageTransformConfig = ImageTransformConfig()
    """Image preprocessing before image encoders."""

    video_transform: VideoTransformConfig = VideoTransformConfig()
    """Video preprocessing before video encoders: frame sampling, resize and crop (empty fields: the recipe's
    `train.sampling`)."""

    tar_chunk_size: Annotated[Count, Field(ge=1)] = 1000
    """Samples per output shard; the last shard of each task keeps a `.INCOMPLETE` marker."""

    node_array_size: Annotated[Count, Field(ge=1)] | str = 1
    """NeMo: number of tasks (int), or a range `"A-B"` of task ids to (re)run out of `override_task_count`."""

    override_task_id: Annotated[Count, Field(ge=0)] | None = None
    """NeMo: run only this task id (0 is valid)."""

    override_task_count: Annotated[Count, Field(ge=1)] | None = None
    """NeMo: the total task count the slices are cut for (needed to re-run a range or one task)."""

    device: str = "auto"
    """Torch device for the encoders: `auto` (cuda when available, else cpu), `cpu`, `cuda`, `cuda:1`."""

    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    """Compute dtype of the encoders (the stored precision is per encoding)."""

    @field_validator("node_array_size")
    @classmethod
    def _range(cls, value: Any) -> Any:
        if isinstance(value, str) and not re.fullmatch(r"\d+-\d+", value.strip()):
            raise ValueError('an integer task count, or a range "A-B" of task ids')
        return value

    @property
    def has_video(self) -> bool:
        return any(spec.modality == "video" for spec in self.encodings)

    @property
    def output_format(self) -> str:
        if self.format is not None:
            return self.format
        return "npy" if self.pickle_encodings is False else "safetensors"

    def problems(self):
        yield from super().problems()
        if not self.encodings and not self.precache_config_path:
            yield "encodings", [], "at least one encoding (or a precache_config_path with `encodings`)"
        if self.pickle_encodings and self.format not in (None, "nemo_pickle"):
            yield "pickle_encodings", True, f"pickle output needs format: nemo_pickle (format is {self.format})"
        keys = [e.key for e in self.encodings]
        if len(keys) != len(set(keys)):
            yield "encodings", keys, "each encoding needs its own key"
        yield from self._member_problems()
        if isinstance(self.node_array_size, str) and self.override_task_count is None:
            yield "override_task_count", None, "a node_array_size range needs the original override_task_count"

    def _member_problems(self):
        """Encoding keys that would name a member readers refuse; extensions that would skip every sample, replace
        the encodings or copy unsafe members (unless trusted)."""
        for i, spec in enumerate(self.encodings):
            if spec.key == "safetensors" or unsafe_extension_reason(spec.key):
                yield f"encodings.{i}.key", spec.key, "a reserved member extension (a format or unsafe); rename it"
            reason = None if self.trusted else unsafe_extension_reason(spec.extension)
            if reason:
                yield f"encodings.{i}.extension", spec.extension, f"{reason}; {TRUSTED_HINT}"
        clash = sorted(set(self.merge_source_extensions) & {"safetensors", "pickle", *(e.key for e in self.encodings)})
        if clash:
            yield "merge_source_extensions", clash, "the cache's own encoding members: a copy would replace them"
        refused = unmergeable(self.merge_source_extensions, self.trusted)
        if refused:
            allowed = ", ".join(sorted(MERGEABLE_EXTENSIONS))
            message = f"not copied from source shards unless trusted (allowed: {allowed}); {TRUSTED_HINT}"
            yield "merge_source_extensions", refused, message
