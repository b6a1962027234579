"""Active context -> the prompt in OpenAI, Anthropic or Ollama wire shape.

Stored messages keep whichever tool-call style the client used; here both styles are
normalised into turns and written out in the provider's shape. Providers reject a
prompt (HTTP 400) when a tool result does not directly follow its call, so the
renderer enforces pairing whatever compression removed or the client sent:

- each tool call is followed by its result (a result pushed later, e.g. after an
  interrupting user message, is moved up to its call);
- a call whose result is nowhere gets the result ``[no result was recorded]``;
- a result whose call is gone (orphan) becomes plain user text, so its content is
  not lost and the prompt stays valid.

Thinking: Anthropic's own thinking blocks (signed: the provider checks the signature)
go back in the Anthropic shape as they were pushed, first in their assistant message;
with extended thinking on, Anthropic refuses a tool-use loop whose last assistant
message does not start with its thinking. Unsigned thinking (other providers'
reasoning, imports) and every thinking block in the OpenAI and Ollama shapes are
history only (docs/decisions.md, "Thinking blocks"). The context counts an assistant
message's thinking when it is signed, whatever the shape (so the prompt fits any of
them); each shape's ``Rendered.format_tokens`` takes off what it does not send, so a
prompt's count is of what it sends.

The pairing is the engine's; the shapes are ``ctxd.formats``': a stored message is read
as a neutral turn (``formats.common.turn_of``) and the paired turns are written out by
``formats.openai.emit``, ``formats.ollama.emit`` or ``formats.anthropic.emit``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ctxd.formats import anthropic, ollama, openai
from ctxd.formats.common import Result, Turn, join, turn_of
from ctxd.protocol.message import Message, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from ctxd.protocol.providers import OllamaMessage, OpenAIMessage
from ctxd.tokens import MESSAGE_OVERHEAD, TOOL_BLOCK_OVERHEAD

MISSING_RESULT = "[no result was recorded for this tool call]"


@dataclass(slots=True)
class PromptPlan:
    """What to render: the client's system parts (the session's system prompt), the
    conversation messages as they should be sent (already pruned/filtered), and ctxd's
    own system parts (goal block, checkpoint section).

    The system part reads: the client's system prompt, the system messages that open
    the conversation (how agents send theirs), then ctxd's parts; one system message for
    OpenAI and Ollama (some servers accept no other), ``system`` for Anthropic."""

    system_parts: list[str]
    messages: list[Message]
    context_parts: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Rendered:
    messages: list[Any]
    system: str | None
    extra_tokens: int
    """Tokens the renderer added to pair tool calls and results (synthesised results,
    relabelled orphans) beyond the stored counts: what :class:`Pairing` says, which the
    active context already counts in ``used``."""
    repairs: list[str]
    system_head: str | None = None
    """The client's part of the system text (see :func:`_system_head`)."""
    format_tokens: int = 0
    """What this provider's shape adds to, or takes from, the context's count: Anthropic's
    opening user turn when the conversation would start with the assistant, less the
    thinking the context counts and the shape does not send (:func:`counted_thinking`;
    all of it in the OpenAI and Ollama shapes). The caller adds it to the prompt's count."""


