"""The three provider wire shapes ``context/prompt`` returns.

Field names follow each provider's own API (snake_case), not ctxd's camelCase:
the ``messages`` of a prompt result can be sent to the provider as they are.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# --- OpenAI chat completions -------------------------------------------------------


class OpenAIFunction(msgspec.Struct):
    name: str
    arguments: str


class OpenAICustom(msgspec.Struct):
    """A freeform (custom tool) call's name and the model's text for it."""

    name: str
    input: str


class OpenAIToolCall(msgspec.Struct):
    """A function call (``function``) or a freeform one (``type: "custom"``, ``custom``)."""

    id: str
    function: OpenAIFunction | msgspec.UnsetType = msgspec.UNSET
    type: Literal["function", "custom"] = "function"
    custom: OpenAICustom | msgspec.UnsetType = msgspec.UNSET


class OpenAIMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None
    tool_calls: list[OpenAIToolCall] | None = None
    tool_call_id: str | None = None


# --- Anthropic messages ------------------------------------------------------------


class CacheControl(msgspec.Struct):
    """An Anthropic prompt-cache breakpoint: the prompt up to this block is cached."""

    type: Literal["ephemeral"] = "ephemeral"


class AnthropicText(msgspec.Struct, tag="text", tag_field="type", omit_defaults=True):
    text: str
    cache_control: CacheControl | None = None


class AnthropicToolUse(msgspec.Struct, tag="tool_use", tag_field="type", omit_defaults=True):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class AnthropicToolResult(msgspec.Struct, tag="tool_result", tag_field="type", omit_defaults=True):
    tool_use_id: str
    content: str
    is_error: bool = False
    cache_control: CacheControl | None = None


class AnthropicThinking(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str


AnthropicBlock = AnthropicText | AnthropicToolUse | AnthropicToolResult | AnthropicThinking


class AnthropicMessage(msgspec.Struct):
    role: Literal["user", "assistant"]
    content: list[AnthropicBlock]


# --- Ollama /api/chat --------------------------------------------------------------


class OllamaFunction(msgspec.Struct):
    name: str
    arguments: dict[str, Any]


class OllamaToolCall(msgspec.Struct):
    function: OllamaFunction


class OllamaMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    thinking: str | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
