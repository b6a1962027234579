"""The three provider wire shapes ``context/prompt`` returns.

Field names follow each provider's own API (snake_case), not ctxd's camelCase:
the ``messages`` of a prompt result can be sent to the provider as they are.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec


# --- OpenAI chat completions -------------------------------------------------------


class OpenAIFunction(msgspec.Struct):
    name: str
    arguments: str


class OpenAIToolCall(msgspec.Struct):
    id: str
    function: OpenAIFunction
    type: Literal["function"] = "function"


class OpenAIMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: Union[str, None] = None
    name: Union[str, None] = None
    tool_calls: Union[list[OpenAIToolCall], None] = None
    tool_call_id: Union[str, None] = None


# --- Anthropic messages ------------------------------------------------------------


class AnthropicText(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class AnthropicToolUse(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


class AnthropicToolResult(msgspec.Struct, tag="tool_result", tag_field="type", omit_defaults=True):
    tool_use_id: str
    content: str
    is_error: bool = False


class AnthropicThinking(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str


AnthropicBlock = Union[AnthropicText, AnthropicToolUse, AnthropicToolResult, AnthropicThinking]


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
    thinking: Union[str, None] = None
    tool_calls: Union[list[OllamaToolCall], None] = None
    tool_name: Union[str, None] = None
