"""`geneval`: GenEval's compositional checks (objects, counts, colours, relative positions) as a reward, with an
open-vocabulary detector (OWLv2 or OWL-ViT) in place of GenEval's Mask2Former and a CLIP for colours.

Each image comes with its prompt's GenEval record (GenEval's `prompts/evaluation_metadata.jsonl` line):

    {"tag": "position", "include": [{"class": "dog", "count": 1},
                                    {"class": "cat", "count": 1, "position": ["left of", 0]}],
     "exclude": [{"class": "cat", "count": 2}]}

`include` clauses must all hold, `exclude` clauses say "fewer than `count`"; `position` names an earlier clause by
index; `color` is one of GenEval's ten `COLORS`. The rules follow flow_grpo's GenEval reward (yifan123/reward-server
`reward_server/gen_eval.py` @7131478, `evaluate_reward`), itself GenEval's `evaluate_images.py` (djghosh13/geneval
@16f1681) made exact for training:

| check         | met when                                                    | credit (the `fractional` score) |
|---------------|-------------------------------------------------------------|---------------------------------|
| count         | exactly `count` boxes of the class (GenEval: at least)      | 1 - abs(count - found) / count  |
| colour        | count met and all `count` boxes classified `color`          | share of boxes of that colour   |
| position      | count (and colour) met, the target clause fully met, and    | 1 or 0                          |
|               | every box relates to every target box by `relative_position`|                                 |
| exclude       | fewer than `count` boxes of the class                       | none: strict only               |

`strict` is 1.0 when every check is met, else 0.0. `fractional` is the mean credit, the score flow_grpo trains on
(its `multi_score` sums `scores`, reward-server's `score`, not `strict_rewards`); it is at most 1 and goes negative
when many extra boxes are found (3 cats for "a photo of a cat": 1 - 2/1 = -1), as there.

Detection, as GenEval's `evaluate_image`: boxes scoring above `threshold`, per class sorted by score, the first
`MAX_OBJECTS` (16) kept. Colour, as GenEval's `color_classification`: CLIP zero-shot over `COLORS`, each colour's
text embedding the renormalized mean of `COLOR_TEMPLATES` (clip_benchmark's `zero_shot_classifier`).

Differences from GenEval and reward-server, on purpose:
- Detector: OWL queried with "a photo of a {class}" for the classes the record names only (Mask2Former classifies
  every box over 80 COCO classes); each box takes its best query. OWL predicts one box per image patch, so boxes of
  one class overlapping by IoU >= `NMS_IOU` are suppressed (GenEval: no NMS). One `threshold` for every tag
  (GenEval: 0.3, and 0.9 for `counting` records, both calibrated for Mask2Former's scores; OWLv2's run lower, and
  its model card thresholds at 0.1: tune `threshold` on a few labelled images of your generator).
- Colour crops are the detector's box of the original image (GenEval: the instance mask over grey #999, then the box).
- A failed position check is one 0 credit (reward-server appends 0.0 and then 1.0 for it: 0.75 for a right-count
  wrong-position image where this gives 2/3); a clause whose count fails gets a 0 for each of its colour and
  position checks (reward-server: one 0 in all); `exclude` clauses count for `strict` (reward-server ignores them;
  on GenEval's own records, whose only excludes are "count + 1" of an exactly counted class, nothing changes).
- A missing or malformed record is an error naming the sample, never a silent 0.

The detector is loaded with `from_pretrained(folder)` (offline: a folder, never a hub name), cached per (folder,
device) like CLIP (`clip.load_clip`, shared with `clip_score` on the same folder).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from unirl_core.rewards.clip import in_batches, load_clip
from unirl_core.rewards.errors import RewardError

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")  # GenEval's
COLOR_TEMPLATES = (
    "a photo of a {color} {object}",
    "a photo of a {color}-colored {object}",
    "a photo of a {color} object",
)
QUERY_TEMPLATE = "a photo of a {object}"
RELATIONS = ("left of", "right of", "above", "below")
POSITION_THRESHOLD = 0.1  # GenEval's c: centre offsets shrink by c x (sum of the two boxes' sizes) per axis
MAX_OBJECTS = 16  # per class, the most confident
NMS_IOU = 0.5  # per class; ours (GenEval keeps every Mask2Former box; OWL predicts one box per image patch)
SCORINGS = ("fractional", "strict")
DETECTOR_TYPES = ("owlv2", "owlvit")
RECORD_EXAMPLE = (
    '{"tag": "position", "include": [{"class": "dog", "count": 1}, '
    '{"class": "cat", "count": 1, "position": ["left of", 0]}]} '
    '(a line of GenEval\'s prompts/evaluation_metadata.jsonl; optional: "color" in an include clause, '
    '"exclude": [{"class": ..., "count": ...}])'
)

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels, y down


@dataclass(frozen=True)
class Detection:
    """One detected object: its class (the record's name), detector score, box and, when asked, CLIP colour."""

    label: str
    score: float
    box: Box
    colour: str | None = None


@dataclass(frozen=True)
class Check:
    """One requirement of a record: `met` (for `strict`) and flow_grpo's partial `credit` (None: strict only)."""

    requirement: str  # "2 x cat", "cat is red", "cat left of dog", "fewer than 3 x cat"
    met: bool
    credit: float | None


# ----------------------------------------------------------------------------------------------- records


def record_problem(record: Any) -> str | None:
    """What is wrong with a GenEval record, or None when it can be scored."""
    if not isinstance(record, Mapping):
        return f"is a {type(record).__name__}, not an object"
    include, exclude = record.get("include"), record.get("exclude", [])
    if not isinstance(include, list) or not include:
        return f"has no non-empty 'include' list (keys: {sorted(record)})"
    if not isinstance(exclude, list):
        return f"'exclude' is a {type(exclude).__name__}, not a list"
    for index, clause in enumerate(include):
        problem = _clause_problem(clause, {"class", "count", "color", "position"}) or _attribute_problem(clause, index)
        if problem:
            return f"include[{index}] {problem}"
    for index, clause in enumerate(exclude):
        problem = _clause_problem(clause, {"class", "count"})
        if problem:
            return f"exclude[{index}] {problem}"
    return None


def _clause_problem(clause: Any, allowed: set[str]) -> str | None:
    if not isinstance(clause, Mapping):
        return f"is a {type(clause).__name__}, not an object"
    if set(clause) - allowed:
        return f"has unknown key(s) {sorted(set(clause) - allowed)}; allowed: {sorted(allowed)}"
    if not isinstance(clause.get("class"), str) or not clause["class"].strip():
        return f"needs a 'class' name, got {clause.get('class')!r}"
    count = clause.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return f"needs an integer 'count' >= 1, got {count!r}"
    return None


def _attribute_problem(clause: Mapping, index: int) -> str | None:
    if "color" in clause and clause["color"] not in COLORS:
        return f"has color {clause['color']!r}; GenEval's colours: {list(COLORS)}"
    position = clause.get("position")
    if position is None:
        return None
    if not isinstance(position, list | tuple) or len(position) != 2 or position[0] not in RELATIONS:
        return f"has position {position!r}; expected [relation in {list(RELATIONS)}, index of an earlier clause]"
    target = position[1]
    if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < index:
        return f"has position target {target!r}: it must index an earlier include clause (0..{index - 1})"
    return None


def query_classes(record: Mapping) -> list[str]:
    """The classes a record names (include, then exclude), each once: the detector's queries for its image."""
    return list(dict.fromkeys(clause["class"] for clause in [*record["include"], *record.get("exclude", [])]))


# ----------------------------------------------------------------------------------------------- rules


def relative_position(box_a: Box, box_b: Box, threshold: float = POSITION_THRESHOLD) -> set[str]:
    """Where A is relative to B (GenEval's `relative_position`): the centre offset, shrunk per axis by `threshold` x
    the sum of both boxes' sizes, divided by the unshrunk offset's length; a component beyond +-0.5 is a relation."""
    boxes = np.array([box_a, box_b], dtype=np.float64).reshape(2, 2, 2)  # [box, corner, xy]
    center_a, center_b = boxes.mean(axis=1)
    size_a, size_b = np.abs(boxes[:, 1] - boxes[:, 0])
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - threshold * (size_a + size_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    relations = {"left of": dx < -0.5, "right of": dx > 0.5, "above": dy < -0.5, "below": dy > 0.5}
    return {name for name, holds in relations.items() if holds}


def box_iou(box_a: Box, box_b: Box) -> float:
    width = max(min(box_a[2], box_b[2]) - max(box_a[0], box_b[0]), 0.0)
    height = max(min(box_a[3], box_b[3]) - max(box_a[1], box_b[1]), 0.0)
    area = lambda box: max(box[2] - box[0], 0.0) * max(box[3] - box[1], 0.0)  # noqa: E731
    union = area(box_a) + area(box_b) - width * height
    return width * height / union if union > 0 else 0.0


def select_objects(
    detections: Sequence[Detection], max_objects: int = MAX_OBJECTS, nms_iou: float = NMS_IOU
) -> list[Detection]:
    """Per class: by score, highest first, the first `max_objects`, then greedy NMS at IoU `nms_iou`."""
    kept = []
    for label in dict.fromkeys(d.label for d in detections):
        ordered = sorted((d for d in detections if d.label == label), key=lambda d: -d.score)[:max_objects]
        while ordered:
            best = ordered.pop(0)
            kept.append(best)
            ordered = [d for d in ordered if box_iou(best.box, d.box) < nms_iou]
    return kept


def check_record(detections: Sequence[Detection], record: Mapping) -> list[Check]:
    """Every check of `record` on one image's objects (already thresholded and selected), in clause order."""
    by_class: dict[str, list[Detection]] = {}
    for detection in sorted(detections, key=lambda d: -d.score):
        by_class.setdefault(detection.label, []).append(detection)
    checks: list[Check] = []
    groups: list[list[Detection] | None] = []  # per include clause: its boxes when all its checks are met
    for clause in record["include"]:
        name, count = clause["class"], clause["count"]
        found = by_class.get(name, [])
        clause_checks = [Check(f"{count} x {name}", len(found) == count, 1 - abs(count - len(found)) / count)]
        if "color" in clause:
            clause_checks.append(_colour_check(clause, found, all(c.met for c in clause_checks)))
        if "position" in clause:
            relation, target = clause["position"]
            ready = all(c.met for c in clause_checks) and groups[target] is not None
            met = ready and all(relation in relative_position(o.box, t.box) for o in found for t in groups[target])
            target_name = record["include"][target]["class"]
            clause_checks.append(Check(f"{name} {relation} {target_name}", met, float(met)))
        groups.append(found if all(c.met for c in clause_checks) else None)
        checks += clause_checks
    for clause in record.get("exclude", []):
        found = by_class.get(clause["class"], [])
        checks.append(Check(f"fewer than {clause['count']} x {clause['class']}", len(found) < clause["count"], None))
    return checks


def _colour_check(clause: Mapping, found: Sequence[Detection], counted: bool) -> Check:
    name, count, colour = clause["class"], clause["count"], clause["color"]
    if not counted:
        return Check(f"{name} is {colour}", False, 0.0)
    matching = sum(d.colour == colour for d in found)
    return Check(f"{name} is {colour}", matching == count, 1 - abs(count - matching) / count)


def strict_score(checks: Sequence[Check]) -> float:
    return float(all(c.met for c in checks))


def fractional_score(checks: Sequence[Check]) -> float:
    credits = [c.credit for c in checks if c.credit is not None]
    assert credits, "a valid record has at least one include clause"
    return float(np.mean(credits))


# ----------------------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class LoadedDetector:
    """An OWLv2/OWL-ViT detector and its processor on one device."""

    model: Any  # transformers.Owlv2ForObjectDetection or OwlViTForObjectDetection, eval mode
    processor: Any  # its Owlv2Processor/OwlViTProcessor: .tokenizer and .image_processor
    device: torch.device

    @torch.inference_mode()
    def detect(
        self, images: Sequence[Image.Image], classes: Sequence[Sequence[str]], threshold: float
    ) -> list[list[Detection]]:
        """Per image, every box whose best query among its own `classes` scores above `threshold`: what
        `image_processor.post_process_object_detection` gives, labelled with the class names."""
        rgb = [image.convert("RGB") for image in images]
        pixels = self.processor.image_processor(images=rgb, return_tensors="pt")["pixel_values"]
        input_ids, attention_mask = self._query_tokens(classes)
        outputs = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            pixel_values=pixels.to(self.device, self.model.dtype),
        )
        sizes = [(image.height, image.width) for image in rgb]
        results = self.processor.image_processor.post_process_object_detection(
            outputs, threshold=threshold, target_sizes=sizes
        )
        return [
            [
                Detection(names[label], float(score), tuple(float(v) for v in box))
                for score, label, box in zip(result["scores"], result["labels"].tolist(), result["boxes"], strict=True)
            ]
            for result, names in zip(results, classes, strict=True)
        ]

    def _query_tokens(self, classes: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """[B x Q, L] token ids, Q the most classes of any image. An image with fewer classes gets all-zero rows,
        which OWL masks out (`query_mask = input_ids[..., 0] > 0`); so no image's boxes depend on its batch-mates."""
        length = self.model.config.text_config.max_position_embeddings
        num_queries = max(len(names) for names in classes)
        input_ids = torch.zeros(len(classes), num_queries, length, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        attention_mask[:, :, 0] = 1  # padding rows attend to their first token: no fully masked row
        for index, names in enumerate(classes):
            tokens = self.processor.tokenizer(
                [QUERY_TEMPLATE.format(object=name) for name in names],
                padding="max_length",
                truncation=True,
                max_length=length,
                return_tensors="pt",
            )
            input_ids[index, : len(names)] = tokens["input_ids"]
            attention_mask[index, : len(names)] = tokens["attention_mask"]
        return input_ids.flatten(0, 1), attention_mask.flatten(0, 1)


def load_detector(path: str | Path, device: str | torch.device = "cpu") -> LoadedDetector:
    """The OWLv2/OWL-ViT detector in folder `path` on `device`, loaded on the first call and shared by later ones."""
    folder = Path(path).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"detector folder {str(path)!r} has no config.json: give a local folder written by "
            "Owlv2ForObjectDetection.save_pretrained with its processor (tokenizer + image processor), e.g. a copy of "
            "google/owlv2-base-patch16-ensemble (or google/owlvit-base-patch32); nothing is downloaded"
        )
    if not any((folder / name).is_file() for name in ("processor_config.json", "preprocessor_config.json")):
        raise FileNotFoundError(
            f"detector folder {str(path)!r} has no (pre)processor_config.json: save the Owlv2Processor there too "
            "(a full copy of google/owlv2-base-patch16-ensemble has it); nothing is downloaded"
        )
    model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    if model_type not in DETECTOR_TYPES:
        raise ValueError(
            f"detector folder {str(path)!r} holds a {model_type!r} model; geneval needs an open-vocabulary detector "
            f"of type {list(DETECTOR_TYPES)}, e.g. google/owlv2-base-patch16-ensemble"
        )
    return _load_detector(str(folder), str(torch.device(device)))


@functools.cache
def _load_detector(folder: str, device: str) -> LoadedDetector:
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    model = AutoModelForZeroShotObjectDetection.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    return LoadedDetector(model.to(device).eval().requires_grad_(False), processor, torch.device(device))


def crop_box(image: Image.Image, box: Box) -> Image.Image:
    """The box's pixels (rounded as PIL's crop rounds), clamped to the image and at least 1 x 1."""
    x0, y0, x1, y1 = (round(v) for v in box)
    x0, y0 = min(max(x0, 0), image.width - 1), min(max(y0, 0), image.height - 1)
    x1, y1 = min(max(x1, x0 + 1), image.width), min(max(y1, y0 + 1), image.height)
    return image.convert("RGB").crop((x0, y0, x1, y1))


class GenEvalScore:
    """The `geneval` reward: GenEval's checks of each image against its prompt's record, `fractional` (mean credit,
    flow_grpo's training reward) or `strict` (1.0 when every check holds)."""

    wants_metadata = True  # the reward service passes each prompt record's `metadata` (its GenEval record)

    def __init__(
        self,
        detector_path: str | Path,
        clip_path: str | Path,
        device: str | torch.device = "cpu",
        batch_size: int = 8,
        threshold: float = 0.3,
        scoring: str = "fractional",
    ):
        if scoring not in SCORINGS:
            raise ValueError(f"geneval scoring {scoring!r} is not one of {list(SCORINGS)}")
        self.detector = load_detector(detector_path, device)
        self.clip = load_clip(clip_path, device)
        self.batch_size, self.threshold, self.scoring = batch_size, threshold, scoring
        self._colour_classifiers: dict[str, torch.Tensor] = {}

    def __call__(
        self,
        images: Sequence[Image.Image],
        prompts: Sequence[str],
        sample_ids: Sequence[str] = (),
        metadata: Sequence[Mapping] | None = None,
    ) -> np.ndarray:
        if len(prompts) != len(images):
            raise ValueError(f"geneval needs one prompt per image; got {len(prompts)} for {len(images)} images")
        score = strict_score if self.scoring == "strict" else fractional_score
        return np.array([score(checks) for checks in self.evaluate(images, metadata, sample_ids)], dtype=np.float64)

    def evaluate(
        self, images: Sequence[Image.Image], metadata: Sequence[Mapping] | None, sample_ids: Sequence[str] = ()
    ) -> list[list[Check]]:
        """Per image, the checks of its record: what the score is made of (for logs and debugging)."""
        records = self._records(metadata, len(images), sample_ids)
        classes = [query_classes(record) for record in records]
        found: list[list[Detection]] = []
        for start in range(0, len(images), self.batch_size):
            stop = start + self.batch_size
            found += self.detector.detect(images[start:stop], classes[start:stop], self.threshold)
        objects = self._with_colours(images, [select_objects(f) for f in found], records)
        return [check_record(o, record) for o, record in zip(objects, records, strict=True)]

    @staticmethod
    def _records(metadata: Sequence[Mapping] | None, num_images: int, sample_ids: Sequence[str]) -> list[Mapping]:
        names = list(sample_ids) or [f"#{i}" for i in range(num_images)]
        if metadata is None or len(metadata) != num_images:
            got = "none" if metadata is None else f"{len(metadata)} records"
            raise RewardError(
                f"geneval needs one GenEval record per image (the prompt records' 'metadata'); got {got} for "
                f"{num_images} images (samples {names[:4]}{' ...' if num_images > 4 else ''}); expected e.g. "
                + RECORD_EXAMPLE
            )
        for name, record in zip(names, metadata, strict=True):
            problem = record_problem(record)
            if problem:
                raise RewardError(
                    f"geneval: sample {name!r}: its prompt's metadata {problem}; expected a GenEval record, e.g. "
                    + RECORD_EXAMPLE
                )
        return list(metadata)

    def _with_colours(
        self, images: Sequence[Image.Image], objects: list[list[Detection]], records: Sequence[Mapping]
    ) -> list[list[Detection]]:
        """`objects` with a CLIP colour on every box of a class some include clause asks a colour of."""
        wanted = [{c["class"] for c in record["include"] if "color" in c} for record in records]
        to_colour = [(i, j) for i, found in enumerate(objects) for j, d in enumerate(found) if d.label in wanted[i]]
        if not to_colour:
            return objects
        crops = [crop_box(images[i], objects[i][j].box) for i, j in to_colour]
        crop_ND = in_batches(self.clip.embed_images, crops, self.batch_size)
        coloured = [list(found) for found in objects]
        for (i, j), crop_D in zip(to_colour, crop_ND, strict=True):
            detection = objects[i][j]
            best = int((self._colour_classifier(detection.label) @ crop_D).argmax())
            coloured[i][j] = replace(detection, colour=COLORS[best])
        return coloured

    def _colour_classifier(self, name: str) -> torch.Tensor:
        """[10, D]: per colour, the renormalized mean of its templates' unit text embeddings (zero-shot weights)."""
        if name not in self._colour_classifiers:
            texts = [t.format(color=c, object=name) for c in COLORS for t in COLOR_TEMPLATES]
            text_CTD = self.clip.embed_texts(texts).reshape(len(COLORS), len(COLOR_TEMPLATES), -1)
            self._colour_classifiers[name] = torch.nn.functional.normalize(text_CTD.mean(dim=1), dim=-1)
        return self._colour_classifiers[name]
