"""deployments/prefect.yaml: every deployment points at a loadable flow whose parameters validate, and `retrain` has
its nightly schedule, its trigger on the event ingest emits, and a concurrency limit of one."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]


def deployments() -> dict[str, dict]:
    document = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    return {d["name"]: d for d in document["deployments"]}


def test_every_deployment_loads_its_flow_and_its_parameters_validate():
    from prefect.flows import load_flow_from_entrypoint

    found = deployments()
    assert set(found) == {"ingest", "precache", "train", "pipeline", "retrain", "bagel-export"}
    for name, deployment in found.items():
        flow = load_flow_from_entrypoint(str(ROOT / deployment["entrypoint"]))
        parameters = deployment.get("parameters", {})
        for trigger in deployment.get("triggers", []):  # what a triggered run gets (templates as plain strings)
            parameters = parameters | trigger.get("parameters", {})
        assert flow.validate_parameters(parameters), name
        assert deployment["work_pool"]["name"] == "unirl-process"


def test_packaged_recipes_named_by_deployments_have_the_sections_they_run(monkeypatch):
    from unirl_core.config import load_recipe

    section = {"ingest": "ingest", "precache": "precache", "train": "train", "pipeline": "train", "retrain": "train"}
    monkeypatch.setenv("INPUT_PARQUET", "/data/x.parquet")
    monkeypatch.setenv("DATA_PATH", "/data/prompts.txt")
    for name, deployment in deployments().items():
        if name not in section:
            continue
        recipe = load_recipe(deployment["parameters"]["recipe"])
        assert getattr(recipe, section[name]) is not None, name


def test_retrain_runs_nightly_on_new_data_and_one_at_a_time():
    retrain = deployments()["retrain"]
    assert retrain["concurrency_limit"] == {"limit": 1, "collision_strategy": "ENQUEUE"}
    assert [s["cron"] for s in retrain["schedules"]] == ["0 3 * * *"]
    (trigger,) = retrain["triggers"]
    assert trigger["expect"] == ["unirl.dataset.updated"]
    # the resource id flows/ingest.py emits for a dataset
    assert fnmatch.fnmatch("unirl.dataset./data/laion/shards", trigger["match"]["prefect.resource.id"])


def test_bagel_export_runs_on_every_dataset_update_with_the_dataset_as_source():
    export = deployments()["bagel-export"]
    (trigger,) = export["triggers"]
    assert trigger["expect"] == ["unirl.dataset.updated"]
    assert fnmatch.fnmatch("unirl.dataset./data/laion", trigger["match"]["prefect.resource.id"])
    # the resource label flows/ingest.py sets to the dataset root (rendered live in tests/e2e/test_deployments.py)
    assert trigger["parameters"]["source"] == "{{ event.resource['unirl.dataset.uri'] }}"