def _pair(messages: list[Message], count: Callable[[str], int]) -> tuple[list[Turn], int, list[str]]:
    """Turns in an order every provider accepts, with the extra tokens that cost."""
    turns = [turn_of(m) for m in messages]
    # Where each result sits, so a call can claim the first unclaimed result after it.
    pending: dict[str, list[tuple[int, Result]]] = {}
    for index, turn in enumerate(turns):
        for result in turn.results:
            pending.setdefault(result.id, []).append((index, result))
    claimed: set[int] = set()
    out: list[Turn] = []
    extra = 0
    repairs: list[str] = []
    for index, turn in enumerate(turns):
        if turn.role == "assistant":
            out.append(Turn("assistant", turn.texts, turn.calls, name=turn.name, thinking=turn.thinking))
            if turn.calls:
                answered = Turn("results")
                for call in turn.calls:
                    found = None
                    for position, result in pending.get(call.id, ()):
                        if position > index and id(result) not in claimed:
                            found = result
                            break
                    if found is None:
                        found = Result(call.id, MISSING_RESULT, True)
                        extra += TOOL_BLOCK_OVERHEAD + count(MISSING_RESULT)
                        repairs.append(f"synthesised a result for call {call.id}")
                    else:
                        claimed.add(id(found))
                    if found.name is None:
                        found.name = call.name
                    answered.results.append(found)
                out.append(answered)
            continue
        orphans = [r for r in turn.results if id(r) not in claimed]
        texts = list(turn.texts)
        for result in orphans:
            label = f"[tool result {result.id}]" if result.id else "[tool result]"
            texts.append(f"{label}\n{result.text}")
            extra += count(label) + 1
            repairs.append(f"orphan result {result.id or '?'} kept as text")
        if turn.role == "results":
            if texts:
                out.append(Turn("user", texts))
                extra += MESSAGE_OVERHEAD
            continue
        if texts or turn.role == "system":
            out.append(Turn(turn.role, texts, name=turn.name))
    return out, extra, repairs


def signed_thinking(message: Message) -> bool:
    """Whether the message carries thinking the Anthropic shape sends back (an assistant
    message's signed thinking blocks; the prompt counts them, ``engine/context.py``)."""
    content = message.content
    return message.role == "assistant" and isinstance(content, list) and any(
        isinstance(b, ThinkingBlock) and b.signature for b in content)


def counted_thinking(messages: list[Message], count: Callable[[str], int]) -> int:
    """The thinking the context counts for these messages as sent: every thinking block
    of an assistant message with signed thinking, as ``MessageTokens.thinking`` counts it
    (``engine.context.sent_tokens``; views without their thinking are not signed)."""
    total = 0
    for message in messages:
        if signed_thinking(message):
            assert isinstance(message.content, list)  # (signed_thinking says so)
            total += sum(count(b.thinking) for b in message.content if isinstance(b, ThinkingBlock))
    return total


def sent_thinking(out: list[Any], count: Callable[[str], int]) -> int:
    """The thinking an Anthropic prompt's messages carry."""
    return sum(count(b.thinking) for m in out for b in m.content if isinstance(b, anthropic.AnthropicThinking))


