"""The chat message as clients push it and as ctxd stores it.

One shape accepts both OpenAI-style tool calls (``toolCalls`` on the assistant,
``role: tool`` replies with ``toolCallId``) and Anthropic-style content blocks
(``tool_use`` in the assistant, ``tool_result`` in the next user message). Whatever
a client sends is stored as sent; conversion between the styles happens only when a
prompt is rendered (``ctxd.engine.render``, through ``ctxd.formats``). Provider-native
spellings (``tool_calls``, ``tool_use_id``, a provider's usage) are renamed before a push
is decoded (``ctxd.formats.native``). Unknown fields are rejected rather than
dropped, because a field silently lost is a message silently changed.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Role = Literal["system", "user", "assistant", "tool"]


class _Block(msgspec.Struct, tag_field="type", rename="camel", omit_defaults=True,
             forbid_unknown_fields=True):
    pass


class TextBlock(_Block, tag="text"):
    """Plain text."""

    text: str


class ToolUseBlock(_Block, tag="tool_use"):
    """A tool call in Anthropic style (inside an assistant message)."""

    id: str
    name: str
    input: dict[str, Any] = {}


class ToolResultBlock(_Block, tag="tool_result"):
    """The result of a tool call in Anthropic style (inside a user or tool message)."""

    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False


class ThinkingBlock(_Block, tag="thinking"):
    """Model reasoning. Kept in history and snapshots, never sent to providers that reject it."""

    thinking: str
    signature: str | None = None


class ImageBlock(_Block, tag="image"):
    """An image that came with a message, as ctxd can send it: what it shows
    (``description``: a caption or alt text an importer or client wrote) and where it is
    (``url``, history only). Not the speaker's words: providers get it as one line of text,
    ``[image: <description>]`` (:func:`image_text`); compression treats it like a tool
    output (a user message kept verbatim behind the compression boundary is sent without
    it, a summary quotes it only when there is room); history keeps it."""

    description: str = ""
    url: str | None = None


ContentBlock = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | ImageBlock


class FunctionCall(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI ``function`` of a tool call; ``arguments`` is JSON text, kept verbatim."""

    name: str
    arguments: str = ""


class CustomCall(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI ``custom`` of a freeform tool call (a ``custom`` tool: Codex's ``apply_patch``
    on the Responses API, ``type: "custom"`` calls on Chat Completions): the text the
    model wrote for the tool, kept verbatim; it is no JSON."""

    name: str
    input: str = ""


class ToolCall(msgspec.Struct, forbid_unknown_fields=True):
    """A tool call in OpenAI style (``toolCalls`` of an assistant message): a function call
    (``function``, JSON arguments) or a freeform call (``type: "custom"``, ``custom``).
    Either way its result is a ``tool`` message answering its ``id``. The field a call
    does not have is absent (never ``null``)."""

    id: str
    function: FunctionCall | msgspec.UnsetType = msgspec.UNSET
    type: Literal["function", "custom"] = "function"
    custom: CustomCall | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        if self.type == "function" and (self.function is msgspec.UNSET or self.custom is not msgspec.UNSET):
            raise ValueError("a function tool call has `function` and no `custom`")
        if self.type == "custom" and (self.custom is msgspec.UNSET or self.function is not msgspec.UNSET):
            raise ValueError("a custom tool call has `custom` and no `function`")

    @property
    def name(self) -> str:
        """The tool's name, whichever kind of call."""
        if isinstance(self.custom, CustomCall):
            return self.custom.name
        return self.function.name if isinstance(self.function, FunctionCall) else ""

    @property
    def text(self) -> str:
        """What the model wrote for the tool: a function's JSON ``arguments``, a freeform
        call's ``input``."""
        if isinstance(self.custom, CustomCall):
            return self.custom.input
        return self.function.arguments if isinstance(self.function, FunctionCall) else ""


class Usage(msgspec.Struct, rename="camel", omit_defaults=True, forbid_unknown_fields=True):
    """Token usage the provider reported for the call that produced this message. A push
    refuses negative or absurd counts (``session/push`` checks them; the type stays open
    so messages stored by any version always read back)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_input_tokens: int | None = None
    """Of ``inputTokens``, those the provider read from its prompt cache, where its input
    count includes them (OpenAI's ``prompt_tokens_details.cached_tokens``, DeepSeek's
    ``prompt_cache_hit_tokens``). Anthropic counts its cache reads beside ``input_tokens``:
    those are ``cacheReadTokens``."""


class Message(msgspec.Struct, rename="camel", omit_defaults=True, forbid_unknown_fields=True):
    """One chat message.

    ``timestamp`` is an ISO 8601 string kept exactly as sent (it is validated, not
    reformatted). ``idempotencyKey`` makes a retried push harmless: the same key in the
    same session returns the original result and stores nothing twice. ``metadata`` is
    free-form, except ``metadata.observation: true`` on a user message: it carries tool
    output (agents that return command results as user messages), so it is compressed
    like tool output instead of being kept verbatim as the user's words; and
    ``metadata.demonstration: true``: a worked example an agent framework sends as a user
    message (SWE-agent's ``is_demo``), compressed like the rest of the conversation, and
    not taken for the agent's task.
    """

    role: Role
    content: str | list[ContentBlock] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None
    usage: Usage | None = None
    metadata: dict[str, Any] | None = None
    timestamp: str | None = None
    idempotency_key: str | None = None


def blocks_of(message: Message) -> list[ContentBlock]:
    """The message content as a list of blocks (a string becomes one text block)."""
    content = message.content
    if content is None:
        return []
    if isinstance(content, str):
        return [TextBlock(text=content)] if content else []
    return content


def image_text(block: ImageBlock) -> str:
    """What a provider is sent for an image block (and what it is counted as)."""
    description = " ".join(block.description.split())
    return f"[image: {description}]" if description else "[image]"


def tool_result_text(block: ToolResultBlock) -> str:
    """The text of a tool result, whichever form its content takes."""
    if isinstance(block.content, str):
        return block.content
    return "\n".join(part.text for part in block.content)


def message_text(message: Message) -> str:
    """All human-readable text of a message (text, tool calls, tool results, thinking).

    Used for search indexing and extractive summaries; not a wire format.
    """
    parts: list[str] = []
    for block in blocks_of(message):
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            parts.append(f"{block.name}({msgspec.json.encode(block.input).decode()})")
        elif isinstance(block, ToolResultBlock):
            parts.append(tool_result_text(block))
        elif isinstance(block, ThinkingBlock):
            parts.append(block.thinking)
        elif isinstance(block, ImageBlock):
            parts.append(image_text(block))
    for call in message.tool_calls or ():
        parts.append(f"{call.name}({call.text})")
    return "\n".join(parts)
