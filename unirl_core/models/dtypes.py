"""The one table from a config's dtype name to the torch dtype (models, precache encoders)."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
