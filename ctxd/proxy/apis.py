"""What differs between the APIs in the proxy: where the system prompt is, how the
client's messages are aligned with ctxd's prompt, how a reply (whole or streamed) is read
back, and how an error looks. The shapes themselves (reading a message, usage, the
Anthropic system part and cache breakpoints, Responses items) are ``ctxd.formats``'s."""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass, field
from typing import Any

from ctxd.formats import anthropic, chain_part, ollama, openai, projection, responses, usage
from ctxd.formats.common import Api, canonical_json, parts_text
from ctxd.proxy.identity import Ident, compose, ident_of

ALIGN_RUN = 32


# --- requests ----------------------------------------------------------------------------


@dataclass
class Split:
    """A request's system part (as text, and as the client sent it) and its conversation."""

    system_text: str
    system_raw: Any
    conversation: list[dict[str, Any]]
    system_role: str = "system"


def messages_of(api: Api, body: dict[str, Any]) -> list[Any] | None:
    """The request's conversation as the client sent it, or None when the request is not
    one the proxy can put through a session (it is passed through unchanged). A Responses
    API request that continues a stored response (``previous_response_id``) or a
    server-side ``conversation`` sends only the newest items: the rest is on OpenAI's
    side, out of ctxd's reach."""
    if api != "responses":
        messages = body.get("messages")
        return messages if isinstance(messages, list) else None
    if body.get("previous_response_id") or body.get("conversation"):
        return None
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return items if isinstance(items, list) else None


def split(api: Api, body: dict[str, Any]) -> Split:
    if api == "responses":
        return _split_responses(body)
    given = body.get("messages") or []
    # (Which are not objects is asked of all at once, in C: an agent resends its whole history.)
    messages = list(given) if set(map(type, given)) <= {dict} else [m for m in given if isinstance(m, dict)]
    if api == "anthropic":
        system = body.get("system")
        return Split(anthropic.system_text(system), system, messages)
    leading: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") in ("system", "developer"):
            leading.append(message)
        else:
            break
    role = leading[0].get("role", "system") if leading else "system"
    return Split(openai.system_text(leading), leading, messages[len(leading):], role)


def _split_responses(body: dict[str, Any]) -> Split:
    """A Responses API request: its system part is ``instructions`` followed by the input's
    leading ``system``/``developer`` items (``system_raw`` holds those items)."""
    items = [m for m in messages_of("responses", body) or [] if isinstance(m, dict)]
    leading = responses.leading_system(items)
    return Split(responses.system_text(body.get("instructions"), leading), leading, items[len(leading):])


MAX_REPLY_LIMIT = 2**31 - 1  # what ``settings.outputTokens`` accepts


def reply_limit(api: Api, body: dict[str, Any]) -> int | None:
    """The most tokens the request lets the reply have, which ctxd's budget reserves:
    OpenAI Chat ``max_completion_tokens`` (else the older ``max_tokens``), Responses
    ``max_output_tokens``, Anthropic ``max_tokens``, Ollama ``options.num_predict`` when
    positive (-1 and -2 mean "no limit"). None when absent or not a positive integer."""
    if api == "ollama":
        options = body.get("options")
        value = options.get("num_predict") if isinstance(options, dict) else None
    elif api == "openai":
        value = body.get("max_completion_tokens")
        if value is None:
            value = body.get("max_tokens")
    else:
        value = body.get("max_output_tokens" if api == "responses" else "max_tokens")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return min(value, MAX_REPLY_LIMIT)


