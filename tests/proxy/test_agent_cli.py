"""A real command-line LLM tool through ``ctxd proxy``: Simon Willison's ``llm`` (from the
package index; the ``test`` extra installs it), configured by its documented setting for
OpenAI-compatible servers (``extra-openai-models.yaml`` with ``api_base``), both on Chat
Completions and on the Responses API. It runs as users run it: one process per prompt,
``-c`` to continue the conversation, a Python tool (``--functions``) it executes itself,
streamed and not. The proxy forwards to the fake upstream (tests/proxy/upstream.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ctxd.tokens import TokenCounter
from tests.proxy.conftest import history, sessions

LLM = Path(sys.executable).parent / "llm"
WINDOW = 4096
TOOL_OUTPUT = "Sunny with light wind, 21 C, humidity 40 percent, visibility good. " * 60
FUNCTIONS = f'def get_weather(city: str) -> str:\n    "The weather of a city."\n    return {TOOL_OUTPUT!r}\n'
PROMPTS = [f"Turn {n}: please use the tool to check the weather in Paris for day {n}." for n in range(6)]


def run_llm(user_dir: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LLM_"))}
    env["LLM_USER_PATH"] = str(user_dir)
    done = subprocess.run([str(LLM), *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"llm {args[:3]} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip()


@pytest.mark.parametrize("wire", ["chat", "responses"])
async def test_llm_cli_conversation_through_the_proxy(wire, proxy, upstream, ctxd_daemon, base_dir) -> None:
    assert LLM.exists(), "the llm CLI is part of the test extra: pip install '.[test]'"
    user_dir = base_dir / "llm"
    user_dir.mkdir()
    # llm's documented way to use an OpenAI-compatible server; headers are sent with every request.
    (user_dir / "extra-openai-models.yaml").write_text(textwrap.dedent(f"""\
        - model_id: through-ctxd
          model_name: fake-model
          api_base: {proxy.url}/v1
          supports_tools: true
          {"responses: true" if wire == "responses" else "can_stream: true"}
          headers:
            X-Ctxd-Context-Window: "{WINDOW}"
        """))
    answers = []
    for n, prompt in enumerate(PROMPTS):
        start = ["-m", "through-ctxd", "-s", "You are a terse weather agent."] if n == 0 else ["-c"]
        stream = ["--no-stream"] if n % 3 == 2 else []
        answers.append(run_llm(user_dir, *start, *stream, "--functions", FUNCTIONS, prompt))
    # llm ran the tool after each call and printed the model's answer to its result.
    assert answers == ["Answer to: the result of tool"] * len(PROMPTS)

    path = "/v1/responses" if wire == "responses" else "/v1/chat/completions"
    sent = upstream.chats(path)
    assert len(sent) == 2 * len(PROMPTS)  # a call, then the answer to its result, per prompt
    [info] = await sessions(ctxd_daemon)
    assert info["title"] == PROMPTS[0] and info["systemPrompt"] == "You are a terse weather agent."
    assert info["provider"] == "openai" and info["contextWindow"] == WINDOW
    # The session holds everything llm said and got, once each, in order.
    stored = await history(ctxd_daemon, info["sessionId"])
    assert [m["content"] for m in stored if m["role"] == "user"] == PROMPTS
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"] * len(PROMPTS)
    assert all(m["content"].strip() == TOOL_OUTPUT.strip() for m in stored if m["role"] == "tool")
    assert all(m.get("usage", {}).get("inputTokens", 0) > 0 for m in stored if m["role"] == "assistant")
    # Compression applied: llm sends its whole history every time, far over the window by
    # the end; what reached the upstream stayed under the window (old tool outputs pruned),
    # with every prompt typed, verbatim.
    counter = TokenCounter.for_model("gpt-4o")
    assert counter.count(TOOL_OUTPUT) * len(PROMPTS) > WINDOW
    sizes = [counter.count(json.dumps(r.json)) for r in sent]
    assert max(sizes) < WINDOW, str(sizes)
    last = json.dumps(sent[-1].json)
    assert last.count(TOOL_OUTPUT.strip()) < len(PROMPTS)
    assert all(prompt in last for prompt in PROMPTS)
