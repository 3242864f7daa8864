"""`vlm_judge`: a vision-language model asked a question about each image, scored by its answer-token probabilities;
`video_judge`: the same about each video, shown a few of its frames in order; `llm_judge`: the same for text outputs
(the autoregressive domain's completions), a chat LM (or VLM) asked about each (prompt, response) pair.

Any chat VLM that transformers loads with `AutoModelForImageTextToText` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA,
Idefics3, Gemma 3, ...) is asked `question` (a template; `{prompt}` becomes the image's prompt) about one image,
through its processor's own chat template, so it is asked exactly as it was trained. One forward, no generation:
the score comes from the next-token distribution right after the template's generation prompt (`assistant\\n`).

| mode   | candidate tokens (`answers`, `scale`)     | score                                                     |
|--------|-------------------------------------------|-----------------------------------------------------------|
| yes_no | yes, Yes / no, No                         | P(yes) = (p_yes + p_Yes) / (p_yes + p_Yes + p_no + p_No), in [0, 1] |
| scale  | the digits scale[0]..scale[1] ("1".."9")  | E[k] = sum_k k p_k / sum_k p_k, in [scale[0], scale[1]]   |

Probabilities are renormalized over the candidates (a softmax of their logits), so a judge that would rather start
its answer with something else ("The", "**") still gives a score on the scale. Each answer word counts as given,
lower-case and capitalized, because instruct models start an answer with "Yes" where the question says "yes".
Variants with a leading space (" yes") are not candidates: after a chat template's generation prompt the answer
starts a new line (sentencepiece tokenizers, LLaVA-1.5's, encode "yes" as "▁yes", the token the model emits there).
Every candidate must be one token of the model's tokenizer; one that is not is refused, naming its pieces. Qwen
tokenizers split numbers into digits, so a scale stops at 9.

VQAScore (linzhiqiu/t2v_metrics) reports p("Yes") over the whole vocabulary instead, one spelling, unnormalized;
flow_grpo's and UnifiedReward's VLM scorers generate text and parse a number out of it (0 when none is found).

Prompts are put in the chat as text: control tokens they spell ("<image>", "<|im_end|>") stay text
(`sanitize_control_tokens`). The model is loaded with `from_pretrained(folder)` (offline: a folder, never a hub
name), in eval mode, without gradients, in `dtype` (float32, or bfloat16 on GPUs), and cached per (resolved
folder, device, dtype). Batches are left-padded, so the last position is every row's generation prompt; only its
logits are computed. A Qwen-VL folder loads on a machine without torchvision too (`models/processors.py`: its
processor without the video part).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

DEFAULT_QUESTIONS = {
    "yes_no": 'Does this image match the description: "{prompt}"? Answer yes or no.',
    "scale": 'How well does this image match the description: "{prompt}"? '
    "Answer with one digit from 1 (not at all) to 9 (perfectly).",
}
VIDEO_QUESTIONS = {
    "yes_no": 'These are frames of one video, in order. Does the video match the description: "{prompt}"? '
    "Answer yes or no.",
    "scale": 'These are frames of one video, in order. How well does the video match the description: "{prompt}"? '
    "Answer with one digit from 1 (not at all) to 9 (perfectly).",
}
TEXT_QUESTIONS = {
    "yes_no": 'Question: "{prompt}"\nResponse: "{response}"\nIs the response correct? Answer yes or no.',
    "scale": 'Question: "{prompt}"\nResponse: "{response}"\nHow good is the response? '
    "Answer with one digit from 1 (useless) to 9 (perfect).",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class LoadedJudge:
    """A VLM and its processor on one device; `next_token_logits` asks it one question per image."""

    model: Any  # an AutoModelForImageTextToText (or, for text only, AutoModelForCausalLM), eval mode
    processor: Any  # its processor: tokenizer (with a chat template) + image processor; or the tokenizer alone
    device: torch.device
    reward: str = "vlm_judge"  # the reward it serves, named in its errors

    @property
    def tokenizer(self):
        return getattr(self.processor, "tokenizer", self.processor)

    def token_id(self, word: str) -> int:
        """The id of `word` as one token; ValueError when this tokenizer splits it."""
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            pieces = self.tokenizer.convert_ids_to_tokens(ids)
            raise ValueError(
                f"{self.reward} answer {word!r} is not one token of this model's tokenizer: it splits into {pieces}; "
                "choose answers (or a scale) whose words are single tokens"
            )
        return ids[0]

    @torch.inference_mode()
    def next_token_logits(self, images: Sequence, questions: Sequence[str]) -> torch.Tensor:
        """[B, V] float32 logits of the first answer token, each image (or list of images: a video's frames, in
        order) asked its question in a one-turn chat."""
        conversations = [
            [
                {
                    "role": "user",
                    "content": [
                        *({"type": "image", "image": frame.convert("RGB")} for frame in _as_list(image)),
                        {"type": "text", "text": q},
                    ],
                }
            ]
            for image, q in zip(images, questions, strict=True)
        ]
        inputs = self.processor.apply_chat_template(
            conversations,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            sanitize_control_tokens=True,  # a prompt containing "<|image_pad|>" or "<|im_end|>" stays plain text
            processor_kwargs={"padding": True, "padding_side": "left"},
        ).to(self.device)
        for key, value in inputs.items():
            if torch.is_floating_point(value):
                inputs[key] = value.to(self.model.dtype)  # pixel_values follow the model's dtype
        return self.model(**inputs, logits_to_keep=1).logits[:, -1].float()

    @torch.inference_mode()
    def text_logits(self, questions: Sequence[str]) -> torch.Tensor:
        """[B, V] float32 logits of the first answer token, each question a one-turn text chat; left-padded, the
        positions counted from each row's first token (transformers does not derive them from the mask)."""
        inputs = self.tokenizer.apply_chat_template(
            [[{"role": "user", "content": q}] for q in questions],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            sanitize_control_tokens=True,  # a response spelling "<|im_end|>" stays plain text
            padding=True,
            tokenizer_kwargs={"padding_side": "left"},
        ).to(self.device)
        mask = inputs["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=inputs["input_ids"], attention_mask=mask, position_ids=positions, logits_to_keep=1)
        return out.logits[:, -1].float()


def _as_list(image) -> list:
    return list(image) if isinstance(image, list | tuple) else [image]


def load_judge(path: str | Path, device: str | torch.device = "cpu", dtype: str = "float32",
               reward: str = "vlm_judge") -> LoadedJudge:  # fmt: skip
    """The VLM (or, for `llm_judge`, chat LM) in folder `path` on `device` in `dtype`, loaded on the first call and
    shared by later ones."""
    folder = Path(path).expanduser().resolve()
    if not (folder / "config.json").is_file():
        example = "Qwen/Qwen2.5-VL-7B-Instruct" if reward == "vlm_judge" else "Qwen/Qwen3-8B"
        raise FileNotFoundError(
            f"{reward} model folder {str(path)!r} has no config.json: give a local folder written by "
            f"save_pretrained with its tokenizer (with a chat template) or processor, e.g. a copy of {example}; "
            "nothing is downloaded"
        )
    if dtype not in DTYPES:
        raise ValueError(f"{reward} dtype {dtype!r} is not one of {sorted(DTYPES)}")
    return _load_judge(str(folder), str(torch.device(device)), dtype, reward)


@functools.cache
def _load_judge(folder: str, device: str, dtype: str, reward: str) -> LoadedJudge:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from unirl_core.models.processors import is_vlm_folder, load_processor

    if is_vlm_folder(folder):
        processor = load_processor(folder, local_files_only=True)
        model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True, dtype=DTYPES[dtype])
    elif reward == "llm_judge":
        processor = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=DTYPES[dtype])
    else:
        raise ValueError(f"vlm_judge model folder {folder} holds no vision-language model (its config.json has no "
                         "vision_config); give a chat VLM's folder, or use llm_judge to judge text")  # fmt: skip
    return LoadedJudge(model.to(device).eval().requires_grad_(False), processor, torch.device(device), reward)


