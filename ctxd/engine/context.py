"""The active context: what would be sent right now, as plain data.

History is every message ever pushed. The active context is a view of it:

    system part     system prompt, goal block, checkpoints (summaries of older turns)
    kept            messages at or before the compression boundary that are still
                    sent verbatim: the user's words (without the tool results and the
                    images they carried; a run of them as one user message), system messages, pinned messages (whole)
    recent          every message after the boundary, as sent: tool outputs older than
                    the pruning horizon replaced by a placeholder, tool blocks before
                    the watermark removed

Compression moves the boundary forward and adds checkpoints; it never edits history.
:class:`CompressionState` is everything needed to rebuild this view from history,
and is what gets stored.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain

import msgspec

from ctxd.engine.checkpoints import in_order, message_text, place
from ctxd.engine.clip import clip_any, clip_message, clip_words
from ctxd.engine.render import Pairing, PromptPlan, signed_thinking
from ctxd.formats.anthropic import OPENER
from ctxd.protocol.compression import Checkpoint, merge_ranges
from ctxd.protocol.message import (
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from ctxd.tokens import MESSAGE_OVERHEAD, PROMPT_PRIMING, TOOL_BLOCK_OVERHEAD, MessageTokens


class PruneEvent(msgspec.Struct, array_like=True):
    """Tool outputs in messages up to ``through_seq`` were cleared at ``at``."""

    through_seq: int
    at: str


class ClipEvent(msgspec.Struct, array_like=True):
    """The tool output of message ``seq`` is sent as an excerpt of ``max_tokens``; with
    ``words``, the text of an older user message (an agent's task that no longer fits
    beside the rest: ``pipeline.plan_word_excerpts``), kept or recent."""

    seq: int
    max_tokens: int
    at: str
    words: bool = False

    def keeps(self, boundary: int, kept: set[int]) -> bool:
        """Whether it still applies once the boundary moved to ``boundary`` (an excerpt of
        the user's words follows the message behind it; others end there)."""
        return self.seq > boundary or (self.words and self.seq in kept)


class FileRead(msgspec.Struct, array_like=True):
    """The newest read of a file by a tool call (``engine/workset.py``): the messages of the
    call and its result, what each costs sent whole, and whether the file was touched
    (read, edited) after it."""

    path: str
    call_seq: int
    result_seq: int
    call_tokens: int
    result_tokens: int
    again: bool = False


class CompressionState(msgspec.Struct, rename="camel", omit_defaults=True):
    """The stored part of the active context (beside checkpoints and history)."""

    boundary: int = 0
    kept_seqs: list[int] = []
    pinned: list[int] = []
    watermark_seq: int = 0
    watermark_tool_use_id: str | None = None
    prunes: list[PruneEvent] = []
    compression_count: int = 0
    last_after_used: int | None = None
    lossy: bool = False
    """Something was truncated or folded (lowers reliability's context confidence)."""
    reliability_level: str | None = None
    threshold_level: str | None = None
    snapshot_armed: bool = True
    """The next rise above the snapshot threshold takes an automatic snapshot."""
    snapshot_seq: int = 0
    """History's last seq when the last snapshot was taken."""
    revision: int = 0
    """Bumped by every change to the active context (the service's ``refresh``)."""
    snapshot_revision: int = -1
    """``revision`` when the last snapshot was taken (-1: none yet)."""
    rolled_back: list[tuple[int, int]] = []
    """Ranges of history (inclusive) that a snapshot restore took out of the active context."""
    superseded: list[int] = []
    """Messages a client no longer sends because it sends a newer copy (its own working
    context: the files in its chat, a repository map, a reminder): out of the active
    context, kept in history (``context/prompt`` ``supersede``). Sorted."""
    current: list[int] = []
    """Messages pinned because a client named them its current working context
    (``context/prompt`` ``current``): unpinned when it no longer does. Sorted."""
    working: list[int] = []
    """Messages pinned as the agent's working set (``engine/workset.py``: the newest read of
    each file its tool calls read, with its call): unpinned when a newer copy or a file
    worked on more recently takes their place. Sorted."""
    reads: list[FileRead] = []
    """The newest read of each file the agent read, where the working set is chosen from."""
    declined: list[int] = []
    """Working-set messages the user unpinned: never chosen for the working set again
    (a pin of theirs takes them off this list). Sorted."""
    clips: list[ClipEvent] = []
    """Recent tool outputs too big for the prompt, sent as excerpts (``engine/clip.py``)."""
    lent: tuple[int, int] | None = None
    """``(seq, tokens)``: the reply's reserve lends ``tokens`` to the newest turn while
    message ``seq`` is the session's newest (``SessionSettings.outputFloor``); void after."""

    def lent_now(self, last_seq: int) -> int:
        """The tokens lent while ``last_seq`` is the newest message (0: none)."""
        return self.lent[1] if self.lent is not None and self.lent[0] == last_seq else 0

    def clip_for(self, seq: int) -> int | None:
        for event in self.clips:
            if event.seq == seq and not event.words:
                return event.max_tokens
        return None

    def words_clip_for(self, seq: int) -> int | None:
        """The excerpt limit of a user message's own words, if they are cut."""
        for event in self.clips:
            if event.seq == seq and event.words:
                return event.max_tokens
        return None

    def is_rolled_back(self, seq: int) -> bool:
        return any(low <= seq <= high for low, high in self.rolled_back)

    def is_superseded(self, seq: int) -> bool:
        at = bisect.bisect_left(self.superseded, seq)
        return at < len(self.superseded) and self.superseded[at] == seq

    def is_out(self, seq: int) -> bool:
        """Out of the active context whatever compression does: rolled back or superseded."""
        return self.is_rolled_back(seq) or self.is_superseded(seq)

    def prune_horizon(self) -> int:
        return self.prunes[-1].through_seq if self.prunes else 0

    def pruned_at(self, seq: int) -> str | None:
        for event in self.prunes:
            if seq <= event.through_seq:
                return event.at
        return None


@dataclass(slots=True)
class Entry:
    """One history message in the active context, with what compression needs to know."""

    seq: int
    message: Message
    tokens: MessageTokens
    call_ids: tuple[str, ...]
    result_ids: tuple[str, ...]
    call_names: tuple[str, ...]
    has_user_text: bool
    # The message as sent and what it costs, refreshed by ActiveContext.refresh().
    view: Message | None = None
    view_tokens: int = 0
    clipped: tuple[int, Message, int] | None = None
    """(max_tokens, view, view_tokens) of the excerpt last made, so refreshes reuse it."""
    kept_view: tuple[Message, int] | None = None
    """(view, view_tokens) while kept behind the boundary, made once (see ``_kept_view``)."""
    words_cut: tuple[int, bool, Message, int] | None = None
    """(max_tokens, kept, view, view_tokens) of the excerpt of its words last made."""
    sent_thinking: int = 0
    """Thinking tokens sent with the message (an assistant message's signed thinking, which
    the Anthropic shape sends back: ``render.signed_thinking``), beyond ``tokens.context``."""

    @classmethod
    def of(cls, seq: int, message: Message, tokens: MessageTokens) -> Entry:
        calls: list[str] = []
        names: list[str] = []
        results: list[str] = []
        has_text = False
        signed = False
        content = message.content
        if isinstance(content, str):
            has_text = bool(content)
        elif content:
            for block in content:
                if isinstance(block, TextBlock):
                    has_text = has_text or bool(block.text)
                elif isinstance(block, ToolUseBlock):
                    calls.append(block.id)
                    names.append(block.name)
                elif isinstance(block, ToolResultBlock):
                    results.append(block.tool_use_id)
                elif isinstance(block, ThinkingBlock):
                    signed = signed or bool(block.signature)
        for call in message.tool_calls or ():
            calls.append(call.id)
            names.append(call.name)
        if message.role == "tool" and message.tool_call_id:
            results.append(message.tool_call_id)
        return cls(seq, message, tokens, tuple(calls), tuple(results), tuple(names),
                   has_text and message.role == "user" and not is_observation(message)
                   and not is_demonstration(message),
                   sent_thinking=tokens.thinking if signed and message.role == "assistant" else 0)

    @property
    def role(self) -> str:
        return self.message.role

    @property
    def sent_tokens(self) -> int:
        """What the message costs sent whole (:func:`sent_tokens`)."""
        return self.tokens.context + self.sent_thinking


def sent_tokens(message: Message, tokens: MessageTokens) -> int:
    """What a message adds to a prompt sent whole: ``tokens.context``, plus its thinking
    when the Anthropic shape sends that back (an assistant message's signed thinking:
    counted for every shape, so the prompt fits whichever is asked for)."""
    return tokens.context + (tokens.thinking if signed_thinking(message) else 0)


PRUNED_TEXT = "[Old tool result cleared by ctxd at {at}; the full output is in history]"


def is_observation(message: Message) -> bool:
    """A user-role message that carries tool output, not the user's words: agents that send
    command results back as user messages (SWE-agent, mini-swe-agent's text protocol) mark
    them ``metadata.observation: true`` (ctxd's importers do). They are compressed like
    tool output instead of being kept verbatim."""
    return message.metadata is not None and message.metadata.get("observation") is True


def is_demonstration(message: Message) -> bool:
    """A user-role message that is a worked example, not the user's words: SWE-agent opens
    with a scripted session of another task (``is_demo``; its importer marks it
    ``metadata.demonstration: true``), 4-5k tokens. Kept verbatim as the user's words, it
    took the task's place as "the session's first user message" and, past the user's
    share, the real task was folded first."""
    return message.metadata is not None and message.metadata.get("demonstration") is True


def never_compressed(entry: Entry) -> bool:
    """System messages and the user's words are sent verbatim whatever compression does."""
    return entry.has_user_text or entry.message.role == "system"


def is_session_marker(entry: Entry) -> bool:
    """A system message that only opens a session of a multi-session chat (``[Session 3:
    8 May 2023]``, ``metadata.sessionStart``, as the LoCoMo importer writes): a date for
    the messages after it, not an instruction (a longer text marked so stays: it may be one)."""
    message = entry.message
    metadata = message.metadata
    content = message.content
    return (message.role == "system" and metadata is not None and metadata.get("sessionStart") is True
            and isinstance(content, str) and len(content) <= 120
            and content.startswith("[Session ") and content.endswith("]"))


def retire_markers(ctx: ActiveContext) -> None:
    """Take out of the kept messages the session markers that date nothing any more: no
    verbatim message of their session (other than system messages) is left in the prompt
    (the summaries quote its turns with their date, ``[8 May 2023] Caroline: ...``). They
    stay whole in history."""
    sent = ctx.kept + ctx.recent
    pinned = ctx.pinned_set
    drop: set[int] = set()
    for i in range(len(ctx.kept)):
        if not is_session_marker(sent[i]) or sent[i].seq in pinned:
            continue
        dated = False
        for later in sent[i + 1:]:
            if is_session_marker(later):
                break
            if later.message.role != "system":
                dated = True
                break
        if not dated:
            drop.add(sent[i].seq)
    if drop:
        ctx.kept = [e for e in ctx.kept if e.seq not in drop]
        ctx.state.kept_seqs = [e.seq for e in ctx.kept]
        # The checkpoint whose span holds a retired marker now stands for it too, so
        # checkpoint/expand returns it and history's "compressed" is true of it.
        for seq in sorted(drop):
            holder = next((c for c in ctx.checkpoints if c.kind != "folded" and c.seq_from <= seq <= c.seq_to), None)
            if holder is not None:
                holder.message_ranges = merge_ranges(holder.message_ranges, [(seq, seq)])


def _strip_tool_blocks(message: Message) -> Message | None:
    """The watermark's block filter: tool_use/tool_result blocks out, conversation in."""
    if message.role == "tool":
        return None
    content = message.content
    if isinstance(content, list):
        kept = [b for b in content if isinstance(b, TextBlock)]
        if not kept or not any(b.text for b in kept):
            return None
        return msgspec.structs.replace(message, content=kept, tool_calls=None)
    if not content:
        return None
    return msgspec.structs.replace(message, tool_calls=None) if message.tool_calls else message


@lru_cache(maxsize=64)
def _placeholder_tokens(count: Callable[[str], int], at: str) -> int:
    """All outputs pruned at one time share one placeholder text: count it once."""
    return count(PRUNED_TEXT.format(at=at))


def _user_words(message: Message) -> Message:
    """A kept user message: its text, without the tool results and images it carried."""
    content = message.content
    if isinstance(content, list) and any(not isinstance(b, TextBlock) for b in content):
        return msgspec.structs.replace(message, content=[b for b in content if isinstance(b, TextBlock)])
    return message


def _kept_view(message: Message, tokens: MessageTokens, count: Callable[[str], int]) -> tuple[Message, int]:
    """A message kept verbatim behind the boundary (the user's words, a system message), as
    sent: its text blocks, byte for byte, without the tool results and the images
    (``ImageBlock``: a description of what came with the words, not the words) it carried;
    those are compressed like an old tool output (on LoCoMo the image captions were 13% of
    the user's verbatim half at 16k). One text block goes out as plain text, so a run of
    kept user messages can be sent as one (``_joins``)."""
    view = _user_words(message)
    if view is message:
        return view, tokens.context
    content = view.content
    assert isinstance(content, list)
    original = message.content
    assert isinstance(original, list)
    if any(isinstance(b, ImageBlock) for b in original):
        text_tokens = sum(count(b.text) for b in content if isinstance(b, TextBlock))
    else:
        text_tokens = tokens.text
    if len(content) == 1 and isinstance(content[0], TextBlock):
        view = msgspec.structs.replace(view, content=content[0].text)
    return view, tokens.overhead + text_tokens


def _prune(message: Message, placeholder: str) -> Message:
    if message.role == "tool":
        return msgspec.structs.replace(message, content=placeholder)
    content = message.content
    if isinstance(content, list):
        return msgspec.structs.replace(message, content=[
            ToolResultBlock(tool_use_id=b.tool_use_id, content=placeholder, is_error=b.is_error)
            if isinstance(b, ToolResultBlock) else b for b in content])
    return message


JOIN = "\n\n"
JOIN_TOKENS = 1
"""Between the texts of kept user messages sent as one (a blank line: one token)."""


def _joins(prev: Entry | None, entry: Entry, pinned: set[int]) -> bool:
    """Whether kept ``entry`` goes out in the same user message as the kept message before
    it: both the user's words (plain text, one speaker's ``name``), neither pinned. Behind
    the boundary the replies between them are summarized, so they would be a run of user
    messages anyway (the Anthropic shape always merges a run); one message for the run
    saves each a message's framing (3-5 tokens: on LoCoMo at 16k, about 600 tokens of
    the user's half, ~15% of it)."""
    if prev is None or prev.view is None or entry.view is None:
        return False
    a, b = prev.view, entry.view
    return (a.role == "user" and b.role == "user" and prev.has_user_text and entry.has_user_text
            and prev.seq not in pinned and entry.seq not in pinned and a.name == b.name
            and isinstance(a.content, str) and isinstance(b.content, str))


@dataclass
class ActiveContext:
    """The active context of one session, and the figures the budget needs."""

    system_prompt: str | None
    state: CompressionState
    checkpoints: list[Checkpoint] = field(default_factory=list)
    kept: list[Entry] = field(default_factory=list)
    recent: list[Entry] = field(default_factory=list)
    goal_text: str | None = None
    # Maintained by refresh()/append():
    system_text: str = ""
    """The system part: system prompt and goal block."""
    section_text: str = ""
    """The checkpoints' messages' text, in order (they are sent in the conversation)."""
    system_tokens: int = 0
    """Tokens of system prompt + goal block."""
    checkpoint_tokens: int = 0
    """Tokens of the checkpoints' messages."""
    checkpoint_messages: dict[str, tuple[tuple[object, ...], Message]] = field(default_factory=dict)
    pinned_tokens: int = 0
    used: int = 0
    """Tokens of the conversation (kept + recent, as sent), pinned excluded, with what
    rendering adds to keep tool calls and results paired (``pairing``): the prompt's
    count is the rendered prompt's, in every figure."""
    call_names: dict[str, str] = field(default_factory=dict)
    pairing: Pairing = field(default_factory=Pairing)
    """Calls without a result yet, and what the renderer's repairs cost (in ``used``)."""
    opener: int = 0
    """What the Anthropic shape adds (a user turn first, ``formats.anthropic.OPENER``) when
    the conversation would open with the assistant (no checkpoint before it: a session
    that begins with a greeting, or checkpoints that left a prompt with no room for them).
    In ``used``, whatever the shape, so a pass makes room for it; the shapes that send
    no opener take it off (``service/prompt.in_shape``, ``compression.ensure_fits``)."""
    count: Callable[[str], int] | None = None
    """The session's token counter (set by :meth:`refresh`; :meth:`append` uses it)."""

    # --- derived figures ----------------------------------------------------------

    @property
    def prompt_tokens(self) -> int:
        return PROMPT_PRIMING + self.system_tokens + self.checkpoint_tokens + self.pinned_tokens + self.used

    @property
    def user_tokens(self) -> int:
        """What the kept (verbatim, before the boundary) messages cost: the user's words
        and system messages."""
        pinned = self.pinned_set
        return sum(e.view_tokens for e in self.kept if e.seq not in pinned)

    @property
    def recent_tokens(self) -> int:
        pinned = self.pinned_set
        return sum(e.view_tokens for e in self.recent if e.seq not in pinned)

    @property
    def pinned_set(self) -> set[int]:
        return set(self.state.pinned)

    def entries(self) -> list[Entry]:
        return self.kept + self.recent

    def _behind(self) -> list[Entry | Checkpoint]:
        """What is behind the boundary, in the order it is sent: the kept messages (the
        user's words, system and pinned ones) and the checkpoints among them, each after the
        kept messages of its span (``checkpoints.place``). A pass adds the words it keeps and
        its checkpoint after what earlier passes left, so the prompt up to there stays as it
        was and a provider's cache still holds it."""
        order: list[Entry | Checkpoint] = []
        checkpoints = in_order(self.checkpoints)
        i = 0
        for e in self.kept:
            while i < len(checkpoints) and place(checkpoints[i]) < (e.seq, 0):
                order.append(checkpoints[i])
                i += 1
            order.append(e)
        return order + checkpoints[i:]

    def _checkpoint_message(self, cp: Checkpoint, first: bool) -> Message:
        """The message that sends ``cp`` (the same object while ``cp`` is unchanged, so a
        renderer can reuse what it rendered)."""
        key = (cp.id, cp.level, cp.tokens, cp.compressed_at, cp.summary, first)
        cached = self.checkpoint_messages.get(cp.id)
        if cached is None or cached[0] != key:
            cached = (key, Message(role="user", content=message_text(cp, first)))
            self.checkpoint_messages[cp.id] = cached
        return cached[1]

    def conversation(self) -> list[Message]:
        """The messages to send after the system part, oldest first: what is behind the
        boundary (:meth:`_behind`: checkpoints as user messages of ctxd's, the kept
        messages; consecutive kept user messages, their replies summarized, go out as one
        user message, ``_joins``), then the recent messages."""
        pinned = self.pinned_set
        out: list[Message] = []
        prev: Entry | None = None
        first = True
        for item in self._behind():
            if isinstance(item, Checkpoint):
                out.append(self._checkpoint_message(item, first))
                first, prev = False, None
                continue
            e = item
            if e.view is None:
                continue
            if _joins(prev, e, pinned):
                out[-1] = msgspec.structs.replace(out[-1], content=f"{out[-1].content}{JOIN}{e.view.content}")
            else:
                out.append(e.view)
            prev = e
        return out + [e.view for e in self.recent if e.view is not None]

    # --- maintenance --------------------------------------------------------------

    def refresh_system(self, count: Callable[[str], int]) -> None:
        """Recount the system part (system prompt + goal block) and the checkpoints' messages."""
        head = [p for p in (self.system_prompt, self.goal_text) if p]
        head_text = "\n\n".join(head)
        self.system_tokens = count(head_text) + MESSAGE_OVERHEAD if head_text else 0
        texts = [message_text(cp, i == 0) for i, cp in enumerate(in_order(self.checkpoints))]
        self.checkpoint_tokens = sum(count(t) + MESSAGE_OVERHEAD for t in texts)
        self.system_text = head_text
        self.section_text = "\n\n".join(texts)

    def prompt_plan(self) -> PromptPlan:
        """What the renderers turn into a provider's prompt (see ``render.PromptPlan``): the
        client's system prompt, ctxd's goal block after it, the conversation (checkpoints in
        it, :meth:`conversation`)."""
        return PromptPlan(system_parts=[self.system_prompt] if self.system_prompt else [],
                          messages=self.conversation(),
                          context_parts=[self.goal_text] if self.goal_text else [])

    def prompt_pieces(self) -> list[tuple[object, int]]:
        """The prompt as a provider's prompt cache sees it, in order: ``(key, tokens)`` per
        piece, equal keys for pieces sent alike (the system part, each checkpoint, each
        message as sent). The tokens of the pieces two prompts share from the start are
        what the second can read from the cache the first filled (``service/billing.py``)."""
        out: list[tuple[object, int]] = [(("system", self.system_prompt, self.goal_text),
                                          PROMPT_PRIMING + self.system_tokens)]
        first = True
        for item in self._behind():
            if isinstance(item, Checkpoint):
                out.append((("checkpoint", item.id, item.level, item.tokens, item.compressed_at, first),
                            item.tokens + MESSAGE_OVERHEAD))
                first = False
            elif item.view is not None:
                out.append((("kept", item.seq, item.view_tokens), item.view_tokens))
        out += [(("recent", e.seq, e.view_tokens), e.view_tokens) for e in self.recent if e.view is not None]
        return out

    def view_entry(self, entry: Entry, kept: bool, count: Callable[[str], int],
                   protected: tuple[str, ...], pinned_set: set[int] | None = None) -> None:
        state = self.state
        tokens = entry.tokens
        message = entry.message
        pinned = entry.seq in (self.pinned_set if pinned_set is None else pinned_set)
        if pinned:
            entry.view, entry.view_tokens = message, entry.sent_tokens
            return
        if kept:
            if entry.kept_view is None:
                entry.kept_view = _kept_view(message, tokens, count)
            entry.view, entry.view_tokens = entry.kept_view
            if state.clips:
                self._cut_words(entry, count)
            return
        if entry.seq < state.watermark_seq and (entry.call_ids or entry.result_ids):
            view = _strip_tool_blocks(message)
            entry.view = view
            entry.view_tokens = 0 if view is None else tokens.overhead + tokens.text
            return
        if entry.result_ids and entry.seq <= state.prune_horizon():
            names = [self.call_names.get(i, "") for i in entry.result_ids]
            if not (protected and any(n in protected for n in names)):
                at = state.pruned_at(entry.seq) or ""
                placeholder = PRUNED_TEXT.format(at=at)
                entry.view = _prune(message, placeholder)
                per = _placeholder_tokens(count, at)
                if message.role == "tool":
                    entry.view_tokens = tokens.overhead + per
                else:
                    entry.view_tokens = (tokens.context - tokens.tool_result
                                         + len(entry.result_ids) * (TOOL_BLOCK_OVERHEAD + per))
                return
        if state.clips:
            if self._cut_words(entry, count, (message, tokens.context)):
                return
            limit = state.clip_for(entry.seq)
            if limit is not None:
                if entry.clipped is None or entry.clipped[0] != limit:
                    # The user's words are never cut: only the tool results beside them.
                    clip = clip_message if entry.has_user_text else clip_any
                    # (An excerpt keeps the message's thinking as it is: the limit is the rest's.)
                    view, view_tokens = clip(message, tokens, max(1, limit - entry.sent_thinking), count)
                    entry.clipped = (limit, view, view_tokens + entry.sent_thinking)
                entry.view, entry.view_tokens = entry.clipped[1], entry.clipped[2]
                return
        entry.view, entry.view_tokens = message, entry.sent_tokens

    def _cut_words(self, entry: Entry, count: Callable[[str], int],
                   whole: tuple[Message, int] | None = None) -> bool:
        """Send ``entry``'s words as an excerpt when they are cut (``ClipEvent.words``),
        from its view (``whole``: the message as pushed, for a recent one)."""
        limit = self.state.words_clip_for(entry.seq)
        if limit is None:
            return False
        kept = whole is None
        done = entry.words_cut
        if done is None or done[0] != limit or done[1] != kept:
            view, view_tokens = whole if whole is not None else (entry.view, entry.view_tokens)
            assert view is not None
            done = entry.words_cut = (limit, kept, *clip_words(view, view_tokens, limit, count))
        entry.view, entry.view_tokens = done[2], done[3]
        return True

    def refresh(self, count: Callable[[str], int], protected: tuple[str, ...] = ()) -> None:
        """Recompute every view and the totals (after any state change)."""
        self.call_names = {}
        for entry in self.kept + self.recent:
            for call_id, name in zip(entry.call_ids, entry.call_names):
                self.call_names[call_id] = name
        pinned = self.pinned_set
        used = pinned_tokens = 0
        prev: Entry | None = None
        for item in self._behind():
            if isinstance(item, Checkpoint):
                prev = None  # (a checkpoint's message ends a run of kept user messages)
                continue
            entry = item
            self.view_entry(entry, True, count, protected, pinned)
            if _joins(prev, entry, pinned):
                entry.view_tokens -= entry.tokens.overhead - JOIN_TOKENS
            prev = entry
        for entry in self.recent:
            self.view_entry(entry, False, count, protected, pinned)
        for entry in self.kept + self.recent:
            if entry.seq in pinned:
                pinned_tokens += entry.view_tokens
            else:
                used += entry.view_tokens
        self.count = count
        self.pairing = Pairing()
        for entry in self.kept + self.recent:  # (what conversation() sends: a join has no calls)
            if entry.view is not None and (entry.call_ids or entry.result_ids or entry.role == "tool"):
                self.pairing.add(entry.view, count)
        self.opener = self._opener(count)
        self.used = used + self.pairing.tokens + self.opener
        self.pinned_tokens = pinned_tokens

    def _opener(self, count: Callable[[str], int]) -> int:
        """:attr:`opener`: the first message sent after the system part is the assistant's."""
        for item in chain(self._behind(), self.recent):  # (not a copy of the history per push)
            if isinstance(item, Checkpoint):
                return 0  # (sent as a user message of ctxd's)
            if item.view is None or item.role == "system":
                continue  # (opening system messages go to the system part)
            return MESSAGE_OVERHEAD + count(OPENER) if item.role == "assistant" else 0
        return 0

    def append(self, entries: list[Entry], count: Callable[[str], int] | None = None) -> None:
        """New messages after the boundary: sent as they are (nothing applies to them yet).
        Messages already present (a context loaded while their push committed) are skipped.
        ``count``: the session's counter (default: the one of the last :meth:`refresh`)."""
        count = count or self.count
        last = self.recent[-1].seq if self.recent else self.state.boundary
        for entry in entries:
            if entry.seq <= last:
                continue
            for call_id, name in zip(entry.call_ids, entry.call_names):
                self.call_names[call_id] = name
            entry.view, entry.view_tokens = entry.message, entry.sent_tokens
            self.recent.append(entry)
            self.used += entry.view_tokens
            if count is not None:
                self.used += self.pairing.add(entry.message, count)
        if count is not None and not self.checkpoints and not self.kept:  # (only a first message opens)
            opener = self._opener(count)
            self.used += opener - self.opener
            self.opener = opener

