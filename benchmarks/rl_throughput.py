"""One GRPO step on an SD3.5-medium-shaped (or, `--model flux1-dev`, a FLUX.1-dev-shaped) transformer vs the bare
diffusers pipeline generating the same images.

    .venv/bin/python benchmarks/rl_throughput.py            # CPU: a scaled-down shape (2 blocks, 128 px, 4 steps)
    .venv/bin/python benchmarks/rl_throughput.py --full     # GPU: the real shape, 512 px, 10 steps, bf16
    .venv/bin/python benchmarks/rl_throughput.py --full --deterministic   # the cost of train.deterministic
    .venv/bin/python benchmarks/rl_throughput.py --smoke    # seconds: 1 block x 2 heads, 32 px, 2 steps, 2 images

The transformer is SD3.5-medium's published config (`real_sizes.VARIANTS["sd3.5-medium"]`: 24 blocks x 1536 wide,
dual attention in the first 13, 2.5 B parameters) with random weights; `--full` keeps it whole, the CPU default keeps
its width and cuts the depth (`--layers`). Only the transformer matters: the text encoders are tiny (byte-level
tokenizers, 1-2 layers) but give conditioning of the real shape (CLIP 77 + T5 256 tokens, 4096 wide; pooled 2048),
and the VAE is a tiny 16-channel one with SD3's 8x downsampling. LoRA r32 / alpha 64 on Flow-GRPO's SD3 targets,
CFG 4.5, SDE noise 0.7, jpeg_compressibility, 2 updates per rollout.

A step's phases (the first step is a warm-up and is not counted; each phase's figure is its fastest of the counted
steps, `--steps`, since other work on a shared machine only adds time):
  rollout  encode prompts, denoise with per-step log-probs (every step but the last stochastic), decode
  reward   jpeg_compressibility on the decoded images, advantages
  pi_old   the log-probs of pi_old recomputed at the training geometry (TrainStack.prepare)
  train    the PPO-clip updates (forward + backward on every trained step, optimizer steps)
and the limit: `StableDiffusion3Pipeline.__call__` (the same pipeline object, so the same LoRA'd transformer, text
encoders and VAE) generating the same number of images at the same size, steps and guidance, decoded to PIL like the
rollout. Peak memory: `torch.cuda.max_memory_allocated` per phase on a GPU; the process's peak RSS on a CPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from unirl_core.algorithms.advantages import PerPromptStatTracker, compute_advantages  # noqa: E402
from unirl_core.config import recipe_from_tree  # noqa: E402
from unirl_core.data.grpo_groups import expand_groups  # noqa: E402
from unirl_core.data.sources import build_source  # noqa: E402
from unirl_core.domains.diffusion.rollout.rollout import run_rollout  # noqa: E402
from unirl_core.domains.diffusion.stack import TrainStack  # noqa: E402
from unirl_core.models.real_sizes import VARIANTS  # noqa: E402
from unirl_core.models.registry import build_family  # noqa: E402
from unirl_core.rewards.service import RewardService  # noqa: E402
from unirl_core.worker.determinism import apply_determinism  # noqa: E402

# Flow-GRPO's SD3 LoRA (scripts/train_sd3.py), as in unirl_core/recipes/sd35_medium_grpo.yaml
LORA_TARGETS = ["attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out", "attn.to_k",
                "attn.to_out.0", "attn.to_q", "attn.to_v"]  # fmt: skip
PHASES = ("rollout", "reward", "pi_old", "train")


def transformer_config(layers: int | None, size: int, heads: int | None = None) -> dict:
    """SD3.5-medium's transformer config, `layers` blocks deep (None: all 24) and `heads` of 64 wide (None: its 24,
    1536 wide); the position-embedding table cut to what `size` px needs when the depth is cut (it is a buffer of
    384^2 x 1536 floats otherwise)."""
    config = dict(VARIANTS["sd3.5-medium"]["components"]["transformer"][3])
    if heads is not None:
        config["num_attention_heads"] = heads
        config["caption_projection_dim"] = heads * config["attention_head_dim"]
    if layers is not None:
        config["num_layers"] = layers
        config["dual_attention_layers"] = [i for i in config["dual_attention_layers"] if i < layers]
        config["pos_embed_max_size"] = size // 16
        config["sample_size"] = size // 8
    return config


def wide_t5(vocab_size: int):
    """A one-layer T5 encoder giving the real T5-XXL conditioning width (4096)."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=vocab_size, d_model=4096, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                   relative_attention_num_buckets=8, decoder_start_token_id=0))  # fmt: skip


