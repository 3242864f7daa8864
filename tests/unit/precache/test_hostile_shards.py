"""Source shards and caches from elsewhere: hostile member names and pickle-like members are skipped (precache),
never merged, refused (read_encodings); a full disk while writing a shard leaves no temporary behind.

The precache runs here use a toy text encoder (`toy_encoders.SlowText`, no pause) on hand-made tars, so they take
well under a second each; the tars are written with `tarfile` directly because our own writer refuses such names.
"""

from __future__ import annotations

import errno
import io
import tarfile
from pathlib import Path

import pytest

from unirl_core.config import RecipeError, recipe_from_tree
from unirl_core.config.precache import PrecacheConfig
from unirl_core.io.storage import StorageError
from unirl_core.io.tars import TarShardWriter, iter_samples, unsafe_member_reason
from unirl_core.precache.merge import merge_source_tar
from unirl_core.precache.read import UnsafeCacheError, read_encodings
from unirl_core.precache.run import PrecacheError
from unirl_core.precache.stages import run_task, write_index

GOOD = ["000000000", "000000001", "000000002"]
HOSTILE_NAMES = {  # source key -> why its name is unsafe (in key order, before and after the good keys)
    "../../escape": "'..' component",
    "/abs/escape2": "absolute member path",
    "nul\x00name": "NUL byte",
    "x" * 300: "component over 255 bytes",
}
PICKLE_LIKE = {"000000005": "pickle", "000000006": "pth", "000000007": "pyd"}
TEXT = {"modality": "text", "extension": "txt", "key": "t", "encoder_config": {"cls": "x.Y"}}


