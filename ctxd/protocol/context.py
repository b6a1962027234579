"""``context/*``: the prompt to send, its budget, and the session's token statistics."""

from __future__ import annotations

from typing import Literal

import msgspec

from ctxd.protocol.compression import Reliability
from ctxd.protocol.message import Message
from ctxd.protocol.providers import AnthropicMessage, AnthropicText, OllamaMessage, OpenAIMessage

PromptFormat = Literal["openai", "anthropic", "ollama"]


class Budget(msgspec.Struct, rename="camel"):
    """The dynamic budget, in tokens.

    ``usable = contextWindow * usableFraction``; a prompt never exceeds
    ``maxPromptTokens = usable - reservedOutput``. ``reservedOutput`` is kept for the reply:
    the session's ``settings.outputTokens`` when set, else the model's output limit (at most
    ``budget.reserved_output_cap``), else a share of the window; never more than a quarter
    of the window. ``available`` is what is left for
    the conversation once the system prompt (with the goal block), pinned messages and
    checkpoints are paid for, less ``safetyMargin``; compression triggers when ``used``
    (the conversation's tokens) passes ``triggerAt = available * triggerFraction``.

    Every figure is in ctxd's own count. ``tokenRatio`` and ``tokenOverhead`` say how the
    session's provider counts: ``ratio * ctxd's count + overhead`` (what the client sends
    beside the messages: tool schemas...), learned from the usage pushed messages carry
    (1.0 and 0 until then); ``maxPromptTokens`` is the provider's room less the overhead,
    divided by the ratio, so a prompt that fits here fits as the provider counts it.
    """

    context_window: int
    usable_fraction: float
    usable: int
    reserved_output: int
    safety_margin: int
    max_prompt_tokens: int
    system_tokens: int
    pinned_tokens: int
    checkpoint_tokens: int
    available: int
    trigger_fraction: float
    trigger_at: int
    used: int
    prompt_tokens: int
    free: int
    token_ratio: float = 1.0
    token_overhead: int = 0


class PromptParams(msgspec.Struct, rename="camel"):
    """Ask for the prompt to send next, in one provider's wire shape. ``cacheControl``
    (Anthropic shape only): mark prompt-cache breakpoints on the system part and the
    last message (default on). ``push``: messages to append first, exactly as
    ``session/push`` does (atomically, idempotency keys honoured), so that a turn costs
    one round trip (``ctxd proxy`` uses it); the prompt then includes them. If the push
    fails, the request fails with its error and nothing is stored; if the push succeeds
    and the prompt then fails (ContextOverflow), the messages stay stored."""

    session_id: str
    format: PromptFormat = "openai"
    cache_control: bool = True
    push: list[Message] | None = None
    supersede: list[str] | None = None
    """Idempotency keys of stored messages the client no longer sends because it sends a
    newer copy (its working context: the files in its chat, a repository map, a trailing
    reminder): taken out of the active context before ``push`` (history keeps them, with
    status ``superseded``), so the prompt shows and the budget counts only the newest
    copy. Keys of no stored message are ignored."""
    current: list[str] | None = None
    """Idempotency keys of stored messages (``push``'s included) that are the client's
    current working context (what it shows the model now besides the conversation: the
    files in its chat): pinned after the push, so they are sent verbatim whatever
    compression does, in the order named while the pins take at most half the prompt;
    those a previous ``current`` named and this one does not are unpinned. Absent: no
    change."""
    preview: bool = False
    """A look at the prompt, not one that will be sent (an editor's prompt preview): it is
    not billed (no ``bill``, and the next push's usage accrues no request for it), not
    counted as handed out (``context/stats``' ``promptCache``), and its count is not paired
    with the next reply's usage (calibration pairs a report with the prompt that was
    sent). Otherwise the result is the same prompt, budget and ``appendRoom`` (a session
    that must be compressed to fit is compressed, as for any prompt). It changes nothing
    else, so it does not combine with ``push``, ``supersede`` or ``current``
    (InvalidParams naming the field)."""


