"""OpenHands logs: litellm completion logs and event streams.

``openhands`` - a litellm completion log (``llm_completions/<instance>/*.json``): a JSON
object with ``messages`` (the prompt of that LLM call, OpenAI style: content is a list
of ``{type: "text", text}`` parts, assistant ``tool_calls``, ``tool`` messages with
``tool_call_id`` + ``name``) and ``response`` (the completion). The final assistant turn
is ``response.choices[0].message``; it is appended, with ``response.usage`` as its
usage and the log's ``timestamp`` (Unix time → ISO 8601 UTC). The model is
``response.model``. ``kwargs.tools`` and ``cost`` go to the transcript metadata;
``cache_control`` markers on parts go to the message metadata. Title: the instance id,
from the log's place in an evaluation's output (``llm_completions/<instance id>/``),
else the repository OpenHands was given (``<uploaded_files>/workspace/<repo>``), else
the first words of the task.

``openhands_events`` - an event stream: a JSON list of events (or ``{"history": [...]}``
/ ``{"events": [...]}``, or JSONL with one event per line, or JSONL with one
``{"history": [...]}`` run per line). Events are mapped in OpenAI style:

* ``action: "message"`` → ``user`` (source user) or ``assistant`` (source agent);
  ``action: "system"`` → ``system``.
* any other agent action (``run``, ``edit``, ``finish``...) → an ``assistant`` message
  with one ``tool_calls`` entry: id = ``tool_call_metadata.tool_call_id`` (or
  ``openhands-<event id>``), name = ``tool_call_metadata.function_name`` (or the action),
  arguments = the call's original JSON from ``model_response`` when present, otherwise
  ``args`` without ``thought``. Content is ``args.thought`` or, if empty, the event's
  ``message``. Actions produced by one model response are merged into one assistant
  message; that response's ``usage`` goes on it.
* an observation caused by such an action → a ``tool`` message (``tool_call_id`` of the
  action, ``name`` its function), content = the observation's ``content``.
* an observation answering no tool call (e.g. recalled knowledge) → a ``user`` message.
* every observation message has ``metadata.observation = true``,
  ``metadata.observationType`` (``run``, ``read``...), ``cause`` and ``extras``; every
  event message has the event ``id`` and ``source``, actions their ``action``.
* ``agent_state_changed``/``null`` observations and ``change_agent_state`` actions are
  not messages and are skipped with a warning.
* Title: the run's ``instance_id`` (an evaluation's output.jsonl), else the first words
  of the user's first message.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import PurePath
from typing import Any

import msgspec

from ctxd.formats import openai
from ctxd.formats.common import IMAGE_PLACEHOLDER, epoch_to_iso, text_of
from ctxd.formats.native import any_usage
from ctxd.protocol.message import FunctionCall, Message, Role, TextBlock, ToolCall

from ._base import (
    Builder,
    Document,
    Transcript,
    guess_provider,
    looks_like_openai_messages,
    title_from_text,
)

NAME = "openhands"
DESCRIPTION = ("OpenHands litellm completion log (JSON: \"messages\" + \"response\"; "
               "the final turn is response.choices[0])")
EVENTS_NAME = "openhands_events"
EVENTS_DESCRIPTION = ("OpenHands event stream (JSON list or JSONL of events with "
                      "source + action/observation)")


# --------------------------------------------------------------------------- completion log


def detect(doc: Document) -> bool:
    value = doc.value
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        return False
    response = value.get("response")
    return (isinstance(response, dict) and isinstance(response.get("choices"), list)
            and (not value["messages"] or looks_like_openai_messages(value["messages"])))


def parse(doc: Document) -> list[Transcript]:
    value = doc.value
    b = Builder(NAME)
    for number, raw in enumerate(value["messages"]):
        message = openai.to_message(raw, f"message {number}", b.warn, index=len(b.messages))
        if message is not None:
            b.add(message, f"message {number}")
    response = value["response"]
    choices = response.get("choices") if isinstance(response.get("choices"), list) else []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    final = choice.get("message")
    if isinstance(final, dict):
        message = openai.to_message(final, "response", b.warn, index=len(b.messages))
        if message is not None:
            message.usage = any_usage(response.get("usage"))
            if message.timestamp is None:
                message.timestamp = epoch_to_iso(value.get("timestamp"))
            meta = message.metadata or {}
            meta["fromResponse"] = True
            if choice.get("finish_reason") is not None:
                meta["finish_reason"] = choice["finish_reason"]
            if isinstance(response.get("id"), str):
                meta["responseId"] = response["id"]
            message.metadata = meta
            b.add(message, "response")
    else:
        b.warn("response: no choices[0].message, final assistant turn missing")
    if len(choices) > 1:
        b.warn(f"response: {len(choices) - 1} extra choices ignored")

    model = response.get("model")
    kwargs = value.get("kwargs") if isinstance(value.get("kwargs"), dict) else {}
    if not isinstance(model, str):
        model = kwargs.get("model") if isinstance(kwargs.get("model"), str) else None
    metadata: dict[str, Any] = {}
    if kwargs.get("tools"):
        metadata["tools"] = kwargs["tools"]
    for key in ("cost", "timestamp"):
        if value.get(key) is not None:
            metadata[key] = value[key]
    instance = _instance_from_path(doc.name)
    if instance:
        metadata["instance_id"] = instance
    title = instance or _workspace_repo(b.messages) or _first_user_words(b.messages)
    return [b.finish(title=title, model=model, provider=guess_provider(model), metadata=metadata)]


def _instance_from_path(name: str) -> str | None:
    """``.../llm_completions/<instance id>/<model>-<time>.json``: where OpenHands'
    evaluations write each instance's completion logs."""
    path = PurePath(name)
    if len(path.parts) >= 3 and path.parent.parent.name == "llm_completions" and path.parent.name:
        return path.parent.name
    return None