def reply_room(prompt: dict[str, Any], body: dict[str, Any]) -> int | None:
    """What the window leaves the reply beside ctxd's prompt, as the provider counts it:
    the budget's usable part less the prompt at the session's learned ratio and overhead,
    less the budget's safety margin (that count is an estimate), and never less than the
    reserve the prompt was built beside. Until the overhead is learned (a session's first
    replies), the request's tool definitions stand in for it at a third of their bytes (a
    token is 3-4 bytes of JSON: rather too many than too few). None without a budget."""
    budget = prompt.get("budget")
    tokens = prompt.get("tokens")
    if not isinstance(budget, dict) or not isinstance(tokens, int) or not isinstance(budget.get("usable"), int):
        return None
    ratio = budget.get("tokenRatio") or 1.0
    overhead = budget.get("tokenOverhead") or 0
    if not overhead and body.get("tools"):
        overhead = len(json.dumps(body["tools"])) // 3
    room = budget["usable"] - math.ceil(tokens * ratio + overhead) - (budget.get("safetyMargin") or 0)
    return max(room, budget.get("reservedOutput") or 0)


def limit_reply(api: Api, body: dict[str, Any], limit: int) -> None:
    """Lower the request's reply limit to ``limit`` in the field the client used
    (:func:`reply_limit`); Anthropic's thinking budget, which must stay below it, with it
    (to 1,024 at least, the API's minimum)."""
    limit = max(1, limit)
    if api == "ollama":
        body["options"] = dict(body["options"], num_predict=limit)
    elif api == "openai":
        body["max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"] = limit
    else:
        body["max_output_tokens" if api == "responses" else "max_tokens"] = limit
    thinking = body.get("thinking") if api == "anthropic" else None
    if isinstance(thinking, dict) and isinstance(thinking.get("budget_tokens"), int) \
            and thinking["budget_tokens"] >= limit:
        body["thinking"] = dict(thinking, budget_tokens=max(1024, limit - 1))


def is_streaming(api: Api, body: dict[str, Any]) -> bool:
    if api == "ollama":
        return body.get("stream") is not False  # Ollama streams unless told not to
    return body.get("stream") is True


@dataclass
class Alignment:
    """One request's alignment: what it compared, where its walk from the end stopped
    (``rendered[:stop[0]]`` is ctxd's, ``client[stop[1]:]`` the client's own) and, for
    Anthropic, the cache breakpoints in the client's messages (``breakpoints[i]``: in
    ``client[:i]``)."""

    rendered: list[Any]
    client: list[Any]
    stop: tuple[int, int]
    breakpoints: list[int] | None = None


@dataclass
class Order:
    """What the alignment knows of the client's messages besides their bytes: their
    identities (identity.py), the shape of the copy stored for each (``shapes[j]``: what
    ctxd renders when it leaves the message as it is), and whether the request was a
    plain extension of its session (else ctxd's prompt goes in the client's order,
    :func:`identity.compose`)."""

    api: Api
    idents: list[Ident | None]  # per client message (None: one with nothing ctxd keeps)
    shapes: list[str | None]
    extends: bool = True
    anchors: list[bool] | None = None

    def identify(self, message: dict[str, Any]) -> Ident | None:
        part = chain_part(self.api, message)
        return ident_of(self.api, message, part) if part is not None else None

    def same(self, rendered: dict[str, Any], j: int) -> bool:
        """Whether ctxd's ``rendered`` message is the client's ``j``-th as stored: the same
        identity, rendered as the stored copy (a message the client sends back with a
        field the model did not write, ``"replace_all": false``, is still the client's)."""
        mine = self.idents[j]
        if mine is None:
            return False
        ident = self.identify(rendered)
        return ident is not None and ident.key == mine.key and ident.shape == self.shapes[j]


@dataclass
class AlignMemo:
    """A request's link to the previous request of its conversation (``Sessions.read``):
    that request's alignment, and how many of this request's messages it starts with
    (equal as decoded JSON). An agent resends its whole conversation each turn and ctxd's
    prompt grows at its end between compressions, so the walk compares only the messages
    new on either side, then goes on where the previous one stopped. ``current``: this
    request's alignment, once made."""

    previous: Alignment | None = None
    same: int = 0
    current: Alignment | None = None


