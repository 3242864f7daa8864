"""Connect to or start a Ray cluster for one training round (the only room that imports ray).

`address` (or `RAY_ADDRESS`) joins an existing cluster (KubeRay, `ray start`); otherwise a local Ray is started on
127.0.0.1 without a dashboard (anyone who reaches a Ray dashboard/jobs port can run code, CVE-2023-48022) and shut
down when the block ends.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray


@contextmanager
def ray_cluster(
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    temp_dir: str | None = None,
) -> Iterator[dict]:
    """Yield the cluster's resources; on exit disconnect (existing cluster) or shut the local Ray down."""
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="WARNING")
    else:
        ray.init(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp_dir,
            logging_level="WARNING",
        )
    try:
        yield ray.cluster_resources()
    finally:
        ray.shutdown()
