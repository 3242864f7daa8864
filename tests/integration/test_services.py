"""Each shared fixture's real service, used the way the pipeline uses it."""

from __future__ import annotations

import json
import time

import pytest

from unirl_core.config import Recipe  # module level: the flow below resolves its annotation from here

pytestmark = pytest.mark.slow


def test_prefect_flow_maps_a_task_over_prompt_files(prefect_harness, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.prompts import check_prompt_files

    good = tmp_path / "a.txt"
    good.write_text("one\ntwo\n")
    also_good = tmp_path / "b.jsonl"
    also_good.write_text('{"prompt": "x", "media": [{"modality": "image", "role": "condition", "uri": "c.png"}]}\n')
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps([{"prompt": "x", "prompt_embeds": [0.1]}]))

    state = check_prompt_files([str(good), str(also_good), str(bad)], return_state=True)
    reports = state.result()
    assert [(r["ok"], r["num_prompts"]) for r in reports] == [(True, 2), (True, 1), (False, 0)]
    assert reports[1]["with_media"] == 1
    assert "c.json, item 0: legacy precomputed-embedding field(s) ['prompt_embeds']" in reports[2]["error"]

    with get_client(sync_client=True) as client:
        flow_run_id = state.state_details.flow_run_id
        deadline = time.monotonic() + 120  # the server records task states from events, retried when sqlite is busy
        while True:
            task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            done = len(task_runs) == 3 and all(t.state is not None and t.state.is_completed() for t in task_runs)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        artifacts = client.read_latest_artifacts()
    assert sorted(t.name for t in task_runs) == sorted(f"check {p}" for p in (good, also_good, bad))
    assert all(t.state is not None and t.state.is_completed() for t in task_runs)
    assert any(a.key == "prompt-file-check" for a in artifacts)


def test_prefect_retries_a_flaky_read_and_still_reports_a_dead_one(prefect_harness, tmp_path, monkeypatch):
    # A stand-in for the store, because a flaky object store cannot be produced on demand here: the first read of
    # flaky.txt fails like an S3 503, every read of dead.txt fails like an unreachable endpoint.
    from collections import Counter

    from flows.prompts import check_prompt_files
    from unirl_core.io import storage

    real_read, calls = storage.read_text, Counter()

    def unreliable_read(path, encoding="utf-8"):
        calls[path] += 1
        if path.endswith("dead.txt") or (path.endswith("flaky.txt") and calls[path] == 1):
            raise ConnectionError("503 Slow Down")
        return real_read(path, encoding)

    monkeypatch.setattr(storage, "read_text", unreliable_read)
    flaky, dead = tmp_path / "flaky.txt", tmp_path / "dead.txt"
    flaky.write_text("a\nb\n")
    dead.write_text("c\n")
    reports = check_prompt_files([str(flaky), str(dead)])
    assert reports[0] == {"path": str(flaky), "ok": True, "num_prompts": 2, "with_media": 0, "error": None}
    assert calls[str(flaky)] == 2  # retried once, then fine
    assert not reports[1]["ok"] and "cannot read after retries: 503 Slow Down" in reports[1]["error"]
    assert calls[str(dead)] == 3  # the first try and 2 retries, then reported, not crashing the flow


def test_recipe_models_become_the_prefect_form(prefect_harness):
    from prefect import flow
    from prefect.utilities.callables import parameter_schema

    @flow
    def takes_a_recipe(recipe: Recipe) -> None:
        pass

    schema = parameter_schema(takes_a_recipe).model_dump()
    definitions = schema["definitions"]
    sampling = definitions["SamplingConfig"]["properties"]
    assert "GRPO group size" in sampling["samples_per_prompt"]["description"]
    assert definitions["SamplingConfig"]["additionalProperties"] is False


def test_ray_actor_pair_all_reduces_over_gloo(ray_local):
    from unirl_core.distributed.worker_group import TorchWorker, WorkerGroup

    assert ray_local["CPU"] == 2
    with WorkerGroup(world_size=2) as group:
        assert group.backends == ["gloo", "gloo"]
        results = group.run(TorchWorker.all_reduce_sum, [1.0, 2.0, 3.0])
    assert results == [[2.0, 4.0, 6.0], [2.0, 4.0, 6.0]]
    # close() released the placement group: a second group of 2 CPUs can start at once.
    with WorkerGroup(world_size=2, ready_timeout_s=30) as again:
        assert again.run(TorchWorker.all_reduce_sum, [0.5]) == [[1.0], [1.0]]
    with pytest.raises(TypeError, match="by reference"):  # no method names as strings
        again.run("all_reduce_sum", [0.5])


