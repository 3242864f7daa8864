"""One GRPO step of unirl's autoregressive domain vs TRL's `GRPOTrainer` (TRL 1.16.0, transformers 5.24) on the same
causal LM, prompts and settings, side by side in one process, on CPU.

    .venv/bin/python benchmarks/ar_grpo.py [--model small] [--steps 6] [--skip 1] [--prompts 4] [--group 8]
                                           [--max-new-tokens 64] [--micro-batch 8] [--threads 1]
    .venv/bin/python benchmarks/ar_grpo.py --model mid          # a wider, deeper shape (slower)
    .venv/bin/python benchmarks/ar_grpo.py --smoke              # seconds: the tiny model, 1 counted step (the test's)

The model is a Qwen3 with random weights built from config in a temporary folder (the byte-level tokenizer of
`unirl_core.models.tiny_vlm.tiny_qwen_tokenizer`, 266 tokens): `tiny` is `tiny:qwen3` (hidden 64, 2 layers),
`small` hidden 256 x 4 layers (the default), `mid` hidden 512 x 8 layers. Both sides load the same folder in float32
(the same initial weights) and train every weight (no LoRA).

The same settings on both sides: the arithmetic prompts ("3+4=", as they are: no chat template; `--prompts` per step)
x `--group` completions each, at most `--max-new-tokens` tokens, temperature 1, top-p 1, no top-k; the same trivial
reward (the fraction of digits in the completion); group advantages (the group's N - 1 std, eps 1e-4); GRPO's loss
(each completion's token mean, then the mean over completions: unirl `token_grpo`, TRL `loss_type="grpo"`), clip 0.2,
beta 0 (no KL: no reference forward), one update per rollout (unirl `num_updates_per_batch: 1`; TRL `num_iterations=1`
and `steps_per_generation` = `gradient_accumulation_steps`, so neither recomputes pi_old: the first forward's own
log-probs, detached, are the old ones), one optimizer step per GRPO step over the whole batch, accumulated in
micro-batches of `--micro-batch` completions (unirl `micro_batch_size`; TRL `per_device_train_batch_size`, with
`gradient_accumulation_steps` = batch / micro-batch), torch.optim.AdamW (no weight decay, betas 0.9/0.999, eps 1e-8;
TRL `optim="adamw_torch"`), learning rate 1e-6 constant (TRL `lr_scheduler_type="constant"`), gradient clipping at 1,
no activation checkpointing (TRL's GRPOConfig defaults to it: turned off), float32 (TRL `bf16=False`), CPU (TRL
`use_cpu=True`), `torch.set_num_threads(--threads)` for both (1 by default: on a machine other processes share,
OpenMP threads waiting for each other slow these small operations tens of times). TRL runs with logging, saving, tqdm
and completion logging off (`report_to="none"`).

unirl is driven in-process the way a rank runs a step (unirl_core/worker/worker.py on one rank, which leaves the model
unwrapped by FSDP2): the source's prompts, `ARDomain.rollout` (`LMPolicy.generate`), the reward, `group_advantages`,
`TokenStack.train`. TRL runs `trainer.train()` for `--steps` steps (`max_steps`), timed by a callback at each step's
end and by timers around its methods. The two sides alternate step by step: TRL's step-end callback runs unirl's step
of the same index, outside TRL's timing, so a machine whose load drifts slows both alike. A TRL step's time is the
wall time from the previous step's end (after that callback) to this one's (the Trainer's loop included: batch fetch,
its log/save checks); unirl's from fetching the prompts to the end of `TokenStack.train`. The first `--skip` steps
are warm-up and not counted; each figure is the fastest of the counted steps (other work on a shared machine only
adds time). Phases of a step:

  generation       unirl `ARDomain.rollout` (tokenize, sample with a KV cache, decode); TRL `_generate` (tokenize,
                   `model.generate`, decode)
  old/ref logp     the no-grad log-prob passes inside the step (unirl `TokenStack._logp`, TRL's no-grad
                   `_get_per_token_logps_and_entropies`): none with these settings on either side, so 0
  reward + adv     unirl the reward and `group_advantages`; TRL the rest of `_generate_and_score_completions`
                   (padding, rewards, advantages, its metrics)
  update           the rest of the step: forward + backward of every micro-batch, clipping, the optimizer step,
                   the loop's bookkeeping (TRL: the Trainer's loop and callbacks)

and, outside the steps, one no-grad log-prob pass over the last step's batch in micro-batches (what pi_old or a
reference would cost: unirl `TokenStack._logp`, TRL `_get_per_token_logps_and_entropies(batch_size=micro-batch)`),
the fastest of 3. Generated tokens: the completions' tokens up to and including their end (mask sum) per step.
Ratios: unirl / TRL for throughput, TRL / unirl for time: > 1 means unirl is faster.

Not identical: (1) the draws: each side samples with its own RNG (unirl a generator per completion seeded from
(seed, step, sample id); TRL the global torch RNG inside `generate`), so the completions, their lengths and the
rewards differ: with random weights the end token is drawn about once in 266 tokens, so the mean lengths differ a
few per cent (the table shows them; tokens/s divides by each side's own tokens, and a batch's decode runs to its
longest completion, nearly always `--max-new-tokens` on both sides). (2) Prompt order: unirl takes the arithmetic
source's shuffled batches, TRL's RepeatSampler draws its own; every prompt is 4 tokens, so the shapes are the same.
(3) unirl clips advantages to +-5 (`adv_clip`); TRL does not clip (no speed effect). (4) Each side's own
implementation of the same computation, which is what is measured: TRL's log-probs come from its fused LM head
(`add_fused_lm_head`, tiled, without the full logits), its model is in train mode (no dropout in Qwen3: the same
function), and it generates with `transformers`' `generate`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad=True")  # TokenStack's loss metric
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")  # TRL on transformers 5.24

SHAPES = {  # name -> (hidden, layers, heads, kv heads, head dim, MLP); None: tiny:qwen3 itself
    "tiny": None,
    "small": (256, 4, 8, 4, 32, 768),
    "mid": (512, 8, 8, 4, 64, 1536),
}
LEARNING_RATE = 1e-6  # small: the sampling distribution (and so the completion lengths) stays put over the steps
PHASES = ("generation", "old_ref_logp", "reward_adv", "update")


def build_model(name: str, folder: Path) -> int:
    """Write the Qwen3 of shape `name` (random weights, seed 0) with the tiny tokenizer to `folder`; its parameters."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from unirl_core.models.tiny_lm import write_tiny_lm
    from unirl_core.models.tiny_vlm import tiny_qwen_tokenizer

    if SHAPES[name] is None:
        write_tiny_lm(folder)
    else:
        hidden, layers, heads, kv_heads, head_dim, mlp = SHAPES[name]
        tokenizer = tiny_qwen_tokenizer()
        pad_id, eos_id = (tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>"))
        config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=mlp,
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             head_dim=head_dim, max_position_embeddings=512, tie_word_embeddings=False,
                             bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)  # fmt: skip
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = Qwen3ForCausalLM(config)
        model.generation_config.eos_token_id = eos_id
        model.generation_config.pad_token_id = pad_id
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters())


