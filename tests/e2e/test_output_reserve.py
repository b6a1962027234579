"""The reply's reserve as a session setting (``settings.outputTokens``), end to end through
a real daemon: set at ``session/create``, merged by ``session/update``, used by the budget
in place of the model's output limit (at most a quarter of the window), validated, and a
prompt that no longer fits once more is reserved is compressed before it is handed out.

The whole module shares one stdio daemon (``shared_lsp``); every test uses its own sessions.
"""

from __future__ import annotations

import pytest
from pytest_lsp import LanguageClient

from tests.e2e.helpers import assistant, user
from tests.e2e.lsp import create, push, request, rpc_error

pytestmark = pytest.mark.asyncio(loop_scope="module")

WINDOW = 8192
USABLE = 6963  # 85% of 8192: no provider given, so a local runtime's share


@pytest.fixture
def lsp(shared_lsp: LanguageClient) -> LanguageClient:
    return shared_lsp


async def budget(lsp: LanguageClient, session_id: str) -> dict:
    return (await request(lsp, "context/stats", {"sessionId": session_id}))["budget"]


async def test_the_setting_is_the_reserve_and_merges_with_the_others(lsp) -> None:
    sid = "reserve-set"
    info = await create(lsp, sessionId=sid, contextWindow=WINDOW,
                        settings={"outputTokens": 2000, "triggerFraction": 0.8})
    assert info["settings"] == {"outputTokens": 2000, "triggerFraction": 0.8}
    first = await budget(lsp, sid)
    assert (first["reservedOutput"], first["maxPromptTokens"]) == (2000, USABLE - 2000)

    # Updated field by field: triggerFraction stays; less reserved, more room for the prompt.
    updated = await request(lsp, "session/update", {"sessionId": sid, "settings": {"outputTokens": 300}})
    assert updated["settings"] == {"outputTokens": 300, "triggerFraction": 0.8}
    second = await budget(lsp, sid)
    assert (second["reservedOutput"], second["maxPromptTokens"]) == (300, USABLE - 300)
    assert second["triggerFraction"] == 0.8 and second["triggerAt"] > first["triggerAt"]

    # Held to a quarter of the window, whatever is asked.
    await request(lsp, "session/update", {"sessionId": sid, "settings": {"outputTokens": 100_000}})
    assert (await budget(lsp, sid))["reservedOutput"] == WINDOW // 4

    # Without the setting: the default share of the window (1/8 for a model ctxd does not know).
    await create(lsp, sessionId="reserve-default", contextWindow=WINDOW)
    assert (await budget(lsp, "reserve-default"))["reservedOutput"] == WINDOW // 8


@pytest.mark.parametrize("value, expected", [
    (0, ">= 1"), (-5, ">= 1"), (2**31, "<= 2147483647"), (1.5, "int"), ("many", "int"), (True, "int")])
async def test_bad_values_are_refused_naming_the_field(lsp, value, expected) -> None:
    sid = f"reserve-bad-{len(str(value))}-{type(value).__name__}"
    await create(lsp, sessionId=sid, contextWindow=WINDOW, settings={"outputTokens": 500})
    for method, params in (("session/update", {"sessionId": sid, "settings": {"outputTokens": value}}),
                           ("session/create", {"sessionId": sid + "-new", "settings": {"outputTokens": value}})):
        error = await rpc_error(lsp, method, params)
        assert error.code == -32602
        assert error.data == {"field": "settings.outputTokens"}
        assert expected in str(error) and "settings.outputTokens" in str(error)
    # Nothing changed, nothing created.
    assert (await request(lsp, "session/get", {"sessionId": sid}))["settings"] == {"outputTokens": 500}
    assert (await rpc_error(lsp, "session/get", {"sessionId": sid + "-new"})).code == -33001


async def test_a_larger_reserve_compresses_a_prompt_that_no_longer_fits(lsp) -> None:
    sid = "reserve-grows"
    await create(lsp, sessionId=sid, contextWindow=WINDOW, settings={"outputTokens": 256})
    n = 0
    while (await budget(lsp, sid))["used"] < USABLE - 2048 + 400:  # past what a 2048 reserve leaves
        words = " ".join(f"w{n}x{i}" for i in range(60))
        await push(lsp, sid, [user(f"question {n}: {words}"), assistant(f"answer {n}: {words}")])
        n += 1
    before = await budget(lsp, sid)
    assert before["used"] < before["triggerAt"]  # no compression due under the small reserve
    assert (await request(lsp, "session/get", {"sessionId": sid})).get("compressionCount", 0) == 0

    await request(lsp, "session/update", {"sessionId": sid, "settings": {"outputTokens": 2048}})
    prompt = await request(lsp, "context/prompt", {"sessionId": sid})
    assert prompt["budget"]["reservedOutput"] == 2048
    assert prompt["tokens"] <= prompt["budget"]["maxPromptTokens"] == USABLE - 2048
    assert prompt["compressionCount"] >= 1
    # The newest user message is still there, verbatim.
    assert prompt["messages"][-2]["content"].startswith(f"question {n - 1}:")
