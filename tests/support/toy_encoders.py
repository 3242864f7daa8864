"""Encoder classes for precache tests, honouring NeMo's contract (importable by DataLoader and CLI subprocesses)."""

from __future__ import annotations

import time

import torch


class SlowText:
    """Text -> (hidden [B,T,4], mask [B,T]) with T = 8, after a pause per batch: slow enough to be killed mid-task."""

    def __init__(self, delay_s: float = 0.05):
        self.delay_s = delay_s

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        codes = torch.zeros(len(texts), 8, 4)
        mask = torch.zeros(len(texts), 8, dtype=torch.long)
        for i, text in enumerate(texts):
            data = text.encode()[:8]
            mask[i, : len(data)] = 1
            codes[i, : len(data)] = torch.tensor(list(data), dtype=torch.float32)[:, None] / 255
        return codes, mask
