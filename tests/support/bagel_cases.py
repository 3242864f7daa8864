"""An ingested dataset as `unirl ingest` leaves it, for the BAGEL export tests."""

from __future__ import annotations

from pathlib import Path

import image_cases as cases

from unirl_core.ingest.reorganize import reorganize, shards_folder
from unirl_core.io.shard_index import generate_wdinfo
from unirl_core.io.tars import TarShardWriter


def write_ingested(root: Path, samples: int = 10, shard_size: int = 4) -> str:
    """`samples` captioned PNGs ("a red cat number i") committed in shards of `shard_size`; returns the root."""
    with TarShardWriter(str(root / "raw" / "00000.tar")) as writer:
        for i in range(samples):
            image = cases.encode(cases.procedural(96 + 8 * i, 80, seed=i), "PNG")
            writer.write(f"{i:09d}", {"png": image, "txt": f"a red cat number {i}".encode()})
        raw = writer.commit()
    record = reorganize(
        str(root), [{"path": str(root / "raw" / "00000.tar"), "sha256": raw.sha256}], shard_size, ["txt"]
    )
    generate_wdinfo(shards_folder(str(root)), record)
    return str(root)
