"""Index shards: dense (FAISS), sparse (bm25s), chunk store, manifest, and published versions."""

from llmframe_ray.index.dense import DenseIndex, DenseParams
from llmframe_ray.index.manifest import FORMAT_VERSION, Manifest
from llmframe_ray.index.shard import IndexShard
from llmframe_ray.index.sparse import CorpusStats, SparseIndex, SparseParams
from llmframe_ray.index.store import ChunkStore
from llmframe_ray.index.versions import IndexDirectory, LoadedIndex

__all__ = [
    "FORMAT_VERSION",
    "ChunkStore",
    "CorpusStats",
    "DenseIndex",
    "DenseParams",
    "IndexDirectory",
    "IndexShard",
    "LoadedIndex",
    "Manifest",
    "SparseIndex",
    "SparseParams",
]
