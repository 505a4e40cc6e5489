"""What a completion cost, from a table of per-model prices.

The table comes from the setting LLMFRAME_LLM_PRICES, a JSON object that maps a model name to
[USD per million input tokens, USD per million output tokens]:

    {"claude-sonnet-4-5": [3.0, 15.0], "gpt-4o-mini": [0.15, 0.6]}

A model is priced by its exact name when the table has it, otherwise by the longest table key
that its name starts with, provided the name continues there with a separator (not a letter or
digit): `claude-sonnet-4-5-20250929` and `claude-sonnet-4-5@20250929` price as
`claude-sonnet-4-5`, while `gpt-4o` does not price as a key `gpt-4`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from llmframe_ray.errors import ConfigError
from llmframe_ray.generate.base import Usage

SETTING = "LLMFRAME_LLM_PRICES"
DEFAULT_PRICES = (
    '{"claude-sonnet-4-5": [3.0, 15.0], "claude-haiku-4-5": [1.0, 5.0], '
    '"gpt-4o-mini": [0.15, 0.6], "gpt-4o": [2.5, 10.0], "extractive-v1": [0.0, 0.0]}'
)
PER_TOKENS = 1_000_000
DECIMALS = 8


def _price(model: str, value: object) -> tuple[float, float]:
    if not model:
        raise ConfigError(f"{SETTING}: a model name is empty")
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(
            f"{SETTING}: the price of {model!r} must be a list [input, output] of two numbers "
            f"(USD per million tokens), got {value!r}"
        )
    prices = []
    for what, number in zip(("input", "output"), value):
        ok = isinstance(number, (int, float)) and not isinstance(number, bool)
        if not ok or not math.isfinite(number) or number < 0:
            raise ConfigError(
                f"{SETTING}: the {what} price of {model!r} must be a finite number >= 0, "
                f"got {number!r}"
            )
        prices.append(float(number))
    return prices[0], prices[1]


@dataclass(frozen=True)
class PriceTable:
    """Per-model prices in USD per million tokens: model -> (input, output)."""

    prices: Mapping[str, tuple[float, float]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        checked = {str(model): _price(str(model), value) for model, value in self.prices.items()}
        object.__setattr__(self, "prices", MappingProxyType(checked))

    @classmethod
    def from_json(cls, text: str) -> PriceTable:
        """The table from the JSON of LLMFRAME_LLM_PRICES; a bad value raises ConfigError."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{SETTING} is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"{SETTING} must be a JSON object {{\"model\": [input, output], ...}}, "
                f"got {type(data).__name__}"
            )
        return cls(data)

    def price_of(self, model: str) -> tuple[float, float] | None:
        """(input, output) USD per million tokens: by exact name, else by the longest key the
        name starts with followed by a separator; None when no key matches."""
        exact = self.prices.get(model)
        if exact is not None:
            return exact
        matches = [
            key for key in self.prices
            if model.startswith(key) and len(model) > len(key) and not model[len(key)].isalnum()
        ]
        if not matches:
            return None
        return self.prices[max(matches, key=len)]

    def cost(self, model: str, usage: Usage) -> float | None:
        """USD for `usage` tokens of `model`, rounded to 8 decimals; None for an unpriced model."""
        price = self.price_of(model)
        if price is None:
            return None
        usd = (usage.input_tokens * price[0] + usage.output_tokens * price[1]) / PER_TOKENS
        return round(usd, DECIMALS)
