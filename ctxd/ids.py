"""Session ids as people see and type them: shortened for tables, and matched back.

Pure functions (no click, no daemon), shared by ``ctxd-cli`` and ``ctxd mcp``.

ids ctxd made up (UUIDs, ``proxy-<api>-<hash>``) are shown as their shortest unique
prefix. A conversation the proxy forked continues in ``<id>~2`` (``~3``...): the id of
its first session and a suffix, so the first session's id is a prefix of its forks'.
Such a family is shown as the short form of the first id, and of the forks as that
short form with their suffix (``proxy-openai-3f2c1a``, ``proxy-openai-3f2c1a~2``); a
prefix that only that family's ids start with names its first session, and a prefix
followed by ``~N`` the fork.
"""

from __future__ import annotations

import re

LAST = "last"

_GENERATED_TAIL = re.compile(r"[0-9a-f]{12,}$")
_FORK = re.compile(r"^(.+)~([1-9][0-9]*)$")


def uuid_like(session_id: str) -> bool:
    """Whether an id is one ctxd made up (a UUID): those are shown shortened, as a unique prefix."""
    return len(session_id) == 36 and session_id.count("-") == 4 and \
        all(c in "0123456789abcdef-" for c in session_id)


def _generated_length(session_id: str, minimum: int) -> int | None:
    """The shortest prefix a generated id is ever shown as; None for an id a client chose."""
    if uuid_like(session_id):
        return minimum
    tail = _GENERATED_TAIL.search(session_id)
    if tail is not None and tail.start() > 0 and session_id[tail.start() - 1] == "-":
        return tail.start() + 6  # the name and at least 6 characters of the hash
    return None


def split_fork(session_id: str) -> tuple[str, str]:
    """``(root, suffix)``: ``("proxy-openai-3f2c...", "~2")`` for a fork of a generated
    id, else ``(session_id, "")``."""
    match = _FORK.match(session_id)
    if match is not None and _generated_length(match.group(1), 8) is not None:
        return match.group(1), "~" + match.group(2)
    return session_id, ""


def short_ids(ids: list[str], minimum: int = 8) -> dict[str, str]:
    """Each id as shown in tables: ids ctxd made up as their shortest prefix that no other
    id starts with (UUIDs: at least ``minimum`` characters; ``proxy-openai-<hash>``: the
    name and at least 6 characters of the hash), a fork of one as its root's short form
    and its ``~N``; ids a client chose whole. :func:`match_ids` finds each back."""
    roots = {split_fork(sid)[0] for sid in ids}
    out: dict[str, str] = {}
    for sid in ids:
        root, suffix = split_fork(sid)
        length = _generated_length(root, minimum)
        if length is None:
            out[sid] = sid
            continue
        # Unique among the other families (this family's ids all start with its root).
        others = [o for o in ids if split_fork(o)[0] != root] + [r for r in roots if r != root]
        while length < len(root) and any(o.startswith(root[:length]) for o in others):
            length += 1
        out[sid] = root[:length] + suffix
    return out


def match_ids(given: str, ids: list[str]) -> list[str]:
    """The ids ``given`` may mean when it is not an id itself: those it is a prefix of;
    when they are one fork family, its first session alone (``P~N``: that family's fork
    ``~N``). Sorted; more than one means ``given`` is ambiguous."""
    if given in ids:
        return [given]
    root_part, suffix = split_fork(given)
    if not suffix:
        match = _FORK.match(given)  # "P~N" where P is a prefix (not a whole generated id)
        if match is not None:
            root_part, suffix = match.group(1), "~" + match.group(2)
    if suffix:
        forks = sorted(sid for sid in ids
                       if split_fork(sid)[1] == suffix and split_fork(sid)[0].startswith(root_part))
        if forks:
            return forks
    matches = sorted(sid for sid in ids if sid.startswith(given))
    families = {split_fork(sid)[0] for sid in matches}
    if len(matches) > 1 and len(families) == 1:
        root = families.pop()
        if root in matches:
            return [root]
    return matches


def _root_part(given: str) -> str:
    """What of ``given`` a generated id's root must start with (its ``~N`` left out)."""
    match = _FORK.match(given)
    return match.group(1) if match is not None else split_fork(given)[0]


_SHOWN_TAIL = re.compile(r"-[0-9a-f]{6,}$")


def may_be_short_form(given: str, minimum: int = 8) -> bool:
    """Whether :func:`short_form_of` can find anything for ``given`` among any ids: it is
    at least a shortest shown prefix of a UUID (its characters, ``minimum`` of them at
    least) or of ``<name>-<hash>`` (the name and 6 characters of the hash). When not,
    no listing of the sessions is needed to know that ``given`` names itself."""
    root_part = _root_part(given)
    if len(root_part) >= min(minimum, 36) and all(c in "0123456789abcdef-" for c in root_part):
        return True
    return _SHOWN_TAIL.search(root_part) is not None


def short_form_of(given: str, ids: list[str], minimum: int = 8) -> list[str]:
    """The ids ``given`` may mean as a short form shown for a generated id (``ctxd-cli
    sessions list``): :func:`match_ids` among the generated ids (and their forks) that
    ``given`` is at least a shortest shown prefix of. An id a client chose is never a
    short form, nor is a prefix shorter than any shown one (``p`` names no session)."""
    root_part = _root_part(given)
    candidates = []
    for sid in ids:
        root = split_fork(sid)[0]
        length = _generated_length(root, minimum)
        if length is not None and len(root_part) >= min(length, len(root)) and root.startswith(root_part):
            candidates.append(sid)
    return match_ids(given, candidates) if candidates else []
