"""prompt in the three provider shapes, and stats (one daemon for both)."""

from __future__ import annotations

import json

from tests.cli.conftest import Cli

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": "Running ls.",
     "toolCalls": [{"id": "call_1", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}],
     "usage": {"inputTokens": 30, "outputTokens": 12}},
    {"role": "tool", "toolCallId": "call_1", "content": "README.md\nsetup.py"},
    {"role": "assistant", "content": "Two files.", "usage": {"inputTokens": 60, "outputTokens": 4}},
]


def _seed(cli: Cli) -> None:
    cli("push", "p", "--create", "--model", "gpt-4o", "--message-json", input=json.dumps(CONVERSATION))


def test_prompt_formats_and_stats(cli: Cli) -> None:
    _seed(cli)
    openai = json.loads(cli("prompt", "p", "--format", "openai").stdout)
    assert list(openai) == ["messages"]
    assert [m["role"] for m in openai["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert openai["messages"][2]["tool_calls"][0]["function"]["name"] == "bash"

    anthropic = json.loads(cli("prompt", "p", "--format", "anthropic").stdout)
    assert [b["text"] for b in anthropic["system"]] == ["You are terse."]
    assert {m["role"] for m in anthropic["messages"]} <= {"user", "assistant"}
    blocks = [b["type"] for m in anthropic["messages"] for b in m["content"]]
    assert "tool_use" in blocks and "tool_result" in blocks

    ollama = json.loads(cli("prompt", "p", "--format", "ollama").stdout)
    assert list(ollama) == ["messages"]
    assert all(isinstance(m["content"], str) for m in ollama["messages"])

    default = json.loads(cli("prompt", "p").stdout)
    assert default == openai

    full = cli.json("prompt", "p", "--format", "anthropic")  # --json: the daemon's whole result
    assert full["format"] == "anthropic" and full["sessionId"] == "p"
    assert full["tokens"] > 0 and full["budget"]["maxPromptTokens"] > 0

    summary = cli("prompt", "p", "--summary").stdout
    for word in ("messages", "tokens", "max prompt", "available", "trigger", "free"):
        assert word in summary

    stats = cli.json("stats", "p")
    assert stats["messageCount"] == 5
    assert stats["byRole"]["assistant"]["messages"] == 2
    assert stats["usageDrift"]["messagesWithUsage"] == 2
    assert set(stats["budget"]) >= {"contextWindow", "maxPromptTokens", "available", "triggerAt", "free"}

    text = cli("stats", "p").stdout
    for word in ("By role", "By kind", "toolCall", "output ratio", "input ratio", "Budget", "trigger"):
        assert word in text

    # The bill: the prompts asked above, priced under OpenAI's rules (gpt-4o), through ctxd
    # and direct; the last one counts as a request until a push follows it.
    bill = stats["bill"]
    assert (bill["provider"], bill["cache"], bill["requests"]) == ("openai", "automatic", 1)
    assert bill["ctxd"]["uncached"] > 0 and bill["ratio"] == 1.0
    cli("push", "p", "--message-json", input=json.dumps([
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": "Done.", "usage": {"inputTokens": 70, "cachedInputTokens": 0}}]))
    cli("prompt", "p", "--format", "openai")
    cli("push", "p", "--message-json", input=json.dumps([
        {"role": "assistant", "content": "Still done.", "usage": {"inputTokens": 75, "cachedInputTokens": 0}}]))
    bill = cli.json("stats", "p")["bill"]
    assert (bill["requests"], bill["measured"]) == (2, 2) and bill["lastRequest"]["measured"]
    text = cli("stats", "p").stdout
    for words in ("Bill", "openai (automatic prefix cache)", "2 (2 reported by the provider)", "through ctxd",
                  "direct", "1.00x direct (both estimated)" if bill["ratio"] == 1.0 else "x direct", "last request",
                  "reported", "the provider's usage: uncached 75"):
        assert words in text, words

    assert cli("stats", "missing", expect=1).error_line().endswith("(-33001)")
    assert cli("prompt", "missing", expect=1).error_line().endswith("(-33001)")


def test_stats_counts_a_formats_prompt_as_prompt_does(cli: Cli) -> None:
    """``stats --format``: the prompt's figures as ``prompt --format`` counts them. With
    signed thinking, the OpenAI prompt (which sends none) is smaller than the context's own
    count, which plain ``stats`` gives."""
    thought = "The parser fails on nested brackets; the tokenizer splits them too early. " * 6
    cli("push", "t", "--create", "--model", "claude-sonnet-4-5", "--message-json", input=json.dumps([
        {"role": "user", "content": "Why does the parser fail?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": thought, "signature": "sig-1"},
                                          {"type": "text", "text": "Nested brackets."}]},
        {"role": "user", "content": "Fix it."}]))
    plain = cli.json("stats", "t")
    for fmt in ("openai", "anthropic"):
        shaped = cli.json("stats", "t", "--format", fmt)
        sent = cli.json("prompt", "t", "--format", fmt)
        assert shaped["budget"] == sent["budget"] and shaped["contextTokens"] == sent["tokens"], fmt
    assert cli.json("stats", "t", "--format", "openai")["contextTokens"] < plain["contextTokens"]
    assert cli.json("stats", "t", "--format", "anthropic")["contextTokens"] == plain["contextTokens"]


def test_prompt_preview_is_not_a_request(cli: Cli) -> None:
    """``--preview`` prints the same prompt without counting it as one handed out."""
    _seed(cli)
    looked = json.loads(cli("prompt", "p", "--preview").stdout)
    assert cli.json("stats", "p")["promptCache"]["prompts"] == 0
    sent = json.loads(cli("prompt", "p").stdout)
    assert looked == sent
    assert cli.json("stats", "p")["promptCache"]["prompts"] == 1
