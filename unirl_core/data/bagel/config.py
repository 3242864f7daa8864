"""A BAGEL data mixture: its YAML groups (BAGEL's keys) plus where the data is (BAGEL's dataset info).

    t2i_pretrain:                     # a group: its name is the dataset type (the registry key)
      dataset_names: [t2i]            # entries of dataset_info[t2i_pretrain]
      image_transform_args: {image_stride: 16, max_image_size: 1024, min_image_size: 512}
      is_mandatory: true              # one sample of this group starts every pack
      num_used_data: [10]             # per dataset name: files (parquet types, repeated to upsample) or lines (vlm)
      weight: 1                       # relative draw weight once the mandatory samples are in
    dataset_info:                     # BAGEL keeps this in dataset_info.py; here: inline, or a path to YAML/JSON
      t2i_pretrain:
        t2i: {data_dir: t2i/, num_files: 4, num_total_samples: 400}
    tokenizer: path/to/tokenizer      # ours: any transformers tokenizer folder
    packing: {expected_num_tokens: 32768}  # ours: PackingConfig fields
    seed: 42                          # ours: file order (BAGEL's data_seed), per-sample draws and the packer
    target: bagel                     # ours: bagel (default) | unirl, see below

`target: bagel` follows BAGEL's own data code wherever its trainer sees the difference (image sizes, transparency,
kept conversations, video frames, file order, batch keys, `max_latent_size` 32) and refuses, before any data is
read, a config BAGEL's dataset constructors would refuse: a group without `num_used_data`, a `t2i_pretrain` entry
with `parquet_info_path` (T2IIterableDataset has no such argument), a `unified_edit` entry without it, a `vlm_sft`
group without `frame_sampler_args` (both required arguments there). `seed` defaults to 42 (BAGEL's `data_seed`).
`target: unirl` keeps this project's own choices (docs/bagel.md) and defaults `seed` to 0.

Relative paths are resolved against the YAML's folder. Unknown keys are errors naming the allowed ones. The models
stand on the shared config base (StrictModel): assignments are validated too, and a weight must be finite.
`load_mixture` reports every problem of a YAML as recipes do (`BagelConfigError`): one line per problem, with the
key as written in the file, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError, create_model, model_validator

from unirl_core.config.recipe import RecipeError, RecipeIssue, unknown_key_message, validation_issues
from unirl_core.config.schema_base import StrictModel
from unirl_core.data.bagel.packing import PackingConfig
from unirl_core.data.bagel.transforms import ImageTransformArgs

DATASET_TYPES = ("t2i_pretrain", "unified_edit", "vlm_sft")
RESERVED_KEYS = ("dataset_info", "tokenizer", "packing", "seed", "target")
BAGEL_CLASSES = {"t2i_pretrain": "T2IIterableDataset", "unified_edit": "UnifiedEditIterableDataset",
                 "vlm_sft": "SftJSONLIterableDataset"}  # fmt: skip
_GROUP_COMMON = {"dataset_names", "image_transform_args", "is_mandatory", "num_used_data", "weight"}
BAGEL_GROUP_KEYS = {  # the YAML keys BAGEL's build_datasets turns into each constructor's arguments
    "t2i_pretrain": _GROUP_COMMON,
    "unified_edit": _GROUP_COMMON | {"vit_image_transform_args"},
    "vlm_sft": _GROUP_COMMON | {"frame_sampler_args", "shuffle_lines", "shuffle_seed"},
}
BAGEL_SEED = 42  # BAGEL's DataArguments.data_seed: the seed of its file shuffle


class BagelConfigError(RecipeError):
    """A BAGEL data config that cannot be used; carries every issue found, keys as written in the YAML."""

    what = "BAGEL data config"


class TransformArgs(StrictModel):
    image_stride: int = 16  # pixels per token side: 16 for the VAE (downsample 8 x patch 2), 14 for the ViT
    max_image_size: int = 1024  # longest side after resizing, pixels
    min_image_size: int = 512  # shortest side is scaled up to at least this, pixels
    max_pixels: int = 14 * 14 * 9 * 1024  # pixel budget of one sample's images, divided by their count

    def build(self, target: str = "bagel") -> ImageTransformArgs:
        return ImageTransformArgs(**self.model_dump(), target=target)


class FrameSamplerArgs(StrictModel):
    max_num_frames: int = 12  # frames sampled per video, at most
    min_num_frames: int = 8  # and at least (when the video has that many)


class GroupConfig(StrictModel):
    """One group of BAGEL's data YAML (the keys BAGEL reads, with its defaults)."""

    dataset_names: list[str] = Field(min_length=1)
    image_transform_args: TransformArgs | None = None
    vit_image_transform_args: TransformArgs | None = None
    frame_sampler_args: FrameSamplerArgs | None = None
    is_mandatory: bool = False
    num_used_data: list[int] | None = None  # per dataset name; None: every file / line once
    weight: float = Field(default=0.0, ge=0.0)  # BAGEL's default: a group without weight is only drawn if mandatory
    shuffle_lines: bool = False  # vlm_sft: shuffle the JSONL lines (with shuffle_seed) before num_used_data cuts
    shuffle_seed: int = 0

    @model_validator(mode="after")
    def _used_data_per_name(self) -> GroupConfig:
        if self.num_used_data is not None and len(self.num_used_data) != len(self.dataset_names):
            raise ValueError(
                f"num_used_data has {len(self.num_used_data)} entries for {len(self.dataset_names)} dataset_names: "
                "give one count per dataset name"
            )
        return self


