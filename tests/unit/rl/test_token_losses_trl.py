"""The token algorithms' losses (unirl_core/algorithms/token_base.py) against TRL 1.16.0's `GRPOTrainer`, called as a
library on identical inputs: the loss of one optimizer step and its gradients.

Both sides hold the same tiny Qwen3 (`write_tiny_lm`, loaded from one folder into two model objects) and score the
same batch: 4 left-padded prompts of different lengths, right-padded completions of 6, 3, 5 and 2 tokens (width 6,
max_new_tokens / max_completion_length 8, so Dr. GRPO's constant is not the tensor width), temperature 0.7, old
log-probs that differ from the current ones (a zero-mean token noise of std 0.3, which the token-level clip cuts on
some tokens, plus a per-row offset that puts two rows' GSPO sequence ratios outside 1 -/+ 3e-4 / 4e-4, with the
advantage's sign that clips, and two inside), reference log-probs for the KL term, and advantages of both signs.

TRL's side is a real `GRPOTrainer` (built offline, CPU, with a trivial reward function): its `compute_loss`
(= `_compute_loss`) on the dict that `_generate_and_score_completions` produces (prompt_ids, prompt_mask,
completion_ids, completion_mask, advantages, num_items_in_batch, old_per_token_logps, ref_per_token_logps), in train
mode with `current_gradient_accumulation_steps` set as the Trainer's loop sets it, then `accelerator.backward`, per
micro-batch. Ours is `LMPolicy.token_logp` and `TokenAlgorithm.token_loss` with `normalizer(B, tokens,
max_new_tokens)`, micro-batch by micro-batch as unirl_core/domains/ar/stack.py runs them. Each case runs with the
batch in one micro-batch and in two (TRL: per_device_train_batch_size 2, gradient_accumulation_steps =
steps_per_generation = 2), two ways:

- the same log-probs: one tensor of current log-probs fed to both losses (TRL's forward,
  `_get_per_token_logps_and_entropies`, replaced on the trainer by one returning its rows): equal losses and equal
  gradients with respect to that tensor, to float32 rounding;
- each side's own forward: equal losses and equal gradients of all 25 weights of the model.

| ours (algorithm_config)            | TRL 1.16.0 GRPOConfig                                                           |
|------------------------------------|---------------------------------------------------------------------------------|
| token_grpo (seq-mean-token-mean)   | loss_type="grpo", epsilon=0.2                                                   |
| dapo (token-mean, clip 0.2 / 0.28) | loss_type="dapo", epsilon=0.2, epsilon_high=0.28                                |
| dr_grpo (seq-mean-token-sum-norm)  | loss_type="dr_grpo", max_completion_length=max_new_tokens                       |
| token_grpo, loss_agg=token-mean    | loss_type="bnpo" (one micro-batch only: bnpo divides by each micro-batch's own  |
|                                    | tokens, ours by the whole batch's)                                              |
| gspo (sequence, clip 3e-4 / 4e-4)  | loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4,           |
|                                    | epsilon_high=4e-4                                                               |
| gspo, loss_agg=token-mean          | loss_type="dapo", importance_sampling_level="sequence" (TRL warns: each         |
|                                    | sequence's loss counted once per token)                                         |
| the first four with beta=0.04 (k3) | the same with beta=0.04, use_bias_correction_kl=False                           |

GSPO: TRL's sequence level takes coef_1 = exp(mean_t m (logp - logp_old)) as one [B, 1] value, clips it and
broadcasts the loss onto the tokens; ours puts sg(s_i) exp(logp - sg(logp)) on every token (GSPO-token). The values
are equal, and so are the gradients: TRL's d/dlogp_t = -A s_i m_t / |y_i| through the mean, ours -A s_i on each token
then divided by |y_i| in each completion's token mean (or, with token-mean, TRL's per-token broadcast sums |y_i|
copies of -A s_i m_t / |y_i|). Both are tested and agree.

Not matched (strict xfail): TRL 1.16.0's default `use_bias_correction_kl=True` multiplies the k3 KL by the
importance ratio coef_1 (trl/trainer/grpo_trainer.py, `_compute_loss`: `per_token_kl = per_token_kl * coef_1`;
grpo_config.py documents it after DeepSeek-V3.2); ours is DeepSeekMath's plain k3 term (token_base.py's docstring),
TRL's `use_bias_correction_kl=False`.

Tolerances. Same log-probs: the token-level losses agree bit for bit, GSPO's to a float32 rounding (ours
exp(sg(seq) + logp - sg(logp)), TRL's exp(seq)): losses rel 1e-6 + abs 5e-7 (a few float32 ulps of the O(1) token
terms), gradients rtol 1e-6, atol 1e-7 (their entries reach ~0.2). Own forwards: the log-probs differ by rounding
(TRL's fused, chunked LM-head log-softmax and position ids 0..L-1 running over the left pads; ours log_softmax and
position ids counted from each row's first real token, equal in exact arithmetic since RoPE attention depends only on
relative positions; measured <= 2e-6): log-probs atol 1e-5, losses rel 1e-5 + abs 2e-6 (the losses sum O(1) terms
of both signs, so a loss can be ~1e-4 and a relative bound alone would only measure that cancellation), parameter
gradients rtol 1e-4, atol 1e-5 (measured <= 2e-6 against entries up to ~1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from unirl_core.algorithms.registry import algorithm_config, build_algorithm
from unirl_core.config import load_recipe
from unirl_core.domains.ar.policy import Completions, LMPolicy
from unirl_core.models.tiny_lm import write_tiny_lm

pytestmark = pytest.mark.slow  # importing TRL alone takes ~10 s

PROMPTS = ["3+4=", "a much longer prompt, so the others are left-padded: 1+2=", "19+20=", "a middle one: 5+5="]
LENGTHS = [6, 3, 5, 2]  # completion tokens per row (the tensor is 6 wide)
WIDTH, MAX_NEW_TOKENS, TEMPERATURE, BETA = 6, 8, 0.7, 0.04
ADVANTAGES = [1.3, -0.8, 0.6, -1.1]
OFFSETS = [1e-4, -1e-3, 1e-3, -1e-4]  # row means of logp - logp_old: GSPO clips rows 1, 2 (A < 0, A > 0)
LOGP_ATOL = 1e-5
SAME_LOSS_TOL, SAME_GRAD_TOL = (1e-6, 5e-7), (1e-6, 1e-7)  # (rel, abs), (rtol, atol): one log-prob tensor
MODEL_LOSS_TOL, MODEL_GRAD_TOL = (1e-5, 2e-6), (1e-4, 1e-5)  # each side's own forward

DAPO_TRL = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28}
GSPO_TRL = {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}
NO_BIAS_KL = {"beta": BETA, "use_bias_correction_kl": False}
CASES = {  # name: (our algorithm config, TRL GRPOConfig options)
    "grpo": ({"name": "token_grpo"}, {"loss_type": "grpo", "epsilon": 0.2}),
    "dapo": ({"name": "dapo"}, DAPO_TRL),
    "dr_grpo": ({"name": "dr_grpo"}, {"loss_type": "dr_grpo", "epsilon": 0.2}),
    "gspo": ({"name": "gspo"}, GSPO_TRL),
    "gspo_token_mean": ({"name": "gspo", "loss_agg": "token-mean"}, GSPO_TRL | {"loss_type": "dapo"}),
    "grpo_kl": ({"name": "token_grpo", "beta": BETA}, {"loss_type": "grpo", "epsilon": 0.2, **NO_BIAS_KL}),
    "dapo_kl": ({"name": "dapo", "beta": BETA}, DAPO_TRL | NO_BIAS_KL),
    "dr_grpo_kl": ({"name": "dr_grpo", "beta": BETA}, {"loss_type": "dr_grpo", "epsilon": 0.2, **NO_BIAS_KL}),
    "gspo_kl": ({"name": "gspo", "beta": BETA}, GSPO_TRL | NO_BIAS_KL),
}


@dataclass
class Batch:
    completions: Completions
    old: torch.Tensor  # [B, T] 0 where masked, as both pipelines record them
    ref: torch.Tensor
    advantages: torch.Tensor


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny-qwen3")


@pytest.fixture(scope="module")
def policy(folder) -> LMPolicy:
    config = load_recipe("demo_llm", [f"train.model.path={folder}", "train.model.lora=null",
                                      f"train.domain.temperature={TEMPERATURE}",
                                      f"train.domain.max_new_tokens={MAX_NEW_TOKENS}"]).train  # fmt: skip
    return LMPolicy(config, "cpu")


@pytest.fixture(scope="module")
def batch(policy) -> Batch:
    generator = torch.Generator().manual_seed(0)
    prompt_ids, prompt_mask, _ = policy.encode(PROMPTS)
    assert len(set(prompt_mask.sum(-1).tolist())) == len(PROMPTS)  # every prompt left-padded differently
    mask = (torch.arange(WIDTH)[None] < torch.tensor(LENGTHS)[:, None]).long()
    ids = torch.randint(0, 94, (len(PROMPTS), WIDTH), generator=generator)  # printable bytes
    ids[1, LENGTHS[1] - 1] = ids[3, LENGTHS[3] - 1] = policy.tokenizer.eos_token_id  # two rows end, two truncated
    ids = ids.masked_fill(mask == 0, policy.tokenizer.pad_token_id)
    completions = Completions(prompt_ids, prompt_mask, ids, mask, torch.zeros(mask.shape), [""] * len(PROMPTS),
                              [True, False, True, False])  # fmt: skip
    with torch.no_grad():
        logp = policy.token_logp(completions) * mask
    noise = torch.randn(mask.shape, generator=generator) * 0.3 * mask
    noise = (noise - noise.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)) * mask  # zero mean in each row
    delta = (noise + torch.tensor(OFFSETS)[:, None]) * mask  # logp - logp_old
    advantages = torch.tensor(ADVANTAGES)
    positive, real = advantages[:, None] > 0, mask.bool()
    for bound in (math.log(1.2), math.log(1.28), math.log(0.8)):  # no token within rounding of a clip boundary
        assert (delta[real] - bound).abs().min() > 1e-3
    for high in (1.2, 1.28):  # GRPO's and DAPO's clips take the clipped term on some tokens, not on all
        clipped = (positive & (delta > math.log(high))) | (~positive & (delta < math.log(0.8)))
        assert 0 < int((clipped & real).sum()) < int(real.sum())
    ref = (logp + torch.randn(mask.shape, generator=generator) * 0.2) * mask
    return Batch(completions, (logp - delta) * mask, ref, advantages)


def micro_batches(count: int) -> list[torch.Tensor]:
    return list(torch.arange(len(PROMPTS)).split(len(PROMPTS) // count))


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def ours(policy: LMPolicy, batch: Batch, keys: dict, count: int, logp: torch.Tensor | None = None):
    """unirl's step: the batch's normalizer, then token_loss and backward per micro-batch (as the AR stack);
    (the summed loss, the gradients of the model's parameters, or of `logp` when given in place of the forward)."""
    algorithm = build_algorithm(algorithm_config(keys))
    completions, mask = batch.completions, batch.completions.mask.float()
    policy.trainable.zero_grad(set_to_none=True)
    normalizer = algorithm.normalizer(len(PROMPTS), int(mask.sum()), MAX_NEW_TOKENS)
    total = 0.0
    for micro in micro_batches(count):
        current = policy.token_logp(completions, micro) if logp is None else logp[micro]
        ref = batch.ref[micro] if algorithm.config.beta > 0 else None
        loss, _ = algorithm.token_loss(current, batch.old[micro], ref, batch.advantages[micro], mask[micro],
                                       normalizer)  # fmt: skip
        loss.backward()
        total += loss.item()
    return total, gradients(policy.trainable) if logp is None else {"logp": logp.grad}


def trl_trainer(folder, tmp_path, options: dict, count: int):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False,
                      per_device_train_batch_size=len(PROMPTS) // count, gradient_accumulation_steps=count,
                      num_generations=2, max_completion_length=MAX_NEW_TOKENS, temperature=TEMPERATURE,
                      save_strategy="no", **options)  # fmt: skip
    assert args.steps_per_generation == count
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                          processing_class=AutoTokenizer.from_pretrained(folder))  # fmt: skip
    trainer.model.train()  # what Trainer.training_step does; the tiny model has no dropout
    trainer.current_gradient_accumulation_steps = count  # what the Trainer's loop sets for each optimizer step
    return trainer


