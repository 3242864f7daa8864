"""The text tokenizer of the BAGEL data layer and its four special tokens.

BAGEL trains on Qwen2's tokenizer: `<|im_start|>` is BOS, `<|im_end|>` EOS, and `<|vision_start|>` /
`<|vision_end|>` surround every image. Like BAGEL, `load_tokenizer` adds whichever of these a tokenizer lacks (the
model's embedding table must then cover `len(tokenizer)`).

`write_tiny_tokenizer` builds a word-level tokenizer in memory for tests and demos: one id per word, per
punctuation character and per digit, so token counts are exact and predictable.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

BOS_TOKEN, EOS_TOKEN = "<|im_start|>", "<|im_end|>"
START_OF_IMAGE_TOKEN, END_OF_IMAGE_TOKEN = "<|vision_start|>", "<|vision_end|>"
BAGEL_SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, START_OF_IMAGE_TOKEN, END_OF_IMAGE_TOKEN)

# Either file lets AutoTokenizer pick the tokenizer class from a local folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids the packer puts around text (BOS/EOS) and images (start/end of image)."""

    bos_token_id: int
    eos_token_id: int
    start_of_image: int
    end_of_image: int


def load_tokenizer(path: str) -> tuple[PreTrainedTokenizerBase, SpecialTokens]:
    """A transformers tokenizer from a local folder (never downloads), with BAGEL's special tokens added if missing."""
    folder = Path(path)
    if not folder.is_dir() or not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"tokenizer path {path!r} is not a folder with tokenizer files: expected one of {', '.join(TOKENIZER_FILES)}"
        )
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    # get_vocab() includes added tokens; convert_tokens_to_ids() would answer the unk id for a missing token.
    vocab = tokenizer.get_vocab()
    missing = [token for token in BAGEL_SPECIAL_TOKENS if token not in vocab]
    if missing:
        tokenizer.add_tokens(missing, special_tokens=True)
    bos, eos, start, end = tokenizer.convert_tokens_to_ids(list(BAGEL_SPECIAL_TOKENS))
    return tokenizer, SpecialTokens(bos_token_id=bos, eos_token_id=eos, start_of_image=start, end_of_image=end)


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of `text`, without special tokens."""
    # The packer adds BOS/EOS around every text element itself; the tokenizer's own would double them.
    return tokenizer.encode(text, add_special_tokens=False)


# ~200 common English words, enough for captions and instructions in tests and demos.
_TINY_VOCAB_TEXT = """
a an the this that these those it its is are was were be been being has have had do does did not no yes
and or but if then so because of in on at to from with without by for over under above below between into onto
out up down near next behind front left right top bottom middle center inside outside
i you he she we they me him her us them my your his our their what which who where when why how here there
cat cats dog dogs bird birds horse fish cow sheep man woman men women boy girl child children person people
car bus train boat plane bike tree trees flower flowers grass sky cloud clouds sun moon star water sea river
lake beach mountain hill road street city house building room table chair bed window door wall floor mat
book cup plate food apple banana cake pizza ball hat shirt dress shoe bag
red blue green yellow black white gray brown orange pink purple
big small large little tall short long old new young happy sad beautiful bright dark light
one two three four five many some all each other more most very
sitting standing walking running flying swimming eating holding looking playing lying wearing riding
sit stand walk run fly swim eat hold look play lie wear ride make add remove change replace turn
image images picture photo video frame describe show shows showing see color style background
"""
TINY_VOCAB_WORDS = _TINY_VOCAB_TEXT.split()


def write_tiny_tokenizer(folder: str) -> str:
    """Build the tiny word-level tokenizer in memory, save it to `folder` and return `folder`.

    Lowercases, splits on whitespace, isolates every punctuation character and every digit; unknown words map to
    `[UNK]`. "A cat sitting on a mat" -> 6 ids; "<image>" -> 3 ids ("<", "image", ">").
    """
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for token in ["[UNK]", *TINY_VOCAB_WORDS, *string.punctuation, *string.digits, *BAGEL_SPECIAL_TOKENS]:
        vocab.setdefault(token, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("isolated"), pre_tokenizers.Digits(True)]
    )
    # Special tokens are matched before normalization and pre-tokenization, so "<|im_start|>" stays one id.
    backend.add_special_tokens([AddedToken(token, special=True) for token in BAGEL_SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        extra_special_tokens=[START_OF_IMAGE_TOKEN, END_OF_IMAGE_TOKEN],
    )
    tokenizer.save_pretrained(folder)
    return folder
