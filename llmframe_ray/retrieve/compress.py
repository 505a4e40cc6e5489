"""Contextual compression, the stage between reranking and generation: keep only the sentences of
each retrieved passage that matter for the question, so the answer prompt gets fewer tokens.

    passages -> sentences -> a score per sentence (below) -> keep by an evidence threshold, a
                token budget, a relative threshold or a score threshold
             -> each hit's text becomes its kept sentences, in their order ("..." where some were cut)

By default the evidence rule (below) decides. The budget rule (a request's budget or threshold, a
hosted embedder, a reranker not trained on rationale sentences, or `evidence` None): a sentence's
score is its embedding's cosine with the query's (`embedder`: the query encoder that retrieval
uses) or the cross-encoder's score of (query, sentence) (`cross-encoder`, where a reranker is
deployed), plus `lexical` times the share of the query's content stems that it holds, plus
`passage` times its passage's best score (so a passage that answers the question keeps more of
itself than one that does not). Every passage keeps its best sentence, so every citation still
points at the document and chunk it came from with text that matters; the rest of the budget
goes to the best sentences overall (optionally after per-passage quotas by length).

Under the relative rule (a reranker trained on rationale sentences), a passage whose best sentence
scores far below the question's best keeps nothing and leaves the list (`passage_drop`), and a
question that keeps less than a floor share of its tokens keeps its next best sentences up to it
(`floor_share`).

With the offline scorer (the local embedder's cosines), and with a deployed reranker trained on
rationale sentences, the sentences are kept by an evidence model instead of a budget
(`evidence`, `rationale_evidence`): each sentence's probability of being evidence for the
question (retrieve/evidence.py: a logistic regression over its score, its lexical overlap, how far
it and its passage's best are below the question's best sentence, and its hit's rank, fitted on
SciFact's train claims, one per scorer) is compared with one threshold, and the question's best
sentence is kept; nothing is kept for a passage's own sake (no passage is kept whole), so a hit
of which nothing is kept leaves the list. No budget caps it: a request's budget does.

Where a cross-encoder scores the whole passages too (a reranker is deployed), the passages it
scores within `passage_margin` of the best one are kept whole, before the budget and over it if
they must: on SciFact, whether a passage answers the question decides more of the gold
rationale than any sentence score does (README "The advanced pipeline").

Ray-free: the API service gets the scores from its stages and calls `select` and `apply`; the
benchmark (benchmarks/compression.py) calls the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from llmframe_ray.generate.sessions import estimate_tokens
from llmframe_ray.ingest.chunker import sentences as split_sentences
from llmframe_ray.retrieve import evidence as evidence_model
from llmframe_ray.retrieve.words import stems
from llmframe_ray.types import Choice, Hit

ELLIPSIS = "..."
MAX_SENTENCE_CHARS = 1000  # what the scorer sees of one sentence (the query encoder's length)


class Scorer(Choice):
    AUTO = "auto"  # the cross-encoder where one trained on rationale sentences is deployed, else the embedder (uses_cross_encoder)
    EMBEDDER = "embedder"
    CROSS_ENCODER = "cross-encoder"
    LLM = "llm"  # the provider chain picks the sentences (generate/extracting.py); offline scoring without a key

    @classmethod
    def label(cls) -> str:
        return "compression scorer"


@dataclass(frozen=True)
class CompressionParams:
    """`budget_tokens`: tokens of passage text kept over all passages (estimated as characters
    / 4, as the prompt budget is), or None to keep by `threshold` alone (sentences scoring at
    least it). `quota`: the share of the budget handed out per passage (by length) before the
    rest goes to the best sentences overall; `lexical`, `passage`, `neighbour`: see `combined`.
    Defaults chosen on the first 300 SciFact claims_train claims (benchmarks/compression.py
    --split train --limit 300): the most rationale kept with at most 40% of the tokens.

    `passage_margin`: where a cross-encoder scores the whole passages (a reranker is deployed),
    the passages within this margin of the best one's score (the reranker's units) are kept
    whole; None: never. `passage_budget_tokens` is then the budget instead of `budget_tokens`
    (None: `budget_tokens`). Both chosen on the 81 claims_train claims that the trained reranker
    held out from its training (benchmarks/compression.py --held-out), by the same rule.

    `relative`: where a cross-encoder scores the sentences and the passages, keep every sentence
    scoring within this of the question's best one (and each passage's best), and fill no
    budget; its sentences are then compared on their own scores (model + lexical + prior), not
    their passage's best. `rationale_relative`: the `relative` used where `relative` is unset and
    the deployed reranker was trained on rationale sentences (`for_reranker`), with no passage
    kept whole; None: never. `passage_prior`: with the reranker's passage scores, each
    sentence's score + this x (its passage's score - the best passage's). 1.0 chosen on those
    81 claims for a reranker trained with `--rationales`, by the same rule.

    `passage_drop`: under the relative rule, a passage whose best sentence scores more than
    `relative` + this below the question's best sentence keeps nothing, and its hit leaves the
    compressed list (it holds nothing the question needs); None: every passage keeps its best
    sentence. 2.0 and `rationale_relative` 6.25 chosen on the 81 held-out claims and on 404
    claims held out by a second reranker (README "The advanced pipeline").

    `floor_share`: under the relative rule, a question whose kept sentences hold less than this
    share of its passages' tokens also keeps its next best sentences, of the passages that keep
    any, while they fit under that share (a question whose best sentence stands far above the
    rest otherwise kept little else); None: no floor. 0.2 chosen on the same train claims.

    `evidence`: with the offline scorer, keep the sentences whose probability of being evidence
    (retrieve/evidence.py) is at least this, and the question's best one, instead of filling the
    budget or keeping passages whole (a request's budget or threshold replaces it, as it does
    the relative rule); None: the budget. Chosen with the model's fit on SciFact's claims_train
    claims (the most rationale kept with at most 40% of the tokens, out of fold).

    `rationale_evidence`: with a deployed reranker trained on rationale sentences and `relative`
    unset, the same rule on the cross-encoder's evidence model (`for_reranker`), instead of the
    relative rule at `rationale_relative`; None: the relative rule. The model was fitted on the
    404 claims_train claims that a reranker trained on the other half held out; the threshold
    was chosen by the same rule (ties: fewer tokens) on the 81 claims that the deployed reranker
    held out, since the two models' logits are not calibrated alike (README)."""

    budget_tokens: int | None = 750
    threshold: float | None = None
    quota: float = 0.0
    lexical: float = 0.3
    passage: float = 1.0
    neighbour: float = 0.0
    scorer: Scorer = Scorer.AUTO
    passage_margin: float | None = 1.0
    passage_budget_tokens: int | None = 550
    passage_prior: float = 1.0
    relative: float | None = None
    rationale_relative: float | None = 6.25
    passage_drop: float | None = 2.0
    floor_share: float | None = 0.2
    evidence: float | None = 0.0068
    rationale_evidence: float | None = 0.002

    def __post_init__(self) -> None:
        object.__setattr__(self, "scorer", Scorer.from_str(self.scorer))
        if self.budget_tokens is None and self.threshold is None:
            raise ValueError("compression needs a token budget or a score threshold")
        if self.passage_margin is not None and not self.passage_margin >= 0:
            raise ValueError(f"passage_margin must be at least 0, got {self.passage_margin!r}")
        for name in ("relative", "rationale_relative", "passage_drop"):
            if getattr(self, name) is not None and not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)!r}")
        if not self.passage_prior >= 0:
            raise ValueError(f"passage_prior must be at least 0, got {self.passage_prior!r}")
        if self.passage_budget_tokens is not None and self.passage_budget_tokens < 1:
            raise ValueError(f"passage_budget_tokens must be at least 1, got {self.passage_budget_tokens!r}")
        if self.budget_tokens is not None and self.budget_tokens < 1:
            raise ValueError(f"budget_tokens must be at least 1, got {self.budget_tokens!r}")
        if not 0.0 <= self.quota <= 1.0:
            raise ValueError(f"quota must be within [0, 1], got {self.quota!r}")
        for name in ("evidence", "rationale_evidence"):
            if getattr(self, name) is not None and not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be within (0, 1), got {getattr(self, name)!r}")
        if self.floor_share is not None and not 0.0 <= self.floor_share <= 1.0:
            raise ValueError(f"floor_share must be within [0, 1], got {self.floor_share!r}")

    def with_budget(self, budget_tokens: int | None, **changes: object) -> CompressionParams:
        """These settings with one budget, whether or not passages are kept whole (a request's),
        and any other `changes` (e.g. its threshold, without which no budget is an error)."""
        return replace(self, budget_tokens=budget_tokens, passage_budget_tokens=None, relative=None, evidence=None, **changes)

    def for_reranker(self, card: Mapping[str, Any]) -> CompressionParams:
        """These settings for the sentence scores of a deployed reranker with this model card.
        Where it was trained on rationale sentences and `relative` is unset: the evidence rule at
        `rationale_evidence` (its evidence model), or else the relative rule at
        `rationale_relative`, no passage kept whole. Otherwise the budget, or a set `relative`
        (never the offline scorer's `evidence`)."""
        plain = replace(self, evidence=None)
        if self.relative is not None or not scores_sentences(card):
            return plain
        if self.rationale_evidence is not None:
            return replace(plain, evidence=self.rationale_evidence, passage_margin=None)
        if self.rationale_relative is None:
            return plain
        return replace(plain, relative=self.rationale_relative, passage_margin=None)

    def budget(self, whole: bool) -> int | None:
        """The token budget, with (`whole`) or without passages kept whole; None: no budget."""
        if whole and self.budget_tokens is not None and self.passage_budget_tokens is not None:
            return self.passage_budget_tokens
        return self.budget_tokens