def pairing_ids(message: Message) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(calls, results)`` of one message as :func:`_pair` sees them (through
    :func:`_to_turn`): calls only of an assistant message; a tool message's text, or its
    string content, is a result under its ``toolCallId`` (``""`` without one)."""
    role = message.role
    content = message.content
    calls: list[str] = []
    results: list[str] = []
    if role == "tool":
        if isinstance(content, str) or content is None:
            return (), (message.tool_call_id or "",)
        if any(isinstance(b, TextBlock) for b in content) or not any(isinstance(b, ToolResultBlock) for b in content):
            results.append(message.tool_call_id or "")
        results += [b.tool_use_id for b in content if isinstance(b, ToolResultBlock)]
        return (), tuple(results)
    if isinstance(content, list):
        for block in content:
            if isinstance(block, ToolUseBlock) and role == "assistant":
                calls.append(block.id)
            elif isinstance(block, ToolResultBlock):
                results.append(block.tool_use_id)
    if role == "assistant":
        calls += [c.id for c in message.tool_calls or ()]
    return tuple(calls), tuple(results)


def stand_in_tokens(count: Callable[[str], int]) -> int:
    """What the result written for a call without one costs."""
    return TOOL_BLOCK_OVERHEAD + count(MISSING_RESULT)


def orphan_tokens(result_id: str, count: Callable[[str], int]) -> int:
    """What the label of a result without its call (sent as text) costs."""
    return count(f"[tool result {result_id}]" if result_id else "[tool result]") + 1


@dataclass(slots=True)
class Pairing:
    """The tokens rendering adds to a conversation's own counts so that every tool call is
    followed by its result (:func:`_pair`: a stand-in result for a call without one, a
    label for a result without its call), kept up to date as messages are appended, so
    the prompt's count is known without rendering it (the budget's ``promptTokens`` is
    the rendered prompt's ``tokens``). ``open`` holds the calls still waiting for a result,
    in order; ``tokens`` what the repairs cost now."""

    open: list[str] = field(default_factory=list)
    tokens: int = 0

    def add(self, message: Message, count: Callable[[str], int]) -> int:
        """Take ``message`` (the next one of the conversation, as sent) into account; the
        change of ``tokens`` it makes."""
        calls, results = pairing_ids(message)
        if not calls and not results:
            return 0
        before = self.tokens
        orphans = 0
        for result_id in results:
            try:
                self.open.remove(result_id)  # (the earliest open call with that id claims it)
                self.tokens -= stand_in_tokens(count)
            except ValueError:
                if message.role != "assistant":
                    self.tokens += orphan_tokens(result_id, count)
                    orphans += 1
        if orphans and message.role == "tool":
            self.tokens += MESSAGE_OVERHEAD  # (its orphans go out as a user message)
        for call_id in calls:
            self.open.append(call_id)
            self.tokens += stand_in_tokens(count)
        return self.tokens - before


def pairing_of(messages: list[Message], count: Callable[[str], int]) -> Pairing:
    pairing = Pairing()
    for message in messages:
        pairing.add(message, count)
    return pairing


def _system_first(plan: PromptPlan, turns: list[Turn]) -> tuple[list[str], list[Turn]]:
    """The system part (see :class:`PromptPlan`) and the turns after the opening system
    messages."""
    start = 0
    while start < len(turns) and turns[start].role == "system":
        start += 1
    opening = [t for turn in turns[:start] for t in turn.texts]
    return [*plan.system_parts, *opening, *plan.context_parts], turns[start:]


def render_openai(plan: PromptPlan, count: Callable[[str], int]) -> Rendered:
    turns, extra, repairs = _pair(plan.messages, count)
    system, turns = _system_first(plan, turns)
    out: list[OpenAIMessage] = [OpenAIMessage(role="system", content=join(system))] if system else []
    return Rendered(out + openai.emit(turns), None, extra, repairs, _system_head(plan, system),
                    -counted_thinking(plan.messages, count))


def render_ollama(plan: PromptPlan, count: Callable[[str], int]) -> Rendered:
    turns, extra, repairs = _pair(plan.messages, count)
    system, turns = _system_first(plan, turns)
    out: list[OllamaMessage] = [OllamaMessage(role="system", content=join(system))] if system else []
    return Rendered(out + ollama.emit(turns), None, extra, repairs, _system_head(plan, system),
                    -counted_thinking(plan.messages, count))


def render_anthropic(plan: PromptPlan, count: Callable[[str], int]) -> Rendered:
    """System text goes to ``system`` (later system-role messages of the conversation
    join it, in order); roles alternate, consecutive turns of one role merge, tool results
    open the user message that follows their calls. Whitespace-only text is left out
    (Anthropic rejects text blocks without non-whitespace text)."""
    turns, extra, repairs = _pair(plan.messages, count)
    system_parts, turns = _system_first(plan, turns)
    head = _system_head(plan, system_parts)
    out = anthropic.emit(turns, system_parts)
    thinking = sent_thinking(out, count) - counted_thinking(plan.messages, count)
    out, more, fixes = anthropic.finish(out, count)
    return Rendered(out, join(system_parts) if system_parts else None, extra, repairs + fixes, head,
                    more + thinking)


def _system_head(plan: PromptPlan, system: list[str]) -> str | None:
    """The client's part of the system text (its system prompt and opening system
    messages), before ctxd's goal and checkpoints: what stays the same across passes."""
    n = len(system) - len(plan.context_parts)
    return join(system[:n]) if n > 0 else None


def _result_ids(message: Message) -> list[str]:
    ids = [message.tool_call_id] if message.role == "tool" and message.tool_call_id else []
    content = message.content
    if isinstance(content, list):
        ids += [b.tool_use_id for b in content if isinstance(b, ToolResultBlock)]
    return ids


def _call_ids(message: Message) -> list[str]:
    ids = [c.id for c in message.tool_calls or ()]
    content = message.content
    if message.role == "assistant" and isinstance(content, list):
        ids += [b.id for b in content if isinstance(b, ToolUseBlock)]
    return ids


