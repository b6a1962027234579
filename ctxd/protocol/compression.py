"""Compression: checkpoints, watermarks, pins, the ``context/compress`` request and
the notifications that tell clients what compression did."""

from __future__ import annotations

from typing import Literal

import msgspec

from ctxd.protocol.common import Seq, WindowSize
from ctxd.protocol.message import Message

Layer = Literal["prune", "watermark", "summarize", "truncate", "clip", "fold"]
Level = Literal["detailed", "moderate", "compact", "ultra"]
CheckpointKind = Literal["summary", "truncated", "folded"]
ReliabilityLevel = Literal["high", "medium", "low", "critical"]
ProgressToken = str | int


class ToolUse(msgspec.Struct, rename="camel"):
    tool: str
    count: int
    notable_uses: list[str] = []


def seq_ranges(seqs: list[int] | set[int]) -> list[tuple[int, int]]:
    """Sequence numbers as inclusive runs: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    out: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if out and seq == out[-1][1] + 1:
            out[-1] = (out[-1][0], seq)
        else:
            out.append((seq, seq))
    return out


def merge_ranges(*groups: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of runs of sequence numbers, as runs (without expanding them)."""
    out: list[tuple[int, int]] = []
    for low, high in sorted(r for group in groups for r in group):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


class Checkpoint(msgspec.Struct, rename="camel", omit_defaults=True):
    """A compressed stretch of conversation: its summary with the facts extracted from
    it (decisions, files, next steps). ``messageRanges`` are the history messages it stands for, as
    inclusive runs of sequence numbers; ``checkpoint/expand`` returns those messages whole.
    A summary covers the user's messages it read too (their words also stay in the prompt,
    verbatim); a truncation notice covers only what was left out; pinned and system
    messages, sent whole, are in none."""

    id: str
    kind: CheckpointKind
    level: Level
    seq_from: int
    seq_to: int
    message_ranges: list[tuple[int, int]]
    summary: str
    tokens: int
    original_tokens: int
    created_at: str
    compression_number: int
    summarizer: str
    compressed_at: str | None = None
    compression_count: int = 1
    merged_from: list[str] = []
    key_decisions: list[str] = []
    files_modified: list[str] = []
    tools_used: list[ToolUse] = []
    next_steps: list[str] = []
    errors: list[str] = []
    ratio: float = 1.0
    """``tokens / originalTokens``: what the checkpoint costs against what it replaced."""

    @property
    def message_seqs(self) -> list[int]:
        """Every sequence number the checkpoint stands for."""
        return [seq for low, high in self.message_ranges for seq in range(low, high + 1)]

    def covers(self, seq: int) -> bool:
        return any(low <= seq <= high for low, high in self.message_ranges)


class SessionSettings(msgspec.Struct, rename="camel", omit_defaults=True):
    """Per-session overrides of the ``[compression]`` and ``[budget]`` configuration
    (absent: use config)."""

    auto_compress: bool | None = None
    strategy: Literal["summarize", "truncate"] | None = None
    overflow_policy: Literal["fold", "error"] | None = None
    keep_recent: int | None = None
    trigger_fraction: float | None = None
    output_tokens: WindowSize | None = None
    """Tokens reserved for the reply (the client's own ``max_tokens``): the budget's
    ``reservedOutput`` in place of the model's output limit or the default share, held to a
    quarter of the window so a prompt keeps room (``ctxd proxy`` sets it from each request)."""
    output_floor: WindowSize | None = None
    """The least the reply may keep when the newest turn (the tool output the model must
    read now) cannot be sent whole otherwise: the reserve lends it what it needs, down to
    this, for that turn only (the budget's ``reservedOutput`` says so; the client must then
    ask for no more, as ``ctxd proxy`` does). Unset: the reserve is never lent."""


class CompressParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Compress now, whatever the budget says (like ``/compact``); ``focus`` steers the summary."""

    session_id: str
    focus: str | None = None
    work_done_token: ProgressToken | None = None


class CompressResult(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    compressed: bool
    layers: list[Layer]
    before_tokens: int
    after_tokens: int
    checkpoint_ids: list[str] = []
    summarizer: str | None = None
    reason: str | None = None
    duration_ms: float = 0.0


class CheckpointsResult(msgspec.Struct, rename="camel"):
    session_id: str
    checkpoints: list[Checkpoint]
    tokens: int


class CheckpointRef(msgspec.Struct, rename="camel"):
    session_id: str
    checkpoint_id: str


class HistoryMessage(msgspec.Struct, rename="camel", omit_defaults=True):
    """A message from history with where it sits."""

    seq: int
    message: Message
    tokens: int
    created_at: str


class ExpandResult(msgspec.Struct, rename="camel"):
    session_id: str
    checkpoint: Checkpoint
    messages: list[HistoryMessage]


class WatermarkParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """Set the watermark at a tool call (``toolUseId``) or a message (``seq``); tool
    blocks before it stop being sent. The watermark only moves forward."""

    session_id: str
    tool_use_id: str | None = None
    seq: Seq | None = None


class WatermarkResult(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    changed: bool
    watermark_seq: int
    tool_use_id: str | None = None
    reason: str | None = None
    blocks_removed: int = 0
    tokens_freed: int = 0


class PinParams(msgspec.Struct, rename="camel"):
    """Pin (or unpin) a message: pinned messages are sent verbatim and never compressed."""

    session_id: str
    seq: Seq
    pinned: bool = True


class PinResult(msgspec.Struct, rename="camel"):
    session_id: str
    seq: int
    pinned: bool
    pinned_tokens: int
    seqs: list[int] = []
    """Every message whose pin changed: ``seq`` and the other half of its tool calls/results."""


class Reliability(msgspec.Struct, rename="camel"):
    """The reliability score: model size x compression penalty x context confidence."""

    score: float
    level: ReliabilityLevel
    model_factor: float
    compression_penalty: float
    context_confidence: float
    compression_count: int
    model_size_billions: float | None
    recommendations: list[str] = []


# --- notifications -------------------------------------------------------------------


class CompressingNotification(msgspec.Struct, rename="camel", omit_defaults=True):
    """``context/compressing``: a compression stage started (one of six, in order)."""

    session_id: str
    stage: Literal["identification", "preparation", "summarization", "checkpoint", "update",
                   "validation", "aging"]
    percentage: int
    message: str | None = None


class CompressedNotification(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    layers: list[Layer]
    before_tokens: int
    after_tokens: int
    freed_tokens: int
    ratio: float
    checkpoint_ids: list[str]
    duration_ms: float
    compression_number: int
    summarizer: str | None = None
    trigger: Literal["auto", "request", "prompt"] = "auto"


class CompressionSkippedNotification(msgspec.Struct, rename="camel"):
    session_id: str
    reason: str
    used: int
    trigger_at: int


class CompressionFailedNotification(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    reason: str
    fallback: str | None = None


class CheckpointCreatedNotification(msgspec.Struct, rename="camel"):
    session_id: str
    checkpoint: Checkpoint


class CheckpointAgedNotification(msgspec.Struct, rename="camel"):
    session_id: str
    checkpoint_id: str
    from_level: Level
    to_level: Level
    before_tokens: int
    after_tokens: int


class CheckpointMergedNotification(msgspec.Struct, rename="camel"):
    session_id: str
    merged_ids: list[str]
    into_id: str
    tokens: int


class ThresholdNotification(msgspec.Struct, rename="camel"):
    """``context/threshold``: ``warning`` when the conversation passes the compression
    trigger, ``critical`` when the prompt passes 98% of what may be sent (both, in that
    order, when one push passes both)."""

    session_id: str
    level: Literal["warning", "critical"]
    prompt_tokens: int
    max_prompt_tokens: int
    used: int
    trigger_at: int


class OverflowNotification(msgspec.Struct, rename="camel", omit_defaults=True):
    """``context/overflow``: what may never be summarized (the user's words, pins, the
    system part) no longer fits where it must, and ctxd applied the overflow policy.
    Sent for every fold of the user's words (``reason``: ``user_share`` when they passed
    ``compression.user_share`` of the prompt, ``prompt`` when the prompt did not fit even
    after compressing everything else), naming the messages folded or excerpted and how to
    get them back; when the checkpoints were cut to the room a newest message near the
    window leaves (the folded words, the summaries made one notice, checkpoints out of the
    prompt: ``action`` says which); and when nothing can be done (``foldedMessages`` 0 and
    no ``excerptedSeqs``: ``action`` says context/prompt answers with ContextOverflow).
    The parts add up to ``promptTokens`` (with a few tokens of priming), as they were
    before the policy acted."""

    session_id: str
    policy: Literal["fold", "error"]
    prompt_tokens: int
    max_prompt_tokens: int
    system_tokens: int
    pinned_tokens: int
    checkpoint_tokens: int
    user_tokens: int
    """The user's words (and system messages) kept verbatim from the compressed part of
    the conversation: what folding can move."""
    action: str
    """What ctxd did, in words: which messages, where they went, how to get them back."""
    reason: Literal["prompt", "user_share"]
    """``user_share``: the user's words passed their share of the prompt (the prompt may
    still fit); ``prompt``: the prompt did not fit."""
    recent_tokens: int = 0
    """The newest messages, after the compression boundary."""
    folded_messages: int = 0
    """How many user messages this pass folds (0 with the ``error`` policy)."""
    folded_seqs: list[int] = []
    """The messages folded now: out of the conversation, into the folded checkpoint."""
    excerpted_seqs: list[int] = []
    """User messages sent as excerpts (head and tail, with a notice) from now on."""
    checkpoint_id: str | None = None
    """The folded checkpoint: ``checkpoint/expand`` returns its messages whole;
    ``message/pin`` sends one of them verbatim again."""


class ReliabilityNotification(msgspec.Struct, rename="camel", omit_defaults=True):
    session_id: str
    reliability: Reliability
    previous_level: ReliabilityLevel | None = None


class ProgressBegin(msgspec.Struct, tag="begin", tag_field="kind", omit_defaults=True):
    title: str
    cancellable: bool = False
    message: str | None = None
    percentage: int | None = None


class ProgressReport(msgspec.Struct, tag="report", tag_field="kind", omit_defaults=True):
    message: str | None = None
    percentage: int | None = None


class ProgressEnd(msgspec.Struct, tag="end", tag_field="kind", omit_defaults=True):
    message: str | None = None


class ProgressParams(msgspec.Struct):
    """LSP ``$/progress`` for a request that carried a ``workDoneToken``."""

    token: ProgressToken
    value: ProgressBegin | ProgressReport | ProgressEnd
