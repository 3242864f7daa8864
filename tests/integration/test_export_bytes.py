"""Exports of identical weights are byte-identical, whichever process writes them: peft keeps `target_modules` as a
set, written in each interpreter's hash order (PYTHONHASHSEED) into `adapter_config.json` and the diffusers file's
metadata; the export writes them sorted."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXPORT = """
import sys, torch
from pathlib import Path
from unirl_core.config import load_recipe
from unirl_core.models.registry import build_family, resolve_model_path
train = load_recipe("demo").train
torch.manual_seed(0)  # the same LoRA weights in every process
family = build_family(train.model, train.sampling)
out = Path(sys.argv[1]); out.mkdir(parents=True)
family.export_adapter(out, str(resolve_model_path(train.model.path)))
"""


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_identical_weights_export_the_same_bytes_under_different_hash_seeds(tmp_path):
    """Two processes (two hash seeds, two safetensors map orders) write the same folder's bytes."""
    env = {**os.environ, "UNIRL_HOME": str(tmp_path / "home")}
    for seed in ("1", "2"):
        subprocess.run([sys.executable, "-c", EXPORT, str(tmp_path / seed)], env={**env, "PYTHONHASHSEED": seed},
                       check=True, capture_output=True)  # fmt: skip
    first = digests(tmp_path / "1")
    assert {"adapter_config.json", "adapter_model.safetensors", "pytorch_lora_weights.safetensors"} <= set(first)
    assert digests(tmp_path / "2") == first
    config = (tmp_path / "1" / "adapter_config.json").read_text()
    assert '"norm_out.linear",\n    "proj_out",\n    "to_k"' in config  # sorted