def digit_fraction(texts: list[str]) -> list[float]:
    """The trivial reward of both sides: the share of a completion's characters that are digits."""
    return [sum(c.isdigit() for c in t) / len(t) if t else 0.0 for t in texts]


def trl_digit_fraction(completions, **kwargs) -> list[float]:
    return digit_fraction(completions)


def fastest(steps: list[dict], skip: int) -> dict:
    """Each figure's fastest over the counted steps (the tokens and lengths: their mean)."""
    counted = steps[skip:]
    row = {k: min(s[k] for s in counted) for k in ("step", *PHASES)}
    row["tokens"] = sum(s["tokens"] for s in counted) / len(counted)
    row["length"] = sum(s["length"] for s in counted) / len(counted)
    row["tokens_per_s"] = max(s["tokens"] / s["step"] for s in counted)
    row["gen_tokens_per_s"] = max(s["tokens"] / s["generation"] for s in counted)
    return row


def logp_pass(call) -> float:
    """The fastest of 3 calls of `call` (no gradients)."""
    times = []
    with torch.no_grad():
        for _ in range(3):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
    return min(times)


class UnirlSide:
    """unirl's GRPO steps in this process, as one rank runs them (unirl_core/worker/worker.py: rollout, reward,
    advantages, train)."""

    def __init__(self, path: Path, args):
        from unirl_core.config import load_recipe
        from unirl_core.data.sources import ArithmeticPromptSource
        from unirl_core.domains.ar.domain import ARDomain

        self.args = args
        self.config = config = load_recipe("demo_llm", [
            f"train.model.path={path}", f"train.domain.max_new_tokens={args.max_new_tokens}",
            "train.domain.temperature=1.0", "train.domain.top_p=1.0", "train.domain.chat_template=false",
            f"train.data.prompts_per_rollout={args.prompts}", f"train.sampling.samples_per_prompt={args.group}",
            "train.algorithm.name=token_grpo", f"train.algorithm.learning_rate={LEARNING_RATE}",
            f"train.algorithm.micro_batch_size={args.micro_batch}", "train.algorithm.num_updates_per_batch=1",
            "train.algorithm.beta=0", "train.algorithm.lr_schedule=constant", f"train.steps={args.steps}",
        ]).train  # fmt: skip
        torch.manual_seed(config.sampling.seed)
        self.domain = ARDomain(config, torch.device("cpu"))
        self.policy = self.domain.build_policy()
        self.stack = self.domain.rl_stack(self.policy)
        self.source = ArithmeticPromptSource(prompts_per_rollout=args.prompts, seed=config.data.seed)
        self.logp, self.spent, self.rollout = self.stack._logp, 0.0, None
        self.stack._logp = self._timed_logp  # TokenStack.train's no-grad passes (pi_old, reference), timed apart

    def _timed_logp(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self.logp(*args, **kwargs)
        finally:
            self.spent += time.perf_counter() - started

    def step(self, step: int) -> dict:
        from unirl_core.algorithms.advantages import group_advantages
        from unirl_core.data.grpo_groups import expand_groups

        args, algorithm = self.args, self.config.algorithm
        self.spent = 0.0
        started = time.perf_counter()
        samples = expand_groups(self.source.next_batch(), args.group, first_group_id=step * args.prompts)
        rolling = time.perf_counter()
        self.rollout = rollout = self.domain.rollout(self.policy, self.stack, samples, step)
        generated = time.perf_counter()
        rewards = torch.tensor(digit_fraction(rollout.outputs))
        advantages, _ = group_advantages(rewards, args.group, algorithm.std_mode, eps=algorithm.adv_eps,
                                         clip=algorithm.adv_clip, ddof=algorithm.std_ddof)  # fmt: skip
        scored = time.perf_counter()
        self.stack.train(rollout, advantages, step)
        ended = time.perf_counter()
        mask = rollout.completions.mask
        return finish({"step": ended - started, "generation": generated - rolling, "old_ref_logp": self.spent,
                       "reward_adv": scored - generated, "tokens": int(mask.sum()),
                       "length": mask.sum(-1).float().mean().item()})  # fmt: skip

    def logp_pass(self) -> float:
        return logp_pass(lambda: self.logp(self.rollout.completions))


def finish(figures: dict) -> dict:
    """`figures` with `update`: the step's time less its other phases."""
    others = figures["generation"] + figures["old_ref_logp"] + figures["reward_adv"]
    return figures | {"update": figures["step"] - others}


def run(path: Path, args) -> tuple[list[dict], float, list[dict], float]:
    """TRL's GRPOTrainer for `args.steps` steps with unirl's step i run after TRL's step i (from TRL's step-end
    callback, outside TRL's timing); (unirl's per-step figures, its no-grad log-prob pass, TRL's, TRL's)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from unirl_core.data.sources import ArithmeticPromptSource

    unirl = UnirlSide(path, args)
    batch = args.prompts * args.group
    prompts = [example.prompt for example in ArithmeticPromptSource(shuffle=False).prompts]
    out = path.parent / "trl"  # output_dir: nothing is written there (saving and logging off)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing's new name
        config = GRPOConfig(
            output_dir=str(out), report_to="none", use_cpu=True, bf16=False, fp16=False,
            per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=batch // args.micro_batch,
            num_generations=args.group, max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0,
            top_k=0, beta=0.0, num_iterations=1, epsilon=0.2, loss_type="grpo", scale_rewards="group",
            learning_rate=LEARNING_RATE, lr_scheduler_type="constant", optim="adamw_torch", weight_decay=0.0,
            max_grad_norm=1.0, gradient_checkpointing=False, max_steps=args.steps, logging_strategy="no",
            save_strategy="no", disable_tqdm=True, log_completions=False, dataloader_num_workers=0, seed=0,
        )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    trainer = GRPOTrainer(model=model, reward_funcs=trl_digit_fraction, args=config,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tokenizer)  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # it prints the logs to stdout at the end of train()
    spent = {"generation": 0.0, "old_ref_logp": 0.0, "generate_and_score": 0.0}
    captured: dict = {}
    generate, score, logps = (trainer._generate, trainer._generate_and_score_completions,
                              trainer._get_per_token_logps_and_entropies)  # fmt: skip

    def timed(name, method, no_grad_only=False):
        def wrapper(*a, **k):
            if no_grad_only and torch.is_grad_enabled():  # the update's own forward: not a pi_old/reference pass
                return method(*a, **k)
            started = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                spent[name] += time.perf_counter() - started

        return wrapper

    def scored(inputs):
        captured["batch"] = timed("generate_and_score", score)(inputs)
        return captured["batch"]

    trainer._generate = timed("generation", generate)
    trainer._get_per_token_logps_and_entropies = timed("old_ref_logp", logps, no_grad_only=True)
    trainer._generate_and_score_completions = scored
    unirl_steps: list[dict] = []
    trl_steps: list[dict] = []
    resumed: list[float] = []

    class Interleave(TrainerCallback):
        def on_train_begin(self, *a, **k):
            resumed.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            mask = captured["batch"]["completion_mask"]
            figures = {"step": time.perf_counter() - resumed[-1], "generation": spent["generation"],
                       "old_ref_logp": spent["old_ref_logp"],
                       "reward_adv": spent["generate_and_score"] - spent["generation"] - spent["old_ref_logp"],
                       "tokens": int(mask.sum()), "length": mask.sum(-1).float().mean().item()}  # fmt: skip
            trl_steps.append(finish(figures))
            progress("TRL", len(trl_steps) - 1, args.skip, trl_steps[-1])
            for key in spent:
                spent[key] = 0.0
            unirl_steps.append(unirl.step(len(unirl_steps)))
            progress("unirl", len(unirl_steps) - 1, args.skip, unirl_steps[-1])
            resumed.append(time.perf_counter())

    trainer.add_callback(Interleave())
    torch.set_num_threads(args.threads)  # after the trainer's (and accelerate's) setup
    trainer.train()
    if len(trl_steps) != args.steps:
        raise RuntimeError(f"TRL ran {len(trl_steps)} steps, expected {args.steps}")
    last = captured["batch"]
    ids = torch.cat([last["prompt_ids"], last["completion_ids"]], 1)
    mask = torch.cat([last["prompt_mask"], last["completion_mask"]], 1)
    keep = last["completion_ids"].shape[1]
    trl_pass = logp_pass(lambda: logps(trainer.model, ids, mask, keep, batch_size=args.micro_batch))
    return unirl_steps, unirl.logp_pass(), trl_steps, trl_pass


def progress(side: str, step: int, skip: int, f: dict) -> None:
    warm = " (warm-up)" if step < skip else ""
    print(f"  {side} step {step}{warm}: {f['step']:.2f} s (generation {f['generation']:.2f}, old/ref logp "
          f"{f['old_ref_logp']:.2f}, reward+adv {f['reward_adv']:.3f}, update {f['update']:.2f}), "
          f"{f['tokens']} tokens, threads {torch.get_num_threads()}", flush=True)  # fmt: skip


def report(unirl: dict, trl: dict) -> None:
    rows = [  # label, key, kind: "rate" (unirl / TRL), "time" (TRL / unirl) or "info" (no ratio)
        ("generated tokens/s (whole step)", "tokens_per_s", "rate"),
        ("generated tokens/s (generation)", "gen_tokens_per_s", "rate"),
        ("GRPO step (s)", "step", "time"),
        ("  generation (s)", "generation", "time"),
        ("  old/ref log-probs (s)", "old_ref_logp", "time"),
        ("  reward + advantages (s)", "reward_adv", "time"),
        ("  update (s)", "update", "time"),
        ("no-grad log-prob pass (s, outside)", "logp_pass", "time"),
        ("generated tokens per step", "tokens", "info"),
        ("mean completion length", "length", "info"),
    ]
    print(f"\n{'metric':<36} {'unirl':>10} {'TRL':>10} {'ratio':>7}")
    for label, key, kind in rows:
        a, b = unirl[key], trl[key]
        ratio = "-" if kind == "info" or min(a, b) <= 0 else f"{(a / b if kind == 'rate' else b / a):.2f}x"
        digits = 3 if kind == "time" else 1
        print(f"{label:<36} {a:>10.{digits}f} {b:>10.{digits}f} {ratio:>7}")
    print("ratio: unirl / TRL for tokens/s, TRL / unirl for seconds (> 1: unirl faster); each figure the fastest "
          "counted step; old/ref log-probs: none in a step with one update and beta 0 (both sides skip them); "
          "the no-grad pass: one over the last batch, outside the steps, what pi_old would cost")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps per side (warm-up included)")
    parser.add_argument("--skip", type=int, default=1, help="warm-up steps left out (>= 1)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (the GRPO group)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=8, help="completions per forward/backward")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: tiny model, 2 prompts x 4, 8 tokens, micro-batch 4, 2 steps (1 warm-up)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.model, args.steps, args.skip, args.prompts, args.group = "tiny", 2, 1, 2, 4
        args.max_new_tokens, args.micro_batch = 8, 4
    if not 1 <= args.skip < args.steps:
        parser.error("--skip must be at least 1 and less than --steps")
    if args.group < 2:
        parser.error("--group must be at least 2 (GRPO's group std)")
    if (args.prompts * args.group) % args.micro_batch:
        parser.error("--micro-batch must divide --prompts x --group")

    import transformers
    import trl

    from unirl_core.models.logs import quiet_model_libraries

    quiet_model_libraries()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="ar-grpo-") as tmp:
        path = Path(tmp) / "model"
        params = build_model(args.model, path)
        print(f"{args.model}: Qwen3, {params / 1e6:.2f} M parameters, full fine-tuning, float32, CPU, torch threads "
              f"{args.threads} ({os.cpu_count()} cores); {args.prompts} prompts x {args.group} completions, "
              f"{args.max_new_tokens} new tokens at most, micro-batch {args.micro_batch}, {args.steps} steps per "
              f"side ({args.skip} warm-up); TRL {trl.__version__}, transformers {transformers.__version__}, "
              f"torch {torch.__version__}", flush=True)  # fmt: skip
        unirl_steps, unirl_pass, trl_steps, trl_pass = run(path, args)
    unirl = fastest(unirl_steps, args.skip) | {"logp_pass": unirl_pass}
    trl_row = fastest(trl_steps, args.skip) | {"logp_pass": trl_pass}
    report(unirl, trl_row)


if __name__ == "__main__":
    main()