def vae16(scaling_factor: float, shift_factor: float):
    """A tiny 16-channel VAE with the real 8x downsampling and the family's latent scaling and shift."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
        block_out_channels=[8, 8, 16, 16], layers_per_block=1, latent_channels=16, norm_num_groups=4,
        scaling_factor=scaling_factor, shift_factor=shift_factor, use_quant_conv=False, use_post_quant_conv=False,
    )  # fmt: skip


def write_pipeline(folder: Path, layers: int | None, size: int, device: str, dtype: torch.dtype,
                   heads: int | None = None) -> int:  # fmt: skip
    """An SD3 pipeline folder: the SD3.5-medium-shaped transformer (random weights, saved in `dtype`; `heads`
    narrows it), tiny text encoders with the real conditioning widths, a tiny 16-channel VAE. Returns the
    transformer's parameter count."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import ByT5Tokenizer, CLIPTextConfig, CLIPTextModelWithProjection

    from unirl_core.models.tiny import CLIP_MAX_LENGTH, byte_level_clip_tokenizer

    torch.manual_seed(0)
    with torch.device(device):  # random init of 2.5 B parameters is minutes on a CPU, seconds on a GPU
        transformer = SD3Transformer2DModel(**transformer_config(layers, size, heads)).to(dtype)
    clip_tokenizer, t5_tokenizer = byte_level_clip_tokenizer(), ByT5Tokenizer()

    def clip(projection_dim: int):  # SD3's pooled vector: the two CLIP projections concatenated, 768 + 1280
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=len(clip_tokenizer), hidden_size=32, intermediate_size=37, num_hidden_layers=1,
            num_attention_heads=4, max_position_embeddings=CLIP_MAX_LENGTH, projection_dim=projection_dim,
            bos_token_id=0, eos_token_id=1, pad_token_id=1))  # fmt: skip

    t5, vae = wide_t5(len(t5_tokenizer)), vae16(scaling_factor=1.5305, shift_factor=0.0609)
    pipeline = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=clip(768), tokenizer=clip_tokenizer, text_encoder_2=clip(1280),
        tokenizer_2=byte_level_clip_tokenizer(), text_encoder_3=t5, tokenizer_3=t5_tokenizer,
    )  # fmt: skip
    pipeline.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in transformer.parameters())


