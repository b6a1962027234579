"""The proxy's reply limit lowered to what the window leaves (``apis.reply_room``,
``apis.limit_reply``), in the field each API's client used, and the budget's reserve less
what it lent the newest turn (``BudgetPolicy.output_lent``)."""

from __future__ import annotations

from typing import Any

import pytest

from ctxd.engine.budget import BudgetPolicy, reserved_output
from ctxd.formats import Api
from ctxd.proxy import apis


def test_the_room_is_the_usable_part_less_the_prompt_as_the_provider_counts_it() -> None:
    budget = {"usable": 8192, "tokenRatio": 1.1, "tokenOverhead": 300, "safetyMargin": 160, "reservedOutput": 2000}
    assert apis.reply_room({"tokens": 1000, "budget": budget}, {}) == 8192 - 1400 - 160
    # never below the reserve the prompt was built beside
    assert apis.reply_room({"tokens": 6000, "budget": budget}, {}) == 2000
    assert apis.reply_room({"tokens": 1000, "budget": {"usable": 8192}}, {}) == 7192
    assert apis.reply_room({"tokens": 1000}, {}) is None


def test_tools_stand_in_for_the_overhead_until_it_is_learned() -> None:
    """A session's first request: the provider counts its tool definitions beside the
    messages, ctxd has not learned what they cost yet."""
    tools = [{"name": f"tool{k}", "description": "Reads a file. " * 40, "input_schema": {"type": "object"}}
             for k in range(10)]
    unlearned = {"usable": 48000, "reservedOutput": 12000}
    guessed = apis.reply_room({"tokens": 1000, "budget": unlearned}, {"tools": tools})
    assert guessed == 48000 - 1000 - len(__import__("json").dumps(tools)) // 3
    learned = dict(unlearned, tokenOverhead=500)
    assert apis.reply_room({"tokens": 1000, "budget": learned}, {"tools": tools}) == 48000 - 1500


@pytest.mark.parametrize("api,body,field", [
    ("openai", {"max_completion_tokens": 8000, "max_tokens": None}, "max_completion_tokens"),
    ("openai", {"max_tokens": 8000}, "max_tokens"),
    ("responses", {"max_output_tokens": 8000}, "max_output_tokens"),
    ("anthropic", {"max_tokens": 8000}, "max_tokens"),
])
def test_the_limit_goes_in_the_field_the_client_used(api: Api, body: dict[str, Any], field: str) -> None:
    apis.limit_reply(api, body, 5000)
    assert body[field] == 5000 and apis.reply_limit(api, body) == 5000
    assert [k for k, v in body.items() if v is not None] == [field]


def test_ollama_num_predict_and_the_other_options_kept() -> None:
    body = {"options": {"num_predict": 8000, "num_ctx": 16384}}
    apis.limit_reply("ollama", body, 3000)
    assert body["options"] == {"num_predict": 3000, "num_ctx": 16384}


def test_anthropic_thinking_budget_stays_below_the_limit() -> None:
    body = {"max_tokens": 32000, "thinking": {"type": "enabled", "budget_tokens": 16000}}
    apis.limit_reply("anthropic", body, 9000)
    assert body["max_tokens"] == 9000 and body["thinking"] == {"type": "enabled", "budget_tokens": 8999}
    body = {"max_tokens": 32000, "thinking": {"type": "enabled", "budget_tokens": 4000}}
    apis.limit_reply("anthropic", body, 9000)
    assert body["thinking"]["budget_tokens"] == 4000


def test_the_reserve_less_what_it_lent() -> None:
    assert reserved_output(24_000, None, BudgetPolicy(output_tokens=8000)) == 6000  # (a quarter of the window)
    assert reserved_output(24_000, None, BudgetPolicy(output_tokens=8000, output_lent=1500)) == 4500
    assert reserved_output(24_000, 16_000, BudgetPolicy(output_lent=1500)) == 4500
    assert reserved_output(24_000, None, BudgetPolicy(output_tokens=1000, output_lent=5000)) == 0


def test_the_reply_floor_is_at_most_an_eighth_of_a_window_given() -> None:
    from ctxd.proxy.sessions import reply_floor

    assert reply_floor(4096, None) == 4096  # the model's own window: as configured
    assert reply_floor(4096, 200_000) == 4096
    assert reply_floor(4096, 16_000) == 2000
    assert reply_floor(4096, 4_096) == 1024  # never below 1,024
    assert reply_floor(512, 16_000) == 512  # a smaller configured floor stays
    assert reply_floor(0, 16_000) == 0  # lending off stays off