class DatasetInfo(StrictModel):
    """BAGEL's dataset info keys for one named dataset."""

    data_dir: str | None = None  # parquet types: the folder of parquet files; vlm_sft: the image folder
    num_files: int | None = None  # informational (BAGEL's), checked against the folder when given
    num_total_samples: int | None = None  # informational
    parquet_info_path: str | None = None  # {"/abs/path.parquet": {"num_row_groups": N}}; keys are real paths
    jsonl_path: str | None = None  # vlm_sft: the conversations file


def _packing_settings() -> type[StrictModel]:
    """PackingConfig's fields as a config model, so a mixture's `packing:` keys and values are checked with the
    rest of the YAML (types, unknown keys with "did you mean")."""
    hints = typing.get_type_hints(PackingConfig)
    fields = {f.name: (hints[f.name], f.default) for f in dataclasses.fields(PackingConfig)}
    return create_model("PackingSettings", __base__=StrictModel, **fields)


PackingSettings = _packing_settings()


def _as_written(settings: StrictModel) -> dict[str, Any]:
    return settings.model_dump(exclude_unset=True)


class Mixture(StrictModel):
    groups: dict[str, GroupConfig]
    dataset_info: dict[str, dict[str, DatasetInfo]]
    tokenizer: str | None = None
    # PackingConfig keys; checked against its fields, then kept as the mapping written (defaults left unset)
    packing: Annotated[PackingSettings, AfterValidator(_as_written)] = Field(default_factory=dict)
    seed: int = BAGEL_SEED
    target: Literal["bagel", "unirl"] = "bagel"

    @model_validator(mode="before")
    @classmethod
    def _seed_of_target(cls, data):
        """`seed` left out: BAGEL's data_seed (42) under `target: bagel`, 0 under `target: unirl`."""
        if isinstance(data, dict) and data.get("seed") is None:
            data = {**data, "seed": BAGEL_SEED if data.get("target", "bagel") == "bagel" else 0}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Mixture:
        for kind, group in self.groups.items():
            if kind not in DATASET_TYPES:
                raise ValueError(f"unknown dataset type {kind!r}: the registered types are {', '.join(DATASET_TYPES)}")
            known = self.dataset_info.get(kind, {})
            missing = [name for name in group.dataset_names if name not in known]
            if missing:
                raise ValueError(
                    f"{kind}: dataset_names {missing} have no entry in dataset_info[{kind}] (known: {sorted(known)})"
                )
        if not any(g.weight > 0 for g in self.groups.values()):
            raise ValueError("every group has weight 0: give at least one group a positive `weight`")
        misplaced = sorted({"seed", "target"} & set(self.packing))
        if misplaced:
            raise ValueError(f"packing.{misplaced[0]}: set `{misplaced[0]}:` at the top level of the mixture, not under "
                             "`packing:` (it drives the datasets too)")  # fmt: skip
        if self.target == "bagel":
            self._check_bagel_accepts()
        return self

    def _check_bagel_accepts(self) -> None:
        """What BAGEL's `PackedDataset.build_datasets` + dataset constructors refuse (TypeError there), named here."""
        fix = "or set `target: unirl` for a config only this project reads"
        for kind, group in self.groups.items():
            foreign = sorted(group.model_fields_set & (set(GroupConfig.model_fields) - BAGEL_GROUP_KEYS[kind]))
            if foreign:
                raise ValueError(f"{kind}: BAGEL's {BAGEL_CLASSES[kind]} takes no `{foreign[0]}`: remove it, {fix}")
            needed = ["image_transform_args"] + (["vit_image_transform_args"] if kind == "unified_edit" else [])
            for key in needed:
                if getattr(group, key) is None:
                    raise ValueError(f"{kind}: BAGEL's {BAGEL_CLASSES[kind]} requires `{key}` (its transform): add "
                                     f"it, {fix}")  # fmt: skip
            if group.num_used_data is None:
                raise ValueError(f"{kind}: BAGEL's dataset constructors require `num_used_data` (one count per "
                                 f"dataset name: files, or lines for vlm_sft): add it, {fix}")  # fmt: skip
            if kind == "vlm_sft" and group.frame_sampler_args is None:
                raise ValueError(f"vlm_sft: BAGEL's SftJSONLIterableDataset requires a frame sampler: add "
                                 f"`frame_sampler_args: {{max_num_frames: 12, min_num_frames: 8}}`, {fix}")  # fmt: skip
            for name in group.dataset_names:
                info = self.dataset_info[kind][name]
                if kind == "t2i_pretrain" and info.parquet_info_path is not None:
                    raise ValueError(f"dataset_info[t2i_pretrain][{name}]: BAGEL's T2IIterableDataset takes no "
                                     f"`parquet_info` (it lists the files): remove `parquet_info_path`, {fix}")  # fmt: skip
                if kind == "unified_edit" and info.parquet_info_path is None:
                    raise ValueError(f"dataset_info[unified_edit][{name}]: BAGEL's edit dataset requires "
                                     f"`parquet_info_path` (its row groups per file): add it, {fix}")  # fmt: skip

    def infos(self, kind: str) -> list[DatasetInfo]:
        return [self.dataset_info[kind][name] for name in self.groups[kind].dataset_names]


