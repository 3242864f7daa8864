"""Video rows (`ingest.video`): the guards and skip reasons of process_video, one work unit of videos end to end
(metadata, counted skips, resume, byte-identical re-runs), and image datasets' settings hash unchanged."""

from __future__ import annotations

import json
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from unirl_core.config.ingest import IngestConfig, VideoIngestConfig
from unirl_core.data.synthetic_video import encode_webm, synthetic_clip, synthetic_video_rows
from unirl_core.data.video import Video, encode_mp4
from unirl_core.ingest.download import download_unit, output_fingerprint
from unirl_core.ingest.images import SkipSample
from unirl_core.ingest.plan import WorkUnit
from unirl_core.ingest.videos import VideoOptions, process_video, sniff_format

ROW_SCHEMA = pa.schema([("url", pa.string()), ("video", pa.binary()), ("caption", pa.string())])


def clip(frames: int = 16, fps: float = 12.0, size: tuple[int, int] = (32, 32)) -> Video:
    return Video(tuple(Image.new("RGB", size, (10 * i, 50, 200)) for i in range(frames)), fps)


def reason(data: bytes, **options) -> str:
    with pytest.raises(SkipSample) as caught:
        process_video(data, VideoOptions(**options))
    return caught.value.reason


def test_an_mp4_is_kept_byte_for_byte_with_its_metadata():
    data = encode_mp4(clip(16, 12.0))
    stored = process_video(data, VideoOptions())
    assert stored.data == data and not stored.reencoded and stored.source_format == "mp4"
    assert (stored.num_frames, stored.fps, stored.width, stored.height) == (16, 12.0, 32, 32)
    assert stored.duration == pytest.approx(16 / 12, abs=1e-5)


def test_a_webm_or_an_odd_sized_mov_becomes_a_deterministic_h264_mp4():
    webm = encode_webm(clip(12, 8.0))
    first, second = process_video(webm, VideoOptions()), process_video(webm, VideoOptions())
    assert first.reencoded and first.source_format == "webm" and sniff_format(first.data) == "mp4"
    assert first.data == second.data and first.num_frames == 12
    again = process_video(first.data, VideoOptions())  # the stored mp4 reads back with every frame
    assert (again.num_frames, again.fps, again.width) == (12, 8.0, 32)
    mov = process_video(encode_mov(clip(6, 10.0, size=(33, 31))), VideoOptions())  # yuv444: odd sizes allowed
    assert mov.reencoded and (mov.source_format, mov.num_frames, mov.fps) == ("mov", 6, 10.0)
    assert (mov.width, mov.height, mov.original_width, mov.original_height) == (34, 32, 33, 31)
    assert process_video(mov.data, VideoOptions()).num_frames == 6


def encode_mov(video: Video) -> bytes:
    import io

    import av
    import numpy as np

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mov") as container:
        stream = container.add_stream("libx264", rate=int(video.fps))
        stream.width, stream.height = video.size
        stream.pix_fmt = "yuv444p"
        for frame in video.frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.asarray(frame), format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


def faststart_mp4(video: Video, path) -> bytes:
    """An mp4 with its index (moov) first, as streaming sites serve them: cut short, its header still reads."""
    import av
    import numpy as np

    with av.open(str(path), mode="w", format="mp4", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=int(video.fps))
        stream.width, stream.height = video.size
        stream.pix_fmt = "yuv420p"
        for frame in video.frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.asarray(frame), format="rgb24")))
        container.mux(stream.encode())
    return path.read_bytes()


