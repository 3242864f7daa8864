"""BAGEL video frame sampler on tiny generated videos; the tokenizer loader on the in-memory tiny tokenizer."""

import random
import sys

import numpy as np
import pytest

from unirl_core.data.bagel.tokenizer import BAGEL_SPECIAL_TOKENS, encode, load_tokenizer, write_tiny_tokenizer
from unirl_core.data.bagel.video import FrameSampler, VideoDecodeError, frame_indexes

COLOR_STEP = 8  # frame i is a solid color with red = i * COLOR_STEP, so a decoded frame tells its own index


def write_video(path, num_frames: int) -> str:
    """A 32x24 video; mp4 (mpeg4, frame count in the header) or mkv (lossless ffv1, no frame count in the header)."""
    av = pytest.importorskip("av")
    codec, pix_fmt = ("mpeg4", "yuv420p") if path.suffix == ".mp4" else ("ffv1", "bgr0")
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 24, pix_fmt
        if codec == "mpeg4":
            stream.bit_rate, stream.options = 5_000_000, {"qmin": "1", "qmax": "2"}
        for i in range(num_frames):
            rgb = np.zeros((24, 32, 3), np.uint8)
            rgb[..., 0], rgb[..., 1], rgb[..., 2] = i * COLOR_STEP, 128, 255 - i * COLOR_STEP
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return str(path)


def index_of(frame) -> int:
    return round(np.asarray(frame)[..., 0].mean() / COLOR_STEP)


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_frame_sampler_returns_evenly_spread_frames_in_order(tmp_path, suffix):
    path = write_video(tmp_path / f"clip{suffix}", num_frames=30)
    sampler = FrameSampler(max_num_frames=12, min_num_frames=8, target="unirl")
    for seed in range(5):
        frames, indexes = sampler(path, random.Random(seed))
        assert 8 <= len(frames) <= 12
        assert indexes == frame_indexes(30, len(frames))
        assert indexes == sorted(set(indexes)) and indexes[0] >= 0 and indexes[-1] < 30
        assert [index_of(frame) for frame in frames] == indexes
        assert all(frame.mode == "RGB" and frame.size == (32, 24) for frame in frames)


def test_bagel_frames_are_drawn_at_random_within_each_segment(tmp_path):
    """BAGEL's get_frame_indices(sample="rand"): 30 frames in 10 segments [3k, 3k + 3); its range(a, b - 1) draws
    3k or 3k + 1, never the segment's last frame 3k + 2."""
    path = write_video(tmp_path / "clip.mkv", num_frames=30)
    sampler = FrameSampler(max_num_frames=10, min_num_frames=10)  # target bagel, the default
    seen = set()
    for seed in range(12):
        frames, indexes = sampler(path, random.Random(seed))
        assert len(indexes) == 10 and [index_of(frame) for frame in frames] == indexes
        assert all(index - 3 * k in (0, 1) for k, index in enumerate(indexes)), indexes
        seen.add(tuple(indexes))
    assert len(seen) > 6  # random, not one fixed choice


def test_frame_sampler_same_seed_same_frames(tmp_path):
    path = write_video(tmp_path / "clip.mp4", num_frames=30)
    sampler = FrameSampler()
    draws = [sampler(path, random.Random(seed))[1] for seed in (7, 7, 8, 9, 10, 11)]
    assert draws[0] == draws[1]
    assert len({len(indexes) for indexes in draws}) > 1  # the frame count does vary with the seed


def test_short_video_returns_all_its_frames(tmp_path):
    """5 frames, 8..12 asked: ours returns the 5; BAGEL's segments of one frame are empty ranges, so it draws 5
    distinct frames over the video (all of them) and repeats the last up to the count asked."""
    path = write_video(tmp_path / "short.mkv", num_frames=5)
    frames, indexes = FrameSampler(max_num_frames=12, min_num_frames=8, target="unirl")(path, random.Random(0))
    assert indexes == [0, 1, 2, 3, 4]
    assert [index_of(frame) for frame in frames] == indexes
    frames, indexes = FrameSampler(max_num_frames=12, min_num_frames=8)(path, random.Random(0))
    assert 8 <= len(indexes) <= 12 and indexes == [0, 1, 2, 3, 4] + [4] * (len(indexes) - 5)
    assert [index_of(frame) for frame in frames] == indexes


def test_unreadable_video_raises_naming_the_path(tmp_path):
    missing = str(tmp_path / "missing.mp4")
    with pytest.raises(VideoDecodeError, match="missing.mp4"):
        FrameSampler()(missing, random.Random(0))
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"not a video" * 100)
    with pytest.raises(VideoDecodeError, match="corrupt.mp4"):
        FrameSampler()(str(corrupt), random.Random(0))


def test_frame_sampler_refuses_min_above_max():
    with pytest.raises(ValueError, match="min_num_frames"):
        FrameSampler(max_num_frames=4, min_num_frames=8)


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    return load_tokenizer(write_tiny_tokenizer(str(tmp_path_factory.mktemp("tokenizer"))))


@pytest.mark.parametrize(
    "text, num_tokens",
    [
        ("A cat sitting on a mat", 6),
        ("A red car, 12 trees!", 8),  # a red car , 1 2 trees !
        ("<image> Describe the image.", 7),  # < image > describe the image .
        ("Zebras xylophone", 2),  # unknown words: one [UNK] each
        ("", 0),
    ],
)
def test_tiny_tokenizer_counts_are_exact(tiny_tokenizer, text, num_tokens):
    tokenizer, _ = tiny_tokenizer
    assert len(encode(tokenizer, text)) == num_tokens


def test_unknown_words_map_to_unk(tiny_tokenizer):
    tokenizer, _ = tiny_tokenizer
    assert encode(tokenizer, "zebra") == [tokenizer.unk_token_id]
    assert tokenizer.unk_token_id not in encode(tokenizer, "A cat sitting on a mat")


def test_special_tokens_are_distinct_and_decode_back(tiny_tokenizer):
    tokenizer, special = tiny_tokenizer
    ids = [special.bos_token_id, special.eos_token_id, special.start_of_image, special.end_of_image]
    assert len(set(ids)) == 4 and tokenizer.unk_token_id not in ids
    assert [tokenizer.decode([token_id]) for token_id in ids] == list(BAGEL_SPECIAL_TOKENS)
    cat_ids = encode(tokenizer, "a cat")
    assert encode(tokenizer, "<|im_start|>a cat<|im_end|>") == [special.bos_token_id, *cat_ids, special.eos_token_id]


def test_missing_special_tokens_are_added(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "cat": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(str(tmp_path))
    tokenizer, special = load_tokenizer(str(tmp_path))
    ids = [special.bos_token_id, special.eos_token_id, special.start_of_image, special.end_of_image]
    assert sorted(ids) == [2, 3, 4, 5] and len(tokenizer) == 6
    assert encode(tokenizer, "<|vision_start|>cat<|vision_end|>") == [special.start_of_image, 1, special.end_of_image]


def test_folder_without_tokenizer_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("no tokenizer here")
    with pytest.raises(ValueError, match=f"{tmp_path}.*tokenizer.json"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="does-not-exist"):
        load_tokenizer(str(tmp_path / "does-not-exist"))


def test_missing_pyav_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'unirl\[video\]'"):
        FrameSampler()(str(tmp_path / "clip.mp4"), random.Random(0))
