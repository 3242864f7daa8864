"""SIGKILL `unirl precache` mid-task, run it again: it resumes after the last committed output shard and ends
byte-identical to an uninterrupted run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unirl_core.io.tars import TarShardWriter

pytestmark = pytest.mark.slow
UNIRL = str(Path(sys.executable).parent / "unirl")
SUPPORT = str(Path(__file__).resolve().parents[1] / "support")


def write_recipe(tmp_path: Path, source: Path, out: Path) -> str:
    recipe = {
        "precache": {
            "input_dir": str(source),
            "output_dir": str(out),
            "batch_size_per_GPU": 2,
            "dataloader_num_workers": 1,
            "tar_chunk_size": 4,
            "save_original_in_tar": ["text"],
            "encodings": [
                {"modality": "text", "extension": "txt", "key": "codes", "precision": 16, "store_pad_tokens": False,
                 "encoder_config": {"cls": "toy_encoders.SlowText", "delay_s": 0.15}}
            ],
        }
    }  # fmt: skip
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(json.dumps(recipe))
    return str(path)


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("t*_r*_*.tar"))}


def test_sigkill_resumes_after_the_last_committed_shard(prefect_harness, tmp_path):
    from prefect.settings import PREFECT_API_URL

    source = tmp_path / "source"
    for shard in range(3):
        with TarShardWriter(str(source / f"{shard:05d}.tar")) as writer:
            for i in range(12):
                writer.write(f"{shard}{i:04d}", {"txt": f"caption {shard}-{i}".encode(), "json": b"{}"})
            writer.commit()
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": SUPPORT}

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [UNIRL, "precache", write_recipe(tmp_path, source, killed)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while len(list(killed.glob("t0_r0_*.json"))) < 2:
        assert process.poll() is None, "finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    committed = sorted(killed.glob("t0_r0_*.json"))
    assert 2 <= len(committed) < 9 and not (killed / "t0_r0.done.json").exists()
    first_shard = killed / "t0_r0_0.tar"
    written_at = first_shard.stat().st_mtime_ns

    resumed = subprocess.run(
        [UNIRL, "precache", write_recipe(tmp_path, source, killed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert first_shard.stat().st_mtime_ns == written_at  # committed shards were not redone

    clean = tmp_path / "clean"
    result = subprocess.run(
        [UNIRL, "precache", write_recipe(tmp_path, source, clean)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert digests(killed) == digests(clean) and len(digests(clean)) == 9  # 36 samples / 4
    assert (killed / "index.json").read_bytes() == (clean / "index.json").read_bytes()
    assert not list(killed.glob(".*.tmp"))
