"""Advantages: GRPO's group normalization, DDPO's per-prompt stat tracker, clipping.

rewards_B (B = prompts x samples_per_prompt, siblings adjacent) -> view [G, K]
A = (r - mean_group) / (std_group + eps)      std per group, or one batch-wide std; population (ddof 0) or N - 1
A = r - mean_group                          std_mode "none" (Dr. GRPO: no std normalization)
"""

from __future__ import annotations

from collections import defaultdict, deque

import torch


def group_advantages(
    rewards_B: torch.Tensor,
    group_size: int,
    std_mode: str = "group",
    eps: float = 1e-4,
    clip: float | None = 5.0,
    ddof: int = 0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-normalized advantages [B] and stats (`zero_std_ratio`: groups whose rewards are all equal). `ddof`: 0,
    the population std (flow_grpo's np.std), or 1, N - 1 (DanceGRPO's and MixGRPO's torch .std())."""
    if rewards_B.numel() % group_size:
        raise ValueError(f"{rewards_B.numel()} rewards do not split into groups of {group_size}")
    rewards_GK = rewards_B.double().view(-1, group_size)
    mean_G1 = rewards_GK.mean(dim=1, keepdim=True)
    if std_mode == "group":
        std = rewards_GK.std(dim=1, keepdim=True, correction=ddof)
    elif std_mode == "batch":
        std = rewards_GK.std(correction=ddof).expand_as(mean_G1)
    elif std_mode == "none":
        std, eps = torch.zeros_like(mean_G1), 1.0
    else:
        raise ValueError(f"std_mode={std_mode!r}: choose group, batch or none")
    advantages = ((rewards_GK - mean_G1) / (std + eps)).view(-1)
    if clip is not None:
        advantages = advantages.clamp(-clip, clip)
    zero_std = (rewards_GK.max(dim=1).values == rewards_GK.min(dim=1).values).double().mean().item()
    return advantages.float(), {
        "zero_std_ratio": zero_std,
        "advantage_mean": advantages.mean().item(),
        "advantage_abs_max": advantages.abs().max().item(),
    }


def prompt_group_advantages(
    prompts: list[str],
    rewards_B: torch.Tensor,
    std_mode: str = "group",
    eps: float = 1e-4,
    clip: float | None = 5.0,
    ddof: int = 0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """flow_grpo's grouping: every sample with the same prompt text is one group, wherever it sits in the batch
    (a prompt drawn twice in a step forms one group of 2K); the std per group, or one batch-wide std."""
    rewards = rewards_B.double()
    advantages = torch.empty_like(rewards)
    batch_std = rewards.std(correction=ddof)
    zero_std = []
    for prompt in dict.fromkeys(prompts):
        index = torch.tensor([i for i, p in enumerate(prompts) if p == prompt])
        members = rewards[index]
        if std_mode == "none":
            advantages[index] = members - members.mean()
        else:
            std = members.std(correction=ddof) if std_mode == "group" else batch_std
            advantages[index] = (members - members.mean()) / (std + eps)
        zero_std.append(float(members.max() == members.min()))
    if clip is not None:
        advantages = advantages.clamp(-clip, clip)
    return advantages.float(), {
        "zero_std_ratio": sum(zero_std) / len(zero_std),
        "advantage_mean": advantages.mean().item(),
        "advantage_abs_max": advantages.abs().max().item(),
    }


class PerPromptStatTracker:
    """DDPO's tracker: normalize each reward by its prompt's recent rewards (a buffer of `buffer_size`); until the
    buffer holds `min_count` rewards, use the whole batch's statistics."""

    def __init__(self, buffer_size: int = 32, min_count: int = 16, eps: float = 1e-6):
        self.buffer_size, self.min_count, self.eps = buffer_size, min_count, eps
        self.buffers: dict[str, deque] = defaultdict(lambda: deque(maxlen=buffer_size))

    def update(self, prompts: list[str], rewards_B: torch.Tensor) -> torch.Tensor:
        rewards = rewards_B.double()
        advantages = torch.empty_like(rewards)
        batch_mean, batch_std = rewards.mean(), rewards.std(unbiased=False)
        for prompt in dict.fromkeys(prompts):
            index = torch.tensor([i for i, p in enumerate(prompts) if p == prompt])
            self.buffers[prompt].extend(rewards[index].tolist())
            if len(self.buffers[prompt]) < self.min_count:
                mean, std = batch_mean, batch_std
            else:
                history = torch.tensor(list(self.buffers[prompt]), dtype=torch.float64)
                mean, std = history.mean(), history.std(unbiased=False)
            advantages[index] = (rewards[index] - mean) / (std + self.eps)
        return advantages.float()

    def state_dict(self) -> dict:
        return {"buffers": {k: list(v) for k, v in self.buffers.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.buffers.clear()
        for prompt, values in state["buffers"].items():
            self.buffers[prompt].extend(values)


def compute_advantages(
    algorithm, tracker: PerPromptStatTracker, prompts: list[str], rewards: list[float], group: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages [B] of one rollout (group-major samples, `group` per prompt) by `algorithm.std_mode`, clipped to
    +-adv_clip, and their stats. `per_prompt` normalizes by each prompt's running stats in `tracker` (flow_grpo's
    per-prompt stat tracking); the others within the batch (`group_advantages`)."""
    rewards_B = torch.tensor(rewards)
    normalized = {"eps": algorithm.adv_eps, "clip": algorithm.adv_clip, "ddof": algorithm.std_ddof}
    if algorithm.group_by == "prompt" and algorithm.std_mode != "per_prompt":
        return prompt_group_advantages(prompts, rewards_B, algorithm.std_mode, **normalized)
    if algorithm.std_mode != "per_prompt":
        return group_advantages(rewards_B, group, algorithm.std_mode, **normalized)
    _, stats = group_advantages(rewards_B, group, "group", clip=algorithm.adv_clip)  # zero_std_ratio
    advantages = tracker.update(prompts, rewards_B).clamp(-algorithm.adv_clip, algorithm.adv_clip)
    return advantages, stats | {
        "advantage_mean": advantages.mean().item(),
        "advantage_abs_max": advantages.abs().max().item(),
    }


def per_reward_advantages(
    algorithm,
    prompts: list[str],
    components: dict[str, list[float]],
    weights: dict[str, float],
    group: int,
    mode: str = "per_reward",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Multi-reward advantages from each reward normalized within its group (`reward.normalize`):

        A_k = normalize_group(r_k)         each reward within its group, by the algorithm's conventions
        S   = sum_k w_k A_k                weighted, summed
        per_reward (GDPO):       A = S / (std(S) + eps)   standardized over the batch (S has mean 0: every A_k is
                                                          centred within its groups)
        advantage_aggr (MixGRPO's `multi_reward_mix`):  A = S / sum_k w_k   the weights normalized to sum to 1,
                                                          no second normalization
    then clipped to +-adv_clip. A reward whose raw values spread widely (PickScore ~ +-1 vs OCR in [0, 1]) cannot
    drown the others, and the weights set the rewards' shares of the advantage. A group whose rewards are all equal
    keeps advantage exactly 0 (`drop_zero_advantage` still drops it). `zero_std_ratio` is that of the weighted
    total."""
    conventions = {"eps": algorithm.adv_eps, "clip": None, "ddof": algorithm.std_ddof}
    by_prompt = algorithm.group_by == "prompt"

    def normalized(rewards_B: torch.Tensor, **settings) -> tuple[torch.Tensor, dict[str, float]]:
        if by_prompt:
            return prompt_group_advantages(prompts, rewards_B, **settings)
        return group_advantages(rewards_B, group, **settings)

    summed = torch.zeros(len(prompts), dtype=torch.float64)
    for name, weight in weights.items():
        advantages_k, _ = normalized(torch.tensor(components[name], dtype=torch.float64), std_mode=algorithm.std_mode,
                                     **conventions)  # fmt: skip
        summed += weight * advantages_k.double()
    if mode == "advantage_aggr":
        advantages = summed / sum(weights.values())
    else:
        advantages = summed / (summed.std(correction=algorithm.std_ddof) + algorithm.adv_eps)
    advantages = advantages.clamp(-algorithm.adv_clip, algorithm.adv_clip)
    total = torch.tensor([sum(weights[k] * components[k][i] for k in weights) for i in range(len(prompts))])
    _, stats = normalized(total, std_mode="group", clip=algorithm.adv_clip)
    return advantages.float(), stats | {
        "advantage_mean": advantages.mean().item(),
        "advantage_abs_max": advantages.abs().max().item(),
    }
