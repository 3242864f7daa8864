"""Benchmark prompt sets made by unirl (nothing downloaded), by name: `unirl eval --prompts geneval`.

    geneval     GenEval's six tasks by its published rules (djghosh13/geneval prompts/create_prompts.py, read at
                5348fb5): every COCO class alone (single_object), then `per_task` records each of two_object,
                counting (2-4, with GenEval's "count + 1" exclude), colors, position and color_attr (no coloured
                person), deduplicated; each line a GenEval record (`tag`, `include`, `exclude`) the `geneval`
                reward reads. Drawn with our own seeded generator: the same rules, not GenEval's 553 prompts (for
                those, pass GenEval's own `evaluation_metadata.jsonl`: it loads as is).
    ocr         text rendering as flow_grpo's OCR set asks it: a scene with a short text in double quotes (what the
                `ocr` reward reads), words and scenes combined deterministically
    aesthetic   general prompts (people, animals, landscapes, objects, art styles) for aesthetic and preference
                rewards (`aesthetic`, `pickscore`, `hpsv2`, `imagereward`)

A set is written once, as JSON lines, to $UNIRL_HOME/prompt_sets/<name>.jsonl and evaluated from there (its digest
names it in an evaluation's spec like any prompt file).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

COCO_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow", "elephant",
    "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard",
    "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange", "broccoli",
    "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant", "bed", "dining table", "toilet",
    "tv", "laptop", "computer mouse", "tv remote", "computer keyboard", "cell phone", "microwave", "oven", "toaster",
    "sink", "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip
NUMBERS = {2: "two", 3: "three", 4: "four"}
OCR_WORDS = (
    "OPEN", "CLOSED", "EXIT", "CAFE", "SALE", "HELLO", "WELCOME", "STOP", "BAKERY", "LIBRARY", "GARAGE", "MARKET",
    "HOTEL", "PHARMACY", "NO PARKING", "FRESH BREAD", "GOOD LUCK", "THANK YOU", "HAPPY BIRTHDAY", "BOOK SHOP",
)  # fmt: skip
OCR_SCENES = (
    'a shop sign that says "{text}"', 'a neon sign reading "{text}"', 'a chalkboard with the words "{text}"',
    'a coffee mug printed with "{text}"', 'a street banner that reads "{text}"', 'a t-shirt with the text "{text}"',
)  # fmt: skip
AESTHETIC = (
    "a portrait of an old fisherman with a weathered face, soft window light",
    "a red fox curled up asleep in fresh snow",
    "a misty mountain lake at sunrise with a wooden pier",
    "a bowl of ripe peaches on a linen tablecloth, still life",
    "a cyberpunk street at night in the rain, neon reflections",
    "a watercolor painting of a lighthouse on a cliff",
    "a hummingbird hovering next to a purple flower, macro photo",
    "an astronaut riding a horse on the moon, digital art",
    "a cozy reading nook with a armchair, a blanket and a lamp",
    "a field of sunflowers under a stormy sky",
    "a golden retriever puppy playing with a ball in the grass",
    "an oil painting of a venetian canal at dusk",
    "a bowl of ramen with steam rising, food photography",
    "a snow leopard on a rocky ledge, telephoto",
    "a futuristic city skyline with flying cars at sunset",
    "a child blowing dandelion seeds in a meadow",
    "a japanese garden with a red bridge and koi pond",
    "a sailing ship in a storm, dramatic lighting",
    "a close-up of dew drops on a spider web",
    "a minimalist living room with large windows and plants",
    "a dragon made of origami paper",
    "a desert canyon with layered red rock at golden hour",
    "a woman in a yellow raincoat walking through an autumn forest",
    "an isometric illustration of a tiny island village",
    "a jazz band playing in a smoky club, film photo",
    "a stack of pancakes with blueberries and maple syrup",
    "the northern lights over a frozen lake",
    "a barn owl flying at twilight",
    "a steampunk pocket watch with visible gears",
    "a bustling night market with lanterns",
    "a sculpture of a hand carved from white marble",
    "a tropical beach with turquoise water and palm trees",
)  # fmt: skip
SETS = ("geneval", "ocr", "aesthetic")


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _plural(word: str) -> str:
    return f"{word}es" if word.endswith("s") else f"{word}s"  # GenEval's rule ("busses", "knifes" as there)


def geneval_records(per_task: int = 20, seed: int = 43) -> list[dict]:
    """GenEval's six tasks as records: every class alone, then `per_task` of each other task, deduplicated."""
    rng = random.Random(seed)
    colourable = [name for name in COCO_CLASSES if name != "person"]  # no "[colour] person" prompts
    colors = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
    records = [{"tag": "single_object", "include": [{"class": name, "count": 1}], "prompt": f"a photo of {_article(name)}"}
               for name in COCO_CLASSES]  # fmt: skip
    for _ in range(per_task):
        a, b = rng.sample(COCO_CLASSES, 2)
        records.append({"tag": "two_object", "include": [{"class": a, "count": 1}, {"class": b, "count": 1}],
                        "prompt": f"a photo of {_article(a)} and {_article(b)}"})  # fmt: skip
    for _ in range(per_task):
        name, count = rng.choice(COCO_CLASSES), rng.randint(2, 4)
        records.append({"tag": "counting", "include": [{"class": name, "count": count}],
                        "exclude": [{"class": name, "count": count + 1}],
                        "prompt": f"a photo of {NUMBERS[count]} {_plural(name)}"})  # fmt: skip
    for _ in range(per_task):
        name, color = rng.choice(colourable), rng.choice(colors)
        records.append({"tag": "colors", "include": [{"class": name, "count": 1, "color": color}],
                        "prompt": f"a photo of {_article(color)} {name}"})  # fmt: skip
    for _ in range(per_task):
        a, b = rng.sample(COCO_CLASSES, 2)
        relation = rng.choice(("left of", "right of", "above", "below"))
        records.append({"tag": "position", "include": [{"class": b, "count": 1},
                                                        {"class": a, "count": 1, "position": [relation, 0]}],
                        "prompt": f"a photo of {_article(a)} {relation} {_article(b)}"})  # fmt: skip
    for _ in range(per_task):
        (a, b), (ca, cb) = rng.sample(colourable, 2), rng.sample(colors, 2)
        records.append({"tag": "color_attr", "include": [{"class": a, "count": 1, "color": ca},
                                                          {"class": b, "count": 1, "color": cb}],
                        "prompt": f"a photo of {_article(ca)} {a} and {_article(cb)} {b}"})  # fmt: skip
    unique = {json.dumps(record, sort_keys=True): record for record in records}
    return list(unique.values())


def ocr_records() -> list[dict]:
    """Every word in two scenes (word i in scenes i and i + 1): 40 prompts, each quoting its text."""
    return [{"prompt": OCR_SCENES[(i + k) % len(OCR_SCENES)].format(text=word), "text": word}
            for i, word in enumerate(OCR_WORDS) for k in (0, 1)]  # fmt: skip


def records(name: str) -> list[dict]:
    return {"geneval": geneval_records, "ocr": ocr_records, "aesthetic": lambda: [{"prompt": p} for p in AESTHETIC]}[
        name
    ]()


def prompt_file(name: str) -> str:
    """The file of set `name` in the workspace (written on first use, atomically)."""
    from unirl_core.io.storage import write_bytes_atomic
    from unirl_core.workspace import workspace

    path = workspace().root / "prompt_sets" / f"{name}.jsonl"
    text = "".join(json.dumps(record) + "\n" for record in records(name))
    if not path.is_file() or path.read_text() != text:
        write_bytes_atomic(str(path), text.encode())
    return str(Path(path).resolve())


def resolve(value: str) -> str:
    """A packaged set's file when `value` names one (and no such path exists), else `value` itself."""
    return prompt_file(value) if value in SETS and not Path(value).exists() else value
