"""`tiny:<family>` folders are built once per workspace; ranks that start together (two Ray workers of one round)
must never read a half-written folder (a run once failed reading an empty tokenizer_config.json)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from unirl_core.models import registry


def test_two_ranks_building_the_tiny_model_at_once_both_get_a_complete_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("UNIRL_HOME", str(tmp_path / "home"))
    final = tmp_path / "home" / "models" / "tiny-sd15-seed0"
    barrier, seen = threading.Barrier(2), []
    write = registry.write_tiny_model

    def racing_write(out_dir, family, seed=0):
        barrier.wait(timeout=60)  # both ranks found no folder and build now
        seen.append(Path(out_dir).parent == final.parent and Path(out_dir) != final)  # written aside, renamed
        return write(out_dir, family, seed)

    registry.build_tiny_pipeline("sd15")  # imports diffusers' lazy modules once (their import is not thread-safe)
    monkeypatch.setattr(registry, "write_tiny_model", racing_write)
    with ThreadPoolExecutor(2) as pool:
        folders = list(pool.map(lambda _: registry.resolve_model_path("tiny:sd15"), range(2)))
    assert folders == [str(final), str(final)] and seen == [True, True]
    assert sorted(p.name for p in final.parent.iterdir()) == ["tiny-sd15-seed0"]  # no partial folder left
    from diffusers import StableDiffusionPipeline

    assert StableDiffusionPipeline.from_pretrained(Path(folders[0])).unet.config.sample_size > 0
