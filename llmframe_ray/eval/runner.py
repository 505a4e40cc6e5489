"""Evaluate retrieval modes on a BEIR collection: build (or reuse) an index, run, score.

Scores always come from the written TREC run files, read back by ir-measures, so the numbers
printed are the numbers any other scorer would compute from the same files.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from llmframe_ray.eval.beir import BeirDataset
from llmframe_ray.eval.trec import score_all_found, score_run, write_run
from llmframe_ray.index.manifest import FORMAT_VERSION
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.index.params import IndexParams
from llmframe_ray.ingest.build import build_index
from llmframe_ray.models.embedder import Embedder
from llmframe_ray.retrieve.pipeline import Pipeline, ResultLevel
from llmframe_ray.retrieve.rerank import RerankFusion
from llmframe_ray.errors import ModelError
from llmframe_ray.generate.rewriting import offline_rewrite
from llmframe_ray.retrieve.rewrite import QueryRewrite, RewriteParams, expand, feedback_terms, fuse_hit_lists, prf_depth, query_weights
from llmframe_ray.types import Choice, Hit, SearchMode

RUN_DEPTH = 100
QUERY_BATCH = 64


class EvalMode(Choice):
    """A retrieval mode as evaluated: the search modes, and hybrid followed by reranking."""

    BM25 = "bm25"
    DENSE = "dense"
    HYBRID = "hybrid"
    RERANK = "rerank"  # hybrid, head reranked as configured (fused with hybrid by default)
    RERANK_CE = "rerank-ce"  # hybrid, head ordered by the cross-encoder alone
    MULTI_QUERY = "multi-query"  # hybrid over the question and its offline rewrites, fused (retrieve/rewrite.py)
    PRF = "prf"  # hybrid, then hybrid with pseudo-relevance feedback terms, fused
    GRAPH = "graph"  # the knowledge graph's ranker alone (graph/rank.py)
    HYBRID_GRAPH = "hybrid-graph"  # BM25, dense and graph fused by RRF

    @classmethod
    def label(cls) -> str:
        return "evaluation mode"

    @property
    def search(self) -> tuple[SearchMode, bool]:
        """(search mode, rerank) that this evaluation mode runs."""
        if self in (EvalMode.RERANK, EvalMode.RERANK_CE):
            return SearchMode.HYBRID, True
        if self in (EvalMode.MULTI_QUERY, EvalMode.PRF):
            return SearchMode.HYBRID, False
        return SearchMode(self.value), False


def check_reranker_data(card: dict, dataset: BeirDataset) -> None:
    """Refuse a reranker whose model card says it was trained on these very judgments, or
    distilled from a teacher or started from a model that was (the card's `teacher` and `init`,
    recursively)."""
    for source in ("teacher", "init"):
        if isinstance(card.get(source), dict):
            check_reranker_data(card[source], dataset)
    data = card.get("data") or {}
    same_file = data.get("qrels_sha256") == dataset.qrels_sha256
    same_split = data.get("corpus_sha256") == dataset.corpus_sha256 and data.get("split") == dataset.split
    if same_file or same_split:
        raise ModelError(
            f"the reranker was trained on {data.get('dataset')}/qrels/{data.get('split')}.tsv; "
            f"evaluating it on the same judgments ({dataset.name} {dataset.split}) would report "
            "training data as test results"
        )


@dataclass(frozen=True)
class ModeResult:
    mode: str
    metrics: dict[str, float]
    run_path: Path
    queries: int
    seconds: float


def index_key(dataset: BeirDataset, params: IndexParams, embedder: Embedder) -> str:
    """A cache key over everything that changes the index: corpus bytes, format, and what
    `IndexParams.identity` names (model and build parameters)."""
    parts = {"corpus": dataset.corpus_sha256, "format": FORMAT_VERSION, "index": params.identity(embedder.info())}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def cached_index(
    dataset: BeirDataset,
    params: IndexParams,
    embedder: Embedder,
    indexes_dir: Path,
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """The index of the dataset's corpus under `indexes_dir`, built on first use."""
    root = Path(indexes_dir) / f"beir-{dataset.name}-{index_key(dataset, params, embedder)}"
    if IndexDirectory(root).current_version() is None:
        build_index(dataset.corpus, root, params, embedder, progress)
    return root