def trl(folder, tmp_path, batch: Batch, options: dict, count: int, logp: torch.Tensor | None = None):
    """TRL's step: `compute_loss` on each micro-batch of the generation batch's dict, then `accelerator.backward`;
    with `logp`, its forward (`_get_per_token_logps_and_entropies`) returns `logp`'s rows instead."""
    trainer = trl_trainer(folder, tmp_path, options, count)
    completions = batch.completions
    inputs = {"prompt_ids": completions.prompt_ids, "prompt_mask": completions.prompt_mask,
              "completion_ids": completions.ids, "completion_mask": completions.mask,
              "advantages": batch.advantages, "old_per_token_logps": batch.old}  # fmt: skip
    if trainer.beta != 0.0:
        inputs["ref_per_token_logps"] = batch.ref
    num_items_in_batch = completions.mask.sum()  # the generation batch's tokens (one process)
    total = 0.0
    for micro in micro_batches(count):
        if logp is not None:
            rows = logp[micro]
            trainer._get_per_token_logps_and_entropies = lambda *_, rows=rows, **__: (rows, torch.zeros_like(rows),
                                                                                      None)  # fmt: skip
        loss = trainer.compute_loss(trainer.model, {key: value[micro] for key, value in inputs.items()} |
                                    {"num_items_in_batch": num_items_in_batch})  # fmt: skip
        trainer.accelerator.backward(loss)
        total += loss.item()
    return total, gradients(trainer.model) if logp is None else {"logp": logp.grad}


