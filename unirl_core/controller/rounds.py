"""Round strategies: what a round of each stage does between the controller's generic parts (resume, the step loop,
checkpoints, the metrics file). The controller asks its round's strategy; nothing compares a stage's name.

| strategy      | named states     | before the steps    | one step                                            | after the steps          |
|---------------|------------------|---------------------|-----------------------------------------------------|--------------------------|
| `RLRound`     | -                | `train.eval` point  | prompts -> groups -> rollout + rewards -> advantages | sample grid, eval grid   |
|               |                  |                     | -> train; `train.eval` point when due (before the   |                          |
|               |                  |                     | step's checkpoint)                                  |                          |
| `WarmupRound` | the warm-up data | the fixed-draw eval | a supervised batch                                  | the fixed-draw eval      |
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np

from unirl_core.algorithms.advantages import compute_advantages, per_reward_advantages
from unirl_core.controller.round_plan import plan_rounds, split_even
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.errors import UserError
from unirl_core.worker.worker import TrainWorker


def reduce_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Mean over ranks; min/max for *_min/*_max; max for seconds (the slowest rank sets the pace)."""
    out: dict[str, float] = {}
    for key in per_rank[0]:
        values = [m[key] for m in per_rank]
        if key.endswith("_min"):
            out[key] = min(values)
        elif key.endswith("_max") or key.startswith("seconds_"):
            out[key] = max(values)
        else:
            out[key] = float(np.mean(values))
    return out


def reward_metrics(scores: dict[str, list[float]]) -> dict[str, float]:
    """Mean and std of the total reward and of each component."""
    metrics = {"reward_mean": float(np.mean(scores["total"])), "reward_std": float(np.std(scores["total"]))}
    metrics |= {f"reward_{k}_mean": float(np.mean(v)) for k, v in scores.items() if k != "total"}
    return metrics | {f"reward_{k}_std": float(np.std(v)) for k, v in scores.items() if k != "total"}


class RoundStrategy:
    """One stage's round, driven by the `Controller` (`controller`: its config, group, mlflow_run, progress, outputs)."""

    stage: ClassVar[str]  # the label written in commit records and metric rows
    scores_rewards: ClassVar[bool] = False  # the workers load the reward models

    def __init__(self, controller, precache=None):
        self.controller = controller

    def states(self) -> dict[str, Any]:
        """Named states of this stage that checkpoints keep beside the controller's."""
        return {}

    def before_steps(self, deadline: float) -> dict[str, Any]:
        return {}

    def step(self, stage_step: int, timeout: float, last: bool) -> dict[str, float]:
        raise NotImplementedError

    def after_step(self, step: int, deadline: float) -> Exception | None:
        """Between a step's log and its checkpoint (what runs here commits with the step); an exception returned
        stops the run once the step's checkpoint is committed."""
        return None

    def after_steps(self, deadline: float) -> dict[str, Any]:
        return {}


