"""reorganize_tar copies a raw shard that maps onto one output shard unchanged (it starts a shard, holds exactly
tar_chunk_size samples, each with every required extension; a hard link on a local disk) and streams the rest: the
shards and the record are the same bytes either way, and a copied shard whose bytes are not the committed ones is
refused."""

from __future__ import annotations

import json

import pytest

from unirl_core.ingest.reorganize import reorganize
from unirl_core.io.tars import TarShardWriter, iter_samples


def raw_shard(path, unit: int, count: int) -> dict:
    with TarShardWriter(str(path)) as writer:
        for row in range(count):
            writer.write(f"{unit:05d}{row:04d}", {"jpg": bytes([unit, row]) * 50, "txt": b"a cat", "json": b"{}"})
        info = writer.commit()
    return {"path": str(path), "sha256": info.sha256, "nsamples": info.nsamples, "has_extensions": True}


def outputs(root) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "shards").iterdir())}


def test_whole_raw_shards_are_copied_to_the_same_bytes_as_streaming_them(tmp_path):
    # units of 4, 4, 3, 4 samples at tar_chunk_size 4: the first two start a shard (copied), the third leaves 3
    # samples pending, so the fourth, though whole, is streamed: 1 sample completes shard 2, 3 go to the tail
    raws = [raw_shard(tmp_path / f"raw/{u:05d}.tar", u, n) for u, n in enumerate([4, 4, 3, 4])]
    streamed = [{"path": r["path"], "sha256": r["sha256"]} for r in raws]  # no counts: every sample streamed
    fast = reorganize(str(tmp_path / "fast"), raws, 4, ["jpg", "txt"])
    slow = reorganize(str(tmp_path / "slow"), streamed, 4, ["jpg", "txt"])
    assert fast == slow and [s["nsamples"] for s in fast["shards"]] == [4, 4, 4, 3]
    assert outputs(tmp_path / "fast") == outputs(tmp_path / "slow")
    assert (tmp_path / "fast/shards/00000.tar").read_bytes() == (tmp_path / "raw/00000.tar").read_bytes()
    assert (tmp_path / "fast/shards/00000.tar").stat().st_ino == (tmp_path / "raw/00000.tar").stat().st_ino  # a link
    assert json.loads((tmp_path / "fast/shards/_reorganize.json").read_text())["samples"] == 15


def test_copied_sample_bytes_equal_rewritten_samples(tmp_path):
    """The streamed path copies each sample's byte range (headers, data, padding) from the raw shard: the shards
    must be the bytes that writing the same samples anew gives, skips and the tail shard included."""
    raws = [raw_shard(tmp_path / f"raw/{u:05d}.tar", u, n) for u, n in enumerate([3, 5, 3])]
    with TarShardWriter(str(tmp_path / "raw/00003.tar")) as writer:  # one sample lacks its txt: skipped, counted
        writer.write("000030000", {"jpg": b"x" * 700, "txt": b"odd sizes " * 77, "json": b"{}"})
        writer.write("000030001", {"jpg": b"y" * 513, "json": b"{}"})
        writer.write("000030002", {"jpg": b"z" * 511, "txt": b"last", "json": b"{}"})
        info = writer.commit()
    raws.append({"path": str(tmp_path / "raw/00003.tar"), "sha256": info.sha256})
    record = reorganize(str(tmp_path / "out"), [{"path": r["path"], "sha256": r["sha256"]} for r in raws], 4,
                        ["jpg", "txt"])  # fmt: skip
    expected, writer, names = {}, None, 0
    for raw in raws:
        for key, members in iter_samples(raw["path"]):
            if "txt" not in members:
                continue
            writer = writer or TarShardWriter(str(tmp_path / f"expected/{names:05d}.tar"))
            writer.write(key, members)
            if writer.nsamples == 4:
                writer.commit()
                writer, names = None, names + 1
    writer.commit()
    expected = {p.name: p.read_bytes() for p in sorted((tmp_path / "expected").iterdir())}
    written = {name: data for name, data in outputs(tmp_path / "out").items() if name.endswith(".tar")}
    assert written == expected and [s["nsamples"] for s in record["shards"]] == [4, 4, 4, 1]
    assert record["skipped"] == {"missing_extension": 1}


def test_where_no_hard_link_can_be_made_the_shard_is_copied_with_the_committed_md5(tmp_path, monkeypatch):
    import errno
    import os

    def cross_device(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    raws = [raw_shard(tmp_path / f"raw/{u:05d}.tar", u, 4) for u in range(2)]
    linked = reorganize(str(tmp_path / "linked"), raws, 4, ["jpg", "txt"])
    monkeypatch.setattr(os, "link", cross_device)  # another file system (or one without links)
    raws[1]["md5"] = linked["shards"][1]["md5"]  # from the unit's stats: taken, not recomputed (the SHA-256 is)
    copied = reorganize(str(tmp_path / "copied"), raws, 4, ["jpg", "txt"])
    assert copied == linked and outputs(tmp_path / "copied") == outputs(tmp_path / "linked")
    assert (tmp_path / "copied/shards/00000.tar").stat().st_ino != (tmp_path / "raw/00000.tar").stat().st_ino
    assert not [p.name for p in (tmp_path / "copied/shards").iterdir() if p.name.startswith(".")]  # no temporaries


def test_a_copied_shard_must_be_the_committed_bytes(tmp_path):
    raws = [raw_shard(tmp_path / "raw/00000.tar", 0, 4)]
    raws[0]["sha256"] = "0" * 64  # what the unit's stats committed differs from the file on disk
    with pytest.raises(ValueError, match=r"raw/00000\.tar: SHA-256 \w{64} is not the committed 0{64}"):
        reorganize(str(tmp_path / "out"), raws, 4, ["jpg", "txt"])
    assert not list((tmp_path / "out/shards").glob("*.tar"))  # nothing under a final name
