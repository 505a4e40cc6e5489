import pytest

from llmframe_ray.errors import ConfigError
from llmframe_ray.generate.base import Usage
from llmframe_ray.generate.costs import PriceTable

TABLE = PriceTable.from_json(
    '{"claude-sonnet-4-5": [3.0, 15.0], "claude-sonnet-4": [2, 10], '
    '"gpt-4o": [2.5, 10.0], "gpt-4o-mini": [0.15, 0.6], "odd": [0.123456789, 0]}'
)


def test_exact_cost_arithmetic():
    # (1000 * 3 + 500 * 15) / 1e6
    assert TABLE.cost("claude-sonnet-4-5", Usage(1000, 500)) == 0.0105
    assert TABLE.cost("claude-sonnet-4", Usage(1000, 500)) == 0.007
    assert TABLE.cost("gpt-4o-mini", Usage(1_000_000, 1_000_000)) == 0.75
    assert TABLE.cost("gpt-4o-mini", Usage(0, 0)) == 0.0


def test_cost_is_rounded_to_8_decimals():
    # 3 * 0.123456789 / 1e6 = 3.70370367e-7
    assert TABLE.cost("odd", Usage(3, 0)) == 0.00000037
    assert TABLE.cost("gpt-4o-mini", Usage(1, 1)) == 0.00000075


def test_dated_model_ids_price_as_the_longest_matching_key():
    assert TABLE.cost("claude-sonnet-4-5-20250929", Usage(1000, 500)) == 0.0105
    assert TABLE.cost("claude-sonnet-4-20250514", Usage(1000, 500)) == 0.007
    assert TABLE.cost("claude-sonnet-4-5@20250929", Usage(1000, 500)) == 0.0105
    assert TABLE.price_of("gpt-4o-mini-2024-07-18") == (0.15, 0.6)
    assert TABLE.price_of("gpt-4o-2024-08-06") == (2.5, 10.0)


def test_unknown_models_have_no_cost():
    assert TABLE.cost("llama-3-8b", Usage(10, 10)) is None
    # a key is a prefix only up to a separator: "gpt-4omni" is not a "gpt-4o"
    assert TABLE.cost("gpt-4omni", Usage(10, 10)) is None
    assert PriceTable().cost("gpt-4o", Usage(1, 1)) is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "LLMFRAME_LLM_PRICES is not valid JSON: Expecting property name"),
        ("[1, 2]", 'LLMFRAME_LLM_PRICES must be a JSON object {"model": [input, output], ...}, got list'),
        ('{"m": [1]}', "LLMFRAME_LLM_PRICES: the price of 'm' must be a list [input, output] of two numbers"),
        ('{"m": 3}', "LLMFRAME_LLM_PRICES: the price of 'm' must be a list [input, output] of two numbers"),
        ('{"m": [1, -2]}', "LLMFRAME_LLM_PRICES: the output price of 'm' must be a finite number >= 0, got -2"),
        ('{"m": [true, 1]}', "LLMFRAME_LLM_PRICES: the input price of 'm' must be a finite number >= 0, got True"),
        ('{"m": [NaN, 1]}', "LLMFRAME_LLM_PRICES: the input price of 'm' must be a finite number >= 0, got nan"),
        ('{"m": ["1", 1]}', "LLMFRAME_LLM_PRICES: the input price of 'm' must be a finite number >= 0, got '1'"),
        ('{"": [1, 1]}', "LLMFRAME_LLM_PRICES: a model name is empty"),
    ],
)
def test_bad_price_tables_raise_config_errors(text, message):
    with pytest.raises(ConfigError) as raised:
        PriceTable.from_json(text)
    assert str(raised.value).startswith(message)


def test_the_default_setting_parses():
    default = (
        '{"claude-sonnet-4-5": [3.0, 15.0], "claude-haiku-4-5": [1.0, 5.0], '
        '"gpt-4o-mini": [0.15, 0.6], "gpt-4o": [2.5, 10.0], "extractive-v1": [0.0, 0.0]}'
    )
    table = PriceTable.from_json(default)
    assert table.cost("claude-haiku-4-5-20251001", Usage(2000, 1000)) == 0.007
    assert table.cost("extractive-v1", Usage(100, 50)) == 0.0