def test_an_mp4_cut_after_its_header_is_truncated(tmp_path):
    data = faststart_mp4(clip(24, 12.0), tmp_path / "faststart.mp4")
    assert process_video(data, VideoOptions()).num_frames == 24
    with pytest.raises(SkipSample) as caught:  # a frame that fails to decode, or fewer frames than the header lists
        process_video(data[: len(data) * 2 // 3], VideoOptions())
    assert caught.value.reason == "truncated"


def test_bad_videos_are_skips_by_reason():
    data = encode_mp4(clip(24, 4.0))  # 6 s
    assert reason(data, max_seconds=5) == "too_long"
    assert reason(data[: len(data) // 2]) == "truncated"
    assert reason(b"") == "not_a_video"
    assert reason(b"<html><body>not found</body></html>") == "not_a_video"
    assert reason(data, max_pixels=32 * 32 - 1) == "too_many_pixels"
    assert reason(encode_webm(clip(4)), formats=("mp4", "mov")) == "unsupported_format"
    mkv = b"\x1a\x45\xdf\xa3" + b"\x00" * 60  # Matroska, not webm: refused by its signature, never probed
    assert reason(mkv) == "unsupported_format"


def video_unit(tmp_path, rows: list[dict], root: str = "ds", **video) -> tuple[IngestConfig, WorkUnit]:
    path = tmp_path / "in.parquet"
    if not path.exists():
        pq.write_table(pa.Table.from_pylist(rows, schema=ROW_SCHEMA), path)
    config = IngestConfig.model_validate(
        {
            "dataset_output_root": str(tmp_path / root),
            "download_parquet": {"parquet_pattern": str(path)},
            "download_images": {"image_bytes_col": "video", "retries": 0, "error_budget": 1.0},
            "video": {"max_seconds": 5, **video},
        }
    )
    return config, WorkUnit(0, str(path), 0, len(rows))


def test_a_unit_of_videos_records_metadata_counts_skips_and_resumes(tmp_path):
    rows = [{"url": None, "video": r["video"], "caption": r["caption"]} for r in synthetic_video_rows(4, size=32)]
    rows.append({"url": "file:///etc/passwd", "video": None, "caption": "a local file"})
    config, unit = video_unit(tmp_path, rows)
    stats = download_unit(config.dataset_output_root, unit, config)
    assert stats["skip_reasons"] == {"blocked_scheme": 1, "not_a_video": 1, "too_long": 1, "truncated": 1}
    assert stats["successes"] == 5  # 4 clips (one webm) and the 4-frame clip
    records = pq.read_table(f"{config.dataset_output_root}/raw/00000.parquet").to_pylist()
    ok = [r for r in records if r["status"] == "success"]
    assert all(r["num_frames"] >= 4 and r["fps"] == 12.0 and r["duration"] > 0 for r in ok)
    assert {r["source_format"] for r in ok} == {"mp4", "webm"}
    with tarfile.open(f"{config.dataset_output_root}/raw/00000.tar") as tar:
        assert {n.rsplit(".", 1)[1] for n in tar.getnames()} == {"mp4", "txt", "json"}
        meta = json.loads(tar.extractfile(tar.getnames()[0]).read())
    assert {"duration", "fps", "num_frames", "width", "height", "source_format"} <= set(meta)

    assert download_unit(config.dataset_output_root, unit, config) == {
        k: v for k, v in stats.items() if k != "committed_now"
    }
    other, _ = video_unit(tmp_path, rows, root="again")
    download_unit(other.dataset_output_root, unit, other)
    for name in ("00000.tar", "00000.parquet"):
        assert (tmp_path / "ds" / "raw" / name).read_bytes() == (tmp_path / "again" / "raw" / name).read_bytes()


def test_the_video_byte_cap_applies_to_fetched_videos(tmp_path, image_server):
    data = encode_mp4(synthetic_clip(0)[0])
    rows = [{"url": image_server.add("/videos/clip.mp4", data), "video": None, "caption": "a clip"}]
    config, unit = video_unit(tmp_path, rows, max_bytes=len(data) - 1)
    config.download_images.allowed_private_networks = ["127.0.0.1/32"]
    stats = download_unit(config.dataset_output_root, unit, config)
    assert stats["skip_reasons"] == {"too_large": 1}


def test_image_datasets_keep_their_settings_hash():
    stage = IngestConfig().download_images
    assert output_fingerprint(stage) == output_fingerprint(stage, None)
    assert output_fingerprint(stage, VideoIngestConfig()) != output_fingerprint(stage)
    assert IngestConfig().file_ext_in_tar == ["jpg", "txt", "json"]
    assert IngestConfig(video={}).file_ext_in_tar == ["mp4", "txt", "json"]
