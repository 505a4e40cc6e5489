"""Documents in, chunks out: file readers and the token-aware chunker."""

from llmframe_ray.ingest.chunker import (
    Chunker,
    HFTokenCounter,
    TokenCounter,
    WhitespaceTokenCounter,
)
from llmframe_ray.ingest.readers import (
    SUPPORTED_SUFFIXES,
    iter_documents,
    read_document,
    read_jsonl,
)

__all__ = [
    "SUPPORTED_SUFFIXES",
    "Chunker",
    "HFTokenCounter",
    "TokenCounter",
    "WhitespaceTokenCounter",
    "iter_documents",
    "read_document",
    "read_jsonl",
]
