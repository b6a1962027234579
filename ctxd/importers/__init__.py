"""Transcript importers: turn other tools' conversation logs into ctxd messages.

>>> from ctxd.importers import load_transcripts
>>> for transcript in load_transcripts("session.jsonl"):
...     print(transcript.title, len(transcript.messages), transcript.warnings)

One module per format (``openai_chat``, ``claude_code``, ``mini_swe_agent``,
``swe_agent``, ``openhands``, ``locomo``, ``aider``); each module's docstring states how
that format maps onto :class:`~ctxd.protocol.message.Message`. Shared rules:

* The format is decided from the content (keys, first JSONL records, aider's run
  headers), never the file name.
* Messages are kept in the tool-call style the source used (OpenAI ``tool_calls`` +
  ``role: tool``, or Anthropic ``tool_use``/``tool_result`` blocks).
* Whatever the source had that ``Message`` has no field for goes to ``metadata``;
  things that could not be imported are listed in ``Transcript.warnings``.
* Every message has been validated against ``Message``; a tool result whose call is not
  earlier in the transcript is kept, with a warning.
* Any problem with the file itself raises :class:`TranscriptError` (a ``ValueError``)
  whose message is one line naming the file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import aider, claude_code, locomo, mini_swe_agent, openai_chat, openhands, swe_agent
from ._base import Document, Transcript, TranscriptError, decode_document

__all__ = [
    "FORMATS",
    "Transcript",
    "TranscriptError",
    "detect_format",
    "load_transcripts",
    "load_transcripts_from_bytes",
]

# Detection order matters: specific shapes first, plain OpenAI chat last.
_FORMATS: list[tuple[str, str, Callable[[Document], bool],
                     Callable[[Document], list[Transcript]]]] = [
    (aider.NAME, aider.DESCRIPTION, aider.detect, aider.parse),
    (claude_code.NAME, claude_code.DESCRIPTION, claude_code.detect, claude_code.parse),
    (locomo.NAME, locomo.DESCRIPTION, locomo.detect, locomo.parse),
    (mini_swe_agent.NAME, mini_swe_agent.DESCRIPTION, mini_swe_agent.detect,
     mini_swe_agent.parse),
    (openhands.NAME, openhands.DESCRIPTION, openhands.detect, openhands.parse),
    (openhands.EVENTS_NAME, openhands.EVENTS_DESCRIPTION, openhands.detect_events,
     openhands.parse_events),
    (swe_agent.NAME, swe_agent.DESCRIPTION, swe_agent.detect, swe_agent.parse),
    (openai_chat.NAME, openai_chat.DESCRIPTION, openai_chat.detect, openai_chat.parse),
]

_DISPLAY_ORDER = ("openai_chat", "claude_code", "aider", "mini_swe_agent", "swe_agent", "openhands",
                  "openhands_events", "locomo")

#: Format name -> one-line description (for ``--format`` help and the README).
FORMATS: dict[str, str] = dict(sorted(
    ((name, description) for name, description, _, _ in _FORMATS),
    key=lambda item: _DISPLAY_ORDER.index(item[0])))

_BY_NAME = {name: (detect, parse) for name, _, detect, parse in _FORMATS}

_EXPECTED = ("expected one of: OpenAI chat messages, a Claude Code JSONL log, aider's "
             ".aider.chat.history.md, a mini-swe-agent or SWE-agent trajectory, an OpenHands "
             "completion log or event stream, or LoCoMo samples")


def _detect(doc: Document) -> str:
    if doc.text is not None:  # a text transcript: only the text formats apply
        if aider.detect(doc):
            return aider.NAME
        raise TranscriptError(f"{doc.name}: not a recognised transcript ({_EXPECTED}); found {doc.describe()}")
    for name, _, detect, _ in _FORMATS:
        if detect(doc):
            return name
    raise TranscriptError(
        f"{doc.name}: not a recognised transcript ({_EXPECTED}); found {doc.describe()}")


def _read(path: str | Path) -> tuple[bytes, str]:
    path = Path(path)
    try:
        return path.read_bytes(), str(path)
    except IsADirectoryError:
        raise TranscriptError(f"{path}: is a directory, expected a transcript file") from None
    except FileNotFoundError:
        raise TranscriptError(f"{path}: no such file") from None
    except OSError as err:
        raise TranscriptError(f"{path}: cannot read ({err.strerror or err})") from None


def detect_format(data_or_path: bytes | str | Path | Any) -> str:
    """The format name (a key of :data:`FORMATS`) of a file, its bytes, or decoded JSON.

    A ``str`` is a path unless it starts with ``{`` or ``[`` (then it is JSON text).
    Raises :class:`TranscriptError` when nothing matches.
    """
    if isinstance(data_or_path, (bytes, bytearray, memoryview)):
        doc = decode_document(bytes(data_or_path), "<data>")
    elif isinstance(data_or_path, str) and data_or_path.lstrip()[:1] in ("{", "["):
        doc = decode_document(data_or_path.encode(), "<data>")
    elif isinstance(data_or_path, (str, Path)):
        data, name = _read(data_or_path)
        doc = decode_document(data, name)
    else:
        doc = Document(name="<data>", value=data_or_path)
    return _detect(doc)


def load_transcripts_from_bytes(data: bytes, format: str = "auto", name: str | None = None,
                                label: str | None = None) -> list[Transcript]:
    """Import every conversation in ``data``; ``name`` (a file's) is used in messages and as
    fallback title; ``label`` names data that is no file, in messages only (a document sent
    to ``session/import``: its session is titled from its first user message)."""
    label = label or name or "<data>"
    if format != "auto" and format not in _BY_NAME:
        raise TranscriptError(
            f"{label}: unknown format {format!r} (known: auto, {', '.join(FORMATS)})")
    doc = decode_document(bytes(data), label)
    if format == "auto":
        format = _detect(doc)
    elif (doc.text is not None) != (format == aider.NAME) or not _BY_NAME[format][0](doc):
        raise TranscriptError(
            f"{label}: does not look like {format} ({FORMATS[format]}); found {doc.describe()}")
    try:
        transcripts = _BY_NAME[format][1](doc)
    except TranscriptError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as err:
        raise TranscriptError(
            f"{label}: malformed {format} transcript ({type(err).__name__}: {err})") from None
    if not transcripts:
        raise TranscriptError(f"{label}: no conversations found in this {format} file")
    if name is not None:
        stem = Path(name).name
        for suffix in (".jsonl", ".json", ".traj", ".md"):
            stem = stem.removesuffix(suffix)
        for transcript in transcripts:
            transcript.metadata.setdefault("sourceFile", name)
            if transcript.title is None and len(transcripts) == 1:
                transcript.title = stem
    return transcripts


def load_transcripts(path: str | Path, format: str = "auto") -> list[Transcript]:
    """Import every conversation in the file at ``path`` (``format`` a key of FORMATS or auto)."""
    data, name = _read(path)
    return load_transcripts_from_bytes(data, format=format, name=name)
