"""From a mixture config to packed batches: one Packer per (rank, worker), a torch IterableDataset for DataLoader
workers, and the statistics `unirl bagel pack-stats` prints.

Resume: every batch from `PackedDataset` carries `data_status`, the packer state after that batch (each group's
reader position and layout, the overflow buffer, the packer's random state). Keep the latest one per worker; a new
`PackedDataset(..., data_status={worker_id: state})` continues with exactly the next batch of each worker.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from unirl_core.data.bagel.config import Mixture
from unirl_core.data.bagel.datasets import DATASET_REGISTRY, Layout
from unirl_core.data.bagel.packing import Packer, PackGroup, PackingConfig
from unirl_core.data.bagel.tokenizer import encode, load_tokenizer


def packing_config(mixture: Mixture) -> PackingConfig:
    """The mixture's packing settings; refuses image sizes whose grids the position ids cannot hold, by name, before
    any data is read (BAGEL would index its position embeddings out of range)."""
    config = PackingConfig.from_dict({"seed": mixture.seed, "target": mixture.target, **mixture.packing})
    for kind, group in mixture.groups.items():
        vae = group.image_transform_args if kind != "vlm_sft" else None
        if vae is not None and vae.max_image_size // config.vae_image_downsample > config.max_latent_size:
            raise ValueError(
                f"{kind}: image_transform_args.max_image_size {vae.max_image_size} gives latent grids of "
                f"{vae.max_image_size // config.vae_image_downsample} per side, over packing.max_latent_size="
                f"{config.max_latent_size}: set `packing: {{max_latent_size: 64}}` (the released BAGEL-7B-MoT's; "
                "BAGEL's trainer: --max_latent_size 64) or lower max_image_size"
            )
    return config


def open_groups(mixture: Mixture, layout: Layout, tokenizer=None) -> tuple[dict[str, Any], Any]:
    """The mixture's datasets (by type, in config order) and the special tokens."""
    if tokenizer is None:
        if not mixture.tokenizer:
            raise ValueError("the BAGEL data config names no `tokenizer:` folder (or pass --tokenizer)")
        tokenizer = load_tokenizer(mixture.tokenizer)
    text_tokenizer, special = tokenizer
    if layout.seed is None:  # the mixture's seed (42, BAGEL's data_seed, unless the config sets one)
        layout = dataclasses.replace(layout, seed=mixture.seed)
    datasets = {
        kind: DATASET_REGISTRY[kind](
            group, mixture.infos(kind), lambda text: encode(text_tokenizer, text), layout, mixture.target
        )
        for kind, group in mixture.groups.items()
    }
    return datasets, special


def open_packer(
    mixture: Mixture, layout: Layout = Layout(), worker_id: int = 0, state: dict | None = None, tokenizer=None
) -> Packer:
    """The packer of one (rank, worker); `state` is a `packer.state()` taken earlier with the same layout."""
    packing = packing_config(mixture)
    datasets, special = open_groups(mixture, layout, tokenizer)
    groups = [
        PackGroup(
            name=kind,
            weight=mixture.groups[kind].weight,
            is_mandatory=mixture.groups[kind].is_mandatory,
            reader=data.reader(worker_id, state["groups"][kind] if state else None),
        )
        for kind, data in datasets.items()
    ]
    return Packer(groups, special, packing, state)


class PackedDataset(torch.utils.data.IterableDataset):
    """Packed batches of this rank; under a DataLoader each worker packs its own files. Use batch_size=None
    (a batch is already a pack) and num_workers equal to `layout.num_workers`. Endless unless `packs_per_worker`
    is set: then each worker stops after that many packs and the DataLoader ends cleanly (an endless loader's
    workers are stopped mid-pack when it is dropped)."""

    def __init__(
        self,
        mixture: Mixture,
        layout: Layout = Layout(),
        data_status: dict[int | str, dict] | None = None,
        packs_per_worker: int | None = None,
    ):
        if packs_per_worker is not None and packs_per_worker < 1:
            raise ValueError(f"packs_per_worker must be at least 1 (got {packs_per_worker}); None means endless")
        self.mixture, self.layout, self.packs_per_worker = mixture, layout, packs_per_worker
        # keys become strings when the status went through JSON (a checkpoint): worker ids are ints
        self.data_status = {int(worker): state for worker, state in (data_status or {}).items()}

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers = info.num_workers if info is not None else 1
        if workers != self.layout.num_workers:
            raise ValueError(f"the DataLoader runs {workers} workers but the layout says {self.layout.num_workers}")
        worker_id = info.id if info is not None else 0
        packer = open_packer(self.mixture, self.layout, worker_id, self.data_status.get(worker_id))
        for count, batch in enumerate(packer, start=1):
            batch["data_status"] = packer.state()
            batch["worker_id"] = worker_id
            yield batch
            if count == self.packs_per_worker:
                return


def pack_stats(
    mixture: Mixture, packs: int, layout: Layout = Layout(), worker_id: int = 0, tokenizer=None
) -> dict[str, Any]:
    """Pack `packs` packs of one (rank, worker) and return the packer's summary plus timing."""
    packer = open_packer(mixture, layout, worker_id, tokenizer=tokenizer)
    fills, started = [], time.perf_counter()
    for _ in range(packs):
        batch = next(packer)
        fills.append(batch["sequence_length"] / packer.config.expected_num_tokens)
    seconds = time.perf_counter() - started
    summary = packer.stats.summary()
    packed = sum(summary["samples_per_pack"].values()) * summary["packs"]
    return summary | {
        "packed_for": mixture.target,  # whose trainer the packs are for: bagel (BAGEL's) or unirl
        "target": packer.config.expected_num_tokens,
        "hard_cap": packer.config.max_num_tokens,
        "min_fill_ratio": min(fills) if fills else 0.0,
        "max_fill_ratio": max(fills) if fills else 0.0,
        "seconds": seconds,
        "samples_per_second": packed / seconds if seconds > 0 else 0.0,
    }


def resolve_config(config: str, workspace: Path) -> Path:
    """A mixture YAML path, or `demo`: the demo mixture, written under `workspace` once."""
    if config != "demo":
        return Path(config)
    from unirl_core.data.bagel.demo import write_demo_mixture

    path = workspace / "mixture.yaml"
    if path.is_file() and "num_used_data" in path.read_text():  # one written before `target` existed: rewrite
        return path
    return write_demo_mixture(workspace)
