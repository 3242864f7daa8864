"""On a GPU (skipped without CUDA): one RL step of the tiny SD3 in bfloat16 through the worker itself, on one nccl
rank: the advantages meet the CUDA log-probs, the master weights and AdamW state stay float32, the first ratio is 1."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_one_bf16_rl_step_on_cuda_through_the_worker():
    from unirl_core.config import recipe_from_tree
    from unirl_core.data.grpo_groups import expand_groups
    from unirl_core.data.sources import build_source
    from unirl_core.distributed.local_group import LocalGroup
    from unirl_core.worker.worker import TrainWorker

    config = recipe_from_tree(
        {
            "train": {
                "data": {"source": "smoke", "prompts_per_rollout": 2},
                "sampling": {"samples_per_prompt": 2, "num_inference_steps": 3, "height": 32, "width": 32},
                "model": {"family": "sd3", "path": "tiny:sd3", "dtype": "bfloat16"},
                "algorithm": {"eta": 1.0, "micro_batch_size": 2, "learning_rate": 1e-5},
                "ray": {"workers": 1, "gpus_per_worker": 1},
                "steps": 1,
            }
        }
    ).train
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    with LocalGroup(TrainWorker, None, 300, gpus=1) as group:
        assert group.backends == ["nccl"]
        group.run(TrainWorker.build, config.model_dump_json(), "rl")
        worker = group.worker
        assert worker.device.type == "cuda"
        group.run(TrainWorker.rollout, samples, 0)
        assert worker._rollout.logp_TB.device.type == "cuda" and worker._rollout.logp_TB.dtype == torch.float32
        (metrics,) = group.run(TrainWorker.train, [1.0, -1.0, 1.0, -1.0], 0)
        assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0
        assert {p.dtype for p in worker.policy.parameters()} == {torch.float32}
        state = [t for s in worker.stack.optimizer.state.values() for t in s.values()]
        assert state and {t.dtype for t in state} == {torch.float32}