def write_flux_pipeline(folder: Path, layers: int | None, size: int, device: str, dtype: torch.dtype,
                        heads: int | None = None) -> int:  # fmt: skip
    """A FLUX.1-dev pipeline folder: the published transformer (19 double + 38 single blocks x 3072 wide, 11.9 B
    parameters, guidance-embedded; `layers` cuts both stacks, `heads` of 128 narrows it), tiny text encoders with
    the real widths (CLIP pooled 768, T5 4096), a tiny 16-channel VAE with FLUX's 8x downsampling. Returns the
    transformer's parameter count."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import ByT5Tokenizer, CLIPTextConfig, CLIPTextModel

    from unirl_core.models.families.flux.tiny import DEV_SCHEDULER
    from unirl_core.models.registry import family_class
    from unirl_core.models.tiny import CLIP_MAX_LENGTH, byte_level_clip_tokenizer

    config = dict(family_class("flux").denoiser_configs["flux1-dev"])
    if layers is not None:
        config |= {"num_layers": layers, "num_single_layers": layers}
    if heads is not None:
        config["num_attention_heads"] = heads
    torch.manual_seed(0)
    with torch.device(device):
        transformer = FluxTransformer2DModel(**config).to(dtype)
    clip_tokenizer = byte_level_clip_tokenizer()
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(clip_tokenizer), hidden_size=768, intermediate_size=37, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=CLIP_MAX_LENGTH, bos_token_id=0, eos_token_id=1,
        pad_token_id=1))  # fmt: skip
    t5_tokenizer = ByT5Tokenizer(model_max_length=512)
    t5, vae = wide_t5(len(t5_tokenizer)), vae16(scaling_factor=0.3611, shift_factor=0.1159)
    pipeline = FluxPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(**DEV_SCHEDULER),
                            vae=vae, text_encoder=clip, tokenizer=clip_tokenizer, text_encoder_2=t5,
                            tokenizer_2=t5_tokenizer)  # fmt: skip
    pipeline.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in transformer.parameters())


def lora_targets(model: str) -> list[str]:
    """Flow-GRPO's LoRA targets of the model's family (SD3's in this file; the family class's `lora_targets`)."""
    from unirl_core.models.registry import family_class

    family, _, targets, *_ = MODELS[model]
    return list(targets or family_class(family).lora_targets)


MODELS = {  # --model: (family, pipeline writer, LoRA targets, guidance_scale, blocks at full depth)
    "sd3.5-medium": ("sd3", write_pipeline, LORA_TARGETS, 4.5, "24 blocks x 1536"),
    "flux1-dev": ("flux", write_flux_pipeline, None, 3.5, "19 double + 38 single blocks x 3072"),
}


def recipe(path: str, args) -> object:
    return recipe_from_tree({"train": {
        "data": {"source": "smoke", "prompts_per_rollout": args.prompts},
        "sampling": {"samples_per_prompt": args.group, "num_inference_steps": args.inference_steps,
                     "guidance_scale": MODELS[args.model][3], "height": args.size, "width": args.size},
        "model": {"family": MODELS[args.model][0], "path": path, "dtype": args.dtype,
                  "lora": {"rank": 32, "alpha": 64, "target_modules": lora_targets(args.model)}},
        "algorithm": {"eta": 0.7, "timestep_fraction": 0.99, "learning_rate": 3e-4, "std_mode": "batch",
                      "num_updates_per_batch": 2, "micro_batch_size": args.micro_batch},
        "steps": args.steps + 1,
    }}).train  # fmt: skip


class Meter:
    """Seconds and peak memory of named phases (peak device memory on CUDA, the process's peak RSS on CPU)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.seconds: dict[str, float] = {}
        self.peak_gib: dict[str, float] = {}

    def start(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        return time.perf_counter()

    def stop(self, name: str, started: float) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**30
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
        self.peak_gib[name] = max(self.peak_gib.get(name, 0.0), peak)


def grpo_step(adapter, stack, source, rewards, tracker, config, step: int, meter: Meter) -> None:
    """One GRPO step with its phases timed: rollout, reward + advantages, pi_old, train."""
    group, algorithm = config.sampling.samples_per_prompt, config.algorithm
    samples = expand_groups(source.next_batch(), group, first_group_id=step * config.data.prompts_per_rollout)
    started = meter.start()
    rollout = run_rollout(adapter, samples, config.sampling, algorithm, seed=config.sampling.seed + step, step=step)
    meter.stop("rollout", started)
    started = meter.start()
    prompts = [s.example.prompt for s in samples]
    scores = rewards.score(rollout.images, prompts, [s.sample_id for s in samples])
    advantages, _ = compute_advantages(algorithm, tracker, prompts, scores["total"], group)
    meter.stop("reward", started)
    prepare = stack.prepare

    def timed_prepare(rollout_, *args, **kwargs):  # TrainStack.train recomputes pi_old first: time it apart
        began = meter.start()
        logp_old = prepare(rollout_, *args, **kwargs)
        meter.stop("pi_old", began)
        return logp_old

    stack.prepare = timed_prepare
    started = meter.start()
    stack.train(rollout, advantages, step)
    meter.stop("train", started)
    stack.prepare = prepare
    meter.seconds["train"] -= meter.seconds["pi_old"]  # a Meter per step: train is the updates alone


def bare_pipeline(adapter, config, step: int, meter: Meter) -> None:
    """The limit: diffusers' own sampling loop on the same pipeline, the same number of images, decoded to PIL."""
    sampling = config.sampling
    prompts = [f"a photo of object {i}" for i in range(config.data.prompts_per_rollout)]
    generator = torch.Generator(device=adapter.device).manual_seed(step)
    started = meter.start()
    with torch.no_grad():
        adapter.pipeline(
            prompt=prompts, num_images_per_prompt=sampling.samples_per_prompt,
            num_inference_steps=sampling.num_inference_steps, guidance_scale=sampling.guidance_scale,
            height=sampling.height, width=sampling.width, generator=generator, output_type="pil",
        )  # fmt: skip
    meter.stop("bare", started)


def measure(path: str, args) -> tuple[dict, dict, int]:
    """Seconds per phase (the fastest of the counted steps: other work on a shared machine only adds time), peak GiB
    per phase, images per step."""
    config = recipe(path, args)
    torch.manual_seed(config.sampling.seed)
    adapter = build_family(config.model, config.sampling, device=args.device)
    source = build_source(config.data)
    rewards = RewardService.from_config(config.reward, device=args.device)
    stack = TrainStack(adapter, config.algorithm, total_updates=config.steps * config.algorithm.num_updates_per_batch)
    tracker = PerPromptStatTracker(config.algorithm.tracker_buffer_size, config.algorithm.tracker_min_count)
    rows = []
    for step in range(config.steps):
        meter = Meter(args.device)
        bare_pipeline(adapter, config, step, meter)
        grpo_step(adapter, stack, source, rewards, tracker, config, step, meter)
        rows.append(meter)
        print(f"  step {step}{' (warm-up)' if step == 0 else ''}: "
              + ", ".join(f"{k} {v:.2f} s" for k, v in meter.seconds.items()), flush=True)  # fmt: skip
    counted = rows[1:]
    seconds = {k: min(m.seconds[k] for m in counted) for k in (*PHASES, "bare")}
    peaks = {k: max(m.peak_gib[k] for m in rows) for k in (*PHASES, "bare")}
    return seconds, peaks, config.data.prompts_per_rollout * config.sampling.samples_per_prompt


def report(seconds: dict, peaks: dict, images: int, args) -> None:
    step = sum(seconds[k] for k in PHASES)
    memory = "peak allocated GiB" if args.device.startswith("cuda") else "peak RSS GiB (process, so far)"
    print(f"\n{images} images a step, {args.size} px, {args.inference_steps} steps, guidance {MODELS[args.model][3]}, LoRA r32, "
          f"{args.dtype}, "
          f"{args.device}, torch threads {torch.get_num_threads()}, deterministic {args.deterministic}")  # fmt: skip
    print(f"{'phase':<16} {'s':>8} {'share':>6} {'img/s':>7} {memory:>28}")
    for name in PHASES:  # images/s of the rollout alone: the other phases make no images
        rate = f"{images / seconds[name]:.2f}" if name == "rollout" else "-"
        print(f"{name:<16} {seconds[name]:>8.2f} {seconds[name] / step:>6.0%} {rate:>7} {peaks[name]:>28.2f}")
    print(f"{'GRPO step':<16} {step:>8.2f} {'100%':>6} {images / step:>7.2f} {max(peaks[k] for k in PHASES):>28.2f}")
    print(f"{'bare pipeline':<16} {seconds['bare']:>8.2f} {'':>6} {images / seconds['bare']:>7.2f} "
          f"{peaks['bare']:>28.2f}")  # fmt: skip
    ratio = seconds["bare"] / seconds["rollout"]
    print(f"\nrollout images/s vs the bare pipeline's: {ratio:.2f}x (goal >= 0.90x); "
          f"a whole GRPO step: {seconds['bare'] / step:.2f}x the bare pipeline's images/s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the real shape: 24 blocks, 512 px, 10 steps, bf16, cuda")
    parser.add_argument("--device", default=None, help="default: cuda with --full, else cpu")
    parser.add_argument("--layers", type=int, default=None, help="transformer blocks (default: 24 with --full, else 2)")
    parser.add_argument("--steps", type=int, default=None, help="counted steps after the warm-up (default 2)")
    parser.add_argument("--deterministic", action="store_true", help="train.deterministic's settings (their cost)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file (gpu_check)")
    parser.add_argument("--model", default="sd3.5-medium", choices=sorted(MODELS), help="the transformer's shape")
    parser.add_argument("--smoke", action="store_true", help="seconds: 1 block x 2 heads, 32 px, 2 steps, 1 prompt x "
                        "2 images, 1 counted step (make test's)")  # fmt: skip
    args = parser.parse_args()
    if args.smoke and args.full:
        parser.error("--smoke and --full: choose one")
    apply_determinism(args.deterministic)  # before the first cuBLAS call, as at a rank's setup
    full = args.full
    args.device = args.device or ("cuda" if full else "cpu")
    args.layers = args.layers if args.layers is not None else (None if full else 2)
    args.steps = args.steps or 2
    args.size, args.inference_steps = (512, 10) if full else (128, 4)
    args.prompts, args.group = (2, 8) if full else (2, 2)  # 16 images a step per device (the goal), CPU 4
    args.micro_batch = 4 if full else 2  # per forward: x2 rows with CFG
    args.heads = None  # the model's own width
    if args.smoke:
        args.layers, args.heads, args.steps, args.size, args.inference_steps, args.prompts = 1, 2, 1, 32, 2, 1
    args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    import diffusers
    import huggingface_hub.utils
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        _, writer, _, _, blocks = MODELS[args.model]
        params = writer(Path(tmp), args.layers, args.size, args.device, getattr(torch, args.dtype), args.heads)
        depth = f"{args.layers} blocks (of {blocks})" if args.layers else blocks
        depth += f", {args.heads} heads" if args.heads else ""
        print(f"{args.model}-shaped transformer: {depth}, {params / 1e6:.0f} M parameters "
              f"(built and saved in {time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
        seconds, peaks, images = measure(tmp, args)
    report(seconds, peaks, images, args)
    if args.json:
        shape = {
            "prompts": args.prompts,
            "group": args.group,
            "inference_steps": args.inference_steps,
            "size": args.size,
            "dtype": args.dtype,
            "micro_batch": args.micro_batch,
            "lora_targets": lora_targets(args.model),
            "model": args.model,
            "family": MODELS[args.model][0],
            "guidance_scale": MODELS[args.model][3],
        }
        step = sum(seconds[k] for k in PHASES)
        args.json.write_text(json.dumps({
            "device": args.device, "shape": shape, "seconds": seconds, "peak_gib": peaks, "images": images,
            "rollout_images_per_s": images / seconds["rollout"], "step_images_per_s": images / step,
            "rollout_vs_bare": seconds["bare"] / seconds["rollout"],
        }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