def _walk(api: Api, rendered: list[Any], client: list[Any], memo: AlignMemo | None,
          order: Order | None = None) -> tuple[int, int]:
    """Where the walk from the end stops: ``rendered[r:]`` and ``client[c:]`` are aligned."""
    r, c = len(rendered), len(client)
    jump = -1
    previous = memo.previous if memo is not None else None
    if previous is not None and memo is not None:
        # From the pair where this request's messages stop being the previous one's (on
        # the previous walk's diagonal, above where it stopped, ctxd's prompt unchanged
        # before it) the walk would compare what the previous one compared.
        pr, pc = previous.rendered, previous.client
        d = len(pc) - len(pr)
        if c - r == d:
            r0 = min(memo.same, len(pc), c) - d
            if previous.stop[0] <= r0 <= min(len(pr), r) and rendered[:r0] == pr[:r0]:
                jump = r0
    while r and c:
        if r == jump:
            return previous.stop  # type: ignore[union-attr]
        # A whole run of messages equal as JSON is compared at once (in C: a long
        # conversation with nothing compressed is all one run).
        if r - ALIGN_RUN >= max(jump, 0) and c >= ALIGN_RUN and \
                rendered[r - ALIGN_RUN:r] == client[c - ALIGN_RUN:c]:
            r, c = r - ALIGN_RUN, c - ALIGN_RUN
            continue
        a, b = rendered[r - 1], client[c - 1]
        # Equal as JSON is equal as ctxd models them: the projection only when they differ,
        # then the identity (the same ids, rendered as stored).
        if a != b and projection(api, a) != projection(api, b) and \
                (order is None or c - 1 >= len(order.idents) or not order.same(a, c - 1)):
            break
        r, c = r - 1, c - 1
    return r, c


def _align(api: Api, rendered: list[dict[str, Any]], client: list[dict[str, Any]],
           memo: AlignMemo | None = None, order: Order | None = None) -> list[Any]:
    """ctxd's rendered conversation, with each message of its tail that ctxd renders as the
    client sent it replaced by the client's own message (byte for byte: unmodelled blocks,
    thinking signatures, ``cache_control`` included). Stops at the first difference.
    ``memo``: the previous request's alignment is built on (and this one's kept in it)."""
    if api == "responses":
        return _align_items(rendered, client, order)
    if order is not None and not order.extends and len(order.idents) == len(client):
        if memo is not None:
            memo.current = None  # (nothing for the next request to build on)
        return compose(api, rendered, client, order.idents, order.shapes, order.identify, order.anchors)
    r, c = _walk(api, rendered, client, memo, order)
    if memo is not None:
        memo.current = Alignment(rendered, client, (r, c))
    head = rendered[:r]
    if order is not None and r and c and len(order.idents) == len(client):
        head = own_bytes(head, client[:c], order)
    out = head + client[c:]
    if api == "anthropic" and r:
        _client_step(out, r, client, c)
    return out


