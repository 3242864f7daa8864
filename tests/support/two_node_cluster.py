"""A simulated two-node Ray cluster on this machine (two raylets, one CPU each) and a worker group placed over it
the way a training round places one on an existing cluster (`worker_group` with `train.ray.address`).

Run as a script (its own process: the test session's Ray stays untouched) by tests/integration/test_ray_cluster.py;
prints one JSON line with what it saw. Ray's logs go to the temp dir given as the first argument.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table

from unirl_core.config.schema import RayConfig
from unirl_core.distributed.groups import worker_group
from unirl_core.distributed.rank import TorchWorker
from unirl_core.distributed.resources import ClusterResourcesError

FORWARDED = ["UNIRL_HOME", "UNIRL_TEST_PUBLIC", "UNIRL_TEST_SECRET", "SCORER_TOKEN"]


class EnvWorker(TorchWorker):  # defined in __main__: Ray ships it by value
    def seen(self, names: list[str]) -> dict:
        return {"node": ray.get_runtime_context().get_node_id(), "env": {n: os.environ.get(n) for n in names}}


def main(temp_dir: str) -> dict:
    # The nodes take this machine's address, not 127.0.0.1: a worker raylet reaches the head through the address Ray
    # resolves for "localhost", which is the machine's.
    # Ray's test cluster records its address in its default temp folder (/tmp/ray/ray_current_cluster) whatever
    # temp_dir says, and only creates that folder when something else started a Ray there first
    Path(tempfile.gettempdir(), "ray").mkdir(exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "temp_dir": temp_dir})  # fmt: skip
    cluster.add_node(num_cpus=1)
    answer: dict = {}
    try:
        config = RayConfig(
            address=cluster.address, workers=2, placement="STRICT_SPREAD", placement_timeout_s=60,
            env_vars=["UNIRL_TEST_PUBLIC"], secret_env_vars=["UNIRL_TEST_SECRET"],
        )  # fmt: skip
        with worker_group(EnvWorker, config, Path(temp_dir) / "record.json", credential_names=["SCORER_TOKEN"]) as g:
            answer["strategy"] = placement_group_table(g.placement_group)["strategy"]
            answer["seen"] = g.run(EnvWorker.seen, FORWARDED)
            answer["all_reduce"] = g.run(TorchWorker.all_reduce_sum, [1.0])
        too_big = config.model_copy(update={"gpus_per_worker": 1})
        try:
            with worker_group(EnvWorker, too_big, Path(temp_dir) / "record.json"):
                answer["refused"] = None
        except ClusterResourcesError as exc:
            answer["refused"] = str(exc)
    finally:
        cluster.shutdown()
    return answer


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)  # the driver's logs go to stderr, which the test reads
    print(json.dumps(main(sys.argv[1])))
