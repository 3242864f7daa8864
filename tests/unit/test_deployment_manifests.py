"""The cluster examples in deployments/ (KubeRay RayCluster, a Prefect Kubernetes work pool's base job template) hold
together: no schema validator for them is installable here, so their structure is checked instead."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

DEPLOYMENTS = Path(__file__).parents[2] / "deployments"


def test_the_raycluster_has_a_cpu_head_gpu_workers_and_one_shared_volume():
    cluster = yaml.safe_load((DEPLOYMENTS / "kubernetes" / "raycluster.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0" and head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    (workers,) = cluster["spec"]["workerGroupSpecs"]
    (container,) = workers["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1" == workers["rayStartParams"]["num-gpus"]
    claims = {v["persistentVolumeClaim"]["claimName"] for spec in (head["template"]["spec"], workers["template"]["spec"])
              for v in spec["volumes"] if "persistentVolumeClaim" in v}  # fmt: skip
    assert claims == {"unirl-workspace"}


def test_the_work_pool_template_declares_every_variable_it_uses():
    template = json.loads((DEPLOYMENTS / "kubernetes" / "prefect-work-pool.json").read_text())
    used = set(re.findall(r"\{\{ (\w+) \}\}", json.dumps(template["job_configuration"])))
    declared = set(template["variables"]["properties"])
    assert used <= declared, used - declared
    assert template["job_configuration"]["job_manifest"]["kind"] == "Job"
    assert template["variables"]["properties"]["env"]["default"]["RAY_ADDRESS"].startswith("ray://")


def test_the_dockerfile_installs_offline_from_the_wheelhouse():
    dockerfile = (DEPLOYMENTS / "Dockerfile").read_text()
    assert "pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse" in dockerfile
    assert "USER 1000" in dockerfile and "HF_HUB_OFFLINE=1" in dockerfile