def _is_results(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return message.get("role") == "user" and isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def _client_step(out: list[Any], r: int, client: list[Any], c: int) -> None:
    """Anthropic: the assistant message whose tool calls the client's last message
    answers (the step of the turn in progress Anthropic checks: with extended thinking it
    must open with its thinking blocks as the model wrote them) goes out as the client
    sent it, also when ctxd changed what follows it (an excerpt of an output too big for
    the prompt stops the walk there): ctxd's own rendering has its signed thinking, not
    ``redacted_thinking`` nor other blocks ctxd does not model. ``out[:r]`` is ctxd's
    rendering, aligned with ``client[:c]`` from the end."""
    j = len(client) - 2
    if j < 0 or j >= c or not _is_results(client[-1]) or client[j].get("role") != "assistant":
        return
    i = r - (c - j)  # (ctxd's messages after the stop are the client's, one for one)
    if 0 <= i < r and out[i].get("role") == "assistant" and (
            out[i] == client[j] or projection("anthropic", out[i]) == projection("anthropic", client[j])):
        out[i] = client[j]


def own_bytes(rendered: list[Any], client: list[Any], order: Order, *, skipped: bool = False) -> list[Any]:
    """Before where the walk from the end stopped (what ctxd compressed, and the client's
    fixed prefix it kept verbatim: Codex's leading user items, aider's repository map),
    each message ctxd renders as stored is the client's own bytes all the same, in ctxd's
    order (matched by identity, from the end: ctxd keeps the newest of equal ones).
    ``skipped``: the client's items ctxd keeps none of (Responses reasoning) just before
    such a message go with it."""
    positions: dict[str, list[int]] = {}
    for j, ident in enumerate(order.idents[:len(client)]):
        if ident is not None:
            positions.setdefault(ident.key, []).append(j)
    out: list[Any] = []
    for message in reversed(rendered):
        ident = order.identify(message)
        queue = positions.get(ident.key) if ident is not None else None
        if not queue or ident is None or ident.shape != order.shapes[queue[-1]]:
            out.append(message)
            continue
        j = queue.pop()
        out.append(client[j])
        while skipped and j > 0 and order.idents[j - 1] is None and chain_part(order.api, client[j - 1]) is None:
            j -= 1
            out.append(client[j])
    return out[::-1]


def _client_breakpoints(client: list[Any], memo: AlignMemo) -> list[int]:
    """``out[i]``: the cache breakpoints in ``client[:i]``, counted again only for the
    messages the previous request did not start with."""
    previous = memo.previous.breakpoints if memo.previous is not None else None
    keep = min(memo.same, len(previous) - 1) if previous else 0
    sums = previous[:keep + 1] if previous else [0]
    for message in client[keep:]:
        sums.append(sums[-1] + anthropic.count_breakpoints(message))
    return sums


def _align_items(rendered: list[dict[str, Any]], client: list[dict[str, Any]],
                 order: Order | None = None) -> list[Any]:
    """``_align`` for Responses API items: items ctxd leaves out (reasoning) that sit
    before an item taken from the client are taken with it, in place, as they belong to it."""
    tail: list[Any] = []
    r, c = len(rendered) - 1, len(client) - 1
    while r >= 0 and c >= 0:
        if chain_part("responses", client[c]) is None:
            break  # a skipped item not directly before an aligned one
        if rendered[r] != client[c] and projection("responses", rendered[r]) != projection("responses", client[c]):
            break
        tail.append(client[c])
        c -= 1
        while c >= 0 and chain_part("responses", client[c]) is None:
            tail.append(client[c])
            c -= 1
        r -= 1
    head = list(rendered[:r + 1])
    if order is not None and head and c >= 0 and len(order.idents) == len(client):
        head = own_bytes(head, client[:c + 1], order, skipped=True)
    return head + tail[::-1]


def upstream_body(api: Api, body: dict[str, Any], parts: Split, prompt: dict[str, Any] | None,
                  memo: AlignMemo | None = None, order: Order | None = None) -> dict[str, Any]:
    """The request sent upstream: the client's body with its system part and messages
    replaced by ctxd's prompt (``prompt`` None: the client's body as it is). ``memo``: see
    :class:`AlignMemo`."""
    if prompt is None:
        return body
    out = dict(body)
    if api == "anthropic":
        system = prompt.get("system")
        system_text = system if isinstance(system, str) else \
            "\n\n".join(b.get("text", "") for b in system or [] if isinstance(b, dict))
        messages = _align(api, list(prompt["messages"]), parts.conversation, memo, order)
        in_messages = None
        if memo is not None and memo.current is not None:
            memo.current.breakpoints = sums = _client_breakpoints(parts.conversation, memo)
            r, c = memo.current.stop
            in_messages = anthropic.count_breakpoints(messages[:r]) + sums[-1] - sums[c]
        new_system, added = anthropic.merge_system(system_text, parts.system_text, parts.system_raw)
        if new_system is None:
            out.pop("system", None)
        else:
            out["system"] = new_system
        out["messages"] = anthropic.place_breakpoints(out, messages, ctxd_system_breakpoint=added,
                                                      in_messages=in_messages)
        return out
    if api == "responses":
        return _responses_body(out, parts, prompt, order)
    rendered = list(prompt["messages"])
    system_msgs: list[Any] = []
    if rendered and rendered[0].get("role") == "system":
        system_msgs = [rendered.pop(0)]
    conversation = _align(api, rendered, parts.conversation, memo, order)
    system_text = system_msgs[0].get("content") if system_msgs else ""
    addition = _addition(system_text if isinstance(system_text, str) else "", parts.system_text)
    if system_text == parts.system_text:
        system_msgs = list(parts.system_raw)
    elif addition is not None:
        # ctxd's goal and checkpoints after the client's own system messages, which stay
        # as sent: the prefix a provider caches is the client's.
        system_msgs = list(parts.system_raw) + [{"role": parts.system_role, "content": addition}]
    elif system_msgs and parts.system_role != "system":
        system_msgs = [dict(system_msgs[0], role=parts.system_role)]
    out["messages"] = system_msgs + conversation
    return out


def unchanged(api: Api, body: dict[str, Any], out: dict[str, Any]) -> bool:
    """Whether the upstream body is the client's, value for value: the same fields, each
    the client's own object (its conversation: the client's own message objects, in its
    order, as the alignment hands them back while ctxd's prompt is the client's). Then
    the client's bytes go upstream as they came: encoding the body again would cost time
    proportional to the conversation to send the same JSON value. Only identity and
    small fields are compared: a conversation ctxd changed in any way is not this."""
    if out is body:
        return True
    if out.keys() != body.keys():
        return False
    conversation = "input" if api == "responses" else "messages"
    for key, value in out.items():
        given = body[key]
        if value is given:
            continue
        if key == conversation:
            if not (isinstance(value, list) and isinstance(given, list) and len(value) == len(given)
                    and all(map(operator.is_, value, given))):
                return False
        elif key == "system" and value == given:  # (Anthropic's system part, rebuilt: small)
            continue
        else:
            return False
    return True


def _addition(system_text: str, client_text: str) -> str | None:
    """What ctxd's system text adds to the client's (a goal, checkpoints), when it is the
    client's followed by more; None otherwise."""
    if client_text and system_text.startswith(client_text + "\n\n") and len(system_text) > len(client_text) + 2:
        return system_text[len(client_text) + 2:]
    return None


def _responses_body(out: dict[str, Any], parts: Split, prompt: dict[str, Any],
                    order: Order | None = None) -> dict[str, Any]:
    """ctxd's prompt as a Responses API request: its system text as ``instructions`` (the
    client's own ``instructions`` and leading system items when ctxd's system text is the
    client's), the conversation as input items, aligned with the client's."""
    rendered = list(prompt["messages"])
    system_text = ""
    if rendered and rendered[0].get("role") == "system":
        system_text = parts_text(rendered.pop(0).get("content"))
    items = responses.items_of_prompt(rendered)
    conversation = responses.keep_ids(_align("responses", items, parts.conversation, order=order),
                                      parts.conversation)
    addition = _addition(system_text, parts.system_text)
    if system_text == parts.system_text:
        leading = list(parts.system_raw)
    elif addition is not None:
        # The client's ``instructions`` and leading items as sent, then ctxd's goal and
        # checkpoints as one developer item: never folded into the client's.
        leading = list(parts.system_raw) + [{"role": "developer", "content": addition}]
    else:
        leading = []
        if system_text:
            out["instructions"] = system_text
        else:
            out.pop("instructions", None)
    out["input"] = leading + conversation
    return out


# --- replies -----------------------------------------------------------------------------


@dataclass
class Reply:
    """A reply as the client will send it back next time, its usage, and whether it is whole."""

    message: dict[str, Any] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    complete: bool = False
    error: str | None = None
    more: list[dict[str, Any]] = field(default_factory=list)  # Responses API: the output items after the first

    @property
    def messages(self) -> list[dict[str, Any]]:
        return ([self.message] if self.message is not None else []) + self.more


def reply_of(api: Api, data: Any) -> Reply:
    """The reply of a whole (non-streamed) answer."""
    if not isinstance(data, dict):
        return Reply(error="the answer is not a JSON object")
    if api == "responses":
        output = data.get("output")
        if not isinstance(output, list):
            return Reply(error="the answer has no output")
        if data.get("status") == "failed" or data.get("error"):
            return Reply(error=canonical_json(data.get("error")))
        items = [item for item in output if isinstance(item, dict)]
        if not items:
            return Reply(error="the answer's output is empty")
        return Reply(items[0], usage(api, data.get("usage")), True, more=items[1:])
    if api == "openai":
        choices = data.get("choices") or []
        message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        if not isinstance(message, dict):
            return Reply(error="the answer has no choices[0].message")
        return Reply(openai.reply_message(message), usage(api, data.get("usage")), True)
    if api == "anthropic":
        content = data.get("content")
        if not isinstance(content, list):
            return Reply(error="the answer has no content")
        return Reply({"role": "assistant", "content": content}, usage(api, data.get("usage")), True)
    message = data.get("message")
    if not isinstance(message, dict):
        return Reply(error="the answer has no message")
    return Reply(ollama.reply_message(message), usage(api, data), bool(data.get("done", True)))


class SSEDecoder:
    """Server-sent events from a byte stream, as they complete: (event, data) pairs."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        self._buffer += chunk
        events: list[tuple[str | None, str]] = []
        while True:
            best: tuple[int, int] | None = None
            for sep in (b"\r\n\r\n", b"\n\n", b"\r\r"):
                at = self._buffer.find(sep)
                if at >= 0 and (best is None or at < best[0]):
                    best = (at, len(sep))
            if best is None:
                return events
            at, size = best
            raw, self._buffer = self._buffer[:at], self._buffer[at + size:]
            name, data = None, []
            for line in raw.decode("utf-8", "replace").splitlines():
                if line.startswith(":"):
                    continue
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "event":
                    name = value
                elif key == "data":
                    data.append(value)
            if data or name:
                events.append((name, "\n".join(data)))


class Assembler:
    """Builds the reply from a streamed answer, event by event, as the bytes pass through."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.reply = Reply()
        self._sse = SSEDecoder()
        self._lines = b""
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._ollama_calls: list[Any] = []
        self._blocks: dict[int, dict[str, Any]] = {}
        self._partial: dict[int, list[str]] = {}

    def feed(self, chunk: bytes) -> None:
        try:
            if self.api == "ollama":
                self._lines += chunk
                *lines, self._lines = self._lines.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._ollama(json.loads(line))
                return
            for event, data in self._sse.feed(chunk):
                if self.api == "openai":
                    self._openai(data)
                elif self.api == "responses":
                    self._responses(data)
                else:
                    self._anthropic(event, data)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            self.reply.error = f"unreadable stream event: {exc}"

    # OpenAI: data: {chunk} ... data: [DONE]
    def _openai(self, data: str) -> None:
        if data.strip() == "[DONE]":
            self.reply.complete = True
            return
        event = json.loads(data)
        if "error" in event:
            self.reply.error = canonical_json(event["error"])
            return
        if event.get("usage"):
            self.reply.usage = usage("openai", event["usage"])
        for choice in event.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self._text.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                slot = self._calls.setdefault(call.get("index", 0),
                                              {"id": None, "name": "", "arguments": [], "custom": False})
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type") == "custom" or call.get("custom"):  # a freeform call: its input in pieces
                    slot["custom"] = True
                function = call.get("custom") or call.get("function") or {}
                if function.get("name"):
                    slot["name"] += function["name"]
                piece = function.get("input") if slot["custom"] else function.get("arguments")
                if piece:
                    slot["arguments"].append(piece)
            if choice.get("finish_reason"):
                self._finish_openai()

    def _finish_openai(self) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text) or None}
        if self._calls:
            message["tool_calls"] = [
                {"id": slot["id"], "type": "custom",
                 "custom": {"name": slot["name"], "input": "".join(slot["arguments"])}}
                if slot["custom"] else
                {"id": slot["id"], "type": "function",
                 "function": {"name": slot["name"], "arguments": "".join(slot["arguments"])}}
                for _, slot in sorted(self._calls.items())]
        self.reply.message = message

    # Anthropic: message_start, content_block_*, message_delta, message_stop
    def _anthropic(self, event: str | None, data: str) -> None:
        payload = json.loads(data)
        kind = payload.get("type", event)
        if kind == "message_start":
            self.reply.usage = usage("anthropic", (payload.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            self._blocks[payload["index"]] = dict(payload.get("content_block") or {})
        elif kind == "content_block_delta":
            block = self._blocks.setdefault(payload["index"], {"type": "text", "text": ""})
            delta = payload.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif dtype == "input_json_delta":
                self._partial.setdefault(payload["index"], []).append(delta.get("partial_json", ""))
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif dtype == "signature_delta":
                block["signature"] = delta.get("signature")
            elif dtype == "citations_delta":
                block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "content_block_stop":
            index = payload["index"]
            if index in self._partial:
                text = "".join(self._partial.pop(index))
                self._blocks[index]["input"] = json.loads(text) if text.strip() else {}
        elif kind == "message_delta":
            self.reply.usage.update(usage("anthropic", payload.get("usage")))
        elif kind == "message_stop":
            self.reply.message = {"role": "assistant", "content": [b for _, b in sorted(self._blocks.items())]}
            self.reply.complete = True
        elif kind == "error":
            self.reply.error = canonical_json(payload.get("error"))

    # Responses API: typed events; response.completed (or .incomplete) carries the whole response
    def _responses(self, data: str) -> None:
        event = json.loads(data)
        kind = event.get("type")
        if kind in ("response.completed", "response.incomplete"):
            reply = reply_of("responses", event.get("response"))
            if reply.error:
                self.reply.error = reply.error
                return
            self.reply = reply
        elif kind == "response.failed":
            self.reply.error = canonical_json((event.get("response") or {}).get("error"))
        elif kind == "error" or "error" in event and kind is None:
            self.reply.error = canonical_json(event.get("error") or event.get("message"))

    # Ollama: one JSON object per line, the last with done: true
    def _ollama(self, event: dict[str, Any]) -> None:
        if "error" in event:
            self.reply.error = str(event["error"])
            return
        message = event.get("message") or {}
        if isinstance(message.get("content"), str):
            self._text.append(message["content"])
        if isinstance(message.get("thinking"), str):
            self._thinking.append(message["thinking"])
        self._ollama_calls.extend(message.get("tool_calls") or [])
        if event.get("done"):
            whole = {"content": "".join(self._text), "thinking": "".join(self._thinking),
                     "tool_calls": self._ollama_calls}
            self.reply.message = ollama.reply_message(whole)
            self.reply.usage = usage("ollama", event)
            self.reply.complete = True

    def finish(self) -> Reply:
        if self.api == "openai" and self.reply.complete and self.reply.message is None:
            self._finish_openai()
        if self.api == "openai" and self.reply.message is not None and not self.reply.complete:
            self.reply.complete = True  # a finish_reason was seen: some servers send no [DONE]
        return self.reply


# --- errors ------------------------------------------------------------------------------


def error_body(api: Api, status: int, message: str) -> dict[str, Any]:
    if api == "ollama":
        return {"error": message}
    kind = {400: "invalid_request_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error",
            503: "overloaded_error" if api == "anthropic" else "service_unavailable",
            504: "timeout_error"}.get(status, "api_error")
    if api == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def stream_error(api: Api, message: str) -> bytes:
    """An error event in the stream's own format (after a 200 was sent, the status cannot
    change): the SDKs raise it as an API error."""
    if api == "ollama":
        return (json.dumps({"error": message}) + "\n").encode()
    body = error_body(api, 500, message)
    if api == "responses":
        # The SDK raises an event whose data has an "error" key.
        event = dict(body, type="error", code="server_error", message=message, param=None)
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    if api == "anthropic":
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    return b"data: " + json.dumps(body).encode() + b"\n\n"
