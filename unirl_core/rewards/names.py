"""The built-in reward names, for validating a recipe without building any scorer (config imports this leaf, not
the registry, so config and rewards never import each other in a circle)."""

from __future__ import annotations

from unirl_core.rewards.functions import REWARDS
from unirl_core.rewards.text import TEXT_REWARDS
from unirl_core.rewards.video import VIDEO_MODEL_REWARDS, VIDEO_REWARDS

MODEL_REWARDS = {
    "clip_score": "clip",
    "aesthetic": "aesthetic",
    "pickscore": "pickscore",
    "hpsv2": "hpsv2",
    "ocr": "ocr",
    "imagereward": "imagereward",
    "geneval": "geneval",
    "vlm_judge": "vlm_judge",
    "llm_judge": "llm_judge",
    **VIDEO_MODEL_REWARDS,
}  # reward name -> its RewardConfig section
TEXT_MODEL_REWARDS = {"llm_judge"}  # model rewards of text outputs
METADATA_REWARDS = {"geneval"}  # scored with each prompt record's `metadata` (its checks)


def is_plugin(name: str) -> bool:
    """A reward named by `package.module:function`: a function (outputs, prompts) -> one float per output."""
    return ":" in name


def plugin_reward(name: str):
    """The function a `package.module:function` reward name names (ValueError when it cannot be imported)."""
    from unirl_core.plugins import load_object

    function = load_object(name, f"reward {name!r}", ValueError)
    if not callable(function):
        raise ValueError(f"reward {name!r} is not a function (outputs, prompts) -> scores")
    return function


def builtin_names() -> set[str]:
    """Names that need no `remote` entry: the weight-free rewards (of images, text and videos) and the model
    rewards."""
    return set(REWARDS) | set(TEXT_REWARDS) | set(VIDEO_REWARDS) | set(MODEL_REWARDS)


def modality(name: str) -> str:
    """What a reward scores: `image` (the weight-free image rewards and the model rewards; on videos frame by frame),
    `text` (text.py's and `llm_judge`), `video` (video.py's), or `any` (remote scorers and `package.module:function`
    rewards: their authors decide)."""
    if name in TEXT_REWARDS or name in TEXT_MODEL_REWARDS:
        return "text"
    if name in VIDEO_REWARDS or name in VIDEO_MODEL_REWARDS:
        return "video"
    return "image" if name in REWARDS or name in MODEL_REWARDS else "any"