def assert_same(mine: tuple[float, dict], theirs: tuple[float, dict], loss_tol: tuple, grad_tol: tuple) -> None:
    """Equal losses (rel, abs) and gradients (rtol, atol), every gradient tensor nonzero somewhere."""
    assert mine[0] == pytest.approx(theirs[0], rel=loss_tol[0], abs=loss_tol[1])
    assert mine[1].keys() == theirs[1].keys()
    for name, grad in mine[1].items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(grad, theirs[1][name], rtol=grad_tol[0], atol=grad_tol[1],
                                   msg=lambda message, name=name: f"{name}: {message}")  # fmt: skip


def same_log_probs(policy: LMPolicy, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Two leaves holding the current log-probs (0 where masked, as TRL's forward returns them), one per side."""
    with torch.no_grad():
        logp = policy.token_logp(batch.completions) * batch.completions.mask
    return logp.clone().requires_grad_(), logp.clone().requires_grad_()


def test_trl_scores_the_completion_tokens_as_we_do(folder, tmp_path, policy, batch):
    trainer = trl_trainer(folder, tmp_path, {"loss_type": "grpo"}, 1)
    completions = batch.completions
    with torch.no_grad():
        theirs, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([completions.prompt_ids, completions.ids], 1),
            torch.cat([completions.prompt_mask, completions.mask], 1), WIDTH)  # fmt: skip
        mine = policy.token_logp(completions)
    torch.testing.assert_close(mine * completions.mask, theirs, rtol=0, atol=LOGP_ATOL)


@pytest.mark.parametrize("count", [1, 2], ids=["one-micro-batch", "two-micro-batches"])
@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_log_prob_gradients_equal_trl_on_the_same_log_probs(folder, tmp_path, policy, batch, case, count):
    keys, options = CASES[case]
    mine, theirs = same_log_probs(policy, batch)
    assert_same(ours(policy, batch, keys, count, mine), trl(folder, tmp_path, batch, options, count, theirs),
                SAME_LOSS_TOL, SAME_GRAD_TOL)  # fmt: skip


@pytest.mark.parametrize("count", [1, 2], ids=["one-micro-batch", "two-micro-batches"])
@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_parameter_gradients_equal_trl(folder, tmp_path, policy, batch, case, count):
    keys, options = CASES[case]
    mine, theirs = ours(policy, batch, keys, count), trl(folder, tmp_path, batch, options, count)
    assert len(mine[1]) == 25  # every weight of the tiny Qwen3
    assert_same(mine, theirs, MODEL_LOSS_TOL, MODEL_GRAD_TOL)


def test_bnpo_is_token_mean_over_one_micro_batch(folder, tmp_path, policy, batch):
    keys, options = {"name": "token_grpo", "loss_agg": "token-mean"}, {"loss_type": "bnpo", "epsilon": 0.2}
    mine, theirs = same_log_probs(policy, batch)
    assert_same(ours(policy, batch, keys, 1, mine), trl(folder, tmp_path, batch, options, 1, theirs),
                SAME_LOSS_TOL, SAME_GRAD_TOL)  # fmt: skip
    assert_same(ours(policy, batch, keys, 1), trl(folder, tmp_path, batch, options, 1), MODEL_LOSS_TOL, MODEL_GRAD_TOL)


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="TRL 1.16.0's default use_bias_correction_kl=True multiplies the k3 KL by the importance "
                   "ratio (grpo_trainer.py _compute_loss: per_token_kl * coef_1, after DeepSeek-V3.2); ours is "
                   "DeepSeekMath's plain k3 term, TRL's use_bias_correction_kl=False")  # fmt: skip
def test_kl_with_trl_default_bias_correction(folder, tmp_path, policy, batch):
    mine, theirs = same_log_probs(policy, batch)
    assert_same(ours(policy, batch, {"name": "token_grpo", "beta": BETA}, 1, mine),
                trl(folder, tmp_path, batch, {"loss_type": "grpo", "beta": BETA}, 1, theirs),
                SAME_LOSS_TOL, SAME_GRAD_TOL)  # fmt: skip
