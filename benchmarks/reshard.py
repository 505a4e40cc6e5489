"""Copy an index's CURRENT version into a new index with another number of shards, reusing its
chunks and vectors (no re-embedding): for benchmarks that compare 1 and N shards of one corpus.

    .venv/bin/python benchmarks/reshard.py SOURCE_INDEX TARGET_INDEX --shards 4

Chunks are routed, and BM25 scored with corpus-wide statistics, as `llmframe-ray ingest --shards
N` does. The index parameters come from the LLMFRAME_* settings, which must match the source's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmframe_ray.index.manifest import thaw  # noqa: E402
from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.index.versions import IndexDirectory  # noqa: E402
from llmframe_ray.ingest.build import publish_shards  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--shards", type=int, required=True)
    args = parser.parse_args()
    if args.target.exists() and any(args.target.iterdir()):
        parser.error(f"{args.target} exists and is not empty")
    loaded = IndexDirectory(args.source).load()
    chunks, vectors = [], []
    for shard in loaded.shards:
        chunks.extend(shard.store)
        vectors.append(shard.dense.vectors(range(len(shard))))
    manifest = loaded.shards[0].manifest
    model = thaw(manifest.model)
    params = load_settings().params().index  # LLMFRAME_* settings, as ingest uses them
    problem = params.mismatch(manifest, model)
    if problem is not None:
        raise SystemExit(f"the settings here differ from the source's: {problem}")
    version = publish_shards(
        IndexDirectory(args.target), chunks, np.vstack(vectors), params, model, args.shards
    )
    print(f"{args.target}: version {version}, {args.shards} shards, {len(chunks)} chunks")


if __name__ == "__main__":
    main()
