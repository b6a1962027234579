"""mini-swe-agent trajectories (``<instance>.traj.json``).

A JSON object whose ``messages`` is an OpenAI-style chat list (system, user, assistant
with ``tool_calls`` whose ``function.arguments`` is a JSON string, ``tool`` with
``tool_call_id``), usually ending with a message of role ``exit`` holding the submitted
diff (or the error that ended the run). That last message becomes an ``assistant``
message with ``metadata.originalRole = "exit"`` (and ``exit_status`` when known).

Each message's ``extra`` (raw API response, raw command output) is not kept, except:
the response's ``usage`` (→ ``Message.usage``), its ``model``, and ``extra.timestamp``
(Unix time → ISO 8601 UTC ``timestamp``). DeepSeek's ``reasoning_content`` becomes a
leading thinking block. ``info`` goes to the transcript metadata without ``config``
(prompt templates already present as messages) and ``submission`` (the exit message).

The older fixture form (a bare list of ``{role, content}``) is plain ``openai_chat``.
"""

from __future__ import annotations

from typing import Any

from ctxd.formats import openai
from ctxd.formats.common import epoch_to_iso
from ctxd.formats.native import any_usage

from ._base import (
    Builder,
    Document,
    Transcript,
    guess_provider,
)

NAME = "mini_swe_agent"
DESCRIPTION = ("mini-swe-agent trajectory (*.traj.json: {\"messages\": [...], \"info\": ...}, "
               "ends in role 'exit')")


def detect(doc: Document) -> bool:
    value = doc.value
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        return False
    fmt = value.get("trajectory_format")
    if isinstance(fmt, str) and fmt.startswith("mini-swe-agent"):
        return True
    info = value.get("info")
    if isinstance(info, dict) and "mini_version" in info:
        return True
    messages = value["messages"]
    return bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "exit"


def parse(doc: Document) -> list[Transcript]:
    value = doc.value
    b = Builder(NAME)
    models: list[str] = []
    for number, raw in enumerate(value["messages"]):
        where = f"message {number}"
        message = openai.to_message(raw, where, b.warn, index=len(b.messages), ignore=("extra",),
                                         role_map={"exit": "assistant"})
        if message is None:
            continue
        extra = raw.get("extra") if isinstance(raw.get("extra"), dict) else {}
        response = extra.get("response") if isinstance(extra.get("response"), dict) else {}
        if message.role == "assistant" and response:
            message.usage = any_usage(response.get("usage"))
            model = response.get("model")
            if isinstance(model, str) and model not in models:
                models.append(model)
        if message.timestamp is None:
            message.timestamp = epoch_to_iso(extra.get("timestamp"))
        if raw.get("role") == "exit" and extra.get("exit_status") is not None:
            message.metadata = {**(message.metadata or {}), "exit_status": extra["exit_status"]}
        b.add(message, where)

    info = value.get("info")
    info = info if isinstance(info, dict) else {}
    config = info.get("config")
    config = config if isinstance(config, dict) else {}
    model_config = config.get("model")
    model_config = model_config if isinstance(model_config, dict) else {}
    model = model_config.get("model_name")
    if not isinstance(model, str):
        model = models[0] if models else None
    metadata: dict[str, Any] = {
        k: v for k, v in value.items() if k not in ("messages", "info") and v is not None}
    metadata["info"] = {k: v for k, v in info.items() if k not in ("config", "submission")}
    if len(models) > 1:
        metadata["models"] = models
    title = value.get("instance_id")
    provider = guess_provider(model)
    return [b.finish(title=title if isinstance(title, str) else None, model=model,
                     provider=provider, metadata=metadata)]