def uses_cross_encoder(params: CompressionParams, has_reranker: bool, card: Mapping[str, Any] | None) -> bool:
    """Whether the cross-encoder scores the sentences (else the embedder): always with the
    `cross-encoder` scorer; with `auto` (and `llm`'s offline fallback) where a reranker is deployed
    and its `card` says it was trained on rationale sentences, or a relative threshold is set, or
    the embedder's evidence rule is off (a request's budget or threshold, a configured threshold,
    hosted embeddings, `evidence` None): a reranker trained on passages alone scores a sentence
    worse than the embedder's evidence model reads it (README "The advanced pipeline"). Never
    with `embedder`."""
    if params.scorer is Scorer.CROSS_ENCODER:
        return True
    if params.scorer is Scorer.EMBEDDER or not has_reranker:
        return False
    return params.evidence is None or params.relative is not None or (card is not None and scores_sentences(card))


def scores_sentences(card: Mapping[str, Any]) -> bool:
    """Whether a reranker's card says it was trained on rationale sentences too (train-reranker
    --rationales), so its score of a single sentence means what compression asks."""
    data = card.get("data") if isinstance(card, Mapping) else None
    return isinstance(data, Mapping) and bool(data.get("rationale_groups"))


@dataclass(frozen=True)
class Split:
    """The passages' sentences, flattened: `owner[i]` is the passage of sentence i."""

    sentences: list[str]
    owner: list[int]
    tokens: list[int]

    @classmethod
    def of(cls, passages: Sequence[Sequence[str]]) -> Split:
        flat = [(p, s) for p, sents in enumerate(passages) for s in sents]
        return cls([s for _, s in flat], [p for p, _ in flat], [estimate_tokens(s) for _, s in flat])

    @classmethod
    def of_hits(cls, hits: Sequence[Hit]) -> Split:
        return cls.of([split_sentences(h.text) or [h.text] for h in hits])

    def by_passage(self) -> list[list[str]]:
        out: list[list[str]] = [[] for _ in range(max(self.owner, default=-1) + 1)]
        for p, sentence in zip(self.owner, self.sentences):
            out[p].append(sentence)
        return out