def _resolve(value: str | None, base: Path) -> str | None:
    if not isinstance(value, str) or "://" in value:  # None, a URL, or a wrong type the model reports
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def _resolve_data_paths(info_tree: Any, base: Path) -> None:
    """Resolve the dataset_info entries' relative paths against `base`, in place; a malformed tree is left as it is
    for the model to report."""
    for entries in info_tree.values() if isinstance(info_tree, dict) else ():
        for entry in entries.values() if isinstance(entries, dict) else ():
            for key in ("data_dir", "parquet_info_path", "jsonl_path"):
                if isinstance(entry, dict) and key in entry:
                    entry[key] = _resolve(entry[key], base)


def _load_tree(path: Path) -> dict[str, Any]:
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"cannot read the BAGEL data config {path}: {error}") from error
    if not isinstance(tree, dict):
        raise ValueError(f"{path}: a BAGEL data config is a mapping of dataset types to groups")
    return tree


def load_mixture(path: str | Path, dataset_info: str | Path | None = None, target: str | None = None) -> Mixture:
    """The mixture in `path`; `dataset_info` (a YAML/JSON file) overrides the config's own `dataset_info` key and
    `target` its `target` key."""
    path = Path(path).expanduser().resolve()
    tree = _load_tree(path)
    info_tree, info_base = tree.get("dataset_info") or {}, path.parent
    if dataset_info is not None or isinstance(info_tree, str):
        info_path = Path(dataset_info) if dataset_info is not None else path.parent / info_tree
        info_tree, info_base = _load_tree(info_path.expanduser().resolve()), info_path.expanduser().resolve().parent
    _resolve_data_paths(info_tree, info_base)
    unknown = [k for k in tree if k not in (*DATASET_TYPES, *RESERVED_KEYS)]
    if unknown:  # a typo of a reserved key would otherwise read as a group of an unknown dataset type
        allowed = [*DATASET_TYPES, *RESERVED_KEYS]
        raise BagelConfigError(str(path), [RecipeIssue(k, tree[k], unknown_key_message(k, allowed)) for k in unknown])
    groups = {k: v for k, v in tree.items() if k not in RESERVED_KEYS}
    settings = {k: tree[k] for k in ("packing", "seed", "target") if k in tree}
    if target is not None:
        settings["target"] = target
    try:
        return Mixture(
            groups=groups, dataset_info=info_tree, tokenizer=_resolve(tree.get("tokenizer"), path.parent), **settings
        )
    except ValidationError as error:
        issues = [_key_in_file(issue) for issue in validation_issues(error, Mixture)]
        raise BagelConfigError(str(path), issues) from None


def _key_in_file(issue: RecipeIssue) -> RecipeIssue:
    """`groups.t2i_pretrain.weight` is `t2i_pretrain.weight` in the YAML: its groups are top-level keys."""
    return dataclasses.replace(issue, path=issue.path.removeprefix("groups."))