OPEN_HORIZON = 32
"""A call still without its result this many messages later no longer holds the reused
part back (a result that does turn up later makes the next render start afresh)."""


def _closed_prefix(messages: list[Message]) -> tuple[int, set[str]]:
    """The longest prefix in which every tool call has its result, or has waited for it
    longer than ``OPEN_HORIZON``: rendering it alone gives what rendering it as part of
    the whole gives (results only move up to their calls). Also the calls in that
    prefix without a result in it."""
    last_result: dict[str, int] = {}
    for index, message in enumerate(messages):
        for result_id in _result_ids(message):
            last_result[result_id] = index
    # Open calls in order, as _pair claims results: each call the first result after it.
    open_calls: list[tuple[str, int]] = []
    unanswered: set[str] = set()
    closed = 0
    closed_unanswered: set[str] = set()
    for index, message in enumerate(messages):
        for result_id in _result_ids(message):
            for position, (call_id, _) in enumerate(open_calls):
                if call_id == result_id:
                    del open_calls[position]
                    break
        for call_id in _call_ids(message):
            open_calls.append((call_id, index))
        # A call times out only when no result with its id comes later in these messages
        # (a later push that brings one makes the renderer start afresh).
        timed_out = [(c, at) for c, at in open_calls
                     if index - at >= OPEN_HORIZON and last_result.get(c, -1) <= index]
        for item in timed_out:
            open_calls.remove(item)
            unanswered.add(item[0])
        if not open_calls:
            closed = index + 1
            closed_unanswered = set(unanswered)
    return closed, closed_unanswered


