"""The training-metrics summary the `unirl` command prints: the reward trend and each round's mean."""

from __future__ import annotations

import json

import pytest

from unirl_core.worker.metrics_summary import RoundMean, read_metrics, reward_trend, round_means


def test_reward_trend_averages_up_to_four_steps_at_each_end():
    trend = reward_trend([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    assert (trend.window, trend.first, trend.last, trend.change) == (4, 1.5, 7.5, 6.0)
    assert reward_trend([1.0, 3.0]) == type(trend)(1, 1.0, 3.0)
    assert reward_trend([2.0]).change == 0.0  # one step: both ends are that step


def test_round_means_count_a_re_logged_step_once_and_list_warmup_first(tmp_path):
    rows = [
        {"step": 2, "stage": "rl", "round": 0, "reward_mean": 0.0},  # re-run after a failure: the later row counts
        {"step": 0, "stage": "warmup", "round": 0, "warmup_loss": 0.5},
        {"step": 1, "stage": "warmup", "round": 0, "warmup_loss": 0.3},
        {"step": 2, "stage": "rl", "round": 0, "reward_mean": 0.2},
        {"step": 3, "stage": "rl", "round": 0, "reward_mean": 0.4},
        {"step": 4, "stage": "rl", "round": 1, "reward_mean": 1.0},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert round_means(read_metrics(path)) == [
        RoundMean("warmup", 0, "warmup_loss", pytest.approx(0.4), 2),
        RoundMean("rl", 0, "reward_mean", pytest.approx(0.3), 2),
        RoundMean("rl", 1, "reward_mean", 1.0, 1),
    ]