def test_local_group_is_one_rank_in_this_process():
    """`unirl train --local`'s transport: the worker in this process, torch.distributed with world size 1."""
    import socket

    import torch
    import torch.distributed as dist

    from unirl_core.distributed.local_group import LocalGroup
    from unirl_core.distributed.rank import TorchWorker

    threads = torch.get_num_threads()
    with LocalGroup(TorchWorker) as group:
        assert group.backends == ["gloo"] and dist.get_world_size() == 1
        with socket.socket() as probe, pytest.raises(OSError):  # the store's port was listening from the start:
            probe.bind(("127.0.0.1", group.worker.store.port))  # never probed free, released and bound again
        assert group.run(TorchWorker.all_reduce_sum, [1.0, 2.0]) == [[1.0, 2.0]]
        assert group.scatter(TorchWorker.all_reduce_sum, [[3.0]]) == [[3.0]]
        torch.set_num_threads(1)  # a worker's build sets its threads; closing restores the process's
    assert not dist.is_initialized() and torch.get_num_threads() == threads


def test_a_user_error_on_a_worker_arrives_as_itself(ray_local):
    """Not wrapped in Ray's remote traceback: `unirl` prints the worker's one-line message and exits 2; an unreachable
    scorer (a ConnectionError: the round's task retries it) and a full disk (never retried) arrive as themselves."""
    from unirl_core.data.bagel.sharding import ShardingError
    from unirl_core.distributed.worker_group import TorchWorker, WorkerGroup

    class Reader(TorchWorker):  # defined here: Ray pickles it by value
        def plan(self, files: list[str]) -> list:
            from unirl_core.data.bagel.sharding import assign_files

            return assign_files(files, self.world_size, num_workers=2, seed=0)

        def score(self) -> None:
            from unirl_core.rewards.errors import ScorerUnavailableError

            raise ScorerUnavailableError("remote scorer http://127.0.0.1:9/score is unreachable")

        def save(self) -> None:
            import errno

            raise OSError(errno.ENOSPC, "No space left on device", "/out/checkpoints/step_00000003/__0_0.distcp")

    with WorkerGroup(world_size=1, worker_cls=Reader) as group:
        with pytest.raises(ShardingError) as info:
            group.run(Reader.plan, ["a.parquet"])
        assert type(info.value) is ShardingError
        assert str(info.value).startswith("1 files cannot feed 1 ranks x 2 workers = 2 readers")
        with pytest.raises(ConnectionError, match="is unreachable") as unreachable:  # transient: the round retries
            group.run(Reader.score)
        assert type(unreachable.value).__name__ == "ScorerUnavailableError"
        with pytest.raises(OSError) as full:  # a full disk: permanent, the controller names it (StorageError)
            group.run(Reader.save)
        assert type(full.value) is OSError and full.value.errno == 28 and full.value.filename.endswith(".distcp")


def test_mlflow_run_is_read_back(mlflow_uri):
    from mlflow.tracking import MlflowClient

    from unirl_core.tracking.mlflow_runs import log_metrics, mlflow_run

    with mlflow_run("foundation", "round-0", params={"prompts_per_rollout": 4}) as run_id:
        for step in range(3):
            log_metrics({"reward_mean": 0.1 * step, "loss": 1.0 / (step + 1)}, step=step)
    with mlflow_run("foundation", "round-0", run_id=run_id):  # a resumed round logs into the same run
        log_metrics({"reward_mean": 0.3}, step=3)
    with pytest.raises(RuntimeError), mlflow_run("foundation", "round-1"):
        raise RuntimeError("worker lost")

    client = MlflowClient(mlflow_uri)
    run = client.get_run(run_id)
    assert run.data.params == {"prompts_per_rollout": "4"}
    history = client.get_metric_history(run_id, "reward_mean")
    assert [(m.step, round(m.value, 3)) for m in history] == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3)]
    assert run.info.status == "FINISHED"
    experiment = client.get_experiment_by_name("foundation")
    statuses = {r.info.run_name: r.info.status for r in client.search_runs([experiment.experiment_id])}
    assert statuses == {"round-0": "FINISHED", "round-1": "FAILED"}


def test_parquet_and_prompt_files_round_trip_over_s3(s3_endpoint):
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    from unirl_core.data.prompts import load_prompts
    from unirl_core.io import storage

    table = pa.table({"caption": ["a cat", "a dog"], "url": ["http://x/1.jpg", "http://x/2.jpg"]})
    fs, path = fsspec.core.url_to_fs("s3://unirl-test/raw/part-0.parquet")
    with fs.open(path, "wb") as f:
        pq.write_table(table, f)
    with fsspec.open("s3://unirl-test/raw/part-0.parquet", "rb") as f:
        assert pq.read_table(f).equals(table)

    row = {"prompt": "edit it", "media_refs": [{"modality": "image", "role": "condition", "uri": "../img/a.png"}]}
    storage.write_bytes_atomic("s3://unirl-test/prompts/train.jsonl", (json.dumps(row) + "\n").encode())
    (example,) = load_prompts("s3://unirl-test/prompts/train.jsonl")
    assert example.prompt_id == "train.jsonl:0"
    assert example.media_refs[0].uri == "s3://unirl-test/img/a.png"
