"""A model reward on its own Ray actor (`train.reward.placement: dedicated`), on the tiny SD3 with GRPO and two
weighted rewards normalized per reward (a tiny CLIP's `clip_score` and `jpeg_compressibility`):

- the run equals the colocated one (`--local`, the reward in the training process) bitwise at every step, even
  though the reward actor is killed in the middle of a step's scoring: Ray restarts it, it reloads its model and
  the call runs again; every step is logged once, with each reward's own metrics;
- `unirl train` SIGKILLed after its first commit, then run again, ends with the same steps bitwise;
- a missing reward folder fails before any rollout, naming the folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_training import comparable, on_one_rank, train_locally

from unirl_core.config import load_recipe

pytestmark = pytest.mark.slow

STEPS = 3


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    from unirl_core.models.tiny_clip import write_tiny_clip

    return write_tiny_clip(tmp_path_factory.mktemp("reward-clip") / "clip", seed=0)


def overrides(clip_folder, placement: str) -> list[str]:
    return [
        f"train.steps={STEPS}",
        "train.checkpoint_every=1",
        "train.eval_every_rounds=0",
        "train.ray.workers=1",
        "train.ray.cpus_per_worker=1",
        "train.reward.weights.clip_score=0.5",
        "train.reward.normalize=per_reward",
        f"train.reward.clip.model_path={clip_folder}",
        f"train.reward.placement={placement}",
    ]


def demo(clip_folder, placement: str, output_dir: Path):
    config = load_recipe("demo", overrides(clip_folder, placement)).train
    return on_one_rank(config, output_dir, cpus_per_worker=1)


@pytest.fixture(scope="module")
def colocated(clip_folder, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("colocated")
    return comparable(train_locally(demo(clip_folder, "colocated", output_dir), output_dir))


def logged_rows(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_reward_actor_killed_mid_step_is_restarted_and_the_run_equals_the_colocated_one(
    ray_local, clip_folder, colocated, tmp_path
):
    import ray

    from unirl_core.controller import plan_rounds, run_round
    from unirl_core.distributed.reward_actors import ACTOR_NAME

    def pid(actor) -> int:
        return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))

    def die_in_the_next_scoring(self) -> None:  # runs inside the actor: its process exits mid-call
        self.scorers["clip_score"] = lambda *args, **kwargs: os._exit(1)

    pids = []

    def on_step(row: dict) -> None:
        actor = ray.get_actor(ACTOR_NAME.format(index=0))
        pids.append(pid(actor))
        if row["step"] == 0:
            ray.get(actor.__ray_call__.remote(die_in_the_next_scoring))

    config = demo(clip_folder, "dedicated", tmp_path / "dedicated")
    for round_ in plan_rounds(config):
        run_round(config, round_, on_step=on_step)
    rows = logged_rows(tmp_path / "dedicated")
    assert [row["step"] for row in rows] == list(range(STEPS))  # none lost, none logged twice
    assert pids[1] != pids[0] and pids[2] == pids[1]  # restarted once, during step 1
    assert comparable(rows) == colocated  # every reward, advantage, loss and gradient norm
    assert {"reward_clip_score_mean", "reward_clip_score_std", "reward_jpeg_compressibility_mean"} <= set(rows[0])
    assert len({row["reward_clip_score_mean"] for row in rows}) == STEPS


def test_unirl_train_sigkilled_resumes_with_the_dedicated_reward(prefect_harness, clip_folder, colocated, tmp_path):
    from prefect.settings import PREFECT_API_URL

    from unirl_core.controller import RAY_RECORD
    from unirl_core.distributed.cluster import stop_recorded

    output_dir = tmp_path / "sigkilled"
    sets = [f"--set={o}" for o in [*overrides(clip_folder, "dedicated"), f"train.output_dir={output_dir}"]]
    command = [str(Path(sys.executable).parent / "unirl"), "train", "demo", *sets]
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    process = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)  # fmt: skip
    marker, deadline = output_dir / "checkpoints/step_00000000/trainer_state.json", time.monotonic() + 300
    while not marker.is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, process.stdout.read().decode()[-3000:]
    os.killpg(process.pid, signal.SIGKILL)  # the driver, its local Ray, the training worker and the reward actor
    process.wait()
    stop_recorded(output_dir / RAY_RECORD)
    assert not (output_dir / "checkpoints/step_00000002").exists()

    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    last = {row["step"]: row for row in comparable(logged_rows(output_dir))}  # a re-run step is logged again
    assert [last[step] for step in range(STEPS)] == colocated


def test_a_missing_reward_folder_fails_before_any_rollout_naming_it(ray_local, clip_folder, tmp_path):
    from unirl_core.controller import plan_rounds, run_round
    from unirl_core.rewards.errors import RewardError

    config = demo(tmp_path / "no-clip", "dedicated", tmp_path / "out")
    with pytest.raises(
        RewardError, match=r"could not load clip_score: train.reward.clip: CLIP model folder .*no-clip.* has no config"
    ):
        run_round(config, plan_rounds(config)[0])
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
