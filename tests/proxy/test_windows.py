"""Per-model windows (``proxy.context_window`` as a table): the models it names are managed
at their window, a model it leaves out passes through unchanged while its request fits
the model's own window (aider's summarizer model, Claude Code's small fast model)."""

from __future__ import annotations

import json

import httpx

from ctxd.proxy.windows import Managed, Unlisted, Windows, lookup
from tests.proxy.conftest import history, sessions
from tests.proxy.upstream import MODEL


def test_lookup_exact_name_then_the_most_specific_pattern() -> None:
    table = {"claude-sonnet-4*": 48_000, "claude-*": 100_000, "gpt-5-mini": 0, "Weak-Model": 16_000}
    assert lookup(table, "claude-sonnet-4-5") == Managed(48_000)
    assert lookup(table, "claude-haiku-4-5") == Managed(100_000)
    assert lookup(table, "anthropic/claude-sonnet-4-5") == Managed(48_000)
    assert lookup(table, "gpt-5-mini") == Managed(None)  # 0: the model's own window, managed
    assert lookup(table, "weak-model") == Managed(16_000)  # names compare without case
    assert lookup(table, "gpt-5") == Unlisted(None)
    assert lookup(table, None) == Unlisted(None)
    assert lookup(0, "anything") == Managed(None)  # unset: every model at its own window
    assert lookup(24_000, "anything") == Managed(24_000)  # one number: every model
    assert lookup({}, "anything") == Managed(None)


def test_an_unlisted_model_is_managed_only_when_its_request_outgrows_its_own_window() -> None:
    counted: list[str] = []

    def count(model: str | None, text: str) -> int:
        counted.append(text)
        return len(text) // 4

    windows = Windows({"main": 8000}, known={"small": 1000, "main": 200_000}.get, counter=count)
    assert windows.decide("main", b"x" * 100_000, None) == Managed(8000)
    assert windows.decide("unknown-model", b"x" * 100_000, None) is None  # its window unknown: the client's
    assert windows.decide("small", b"x" * 900, None) is None and counted == []  # short: not even counted
    assert windows.decide("small", b"x" * 3000, None) is None  # 750 tokens
    assert windows.decide("small", b"x" * 3000, 300) == Managed(1000)  # 750 + the reply's 300 > 1000
    assert windows.decide("small", b"x" * 8000, None) == Managed(1000)


async def test_per_model_windows_end_to_end(start_proxy, upstream, ctxd_daemon) -> None:
    """The main model at its table window (compressed to fit), a summarizer model with no
    entry passed through byte for byte with no session, and an unlisted model whose
    request outgrows its own window ([models]) managed at that window."""
    upstream.models = {MODEL, "weak-model", "small-model"}
    proxy = start_proxy("--set", f'proxy.context_window={{"{MODEL}": 2048}}',
                        "--set", 'models.context_windows={"small-model": 1500}')
    paragraph = "The build log says module {0} compiled with warnings about unused imports. " * 12

    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
        async def ask(model: str, messages: list[dict]) -> httpx.Response:
            body = {"model": model, "messages": messages, "max_tokens": 100}
            return await client.post("/v1/chat/completions", content=json.dumps(body).encode(),
                                     headers={"authorization": "Bearer sk-test"})

        main: list[dict] = [{"role": "system", "content": "Main agent."}]
        for n in range(8):
            main.append({"role": "user", "content": f"Step {n}: " + paragraph.format(n)})
            reply = await ask(MODEL, main)
            assert reply.status_code == 200, reply.text
            main.append(reply.json()["choices"][0]["message"])
        summary = [{"role": "system", "content": "Summarize."},
                   {"role": "user", "content": "\n".join(paragraph.format(n) for n in range(12))}]
        sent = len(upstream.received)
        reply = await ask("weak-model", summary)
        assert reply.status_code == 200, reply.text
        # The summarizer's request is far over the main model's 2048: passed on as sent.
        assert upstream.received[sent].json == {"model": "weak-model", "messages": summary, "max_tokens": 100}
        small = [{"role": "system", "content": "Small."}]
        for n in range(12):
            small.append({"role": "user", "content": f"Part {n}: " + paragraph.format(n)})
            reply = await ask("small-model", small)
            assert reply.status_code == 200, reply.text
            small.append(reply.json()["choices"][0]["message"])

    infos = {s["title"].split(":")[0]: s for s in await sessions(ctxd_daemon)}
    assert set(infos) == {"Step 0", "Part 0"}  # no session for the summarizer
    assert infos["Step 0"]["contextWindow"] == 2048 and infos["Step 0"]["model"] == MODEL
    assert infos["Part 0"]["contextWindow"] == 1500 and infos["Part 0"]["model"] == "small-model"
    assert len(await history(ctxd_daemon, infos["Step 0"]["sessionId"])) == 16
    # Every managed request fits its model's window as sent (bytes / 4 as a generous bound).
    for received in upstream.chats():
        model = received.json["model"]
        if model == MODEL:
            assert len(received.body) // 4 < 2048 * 1.3, len(received.body)
    mains = [r for r in upstream.chats() if r.json["model"] == MODEL]
    assert len(json.dumps(main)) // 4 > 2048 and len(mains[-1].body) < len(json.dumps(main))
    smalls = [r for r in upstream.chats() if r.json["model"] == "small-model"]
    assert len(smalls[-1].body) < len(json.dumps(small))  # compressed once it outgrew 1500
