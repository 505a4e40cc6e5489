"""The settings of the advanced pipeline (part of config.Settings): query rewriting before
retrieval and contextual compression after reranking."""

from __future__ import annotations

from pydantic import Field, field_validator

from llmframe_ray.config_writes import WriteSettings, _env
from llmframe_ray.errors import ConfigError
from llmframe_ray.retrieve.compress import CompressionParams, Scorer
from llmframe_ray.retrieve.rewrite import QueryRewrite, RewriteParams


class PipelineSettings(WriteSettings):
    # a request without `query_rewrite` gets this: none, multi-query, prf or conversational
    query_rewrite: str = Field("none", validation_alias=_env("QUERY_REWRITE"))
    multi_query_n: int = Field(3, ge=1, le=10, validation_alias=_env("MULTI_QUERY_N"))
    multi_query_weight: float = Field(1.0, ge=0, le=10, validation_alias=_env("MULTI_QUERY_WEIGHT"))
    multi_query_parts_weight: float = Field(0.1, ge=0, le=10, validation_alias=_env("MULTI_QUERY_PARTS_WEIGHT"))
    prf_docs: int = Field(3, ge=1, le=100, validation_alias=_env("PRF_DOCS"))
    prf_terms: int = Field(5, ge=1, le=100, validation_alias=_env("PRF_TERMS"))
    prf_weight: float = Field(0.5, ge=0, le=10, validation_alias=_env("PRF_WEIGHT"))
    rewrite_timeout_s: float = Field(10.0, gt=0, le=300, validation_alias=_env("REWRITE_TIMEOUT_S"))
    # retrieval_strategy "compressed", where the budget rule applies (the evidence rule, below, is
    # the default): tokens of passage text kept (0: by threshold only), the score a sentence needs
    # to be kept regardless of the budget (unset: none; set: no evidence rule), the scorer
    compression_budget_tokens: int = Field(750, ge=0, le=1_000_000, validation_alias=_env("COMPRESSION_BUDGET_TOKENS"))
    compression_threshold: float | None = Field(None, validation_alias=_env("COMPRESSION_THRESHOLD"))
    compression_scorer: Scorer = Field(Scorer.AUTO, validation_alias=_env("COMPRESSION_SCORER"))
    # with a reranker deployed: passages it scores within this margin of the best are kept whole
    # ("none": never), and the budget is then this one (0: COMPRESSION_BUDGET_TOKENS)
    compression_passage_margin: float | None = Field(1.0, ge=0, validation_alias=_env("COMPRESSION_PASSAGE_MARGIN"))
    compression_passage_budget_tokens: int = Field(
        550, ge=0, le=1_000_000, validation_alias=_env("COMPRESSION_PASSAGE_BUDGET_TOKENS")
    )
    # with a reranker deployed: keep every sentence within this of the best one instead of a
    # budget ("auto": where the reranker was trained with --rationales, its evidence rule, or 6.25
    # with COMPRESSION_RATIONALE_EVIDENCE none, else the budget; "none": the budget), and lower
    # each sentence by this prior x its passage's distance from the best passage (reranker logits)
    compression_relative: str = Field("auto", validation_alias=_env("COMPRESSION_RELATIVE"))
    compression_passage_prior: float = Field(1.0, ge=0, le=100, validation_alias=_env("COMPRESSION_PASSAGE_PRIOR"))
    # under the relative rule: a passage whose best sentence is further than the relative
    # threshold + this below the best one keeps nothing and leaves the list ("none": every
    # passage keeps its best sentence)
    compression_passage_drop: float | None = Field(
        CompressionParams.passage_drop, ge=0, validation_alias=_env("COMPRESSION_PASSAGE_DROP")
    )
    # under the relative rule: a question that keeps less than this share of its passages'
    # tokens keeps its next best sentences up to it ("none": no floor)
    compression_floor_share: float | None = Field(
        CompressionParams.floor_share, ge=0, le=1, validation_alias=_env("COMPRESSION_FLOOR_SHARE")
    )
    # the offline scorer with the local embedder (and auto's beside a reranker trained on passages
    # alone): keep the sentences whose probability of being evidence (retrieve/evidence.py) is at
    # least this instead of filling the budget ("none": the budget; auto then takes any reranker's scores)
    compression_evidence: float | None = Field(
        CompressionParams.evidence, gt=0, lt=1, validation_alias=_env("COMPRESSION_EVIDENCE")
    )
    # with a reranker trained with --rationales and COMPRESSION_RELATIVE auto: the same rule on its
    # logits' evidence model ("none": the relative rule at 6.25)
    compression_rationale_evidence: float | None = Field(
        CompressionParams.rationale_evidence, gt=0, lt=1, validation_alias=_env("COMPRESSION_RATIONALE_EVIDENCE")
    )

    @field_validator("compression_relative", mode="before")
    @classmethod
    def _relative(cls, value: object) -> object:
        text = str(value).strip().lower()
        if text in ("auto", "none"):
            return text
        try:
            number = float(text)
        except ValueError:
            raise ValueError("should be auto, none or a number of at least 0") from None
        if not number >= 0:
            raise ValueError("should be auto, none or a number of at least 0")
        return str(number)

    @field_validator("compression_passage_margin", "compression_passage_drop", "compression_floor_share",
                     "compression_evidence", "compression_rationale_evidence", mode="before")
    @classmethod
    def _none_or_number(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return value

    @field_validator("query_rewrite")
    @classmethod
    def _rewrite(cls, value: str) -> str:
        return QueryRewrite.from_str(value).value

    def rewrite_params(self) -> RewriteParams:
        return RewriteParams(
            default=self.query_rewrite, queries=self.multi_query_n, multi_weight=self.multi_query_weight,
            parts_weight=self.multi_query_parts_weight, prf_docs=self.prf_docs,
            prf_terms=self.prf_terms, prf_weight=self.prf_weight, timeout_s=self.rewrite_timeout_s,
        )

    def compression_params(self, local_embedder: bool = True) -> CompressionParams:
        """`local_embedder`: the query encoder is the local model the evidence model was fitted
        with (its cosines are what the model reads); without it the offline scorer fills the
        budget. A score threshold (or no budget) set here asks for the threshold and budget
        rules: no evidence rule then."""
        budget = self.compression_budget_tokens or None
        if budget is None and self.compression_threshold is None:
            raise ConfigError("LLMFRAME_COMPRESSION_BUDGET_TOKENS is 0 and no LLMFRAME_COMPRESSION_THRESHOLD is set")
        by_score = self.compression_threshold is not None or budget is None
        return CompressionParams(
            budget_tokens=budget, threshold=self.compression_threshold, scorer=self.compression_scorer,
            passage_margin=self.compression_passage_margin,
            passage_budget_tokens=self.compression_passage_budget_tokens or None,
            passage_prior=self.compression_passage_prior, passage_drop=self.compression_passage_drop,
            floor_share=self.compression_floor_share,
            evidence=None if by_score or not local_embedder else self.compression_evidence,
            **{"rationale_evidence": None if by_score else self.compression_rationale_evidence, **self._relative_params()},
        )

    def _relative_params(self) -> dict[str, float | None]:
        if self.compression_relative == "auto":
            return {}  # CompressionParams' defaults: by the reranker's card
        if self.compression_relative == "none":
            return {"relative": None, "rationale_relative": None, "rationale_evidence": None}
        return {"relative": float(self.compression_relative), "rationale_relative": None, "rationale_evidence": None}