def with_one_each(split: Split, keep: Sequence[bool]) -> list[bool]:
    """`keep`, with the first sentence of every passage of which it keeps none (an LLM's choice:
    every citation must still point at text of its passage)."""
    out, covered = list(keep), {p for p, k in zip(split.owner, keep) if k}
    for i, p in enumerate(split.owner):
        if p not in covered:
            out[i] = True
            covered.add(p)
    return out


def scoring_text(title: str, sentence: str) -> str:
    """What the scorer reads of a sentence: its passage's title (as every ranker reads a chunk)
    and the sentence, cut to what the query encoder takes."""
    text = f"{title}\n{sentence}" if title else sentence
    return text[:MAX_SENTENCE_CHARS]


def cosines(query: np.ndarray, vectors: Sequence[np.ndarray | None]) -> list[float]:
    """Cosine of unit vectors; 0 for a sentence the encoder could not take."""
    return [0.0 if v is None else float(np.dot(query, v)) for v in vectors]


def lexical_overlap(query: str, sentences: Sequence[str]) -> list[float]:
    """The share of the query's distinct content stems that each sentence holds."""
    wanted = set(stems(query))
    if not wanted:
        return [0.0] * len(sentences)
    return [len(wanted & set(stems(s))) / len(wanted) for s in sentences]