_UPLOADED = re.compile(r"<uploaded_files>\s*(\S+?)/*\s*</uploaded_files>")


def _message_text(message: Message) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "\n".join(block.text for block in content or () if isinstance(block, TextBlock))


def _workspace_repo(messages: list[Message]) -> str | None:
    """The repository OpenHands' SWE-bench prompt names: ``<uploaded_files>/workspace/x``."""
    for message in messages:
        if message.role == "user":
            found = _UPLOADED.search(_message_text(message)[:2000])
            return PurePath(found.group(1)).name or None if found else None
    return None


def _first_user_words(messages: list[Message]) -> str | None:
    for message in messages:
        if message.role == "user" and not (message.metadata or {}).get("observation"):
            title = title_from_text(_message_text(message))
            if title:
                return title
    return None


# --------------------------------------------------------------------------- event stream

_SKIP_OBSERVATIONS = frozenset({"agent_state_changed", "null"})
_SKIP_ACTIONS = frozenset({"change_agent_state"})


def _is_event(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("source"), str) and (
        isinstance(value.get("action"), str) or isinstance(value.get("observation"), str))


def _event_list(value: Any) -> list[Any] | None:
    if isinstance(value, list) and value and _is_event(value[0]):
        return value
    if isinstance(value, dict):
        for key in ("history", "events"):
            events = value.get(key)
            if isinstance(events, list) and events and _is_event(events[0]):
                return events
    return None


def detect_events(doc: Document) -> bool:
    if doc.records is not None:
        first = doc.records[0][1] if doc.records else None
        return _is_event(first) or _event_list(first) is not None
    return _event_list(doc.value) is not None


def parse_events(doc: Document) -> list[Transcript]:
    if doc.records is not None:
        if _is_event(doc.records[0][1]):
            return [_events_transcript([r for _, r in doc.records],
                                       [f"line {n}" for n, _ in doc.records], {})]
        out = []
        for line, record in doc.records:
            events = _event_list(record)
            if events is None:
                continue
            fields = {k: v for k, v in record.items()
                      if k not in ("history", "events") and isinstance(v, (str, int, float))}
            transcript = _events_transcript(events, None, fields, prefix=f"line {line}: ")
            transcript.metadata["line"] = line
            out.append(transcript)
        return out
    events = _event_list(doc.value) or []
    extra: dict[str, Any] = {}
    if isinstance(doc.value, dict):
        extra = {k: v for k, v in doc.value.items()
                 if k not in ("history", "events") and isinstance(v, (str, int, float))}
    return [_events_transcript(events, None, extra)]


