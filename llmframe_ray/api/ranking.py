"""The passages of a request, in the pipeline's strict order:

    check -> [query rewriting] -> retrieval of each query (hybrid / dense / sparse, alpha)
          -> [RRF over the queries' lists] -> [rerank the head] -> [contextual compression] -> top k

Each step's logic is a Ray-free core function (retrieve/rewrite.py, retrieve/compress.py,
retrieve/rerank.py); `Stages` reaches the models, in this process or through deployments.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from llmframe_ray.api.failures import FieldError, StageUnavailableError
from llmframe_ray.api.params import ServiceParams
from llmframe_ray.api.stages import Retrieved, Stages
from llmframe_ray.errors import QueryError
from llmframe_ray.generate.base import Message, Usage
from llmframe_ray.index.metadata import NS_SEP, Filter, public_id
from llmframe_ray.retrieve import compress
from llmframe_ray.retrieve.plan import ResultLevel
from llmframe_ray.retrieve.rewrite import (
    QueryRewrite, Rewrite, expand, feedback_terms, fuse_hit_lists, prf_depth, query_weights,
)
from llmframe_ray.retrieve.strategy import Strategy, StrategyError, alpha_weights, resolve
from llmframe_ray.types import Hit, SearchMode

logger = logging.getLogger(__name__)

SENTENCE_CACHE = 20_000  # sentence vectors kept for compression (384 floats each: about 30 MB)
COMMUNITIES = 2  # community summaries appended with include_communities
RERANK_SKIPPED = "the reranker is unavailable: hits are in first-stage order (reranked: false)"


@dataclass(frozen=True)
class Ask:
    """One request's retrieval: the text (and the request field that holds it), its options."""

    field: str
    text: str
    mode: str | None
    level: ResultLevel
    top_k: int
    rerank: bool | None
    where: Filter | None = None
    strategy: str | None = None
    alpha: float | None = None
    rewrite: str | None = None
    history: tuple[Message, ...] = ()
    budget_tokens: int | None = None
    threshold: float | None = None
    communities: bool = False

    @classmethod
    def of(cls, request: Any, field: str, text: str, level: ResultLevel, where: Filter | None,
           history: Sequence[Message] = ()) -> Ask:
        """From a search, query or chat request (they share the pipeline fields)."""
        return cls(
            field, text, request.mode, level, request.top_k, request.rerank, where, request.retrieval_strategy,
            request.alpha, request.query_rewrite, tuple(history), request.compression_budget_tokens,
            request.compression_threshold, request.include_communities,
        )


@dataclass(frozen=True)
class Ranked:
    version: str
    mode: SearchMode
    reranked: bool
    hits: list[Hit]
    timings_ms: dict[str, float]
    warnings: tuple[str, ...] = ()
    strategy: Strategy = Strategy.HYBRID
    rewrites: tuple[str, ...] = ()
    usage: Usage | None = None  # the LLM's tokens for rewriting, counted against the key


def ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 2)


def with_total(timings: dict[str, float]) -> dict[str, float]:
    return {**timings, "total": round(sum(v for k, v in timings.items() if k != "total"), 2)}


