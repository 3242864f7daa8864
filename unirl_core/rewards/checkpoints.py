"""Reading a reward model's published weights safely: a state dict of tensors, never pickled code.

`read_tensors(path, what, hint)`: `.safetensors`, or a torch.save file read with `torch.load(weights_only=True)`
(a dict of tensors, or {"state_dict": ...} as open_clip and many training scripts save); anything else is a
ValueError naming the file, why, and what to give. `check_keys` compares a state dict with the shapes a model expects
and names a few missing, unexpected and misshapen keys instead of a page of torch's load_state_dict output.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from pathlib import Path

import torch


def read_tensors(path: str | Path, what: str, hint: str) -> dict[str, torch.Tensor]:
    """The tensors of checkpoint `path` (`what`, e.g. "HPSv2 checkpoint"; `hint`: the file to give instead)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except SafetensorError as exc:
            raise ValueError(f"{what} {str(path)!r} is not a valid safetensors file ({exc})") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if refused:
            reason = f"it holds a pickled {refused.group(1)} besides tensors, and unpickling that could run code"
        else:
            reason = f"torch.load(weights_only=True) cannot read it: {str(exc).strip().splitlines()[-1]}"
        raise ValueError(f"{what} {str(path)!r} is not loaded ({reason}): give {hint}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise ValueError(f"{what} {str(path)!r} is not a state dict of tensors: give {hint}")
    return state


def check_keys(
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, tuple[int, ...]],
    mismatch: str,
    ignored: re.Pattern | None = None,
) -> None:
    """ValueError `mismatch (3 missing keys, e.g. a, b; ...)` unless `state` has exactly `expected`'s keys and
    shapes (keys matching `ignored` may be there too)."""
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected and not (ignored and ignored.fullmatch(key))]
    misshapen = [
        f"{key} {tuple(state[key].shape)} (expected {expected[key]})"
        for key in expected
        if key in state and tuple(state[key].shape) != expected[key]
    ]
    problems = [
        f"{len(keys)} {kind}, e.g. {', '.join(keys[:3])}"
        for kind, keys in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", misshapen))
        if keys
    ]
    if problems:
        raise ValueError(mismatch.format(problems="; ".join(problems)))