class ContextStatsParams(msgspec.Struct, rename="camel"):
    """``format``: the figures of a prompt in that provider's shape, as ``context/prompt``
    with that format counts it (``budget.promptTokens``, ``budget.free`` and
    ``contextTokens``): the OpenAI and Ollama shapes send no thinking, Anthropic's sends
    the signed blocks and may need an opening user turn. Absent: the count of the active
    context itself, which ``session/get`` also gives and which includes signed thinking
    (so the prompt fits any shape)."""

    session_id: str
    format: PromptFormat | None = None


class InputBill(msgspec.Struct, rename="camel"):
    """Input tokens of one request (or a session's requests) as the provider bills them,
    in its count (``budget.tokenRatio`` and ``tokenOverhead`` applied to ctxd's):
    ``uncached`` at the input price, ``cacheWrite`` written to the prompt cache (Anthropic
    bills them 1.25x), ``cacheRead`` read from it (about 0.1x). ``billed`` is the sum
    weighed by the provider's rules ([billing] in docs/configuration.md), in uncached input
    tokens; ``usd`` the same in US dollars when the model's price is known."""

    uncached: int = 0
    cache_write: int = 0
    cache_read: int = 0
    billed: float = 0.0
    usd: float | None = None


class RequestBill(msgspec.Struct, rename="camel", kw_only=True):
    """One request's input, through ctxd and as the client's own request (its whole history,
    whose previous request was its cached prefix) would have been billed, both estimated
    by one rule (the prefix a prompt shares with the previous one is read from the cache
    while it lives) so that they compare. ``measured``: the provider reported ctxd's
    request (``reported``: its usage as billed). On a prompt, the session's totals so
    far, this request included (``sessionBilled``, ``sessionDirect``, ``sessionRequests``),
    and the ``sessionMeasured`` requests the provider reported: ``sessionReported`` as
    it billed them, ``sessionReportedEstimate`` as ctxd estimated them."""

    ctxd: InputBill
    direct: InputBill
    measured: bool = False
    reported: InputBill | None = None
    session_billed: float = 0.0
    session_direct: float = 0.0
    session_requests: int = 0
    session_measured: int = 0
    session_reported: float = 0.0
    session_reported_estimate: float = 0.0


class SessionBill(msgspec.Struct, rename="camel", kw_only=True):
    """A session's requests as billed (``context/stats``): through ctxd and as sending the
    whole history directly would have been, under ``provider``'s rules (``cache``: how it
    caches: ``breakpoints``, ``automatic`` or ``none``), both sides estimated by one rule
    (a provider reports only ctxd's side: taking it for one side only would weigh a cache
    that missed, or a provider's own rules, against ctxd). ``ratio`` is ctxd's ``billed``
    over direct's. ``reported``: the ``measured`` requests as the provider's usage billed
    them, and ``reportedEstimate`` ctxd's estimate of the same requests, billed: beside
    each other they say how far the provider cached what ctxd expected. ``passCost``: what
    the compression passes cost by rewriting what the cache held (tokens billed again as
    new input, in uncached input tokens), over ``passes`` passes.
    ``budgetNote``: set when the session's window is below its model's, saying what the
    smaller budget costs."""

    provider: str
    cache: str
    requests: int = 0
    measured: int = 0
    """Requests whose ctxd figures came from the provider's usage."""
    ctxd: InputBill = msgspec.field(default_factory=InputBill)
    direct: InputBill = msgspec.field(default_factory=InputBill)
    ratio: float | None = None
    reported: InputBill | None = None
    reported_estimate: float | None = None
    passes: int = 0
    pass_cost: float = 0.0
    last_request: RequestBill | None = None
    budget_note: str | None = None


class _PromptBase(msgspec.Struct, rename="camel", tag_field="format", kw_only=True):
    """``tokens`` is the whole prompt as ctxd counts it (never more than
    ``budget.maxPromptTokens``); ``lastSeq`` is the newest message it includes."""

    session_id: str
    tokens: int
    tokens_estimated: bool
    last_seq: int
    message_count: int
    budget: Budget
    reliability: Reliability
    compression_count: int
    checkpoint_count: int
    bill: RequestBill | None = None
    """What this request is expected to cost, through ctxd and direct (see ``RequestBill``);
    null for a ``preview`` (no request is sent)."""
    append_room: int = 0
    """Tokens (ctxd's count) the conversation can grow by in pushes while the next prompt is
    this one with the pushed messages appended: no compression pass can start before (the
    trigger, an early pass where the provider caches) and the prompt still fits. 0 while a
    pass is running or due. Messages of ``b`` UTF-8 bytes count at most ``b`` tokens (and
    their framing less than its JSON), so a client can tell from its messages' sizes,
    before it asks, that its next prompt will be what it holds (``ctxd proxy`` then sends
    the request upstream while ctxd stores it)."""