class RLRound(RoundStrategy):
    """RL: rollouts scored by the rewards, advantages over the whole batch, the ranks train; a sample grid of the
    round's last step and the evaluation grid when due."""

    stage = "rl"
    scores_rewards = True

    def __init__(self, controller, precache=None):
        from unirl_core.controller.train_eval import TrainEval

        super().__init__(controller, precache)
        self.last_outputs: tuple[list, list[str]] | None = None
        self.last_rows: list[dict] = []
        self.eval = TrainEval(controller) if controller.config.eval else None

    def before_steps(self, deadline: float) -> dict[str, Any]:
        """`train.eval`: drop the points a resume lost, then the point due before the next step (the first RL
        step's; one a resume lacks), which stops here again when a guard with `stop` was breached at it."""
        if self.eval is not None:
            c = self.controller
            self.eval.drop_past(committed=c.progress.step - 1)
            stop = self.eval.stop_error(self.eval.run(c.progress.step, deadline))
            if stop is not None:
                raise stop
        return {}

    def after_step(self, step: int, deadline: float) -> Exception | None:
        """`train.eval`: the point after this step, when due."""
        return self.eval.stop_error(self.eval.run(step + 1, deadline)) if self.eval is not None else None

    def step(self, stage_step: int, timeout: float, last: bool) -> dict[str, float]:
        """Prompts -> groups -> the ranks roll out and score -> advantages over the whole batch -> the ranks train
        (with dynamic sampling, more rollouts first until enough groups have differing rewards)."""
        c = self.controller
        config, group, workers = c.config, c.config.sampling.samples_per_prompt, c.workers
        started = time.perf_counter()
        batch = c.source.next_batch()
        samples = expand_groups(batch, group, first_group_id=stage_step * config.data.prompts_per_rollout)
        first_group = samples[0].group_id
        grid = [s for s in samples if s.group_id - first_group < config.grid_prompts
                and s.sample_index < config.grid_images_per_prompt] if last else []  # fmt: skip
        results, scores = self._roll_out(samples, stage_step, [s.sample_id for s in grid], timeout)
        rollouts, dynamic = [(samples, scores)], getattr(config.algorithm, "dynamic_sampling", False)
        if dynamic:  # the first prompts_per_rollout groups with differing rewards
            rollouts = self._sample_dynamically(rollouts, stage_step, timeout)
        chosen = set(differing_groups(rollouts)[: len(batch)]) if dynamic else {s.group_id for s in samples}
        kept = [s for round_samples, _ in rollouts for s in round_samples if s.group_id in chosen]
        kept_scores = {k: [x for ss, sc in rollouts for s, x in zip(ss, sc[k], strict=True) if s.group_id in chosen]
                       for k in scores}  # fmt: skip
        advantages, advantage_stats = self._advantages([s.example.prompt for s in kept], kept_scores)
        train_parts = c.group.scatter(TrainWorker.train, rank_advantages(rollouts, chosen, advantages, workers),
                                      stage_step, timeout=timeout)  # fmt: skip
        metrics = reward_metrics(kept_scores) | advantage_stats | reduce_metrics(train_parts)
        metrics["seconds_rollout"] = max(r["seconds_rollout"] for r in results)
        metrics["seconds_reward"] = max(r["seconds_reward"] for r in results)
        metrics["images_per_s"] = sum(len(ss) for ss, _ in rollouts) / (time.perf_counter() - started)
        if dynamic:
            metrics["gen_batches"] = float(len(rollouts))
        if last:  # only the grid's outputs came back (of the step's first rollout)
            outputs = {sample_id: output for r in results for sample_id, output in r["outputs"].items()}
            self.last_outputs = ([outputs[s.sample_id] for s in grid], [b.prompt for b in batch[: config.grid_prompts]])
            self.last_rows = sample_rows(samples, grid, outputs, scores)
        return metrics

    def _roll_out(self, samples: list, stage_step: int, grid_ids: list[str], timeout: float,
                  extend: bool = False) -> tuple[list[dict], dict[str, list[float]]]:  # fmt: skip
        """The ranks roll out and score their shares of `samples`: (their results, the scores in sample order)."""
        c = self.controller
        results = c.group.scatter(TrainWorker.rollout, split_even(samples, c.workers), stage_step, grid_ids, extend,
                                  timeout=timeout)  # fmt: skip
        return results, {k: [x for r in results for x in r["rewards"][k]] for k in results[0]["rewards"]}

    def _sample_dynamically(self, rollouts: list, stage_step: int, timeout: float) -> list:
        """DAPO's dynamic sampling: more rollouts of `prompts_per_rollout` new prompts, each kept on the ranks after
        the step's earlier ones, until that many groups have differing total rewards (`train.algorithm`
        `max_gen_batches` rollouts at most: past it, a UserError)."""
        c = self.controller
        config, most = c.config, c.config.algorithm.max_gen_batches
        wanted = config.data.prompts_per_rollout
        while len(differing_groups(rollouts)) < wanted:
            if most and len(rollouts) >= most:
                raise DynamicSamplingError(
                    f"step {c.progress.step}: {len(differing_groups(rollouts))} of {wanted} groups with differing "
                    f"rewards after train.algorithm.max_gen_batches={most} rollouts; the prompts are too hard or too "
                    "easy for the policy: filter them, or raise max_gen_batches (0: no limit)"
                )
            first = stage_step * wanted + len(rollouts) * EXTRA_GROUP_IDS  # ids apart from every step's first rollout
            samples = expand_groups(c.source.next_batch(), config.sampling.samples_per_prompt, first_group_id=first)
            rollouts.append((samples, self._roll_out(samples, stage_step, [], timeout, extend=True)[1]))
        return rollouts

    def _advantages(self, prompts: list[str], scores: dict[str, list[float]]) -> tuple[np.ndarray, dict]:
        config, group = self.controller.config, self.controller.config.sampling.samples_per_prompt
        if config.reward.normalize != "total":
            return per_reward_advantages(config.algorithm, prompts, scores, config.reward.weights, group,
                                         config.reward.normalize)  # fmt: skip
        return compute_advantages(config.algorithm, self.controller.advantage_tracker, prompts, scores["total"], group)

    def after_steps(self, deadline: float) -> dict[str, Any]:
        """The last step's sample grid, and the evaluation grid when due."""
        c = self.controller
        summary = {"samples": c.grids.save_samples(*self.last_outputs)} if self.last_outputs else {}
        if self.last_outputs:
            c.grids.save_table(self.last_rows)
        rl_rounds = [r for r in plan_rounds(c.config) if r.stage == self.stage]
        every = c.config.eval_every_rounds
        if every and ((c.round.index + 1) % every == 0 or c.round == rl_rounds[-1]):
            summary["eval_samples"] = c.grids.evaluate(c.round.end - 1, deadline - time.monotonic())
        return summary


