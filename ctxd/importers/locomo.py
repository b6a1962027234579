"""LoCoMo long-conversation benchmark files (``locomo10.json``).

A JSON list of samples ``{sample_id, conversation, qa, ...}`` (a single sample object is
accepted too); one transcript per sample, titled with ``sample_id``. ``conversation``
has ``speaker_a``, ``speaker_b``, ``session_N_date_time`` and ``session_N`` (a list of
turns ``{speaker, dia_id, text, blip_caption?, img_url?, query?}``), sessions taken in
numeric order.

Mapping (LoCoMo is a dialogue between two people, not a user and a model):

* ``speaker_a`` → ``user``, ``speaker_b`` → ``assistant``; a turn by anyone else →
  ``user`` with a warning.
* ``name`` = the speaker's name made fit for OpenAI's ``name`` field (ASCII letters,
  digits, ``_`` and ``-``, at most 64 characters: ``"Mary Ann"`` → ``"Mary_Ann"``), so
  the turns carry their speaker in the OpenAI prompt shape; the name as written is in
  ``metadata.speaker``.
* content = ``text``, verbatim; a turn that shared an image gets it as a second block,
  ``{"type": "image", "description": <blip_caption>, "url": <img_url>}`` (an image
  captioner's words, not the speaker's: ctxd sends it as ``[image: <caption>]`` and
  compresses it like a tool output, never as part of the speaker's words).
* ``metadata = {dia_id, speaker, session: N, sessionDateTime}`` plus any other turn
  field (``query``, ...) under its own name (``blip_caption`` and ``img_url`` are in the
  image block). The extractive
  summarizer prefixes the turns it quotes with speaker and date from these
  (``[8 May 2023] Caroline: ...``).
* Each session that has a date opens with one short **system message**,
  ``[Session N: <session_N_date_time>]`` (``metadata = {session: N, sessionDateTime,
  sessionStart: true}``, no ``dia_id``): the date reaches the prompt without touching
  the speakers' words. ctxd keeps such a marker in the prompt while a verbatim message
  of its session is there to date (about 15 tokens a session); once its turns are all
  summarized (the summary lines carry the date) or folded, it leaves the prompt
  (``engine/context.retire_markers``); history keeps it.
* ``timestamp`` = the session's date/time as ISO 8601 (``"1:56 pm on 8 May, 2023"`` →
  ``"2023-05-08T13:56:00"``, no time zone, as in the source) when it parses; the
  original text is always in ``metadata.sessionDateTime``.
* ``Transcript.metadata``: ``qa`` (questions with ``evidence`` dia_ids, so a benchmark
  can check which evidence turns survive compression), ``speaker_a``, ``speaker_b`` and
  every other sample field (``event_summary``, ``observation``, ``session_summary``...).
"""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime
from typing import Any

from ctxd.formats.common import text_of
from ctxd.protocol.message import ContentBlock, ImageBlock, Message, Role, TextBlock

from ._base import Builder, Document, Transcript

NAME = "locomo"
DESCRIPTION = ("LoCoMo benchmark samples (JSON list of {sample_id, conversation, qa}); "
               "one transcript per sample")

_SESSION = re.compile(r"^session_(\d+)$")
_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M %p on %B %d, %Y")
_NOT_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")


def _is_sample(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("conversation"), dict)
            and "speaker_a" in value["conversation"])


def detect(doc: Document) -> bool:
    value = doc.value
    if isinstance(value, list):
        return bool(value) and _is_sample(value[0])
    return _is_sample(value)


def session_datetime_iso(text: Any) -> str | None:
    """``"1:56 pm on 8 May, 2023"`` as ``"2023-05-08T13:56:00"`` (None if it does not parse)."""
    if not isinstance(text, str):
        return None
    cleaned = " ".join(text.split())
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(cleaned, fmt).isoformat()
        except ValueError:
            continue
    return None