class OpenAIPrompt(_PromptBase, tag="openai"):
    """``messages`` goes straight into ``/v1/chat/completions``; the system prompt is its first message."""

    messages: list[OpenAIMessage]


class AnthropicPrompt(_PromptBase, tag="anthropic"):
    """``system`` and ``messages`` go straight into ``/v1/messages``. With
    ``cacheControl`` (the default) ``system`` is a list of text blocks (the client's own
    system text, then ctxd's goal and checkpoints; one block when there is one part), each
    with a ``cache_control`` breakpoint, as the last message's last block has; without,
    ``system`` is a string."""

    system: str | list[AnthropicText] | None
    messages: list[AnthropicMessage]


class OllamaPrompt(_PromptBase, tag="ollama"):
    """``messages`` goes straight into Ollama's ``/api/chat``."""

    messages: list[OllamaMessage]


PromptResult = OpenAIPrompt | AnthropicPrompt | OllamaPrompt


class RoleStats(msgspec.Struct, rename="camel"):
    messages: int = 0
    tokens: int = 0


class KindStats(msgspec.Struct, rename="camel"):
    """Tokens by content kind across the whole history (blocks: how many of that kind)."""

    blocks: int = 0
    tokens: int = 0


class UsageDrift(msgspec.Struct, rename="camel"):
    """Counted tokens against what providers reported, over messages that carried ``usage``.

    ``outputRatio`` = reported output tokens / ctxd's count of those assistant messages;
    ``inputRatio`` = reported input tokens / ctxd's count of the context before them.
    A ratio far from 1.0 means the session's encoding does not match the model's tokenizer.
    """

    messages_with_usage: int = 0
    reported_output_tokens: int = 0
    counted_output_tokens: int = 0
    output_ratio: float | None = None
    reported_input_tokens: int = 0
    counted_input_tokens: int = 0
    input_ratio: float | None = None
    applied_ratio: float = 1.0
    """The ratio the budget applies (``budget.tokenRatio``): fitted over the newest reports,
    each paired with ctxd's count of what was sent (the prompt ctxd handed out, or the
    whole history for a client that sends everything, whichever the report matches),
    held between 0.8 and 2.0; 1.0 until a call of at least 256 tokens reported usage."""
    applied_overhead: int = 0
    """What the provider counts beside the pushed messages (``budget.tokenOverhead``)."""
    samples: list[tuple[int, int]] = []
    """The (ctxd's count, provider's count) pairs the ratio and overhead are fitted from,
    oldest first: what ``session/create`` takes as ``usageSamples`` to start another
    session of the same client and model from them (``ctxd proxy`` does, for a fork or a
    new conversation)."""


class PromptCacheStats(msgspec.Struct, rename="camel"):
    """How cacheable the prompts handed out were (``context/prompt`` calls served by this
    daemon since it loaded the session): a prompt that starts with the previous one of
    the same format (same system part, the previous messages unchanged, new ones only
    appended) lets the provider reuse its prompt cache; compressions break it."""

    prompts: int = 0
    compared: int = 0
    """Prompts after the first of their format (each compared with the one before)."""
    prefix_kept: int = 0
    """Of those, the ones that started with the previous prompt of their format."""
    prefix_kept_share: float | None = None
    """``prefixKept`` / ``compared``; null before there is any."""


class ContextStatsResult(msgspec.Struct, rename="camel"):
    session_id: str
    message_count: int
    token_count: int
    context_tokens: int
    encoding: str
    tokens_estimated: bool
    by_role: dict[str, RoleStats]
    by_kind: dict[str, KindStats]
    usage_drift: UsageDrift
    budget: Budget
    reliability: Reliability
    compression_count: int
    checkpoint_count: int
    checkpoint_tokens: int
    watermark_seq: int
    pruned_through_seq: int
    pinned: list[int]
    prompt_cache: PromptCacheStats = msgspec.field(default_factory=PromptCacheStats)
    bill: SessionBill | None = None
