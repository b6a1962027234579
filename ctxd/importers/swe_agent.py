"""SWE-agent trajectories (``*.traj``).

A JSON object; the conversation is ``history`` (what the model saw), a list of
OpenAI-style messages with SWE-agent's extra fields. ``trajectory`` (the same steps
as action/observation records) and ``replay_config`` are not imported; ``info``
(exit status, submission, model stats) and ``environment`` go to the transcript metadata.

* ``thought``, ``action``, ``agent``, ``message_type``, ``is_demo`` and any other extra
  field go to ``metadata`` under their own names.
* Older files (no function calling) return command output as ``user`` messages: they
  stay ``user`` messages, marked ``metadata.observation = true`` (a user message that
  directly follows an assistant message).
* A demonstration (``is_demo: true``: a worked example of another task, shown before the
  real one) is marked ``metadata.demonstration = true``: not the user's words, nor the task.
* In the function-calling variant the assistant carries ``tool_calls`` and tool
  messages carry ``tool_call_ids`` (a list): ``tool_call_id`` is the first id, the full
  list stays in ``metadata.tool_call_ids``.
"""

from __future__ import annotations

from typing import Any

from ctxd.formats import openai

from ._base import (
    Builder,
    Document,
    Transcript,
    first_dict_items,
    guess_provider,
)

NAME = "swe_agent"
DESCRIPTION = ("SWE-agent trajectory (*.traj: {\"history\": [...], \"trajectory\": [...], "
               "\"info\": ...})")

_PSEUDO_MODELS = frozenset({"replay", "human", "human_thought", "instant_empty_submit"})


def detect(doc: Document) -> bool:
    value = doc.value
    if not isinstance(value, dict):
        return False
    items = first_dict_items(value.get("history"))
    return bool(items) and all(isinstance(item.get("role"), str) for item in items)


def parse(doc: Document) -> list[Transcript]:
    value = doc.value
    b = Builder(NAME)
    previous_role: Any = None
    for number, raw in enumerate(value["history"]):
        where = f"history {number}"
        message = openai.to_message(raw, where, b.warn, index=len(b.messages))
        if message is None:
            continue
        meta = message.metadata or {}
        ids = raw.get("tool_call_ids")
        if message.tool_call_id is None and isinstance(ids, list) and ids and isinstance(
                ids[0], str):
            message.tool_call_id = ids[0]
        if message.role == "user" and previous_role == "assistant":
            meta["observation"] = True
        if message.role == "user" and raw.get("is_demo") is True:
            meta["demonstration"] = True
        message.metadata = meta or None
        previous_role = raw.get("role")
        b.add(message, where)

    metadata: dict[str, Any] = {}
    for key in ("environment", "info"):
        if value.get(key) is not None:
            metadata[key] = value[key]
    model = None
    try:
        name = value["replay_config"]["agent"]["model"]["name"]
        if isinstance(name, str):
            metadata["model_name"] = name
            if name not in _PSEUDO_MODELS:
                model = name
    except (KeyError, TypeError):
        pass
    return [b.finish(model=model, provider=guess_provider(model), metadata=metadata)]
