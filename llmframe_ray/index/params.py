"""What changes an index, in one place: the embedding model, chunking, dense and BM25 parameters.

The in-process build, the ingestion job, the evaluation cache and the query path all ask these
functions whether an index matches what they are about to do with it:

- `IndexParams.identity(model)`: everything an index's content depends on (the eval cache key);
- `IndexParams.mismatch(manifest)`: why an existing index cannot take more documents built
  with these parameters (the ingestion job refuses then);
- `check_model(index_model, embedder_model)`: whether queries can be embedded for an index.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from llmframe_ray.errors import ModelError
from llmframe_ray.index.dense import DenseIndexKind, DenseParams
from llmframe_ray.index.manifest import Manifest, thaw
from llmframe_ray.index.sparse import SparseParams

MODEL_IDENTITY = ("name", "dim", "max_length")  # what makes two embedders produce the same vectors
DENSE_BUILD_FIELDS = ("kind", "hnsw_m", "hnsw_ef_construction", "ivf_nlist")  # search-time ones aside


@dataclass(frozen=True)
class ChunkingParams:
    """Chunk size and overlap, in the embedder's tokens (special tokens and title included)."""

    chunk_size: int = 256
    chunk_overlap: int = 32

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class IndexParams:
    """The parameters an index is built with (the embedding model aside)."""

    chunking: ChunkingParams = field(default_factory=ChunkingParams)
    dense: DenseParams = field(default_factory=DenseParams)
    sparse: SparseParams = field(default_factory=SparseParams)

    def identity(self, model: Mapping[str, Any]) -> dict[str, Any]:
        """Everything the content of an index built with these parameters depends on (beside
        the documents): the model's identity and every build-time parameter."""
        dense = self.dense.to_dict()
        fields = DENSE_BUILD_FIELDS + (("flat_max_rows",) if self.dense.kind is DenseIndexKind.AUTO else ())
        return {
            "model": {k: model.get(k) for k in MODEL_IDENTITY},
            "chunking": self.chunking.to_dict(),
            "dense": {k: dense[k] for k in fields},
            "sparse": self.sparse.to_dict(),
        }

    def mismatch(self, manifest: Manifest, model: Mapping[str, Any]) -> str | None:
        """Why an index with this manifest cannot be extended with these parameters and this
        model (None: it can)."""
        old = {k: manifest.model.get(k) for k in MODEL_IDENTITY}
        new = self.identity(model)
        if old != new["model"]:
            return f"the index was built with model {old}, these settings give {new['model']}"
        parameters = thaw(manifest.parameters)
        if parameters.get("chunking", {}) != new["chunking"]:
            return f"the index was chunked with {parameters.get('chunking', {})}, these settings give {new['chunking']}"
        old_dense = parameters.get("dense", {})
        # a shard records the kind it was built as; `auto` may build any of them, shard by shard
        compared = [k for k in DENSE_BUILD_FIELDS if k != "kind" or self.dense.kind is not DenseIndexKind.AUTO]
        new_view = {k: new["dense"][k] for k in compared}
        if old_dense and {k: old_dense.get(k) for k in compared} != new_view:
            old_view = {k: old_dense.get(k) for k in compared}
            return f"the index's dense shards were built with {old_view}, these settings give {new_view}"
        old_sparse = parameters.get("sparse", {})
        if old_sparse and old_sparse != new["sparse"]:
            return f"the index's BM25 settings are {old_sparse}, these settings give {new['sparse']}"
        return None


def check_model(index_model: Mapping[str, Any], embedder_model: Mapping[str, Any]) -> None:
    """Queries embedded by `embedder_model` (an embedder's `info()`) must match the index's
    model (from its manifest)."""
    name, dim = index_model.get("name"), index_model.get("dim")
    # a hosted model's dimension may be unknown (0) until its first call
    if name != embedder_model["name"] or (embedder_model["dim"] and dim != embedder_model["dim"]):
        raise ModelError(
            f"the index was built with embedding model {name!r} (dim {dim}), but the loaded "
            f"embedder is {embedder_model['name']!r} (dim {embedder_model['dim']}); rebuild the "
            "index or change EMBEDDING_PROVIDER"
        )
