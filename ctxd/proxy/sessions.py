"""The proxy's side of ctxd sessions: which session a request belongs to, which of its
messages are new, pushing them and the reply, and the prompt to send.

Every message the proxy pushes carries ``metadata.ctxdProxy.hash``: a hash chain over
the conversation (each message's chain part, see ``ctxd.formats``, hashed with the previous
hash), and the same value, prefixed, as its idempotency key. The session's chain is kept
in memory and rebuilt from history after a restart; a client whose chain extends the
session's gets the rest pushed; any other is a disagreement (docs/proxy.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import compress, count
from pathlib import Path
from typing import Any

import msgspec

from ctxd.client import Client, DaemonUnavailable, RpcError, connect_or_start
from ctxd.engine import calibration
from ctxd.formats import Api, chain_part, to_ctxd
from ctxd.ids import may_be_short_form, short_form_of
from ctxd.protocol.errors import ErrorCode
from ctxd.protocol.notifications import SessionUpdated
from ctxd.proxy.apis import AlignMemo, Split, reply_room
from ctxd.proxy.convert import chain_hash
from ctxd.proxy.identity import Ident, Live, Plan, Stored, ident_of, match, stored_sides

log = logging.getLogger("ctxd.proxy")

META = "ctxdProxy"
PUSH_BATCH = 100
CREDENTIAL_HEADERS = ("x-api-key", "api-key", "x-goog-api-key", "authorization")
"""The headers that carry a client's API key (Anthropic, Azure OpenAI, Google, the rest)."""