def combined(
    model_scores: Sequence[float], overlap: Sequence[float], params: CompressionParams, owner: Sequence[int] | None = None,
    passage_scores: Sequence[float] | None = None,
) -> list[float]:
    """Each sentence's score: model + `lexical` x overlap, then (given the sentences' passages)
    + `passage_prior` x (its passage's cross-encoder score - the best passage's), where a
    reranker scored the passages, + `passage` x its passage's best such score (a passage that
    answers the question keeps more of itself) + `neighbour` x the better of its neighbours'
    (evidence runs over adjacent sentences); these last two not under the relative rule."""
    base = [m + params.lexical * o for m, o in zip(model_scores, overlap)]
    if owner is not None and passage_scores and params.passage_prior:
        top = max(passage_scores)
        base = [b + params.passage_prior * (passage_scores[p] - top) for b, p in zip(base, owner)]
    relative_rule = bool(passage_scores) and params.relative is not None  # sentences on their own scores
    if owner is None or relative_rule or not (params.passage or params.neighbour):
        return base
    best: dict[int, float] = {}
    for p, score in zip(owner, base):
        best[p] = max(best.get(p, score), score)
    out = []
    for i, (p, score) in enumerate(zip(owner, base)):
        around = [base[j] for j in (i - 1, i + 1) if 0 <= j < len(base) and owner[j] == p]
        out.append(score + params.passage * best[p] + params.neighbour * (max(around) if around else 0.0))
    return out


def sentence_scores(model_scores: Sequence[float], overlap: Sequence[float], params: CompressionParams,
                    owner: Sequence[int], cross_encoder: bool = False,
                    passage_scores: Sequence[float] | None = None) -> tuple[list[float], bool]:
    """The scores `select` reads, and whether they are evidence probabilities (under
    `params.evidence`: select(..., evidence=True)) rather than `combined` scores. `model_scores`
    are the embedder's cosines, or with `cross_encoder` the reranker's logits (then beside its
    `passage_scores`, which the prior and the relative rule read)."""
    if params.evidence is not None:
        model = evidence_model.CROSS_ENCODER if cross_encoder else evidence_model.EMBEDDER
        return evidence_model.probabilities(model_scores, overlap, owner, model), True
    return combined(model_scores, overlap, params, owner, passage_scores if cross_encoder else None), False


def whole_passages(passage_scores: Sequence[float] | None, margin: float | None) -> frozenset[int]:
    """The passages scored within `margin` of the best passage (none without scores or margin)."""
    if margin is None or not passage_scores:
        return frozenset()
    best = max(passage_scores)
    return frozenset(p for p, score in enumerate(passage_scores) if score >= best - margin)


