"""`aesthetic`: the LAION aesthetic predictor (improved-aesthetic-predictor, the one DDPO trains on).

score = head(e / ||e||), e = CLIP's projected image embedding, head = a stack of Linear layers with no activations
between them (as published; its dropouts are no-ops at inference). With the public head on CLIP ViT-L/14 scores
land around 1-10 (higher: more aesthetic); with any other CLIP or head they are on that head's own scale.

The head file is `.safetensors` (pickle files are refused: loading one can run arbitrary code). Keys are
`layers.{i}.weight` [out, in] and `layers.{i}.bias` [out], applied in increasing i; the first `in` must equal the
CLIP's `projection_dim`, each `out` the next layer's `in`, the last `out` 1. The public LAION head
(`sac+logos+ava1-l14-linearMSE.pth`, for ViT-L/14, projection_dim 768) has exactly this layout:

| key             | shape        |
|-----------------|--------------|
| layers.0.*      | [1024, 768]  |
| layers.2.*      | [128, 1024]  |
| layers.4.*      | [64, 128]    |
| layers.6.*      | [16, 64]     |
| layers.7.*      | [1, 16]      |

Convert it once, in a trusted environment:

    import torch, safetensors.torch
    state = torch.load("sac+logos+ava1-l14-linearMSE.pth", map_location="cpu", weights_only=True)
    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, "aesthetic_head.safetensors")
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from unirl_core.rewards.clip import in_batches, load_clip

_KEY = re.compile(r"layers\.(\d+)\.(weight|bias)")
CONVERT_HINT = (
    "convert it once with torch.load(path, map_location='cpu', weights_only=True) and "
    "safetensors.torch.save_file (see unirl_core/rewards/aesthetic.py)"
)


class AestheticHead(torch.nn.Module):
    """Linear layers applied in order, no activations: [B, in] -> [B]."""

    def __init__(self, linears: Sequence[torch.nn.Linear]):
        super().__init__()
        self.linears = torch.nn.ModuleList(linears)

    @property
    def in_features(self) -> int:
        return self.linears[0].in_features

    def forward(self, embeddings_BD: torch.Tensor) -> torch.Tensor:
        hidden = embeddings_BD
        for linear in self.linears:
            hidden = linear(hidden)
        return hidden.squeeze(-1)


def load_aesthetic_head(path: str | Path) -> AestheticHead:
    """The head in the `.safetensors` file `path` (layout in the module docstring), eval mode, float32."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(
            f"aesthetic head {str(path)!r}: only .safetensors files are loaded (never pickle); " + CONVERT_HINT
        )
    try:
        state = load_file(str(path))
    except SafetensorError as exc:
        raise ValueError(
            f"aesthetic head {str(path)!r} is not a valid safetensors file ({exc}); " + CONVERT_HINT
        ) from None
    return _head_from_state(state, str(path))


def _head_from_state(state: dict[str, torch.Tensor], source: str) -> AestheticHead:
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        match = _KEY.fullmatch(key)
        if match is None:
            raise ValueError(f"aesthetic head {source!r}: unexpected key {key!r}; expected layers.<i>.weight/bias")
        layers.setdefault(int(match[1]), {})[match[2]] = tensor.float()
    linears = []
    for index in sorted(layers):
        weight, bias = layers[index].get("weight"), layers[index].get("bias")
        fan_in = linears[-1].out_features if linears else None
        if weight is None or bias is None or weight.ndim != 2 or bias.shape != weight.shape[:1]:
            raise ValueError(f"aesthetic head {source!r}: layers.{index} needs weight [out, in] and bias [out]")
        if fan_in is not None and weight.shape[1] != fan_in:
            raise ValueError(f"aesthetic head {source!r}: layers.{index} takes {weight.shape[1]} inputs, not {fan_in}")
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
        linear.load_state_dict({"weight": weight, "bias": bias})
        linears.append(linear)
    if not linears or linears[-1].out_features != 1:
        raise ValueError(f"aesthetic head {source!r}: the last layer must output 1 score")
    return AestheticHead(linears).eval().requires_grad_(False)


class AestheticScore:
    """The `aesthetic` reward: the head's score of each image's normalized CLIP embedding (prompts unused)."""

    def __init__(
        self, clip_model_path: str | Path, head_path: str | Path, device: str | torch.device = "cpu", batch_size=32
    ):
        self.clip = load_clip(clip_model_path, device)
        self.head = load_aesthetic_head(head_path).to(self.clip.device)
        self.batch_size = batch_size
        if self.head.in_features != self.clip.embed_dim:
            raise ValueError(
                f"aesthetic head {str(head_path)!r} takes {self.head.in_features}-d embeddings but the CLIP in "
                f"{str(clip_model_path)!r} makes {self.clip.embed_dim}-d ones: use the CLIP the head was trained on"
            )

    @torch.inference_mode()
    def __call__(self, images: Sequence[Image.Image], prompts=(), sample_ids=()) -> np.ndarray:
        if not images:
            return np.zeros(0)
        embeddings_BD = in_batches(self.clip.embed_images, list(images), self.batch_size)
        return self.head(embeddings_BD).cpu().double().numpy()