class VlmJudgeScore:
    """The `vlm_judge` reward: P(yes) (`yes_no`) or the expected digit (`scale`) of a VLM asked about each image."""

    reward, questions, fields = "vlm_judge", DEFAULT_QUESTIONS, ("{prompt}",)

    def __init__(
        self,
        model_path: str | Path,
        device: str | torch.device = "cpu",
        batch_size: int = 4,
        question: str | None = None,
        mode: str = "yes_no",
        dtype: str = "float32",
        answers: tuple[str, str] = ("yes", "no"),
        scale: tuple[int, int] = (1, 9),
    ):
        if mode not in self.questions:
            raise ValueError(f"{self.reward} mode {mode!r} is not one of {sorted(self.questions)}")
        self.question = self.questions[mode] if question is None else question
        missing = [field for field in self.fields if field not in self.question]
        if missing:
            raise ValueError(
                f"{self.reward} question {self.question!r} has no {' or '.join(missing)}: write where it goes, "
                f"e.g. {self.questions[mode]!r}"
            )
        self.judge = load_judge(model_path, device, dtype, self.reward)
        self.batch_size = batch_size
        self.mode = mode
        self.candidate_ids, self.values = self._candidates(answers, scale)

    def _candidates(self, answers: tuple[str, str], scale: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidate token ids [K] and the value each stands for [K]: 1/0 for yes/no spellings, k for digit k."""
        if self.mode == "yes_no":
            yes, no = answers  # each as given, lower-case and capitalized: "yes", "Yes"
            words = {spelling: 1.0 for spelling in (yes, yes.lower(), yes.capitalize())}
            words |= {spelling: 0.0 for spelling in (no, no.lower(), no.capitalize())}
        else:
            low, high = scale
            if low >= high:
                raise ValueError(f"{self.reward} scale {scale} is empty: give (lowest, highest), e.g. (1, 9)")
            words = {str(k): float(k) for k in range(low, high + 1)}
        ids = [self.judge.token_id(word) for word in words]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{self.reward} answers {list(words)} share tokens in this tokenizer: {ids}")
        return torch.tensor(ids), torch.tensor(list(words.values()), dtype=torch.float64)

    def score_logits(self, logits_BV: torch.Tensor) -> torch.Tensor:
        """[B] float64 scores from next-token logits: softmax over the candidates, then the expected value."""
        probs_BK = torch.softmax(logits_BV[:, self.candidate_ids.to(logits_BV.device)].double(), dim=-1)
        return probs_BK.cpu() @ self.values

    def __call__(
        self, images: Sequence[Image.Image], prompts: Sequence[str], sample_ids: Sequence[str] = ()
    ) -> np.ndarray:
        if len(prompts) != len(images):
            raise ValueError(f"vlm_judge needs one prompt per image; got {len(prompts)} for {len(images)} images")
        images, size = list(images), self.batch_size
        questions = [self.question.replace("{prompt}", prompt) for prompt in prompts]  # not str.format: braces stay
        scores = [
            self.score_logits(
                self.judge.next_token_logits(images[start : start + size], questions[start : start + size])
            )
            for start in range(0, len(images), size)
        ]
        return torch.cat(scores).numpy() if scores else np.zeros(0)


class LlmJudgeScore(VlmJudgeScore):
    """The `llm_judge` reward: P(yes) (`yes_no`) or the expected digit (`scale`) of a chat LM (or VLM, text only)
    asked about each text output: the question's `{prompt}` becomes the prompt, `{response}` the output."""

    reward, questions, fields = "llm_judge", TEXT_QUESTIONS, ("{prompt}", "{response}")

    def __call__(self, outputs: Sequence[str], prompts: Sequence[str], sample_ids: Sequence[str] = ()) -> np.ndarray:
        if len(prompts) != len(outputs):
            raise ValueError(f"llm_judge needs one prompt per output; got {len(prompts)} for {len(outputs)} outputs")
        fill = {"{prompt}": list(prompts), "{response}": [str(o) for o in outputs]}
        pattern = re.compile("|".join(re.escape(field) for field in fill))  # one pass: a response's braces stay
        questions = [pattern.sub(lambda m, i=i: fill[m.group(0)][i], self.question) for i in range(len(outputs))]
        size = self.batch_size
        scores = [self.score_logits(self.judge.text_logits(questions[start : start + size]))
                  for start in range(0, len(questions), size)]  # fmt: skip
        return torch.cat(scores).numpy() if scores else np.zeros(0)


class VideoJudgeScore(VlmJudgeScore):
    """The `video_judge` reward: the VLM judge asked about each video, shown `frames` evenly spaced frames (first and
    last included) as images of one chat turn, in order: P(yes) (`yes_no`) or the expected digit (`scale`)."""

    reward, questions = "video_judge", VIDEO_QUESTIONS

    def __init__(self, *args, frames: int = 4, **kwargs):
        super().__init__(*args, **kwargs)
        self.frames = frames

    def __call__(self, videos: Sequence, prompts: Sequence[str], sample_ids: Sequence[str] = ()) -> np.ndarray:
        from unirl_core.data.video import spaced_frames

        return super().__call__([list(spaced_frames(v, self.frames)) for v in videos], prompts, sample_ids)