def run_reranked(
    pipeline: Pipeline, dataset: BeirDataset, depth: int = RUN_DEPTH
) -> dict[EvalMode, dict[str, list[tuple[str, float]]]]:
    """Both reranked runs from one cross-encoder pass: `rerank` (as configured) and
    `rerank-ce` (cross-encoder order alone)."""
    if pipeline.reranker is None:
        raise ModelError("reranking was asked for but no reranker is loaded")
    hybrid = run_mode(pipeline, dataset, SearchMode.HYBRID, depth, hits=True)
    steps = pipeline.rerank
    out: dict[EvalMode, dict[str, list[tuple[str, float]]]] = {EvalMode.RERANK: {}, EvalMode.RERANK_CE: {}}
    for qid, hits in hybrid.items():
        query = dataset.queries[qid]
        scores = pipeline.reranker.score(query, steps.passages(hits))
        for mode, fusion in ((EvalMode.RERANK, None), (EvalMode.RERANK_CE, RerankFusion.NONE)):
            ranked = steps.apply(query, hits, scores, fusion, pipeline.rerank_weight)
            out[mode][qid] = [(h.doc_id, h.score) for h in ranked]
    return out


def run_mode(
    pipeline: Pipeline,
    dataset: BeirDataset,
    mode: SearchMode | EvalMode,
    depth: int = RUN_DEPTH,
    *,
    hits: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Top-`depth` documents for every judged query of the dataset, in query order, as
    (doc_id, score) pairs (or the Hits themselves with `hits`); `progress(stage, done, total)`
    after each batch of queries.

    A query whose text is blank gets no line in the run, so it scores zero.
    """
    search_mode, rerank = EvalMode.from_str(mode.value).search
    qids = [qid for qid, text in dataset.queries.items() if text.strip()]
    results: dict[str, list[tuple[str, float]]] = {}
    for start in range(0, len(qids), QUERY_BATCH):
        batch = qids[start : start + QUERY_BATCH]
        found = pipeline.search_batch(
            [dataset.queries[q] for q in batch], search_mode, depth, ResultLevel.DOCUMENT,
            truncate=True, rerank=rerank,
        )
        for qid, ranked in zip(batch, found):
            results[qid] = list(ranked) if hits else [(h.doc_id, h.score) for h in ranked]
        if progress is not None:
            progress(f"{mode.value} queries", len(results), len(qids))
    return results


def run_rewritten(
    pipeline: Pipeline, dataset: BeirDataset, mode: EvalMode, params: RewriteParams, depth: int = RUN_DEPTH
) -> dict[str, list[tuple[str, float]]]:
    """The `multi-query` or `prf` run: the service's query rewriting (api/ranking.py) with the
    same core functions, over the in-process pipeline. Multi-query uses the offline rewriter
    (the harness calls no LLM)."""
    qids = [qid for qid, text in dataset.queries.items() if text.strip()]
    texts = [dataset.queries[q] for q in qids]

    def hybrid(queries: list[str], k: int) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        for start in range(0, len(queries), QUERY_BATCH):
            out.extend(pipeline.search_batch(queries[start : start + QUERY_BATCH], SearchMode.HYBRID, k, truncate=True))
        return out

    fused: list[list[Hit]] = []
    if mode is EvalMode.PRF:
        first = hybrid(texts, prf_depth(depth, params))
        expanded = [expand(t, feedback_terms(t, hits, params.prf_docs, params.prf_terms)) for t, hits in zip(texts, first)]
        second = hybrid(expanded, depth)
        fused = [fuse_hit_lists([a[:depth], b], [1.0, params.prf_weight], params.rrf_k, depth) for a, b in zip(first, second)]
    else:
        variants = [offline_rewrite(QueryRewrite.MULTI_QUERY, t, [], params).queries for t in texts]
        flat = hybrid([v for vs in variants for v in vs], depth)
        at = 0
        for vs in variants:
            lists, at = flat[at : at + len(vs)], at + len(vs)
            fused.append(fuse_hit_lists(lists, query_weights(len(lists), params, offline=True), params.rrf_k, depth))
    return {qid: [(h.doc_id, h.score) for h in hits] for qid, hits in zip(qids, fused)}


def evaluate(
    pipeline: Pipeline,
    dataset: BeirDataset,
    modes: Sequence[SearchMode | EvalMode],
    runs_dir: Path | None = None,
    depth: int = RUN_DEPTH,
    rewrite: RewriteParams | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[ModeResult]:
    """Run each mode, write `<runs_dir>/<mode>.trec`, and score it from the file."""
    out_dir = Path(runs_dir) if runs_dir is not None else Path(tempfile.mkdtemp(prefix="llmframe-runs-"))
    reports = []
    reranked: dict = {}
    rerank_seconds = 0.0
    for mode in modes:
        started = time.perf_counter()
        mode = EvalMode.from_str(mode.value)
        if mode in (EvalMode.RERANK, EvalMode.RERANK_CE):
            if not reranked:  # one scoring pass gives both runs; both report its time
                reranked = run_reranked(pipeline, dataset, depth)
                rerank_seconds = time.perf_counter() - started
            results = reranked[mode]
            seconds = rerank_seconds
        elif mode in (EvalMode.MULTI_QUERY, EvalMode.PRF):
            results = run_rewritten(pipeline, dataset, mode, rewrite or RewriteParams(), depth)
            seconds = time.perf_counter() - started
        else:
            results = run_mode(pipeline, dataset, mode, depth, progress=progress)
            seconds = time.perf_counter() - started
        path = write_run(out_dir / f"{mode.value}.trec", results, tag=f"llmframe-{mode.value}")
        metrics = score_run(path, dataset.qrels)
        if multi_hop(dataset):
            metrics.update(score_all_found(path, dataset.qrels))
        reports.append(ModeResult(mode.value, metrics, path, len(results), seconds))
    return reports


def multi_hop(dataset: BeirDataset) -> bool:
    """Every judged query needs a few (two to four) documents together, as HotpotQA's two gold
    paragraphs: R_all@k is reported too (on collections with many relevant documents per query
    it says nothing)."""
    return bool(dataset.qrels) and all(2 <= sum(1 for r in docs.values() if r > 0) <= 4 for docs in dataset.qrels.values())


def format_table(dataset: BeirDataset, reports: Sequence[ModeResult]) -> str:
    extra = [name for name in (reports[0].metrics if reports else {}) if name.startswith("R_all@")]
    lines = [
        f"dataset {dataset.name} ({len(dataset.corpus)} docs, {len(dataset.queries)} judged "
        f"{dataset.split} queries)",
        f"{'mode':<12} {'nDCG@10':>8} {'Recall@100':>11} " + "".join(f"{name:>9} " for name in extra)
        + f"{'queries/s':>10}  run file",
    ]
    for r in reports:
        qps = r.queries / r.seconds if r.seconds > 0 else float("inf")
        lines.append(
            f"{r.mode:<12} {r.metrics['nDCG@10']:>8.4f} {r.metrics['Recall@100']:>11.4f} "
            + "".join(f"{r.metrics[name]:>9.4f} " for name in extra)
            + f"{qps:>10.1f}  {r.run_path}"
        )
    if extra:
        lines.append("R_all@k: share of queries with every relevant document in the top k (both gold paragraphs)")
    return "\n".join(lines)
