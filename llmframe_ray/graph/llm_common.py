"""What the LLM extractor (llm_extract.py) and the community summariser (llm_summaries.py)
share: an append-only JSON-lines cache of answers, and the usage report of a run of requests."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Sequence, TypeVar

from llmframe_ray.generate.base import Usage
from llmframe_ray.generate.costs import PriceTable

V = TypeVar("V")


class JsonLinesCache(Generic[V]):
    """Fingerprint -> answer, one JSON line each (`{"fp": ..., **encode(answer)}`), appended and
    flushed to disk per batch. A line cut by a crash is skipped: that item is asked again."""

    def __init__(self, path: str | Path, decode: Callable[[dict], V], encode: Callable[[V], dict]) -> None:
        self.path, self.encode = Path(path), encode
        self.known: dict[str, V] = {}
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                    self.known[str(row["fp"])] = decode(row)
                except (ValueError, KeyError, TypeError):
                    continue

    def put_many(self, items: Sequence[tuple[str, V]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            for fp, answer in items:
                fh.write(json.dumps({"fp": fp, **self.encode(answer)}, ensure_ascii=False) + "\n")
                self.known[fp] = answer
            fh.flush()
            os.fsync(fh.fileno())


@dataclass
class LlmReport:
    cached: int = 0
    asked: int = 0  # items sent to the model
    requests: int = 0
    fallback: int = 0  # items answered offline after a failed or malformed answer
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = 0.0  # None: the price of a model used is unknown
    problems: list[str] = field(default_factory=list)

    def charge(self, completion: Any, prices: PriceTable) -> None:
        """Add one answer's tokens and cost."""
        self.usage = self.usage + completion.usage
        cost = prices.cost(completion.model, completion.usage)
        self.cost_usd = None if cost is None or self.cost_usd is None else round(self.cost_usd + cost, 8)

    def counts(self) -> dict[str, Any]:
        return {
            "cached": self.cached, "asked": self.asked, "requests": self.requests, "fallback": self.fallback,
            "input_tokens": self.usage.input_tokens, "output_tokens": self.usage.output_tokens,
            "cost_usd": self.cost_usd, "problems": self.problems[:20],
        }
