"""What the MLflow pages are built from, without MLflow: the Prefect link check, the git commit read from .git,
the params kept off the image card, the pipeline's stage numbers."""

from __future__ import annotations

import pytest

from unirl_core.tracking.pipeline_run import stage_metrics
from unirl_core.tracking.run_page import git_head, http_url, key_params

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("raw", "link"),
    [
        ("None/flow-runs/flow-run/6f1c", False),  # Prefect without a known UI URL
        (None, False),
        ("", False),
        ("/flow-runs/flow-run/6f1c", False),
        ("http:///flow-runs/flow-run/6f1c", False),
        ("http://127.0.0.1:4200/runs/flow-run/6f1c", True),
        ("https://app.prefect.cloud/account/a/workspace/w/runs/flow-run/6f1c", True),
    ],
)
def test_only_a_real_http_url_is_a_prefect_link(raw, link):
    assert http_url(raw) == (raw if link else None)


def test_the_commit_and_branch_are_read_from_a_checkouts_git_folder(tmp_path):
    git = tmp_path / "repo/.git"
    (git / "refs/heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs/heads/main").write_text(COMMIT + "\n")
    code = tmp_path / "repo/pkg/sub"
    code.mkdir(parents=True)
    assert git_head(code) == (COMMIT, "main")
    (git / "refs/heads/main").unlink()  # after `git gc`: the ref only in packed-refs
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{COMMIT} refs/heads/main\n")
    assert git_head(code) == (COMMIT, "main")
    (git / "HEAD").write_text(COMMIT + "\n")  # detached
    assert git_head(code) == (COMMIT, None)


def test_a_worktree_reads_its_commit_through_its_gitdir_file(tmp_path):
    main = tmp_path / "main/.git"
    (main / "refs/heads").mkdir(parents=True)
    (main / "refs/heads/feature").write_text(COMMIT + "\n")
    worktree_git = main / "worktrees/wt"
    worktree_git.mkdir(parents=True)
    (worktree_git / "HEAD").write_text("ref: refs/heads/feature\n")
    (worktree_git / "commondir").write_text("../..\n")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt/.git").write_text(f"gitdir: {worktree_git}\n")
    assert git_head(tmp_path / "wt") == (COMMIT, "feature")


def test_outside_a_checkout_no_commit_is_claimed(tmp_path):
    assert git_head(tmp_path) == (None, None)


def test_the_run_keeps_the_defining_knobs_as_params_not_the_whole_recipe():
    from unirl_core.config import load_recipe
    from unirl_core.tracking.run_tracker import flatten

    flat = flatten(load_recipe("demo").train.model_dump(mode="json"))
    params = key_params(flat)
    assert params["algorithm.eta"] == "0.7" and params["reward.weights.jpeg_compressibility"] == "1.0"
    assert "algorithm.tracker_buffer_size" not in params and "ray.round_timeout_s" not in params
    assert len(params) <= 15 < len(flat)


def test_stage_numbers_become_metrics_named_by_stage():
    summary = {"ok": 8, "skipped": 2, "skip_reasons": {"undecodable": 2}, "dataset": "/d", "seconds": 3.0,
               "incomplete_shards": ["a"], "new_units": True}  # fmt: skip
    assert stage_metrics("ingest", summary) == {
        "ingest/ok": 8,
        "ingest/skipped": 2,
        "ingest/skip_reasons.undecodable": 2,
    }