class Refused(Exception):
    """The request may not use the session it names: answered with ``status`` and the
    message, in the API's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def profile_of(api: Api, user_agent: str | None, model: str | None, tools: Any = None) -> str:
    """Who sends a request, for what the provider counts beside its messages (tool
    definitions, framing): the API, the client's product name (its User-Agent's first
    word, version left out), the model, and the names of the tools it declares. An agent's
    side requests (opencode's title, with no tools) go to the same model with none of the
    thousands of tokens its tasks carry: one line fitted through both (engine/calibration.py)
    read the tools' cost as a doubled ratio, which halved the room of a 16K window's
    prompt and underestimated a small prompt (its ``max_tokens`` passed the window)."""
    product = (user_agent or "").split(" ", 1)[0].split("/", 1)[0][:64]
    profile = f"{api}|{product}|{model or ''}"
    names = _tool_names(tools)
    if names:
        profile += "|" + hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]
    return profile


def _tool_names(tools: Any) -> list[str]:
    """The names of a request's declared tools, in order (a tool without one: its type,
    as the providers' built-in tools have), cheap to take from a large schema list."""
    if not isinstance(tools, list):
        return []
    names = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        name = name or tool.get("name") or tool.get("type")
        names.append(name if isinstance(name, str) else "")
    return names


def credential_of(headers: Any) -> str:
    """The fingerprint of the request's API key ("" for none): a SHA-256 of the key
    headers, never the key. A session is continued only under the key that created it
    (docs/proxy.md, "Which session")."""
    values = [f"{name}:{headers.get(name)}" for name in CREDENTIAL_HEADERS if headers.get(name)]
    if not values:
        return ""
    return hashlib.sha256(("ctxd-proxy credential\n" + "\n".join(values)).encode()).hexdigest()[:32]


class DaemonLink:
    """A few connections to the ctxd daemon (started when none answers); a session always
    uses the same one, so its requests stay in order."""

    def __init__(self, socket_path: Path, *, connections: int = 4, autostart: bool = True,
                 data_dir: str | None = None, config_file: str | None = None) -> None:
        self.socket_path = socket_path
        self.size = max(1, connections)
        self.autostart = autostart
        self.data_dir = data_dir
        self.config_file = config_file
        self._clients: list[Client | None] = [None] * self.size
        self._locks = [asyncio.Lock() for _ in range(self.size)]

    async def _client(self, slot: int) -> Client:
        async with self._locks[slot]:
            client = self._clients[slot]
            if client is None or getattr(client, "_closed", False):
                client = await connect_or_start(self.socket_path, autostart=self.autostart, data_dir=self.data_dir,
                                                config_file=self.config_file, client_name="ctxd-proxy")
                self._clients[slot] = client
            return client

    async def start(self) -> None:
        await self._client(0)

    def slot(self, session_id: str) -> int:
        return zlib.crc32(session_id.encode()) % self.size

    async def request(self, session_id: str, method: str, params: Any) -> Any:
        slot = self.slot(session_id)
        for attempt in (1, 2):
            client = await self._client(slot)
            try:
                return await client.request(method, params)
            except DaemonUnavailable:
                self._clients[slot] = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        for client in self._clients:
            if client is not None:
                await client.close()


@dataclass
class Pending:
    """A reply's push sent and not answered yet, and the chain before it."""

    task: asyncio.Task[Any]
    before: list[str]
    entries: int = 0  # len(Tracked.entries) before it


def may_derive(message: dict[str, Any]) -> bool:
    """Whether pushing ``message`` may change a session's prompt besides appending it: an
    assistant message with a tool call (a configured watermark tool moves the watermark)
    or a bracket in its text (goal markers, ``[GOAL] ...``), or any block but text.
    Over-inclusive by design."""
    if message.get("role") != "assistant":
        return False
    if message.get("toolCalls"):
        return True
    content = message.get("content")
    if isinstance(content, str):
        return "[" in content
    return any(not isinstance(block, dict) or block.get("type") != "text" or "[" in str(block.get("text", ""))
               for block in content or ())


def reply_floor(configured: int, window: int | None) -> int:
    """The least a reply keeps before the session's replies are seen: the configured floor,
    at most an eighth of a window given (at least 1,024). A 16K window's reserve is already
    a quarter of it (4,000 of opencode's 8,000): a 4,096 floor there lent nothing, and the
    newest read went cut for tens of tokens of reply room a coding agent does not use."""
    if not window or configured <= 0:
        return configured
    return min(configured, max(1024, window // 8))


@dataclass
class Verbatim:
    """A session whose last prompt was the client's conversation as sent (the proxy
    forwarded the client's bytes), and how far it may grow so that the next prompt is
    too: the prompt's ``appendRoom`` and figures, the API, window and entries then
    (:meth:`Sessions.early`)."""

    fmt: Api
    window: int | None
    entries: int  # len(Tracked.entries) after that turn's push
    room: int
    tokens: int
    budget: dict[str, Any]


@dataclass
class Tracked:
    """A session the proxy pushes to: its id, the hash chain of what it pushed (a reply in
    flight included), its system prompt and reply reserve (``settings.outputTokens``), the
    reply push in flight."""

    id: str
    chain: list[str]
    system: str | None
    output: int | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: Pending | None = None
    credential: str | None = None  # the creating key's fingerprint; None: not recorded (made elsewhere)
    entries: list[Stored] = field(default_factory=list)  # one per ``chain`` key: identity, anchor, live
    current: list[str] | None = None  # the keys last named the client's current context (None: not yet)
    floor: int | None = None  # ``settings.outputFloor`` as last sent
    longest_reply: int = 0  # the longest reply's output tokens seen (usage)
    verbatim: Verbatim | None = None  # the last prompt was the client's own (Sessions.early)
    changes: int = 0  # the daemon's notifications of other changes than its own pushes (Sessions.changed)
    last_seq: int | None = None  # the session's newest seq as the proxy last learned it (None: unknown)
    expect: list[int] = field(default_factory=list)  # last_seq values its own pushes in flight will leave
    live: Live = field(default_factory=Live)  # ``entries``' live ones, kept up to date as it grows (identity.py)

    def plan(self, conv: Conversation) -> Plan | None:
        """:func:`identity.match` of the request over this session's entries."""
        return match(self.entries, conv.idents, self.live, conv.keys)


@dataclass
class Conversation:
    """One request's conversation, ready to compare with its session."""

    api: Api
    model: str | None
    base_id: str
    explicit: bool
    window: int | None
    parts: Split
    items: list[tuple[dict[str, Any], list[Any], dict[str, Any]]]  # (ctxd message, chain part, raw)
    chain: list[str]
    idents: list[Ident]  # one per item (identity.py)
    counts: list[int] = field(default_factory=list)  # counts[i]: len(items) after the first i client messages
    output: int | None = None  # the request's reply limit (apis.reply_limit)
    align: AlignMemo = field(default_factory=AlignMemo)  # (apis.upstream_body)
    credential: str = ""  # the request's key fingerprint (credential_of)
    profile: str = ""  # the client and model (profile_of)
    prompt_tokens: int | None = None  # ctxd's count of the prompt this request got, and its window
    prompt_window: int = 0
    plan: Plan | None = None  # what this request did to its session (identity.match)
    shapes: list[str | None] = field(default_factory=list)  # per item: the stored copy's shape
    anchors: list[bool] = field(default_factory=list)  # per item: an anchor (identity.py)
    changes: int = -1  # Tracked.changes when its prompt was asked for (Sessions.verbatim)
    early: tuple[int, Stored | None, Plan] | None = None  # Sessions.early's plan, and the entries it saw
    ahead: tuple[dict[str, Any], Split, dict[str, Any]] | None = None
    """Sent ahead of its turn: its body, parts and ctxd's prompt, checked once answered (app.py)."""
    keys: list[str] = field(default_factory=list)  # idents' keys (made with them: identity.match compares them)

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.idents):
            self.keys = [ident.key for ident in self.idents]


def _seq_of(info: dict[str, Any]) -> int | None:
    seq = info.get("lastSeq")
    return seq if isinstance(seq, int) else None


def _output_of(info: dict[str, Any]) -> int | None:
    """A session's reply reserve (``settings.outputTokens``) from its ``SessionInfo``."""
    value = (info.get("settings") or {}).get("outputTokens")
    return value if isinstance(value, int) else None


def _floor_of(info: dict[str, Any]) -> int | None:
    value = (info.get("settings") or {}).get("outputFloor")
    return value if isinstance(value, int) else None


def _reply_tokens(entry: dict[str, Any]) -> int:
    usage = (entry.get("message") or {}).get("usage") or {}
    value = usage.get("outputTokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) else 0


def _stored_of(entry: dict[str, Any]) -> Stored | None:
    """A history entry's side of the proxy (``metadata.ctxdProxy``), None for a message
    another client pushed. One pushed before identities were kept is an anchor whose
    identity nothing matches (such a conversation forks once)."""
    message = entry.get("message") or {}
    meta = (message.get("metadata") or {}).get(META) or {}
    if not isinstance(meta, dict) or not isinstance(meta.get("hash"), str):
        return None
    ident = meta.get("id")
    if not isinstance(ident, str):
        return Stored(meta["hash"], "legacy:" + meta["hash"], True, "")
    return Stored(meta["hash"], ident, bool(meta.get("anchor")) or bool(meta.get("ids")),
                  str(meta.get("shape") or ""), entry.get("status") != "superseded")


def derive_session_id(api: Api, model: str | None, parts: Split, credential: str = "") -> str:
    """``proxy-<api>-<hash>``: the hash of the model, the system prompt and the first user
    message (its text as ctxd models it), and the API key's fingerprint: one agent
    conversation, one session; the same opening under another key is another session."""
    first = next((chain_part(api, m) for m in parts.conversation if m.get("role") == "user"), None)
    material = "\n".join([api, model or "", parts.system_text, repr(first)] + ([credential] if credential else []))
    return f"proxy-{api}-{hashlib.sha256(material.encode()).hexdigest()[:16]}"


def conversation(api: Api, body: dict[str, Any], parts: Split, *, session: str | None, window: int | None,
                 output: int | None = None, previous: Conversation | None = None,
                 credential: str = "", user_agent: str | None = None) -> Conversation:
    """The request's conversation: each client message as ctxd stores it, and the hash
    chain. ``previous``: the last request's conversation of the same session, whose work is
    reused for the messages both start with (equal as decoded JSON)."""
    model = body.get("model") if isinstance(body.get("model"), str) else None
    items: list[tuple[dict[str, Any], list[Any], dict[str, Any]]] = []
    idents: list[Ident] = []
    keys: list[str] = []
    call_ids: dict[int, list[str]] = {}
    chain: list[str] = []
    counts = [0]
    offset = len(parts.system_raw) if isinstance(parts.system_raw, list) and api != "anthropic" else 0
    client = parts.conversation
    start = 0
    align = AlignMemo()
    if previous is not None and previous.api == api and previous.parts.system_raw == parts.system_raw:
        known = previous.parts.conversation
        same = min(len(known), len(client))
        if client[:same] != known[:same]:
            same = next(i for i in range(same) if client[i] != known[i])
        align = AlignMemo(previous.align.current, same)
        if api != "ollama":  # (Ollama's tool-call ids depend on the calls before them: no reuse there)
            start = same
            n = previous.counts[start]
            items, chain, counts = previous.items[:n], previous.chain[:n], previous.counts[:start + 1]
            idents, keys = previous.idents[:n], previous.keys[:n]
    for position in range(start, len(client)):
        raw = client[position]
        message = to_ctxd(api, raw, call_ids=call_ids, position=offset + position)
        part = chain_part(api, raw)
        if message is not None and part is not None:
            chain.append(chain_hash(chain[-1] if chain else "", part))
            items.append((message, part, raw))
            idents.append(ident_of(api, raw, part))
            keys.append(idents[-1].key)
        counts.append(len(items))
    base = session if session else derive_session_id(api, model, parts, credential)
    return Conversation(api, model, base, bool(session), window, parts, items, chain, idents, counts, output,
                        align, credential, profile_of(api, user_agent, model, body.get("tools")), keys=keys)


def reply_items(api: Api, conv: Conversation, messages: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Ident]]:
    """The reply as ctxd stores it, and its identity (as the client will send it back):
    one message, or for the Responses API one per output item (reasoning left out)."""
    call_ids: dict[int, list[str]] = {}
    offset = len(conv.parts.system_raw) if isinstance(conv.parts.system_raw, list) and api != "anthropic" else 0
    out = []
    for n, message in enumerate(messages):
        converted = to_ctxd(api, message, call_ids=call_ids, position=offset + len(conv.parts.conversation) + n)
        part = chain_part(api, message)
        if converted is not None and part is not None:
            out.append((converted, ident_of(api, message, part)))
    return out


class Sessions:
    TRACKED = 2048
    """Sessions whose chains are kept in memory; beyond, the least recently used idle ones
    are forgotten (read again from history if their conversation comes back): a proxy that
    runs for months would otherwise keep every session it ever saw."""
    PROFILES = 1024
    """Clients' profiles whose learned counts are kept (:meth:`_learn`), the least recently
    used forgotten beyond (learned again from their sessions, :meth:`_samples`)."""

    def __init__(self, link: DaemonLink, *, remembered: int = 256, reply_floor: int = 4096) -> None:
        self.link = link
        self.reply_floor = reply_floor
        self._tracked: dict[str, Tracked] = {}
        self._aliases: dict[str, str] = {}
        self._earlier: dict[str, Tracked] = {}  # sessions a fork followed (``_continued``)
        self._locks: dict[str, asyncio.Lock] = {}
        self._recent: OrderedDict[tuple[str, str], Conversation] = OrderedDict()
        self._remembered = remembered
        self._pushing: set[asyncio.Task[Any]] = set()
        # Per profile (API, client, model, tools): (ctxd's count, provider's), the most recently
        # used last; at most PROFILES (a client whose tools change makes new ones for months).
        self._learned: OrderedDict[str, list[tuple[int, int]]] = OrderedDict()
        self._owners: dict[str, str] = {}  # a derived session's newest anchor (identity) -> its id
        self._newest: dict[str, str] = {}  # the reverse
        self._looked_up: set[str] = set()
        # Early sending needs to hear at once of every change to a session but its own pushes
        # (a goal set, a pass, another client's push): a daemon in this process tells, unless
        # its storage is shared with other daemons (whose changes it hears of later).
        watch = getattr(link, "watch", None)
        self._watching = callable(watch) and watch(self.changed) is not None

    def changed(self, session_id: str, notification: Any) -> None:
        """A notification of the daemon: any change to a session but the proxy's own pushes
        (told by the ``lastSeq`` they leave) ends what :meth:`early` may assume of it (the
        next prompt is the last one, appended to)."""
        tracked = self._tracked.get(session_id)
        if tracked is None:
            return
        if isinstance(notification, SessionUpdated) and notification.reason == "push" \
                and notification.last_seq in tracked.expect:
            tracked.expect.remove(notification.last_seq)
            tracked.last_seq = notification.last_seq
            return
        tracked.verbatim = None
        tracked.changes += 1

    def read(self, api: Api, body: dict[str, Any], parts: Split, *, session: str | None,
             window: int | None, output: int | None = None, credential: str = "",
             user_agent: str | None = None) -> Conversation:
        """:func:`conversation`, reusing the previous request's work on the messages this
        one starts with (an agent resends its whole history each turn: hashing it again
        cost about 1 ms per 100 messages). The last ``remembered`` conversations are kept."""
        model = body.get("model") if isinstance(body.get("model"), str) else None
        key = (api, session or derive_session_id(api, model, parts, credential))
        conv = conversation(api, body, parts, session=session, window=window, output=output,
                            previous=self._recent.get(key), credential=credential, user_agent=user_agent)
        self._recent[key] = conv
        self._recent.move_to_end(key)
        while len(self._recent) > self._remembered:
            self._recent.popitem(last=False)
        return conv

    # --- finding sessions ------------------------------------------------------------

    async def _get(self, session_id: str) -> dict[str, Any] | None:
        try:
            return await self.link.request(session_id, "session/get", {"sessionId": session_id})
        except RpcError as exc:
            if exc.code == ErrorCode.SessionNotFound:
                return None
            raise

    async def _load(self, info: dict[str, Any]) -> Tracked:
        """A stored session's chain, from the hashes its pushed messages carry."""
        session_id = info["sessionId"]
        entries: list[Stored] = []
        longest = 0
        next_seq: int | None = 1
        while next_seq is not None:
            page = await self.link.request(session_id, "session/history",
                                           {"sessionId": session_id, "from": next_seq, "limit": 500})
            for entry in page.get("messages") or []:
                longest = max(longest, _reply_tokens(entry))
                stored = _stored_of(entry)
                if stored is not None:
                    entries.append(stored)
            next_seq = page.get("nextSeq")
        chain = [e.key for e in entries]
        own = (info.get("metadata") or {}).get(META)
        credential = own.get("credential") if isinstance(own, dict) else None
        return Tracked(session_id, chain, info.get("systemPrompt"), _output_of(info), last_seq=_seq_of(info),
                       credential=credential if isinstance(credential, str) else None, entries=entries,
                       floor=_floor_of(info), longest_reply=longest)

    async def resolve(self, base_id: str) -> Tracked | None:
        """The session a conversation continues (following forks), or None."""
        session_id = base_id
        for _ in range(1000):
            session_id = self._aliases.get(session_id, session_id)
            tracked = self._tracked.get(session_id)
            if tracked is not None:
                return tracked
            info = await self._get(session_id)
            if info is None:
                return None
            successor = ((info.get("metadata") or {}).get(META) or {}).get("successor")
            if isinstance(successor, str) and successor != session_id:
                self._aliases[session_id] = successor
                session_id = successor
                continue
            tracked = await self._load(info)
            self._tracked[session_id] = tracked
            return tracked
        raise RuntimeError(f"session {base_id}: too many forks")

    async def _create(self, conv: Conversation, session_id: str, meta: dict[str, Any], *,
                      resolve: bool = False) -> Tracked:
        """A new session of the conversation, made with everything it holds in one
        ``session/create`` (the key's fingerprint, settings, learned samples). If it
        exists already (a crash, another proxy, or ``resolve``: not looked up before),
        the stored one: ``resolve``, the session it continues (:meth:`resolve`)."""
        provider = "openai" if conv.api == "responses" else conv.api
        params: dict[str, Any] = {"sessionId": session_id, "provider": provider, "tags": ["proxy"],
                                  "metadata": {META: dict(meta, api=conv.api, credential=conv.credential,
                                                          profile=conv.profile)}}
        samples = await self._samples(conv.profile, source=meta.get("forkedFrom"))
        if samples:
            params["usageSamples"] = samples
        if conv.model:
            params["model"] = conv.model
        if conv.window:
            params["contextWindow"] = conv.window
        if conv.parts.system_text:
            params["systemPrompt"] = conv.parts.system_text
        if conv.output is not None:
            params["settings"] = {"outputTokens": conv.output}
        if self.reply_floor > 0:
            params.setdefault("settings", {})["outputFloor"] = reply_floor(self.reply_floor, conv.window)
        first_user = next((m for m, _, _ in conv.items if m.get("role") == "user"), None)
        if first_user is not None:
            content = first_user.get("content")
            text = content if isinstance(content, str) else " ".join(
                b.get("text", "") for b in content or [] if isinstance(b, dict))
            if text.strip():
                params["title"] = " ".join(text.split())[:80]
        try:
            info = await self.link.request(session_id, "session/create", params)
        except RpcError as exc:
            if exc.code != ErrorCode.SessionExists:
                raise
            if resolve:
                found = await self.resolve(session_id)
                if found is None:  # (deleted meanwhile)
                    raise
                return found
            info = await self._get(session_id)
            if info is None:
                raise
            tracked = await self._load(info)
            self._tracked[session_id] = tracked
            return tracked
        tracked = Tracked(session_id, [], info.get("systemPrompt"), _output_of(info), last_seq=_seq_of(info),
                          credential=conv.credential,
                          floor=_floor_of(info))
        self._tracked[session_id] = tracked
        return tracked

    async def _samples(self, profile: str, *, source: str | None = None) -> list[tuple[int, int]]:
        """What the provider counted against ctxd's count for this client and model (the
        calibration's pairs), for a session about to be created: learned from this
        proxy's replies, else the session a fork leaves, else (once per profile, after a
        restart) the most recently active session of that profile."""
        known = self._learned.get(profile)
        if known:
            self._learned.move_to_end(profile)
            return list(known)
        candidates: list[str] = []
        if source is not None:
            candidates.append(source)
        elif profile not in self._looked_up:
            if len(self._looked_up) >= self.PROFILES:
                self._looked_up.clear()  # (then at most one more listing for each)
            self._looked_up.add(profile)
            listed = await self.link.request(profile, "session/list", {"tag": "proxy", "limit": 50})
            candidates += [info["sessionId"] for info in listed.get("sessions") or []
                           if ((info.get("metadata") or {}).get(META) or {}).get("profile") == profile][:1]
        for session_id in candidates:
            try:
                stats = await self.link.request(session_id, "context/stats", {"sessionId": session_id})
            except RpcError:
                continue
            samples = [(int(c), int(r)) for c, r in (stats.get("usageDrift") or {}).get("samples") or []]
            if samples:
                self._remember(profile, samples)
                return list(samples)
        return []

    def _remember(self, profile: str, samples: list[tuple[int, int]]) -> None:
        self._learned[profile] = samples
        self._learned.move_to_end(profile)
        while len(self._learned) > self.PROFILES:
            self._learned.popitem(last=False)

    def _learn(self, conv: Conversation, usage: dict[str, int]) -> None:
        """Pair a reply's reported input with ctxd's count of the prompt it answered, as
        the daemon does for the session (engine/calibration.py), for the sessions this
        client and model will start."""
        reported = usage.get("inputTokens")
        if reported is None or conv.prompt_tokens is None:
            return
        reported += usage.get("cacheReadTokens", 0) + usage.get("cacheWriteTokens", 0)
        pair = calibration.pair(reported, (conv.prompt_tokens,), None, conv.prompt_window)
        self._remember(conv.profile, calibration.remember(self._learned.get(conv.profile, []), pair))

    async def _fork(self, conv: Conversation, old: Tracked, at: int) -> Tracked:
        """The client's history disagrees with the session's from message ``at`` on: a new
        session (``<root>~N``) takes the client's whole conversation; each names the other
        in its metadata (``forkedFrom`` / ``successor``), and the old one is left as it is."""
        root = old.id.split("~", 1)[0]
        n = 2
        while True:
            candidate = f"{root}~{n}"
            if candidate not in self._tracked and await self._get(candidate) is None:
                break
            n += 1
        log.warning("session %s: the client's history differs from the session's at message %d "
                    "(client %d messages, session %d); continuing in new session %s",
                    old.id, at + 1, len(conv.items), len(old.chain), candidate)
        tracked = await self._create(conv, candidate, {"forkedFrom": old.id, "forkedAt": at + 1})
        info = await self._get(old.id)
        metadata = dict((info or {}).get("metadata") or {})
        metadata[META] = dict(metadata.get(META) or {}, successor=candidate)
        await self.link.request(old.id, "session/update", {"sessionId": old.id, "metadata": metadata})
        self._aliases[old.id] = candidate
        self._earlier[old.id] = self._tracked.pop(old.id, old)
        return tracked

    def lock(self, base_id: str) -> asyncio.Lock:
        return self._locks.setdefault(base_id, asyncio.Lock())

    async def _named(self, given: str) -> str:
        """The session an ``X-Ctxd-Session`` name means: itself when it exists or is new;
        the session it is the shown short form of (``ctxd-cli sessions list`` shows
        generated ids shortened), never a new session of that short id. A name that
        cannot be a short form (``bench-1``, most a client chooses) names itself: no
        daemon round trip (a new session's first request listed every proxy session)."""
        if given in self._aliases or given in self._tracked:
            return given
        root, sep, suffix = given.rpartition("~")
        if not may_be_short_form(given) and not (sep and suffix.isdigit() and may_be_short_form(root)):
            return given
        if await self._get(given) is not None:
            return given
        listed = await self.link.request(given, "session/list", {"tag": "proxy"})
        ids = [info["sessionId"] for info in listed.get("sessions") or []]
        found = short_form_of(given, ids)
        if len(found) == 1:
            self._aliases[given] = found[0]
            return found[0]
        if len(found) > 1:
            raise Refused(400, f"ctxd proxy: X-Ctxd-Session {given!r} names several sessions "
                               f"({', '.join(found[:5])}): give more of the id")
        if sep and suffix.isdigit() and short_form_of(root, ids):
            raise Refused(404, f"ctxd proxy: X-Ctxd-Session {given!r}: that conversation has no fork ~{suffix}")
        return given

    async def _admit(self, conv: Conversation, tracked: Tracked) -> None:
        """A session is continued only under the API key that created it. One made outside
        the proxy (``ctxd-cli``, an editor) and named by the client is claimed by the
        request's key."""
        if tracked.credential is None:
            info = await self._get(tracked.id)
            metadata = dict((info or {}).get("metadata") or {})
            metadata[META] = dict(metadata.get(META) or {}, credential=conv.credential)
            await self.link.request(tracked.id, "session/update", {"sessionId": tracked.id, "metadata": metadata})
            tracked.credential = conv.credential
        elif tracked.credential != conv.credential:
            log.warning("session %s: refused a request under another API key than the one that created it",
                        tracked.id)
            raise Refused(403, f"ctxd proxy: session {tracked.id} belongs to another API key; a session is "
                               "continued only under the key that created it (name another with X-Ctxd-Session)")

    # --- what a request does -----------------------------------------------------------

    def early(self, conv: Conversation, fmt: Api, body: dict[str, Any]) -> bool:
        """Whether the request may go upstream as the client sent it before its turn (push
        and prompt) runs, the turn then running while the upstream answers: its session's
        last prompt was the client's own conversation; this request only appends to it
        (nothing superseded, no fork, the same system prompt, reply limit, window and key;
        no assistant message of its own, whose goal markers or watermark call the push
        would apply; the previous reply's push stored, whose markers and usage may move
        the prompt or its budget); and what it appends cannot start a pass, outgrow the
        prompt's room or make the reply's limit lower: a message of ``b`` UTF-8 bytes is at
        most ``b`` tokens (each token is a byte at least; its framing is less than its
        JSON), which the session's ``appendRoom`` bounds. Decided in memory only: a session
        the proxy does not hold, or one another request is using, takes the usual path.
        The turn that follows says again whether the prompt is the client's (a warning is
        logged for one that was not; it went as the client would have sent it direct,
        within the window)."""
        if not self._watching or \
                (conv.explicit and conv.base_id not in self._aliases and conv.base_id not in self._tracked):
            return False
        tracked = self._tracked.get(self._aliases.get(conv.base_id, conv.base_id))
        if tracked is None:
            return False
        seen = tracked.verbatim
        if seen is None or seen.fmt != fmt or seen.window != conv.window or seen.room <= 0:
            return False
        if tracked.credential is None or tracked.credential != conv.credential:
            return False
        if tracked.lock.locked() or any(lock is not None and lock.locked() for lock in (
                self._locks.get(conv.base_id), self._locks.get(tracked.id.split("~", 1)[0]))):
            return False
        if tracked.pending is not None and not tracked.pending.task.done():
            # (The reply's push may change the prompt besides appending: its goal markers,
            # a watermark call, the provider's count its usage teaches; told once stored.)
            return False
        if (conv.parts.system_text or "") != (tracked.system or ""):
            return False  # (a dropped system prompt too: the session's stays in ctxd's prompt)
        if (conv.output is not None and conv.output != tracked.output) or \
                self.floor_for(tracked, conv.window) != tracked.floor:
            return False
        plan = tracked.plan(conv)
        if plan is None or not plan.extends or plan.superseded:
            return False
        if any(may_derive(conv.items[j][0]) for j in plan.new):
            return False  # (its goal markers or watermark call would change the prompt in the turn)
        grown = plan.matched_since(seen.entries) + plan.new
        bound = sum(len(msgspec.json.encode(conv.items[j][0])) for j in grown)  # (what is pushed, as counted)
        if bound > seen.room:
            return False
        if conv.output is not None:
            room = reply_room({"budget": seen.budget, "tokens": seen.tokens + bound}, body)
            if room is not None and room < conv.output:
                return False
        tracked.verbatim = None  # (this request's turn says it again)
        conv.early = (len(tracked.entries), tracked.entries[-1] if tracked.entries else None, plan)
        return True

    def verbatim(self, tracked: Tracked, conv: Conversation, fmt: Api, prompt: dict[str, Any], *,
                 as_sent: bool) -> None:
        """After a turn: whether its prompt was the client's conversation as sent, and how
        much room the session has to stay so (:meth:`early`)."""
        room = prompt.get("appendRoom")
        budget = prompt.get("budget")
        if as_sent and isinstance(room, int) and room > 0 and isinstance(budget, dict) \
                and isinstance(prompt.get("tokens"), int) and tracked.changes == conv.changes:
            tracked.verbatim = Verbatim(fmt, conv.window, len(tracked.entries), room, prompt["tokens"], budget)
        else:
            tracked.verbatim = None

    async def turn(self, conv: Conversation, fmt: Api) -> tuple[Tracked, list[str], dict[str, Any]]:
        """Make the session hold the client's conversation (push what it lacks, or fork)
        and get its prompt: the session, its chain then (what the reply extends) and the
        prompt. The last batch of new messages rides on ``context/prompt`` (``push``), so a
        turn is one daemon round trip."""
        if len(self._tracked) > self.TRACKED:
            self._forget_idle()
        base = await self._named(conv.base_id) if conv.explicit else conv.base_id
        async with self.lock(base):
            tracked: Tracked | None
            if base == conv.base_id and base not in self._aliases and base not in self._tracked and \
                    (conv.explicit or self._owner(conv) is None):
                # Not known here: most often a new session, so it is created without asking
                # first (one daemon round trip less); if it exists, the stored one is read.
                # (A short form ``_named`` found names a stored session: read at once.)
                tracked = await self._create(conv, base, {}, resolve=True)
            else:
                tracked = await self.resolve(base)
                if tracked is None and not conv.explicit:
                    tracked = self._owned(conv, base)
                if tracked is None:
                    tracked = await self._create(conv, base, {})
            await self._admit(conv, tracked)
            if tracked.id in self._tracked:  # (most recently used last)
                self._tracked[tracked.id] = self._tracked.pop(tracked.id)
            async with tracked.lock:
                await self._settle(tracked)
                plan = self._planned(conv, tracked)
                if plan is not None and plan.extends:
                    return tracked, *await self._push_and_prompt(conv, tracked, fmt, plan)
            # An earlier branch the request extends exactly is preferred to one it only
            # continues by superseding (a client back on the branch it left).
            earlier = await self._continued(conv, tracked, exactly=plan is not None)
            if earlier is not None:
                async with earlier.lock:
                    await self._settle(earlier)  # (checked again in the same hold as the push)
                    again = earlier.plan(conv)
                    if again is not None and (again.extends or plan is None):
                        return earlier, *await self._push_and_prompt(conv, earlier, fmt, again)
            if plan is not None:
                async with tracked.lock:
                    await self._settle(tracked)
                    plan = tracked.plan(conv)
                    if plan is not None:
                        return tracked, *await self._push_and_prompt(conv, tracked, fmt, plan)
            async with tracked.lock:
                live = [e.ident for e in tracked.entries if e.live]
                at = next((i for i, (a, b) in enumerate(zip(live, conv.idents)) if a != b.key),
                          min(len(live), len(conv.idents)))
                fork = await self._fork(conv, tracked, at)
                # (the replies it held stay anchors in the fork)
                plan = Plan(new=list(range(len(conv.items))), extends=True,
                            anchors={e.ident for e in tracked.entries if e.anchor})
                async with fork.lock:
                    return fork, *await self._push_and_prompt(conv, fork, fmt, plan)

    @staticmethod
    def _planned(conv: Conversation, tracked: Tracked) -> Plan | None:
        """:func:`match`, or the plan :meth:`early` made of the same entries."""
        seen, conv.early = conv.early, None
        entries = tracked.entries
        if seen is not None and seen[0] == len(entries) and seen[1] is (entries[-1] if entries else None):
            return seen[2]
        return tracked.plan(conv)

    def _note_newest(self, tracked: Tracked) -> None:
        """Remember a derived session's newest anchor (its last reply, as a rule), which a
        request continuing its conversation carries whatever else it changed."""
        if not tracked.id.startswith("proxy-"):
            return
        newest = next((e.ident for e in reversed(tracked.entries) if e.anchor and e.live), None)
        old = self._newest.pop(tracked.id, None)
        if old is not None and self._owners.get(old) == tracked.id:
            del self._owners[old]
        if newest is not None:
            self._newest[tracked.id] = newest
            self._owners[newest] = tracked.id

    def _owned(self, conv: Conversation, base: str) -> Tracked | None:
        """The session a request whose derived id is new continues all the same
        (:meth:`_owner`). Then the derived id names it."""
        tracked = self._owner(conv)
        if tracked is not None:
            log.info("session %s: continued by a request whose derived id is %s", tracked.id, base)
            self._aliases[base] = tracked.id
        return tracked

    def _owner(self, conv: Conversation) -> Tracked | None:
        """A session whose newest anchor the request carries and whose history it
        continues (the first user message, part of the derived id, is the client's own
        context in some agents: aider's repository map, which changes with the code)."""
        for ident in reversed(conv.idents):
            session_id = self._owners.get(ident.key)
            tracked = self._tracked.get(session_id) if session_id is not None else None
            if tracked is None or not tracked.id.startswith(f"proxy-{conv.api}-") or \
                    tracked.credential not in (None, conv.credential) or tracked.plan(conv) is None:
                continue
            return tracked
        return None

    def _forget_idle(self) -> None:
        """Forget the least recently used sessions (down to three quarters of
        :attr:`TRACKED`) that nothing is using: no request of their conversation running,
        no reply push in flight. (A forgotten one still in use elsewhere is harmless: what
        both copies push carries the same idempotency keys.)"""
        def idle(t: Tracked) -> bool:
            base = self._locks.get(t.id.split("~", 1)[0])
            return (t.pending is None or t.pending.task.done()) and not t.lock.locked() \
                and (base is None or not base.locked())

        excess = len(self._tracked) - self.TRACKED * 3 // 4
        for session_id in [sid for sid, t in self._tracked.items() if idle(t)][:max(0, excess)]:
            del self._tracked[session_id]
            newest = self._newest.pop(session_id, None)
            if newest is not None and self._owners.get(newest) == session_id:
                del self._owners[newest]
            root = session_id.split("~", 1)[0]
            for sid in [sid for sid in self._earlier if sid.split("~", 1)[0] == root]:
                if idle(self._earlier[sid]):
                    del self._earlier[sid]

    async def _continued(self, conv: Conversation, current: Tracked, *, exactly: bool = False) -> Tracked | None:
        """The newest earlier session of the conversation's line (the session its id
        names, then each fork that followed) whose messages the client's conversation
        starts with: a client back on a branch it left (its history as it was before an
        edit, another window of the same agent, a request named by ``X-Ctxd-Session``)
        continues that session instead of forking once more."""
        line = [conv.base_id]
        while line[-1] in self._aliases and len(line) < 1000:
            line.append(self._aliases[line[-1]])
        for session_id in reversed(line):
            if session_id == current.id:
                continue
            earlier = self._earlier.get(session_id)
            if earlier is None:
                info = await self._get(session_id)
                if info is None:
                    continue
                earlier = self._earlier[session_id] = await self._load(info)
            if earlier.credential is not None and earlier.credential != conv.credential:
                continue
            async with earlier.lock:
                await self._settle(earlier)
                plan = earlier.plan(conv)
                if plan is not None and (plan.extends or not exactly):
                    return earlier
        return None

    async def _push_and_prompt(self, conv: Conversation, tracked: Tracked, fmt: Api,
                               plan: Plan) -> tuple[list[str], dict[str, Any]]:
        # What the session is told besides the messages, only when it changed (so a turn
        # stays one round trip): a new system prompt, another reply limit (the budget
        # reserves it; a request without one leaves the session's as it is).
        changes: dict[str, Any] = {}
        if conv.parts.system_text and conv.parts.system_text != (tracked.system or ""):
            changes["systemPrompt"] = conv.parts.system_text
        if conv.output is not None and conv.output != tracked.output:
            changes["settings"] = {"outputTokens": conv.output}
        floor = self.floor_for(tracked, conv.window)
        if floor != tracked.floor:
            changes.setdefault("settings", {})["outputFloor"] = floor
        if changes:
            await self.link.request(tracked.id, "session/update", {"sessionId": tracked.id, **changes})
            tracked.system = changes.get("systemPrompt", tracked.system)
            if "outputTokens" in changes.get("settings", {}):
                log.debug("session %s: %d tokens reserved for the reply (was %s)", tracked.id, conv.output,
                          tracked.output)
                tracked.output = conv.output
            if "outputFloor" in changes.get("settings", {}):
                log.debug("session %s: the reply's reserve may be lent down to %s tokens", tracked.id, floor)
                tracked.floor = floor
        # The client's new messages, each keyed by the chain of identities in the order
        # pushed (a push repeated after a crash carries the same keys: stored once).
        stamped: list[tuple[dict[str, Any], Stored]] = []
        key = tracked.chain[-1] if tracked.chain else ""
        for j in plan.new:
            message, _, _ = conv.items[j]
            ident = conv.idents[j]
            key = chain_hash(key, [ident.key])
            entry = Stored(key, ident.key, ident.ids or ident.key in plan.anchors, ident.shape)
            stamped.append((self._stamped(message, entry), entry))
        supersede = [f"ctxd-proxy:{tracked.entries[i].key}" for i in plan.superseded]  # (their idempotency keys)
        conv.plan = plan
        conv.shapes, conv.anchors = stored_sides(tracked.entries, plan, conv.idents)
        # The client's own messages before its first anchor or reply (its fixed prefix:
        # Codex's leading user items, aider's read-only files) and after its newest (what it shows
        # the model now: aider's files and their acknowledgement, its reminder, its
        # request): kept verbatim, in their place, by the daemon while they are
        # (``context/prompt`` ``current``, applied after the push).
        # (A history of no anchors, one the proxy never saw answered: its assistant
        # messages bound the two instead, so that not all of it is "current". A fork's
        # anchors are the session's it leaves: ``Plan.anchors``.)
        if plan.extends:
            # A plain extension (Claude Code, Codex) names its prefix alone, which does not
            # change from turn to turn (nothing to write then): the messages before the
            # first anchor (none of them one), newest first; only they are read.
            first = next(compress(count(), conv.anchors), None)
            if first is None:
                first = next((j for j, (message, _, _) in enumerate(conv.items) if message.get("role") == "assistant"),
                             len(conv.items))
            pushed = dict(zip(plan.new, (entry.key for _, entry in stamped)))
            current = [f"ctxd-proxy:{pushed[j] if j in pushed else tracked.entries[plan.matched[j]].key}"
                       for j in range(first - 1, -1, -1)]
        else:
            anchored = list(compress(range(len(conv.anchors)), conv.anchors))
            spoken = [] if anchored else \
                [j for j, (message, _, _) in enumerate(conv.items) if message.get("role") == "assistant"]
            first = anchored[0] if anchored else spoken[0] if spoken else len(conv.items)
            newest = anchored[-1] if anchored else spoken[-1] if spoken else -1
            keys = {j: tracked.entries[i].key for j, i in plan.matched.items()}
            keys.update((j, entry.key) for j, (_, entry) in zip(plan.new, stamped))
            # In the order they are pinned while they fit: the newest turn first (from the
            # end, the newest anchor included: the newest tool result is never cut for the
            # rest), then the prefix, newest first.
            order = sorted(keys, reverse=True)
            tail = [j for j in order if j >= max(newest, 0) and (j == newest or not conv.anchors[j])]
            head = [j for j in order if j < first and not conv.anchors[j] and j not in tail]
            current = [f"ctxd-proxy:{keys[j]}" for j in tail + head]
        send_current = current != (tracked.current or []) or (tracked.current is None and current)
        while len(stamped) > PUSH_BATCH:  # a long history the session lacks: all but the last batch
            batch, stamped = stamped[:PUSH_BATCH], stamped[PUSH_BATCH:]
            await self.link.request(tracked.id, "session/push",
                                    {"sessionId": tracked.id, "messages": [m for m, _ in batch]})
            tracked.chain += [e.key for _, e in batch]
            tracked.entries += [e for _, e in batch]
        last = [m for m, _ in stamped]
        if last and tracked.last_seq is not None:
            tracked.expect.append(tracked.last_seq + len(last))
        conv.changes = tracked.changes  # (a change told while the prompt is made: not the client's)
        try:
            prompt = await self.prompt(tracked, fmt, push=last, supersede=supersede,
                                       current=current if send_current else None)
        except BaseException:
            if last or supersede or send_current:
                # Stored or not is unknown (the push may have committed before the prompt
                # failed): the chain is read again from history by the next request.
                self._tracked.pop(tracked.id, None)
                self._earlier.pop(tracked.id, None)
            raise
        tracked.live.retire(tracked.entries, plan.superseded)
        tracked.chain += [e.key for _, e in stamped]
        tracked.entries += [e for _, e in stamped]
        tracked.current = current
        self._note_newest(tracked)
        seq = prompt.get("lastSeq")
        tracked.last_seq = seq if isinstance(seq, int) else None
        tracked.expect.clear()
        conv.prompt_tokens = prompt.get("tokens")
        conv.prompt_window = (prompt.get("budget") or {}).get("contextWindow") or 0
        return list(tracked.chain), prompt

    def floor_for(self, tracked: Tracked, window: int | None = None) -> int | None:
        """``settings.outputFloor``: the configured floor (scaled to a small ``window``:
        :func:`reply_floor`), or 1.5x the session's longest reply so far (in steps of 512
        tokens: few updates), whichever is more; None when lending is off
        (``proxy.reply_floor_tokens = 0``)."""
        if self.reply_floor <= 0:
            return None
        learned = -(-(tracked.longest_reply * 3 // 2) // 512) * 512
        return max(reply_floor(self.reply_floor, window), learned)

    @staticmethod
    def _stamped(message: dict[str, Any], entry: Stored, usage: dict[str, int] | None = None) -> dict[str, Any]:
        out = dict(message)
        metadata = dict(out.pop("metadata", None) or {})
        hash_ = entry.key
        own: dict[str, Any] = {"hash": hash_, "id": entry.ident, "shape": entry.shape}
        if entry.anchor:
            own["anchor"] = True
        if "ctxdProxyUnkept" in metadata:
            own["unkept"] = metadata.pop("ctxdProxyUnkept")
        metadata[META] = own
        out["metadata"] = metadata
        out["idempotencyKey"] = f"ctxd-proxy:{hash_}"
        if usage:
            out["usage"] = usage
        return out

    async def prompt(self, tracked: Tracked, fmt: Api, *, push: list[dict[str, Any]] | None = None,
                     supersede: list[str] | None = None, current: list[str] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"sessionId": tracked.id, "format": "openai" if fmt == "responses" else fmt}
        if fmt == "anthropic":
            params["cacheControl"] = False  # the proxy places breakpoints (apis.py)
        if supersede:
            params["supersede"] = supersede
        if current is not None:
            params["current"] = current
        if push:
            params["push"] = push
        return await self.link.request(tracked.id, "context/prompt", params)

    async def push_reply(self, tracked: Tracked, chain_then: list[str], conv: Conversation,
                         messages: list[dict[str, Any]], usage: dict[str, int]) -> bool:
        """Push the upstream's reply, unless the session moved on meanwhile (another request
        of the conversation already pushed the client's copy of it). The usage goes on the
        last message pushed.

        The push is sent now and its answer is not waited for (the client gets its reply
        meanwhile): the next request of the session waits for it first (:meth:`_settle`),
        and if it failed, that request pushes the client's copy of the reply instead."""
        items = reply_items(conv.api, conv, messages)
        if not items:
            return False
        self._learn(conv, usage)
        if isinstance(usage.get("outputTokens"), int):
            tracked.longest_reply = max(tracked.longest_reply, usage["outputTokens"])
        async with tracked.lock:
            if tracked.chain != chain_then:
                log.info("session %s: the reply is not pushed, the session moved on meanwhile", tracked.id)
                return False
            chain = list(chain_then)
            stamped = []
            entries = []
            for n, (converted, ident) in enumerate(items):
                chain.append(chain_hash(chain[-1] if chain else "", [ident.key]))
                entries.append(Stored(chain[-1], ident.key, True, ident.shape))  # a reply: an anchor
                stamped.append(self._stamped(converted, entries[-1], usage if n == len(items) - 1 else None))
            if tracked.last_seq is not None:
                tracked.expect.append(tracked.last_seq + len(stamped))
            task = asyncio.get_running_loop().create_task(
                self.link.request(tracked.id, "session/push", {"sessionId": tracked.id, "messages": stamped}))
            tracked.chain = chain
            before = len(tracked.entries)
            tracked.entries += entries
            tracked.pending = Pending(task, list(chain_then), before)
            self._note_newest(tracked)
            self._pushing.add(task)
            task.add_done_callback(lambda done: self._pushed(tracked, done))
            return True

    def _pushed(self, tracked: Tracked, task: asyncio.Task[Any]) -> None:
        """A reply's push is answered: log a failure (the next request repairs the chain)."""
        self._pushing.discard(task)
        if task.cancelled() or task.exception() is not None:
            tracked.verbatim = None
            if not task.cancelled():
                log.warning("session %s: pushing the reply failed: %s; the client's copy is pushed with its "
                            "next request", tracked.id, task.exception())
            return
        seen, result = tracked.verbatim, task.result()
        if seen is not None:
            # The reply's usage may have moved the budget (the provider's ratio, the reply
            # reserve): the room is the push's, from where the conversation now ends.
            room, budget = result.get("appendRoom"), result.get("budget")
            if isinstance(room, int) and isinstance(budget, dict) and isinstance(budget.get("promptTokens"), int):
                tracked.verbatim = Verbatim(seen.fmt, seen.window, len(tracked.entries), room,
                                            budget["promptTokens"], budget)
            else:
                tracked.verbatim = None

    async def _settle(self, tracked: Tracked) -> None:
        """Wait for the reply push still in flight, if any; if it failed, the chain is
        what it was before it (the client's copy of the reply is then pushed as new)."""
        pending, tracked.pending = tracked.pending, None
        if pending is None:
            return
        try:
            await asyncio.shield(pending.task)
        except asyncio.CancelledError:
            if not pending.task.done():
                tracked.pending = pending  # this request was cancelled; the push goes on
                raise
            tracked.chain, tracked.entries = pending.before, tracked.entries[:pending.entries]
        except Exception:  # logged by _pushed
            tracked.chain, tracked.entries = pending.before, tracked.entries[:pending.entries]

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait for every reply push in flight (before the proxy closes its daemon link),
        ``timeout`` seconds at most: a daemon that stopped answering must not hold the
        proxy's exit (a reply not stored is pushed by the client's next request)."""
        if self._pushing:
            _, late = await asyncio.wait(set(self._pushing), timeout=timeout)
            if late:
                log.warning("%d reply pushes unanswered after %g s; not waiting for them", len(late), timeout)

    async def peek(self, conv: Conversation) -> tuple[Tracked | None, Plan | None]:
        """For count_tokens: the session as it is (nothing pushed, nothing created) and
        what the request would push to it (None: it disagrees)."""
        base = await self._named(conv.base_id) if conv.explicit else conv.base_id
        async with self.lock(base):
            tracked = await self.resolve(base)
            if tracked is None:
                return None, None
            if tracked.credential is not None and tracked.credential != conv.credential:
                raise Refused(403, f"ctxd proxy: session {tracked.id} belongs to another API key")
            async with tracked.lock:
                await self._settle(tracked)
            plan = tracked.plan(conv)
            if plan is None:
                earlier = await self._continued(conv, tracked)
                if earlier is None:
                    return tracked, None
                tracked, plan = earlier, earlier.plan(conv)
        return tracked, plan