def _events_transcript(events: list[Any], labels: list[str] | None, extra: dict[str, Any],
                       prefix: str = "") -> Transcript:
    b = Builder(EVENTS_NAME)
    drafts: list[dict[str, Any]] = []
    by_response: dict[str, dict[str, Any]] = {}
    call_of_action: dict[Any, tuple[str, str]] = {}  # action event id -> (call id, name)
    skipped: Counter[str] = Counter()
    models: list[str] = []
    tools: Any = None

    for number, event in enumerate(events):
        where = prefix + (labels[number] if labels else f"event {number}")
        if not isinstance(event, dict):
            b.warn(f"{where}: skipped, not a JSON object")
            continue
        event_id = event.get("id")
        if not isinstance(event_id, (int, str)) or isinstance(event_id, bool):
            event_id = None
        cause = event.get("cause")
        if not isinstance(cause, (int, str)) or isinstance(cause, bool):
            cause = None
        timestamp = event.get("timestamp") if isinstance(event.get("timestamp"), str) else None
        source = event.get("source")
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        tcm = event.get("tool_call_metadata")
        tcm = tcm if isinstance(tcm, dict) else {}
        base_meta: dict[str, Any] = {"id": event_id, "source": source}

        action = event.get("action")
        if isinstance(action, str):
            base_meta["action"] = action
            if action in _SKIP_ACTIONS:
                skipped[f"{action} action"] += 1
                continue
            if action in ("message", "system"):
                role: Role = "system" if action == "system" else (
                    "assistant" if source == "agent" else "user")
                content = args.get("content")
                if not isinstance(content, str):
                    content = text_of(event.get("message"))
                images = args.get("image_urls") or []
                if not isinstance(images, list):
                    images = [images]
                if images:
                    b.warn(f"{where}: {len(images)} image(s) replaced by {IMAGE_PLACEHOLDER!r}")
                    content = "\n".join([content] + [IMAGE_PLACEHOLDER] * len(images))
                if action == "system" and args.get("tools"):
                    tools = args["tools"]
                response = tcm.get("model_response")
                usage = any_usage(response.get("usage")) if isinstance(response, dict) else None
                drafts.append({"message": Message(role=role, content=content, metadata=base_meta,
                                                  usage=usage if role == "assistant" else None,
                                                  timestamp=timestamp), "where": where})
                continue
            if source != "agent":
                content = text_of(event.get("message")) or None
                base_meta["args"] = args
                drafts.append({"message": Message(role="user", content=content,
                                                  metadata=base_meta, timestamp=timestamp),
                               "where": where})
                continue
            call_id = tcm.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                call_id = f"openhands-{event_id if event_id is not None else number}"
            name = tcm.get("function_name")
            if not isinstance(name, str) or not name:
                name = action
            response = tcm.get("model_response")
            response = response if isinstance(response, dict) else {}
            arguments = _original_arguments(response, call_id)
            if arguments is None:
                arguments = msgspec.json.encode(
                    {k: v for k, v in args.items() if k != "thought"}).decode()
            call = ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))
            if event_id is not None:
                call_of_action[event_id] = (call_id, name)
            thought = args.get("thought")
            content = thought if isinstance(thought, str) and thought else (
                text_of(event.get("message")) or None)
            response_id = response.get("id")
            if not isinstance(response_id, str):
                response_id = None
            model = response.get("model")
            if isinstance(model, str) and model not in models:
                models.append(model)
            if isinstance(response_id, str) and response_id in by_response:
                draft = by_response[response_id]
                draft["message"].tool_calls.append(call)
                draft["message"].metadata.setdefault("ids", [draft["message"].metadata["id"]])
                draft["message"].metadata["ids"].append(event_id)
                continue
            message = Message(role="assistant", content=content, tool_calls=[call],
                              usage=any_usage(response.get("usage")), metadata=base_meta,
                              timestamp=timestamp)
            draft = {"message": message, "where": where}
            drafts.append(draft)
            if isinstance(response_id, str):
                by_response[response_id] = draft
            continue

        observation = event.get("observation")
        if isinstance(observation, str):
            base_meta["observation"] = True
            base_meta["observationType"] = observation
            if observation in _SKIP_OBSERVATIONS:
                skipped[f"{observation} observation"] += 1
                continue
            if cause is not None:
                base_meta["cause"] = cause
            if event.get("extras"):
                base_meta["extras"] = event["extras"]
            content = event.get("content")
            if not isinstance(content, str):
                content = text_of(event.get("message"))
            call_id = tcm.get("tool_call_id") if isinstance(tcm.get("tool_call_id"), str) else None
            name = tcm.get("function_name") if isinstance(tcm.get("function_name"), str) else None
            if call_id is None and cause in call_of_action:
                call_id, name = call_of_action[cause]
            if call_id is None:
                drafts.append({"message": Message(role="user", content=content,
                                                  metadata=base_meta, timestamp=timestamp),
                               "where": where})
            else:
                drafts.append({"message": Message(role="tool", content=content, name=name,
                                                  tool_call_id=call_id, metadata=base_meta,
                                                  timestamp=timestamp), "where": where})
            continue
        b.warn(f"{where}: skipped, neither an action nor an observation")

    for label, count in skipped.items():
        b.warn(f"skipped {count} {label} event{'s' if count != 1 else ''}")
    for draft in drafts:
        b.add(draft["message"], draft["where"])
    metadata: dict[str, Any] = dict(extra)
    if tools:
        metadata["tools"] = tools
    if len(models) > 1:
        metadata["models"] = models
    model = models[0] if models else None
    title = extra.get("instance_id") if isinstance(extra.get("instance_id"), str) else None
    return b.finish(title=title or _first_user_words(b.messages), model=model, provider=guess_provider(model),
                    metadata=metadata)


def _original_arguments(response: dict[str, Any], call_id: str) -> str | None:
    """The verbatim ``arguments`` of tool call ``call_id`` in a logged model response."""
    choices = response.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        message = choice.get("message") if isinstance(choice, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict) and call.get("id") == call_id:
                function = call.get("function")
                if not isinstance(function, dict):
                    return None
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    return arguments
                return None if arguments is None else text_of(arguments)
    return None