def raw_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    """A tar with exactly these member names (a NUL survives only in a PAX `path` header)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if "\x00" in name:
                info.pax_headers = {"path": name}
            tar.addfile(info, io.BytesIO(data))


def member_names(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return tar.getnames()


@pytest.fixture
def hostile_source(tmp_path) -> Path:
    """One source shard: three good samples (txt + json) among samples with hostile names and pickle-like members,
    in key order, so that a precache trusting its input would write every one of them."""
    samples = {key: {"txt": f"caption {key}".encode(), "json": b"{}"} for key in GOOD}
    samples |= {key: {"txt": b"hostile", "safetensors": b"x"} for key in HOSTILE_NAMES}
    samples |= {key: {"txt": b"pickled", "json": b"{}", ext: b"\x80\x04payload"} for key, ext in PICKLE_LIKE.items()}
    members = [(f"{key}.{ext}", data) for key in sorted(samples) for ext, data in sorted(samples[key].items())]
    raw_tar(tmp_path / "src" / "00000.tar", members)
    return tmp_path / "src"


@pytest.fixture
def clean_source(tmp_path) -> Path:
    """One source shard of the three good samples only: its cache is tampered with by the reader tests."""
    raw_tar(tmp_path / "clean" / "00000.tar", [(f"{key}.txt", f"caption {key}".encode()) for key in GOOD])
    return tmp_path / "clean"


def config(source: Path, out: Path, **values) -> PrecacheConfig:
    return PrecacheConfig.model_validate(
        {
            "input_dir": str(source),
            "output_dir": str(out),
            "batch_size_per_GPU": 4,
            "dataloader_num_workers": 0,
            "device": "cpu",
            "save_original_in_tar": ["text"],
            "encodings": [{"modality": "text", "extension": "txt", "key": "toy_text", "store_pad_tokens": False,
                           "encoder_config": {"cls": "toy_encoders.SlowText", "delay_s": 0}}],
            **values,
        }
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("../../escape.safetensors", "'..' component"),
        ("a/../b.jpg", "'..' component"),
        ("/abs/escape2.x", "absolute member path"),
        ("nul\x00name.txt", "NUL byte"),
        ("x" * 256 + ".jpg", "component over 255 bytes"),
        ("/".join(["y" * 200] * 6) + ".jpg", "name over 1024 bytes"),
        ("00000.tar/000000001.jpg", None),
        ("a/..b/c...d.seg.png", None),
    ],
)
def test_unsafe_member_names(name, reason):
    found = unsafe_member_reason(name)
    assert found is None if reason is None else reason in found, found


def test_precache_skips_hostile_names_and_pickle_like_members_with_reasons(hostile_source, tmp_path):
    cfg = config(hostile_source, tmp_path / "out")
    done = run_task(cfg, 0, 1)
    reasons = {s["key"].removeprefix("00000.tar/"): s["reason"] for s in done["skipped"]}
    assert set(reasons) == set(HOSTILE_NAMES) | set(PICKLE_LIKE) and done["samples"] == len(GOOD)
    for key, why in HOSTILE_NAMES.items():
        assert reasons[key].startswith("unsafe_name: ") and why in reasons[key]
    for key, ext in PICKLE_LIKE.items():
        assert reasons[key].startswith(f"unsafe_member: .{ext} is pickle-like") and "precache.trusted" in reasons[key]
    assert write_index(cfg)["skipped_in_reorganize"] == {"unsafe_member": 3, "unsafe_name": 4}

    out = tmp_path / "out"
    names = [n for tar in sorted(out.glob("*.tar")) for n in member_names(tar)]
    assert names == [f"00000.tar/{key}.{ext}" for key in GOOD for ext in ("safetensors", "txt")]
    everything = [p.name for p in tmp_path.rglob("*")]
    assert not [n for n in everything if "escape" in n or n.endswith((".pickle", ".pth", ".pyd"))], everything

    trusted = config(hostile_source, tmp_path / "trusted", trusted=True)  # documented: members precached, names not
    done = run_task(trusted, 0, 1)
    assert done["samples"] == len(GOOD) + len(PICKLE_LIKE)
    assert {s["key"].removeprefix("00000.tar/") for s in done["skipped"]} == set(HOSTILE_NAMES)


def test_merge_source_tar_copies_only_allowed_members(hostile_source, tmp_path):
    cfg = config(hostile_source, tmp_path / "out")
    run_task(cfg, 0, 1)
    before = (tmp_path / "out" / "t0_r0_0.tar").read_bytes()
    with pytest.raises(PrecacheError, match=r"\['pth'\] are not copied from source shards .*precache.trusted: true"):
        merge_source_tar(cfg, ["json", "pth"])
    assert (tmp_path / "out" / "t0_r0_0.tar").read_bytes() == before  # refused before a shard is touched
    assert merge_source_tar(cfg, ["json"]) == len(GOOD)
    merged = member_names(tmp_path / "out" / "t0_r0_0.tar")
    assert merged == [f"00000.tar/{key}.{ext}" for key in GOOD for ext in ("json", "safetensors", "txt")]

    trusted = config(hostile_source, tmp_path / "trusted", trusted=True)  # documented: any extension when trusted
    run_task(trusted, 0, 1)
    assert merge_source_tar(trusted, ["pth"]) == len(GOOD) + len(PICKLE_LIKE)
    assert "00000.tar/000000006.pth" in member_names(tmp_path / "trusted" / "t0_r0_0.tar")


@pytest.mark.parametrize(
    ("values", "path", "message", "trusted_allows"),
    [
        ({"merge_source_extensions": ["json", "pyd"]}, "precache.merge_source_extensions", "not copied from source",
         True),
        ({"merge_source_extensions": ["safetensors"]}, "precache.merge_source_extensions", "would replace them", False),
        ({"encodings": [{**TEXT, "extension": "pth"}]}, "precache.encodings.0.extension", "pickle-like", True),
        ({"encodings": [{**TEXT, "key": "pt"}]}, "precache.encodings.0.key", "reserved member extension", False),
    ],
)  # fmt: skip
def test_config_refuses_unsafe_member_settings(values, path, message, trusted_allows):
    tree = {"precache": {"input_dir": "/in", "output_dir": "/out", "encodings": [TEXT], **values}}
    with pytest.raises(RecipeError) as info:
        recipe_from_tree(tree)
    found = {issue.path: str(issue) for issue in info.value.issues}
    assert message in found[path], found
    if trusted_allows:
        recipe_from_tree({"precache": {**tree["precache"], "trusted": True}})


def tamper(shard: Path, after_key: str, name: str) -> None:
    """Rewrite `shard` with an extra member `name` right after the members of sample `after_key`."""
    with tarfile.open(shard) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar]
    position = max(i for i, (n, _) in enumerate(members) if n.startswith(f"{after_key}.")) + 1
    raw_tar(shard, [*members[:position], (name, b"\x80\x04payload"), *members[position:]])


@pytest.mark.parametrize("ext", ["pth", "pickle", "so"])
def test_read_encodings_refuses_a_cache_holding_an_unsafe_member(clean_source, tmp_path, ext):
    cfg = config(clean_source, tmp_path / "out")
    run_task(cfg, 0, 1)
    shard = tmp_path / "out" / "t0_r0_0.tar"
    tamper(shard, "00000.tar/000000001", f"00000.tar/000000001.{ext}")
    with pytest.raises(UnsafeCacheError) as info:
        list(read_encodings(cfg.output_dir, cfg))
    assert f"{shard}: member '00000.tar/000000001.{ext}' refused" in str(info.value)
    assert "precache.trusted: true" in str(info.value)
    assert len(list(read_encodings(cfg.output_dir, cfg, trusted=True))) == len(GOOD)  # documented: trusted reads it
    trusting = config(clean_source, tmp_path / "out", trusted=True)
    assert len(list(read_encodings(trusting.output_dir, trusting))) == len(GOOD)


def test_read_encodings_refuses_unsafe_names_even_when_trusted(clean_source, tmp_path):
    cfg = config(clean_source, tmp_path / "out")
    run_task(cfg, 0, 1)
    shard = tmp_path / "out" / "t0_r0_0.tar"
    tamper(shard, "00000.tar/000000002", "00000.tar/../../escape.txt")
    with pytest.raises(UnsafeCacheError, match=r"t0_r0_0.tar: '..' component in member name '00000.tar/../../esc"):
        list(read_encodings(cfg.output_dir, cfg, trusted=True))


def test_writer_refuses_unsafe_names(tmp_path):
    with TarShardWriter(str(tmp_path / "00000.tar")) as writer:
        for key in ("../../escape", "a/../../b", "nul\x00name", "y" * 300):
            with pytest.raises(ValueError, match="refused, a file under this name could escape"):
                writer.write(key, {"txt": b"x"})
        with pytest.raises(ValueError, match="absolute"):
            writer.write("/abs/escape2", {"txt": b"x"})
        writer.write("000000000", {"txt": b"x"})
        writer.commit()
    assert [key for key, _ in iter_samples(str(tmp_path / "00000.tar"))] == ["000000000"]


class FullDisk(io.FileIO):
    """SIMULATES a full disk: every write fails with ENOSPC. Buffered, as the real file is, small writes succeed
    until the buffer is flushed: by a big write, by the tar's close, or by closing the file."""

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")


