"""Weight-free rewards of text completions (the autoregressive domain), each reading its prompt record's `metadata`.

| name         | score                                                                                    | metadata  |
|--------------|------------------------------------------------------------------------------------------|-----------|
| math_verify  | 1 if the completion's answer equals `answer` mathematically (HF's math-verify), else 0   | answer    |
| exact_match  | 1 if the completion, stripped, equals `answer` (a string or a list of accepted strings)  | answer    |
| regex_match  | 1 if the completion, stripped, matches `pattern` whole (Python `re.fullmatch`), else 0   | pattern   |
| think_answer | 1 if the completion is `<think>...</think>` then `<answer>...</answer>` (DeepSeek-R1's format) | none |

A record without the key a reward reads fails the step naming the sample (a reward must never invent a score).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence

import numpy as np

from unirl_core.rewards.errors import RewardError

THINK_ANSWER = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def _field(metadata: dict, key: str, reward: str, index: int):
    if key not in metadata:
        raise RewardError(f"reward {reward}: sample {index}'s prompt record has no metadata.{key}; add it to the "
                          "prompt file's records (see docs/autoregressive.md)")  # fmt: skip
    return metadata[key]


def math_verify(outputs: Sequence[str], prompts, metadata: Sequence[dict]) -> np.ndarray:
    from math_verify import parse, verify

    # math-verify bounds its parsing with SIGALRM, which only the main thread may set: elsewhere, no bound (and
    # not its warning about that on every call)
    bound = 5 if threading.current_thread() is threading.main_thread() else None
    logging.getLogger("math_verify").setLevel(logging.ERROR if bound is None else logging.WARNING)
    scores = []
    for i, (output, record) in enumerate(zip(outputs, metadata, strict=True)):
        gold = parse(str(_field(record, "answer", "math_verify", i)), parsing_timeout=bound)
        answer = parse(output, parsing_timeout=bound)
        scores.append(float(bool(gold) and bool(answer) and verify(gold, answer, timeout_seconds=bound)))
    return np.array(scores)


def exact_match(outputs: Sequence[str], prompts, metadata: Sequence[dict]) -> np.ndarray:
    scores = []
    for i, (output, record) in enumerate(zip(outputs, metadata, strict=True)):
        accepted = _field(record, "answer", "exact_match", i)
        accepted = [accepted] if isinstance(accepted, str | int | float) else accepted
        scores.append(float(output.strip() in {str(a).strip() for a in accepted}))
    return np.array(scores)


def regex_match(outputs: Sequence[str], prompts, metadata: Sequence[dict]) -> np.ndarray:
    return np.array([float(re.fullmatch(_field(record, "pattern", "regex_match", i), output.strip()) is not None)
                     for i, (output, record) in enumerate(zip(outputs, metadata, strict=True))])  # fmt: skip


def think_answer(outputs: Sequence[str], prompts, metadata: Sequence[dict]) -> np.ndarray:
    return np.array([float(THINK_ANSWER.fullmatch(output.strip()) is not None) for output in outputs])


TEXT_REWARDS = {"math_verify": math_verify, "exact_match": exact_match, "regex_match": regex_match,
                "think_answer": think_answer}  # fmt: skip

DESCRIPTIONS = {
    "math_verify": (
        "1 if the answer equals metadata.answer mathematically (math-verify), else 0",
        "text; metadata.answer",
    ),
    "exact_match": ("1 if the stripped completion equals metadata.answer (or one of a list)", "text; metadata.answer"),
    "regex_match": ("1 if the stripped completion matches metadata.pattern whole", "text; metadata.pattern"),
    "think_answer": ("1 if <think>...</think> then <answer>...</answer> (R1's format)", "text"),
}