def openai_name(speaker: Any) -> str | None:
    """``speaker`` made valid for OpenAI's ``name`` field (``^[A-Za-z0-9_-]{1,64}$``):
    accents dropped ("Zoë" → "Zoe"), other runs of characters → ``_``; None if nothing is left."""
    if not isinstance(speaker, str):
        return None
    ascii_text = unicodedata.normalize("NFKD", speaker).encode("ascii", "ignore").decode("ascii")
    name = _NOT_NAME_CHARS.sub("_", ascii_text.strip()).strip("_")[:64].rstrip("_")
    return name or None


def session_marker(number: int, date_text: str) -> str:
    """The text of the system message that opens a session: ``[Session 2: 1:56 pm on 8 May, 2023]``."""
    return f"[Session {number}: {' '.join(date_text.split())}]"


def _sample(sample: dict[str, Any], index: int) -> Transcript:
    b = Builder(NAME)
    conversation = sample["conversation"]
    speaker_a = conversation.get("speaker_a")
    speaker_b = conversation.get("speaker_b")
    sessions = sorted(
        (int(m.group(1)), key) for key in conversation if (m := _SESSION.match(key)))
    unparsed_dates = 0
    for number, key in sessions:
        turns = conversation[key]
        if not isinstance(turns, list):
            b.warn(f"{key}: not a list of turns, skipped")
            continue
        date_text = conversation.get(f"{key}_date_time")
        timestamp = session_datetime_iso(date_text)
        if date_text is not None and timestamp is None:
            unparsed_dates += 1
        if isinstance(date_text, str) and date_text.strip() and turns:
            b.add(Message(role="system", content=session_marker(number, date_text), timestamp=timestamp,
                          metadata={"session": number, "sessionDateTime": date_text, "sessionStart": True}),
                  f"{key} date")
        for position, turn in enumerate(turns):
            where = f"{key} turn {position}"
            if not isinstance(turn, dict):
                b.warn(f"{where}: skipped, not a JSON object")
                continue
            speaker = turn.get("speaker")
            role: Role
            if speaker == speaker_a:
                role = "user"
            elif speaker == speaker_b:
                role = "assistant"
            else:
                role = "user"
                b.warn(f"{where}: speaker {speaker!r} is neither speaker_a nor speaker_b, "
                       "imported as user")
            text = text_of(turn.get("text"))
            caption = turn.get("blip_caption")
            url = turn.get("img_url")
            if isinstance(url, list):  # (LoCoMo gives a list of one URL)
                url = next((u for u in url if isinstance(u, str)), None)
            content: str | list[ContentBlock] = text
            image = isinstance(caption, str) and caption.strip()
            if image and isinstance(caption, str):
                blocks: list[ContentBlock] = [TextBlock(text=text)] if text else []
                content = [*blocks, ImageBlock(description=caption, url=url if isinstance(url, str) else None)]
            meta: dict[str, Any] = {"dia_id": turn.get("dia_id"), "speaker": speaker,
                                    "session": number}
            if date_text is not None:
                meta["sessionDateTime"] = date_text
            for field, value in turn.items():
                if field not in ("text", "speaker", "dia_id") and value is not None and not (
                        image and field in ("blip_caption", "img_url")):
                    meta[field] = value
            b.add(Message(role=role, content=content, name=openai_name(speaker), metadata=meta,
                          timestamp=timestamp), where)
    if unparsed_dates:
        b.warn(f"{unparsed_dates} session date(s) not understood; timestamps left empty")
    metadata: dict[str, Any] = {"speaker_a": speaker_a, "speaker_b": speaker_b,
                                "qa": sample.get("qa") or []}
    for field, value in sample.items():
        if field not in ("conversation", "qa", "sample_id"):
            metadata[field] = value
    sample_id = sample.get("sample_id")
    title = sample_id if isinstance(sample_id, str) else f"sample {index}"
    return b.finish(title=title, metadata=metadata)


def parse(doc: Document) -> list[Transcript]:
    value = doc.value
    samples = value if isinstance(value, list) else [value]
    out: list[Transcript] = []
    skipped = []
    for index, sample in enumerate(samples):
        if _is_sample(sample):
            out.append(_sample(sample, index))
        else:
            skipped.append(index)
    if skipped and out:
        out[0].warnings.insert(0, f"items {', '.join(map(str, skipped[:10]))}: skipped, "
                                  "not LoCoMo samples")
    return out
