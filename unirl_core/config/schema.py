"""Typed recipe models: one config system from YAML to the Prefect UI form.

A recipe file holds up to four sections, `ingest`, `precache`, `train` and `promote`, each optional. Every model refuses
unknown keys (a typo is an error, never a silently ignored setting) and documents each field with its meaning,
its unit, and whether it is global or per rank. The docstring under a field is its description: it shows in
`unirl validate`'s errors, in the JSON schema and in the Prefect UI form.

Batch arithmetic (global, per rollout):
    prompts_per_rollout x samples_per_prompt = samples per rollout, e.g. 4 x 4 = 16.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Discriminator, Field, SerializeAsAny, Tag, model_validator

from unirl_core.algorithms.config import AlgorithmConfig
from unirl_core.algorithms.registry import BUILT_IN, algorithm_class, algorithm_config, builtin_configs
from unirl_core.config.ingest import IngestConfig
from unirl_core.config.precache import PrecacheConfig
from unirl_core.config.schema_base import Count, OptionalStr, Problem, SectionClass, Seed, StrictModel
from unirl_core.domains.base import DomainConfig
from unirl_core.domains.registry import domain_class, domain_config, section_class


class DataConfig(StrictModel):
    """Where training prompts come from and how they are batched (the seed's `data_source`)."""

    source: str = "file"
    """Prompt source: `file` reads `data_path`, shuffles each epoch with `seed` and drops the last partial
    batch; `smoke` ignores `data_path` and cycles a few built-in prompts. A dotted class path
    (`package.module.Class`) selects a custom source."""

    data_path: OptionalStr = None
    """Training prompt file: `.txt` (one prompt per line), `.jsonl` or `.json`; a local path or an fsspec URL
    (`s3://bucket/prompts.jsonl`). Required by the `file` source. Recipes usually read it from `${env:DATA_PATH}`."""

    eval_data_path: OptionalStr = None
    """Optional eval prompt file (same formats), read in file order, never shuffled. Usually `${env:EVAL_DATA_PATH,}`."""

    prompt_key: str = "prompt"
    """Key holding the prompt text in JSON objects, when it is not `prompt` (`caption` is always accepted)."""

    prompts_per_rollout: Annotated[Count, Field(gt=0)] = 4
    """Global: distinct prompts per rollout (the loader's batch size). Prompts are not pre-duplicated; each is
    repeated `train.sampling.samples_per_prompt` times later, in the rollout."""

    shuffle: bool = True
    """Shuffle the prompt order each epoch (the `file` source). False keeps file order."""

    seed: Seed = 0
    """Seed of the epoch shuffle: epoch e uses the permutation drawn from (seed, e), so a resume is exact."""

    def problems(self) -> Iterator[Problem]:
        from unirl_core.data.sources import SOURCES, source_class

        if self.source not in SOURCES:
            try:
                source_class(self.source)
            except ValueError as exc:
                yield "source", self.source, str(exc)
        if self.source == "file" and not self.data_path:
            yield (
                "data_path",
                self.data_path,
                "a prompt file path: the `file` source needs one (set DATA_PATH or --set train.data.data_path=...)",
            )


class SamplingConfig(StrictModel):
    """How each rollout samples images. Prompt rows can never set these (the seed: they come from cfg.sampling)."""

    samples_per_prompt: Annotated[Count, Field(ge=1)] = 4
    """Global: images generated per prompt, the GRPO group size. Siblings share a `group_id`."""

    num_inference_steps: Annotated[Count, Field(ge=1)] = 10
    """Denoising steps per image."""

    guidance_scale: Annotated[float, Field(ge=0.0)] = 4.5
    """Classifier-free guidance scale; 1.0 or less turns guidance off."""

    height: Annotated[Count, Field(gt=0, multiple_of=8)] = 512
    """Image height in pixels (a multiple of 8, the VAE's downsampling)."""

    width: Annotated[Count, Field(gt=0, multiple_of=8)] = 512
    """Image width in pixels (a multiple of 8, the VAE's downsampling)."""

    negative_prompt: str = ""
    """Negative prompt used for every sample when guidance is on; empty means the unconditional embedding."""

    num_frames: Annotated[Count, Field(ge=1)] | None = None
    """Frames per video (video families only; Wan: (num_frames - 1) % 4 == 0, e.g. 33 or 81). Empty for image
    families, which refuse it."""

    fps: Annotated[float, Field(gt=0)] | None = None
    """Frame rate of the videos (their mp4s and what video rewards read); empty: the family's native rate (Wan 16)."""

    share_group_noise: bool = False
    """Siblings (the samples of one prompt) start from the same initial noise, so the group's differences come
    only from the SDE noise of the stochastic steps."""

    condition_strength: Annotated[float, Field(gt=0, le=1)] = 0.7
    """Image-to-image (prompts with an image `condition` in `media_refs`): the fraction of the denoising steps run,
    starting from the condition image's noised latent (diffusers' `strength`; 1.0 starts from pure noise)."""

    seed: Seed = 0
    """Base seed of the initial noise; each sample's noise derives from (seed, step, sample index)."""

    eval_num_inference_steps: Annotated[Count, Field(ge=1)] | None = None
    """Denoising steps of evaluation images (`eval_prompts`); empty: `num_inference_steps`. Flow-GRPO trains on
    10-step rollouts and evaluates at 40: set `num_inference_steps: 10, eval_num_inference_steps: 40`."""

    eval_guidance_scale: Annotated[float, Field(ge=0.0)] | None = None
    """Guidance scale of evaluation images; empty: `guidance_scale`. CFG-free training (Flow-GRPO's speed lever:
    one branch per forward, half the compute) is `guidance_scale: 1.0` with e.g. `eval_guidance_scale: 4.5`."""

    @property
    def eval_steps(self) -> int:
        return self.eval_num_inference_steps or self.num_inference_steps

    @property
    def eval_guidance(self) -> float:
        return self.guidance_scale if self.eval_guidance_scale is None else self.eval_guidance_scale


class LoraConfig(StrictModel):
    """LoRA through peft on the denoiser (the reference policy is the same model with the adapter disabled)."""

    rank: Annotated[Count, Field(ge=1)] = 8
    """LoRA rank r."""

    alpha: Annotated[float, Field(gt=0)] = 16.0
    """LoRA alpha (the update is scaled by alpha / rank)."""

    target_modules: list[str] = ["to_q", "to_k", "to_v", "to_out.0"]
    """Module names that get adapters (attention projections by default)."""


class ModelConfig(StrictModel):
    """The generator being trained."""

    family: str = "sd3"
    """Model family (`unirl_core/models/families/`): `sd3` (flow matching, SDE sampler), `sd15` (UNet + DDIM, eta
    sampler), or your own `Family` subclass as `package.module:ClassName`. Checked when training starts."""

    path: str = "tiny:sd3"
    """A diffusers pipeline folder or hub id; `tiny:<family>` builds the tiny test model in the workspace."""

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the frozen weights and of the compute (`bfloat16` on GPUs). Trained parameters (LoRA or the whole
    denoiser), their gradients and the optimizer state are float32 whatever it is, and so are log-probs. `float16`
    is refused for training (no loss scaling)."""

    lora: LoraConfig | None = LoraConfig()
    """LoRA settings; empty (null) means full fine-tuning of the denoiser."""

    text_embedding_cache: OptionalStr = None
    """Folder of the text-embedding cache (e.g. `.unirl/cache/text-embeddings`, or an fsspec URL): prompt
    conditioning is read from it and misses are computed and written back, keyed by the text encoders' weights.
    `unirl precache prompts FILE --recipe R` fills it ahead of a run. Empty: encode every rollout."""

    text_encoders: Literal["auto", "device", "cpu"] = "auto"
    """Where the frozen text encoders (every `text_encoder*` component: CLIP, T5-XXL ~9.5 GB in bf16, a VLM) live:
    `device` keeps them with the model on each training GPU; `cpu` keeps them in host memory and encodes cache misses
    there (the conditioning then moves to the GPU; slow for a big encoder: precache the prompts). `auto`: `cpu` when
    `text_embedding_cache` is set and the model is on a GPU (edit models, whose text encoder reads every condition
    image, stay on the device), else `device`. Conditioning is the same either way (device numerics aside)."""

    vae_decode_batch: Annotated[Count, Field(ge=1)] = 8
    """Images per VAE decode call when rollouts turn latents into images: lower it at high resolution (a batch of 8
    at 1024 px through the SD3/FLUX VAE takes many GB). Images are the same whatever it is."""

    vae_tiling: bool = False
    """Decode (and encode condition images) in overlapping tiles (diffusers' `vae.enable_tiling()`): bounded VAE
    memory at any resolution; images differ slightly from untiled decoding at the tile seams."""

    experts: list[str] | None = None
    """Which denoisers train, for a family with several (Wan 2.2 A14B: `transformer`, the high-noise expert, and
    `transformer_2`, the low-noise one); the others stay frozen. Empty: all of them. Other families refuse it."""


def _algorithm_tag(value) -> str:
    """The union member of a `train.algorithm` section: its `name` (grpo when left out), `plugin` for an algorithm
    named by `package.module:ClassName`."""
    name = value.get("name", "grpo") if isinstance(value, dict) else getattr(value, "name", "grpo")
    return "plugin" if isinstance(name, str) and ":" in name else name


def _plugin_config(value):
    """A `package.module:ClassName` algorithm's section, validated by its own config class."""
    from unirl_core.algorithms.registry import algorithm_config

    return algorithm_config(value)


# `train.algorithm`: one config class per algorithm (its module's), chosen by `name`; each fills the keys a recipe
# leaves out with its paper's defaults. An algorithm outside unirl (`package.module:ClassName`) brings its own.
AlgorithmSection = Annotated[
    Union[  # noqa: UP007 (a union built from the registry)
        tuple(Annotated[config, Tag(name)] for name, config in builtin_configs().items())
        + (Annotated[SerializeAsAny[AlgorithmConfig], BeforeValidator(_plugin_config), Tag("plugin")],)
    ],
    Discriminator(
        _algorithm_tag,
        custom_error_type="algorithm_name",
        custom_error_message=f"unknown algorithm name: choose one of {', '.join(BUILT_IN)}, or name an Algorithm "
        "subclass as 'package.module:ClassName'",
    ),
    Field(json_schema_extra=lambda schema: schema.update(anyOf=schema.pop("oneOf"))),  # `name` may be left out:
]  # several members then match, which JSON Schema's oneOf (exactly one) refuses and anyOf accepts


class ClipRewardConfig(StrictModel):
    """Settings of the `clip_score` reward: 100 x cosine(CLIP image embedding, CLIP prompt embedding)."""

    model_path: OptionalStr = None
    """Local folder of a transformers CLIP checkpoint (`CLIPModel` weights, tokenizer, image processor), e.g. a
    `save_pretrained` copy of openai/clip-vit-large-patch14. Loaded offline, once per process. Recipes usually read
    it from `${env:CLIP_PATH}`."""

    batch_size: Annotated[Count, Field(ge=1)] = 32
    """Per rank: images (and prompts) per CLIP forward."""


class PickScoreRewardConfig(StrictModel):
    """Settings of the `pickscore` reward (yuvalkirstain/PickScore): exp(logit_scale) x cosine(image, prompt) of the
    PickScore CLIP-H model, about 18-23 on real images. flow_grpo divides it by 26: weight it 0.03846 for its scale."""

    model_path: OptionalStr = None
    """Local folder of the PickScore model (a `save_pretrained` copy of yuvalkirstain/PickScore_v1: CLIPModel
    weights and config). Recipes usually read it from `${env:PICKSCORE_PATH}`."""

    processor_path: OptionalStr = None
    """Local folder of its CLIP processor (tokenizer + image processor; the reference uses
    laion/CLIP-ViT-H-14-laion2B-s32B-b79K's). Empty: `model_path` (when the processor was saved there)."""

    batch_size: Annotated[Count, Field(ge=1)] = 16
    """Per rank: images (and prompts) per forward."""


class OcrRewardConfig(StrictModel):
    """Settings of the `ocr` reward (Flow-GRPO's): how exactly each image renders the text its prompt quotes in double
    quotes, 1 - min(edit distance, |target|) / |target| in [0, 1], read by a local TrOCR-style OCR model."""

    model_path: OptionalStr = None
    """Local folder of the OCR model: a `save_pretrained` VisionEncoderDecoderModel with its processor (tokenizer +
    image processor), e.g. a copy of microsoft/trocr-base-printed. Recipes usually read it from `${env:OCR_PATH}`."""

    batch_size: Annotated[Count, Field(ge=1)] = 16
    """Per rank: images read per generate call."""

    max_new_tokens: Annotated[Count, Field(ge=1)] = 32
    """Per image: most tokens read (greedy decoding); a longer text is cut off and scores lower."""


class HPSv2RewardConfig(StrictModel):
    """Settings of the `hpsv2` reward (tgxs002/HPSv2): cosine(image, prompt) of the HPSv2 / HPSv2.1 model (OpenCLIP
    ViT-H-14 fine-tuned on human preferences), no logit scale: about 0.2-0.35 on real images (papers print it x100)."""

    checkpoint_path: OptionalStr = None
    """Local HPS checkpoint: HPS_v2.1_compressed.pt (HPS_v2_compressed.pt for HPSv2.0) from huggingface.co/xswu/HPSv2,
    read with torch.load(weights_only=True), or a .safetensors of its state dict. Recipes usually read it from
    `${env:HPSV2_PATH}`."""

    tokenizer_path: OptionalStr = None
    """Local CLIP tokenizer folder (laion/CLIP-ViT-H-14-laion2B-s32B-b79K's; PickScore's `processor_path` folder
    works)."""

    arch: str = "ViT-H-14"
    """open_clip architecture of the checkpoint: ViT-H-14 (HPSv2's and HPSv2.1's) or the path of an open_clip
    model-config JSON."""

    batch_size: Annotated[Count, Field(ge=1)] = 16
    """Per rank: images (and prompts) per forward."""


class ImageRewardConfig(StrictModel):
    """Settings of the `imagereward` reward (THUDM/ImageReward v1.0): BLIP's text encoder reads the prompt with
    cross-attention to the image and an MLP scores it, normalized to about zero mean and unit variance on its
    training data (higher: preferred)."""

    checkpoint_path: OptionalStr = None
    """Local `ImageReward.pt` from huggingface.co/THUDM/ImageReward (a state dict, read with
    torch.load(weights_only=True)) or a `.safetensors` of it. Recipes usually read it from `${env:IMAGEREWARD_PATH}`."""

    tokenizer_path: OptionalStr = None
    """Local folder of bert-base-uncased's tokenizer (vocab.txt or tokenizer.json); the reference's [DEC] and [ENC]
    tokens are added on load."""

    batch_size: Annotated[Count, Field(ge=1)] = 16
    """Per rank: images (and prompts) per forward."""

    arch_path: OptionalStr = None
    """JSON of the model sizes (`ImageRewardArch` fields in unirl_core/rewards/imagereward.py), for tests' tiny
    checkpoints. Empty: the published ViT-L/16 + BERT-base sizes."""


class GenEvalRewardConfig(StrictModel):
    """Settings of the `geneval` reward: GenEval's object/count/colour/position checks of each image against its
    prompt record's `metadata` (GenEval's record), an OWLv2 detector for boxes and a CLIP for colours."""

    detector_path: OptionalStr = None
    """Local folder of an OWLv2 (or OWL-ViT) detector with its processor: a `save_pretrained` copy of
    google/owlv2-base-patch16-ensemble. Recipes usually read it from `${env:OWLV2_PATH}`."""

    clip_path: OptionalStr = None
    """Local CLIP folder (as `clip.model_path`) that classifies each box's colour zero-shot; GenEval uses
    ViT-L/14 (openai/clip-vit-large-patch14). Shared with `clip_score` when both name the same folder."""

    batch_size: Annotated[Count, Field(ge=1)] = 8
    """Per rank: images per detector forward (and box crops per CLIP forward)."""

    threshold: Annotated[float, Field(gt=0, lt=1)] = 0.3
    """Detector score above which a box counts as an object. GenEval's 0.3 is for Mask2Former; OWLv2's scores run
    lower (its model card uses 0.1): tune it on a few labelled images."""

    scoring: Literal["fractional", "strict"] = "fractional"
    """`fractional`: mean credit over the checks, what flow_grpo trains on (at most 1, negative with many extra
    objects); `strict`: 1.0 only when every check holds (exact counts, exclusions included), else 0.0."""


class VlmJudgeRewardConfig(StrictModel):
    """Settings of the `vlm_judge` reward: a chat VLM asked `question` about each image, scored from its next-token
    probabilities over the answer tokens (one forward, no generation): P(yes) in [0, 1] or the expected digit."""

    model_path: OptionalStr = None
    """Local folder of a VLM that AutoModelForImageTextToText loads, with its processor (a `save_pretrained` copy of
    e.g. Qwen/Qwen2.5-VL-7B-Instruct; a Qwen-VL folder loads without torchvision too). Recipes read it from
    `${env:VLM_JUDGE_PATH}`."""

    question: OptionalStr = None
    """The question, a template where `{prompt}` becomes the image's prompt. Empty: the mode's default (yes_no: 'Does
    this image match the description: "{prompt}"? Answer yes or no.'; scale: asks for one digit from 1 to 9)."""

    mode: Literal["yes_no", "scale"] = "yes_no"
    """yes_no: P(yes) over the yes/no answer tokens, in [0, 1]; scale: sum_k k p(k) over the digit tokens, in [1, 9]."""

    batch_size: Annotated[Count, Field(ge=1)] = 4
    """Per rank: images (one question each) per forward, left-padded."""

    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights' dtype: float32 (CPU, tests) or bfloat16 (real judges on GPUs)."""

    answers: tuple[str, str] = ("yes", "no")
    """yes_no: the positive and negative word, each counted as given, lower-case and capitalized; each must be one
    token."""

    scale: tuple[int, int] = (1, 9)
    """scale: the lowest and highest digit; every value must be one token (Qwen tokenizers split 10)."""


class VideoJudgeRewardConfig(VlmJudgeRewardConfig):
    """Settings of the `video_judge` reward: a chat VLM shown `frames` frames of each video (in order, one chat
    turn) and asked `question`, scored as `vlm_judge` is (P(yes) or the expected digit)."""

    model_path: OptionalStr = None
    """Local folder of a chat VLM that reads several images per turn (e.g. Qwen2-VL-2B-Instruct, the base of
    VideoAlign's reward model; Qwen2.5-VL). Recipes read it from `${env:VIDEO_JUDGE_PATH}`."""

    question: OptionalStr = None
    """A template where `{prompt}` becomes the video's prompt. Empty: the mode's default ('These are frames of one
    video, in order. Does the video match the description: "{prompt}"? Answer yes or no.')."""

    frames: Annotated[Count, Field(ge=1)] = 4
    """Frames shown per video, evenly spaced with the first and the last included (every frame of a shorter one)."""

    batch_size: Annotated[Count, Field(ge=1)] = 2
    """Per rank: videos (each `frames` images) per forward, left-padded."""


class LlmJudgeRewardConfig(VlmJudgeRewardConfig):
    """Settings of the `llm_judge` reward: a chat LM (or a VLM, text only) asked `question` about each text output
    (the autoregressive domain's completions), scored from its next-token probabilities over the answer tokens."""

    model_path: OptionalStr = None
    """Local folder of a chat LM that AutoModelForCausalLM loads with its tokenizer (a `save_pretrained` copy of
    e.g. Qwen/Qwen3-8B), or of a chat VLM. Recipes read it from `${env:LLM_JUDGE_PATH}`."""

    question: OptionalStr = None
    """The question, a template where `{prompt}` becomes the prompt and `{response}` the output. Empty: the mode's
    default (yes_no: 'Question: "{prompt}" / Response: "{response}" / Is the response correct? Answer yes or no.';
    scale: asks for one digit from 1 to 9)."""


class AestheticRewardConfig(StrictModel):
    """Settings of the `aesthetic` reward: LAION's aesthetic predictor head on a CLIP image embedding."""

    clip_model_path: OptionalStr = None
    """Local CLIP folder (as `clip.model_path`) whose image embedding the head was trained on: ViT-L/14 for the
    public LAION head. Shared with `clip_score` when both name the same folder."""

    head_path: OptionalStr = None
    """The head's `.safetensors` file (pickle is refused); key layout and how to convert the public LAION `.pth`
    in unirl_core/rewards/aesthetic.py."""

    batch_size: Annotated[Count, Field(ge=1)] = 32
    """Per rank: images per CLIP forward."""


class RemoteScorerConfig(StrictModel):
    """A reward served over HTTP (JSON contract in unirl_core/rewards/remote.py); its key in `remote` is its name."""

    url: str
    """Endpoint the batches are POSTed to, `http://` or `https://`, e.g. `http://scorer:8000/score`."""

    connect_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """Seconds to wait for a connection; a failed connection is retried."""

    read_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    """Seconds to wait for the scores of one batch; a read timeout is not retried (the server is busy)."""

    retries: Annotated[Count, Field(ge=0)] = 3
    """Retries of a batch after a connection error or HTTP 429/500/502/503/504."""

    backoff_s: Annotated[float, Field(ge=0)] = 1.0
    """Backoff between retries: none before the 1st, then backoff_s x 2, x 4, ... seconds (at most 120)."""

    batch_size: Annotated[Count, Field(ge=1)] = 16
    """Per rank: images per request."""

    auth_header: str = "Authorization"
    """Name of the header that carries the credential, when `auth_header_env` is set."""

    auth_header_env: OptionalStr = None
    """NAME of the environment variable holding the header's value (e.g. `SCORER_TOKEN`, holding `Bearer ...`);
    never the secret itself. Empty: no auth header."""

    videos: Literal["frames", "mp4"] = "frames"
    """How video outputs are sent: `frames` (the frames `reward.video` chooses, each as an image, their scores
    aggregated as an image reward's) or `mp4` (each whole video, base64 mp4 in the request's `videos`, one score
    per video: a video scorer such as VideoAlign behind a server)."""

    def problems(self) -> Iterator[Problem]:
        if not self.url.startswith(("http://", "https://")):
            yield "url", self.url, "an http:// or https:// URL"
        name = self.auth_header_env
        if name is not None and not (name.isascii() and name.isidentifier()):  # letters, digits, _; no leading digit
            yield (
                "auth_header_env",
                "<hidden>",  # it may be the secret pasted by mistake: never echo it
                "the NAME of an environment variable (letters, digits, _), not the secret: export the value there",
            )


class RewardActorsConfig(StrictModel):
    """The Ray actors that serve the model rewards under `placement: dedicated` (global counts).

    Resource arithmetic: workers x cpus_per_worker CPUs and workers x gpus_per_worker GPUs, on top of the training
    workers' (`train.ray`), e.g. 8 policy GPUs + 2 x 1 reward GPUs = 10 GPUs."""

    workers: Annotated[Count, Field(ge=1)] = 1
    """Reward actors; each loads every model reward of the recipe once. A rank's batch is split evenly over them
    and scored in one call per actor (the policy never waits on one image at a time)."""

    cpus_per_worker: Annotated[float, Field(gt=0)] = 1
    """CPUs of each reward actor (and its torch threads)."""

    gpus_per_worker: Annotated[float, Field(ge=0)] = 0
    """GPUs of each reward actor: 0 scores on its CPUs; a fraction (0.5) lets two actors share one GPU."""

    max_restarts: Annotated[Count, Field(ge=0)] = 3
    """Times Ray restarts a reward actor that died (it reloads its models) and retries the call on it; past that
    the step fails as transient and the round resumes from its last committed checkpoint."""


class VideoRewardConfig(StrictModel):
    """How image rewards score videos (a video family's outputs): on which frames, and how those scores become the
    video's one score. Video rewards (`frame_smoothness`, `temporal_consistency`) read every frame regardless."""

    frames: Literal["first", "mean", "min"] = "first"
    """`first`: the first frame's score (UniRL's: PickScore of frame 0). `mean` / `min`: the mean / the lowest
    score of `sample_frames` frames (min: a video is as good as its worst frame)."""

    sample_frames: Annotated[Count, Field(ge=1)] = 4
    """`mean`, `min`: frames scored per video, evenly spaced with the first and the last included (every frame of
    a shorter video). Per video, so the image rewards score this many times the batch."""


class RewardConfig(StrictModel):
    """How images are scored: a weighted sum of named rewards, plus guards that are scored but not trained on.

    Names: the weight-free ones (unirl_core/rewards/functions.py; of videos: rewards/video.py), the model rewards
    (`clip_score` and `temporal_consistency` need `clip`; `aesthetic`, `pickscore`, `hpsv2`, `ocr`, `imagereward`,
    `geneval`, `vlm_judge`, `llm_judge`, `video_judge` their own section), and every key of `remote`."""

    weights: dict[str, float] = {"jpeg_compressibility": 1.0}
    """Reward name -> weight in the total reward."""

    guards: list[str] = ["brightness", "edge_density"]
    """Rewards scored and logged but not trained on (watch for reward hacking)."""

    clip: ClipRewardConfig | None = None
    """The CLIP model of `clip_score`; required when `clip_score` is weighted or a guard."""

    aesthetic: AestheticRewardConfig | None = None
    """The CLIP and head of `aesthetic`; required when `aesthetic` is weighted or a guard."""

    pickscore: PickScoreRewardConfig | None = None
    """The PickScore model of `pickscore`; required when `pickscore` is weighted or a guard."""

    hpsv2: HPSv2RewardConfig | None = None
    """The HPS checkpoint and tokenizer of `hpsv2`; required when `hpsv2` is weighted or a guard."""

    ocr: OcrRewardConfig | None = None
    """The OCR model of `ocr`; required when `ocr` is weighted or a guard."""

    imagereward: ImageRewardConfig | None = None
    """The checkpoint and tokenizer of `imagereward`; required when `imagereward` is weighted or a guard."""

    geneval: GenEvalRewardConfig | None = None
    """The detector and CLIP of `geneval`; required when `geneval` is weighted or a guard."""

    vlm_judge: VlmJudgeRewardConfig | None = None
    """The VLM of `vlm_judge`; required when `vlm_judge` is weighted or a guard."""

    llm_judge: LlmJudgeRewardConfig | None = None
    """The chat LM of `llm_judge` (text outputs); required when `llm_judge` is weighted or a guard."""

    video_judge: VideoJudgeRewardConfig | None = None
    """The VLM of `video_judge` (video outputs); required when `video_judge` is weighted or a guard."""

    remote: dict[str, RemoteScorerConfig] = {}
    """Remote scorers by reward name: each key can be weighted or guarded like a built-in reward."""

    normalize: Literal["total", "per_reward", "advantage_aggr"] = "total"
    """How several weighted rewards become advantages. `total`: normalize the weighted sum within each group
    (flow_grpo's and DiffusionNFT's multi-reward runs). `per_reward` (GDPO): normalize each reward within its
    group, weight and sum those advantages, then standardize the sum over the batch, so a reward with a wide raw
    range cannot drown the others. `advantage_aggr` (MixGRPO's `multi_reward_mix`, its default for HPS +
    ImageReward + PickScore): the same weighted sum of per-reward group advantages with the weights normalized to
    sum to 1, not standardized again. The algorithm's std_mode, std_ddof, adv_eps and grouping apply to each."""

    placement: Literal["colocated", "dedicated"] = "colocated"
    """Where the model rewards run. `colocated`: on each training worker's device, next to the policy.
    `dedicated`: on their own Ray actors (`actors`: own CPUs or GPUs, restarted when they die); not with `--local`.
    Weight-free and remote rewards always run on the training workers."""

    actors: RewardActorsConfig = RewardActorsConfig()
    """`dedicated`: how many reward actors, and their resources."""

    video: VideoRewardConfig = VideoRewardConfig()
    """Video outputs: which frames the image rewards score, and how their scores aggregate per video."""

    def problems(self) -> Iterator[Problem]:
        from unirl_core.rewards.names import builtin_names, is_plugin, plugin_reward

        yield from super().problems()
        builtins = builtin_names()
        known = sorted(builtins | set(self.remote))
        if not self.weights:
            yield "weights", {}, "at least one weighted reward, e.g. {jpeg_compressibility: 1.0}"
        for field, names in (("weights", list(self.weights)), ("guards", self.guards)):
            for name in names:
                if is_plugin(name):
                    try:
                        plugin_reward(name)
                    except ValueError as exc:
                        yield f"{field}.{name}", name, f"an importable reward function ({exc})"
                elif name not in known:
                    yield f"{field}.{name}", name, (f"an unknown reward: choose one of {known}, add remote.{name}, or "
                                                    "name a function of yours as 'package.module:function'")  # fmt: skip
        yield from self._missing_model_paths()
        for name, remote in self.remote.items():
            if name in builtins:
                yield f"remote.{name}", name, "a built-in reward's name: give the remote scorer another name"
            for path, value, message in remote.problems():
                yield f"remote.{name}.{path}", value, message

    def _missing_model_paths(self) -> Iterator[Problem]:
        used = set(self.weights) | set(self.guards)
        clip, aesthetic = self.clip or ClipRewardConfig(), self.aesthetic or AestheticRewardConfig()
        pickscore, ocr = self.pickscore or PickScoreRewardConfig(), self.ocr or OcrRewardConfig()
        imagereward, hps = self.imagereward or ImageRewardConfig(), self.hpsv2 or HPSv2RewardConfig()
        geneval, judge = self.geneval or GenEvalRewardConfig(), self.vlm_judge or VlmJudgeRewardConfig()
        text_judge = self.llm_judge or LlmJudgeRewardConfig()
        required = [
            ("hpsv2", "hpsv2.checkpoint_path", hps.checkpoint_path, "a local HPS_v2.1_compressed.pt"),
            ("hpsv2", "hpsv2.tokenizer_path", hps.tokenizer_path, "a local CLIP-H tokenizer folder"),
            ("geneval", "geneval.detector_path", geneval.detector_path, "a local OWLv2 folder"),
            ("geneval", "geneval.clip_path", geneval.clip_path, "a local CLIP folder (colours)"),
            ("vlm_judge", "vlm_judge.model_path", judge.model_path, "a local chat VLM folder"),
            ("llm_judge", "llm_judge.model_path", text_judge.model_path, "a local chat LM folder"),
            (
                "video_judge",
                "video_judge.model_path",
                (self.video_judge or VideoJudgeRewardConfig()).model_path,
                "a local chat VLM folder",
            ),
            ("imagereward", "imagereward.checkpoint_path", imagereward.checkpoint_path, "a local ImageReward.pt"),
            ("imagereward", "imagereward.tokenizer_path", imagereward.tokenizer_path, "a bert-base-uncased folder"),
            ("ocr", "ocr.model_path", ocr.model_path, "a local OCR model folder, e.g. microsoft/trocr-base-printed"),
            ("clip_score", "clip.model_path", clip.model_path, "a local CLIP folder (or drop clip_score)"),
            ("temporal_consistency", "clip.model_path", clip.model_path, "a local CLIP folder (frame embeddings)"),
            ("pickscore", "pickscore.model_path", pickscore.model_path, "a local copy of yuvalkirstain/PickScore_v1"),
            ("aesthetic", "aesthetic.clip_model_path", aesthetic.clip_model_path, "a local CLIP ViT-L/14 folder"),
            ("aesthetic", "aesthetic.head_path", aesthetic.head_path, "the head's .safetensors file"),
        ]
        for name, path, value, what in required:
            if name in used and not value:
                yield path, value, f"{name} is weighted or a guard, so set train.reward.{path} to {what}"


class RayConfig(StrictModel):
    """Where a training round runs: a local Ray started for the round, or an existing cluster.

    Resource arithmetic (global): workers x cpus_per_worker CPUs and workers x gpus_per_worker GPUs, e.g. 8 x 1 = 8
    GPUs; refused before any actor starts when the cluster (or, for a local Ray, this machine) has fewer."""

    address: str | None = None
    """An existing Ray cluster (`auto`, `host:6379`, `ray://host:10001`; KubeRay's head service). Empty: the
    `RAY_ADDRESS` environment variable, else a local Ray started on 127.0.0.1 for the round and shut down after."""

    workers: Annotated[Count, Field(ge=1)] = 2
    """Data-parallel ranks: one Ray actor each in one placement-group bundle, joined by torch.distributed."""

    cpus_per_worker: Annotated[float, Field(gt=0)] = 1
    """CPUs of each worker's bundle (and its torch threads)."""

    gpus_per_worker: Annotated[float, Field(ge=0)] = 0
    """GPUs of each worker's bundle, a whole number: 1 on GPU clusters (the backend becomes nccl), 0 on CPU (gloo).
    An FSDP rank drives whole GPUs, so fractions (0.5) are refused."""

    placement: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """Ray placement strategy of the workers' bundles: PACK (as few nodes as possible: NVLink within a node),
    SPREAD (over as many nodes as possible), STRICT_PACK (all on one node or fail), STRICT_SPREAD (one per node)."""

    placement_timeout_s: Annotated[float, Field(gt=0)] = 120
    """Seconds to wait for the cluster to place every worker's bundle (an autoscaler adding nodes needs minutes);
    past it the round fails at once (not retried) naming the resources asked and available."""

    env_vars: list[str] = []
    """NAMES of environment variables copied from the driver's environment to every worker when its process starts
    (Ray's runtime_env), e.g. [HF_HOME, NCCL_SOCKET_IFNAME]. Ray writes runtime_env values into its own logs on each
    node: list credentials under `secret_env_vars`. UNIRL_HOME and HF_HUB_OFFLINE are always copied."""

    secret_env_vars: list[str] = []
    """NAMES of environment variables holding credentials (e.g. [AWS_SECRET_ACCESS_KEY]), set in every worker by a
    call before anything is built, never in Ray's runtime_env, logs or MLflow params. The names a recipe already
    gives (a remote scorer's `auth_header_env`) and MLFLOW_TRACKING_URI are always added."""

    working_dir: OptionalStr = None
    """A local folder Ray uploads to every worker and starts it in (on its `sys.path`), for code that is not
    installed on the nodes. Empty (the default and the advice for clusters): unirl installed on every node, e.g.
    in the cluster's container image."""

    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend: `auto` is nccl with GPUs, gloo without."""

    collective_timeout_s: Annotated[int, Field(ge=10)] = 300
    """Seconds a collective waits for a peer before failing (a lost rank then fails the round, which retries)."""

    round_timeout_s: Annotated[float, Field(gt=0)] = 6 * 3600
    """Deadline of one round, enforced inside it (Prefect's task timeout cannot stop Ray actors)."""

    def problems(self) -> Iterator[Problem]:
        yield from super().problems()
        gpus = self.gpus_per_worker
        if gpus != int(gpus):
            yield (
                "gpus_per_worker",
                gpus,
                f"a whole number (0, 1, 2, ...): each FSDP rank drives whole GPUs, and {gpus:g} GPU per worker "
                f"would have ranks share a GPU (NCCL refuses that); use 1 (or 0 to train on CPUs)",
            )
        for key in ("env_vars", "secret_env_vars"):
            for index, name in enumerate(getattr(self, key)):
                if not (name.isascii() and name.isidentifier()):
                    # it may be a secret pasted by mistake: never echo it
                    yield f"{key}.{index}", "<hidden>", "the NAME of an environment variable (letters, digits, _)"


class FSDPConfig(StrictModel):
    """How the trained module is sharded across the workers (FSDP2 `fully_shard`, block by block)."""

    mixed_precision: Literal["auto", "bf16", "none"] = "auto"
    """`auto`: bf16 compute with fp32 gradient reduction on CUDA, fp32 on CPU. `none`: compute in the parameters'
    dtype. A `bfloat16` model always computes in bf16 (on CPU too); trained parameters stay float32 in every case."""

    activation_checkpointing: bool = False
    """Recompute block activations in the backward pass (less memory, about a third more compute)."""

    reshard_after_forward: bool = False
    """FSDP2's setting inside one phase (a rollout's denoising steps, an evaluation, one optimizer step's forwards and
    backwards). false: each block is gathered once per phase and freed at its end (one all-gather per block, not one
    per forward and another per backward; the gathered trained module stays on each rank during the phase, as a
    replica would). true: freed after every forward (the least memory). The same numbers either way."""


class EMAConfig(StrictModel):
    """An exponential moving average of the trained weights, used for evaluation and export when set."""

    decay: Annotated[float, Field(gt=0, lt=1)] = 0.99
    """Shadow <- decay x shadow + (1 - decay) x weights."""

    interval: Annotated[Count, Field(ge=1)] = 1
    """Update the shadow every `interval` optimizer steps."""


class WarmupConfig(StrictModel):
    """Supervised warm-up before RL: the denoising (flow-matching) loss on precached (VAE latent, text
    conditioning) pairs, on the same workers and sharding. The recipe's `precache` section names the cache."""

    steps: Annotated[Count, Field(ge=0)] = 0
    """Warm-up optimizer steps (0: no warm-up)."""

    steps_per_round: Annotated[Count, Field(ge=1)] | None = None
    """Warm-up steps per round. Empty: all warm-up steps in one round."""

    batch_size: Annotated[Count, Field(ge=1)] = 8
    """Global: precached samples per step, split evenly over the workers."""

    micro_batch_size: Annotated[Count, Field(ge=1)] | None = None
    """Samples per forward/backward on each worker (gradient accumulation), to fit memory. Empty: a worker's whole
    share at once. It does not change the result: each sample's noise and timestep come from (seed, step, sample),
    so it may also change on resume."""

    learning_rate: Annotated[float, Field(gt=0)] = 1e-4
    """AdamW learning rate of the warm-up (constant)."""

    latent_key: str = "image_latent"
    """Encoding key of the VAE latents in the precache shards (a `PipelineImageEncoder` or `AutoencoderKLEncoder` of
    the trained model's VAE; for a video family, a `modality: video` encoding's [C, F, h, w] latents)."""

    text_key: str = "prompt_conditioning"
    """Encoding key of the text conditioning (a `PipelinePromptEncoder` of the trained model: exactly what rollouts
    compute)."""

    seed: Seed = 0
    """Seed of the epoch order and of the noise and timesteps drawn by the loss."""


class TrackingConfig(StrictModel):
    """MLflow tracking of training runs (one run per `output_dir`, found again on retry and resume)."""

    experiment: str = "unirl"
    """MLflow experiment name."""

    registered_model: str | None = None
    """Registered model name for the final adapter. Empty: `unirl-<recipe name>`."""

    alias: str = "candidate"
    """Alias set on the newly registered model version; a recipe's `promote` section (or `unirl promote`) moves
    `champion` to it when it beats the current champion."""


class CheckpointConfig(StrictModel):
    """How committed checkpoints are trusted on resume (each file's size and CRC-32 sit in the commit record)."""

    on_corrupt: Literal["fail", "previous"] = "fail"
    """A checkpoint file that no longer matches its recorded size or CRC-32 (a flipped byte, a truncated copy):
    `fail` stops with an error naming the file (exit 2); `previous` moves the damaged checkpoint aside to
    `step_N.corrupt` and resumes from the previous committed one (its steps are trained again)."""


class EvalSetConfig(StrictModel):
    """One prompt set evaluated during training."""

    prompts: str
    """A packaged set (`geneval`, `ocr`, `aesthetic`) or a prompt file (.txt, .jsonl, .json; GenEval's and
    flow_grpo's metadata files load as they are)."""

    name: OptionalStr = None
    """The set's name in metric keys (`eval/<name>/<reward>`). Empty: the packaged set's name, else the file's stem."""

    count: Annotated[Count, Field(ge=1)] | None = None
    """Evaluate the first N prompts only (file order). Empty: all of them."""

    def label(self) -> str:
        from pathlib import PurePath

        return self.name or PurePath(self.prompts).stem


class EvalGuardConfig(StrictModel):
    """A held-out metric that must not fall while the training reward rises (reward hacking)."""

    metric: str
    """`<set>/<reward>` of `train.eval` (a set's name and one of `train.eval.rewards`)."""

    tolerance: Annotated[float, Field(ge=0.0)] = 0.0
    """How far below its first evaluation (the weights before the first RL step) it may fall."""

    stop: bool = False
    """Stop the run at a breach (the breach's checkpoint committed, the run failed with the reason); else the breach
    is logged and shown and training goes on."""


class TrainEvalConfig(StrictModel):
    """Scored evaluation during RL: prompt sets generated with fixed noise per prompt (eta 0, the training's
    sampler) and scored by named rewards, before the first RL step, every `every` steps and after the last; each
    metric to MLflow as `reward/eval/<set>/<reward>` on the step axis with its per-prompt table."""

    every: Annotated[Count, Field(ge=1)]
    """Evaluate every N RL steps (and before the first, and after the last)."""

    sets: list[EvalSetConfig] = Field(min_length=1)
    """The prompt sets."""

    rewards: list[str] = Field(min_length=1)
    """Rewards scored (may differ from the training rewards: held-out judges). Model rewards take their settings
    from `train.reward`'s sections (e.g. `train.reward.pickscore`)."""

    steps: Annotated[Count, Field(ge=1)] | None = None
    """Denoising steps. Empty: `sampling.eval_num_inference_steps`, else `sampling.num_inference_steps`."""

    guidance: Annotated[float, Field(ge=0.0)] | None = None
    """Guidance scale. Empty: `sampling.eval_guidance_scale`, else `sampling.guidance_scale`."""

    batch_size: Annotated[Count, Field(ge=1)] = 8
    """Images a rank generates per forward pass."""

    best: OptionalStr = None
    """`<set>/<reward>` whose highest value names the best step. Empty: the first set's first reward."""

    guards: list[EvalGuardConfig] = []
    """Held-out metrics that must not fall while the training reward rises."""

    def metric_names(self) -> list[str]:
        return list(dict.fromkeys(f"{s.label()}/{r}" for s in self.sets for r in self.rewards))

    def best_metric(self) -> str:
        return self.best or self.metric_names()[0]

    def problems(self) -> Iterator[Problem]:
        yield from super().problems()
        labels = [s.label() for s in self.sets]
        for i, label in enumerate(labels):
            if "/" in label or not label:
                yield f"sets.{i}.name", label, "a name without '/' (it is a part of the metric keys)"
            elif labels.index(label) != i:
                yield f"sets.{i}.name", label, f"a name no other set has (set {labels.index(label)} is {label!r})"
        if len(set(self.rewards)) != len(self.rewards):
            yield "rewards", self.rewards, "each reward once"
        known = self.metric_names()
        named = [("best", self.best)] + [(f"guards.{i}.metric", g.metric) for i, g in enumerate(self.guards)]
        for path, metric in named:
            if metric is not None and metric not in known:
                yield path, metric, f"one of {known} (<set>/<reward>)"


def _shares_group_noise(name) -> bool:
    try:
        return isinstance(name, str) and algorithm_class(name).shares_group_noise
    except ValueError:  # an unknown name: the algorithm section's validation says so
        return False


class TrainConfig(StrictModel):
    """Training: the model, the data and sampling, the algorithm and the reward."""

    output_dir: OptionalStr = None
    """Folder for this training's checkpoints and samples (local path or fsspec URL). Empty: the workspace's
    `$UNIRL_HOME/outputs/<recipe name>`, filled in when the recipe is loaded. Recipes read it from `${env:OUTPUT_DIR,}`."""

    domain: Annotated[SerializeAsAny[DomainConfig], BeforeValidator(domain_config), SectionClass(section_class)] = (
        DomainConfig()
    )
    """What kind of model trains: `diffusion` (image diffusion, the default), or a domain of your own as
    `name: package.module:ClassName` with its own keys beside `name` (unirl_core/domains/base.py)."""

    data: DataConfig = DataConfig()
    """Prompt data source and rollout batch size."""

    sampling: SamplingConfig = SamplingConfig()
    """Sampling settings shared by every rollout."""

    model: ModelConfig = ModelConfig()
    """The generator and its LoRA."""

    algorithm: AlgorithmSection = Field(default_factory=lambda: algorithm_config({}))
    """GRPO settings."""

    reward: RewardConfig = RewardConfig()
    """Reward weights and guards."""

    steps: Annotated[Count, Field(ge=1)] = 10
    """RL steps (rollout -> reward -> advantage -> update) of the whole run (the LR schedule spans them)."""

    deterministic: bool = False
    """CUDA determinism on every rank (cuBLAS workspace `:4096:8`, deterministic algorithms, cuDNN autotuning off):
    bitwise-repeatable GPU steps at the cost of slower kernels (unirl_core/worker/determinism.py). CPU runs are
    deterministic either way."""

    steps_per_round: Annotated[Count, Field(ge=1)] | None = None
    """RL steps per training round (one retryable Prefect task). Empty: all steps in one round."""

    checkpoint_every: Annotated[Count, Field(ge=0)] = 0
    """Commit a checkpoint every N steps inside a round (0: only at each round's end, which always commits)."""

    keep_checkpoints: Annotated[Count, Field(ge=2)] = 2
    """Committed checkpoints kept (>= 2: the previous one survives a failed write of the next)."""

    checkpoint: CheckpointConfig = CheckpointConfig()
    """What a resume does with a damaged checkpoint."""

    eval_every_rounds: Annotated[Count, Field(ge=0)] = 0
    """Evaluate every N RL rounds (and after the last): deterministic sampling (eta 0) of the eval prompts
    (`data.eval_data_path`, else the first prompts of the source) with noise fixed per prompt, one image grid."""

    eval_prompts: Annotated[Count, Field(ge=1)] = 4
    """How many eval prompts are sampled (the first N)."""

    grid_prompts: Annotated[Count, Field(ge=1)] = 4
    """The round's sample grid (its last step's images): the first N prompts of the step ..."""

    grid_images_per_prompt: Annotated[Count, Field(ge=1)] = 4
    """... and the first K samples of each. Only these images leave the ranks (a step's images stay there)."""

    eval: TrainEvalConfig | None = None
    """Scored evaluation of prompt sets during RL (metrics `eval/<set>/<reward>`, in MLflow `reward/eval/<set>/<reward>`, the best step, guards). Empty:
    none."""

    ema: EMAConfig | None = None
    """EMA of the trained weights for evaluation and export. Empty: none."""

    warmup: WarmupConfig = WarmupConfig()
    """Supervised warm-up rounds before RL (off while `warmup.steps` is 0)."""

    ray: RayConfig = RayConfig()
    """The Ray cluster and worker group of each round."""

    fsdp: FSDPConfig = FSDPConfig()
    """FSDP2 sharding of the trained module."""

    tracking: TrackingConfig = TrackingConfig()
    """MLflow experiment and model registry."""

    @model_validator(mode="before")
    @classmethod
    def _shared_noise_preset(cls, data):
        """Algorithms that share the initial noise within a group (MixGRPO, DanceGRPO) set it unless the recipe says
        otherwise."""
        algorithm = data.get("algorithm") if isinstance(data, dict) else None
        if isinstance(algorithm, dict) and _shares_group_noise(algorithm.get("name", "grpo")):
            sampling = data.get("sampling", {})
            if isinstance(sampling, dict):
                data = {**data, "sampling": {"share_group_noise": True, **sampling}}
        return data

    def eval_reward(self) -> RewardConfig:
        """The reward settings of `eval`: its rewards, each alone (weight 1, no guards), the model rewards' folders
        from `reward`."""
        rewards = self.eval.rewards if self.eval else []
        return RewardConfig.model_validate(
            self.reward.model_dump() | {"weights": dict.fromkeys(rewards, 1.0), "guards": [], "placement": "colocated"}
        )

    def _eval_reward_problems(self) -> Iterator[Problem]:
        """`eval.rewards` by index (unknown names, plugins that do not import), and the model rewards' folders they
        need under `reward` (those the training rewards do not report already)."""
        index = {name: i for i, name in enumerate(self.eval.rewards)}
        reported = {path for path, _, _ in self.reward.problems()}
        for path, bad, message in self.eval_reward().problems():
            if path.startswith("weights."):
                yield f"eval.rewards.{index[path.removeprefix('weights.')]}", bad, message
            elif path not in reported and path != "weights":
                yield f"reward.{path}", bad, message.replace("is weighted or a guard", "is in train.eval.rewards")

    def problems(self) -> Iterator[Problem]:
        yield from super().problems()
        yield from domain_class(self.domain.name).config_problems(self)
        if self.eval is not None:
            yield from self._eval_reward_problems()
        for path, bad, fix in algorithm_class(self.algorithm.name).config_problems(self.algorithm):
            yield f"algorithm.{path}", bad, fix
        if self.algorithm.beta > 0 and self.model.lora is None:
            yield (
                "algorithm.beta",
                self.algorithm.beta,
                "0 with full fine-tuning (model.lora: null): the KL reference is the model with its LoRA adapter "
                "disabled, so a KL term needs LoRA",
            )
        if self.reward.normalize != "total" and self.algorithm.std_mode == "per_prompt":
            yield (
                "reward.normalize",
                self.reward.normalize,
                "total with algorithm.std_mode: per_prompt (the per-prompt tracker remembers one reward per prompt), "
                f"or keep {self.reward.normalize} with std_mode group or batch",
            )
        if self.reward.normalize == "advantage_aggr" and sum(self.reward.weights.values()) <= 0:
            yield "reward.normalize", "advantage_aggr", "total or per_reward: the weights sum to 0 or less"
        window, steps = self.algorithm.sde_window, self.sampling.num_inference_steps
        if window is not None and not algorithm_class(self.algorithm.name).likelihood_free:
            from unirl_core.domains.diffusion.rollout.step_plan import window_end

            end = window_end(self.algorithm, steps)
            shrinks = window.mode == "sliding" and window.tail == "shrink"  # only its first position must fit
            if end > steps:
                yield "algorithm.sde_window.end", window.end, f"at most sampling.num_inference_steps={steps}"
            elif shrinks and window.start >= end:
                yield "algorithm.sde_window.start", window.start, f"below the windows' end {end} of {steps} steps"
            elif not shrinks and window.start + window.size > end:
                yield (
                    "algorithm.sde_window.size",
                    window.size,
                    f"at most end - start = {end} - {window.start} = {end - window.start} (the window must fit "
                    f"in steps [{window.start}, {end}) of {steps})",
                )

    def distributed_problems(self) -> Iterator[Problem]:
        """Checked by training rounds (not `--local`): the global batch must split over the workers with groups
        whole and equal shares (FSDP needs every rank to run the same number of forward passes)."""
        workers = self.ray.workers
        prompts, group = self.data.prompts_per_rollout, self.sampling.samples_per_prompt
        if prompts % workers:
            yield (
                "data.prompts_per_rollout",
                prompts,
                f"a multiple of ray.workers={workers}: {prompts} prompts x {group} samples = {prompts * group} "
                f"samples, but a GRPO group is never split, so {prompts} groups must divide over {workers} workers "
                f"({prompts} % {workers} = {prompts % workers})",
            )
            return
        per_rank = prompts * group // workers
        updates = self.algorithm.num_updates_per_batch
        if per_rank % updates:
            yield (
                "algorithm.num_updates_per_batch",
                updates,
                f"a divisor of the {per_rank} samples per worker ({prompts} prompts x {group} samples / {workers} "
                f"workers), so every update gets an equal mini-batch",
            )
        if self.warmup.steps and self.warmup.batch_size % workers:
            batch = self.warmup.batch_size
            yield (
                "warmup.batch_size",
                batch,
                f"a multiple of ray.workers={workers} ({batch} % {workers} = {batch % workers})",
            )


class GateMetric(StrictModel):
    """One metric of the promotion gate: a reward the candidate must win on."""

    reward: str
    """A reward name (as in `train.reward.weights`): scored on both models with the same prompts and noise."""

    margin: Annotated[float, Field(ge=0.0)] = 0.0
    """The candidate wins when the lower bound of the paired difference's 95 % interval (candidate - champion)
    is above this: ahead by more than `margin`, with 95 % confidence."""


class PromoteConfig(StrictModel):
    """Champion/challenger: after training, the version with `candidate_alias` is evaluated against the version with
    `champion_alias` (`unirl eval --against`) and becomes champion only when it wins on every gate metric; else it
    stays candidate with the reason on the version. The first version, with no champion to beat, becomes champion."""

    model_name: OptionalStr = None
    """The registered model. Empty: the training's (`train.tracking.registered_model`, else `unirl-<recipe name>`)."""

    prompts: OptionalStr = None
    """The prompt file both versions generate for. Empty: `train.data.eval_data_path`."""

    gate: list[GateMetric] = Field(min_length=1)
    """The metrics the candidate must win on, every one."""

    report: list[str] = []
    """Rewards scored and recorded beside the gate but not gated (held-out judges, guards)."""

    candidate_alias: str = "candidate"
    """The alias of the version to judge (training sets it: `train.tracking.alias`)."""

    champion_alias: str = "champion"
    """The alias of the version in use, moved to the candidate when it wins."""

    steps: Annotated[Count, Field(ge=1)] | None = None
    """Denoising steps. Empty: the candidate's recipe's evaluation steps."""

    guidance: Annotated[float, Field(ge=0.0)] | None = None
    """Guidance scale. Empty: the candidate's recipe's evaluation guidance."""

    seed: Seed | None = None
    """Noise seed. Empty: the candidate's recipe's `sampling.seed`."""

    shard_size: Annotated[Count, Field(ge=1)] = 16
    """Prompts per evaluation task (the unit a re-run skips)."""

    batch_size: Annotated[Count, Field(ge=1)] = 4
    """Images generated per forward pass."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where both versions generate and are scored (`auto`: CUDA when there is one)."""


class Recipe(StrictModel):
    """A unirl recipe: any of the four stages, each optional."""

    name: str | None = None
    """Short name of the recipe, used in run names. Empty: the recipe file's stem."""

    description: str | None = None
    """Free text shown by `unirl validate`."""

    ingest: IngestConfig | None = None
    """Dataset ingest: parquet to WebDataset shards."""

    precache: PrecacheConfig | None = None
    """Encoding precache: frozen encoders to embedding shards."""

    train: TrainConfig | None = None
    """Training rounds: supervised warm-up, then RL."""

    promote: PromoteConfig | None = None
    """The promotion gate after training: the new version becomes champion only when it beats the current one."""

    def problems(self) -> Iterator[Problem]:
        yield from super().problems()
        if self.promote is None:
            return
        from unirl_core.rewards.names import builtin_names, is_plugin

        known = builtin_names() | set(self.train.reward.remote if self.train else {})
        names = [(f"promote.gate.{i}.reward", m.reward) for i, m in enumerate(self.promote.gate)]
        names += [(f"promote.report.{i}", name) for i, name in enumerate(self.promote.report)]
        for path, name in names:
            if not is_plugin(name) and name not in known:
                yield path, name, f"an unknown reward: choose one of {sorted(known)}"
