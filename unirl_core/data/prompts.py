"""Prompt files and the per-prompt schema (UniRL's data contract, `shared/seeds/unirl-data-preparation.txt`).

Readers by extension: `.txt` (one prompt per non-empty line), `.jsonl` (one JSON object per non-empty line),
`.json` (a list of strings or objects, or a dict with a `prompts` list, a `caption`, or the prompt key).
Each record normalizes to a `PromptExample`. Unlike UniRL, which logs and skips a bad row, every problem here is
an error naming the file and the line (or item index): a prompt file is small and hand-written, and a silently
shorter dataset changes the batch arithmetic of a whole training run.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from unirl_core.errors import UserError
from unirl_core.io import storage

logger = logging.getLogger(__name__)

SUPPORTED_EXTENSIONS = (".txt", ".jsonl", ".json")
PASS_THROUGH_SCHEMES = ("http://", "https://", "s3://", "gs://")
RESERVED_KEYS = {"prompt", "caption", "media", "media_refs", "metadata", "prompt_id"}
MEDIA_REF_FIELDS = ("modality", "role", "uri")
SUPPORTED_MEDIA = ("image", "condition")  # (modality, role): exactly one such ref per prompt, or none

LEGACY_EMBEDDING_FIELDS = {
    "prompt_embed_path",
    "prompt_embeds_path",
    "pooled_embed_path",
    "pooled_prompt_embeds_path",
    "prompt_embeds",
    "pooled_prompt_embeds",
    "negative_prompt_embeds",
    "negative_pooled_prompt_embeds",
    "prompt_attention_mask",
    "negative_prompt_attention_mask",
    "text_ids",
    "text_ids_path",
}
_LEGACY_PATTERN = re.compile(r"_embeds(_path)?$|_embed_path$")  # diffusers' naming: prompt_embeds, t5_embeds ...

# Row fields that would set sampling: they belong to the recipe (train.sampling.<field>), never to a row.
SAMPLING_FIELDS = {"negative_prompt", "seed", "guidance_scale", "height", "width", "num_inference_steps"}


class PromptDataError(UserError, ValueError):
    """A prompt file that cannot be used; the message names the file and the line or item."""


class UnsupportedMediaError(PromptDataError, NotImplementedError):
    """A media reference the rollout cannot consume yet (anything but one image condition per prompt)."""


@dataclass(frozen=True)
class MediaRef:
    modality: str  # image | video | audio ...
    role: str  # condition | target ...
    uri: str  # resolved: absolute path or URL


@dataclass(frozen=True)
class PromptExample:
    prompt: str
    prompt_id: str
    metadata: dict[str, Any] = field(default_factory=dict)
    media_refs: tuple[MediaRef, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "prompt_id": self.prompt_id,
            "metadata": self.metadata,
            "media_refs": [vars(ref) for ref in self.media_refs],
        }


REPORTED = 20  # bad records listed in one error (the count is always whole)


def load_prompts(path: str, prompt_key: str = "prompt") -> list[PromptExample]:
    """Read and normalize every prompt of a `.txt`, `.jsonl` or `.json` file (local path or fsspec URL)."""
    path = str(path)
    suffix = next((ext for ext in SUPPORTED_EXTENSIONS if path.lower().endswith(ext)), None)
    if suffix is None:
        raise PromptDataError(
            f"{path}: unsupported prompt file extension; use one of {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    try:
        text = storage.read_text(path, encoding="utf-8-sig")  # a byte-order mark is not part of the first prompt
    except FileNotFoundError:
        raise PromptDataError(f"{path}: no such prompt file") from None
    except (IsADirectoryError, PermissionError) as exc:
        raise PromptDataError(f"{path}: cannot read the prompt file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise PromptDataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:  # fsspec: an unknown protocol such as nosuch://
        raise PromptDataError(f"{path}: cannot open ({exc})") from None
    records = {".txt": _txt_records, ".jsonl": _jsonl_records, ".json": _json_records}[suffix]
    normalizer = _Normalizer(path, prompt_key)
    examples, bad = [], []
    for index, (where, raw) in enumerate(records(path, text, prompt_key)):
        try:
            examples.append(normalizer(raw, index, where))
        except PromptDataError as exc:
            bad.append(exc)
    if len(bad) == 1:
        raise bad[0]
    if bad:  # every bad record in one report, so one edit fixes the file
        listed = "\n  ".join(map(str, bad[:REPORTED]))
        more = f"\n  ... and {len(bad) - REPORTED} more" if len(bad) > REPORTED else ""
        kinds = {type(exc) for exc in bad}
        raise (kinds.pop() if len(kinds) == 1 else PromptDataError)(
            f"{path}: {len(bad)} bad records:\n  {listed}{more}"
        )
    if not examples:
        raise PromptDataError(f"{path}: no prompts found")
    normalizer.warn_ignored()
    _refuse_duplicate_ids(path, examples)
    return examples


def _refuse_duplicate_ids(path: str, examples: list[PromptExample]) -> None:
    first_index: dict[str, int] = {}
    for index, example in enumerate(examples):
        if example.prompt_id in first_index:
            raise PromptDataError(
                f"{path}: prompt_id {example.prompt_id!r} is used by records {first_index[example.prompt_id]} and "
                f"{index} (0-based); prompt ids must be unique (they name samples, rewards and eval images)"
            )
        first_index[example.prompt_id] = index


def _txt_records(path: str, text: str, prompt_key: str) -> Iterator[tuple[str, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield f"line {number}", {"prompt": line.strip()}


def _jsonl_records(path: str, text: str, prompt_key: str) -> Iterator[tuple[str, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            record = _NotJSON(f"not valid JSON ({exc.msg} at column {exc.colno})")
        yield f"line {number}", record


class _NotJSON(str):
    """A JSONL line that does not parse: reported with the file's other bad records."""