class Ranking:
    def __init__(self, stages: Stages, params: ServiceParams) -> None:
        self.stages = stages
        self.params = params
        self._rerank_weights: dict[str, float] = {}  # by index version
        self._card: dict[str, Any] | None = None  # the deployed reranker's model card, once asked
        self._sentence_vectors: OrderedDict[str, Any] = OrderedDict()  # sentence text -> unit vector

    async def ranked(self, ask: Ask) -> Ranked:
        limits, steps = self.params.limits, self.params.rerank
        if len(ask.text) > limits.max_query_chars:
            raise FieldError(ask.field, f"is {len(ask.text)} characters long; the limit is {limits.max_query_chars} (LLMFRAME_MAX_QUERY_CHARS)")
        if ask.top_k > limits.max_top_k:
            raise FieldError("top_k", f"must be at most {limits.max_top_k} (LLMFRAME_MAX_TOP_K), got {ask.top_k}")
        try:
            plan = resolve(ask.strategy, ask.mode, self.params.default_mode)
            if ask.alpha is not None:
                alpha_weights(ask.alpha)
        except StrategyError as exc:
            raise FieldError(exc.field, str(exc)) from None
        rerank = steps.enabled if ask.rerank is None else ask.rerank
        if rerank and not self.stages.has_reranker:
            raise FieldError(
                "rerank", "this server has no reranker (deploy it with a reranker model: LLMFRAME_RERANKER_ENABLED=true)"
            )
        kind = self.params.rewrite.default if ask.rewrite is None else QueryRewrite.from_str(ask.rewrite)
        timings: dict[str, float] = {}
        warnings: list[str] = []
        rewrite = Rewrite((ask.text,), "none")
        if kind in (QueryRewrite.CONVERSATIONAL, QueryRewrite.MULTI_QUERY):
            start = time.perf_counter()
            rewrite = await self._rewrite(kind, ask)
            timings["rewrite"] = ms(start)
            warnings.extend([rewrite.warning] if rewrite.warning else [])
        start = time.perf_counter()
        wanted = steps.wanted(ask.top_k, rerank)
        if kind is QueryRewrite.PRF:
            retrieved, queries = await self._prf(ask, plan.mode, wanted)
        else:
            retrieved, queries = await self._each(ask, rewrite.queries, rewrite.source, plan.mode, wanted, warnings)
        timings["retrieve"] = ms(start)
        # a request sees one namespace: its documents by the ids their tenant gave them
        hits = [
            replace(h, doc_id=public_id(h.doc_id), chunk_id=public_id(h.chunk_id)) if NS_SEP in h.doc_id else h
            for h in retrieved.hits
        ]
        main = queries[0]  # the question, or its standalone form: what reranking and compression read
        if rerank and hits:
            start = time.perf_counter()
            try:
                scores = await self.stages.rerank_scores(main, steps.passages(hits))
            except StageUnavailableError as exc:
                if not self.params.rerank_fail_open:
                    raise
                logger.warning("answering without reranking: %s", exc)
                rerank = False
                warnings.append(RERANK_SKIPPED)
            else:
                hits = steps.apply(main, hits, scores, weight=await self._rerank_weight(retrieved.version))
            timings["rerank"] = ms(start)
        hits = hits[: ask.top_k]
        usage = rewrite.usage
        if (plan.compress or ask.budget_tokens or ask.threshold is not None) and hits:
            start = time.perf_counter()
            hits, spent = await self._compress(main, hits, ask, warnings)
            usage = spent if usage is None else usage if spent is None else usage + spent
            timings["compress"] = ms(start)
        if ask.communities:
            start = time.perf_counter()
            hits = [*hits, *await self._communities(main, ask, len(hits))]
            timings["communities"] = ms(start)
        rewrites = tuple(q for q in queries if q != ask.text)
        return Ranked(
            retrieved.version, plan.mode, rerank, hits, with_total(timings), tuple(warnings), plan.strategy,
            rewrites, usage,
        )

    async def _communities(self, question: str, ask: Ask, after: int) -> list[Hit]:
        """The graph's community summaries for the question's entities, as passages after the hits."""
        found = await self.stages.graph_query("communities", {"q": question, "limit": COMMUNITIES, "where": ask.where})
        if found is None:
            raise FieldError("include_communities", "needs a knowledge graph in the served index version, and it has none "
                             "(build one with `llmframe-ray graph build`)")
        return [
            Hit(f"community:{c['id']}", f"community:{c['id']}", c["summary"], 0.0, after + rank,
                f"Community: {c['title']}", {"community": rank}, {"level": c["level"], "entities": c["entities"]})
            for rank, c in enumerate(found, 1)
        ]

    async def _rewrite(self, kind: QueryRewrite, ask: Ask) -> Rewrite:
        try:
            return await self.stages.rewrite(kind, ask.text, list(ask.history), self.params.rewrite)
        except Exception as exc:  # noqa: BLE001 - the Generator is down: retrieve the question as asked
            return Rewrite((ask.text,), "original", f"query rewriting ({kind.value}) failed, the original query was used: {exc}")

    async def _retrieve(self, field: str, text: str, mode: SearchMode, ask: Ask, top_k: int) -> Retrieved:
        try:
            return await self.stages.retrieve(text, mode, ask.level, top_k, ask.where, ask.alpha)
        except StrategyError as exc:  # a graph strategy on a version without a graph
            raise FieldError(exc.field, str(exc)) from None
        except QueryError as exc:
            raise FieldError(field, str(exc)) from None

    async def _each(
        self, ask: Ask, queries: Sequence[str], source: str, mode: SearchMode, top_k: int, warnings: list[str]
    ) -> tuple[Retrieved, tuple[str, ...]]:
        """Every query retrieved at once; several are fused by RRF. A rewritten query that
        cannot be searched (too long for the model) is left out with a warning."""
        first = self._retrieve(ask.field, queries[0], mode, ask, top_k)
        if len(queries) == 1:
            return await first, tuple(queries)
        results = await asyncio.gather(first, *(self.stages.retrieve(q, mode, ask.level, top_k, ask.where, ask.alpha) for q in queries[1:]), return_exceptions=True)
        kept: list[tuple[str, Retrieved]] = []
        for query, result in zip(queries, results):
            if isinstance(result, QueryError) and query != queries[0]:
                warnings.append(f"the rewritten query {query[:80]!r} was not searched: {result}")
            elif isinstance(result, BaseException):
                raise result
            else:
                kept.append((query, result))
        lists = [r.hits for _, r in kept]
        weights = query_weights(len(kept), self.params.rewrite, offline=source == "offline")
        fused = fuse_hit_lists(lists, weights, self.params.rewrite.rrf_k, top_k, ask.level is ResultLevel.CHUNK)
        return Retrieved(kept[0][1].version, fused), tuple(q for q, _ in kept)

    async def _prf(self, ask: Ask, mode: SearchMode, top_k: int) -> tuple[Retrieved, tuple[str, ...]]:
        """Pseudo-relevance feedback: the first pass's top documents give terms; the expanded
        query's list is fused with the first (weight LLMFRAME_PRF_WEIGHT against 1)."""
        params = self.params.rewrite
        first = await self._retrieve(ask.field, ask.text, mode, ask, prf_depth(top_k, params))
        terms = feedback_terms(ask.text, first.hits, params.prf_docs, params.prf_terms)
        if not terms:
            return Retrieved(first.version, first.hits[:top_k]), (ask.text,)
        expanded = expand(ask.text, terms)
        second = await self._retrieve(ask.field, expanded, mode, ask, top_k)
        fused = fuse_hit_lists(
            [first.hits[:top_k], second.hits], [1.0, params.prf_weight], params.rrf_k, top_k, ask.level is ResultLevel.CHUNK
        )
        return Retrieved(first.version, fused), (ask.text, expanded)

    async def _compress(self, query: str, hits: list[Hit], ask: Ask, warnings: list[str]) -> tuple[list[Hit], Usage | None]:
        """The hits cut to the sentences that matter, and the LLM's tokens when it chose them."""
        params = self.params.compression
        reranker = self.stages.has_reranker
        card = await self._reranker_card() if reranker and params.scorer is not compress.Scorer.EMBEDDER else {}
        use_ce = compress.uses_cross_encoder(_asked(params, ask), reranker, card)  # as the request leaves the rules
        if card is None:
            how = "compressed by the budget rule" if use_ce else "the reranker did not score the sentences"
            warnings.append(f"the reranker's model card could not be read: {how}")
        if use_ce and reranker:  # a reranker trained on rationale sentences: its evidence rule
            params = params.for_reranker(card or {})
        params = _asked(params, ask)
        split = compress.Split.of_hits(hits)
        if params.scorer is compress.Scorer.LLM:
            try:
                chosen = await self.stages.extract_sentences(
                    query, split.by_passage(), params.budget_tokens or sum(split.tokens), self.params.rewrite.timeout_s
                )
            except Exception as exc:  # noqa: BLE001 - compressed offline instead
                warnings.append(f"LLM compression failed, the sentences were scored offline: {exc}")
                chosen = None
            if chosen is not None:
                keep, usage = chosen
                return compress.apply(hits, split, compress.with_one_each(split, keep)), usage
        texts = [compress.scoring_text(hits[p].title, s) for p, s in zip(split.owner, split.sentences)]
        # the whole passages too, in the same call, where the reranker keeps passages whole
        # the prior and the relative rule read them beside cross-encoder sentence scores only;
        # the evidence rule reads the sentences alone
        by_passage = params.evidence is None and (
            params.passage_margin is not None or (use_ce and (params.relative is not None or params.passage_prior)))
        passages = [h.passage for h in hits] if by_passage and self.stages.has_reranker else []
        try:
            if use_ce:
                model = list(await self.stages.rerank_scores(query, texts + passages))
            else:
                model = await self._cosines(query, texts)
                if passages:
                    model += list(await self.stages.rerank_scores(query, passages))
        except StageUnavailableError as exc:
            warnings.append(f"contextual compression was skipped: {exc}")
            return hits, None
        passage_scores = model[len(texts):]
        whole = compress.whole_passages(passage_scores, params.passage_margin)
        overlap = compress.lexical_overlap(query, split.sentences)
        scores, evidence = compress.sentence_scores(model[: len(texts)], overlap, params, split.owner, use_ce, passage_scores)
        keep = compress.select(split, scores, params, whole, relative=use_ce and bool(passage_scores), evidence=evidence)
        return compress.apply(hits, split, keep), None

    async def _cosines(self, query: str, texts: list[str]) -> list[float]:
        """Each sentence's cosine with the question. Sentence vectors are kept (the last
        SENTENCE_CACHE): the same passages come back for many questions, and embedding their
        sentences is most of compression's cost."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._sentence_vectors))
        vectors = await self.stages.embed_texts([query[: compress.MAX_SENTENCE_CHARS], *missing])
        if vectors[0] is None:
            raise StageUnavailableError("the query encoder could not embed the question")
        for text, vector in zip(missing, vectors[1:]):
            self._sentence_vectors[text] = vector
        while len(self._sentence_vectors) > SENTENCE_CACHE:
            self._sentence_vectors.popitem(last=False)
        return compress.cosines(vectors[0], [self._sentence_vectors.get(t) for t in texts])

    async def _reranker_card(self) -> Mapping[str, Any] | None:
        """The deployed reranker's model card, asked once; None (asked again next time) when
        the stage cannot answer."""
        if self._card is None:
            try:
                self._card = dict(await self.stages.rerank_card())
            except Exception as exc:  # noqa: BLE001 - compression goes on with the plain settings
                logger.warning("reranker model card: not available (%s)", exc)
                return None
        return self._card

    async def _rerank_weight(self, version: str) -> float:
        """The cross-encoder's fusion weight for this index version: set, or by its domain
        similarity (retrieve/rerank.py), asked once per version; far when that cannot be had."""
        if self.params.rerank.weight is not None:
            return self.params.rerank.weight
        if version not in self._rerank_weights:
            try:
                similarity = await self.stages.rerank_similarity(version)
            except Exception as exc:  # noqa: BLE001 - the safe weight, asked again next time
                logger.warning("reranker fusion weight for version %s: domain unknown (%s)", version, exc)
                return self.params.rerank.weight_for(None)
            self._rerank_weights[version] = self.params.rerank.weight_for(similarity)
        return self._rerank_weights[version]


def _asked(params: compress.CompressionParams, ask: Ask) -> compress.CompressionParams:
    """The compression settings with the request's threshold (and its budget, if it gives one)
    or its budget instead of the default rule."""
    if ask.threshold is not None:
        return params.with_budget(ask.budget_tokens, threshold=ask.threshold)
    if ask.budget_tokens is not None:
        return params.with_budget(ask.budget_tokens)
    return params
