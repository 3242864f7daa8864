"""The promotion gate end to end (real Prefect, MLflow sqlite, tiny SD3 trained `--local`): the first version
becomes champion; a version trained on jpeg_compressibility beats one trained on its negation and becomes champion;
one trained on the negation again is refused, the reason on the version in MLflow and in the Prefect artifact."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app

pytestmark = pytest.mark.slow

PROMPTS = ["a red apple", "a blue car", "a dark night", "a bright sun", "a cat on a mat", "a pine tree"]
NEGATED = "train.reward.weights={jpeg_compressibility: -1.0}"


def test_a_better_candidate_becomes_champion_and_a_worse_one_is_refused(prefect_harness, mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from unirl_core.config.recipe import packaged_recipes

    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    recipe = yaml.safe_load(packaged_recipes()["demo"].read_text())
    recipe["name"] = "gated"
    recipe["promote"] = {"prompts": str(tmp_path / "prompts.txt"), "gate": [{"reward": "jpeg_compressibility"}],
                         "report": ["brightness"], "shard_size": 3}  # fmt: skip
    path = tmp_path / "gated.yaml"
    path.write_text(yaml.safe_dump(recipe))
    client = MlflowClient(mlflow_uri)

    def train_and_promote(run: str, *overrides: str, steps: int = 6):
        trained = CliRunner().invoke(app, ["train", str(path), "--local", "--steps", str(steps), "--set",
                                           f"train.output_dir={tmp_path / run}", *overrides])  # fmt: skip
        assert trained.exit_code == 0, trained.output
        promoted = CliRunner().invoke(app, ["promote", str(path)])
        assert promoted.exit_code == 0, (promoted.exception, promoted.output[-2000:])
        return promoted.stdout

    said = train_and_promote("negated", "--set", NEGATED)
    assert "version 1 is the champion: the first version" in said
    assert client.get_model_version_by_alias("unirl-gated", "champion").version == 1

    said = train_and_promote("trained")
    assert "version 2 is the champion: ahead of champion version 1 on jpeg_compressibility" in said
    assert client.get_model_version_by_alias("unirl-gated", "champion").version == 2
    assert client.get_model_version("unirl-gated", "2").tags["unirl.promotion"] == "promoted"

    said = train_and_promote("negated_again", "--set", NEGATED)
    assert "version 3 stays candidate: not ahead of champion version 2 on jpeg_compressibility" in said
    assert client.get_model_version_by_alias("unirl-gated", "champion").version == 2
    assert client.get_model_version_by_alias("unirl-gated", "candidate").version == 3
    refused = client.get_model_version("unirl-gated", "3")
    assert refused.tags["unirl.promotion"] == "rejected" and refused.tags["unirl.promotion.against"] == "2"
    assert "not ahead of champion version 2" in refused.tags["unirl.promotion.reason"]
    assert "stays candidate" in refused.description
    assert refused.tags["unirl.promotion.jpeg_compressibility"].startswith("-")  # the difference, recorded

    # a version of another family cannot be compared on the same noise: refused with the reason, the champion kept
    # (whatever it learned: one step, no scored evaluation)
    said = train_and_promote("sd15", "--set", "train.model.family=sd15", "--set", "train.model.path=tiny:sd15",
                             "--set", "train.model.lora.target_modules=[to_q,to_k,to_v,to_out.0]",
                             "--set", "train.eval=null", steps=1)  # fmt: skip
    assert "version 4 stays candidate: not comparable with champion version 2" in said
    assert client.get_model_version_by_alias("unirl-gated", "champion").version == 2

    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["promotion"])))
    assert any("version 3: stays candidate" in str(a.data) for a in artifacts)
    assert any("reported: brightness" in str(a.data) for a in artifacts)  # the guard beside the gate


def test_promote_without_a_section_or_a_candidate_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    result = CliRunner().invoke(app, ["promote", "demo"])
    assert result.exit_code == 2 and "has no `promote` section" in result.output
