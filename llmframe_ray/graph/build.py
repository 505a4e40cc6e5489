"""Build the knowledge graph of an index version and store it in that version (graph/store.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from llmframe_ray.graph.extract import OfflineExtractor
from llmframe_ray.graph.extractions import ExtractionStore, extractor_name
from llmframe_ray.graph.store import GRAPH_DIR, KnowledgeGraph, build_graph, index_chunks
from llmframe_ray.index.versions import IndexDirectory


def ensure_graph(
    index_dir: str | Path,
    version: str | None = None,
    *,
    rebuild: bool = False,
    max_community_size: int = 64,
    progress: Callable[[str, int, int], None] | None = None,
    llm: Any = None,
    summarizer: Any = None,
    embed: Callable[[list[str]], Any] | None = None,
) -> tuple[Path, KnowledgeGraph, bool]:
    """The graph of `version` (default: the served one), built and stored there if it has
    none yet, one by another extractor (version), or `rebuild`: (its folder, the graph, whether
    it was built now). `llm`: an LlmExtractor reads the chunks (graph/llm_extract.py). Chunks
    already in the index's extraction store (graph/extractions.py) are not read again.
    `summarizer`: an LlmSummarizer writes the community summaries (graph/llm_summaries.py).
    `embed`: the index's embedder, for the entity name vectors; a graph built without them is
    built again when it is given."""
    index = IndexDirectory(index_dir)
    loaded = index.load(version)
    directory = loaded.path / GRAPH_DIR
    if directory.is_dir() and not rebuild:
        graph = KnowledgeGraph.load(directory)
        if graph.info.get("extractor") == (OfflineExtractor.name if llm is None else llm.name) and (
            embed is None or "names_embedded" in graph.info
        ):
            return directory, graph, False
    graph = build_graph(
        index_chunks(list(zip(loaded.shard_ids, loaded.shards))),
        max_community_size=max_community_size, progress=progress, llm=llm,
        store=ExtractionStore(index.root, extractor_name(llm)), summarizer=summarizer, embed=embed,
    )
    graph.info["version"] = loaded.version
    with index.writer_lock():
        graph.save(directory)
    return directory, graph, True


def _chain(params: Any) -> tuple[Any, Any]:
    from llmframe_ray.generate.chain import provider_chain
    from llmframe_ray.generate.costs import PriceTable
    from llmframe_ray.generate.rewriting import has_llm

    chain = provider_chain(params.providers)
    if not has_llm(chain):
        raise ValueError("the llm graph extractor needs an LLM in the provider chain (ANTHROPIC_API_KEY or OPENAI_API_KEY)")
    return chain, PriceTable.from_json(params.service.generation.prices)


def llm_extractor(index_dir: str | Path, params: Any) -> Any:
    """The LLM extractor over the provider chain of `params` (config.Params), its cache in the
    index directory."""
    from llmframe_ray.graph.llm_extract import CACHE_FILE, ExtractionCache, LlmExtractor

    chain, prices = _chain(params)
    return LlmExtractor(chain, ExtractionCache(Path(index_dir) / CACHE_FILE), prices=prices)


def llm_summarizer(index_dir: str | Path, params: Any) -> Any:
    """The community summariser over the provider chain of `params`, its cache in the index directory."""
    from llmframe_ray.graph.llm_summaries import CACHE_FILE, LlmSummarizer, SummaryCache

    chain, prices = _chain(params)
    return LlmSummarizer(chain, SummaryCache(Path(index_dir) / CACHE_FILE), prices=prices)