class IncrementalRenderer:
    """Renders a session's prompt in one format, reusing the rendering of the part that
    did not change: a prompt grows at its end between compressions, so after a push
    only the new messages (from the last point where every tool call had its result)
    are paired and written out. Any other change (a compression, a pin, new system or
    checkpoint text) is seen in the messages themselves (new objects) and renders all.

    :meth:`render` takes the whole plan and checks its reused part message by message;
    :meth:`append` takes only the messages added since the last render, from a caller
    that knows nothing before them changed (the service: the context's revision did not
    move), and looks at nothing older than the part after the reused prefix."""

    MIN_STEP = 1
    """Messages the reused part must grow by before it is extended: at once (extending
    costs the new messages alone, while what is left in the open tail is rendered again
    by every prompt)."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self.prefix: list[Message] = []
        self.out: list[Any] = []
        """The prefix written out (after the system message, for OpenAI and Ollama)."""
        self.system: list[str] = []
        self.head: str | None = None
        self.extra = 0
        self.thinking = 0
        """The prefix's :attr:`Rendered.format_tokens` for its thinking."""
        self.repairs: list[str] = []
        self.unanswered: set[str] = set()
        """Calls in the prefix without a result there (rendered with a stand-in)."""
        self.tail: list[Message] = []
        """The messages of the last render after ``prefix`` (all of them when it is empty)."""
        self.first: Any = None
        """The last system message written (OpenAI and Ollama)."""

    def render(self, plan: PromptPlan, count: Callable[[str], int]) -> Rendered:
        messages = plan.messages
        key = (tuple(plan.system_parts), tuple(plan.context_parts))
        k = len(self.prefix)
        reusable = (key == self.key and k and len(messages) >= k
                    and all(map(operator.is_, self.prefix, messages))
                    and not self._answers_stand_in(messages[k:]))
        if not reusable:
            self._reset(plan, key, count)
            k = len(self.prefix)
            if not k:
                self.tail = list(messages)
                return RENDERERS[self.fmt](plan, count)
        return self._render_tail(messages[k:], count)

    def append(self, messages: list[Message], count: Callable[[str], int]) -> Rendered:
        """The last plan rendered with ``messages`` added at its end (what :meth:`render`
        of that whole plan gives), for a caller that knows nothing before them changed."""
        if self.key is None:
            raise RuntimeError("append before a first render")
        if not self.prefix or self._answers_stand_in(messages):
            # Nothing reused yet, or a result for a call the prefix rendered with a stand-in:
            # the whole plan again, as render would.
            plan = PromptPlan(system_parts=list(self.key[0]), messages=self.prefix + self.tail + messages,
                              context_parts=list(self.key[1]))
            self.prefix = []
            return self.render(plan, count)
        return self._render_tail(self.tail + messages, count)

    def _answers_stand_in(self, messages: list[Message]) -> bool:
        return bool(self.unanswered) and any(r in self.unanswered for m in messages for r in _result_ids(m))

    def _render_tail(self, tail: list[Message], count: Callable[[str], int]) -> Rendered:
        closed, unanswered = _closed_prefix(tail)
        if closed >= self.MIN_STEP:
            self._extend(tail[:closed], count)
            self.unanswered |= unanswered
            tail = tail[closed:]
        self.tail = tail
        return self._combine(tail, count)

    def _reset(self, plan: PromptPlan, key: tuple[tuple[str, ...], tuple[str, ...]],
               count: Callable[[str], int]) -> None:
        self.key = key
        messages = plan.messages
        k, self.unanswered = _closed_prefix(messages)
        turns, extra, repairs = _pair(messages[:k], count)
        system, turns = _system_first(plan, turns)
        if not turns:  # nothing but the opening system messages: nothing worth keeping
            self.prefix, self.out = [], []
            return
        self.prefix = list(messages[:k])
        self.system = system
        self.head = _system_head(plan, system)
        self.extra, self.repairs = extra, repairs
        self.system = list(system)
        self.out = self._emit(turns, self.system)
        self.thinking = self._thinking(self.prefix, self.out, count)

    def _emit(self, turns: list[Turn], system: list[str]) -> list[Any]:
        if self.fmt == "openai":
            return openai.emit(turns)
        if self.fmt == "ollama":
            return ollama.emit(turns)
        return anthropic.emit(turns, system)

    def _thinking(self, messages: list[Message], out: list[Any], count: Callable[[str], int]) -> int:
        """What the thinking of ``messages``, written out as ``out``, adds to their count
        in this shape (see :attr:`Rendered.format_tokens`)."""
        sent = sent_thinking(out, count) if self.fmt == "anthropic" else 0
        return sent - counted_thinking(messages, count)

    def _extend(self, messages: list[Message], count: Callable[[str], int]) -> None:
        """Add ``messages`` to the reused part, in place (``prefix`` and ``out`` are this
        renderer's own lists: a prompt gets copies), so extending costs what they cost,
        whatever the length of what is reused."""
        turns, extra, repairs = _pair(messages, count)
        system = list(self.system)
        out = self._emit(turns, system)
        self.thinking += self._thinking(messages, out, count)
        if self.fmt == "anthropic":  # (the boundary's two messages merged when they share a role)
            self.out[-1:] = anthropic.join_messages(self.out[-1:], out)
        else:
            self.out += out
        self.system = system
        self.prefix += messages
        self.extra += extra
        self.repairs = self.repairs + repairs

    def _combine(self, tail: list[Message], count: Callable[[str], int]) -> Rendered:
        turns, extra, repairs = _pair(tail, count)
        system = list(self.system)
        out = self._emit(turns, system)
        thinking = self.thinking + self._thinking(tail, out, count)
        extra += self.extra
        repairs = self.repairs + repairs
        if self.fmt == "anthropic":
            messages, more, fixes = anthropic.finish(anthropic.join_messages(self.out, out), count)
            return Rendered(messages, join(system) if system else None, extra, repairs + fixes, self.head,
                            more + thinking)
        first: list[Any] = []
        if system:
            text = join(system)
            if self.first is None or self.first.content != text:
                # (The same object while its text is: a prompt after a push then starts
                # with the same objects as the one before, which ``ctxd proxy`` builds on.)
                self.first = (OpenAIMessage if self.fmt == "openai" else OllamaMessage)(role="system", content=text)
            first = [self.first]
        return Rendered(first + self.out + out, None, extra, repairs, self.head, thinking)


RENDERERS: dict[str, Callable[[PromptPlan, Callable[[str], int]], Rendered]] = {
    "openai": render_openai,
    "anthropic": render_anthropic,
    "ollama": render_ollama,
}