def select(split: Split, scores: Sequence[float], params: CompressionParams, whole: Collection[int] = (),
           relative: bool = False, evidence: bool = False) -> list[bool]:
    """Which sentences to keep (see the module docstring); every sentence of the `whole`
    passages (`whole_passages`) is kept, whatever the budget (not under the evidence rule). `relative` (a reranker scored the
    passages, and `params.relative` is set): every sentence within `params.relative` of the best
    one is kept, and no budget is filled; with `params.passage_drop`, a passage whose best sentence
    is further than `relative` + that below the best one keeps nothing (but what reaches
    `params.threshold`); with `params.floor_share`, the kept tokens are then topped up to that
    share (`_topped_up`). `evidence` (the scores are `sentence_scores`' probabilities, and
    `params.evidence` is set): every sentence scoring at least `params.evidence` is kept, and the
    best one; a passage with none keeps nothing, and none is kept whole."""
    n = len(split.sentences)
    keep = [split.owner[i] in whole for i in range(n)]
    order = sorted(range(n), key=lambda i: (-scores[i], i))
    if evidence and params.evidence is not None:
        keep = [s >= params.evidence for s in scores]
        if n:
            keep[order[0]] = True
        return keep
    best: dict[int, int] = {}
    for i in order:
        best.setdefault(split.owner[i], i)
    for i in best.values():
        keep[i] = True
    if relative and params.relative is not None and n:
        cut = scores[order[0]] - params.relative
        floor = -np.inf if params.passage_drop is None else cut - params.passage_drop
        keep = [(scores[best[split.owner[i]]] >= floor and (k or scores[i] >= cut))
                or (params.threshold is not None and scores[i] >= params.threshold) for i, k in enumerate(keep)]
        return _topped_up(split, keep, order, params.floor_share)
    used: dict[int, int] = {}  # tokens kept per passage before the threshold and the budget
    for p, t, k in zip(split.owner, split.tokens, keep):
        used[p] = used.get(p, 0) + (t if k else 0)
    if params.threshold is not None:
        for i in order:
            keep[i] = keep[i] or scores[i] >= params.threshold
    budget = params.budget(bool(whole))
    if budget is None:
        return keep
    spent = sum(t for t, k in zip(split.tokens, keep) if k)
    total = sum(split.tokens) or 1
    passage_tokens: dict[int, int] = {}
    for p, t in zip(split.owner, split.tokens):
        passage_tokens[p] = passage_tokens.get(p, 0) + t
    quota = {p: params.quota * budget * t / total for p, t in passage_tokens.items()}
    for in_quota in (True, False):
        for i in order:
            p, t = split.owner[i], split.tokens[i]
            if keep[i] or spent + t > budget or (in_quota and used[p] + t > quota[p]):
                continue
            keep[i], spent, used[p] = True, spent + t, used[p] + t
    return keep


def _topped_up(split: Split, keep: list[bool], order: Sequence[int], share: float | None) -> list[bool]:
    """`keep`, with the best sentences not kept (`order`: best first) of the passages that keep
    any added while the kept tokens stay within `share` of all the passages' tokens (a sentence
    that would pass it is skipped; a shorter one after it may still fit)."""
    if not share:
        return keep
    limit = share * sum(split.tokens)
    spent = sum(t for t, k in zip(split.tokens, keep) if k)
    live = {p for p, k in zip(split.owner, keep) if k}
    for i in order:
        if spent >= limit:
            break
        if not keep[i] and split.owner[i] in live and spent + split.tokens[i] <= limit:
            keep[i], spent = True, spent + split.tokens[i]
    return keep


def apply(hits: Sequence[Hit], split: Split, keep: Sequence[bool]) -> list[Hit]:
    """The hits with their text cut to the kept sentences, "..." marking each cut (ids, titles
    and ranks unchanged); a hit of which nothing is kept is left out."""
    by_passage: list[list[tuple[str, bool]]] = [[] for _ in hits]
    for p, sentence, kept in zip(split.owner, split.sentences, keep):
        by_passage[p].append((sentence, kept))
    out = []
    for hit, sents in zip(hits, by_passage):
        pieces: list[str] = []
        for sentence, kept in sents:
            if kept:
                pieces.append(sentence)
            elif not pieces or pieces[-1] != ELLIPSIS:
                pieces.append(ELLIPSIS)
        if any(k for _, k in sents):
            out.append(replace(hit, text=" ".join(pieces).strip()))
    return out