def _json_records(path: str, text: str, prompt_key: str) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PromptDataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if isinstance(data, dict) and "prompts" in data:
        if not isinstance(data["prompts"], list):
            raise PromptDataError(f"{path}: 'prompts' must be a list, got {type(data['prompts']).__name__}")
        data, label = data["prompts"], "prompts"
    elif isinstance(data, dict) and isinstance(data.get(prompt_key), list):
        data, label = data[prompt_key], prompt_key
    elif isinstance(data, dict) and (prompt_key in data or "caption" in data):
        data, label = [data], "item"
    elif isinstance(data, list):
        label = "item"
    else:
        raise PromptDataError(
            f"{path}: expected a list of prompts or objects, or an object with a 'prompts' list, "
            f"a 'caption' or a '{prompt_key}' key; got {type(data).__name__}"
            + (f" with keys {sorted(data)}" if isinstance(data, dict) else "")
        )
    for index, item in enumerate(data):
        yield (f"{label}[{index}]" if label != "item" else f"item {index}"), item


class _Normalizer:
    """Turns one raw record into a PromptExample, or raises an error naming file and line/item."""

    def __init__(self, path: str, prompt_key: str):
        self.path = path
        self.prompt_key = prompt_key
        self.base_dir = storage.parent(path)
        self.file_name = storage.basename(path)
        self.ignored: dict[str, int] = {}

    def __call__(self, raw: Any, index: int, where: str) -> PromptExample:
        def fail(message: str, error: type[PromptDataError] = PromptDataError) -> None:
            raise error(f"{self.path}, {where}: {message}")

        if isinstance(raw, _NotJSON):
            fail(str(raw))
        if isinstance(raw, str):
            raw = {"prompt": raw}
        if not isinstance(raw, dict):
            fail(f"expected a JSON object or a string, got {type(raw).__name__}")
        record = dict(raw)
        if self.prompt_key != "prompt" and self.prompt_key in record:
            if "prompt" in record:
                fail(f"both 'prompt' and the prompt key '{self.prompt_key}' are set; keep one")
            record["prompt"] = record.pop(self.prompt_key)
        self._refuse_forbidden_fields(record, fail)

        prompt = record.get("prompt", record.get("caption"))
        if not isinstance(prompt, str) or not prompt.strip():
            fail(f"needs a non-empty 'prompt' (or 'caption') string, got {prompt!r}")
        metadata = self._metadata(record, fail)
        media = self._media_refs(record, fail)
        prompt_id = record.get("prompt_id")
        if prompt_id is None:
            prompt_id = f"{self.file_name}:{index}"
        elif isinstance(prompt_id, bool) or not isinstance(prompt_id, str | int) or not str(prompt_id).strip():
            fail(f"'prompt_id' must be a non-empty string or an integer, got {prompt_id!r}")
        return PromptExample(prompt=prompt, prompt_id=str(prompt_id), metadata=metadata, media_refs=media)

    def _refuse_forbidden_fields(self, record: dict, fail) -> None:
        legacy = sorted(k for k in record if k in LEGACY_EMBEDDING_FIELDS or _LEGACY_PATTERN.search(k))
        if legacy:
            fail(
                f"legacy precomputed-embedding field(s) {legacy} are not accepted: embeddings are computed at "
                "runtime by the model's text encoders (or served from the precache text-embedding cache). "
                "Remove these fields from the prompt file."
            )
        sampling = sorted(k for k in record if k in SAMPLING_FIELDS)
        if sampling:
            targets = ", ".join(f"train.sampling.{k}" for k in sampling)
            fail(
                f"row field(s) {sampling} try to set sampling, which rows never do: remove them from the file "
                f"and set {targets} in the recipe (the same for every sample)"
            )

    def _metadata(self, record: dict, fail) -> dict[str, Any]:
        extra = {k: v for k, v in record.items() if k not in RESERVED_KEYS}
        metadata = record.get("metadata")
        if metadata is None:
            return extra
        if not isinstance(metadata, dict):
            fail(f"'metadata' must be an object when given, got {type(metadata).__name__}")
        for key in extra:  # an explicit metadata dict is used as is: extra top-level keys are dropped
            self.ignored[key] = self.ignored.get(key, 0) + 1
        return dict(metadata)

    def _media_refs(self, record: dict, fail) -> tuple[MediaRef, ...]:
        if "media" in record and "media_refs" in record:
            fail("both 'media' and 'media_refs' are set; use one list")
        key = "media_refs" if "media_refs" in record else "media"
        raw = record.get(key)
        if raw is None:
            return ()
        if not isinstance(raw, list):
            fail(f"'{key}' must be a list of {{modality, role, uri}} objects, got {type(raw).__name__}")
        refs = tuple(self._media_ref(item, f"{key}[{i}]", fail) for i, item in enumerate(raw))
        for i, ref in enumerate(refs):
            if (ref.modality, ref.role) != SUPPORTED_MEDIA:
                fail(
                    f"{key}[{i}] is (modality={ref.modality!r}, role={ref.role!r}); only one "
                    "(modality='image', role='condition') ref per prompt is implemented",
                    UnsupportedMediaError,
                )
        if len(refs) > 1:
            fail(
                f"{len(refs)} image condition refs; exactly one (modality='image', role='condition') ref per "
                "prompt is implemented",
                UnsupportedMediaError,
            )
        return refs

    def _media_ref(self, item: Any, label: str, fail) -> MediaRef:
        if not isinstance(item, dict):
            fail(f"{label} must be an object with {list(MEDIA_REF_FIELDS)}, got {type(item).__name__}")
        extra = sorted(set(item) - set(MEDIA_REF_FIELDS))
        missing = [f for f in MEDIA_REF_FIELDS if not isinstance(item.get(f), str) or not item[f].strip()]
        if extra or missing:
            fail(
                f"{label} takes exactly {list(MEDIA_REF_FIELDS)} (non-empty strings); missing {missing}, extra {extra}"
            )
        uri = item["uri"].strip()
        return MediaRef(item["modality"].strip().lower(), item["role"].strip().lower(), self._resolve(uri, label, fail))

    def _resolve(self, uri: str, label: str, fail) -> str:
        if uri.startswith(PASS_THROUGH_SCHEMES) or uri.startswith("/"):
            return uri
        if "://" in uri:
            fail(
                f"{label}.uri {uri!r} has an unsupported scheme; use a path relative to the prompt file, an "
                f"absolute path, or one of {', '.join(PASS_THROUGH_SCHEMES)}"
            )
        return storage.join(self.base_dir, uri)

    def warn_ignored(self) -> None:
        if self.ignored:
            logger.warning(
                "%s: rows with an explicit 'metadata' object also have top-level keys %s; they are ignored "
                "(put them inside 'metadata')",
                self.path,
                sorted(self.ignored),
            )