EXTRA_GROUP_IDS = 1 << 40  # group ids of a step's later rollouts: first_group_id + k x this


class DynamicSamplingError(UserError):
    """Dynamic sampling kept too few groups with differing rewards within `max_gen_batches` rollouts."""


def differing_groups(rollouts: list) -> list[int]:
    """The group ids, in rollout order, whose total rewards are not all equal (population std > 0; a group of
    one sample counts, as in veRL)."""
    totals: dict[int, list[float]] = {}
    for samples, scores in rollouts:
        for sample, total in zip(samples, scores["total"], strict=True):
            totals.setdefault(sample.group_id, []).append(total)
    return [g for g, values in totals.items() if len(values) == 1 or np.std(values) > 0]


def rank_advantages(rollouts: list, chosen: set[int], advantages: np.ndarray, workers: int) -> list[list[float]]:
    """Each rank's advantages in the order of the rows it keeps (its share of each rollout, rollout after rollout):
    the chosen groups' values in order, NaN for the rest (outside the step's batch)."""
    values = iter(advantages.tolist())
    per_round = [[next(values) if s.group_id in chosen else float("nan") for s in samples] for samples, _ in rollouts]
    return [[x for row in per_round for x in split_even(row, workers)[rank]] for rank in range(workers)]


def sample_rows(samples: list, grid: list, outputs: dict, scores: dict[str, list[float]]) -> list[dict]:
    """A row per grid sample: its prompt and id, its output when it is text (a completion), its rewards."""
    index = {s.sample_id: i for i, s in enumerate(samples)}
    return [{"prompt": s.example.prompt, "sample_id": s.sample_id,
             **({"output": outputs[s.sample_id]} if isinstance(outputs[s.sample_id], str) else {}),
             **{name: values[index[s.sample_id]] for name, values in scores.items()}} for s in grid]  # fmt: skip


class WarmupRound(RoundStrategy):
    """Supervised warm-up on the domain's data (image diffusion: precached (latent, conditioning) pairs); the
    fixed-draw eval loss before and after."""

    stage = "warmup"

    def __init__(self, controller, precache=None):
        from unirl_core.domains.registry import domain_class

        super().__init__(controller, precache)
        self.domain = domain_class(controller.config.domain.name)
        self.data = self.domain.warmup_data(controller.config, precache)

    def states(self) -> dict[str, Any]:
        return {"warmup_data": self.data}

    def step(self, stage_step: int, timeout: float, last: bool) -> dict[str, float]:
        c = self.controller
        started = time.perf_counter()
        batch = self.data.next_batch()
        parts = c.group.scatter(TrainWorker.warmup, self.domain.split_warmup(batch, c.workers), stage_step,
                                timeout=timeout)  # fmt: skip
        metrics = {f"warmup_{k}": v for k, v in reduce_metrics(parts).items()}
        metrics["warmup_samples_per_s"] = len(batch["keys"]) / (time.perf_counter() - started)
        return metrics

    def before_steps(self, deadline: float) -> dict[str, Any]:
        """The eval loss before the round's steps, logged at its first step."""
        loss = self._eval(deadline - time.monotonic())
        self.controller.mlflow_run.log_metrics({"warmup_eval_loss": loss}, self.controller.progress.step)
        return {"warmup_eval_loss_before": loss}

    def after_steps(self, deadline: float) -> dict[str, Any]:
        loss = self._eval(deadline - time.monotonic())
        self.controller.mlflow_run.log_metrics({"warmup_eval_loss": loss}, self.controller.round.end - 1)
        return {"warmup_eval_loss": loss}

    def _eval(self, timeout: float) -> float:
        """The mean denoising loss on the data's first batch with fixed draws: comparable across the warm-up."""
        c = self.controller
        saved = self.data.state_dict()
        self.data.load_state_dict(saved | {"epoch": 0, "batch_in_epoch": 0})
        batch = self.data.next_batch()
        self.data.load_state_dict(saved)
        losses = c.group.scatter(TrainWorker.warmup_eval, self.domain.split_warmup(batch, c.workers),
                                 c.config.warmup.seed, timeout=timeout)  # fmt: skip
        return float(np.mean(losses))


STRATEGIES: dict[str, type[RoundStrategy]] = {s.stage: s for s in (RLRound, WarmupRound)}