def writer_on_full_disk(final: Path) -> TarShardWriter:
    writer = TarShardWriter(str(final))
    writer._file.close()
    writer._file = writer._tar.fileobj = io.BufferedWriter(FullDisk(writer._tmp, "wb"))
    return writer


def temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_abort_after_simulated_enospc_leaves_no_tmp_and_raises_nothing(tmp_path):
    writer = writer_on_full_disk(tmp_path / "00000.tar")
    writer.write("000000000", {"txt": b"small: stays in the buffer"})
    assert temporaries(tmp_path)
    writer.abort()  # closing flushes the buffered tail: ENOSPC again, swallowed; the temporary goes
    assert temporaries(tmp_path) == [] and not (tmp_path / "00000.tar").exists()
    writer.abort()  # twice is harmless (a `with` block aborts after a failed write too)

    writer = writer_on_full_disk(tmp_path / "00001.tar")
    with pytest.raises(StorageError) as info:
        writer.write("000000000", {"jpg": bytes(1 << 16)})  # larger than the buffer: written through, fails
    assert info.value.errno == errno.ENOSPC and str(tmp_path / "00001.tar") in str(info.value)
    assert "no space left on the device" in str(info.value) and temporaries(tmp_path) == []

    writer = writer_on_full_disk(tmp_path / "00002.tar")
    writer.write("000000000", {"txt": b"small"})
    with pytest.raises(StorageError, match="00002.tar: cannot write: no space left"):
        writer.commit()  # the tar's end blocks flush the buffer
    assert temporaries(tmp_path) == [] and not (tmp_path / "00002.tar").exists()


def test_precache_removes_its_temporary_when_a_shard_write_fails(hostile_source, tmp_path, monkeypatch):
    """A permanent error while writing an output shard (SIMULATED ENOSPC) fails the task as a StorageError, not a
    skip, and leaves no temporary in the output folder."""
    original = TarShardWriter.write

    def full_after_two(self, key, members):
        if self.nsamples == 2:
            self._file.close()  # flushes what the first two samples wrote
            self._file = self._tar.fileobj = io.BufferedWriter(FullDisk(self._tmp, "ab"), buffer_size=16)
        original(self, key, members)

    monkeypatch.setattr(TarShardWriter, "write", full_after_two)
    cfg = config(hostile_source, tmp_path / "out")
    with pytest.raises(StorageError, match="t0_r0_0.tar: cannot write: no space left"):
        run_task(cfg, 0, 1)
    assert temporaries(tmp_path / "out") == [] and not list((tmp_path / "out").glob("*.json"))
