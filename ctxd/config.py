"""Configuration: embedded defaults < TOML file < ``CTXD_*`` environment < flags.

Every key is a field of a Struct below; docs/configuration.md is generated from them
(``python -m ctxd.config --markdown``) and a test checks it is current. The file is
``$XDG_CONFIG_HOME/ctxd/config.toml`` (or ``--config``/``CTXD_CONFIG``); a missing
file is not an error, a malformed one is, with the file and key named.

Environment variables are ``CTXD_<SECTION>_<KEY>`` in capitals, e.g.
``CTXD_STORAGE_DURABILITY=full``; flags use ``--set section.key=value``.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_type_hints

import msgspec
import platformdirs

APP = "ctxd"


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class DaemonConfig(_Section):
    """Where the daemon keeps its files and how it logs."""

    data_dir: str = ""
    """Directory of the database (and snapshots). Empty: the user data directory. One daemon at a
    time uses a SQLite database (``ctxd.db.lock``): another, on another socket, refuses to start
    and names the first one's pid and socket."""
    socket: str = ""
    """Unix socket path. Empty: ``$XDG_RUNTIME_DIR/ctxd/ctxd.sock`` or the user state directory."""
    token_file: str = ""
    """File holding the TCP token (created 0600 if missing). Empty: ``tcp-token`` in the state directory."""
    tcp_allow_unchecked: bool = False
    """``ctxd-cli --tcp`` and ``ctxd --remote tcp:`` send the token only to a server the kernel
    names as this user's (another user may listen on the port first). Where the kernel cannot
    say (not Linux, or a server on another machine), send it anyway; off: refuse."""
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    """Log level; ``-v`` raises it to info, ``-vv`` to debug."""
    log_file: str = ""
    """Log to this file instead of stderr."""
    idle_exit_seconds: float = 0
    """A socket daemon exits after this long without connections (0: never)."""
    autostart_idle_exit_seconds: float = 900
    """The same for a daemon ctxd-cli started on demand, because none answered (0: never)."""


class StorageConfig(_Section):
    """How hard ctxd works to keep an acknowledged message."""

    durability: Literal["normal", "full"] = "normal"
    """``normal``: a push is acknowledged once committed to the SQLite WAL; it survives the
    daemon being killed at any moment, but a power loss or OS crash may lose the last
    commits (never corrupt the file). ``full``: fsync on every commit; survives power loss
    too, at a cost measured in docs/performance.md."""
    busy_timeout_ms: int = 5000
    """How long a reader waits on a lock held by another process (e.g. ``ctxd-cli doctor``)."""
    url: str = ""
    """Where the data lives. Empty: ``ctxd.db`` in the data directory (SQLite); a path: that
    SQLite file; ``postgresql://user@host:port/dbname`` (or ``?host=/socket/dir``): a PostgreSQL
    database several daemons share (``pip install 'ctxd[postgres]'``; docs/deployment.md). The
    password never goes in the URL: it comes from ``PGPASSWORD``, ``~/.pgpass`` (libpq's
    conventions) or ``storage.password_file``, and is never logged."""
    password_file: str = ""
    """A file (mode 0600, ours) holding the PostgreSQL password on its first line."""
    pool_size: Annotated[int, msgspec.Meta(ge=2)] = 8
    """Most PostgreSQL connections one daemon opens for reads (plus one writer)."""

    def __post_init__(self) -> None:
        if self.url.startswith(("postgresql://", "postgres://")):
            from urllib.parse import urlsplit

            try:
                password = urlsplit(self.url).password
            except ValueError:
                raise ValueError("storage.url is not a valid URL") from None
            if password is not None or "password=" in self.url:
                raise ValueError("storage.url must not carry the password: use PGPASSWORD, ~/.pgpass or "
                                 "storage.password_file")


class LimitsConfig(_Section):
    """Bounds on what one request may carry."""

    max_message_bytes: int = 4 * 1024 * 1024
    """Largest single message (its JSON encoding) a push accepts."""
    max_batch_messages: int = 10_000
    """Most messages one ``session/push`` may carry, and one ``session/import`` (all the
    conversations of its document together); more is refused with the figures."""
    max_frame_bytes: int = 256 * 1024 * 1024
    """Largest JSON-RPC frame read; a larger Content-Length is skipped and answered with an error."""
    frame_stall_seconds: float = 5.0
    """A frame body that stops arriving for this long is treated as complete (and answered
    as malformed), so a client that sent a wrong Content-Length is not left waiting."""
    max_frame_bytes_before_initialize: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024
    """Largest frame read from a Unix-socket or TCP client before its ``initialize`` succeeded
    (the TCP token is checked there): a larger one is skipped and answered with an error, so a
    client that has not authenticated cannot make the daemon buffer or decode more."""
    initialize_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    """A Unix-socket or TCP client whose ``initialize`` has not succeeded this long after it
    connected is disconnected."""
    max_pending_connections: Annotated[int, msgspec.Meta(ge=1)] = 64
    """Unix-socket (and, counted apart, TCP: per uid, so another user fills only their own)
    connections that may wait for ``initialize`` at once; past it a new connection is closed
    as soon as it is accepted (another user's over TCP: held unread until
    ``initialize_timeout_seconds``, then closed, so that it cannot come back at once)."""


class BudgetConfig(_Section):
    """The dynamic budget: what a prompt may take of the window, and when to compress."""

    default_context_window: int = 8192
    """Window for a model ctxd does not know, when the session gives none."""
    usable_fraction: float = 0.85
    """Share of the window a prompt plus its reply may use with a local runtime or an unknown
    model (85%, which leaves a local runtime such as Ollama its headroom)."""
    hosted_usable_fraction: float = 1.0
    """The same for hosted APIs (provider openai/anthropic/google, or a gpt/o-series/claude/gemini
    model), whose windows are exact (usable context: the window minus the reserved output)."""
    reserved_output_cap: int = 32_000
    """Most tokens reserved for the reply when taken from the model's output limit (coding agents' 32k).
    A session's own ``settings.outputTokens`` (the client's ``max_tokens`` through ``ctxd
    proxy``) is reserved as given, up to a quarter of the window."""
    reserved_output_fraction: float = 0.125
    """Reply reservation as a share of the window for a model whose output limit is unknown."""
    safety_margin_fraction: float = 0.02
    """Extra headroom kept free of conversation, as a share of the window."""
    trigger_fraction: float = 1.0
    """Compress when the conversation passes this share of the available budget: all of it,
    when the window forces a pass (the checkpoint-ageing design said 80%; a conversation
    that fits was compressed at 97%, where a sliding window kept it whole; docs/decisions.md)."""


class CompressionConfig(_Section):
    """What is compressed, when, and how: pruning, the watermark, summary checkpoints."""

    auto: bool = True
    """Compress automatically when a session passes its trigger. ``false`` is always honoured:
    then only ``context/compress`` compresses, and a prompt that does not fit is an error."""
    strategy: Literal["summarize", "truncate"] = "summarize"
    """``summarize`` older turns into checkpoints, or ``truncate`` them (a checkpoint that only
    says what was left out; history keeps everything either way)."""
    overflow_policy: Literal["fold", "error"] = "fold"
    """When what is never compressed no longer fits: ``fold`` the oldest user messages into a
    checkpoint that keeps their words as far as the budget allows, or answer ``context/prompt``
    with an error carrying the figures."""
    keep_recent: int = 5
    """Newest messages never summarized (a floor: a pass summarizes only as much as it must)."""
    cached_keep_recent: int = 1
    """The same where the provider caches prompts: only the newest message (with its tool
    call's other half) is sure to stay; what a pass keeps beyond what it must, the next one
    rewrites (docs/decisions.md, "Compression that pays")."""
    low_water_fraction: float = 0.87
    """A compression takes the oldest part of the conversation just far enough to leave it at
    this share of the available budget, and no further: a little more than one loop guard's
    step below the trigger (passes 13% of the conversation apart, not the guard's 10%: the
    same quality, a third fewer passes; docs/decisions.md)."""
    cached_low_water_fraction: float = 0.4
    """The same for a session whose provider caches prompts (``[billing]``): each pass bills
    the conversation it leaves again as new input, so passes go deeper and come seldom
    (docs/decisions.md, "Compression that pays")."""
    cached_fold_floor: float = 0.25
    """Where the provider caches, a fold of the user's words past ``user_share`` goes as deep
    as the pass's low-water mark asks, down to this share of ``user_share`` (elsewhere to
    half of it): each fold rewrites the prompt from the oldest word it moves, and the
    next comes once the words fill their share again (docs/decisions.md, "Compression
    that pays")."""
    min_growth_fraction: float = 0.10
    """Automatic compression waits until the conversation grew by this share of the available
    budget since the last one (no compaction loops)."""
    cached_pass_interval: int = 15
    """Where the provider caches, a pass leaves room for this many requests of the session's
    growth, shortening the older summaries (down to 5% of the largest prompt) when the user's
    words and the newest turns leave less: a session growing by a few percent of the window a
    request otherwise compresses every few requests, each pass rewriting the prompt. More than
    ten (a pass on at most 10% of requests): growth is a mean, and one large tool output brings
    the next pass early (docs/decisions.md, "Compression that pays"); 0: no such room."""
    prune_minimum: int = 20_000
    """Tool-output pruning needs at least this many tokens of tool output (layer 1 of three-layer compaction)..."""
    prune_protect: int = 40_000
    """...and protects the newest this many tokens of it."""
    prune_minimum_fraction: float = 0.25
    """For small windows the minimum is at most this share of the available budget."""
    prune_protect_fraction: float = 0.5
    """For small windows the protected share is at most this share of the available budget."""
    protected_tools: list[str] = []
    """Tools whose outputs are never pruned."""
    watermark_tools: list[str] = msgspec.field(
        default_factory=lambda: ["compress_to_checkpoint", "deactivate_augments"])
    """Tool calls that set the watermark (stateful watermarking); ``mcp__x__name`` matches ``name``."""
    max_checkpoints: int = 4
    """More summary checkpoints than this and the two oldest merge into one."""
    fold_share: float = 0.12
    """Folded user words may take at most this share of the largest prompt (the rest of the
    older conversation's room goes to the summaries, which pick the other speakers' turns)."""
    checkpoint_share: float = 0.25
    """Summary checkpoints age one level (oldest first) only when together they take more than
    this share of the largest prompt; more than ``max_checkpoints`` of them still merge."""
    user_share: float = 0.5
    """User messages stay verbatim while they take at most this share of the largest prompt;
    past it the overflow policy folds the oldest."""
    working_share: float = 0.12
    """An agent's working set (the newest read of each file its tool calls read, with the
    call) stays verbatim while it takes at most this share of the largest prompt, with the
    other pins, after the newest turn and the user's words; 0 keeps none."""


class SummarizerConfig(_Section):
    """Who writes checkpoint summaries. The embedded default needs no model."""

    backend: Literal["extractive", "ollama", "openai", "anthropic"] = "extractive"
    """``extractive`` (offline, deterministic), or an LLM behind Ollama, an OpenAI-compatible
    server (OpenAI, vLLM, llama.cpp, LM Studio) or Anthropic; the extractive summarizer stays
    the fallback when the LLM fails, is too slow, or answers garbage."""
    model: str = ""
    """The summarizer model (a cheaper one than the session's, say); empty: the session's model."""
    base_url: str = ""
    """Server address; empty: the backend's usual one."""
    api_key_env: str = ""
    """Environment variable holding the API key; empty: ``OPENAI_API_KEY``/``ANTHROPIC_API_KEY``;
    ``none``: send no key."""
    api_key_file: str = ""
    """File holding the API key (must not be readable by others); never logged."""
    timeout_seconds: float = 60.0
    """One request to the backend."""
    max_retries: int = 2
    """Retries with backoff after connection errors, timeouts, 429 and 5xx."""
    context_window: int = 0
    """The summarizer model's own window; 0: ask the server. Larger inputs are summarized in chunks."""
    chain_timeout_seconds: float = 120.0
    """All of one LLM summary (chunks included); past it the extractive summarizer takes over."""
    cooldown_seconds: float = 60.0
    """After the backend timed out or failed, summaries are extractive for this long
    before it is tried again (one dead server never costs a timeout per summary); 0: try
    it every time."""
    query_model_info: bool = True
    """Ask the backend for a session model's window and size when the session does not say."""
    model_info_timeout_seconds: float = 5.0
    """How long ``session/create`` waits for that answer (retries included); past it the session
    takes its window from ``[models]`` or the built-in table, and the backend is not asked again
    for ``cooldown_seconds``."""
    max_response_bytes: int = 4 * 1024 * 1024
    """Largest answer read from the backend (a summary, a model list); a longer one is cut off
    and counts as a failed summary, so the extractive summarizer takes over."""


class SnapshotsConfig(_Section):
    """Rollback points of the active context."""

    auto: bool = True
    """Take snapshots automatically (at the threshold, and before a compression)."""
    auto_threshold: float = 0.85
    """Snapshot when the prompt reaches this share of the largest prompt that may be sent."""
    before_compression: bool = True
    """Snapshot before a compression pass when anything changed since the last snapshot,
    so every compression can be undone."""
    keep: int = 5
    """Automatic snapshots kept per session (newest); manual ones are kept until deleted."""
    max_age_days: float = 0
    """Delete snapshots older than this (0: never by age)."""


class SessionsConfig(_Section):
    """Retention of whole sessions. Nothing is removed unless a limit is set here; every
    removal is announced (``session/deleted`` with its reason, a WARNING log line, a count
    under ``ctxd-cli sessions list``, and a line from ``ctxd-cli push --create``)."""

    max_sessions: int = 0
    """Keep this many sessions, removing the least recently active beyond it, when a session is
    created or imported and at startup (0: keep all)."""
    max_age_days: float = 0
    """Remove sessions without activity (a push) for this many days, checked at the same times
    (0: never by age)."""


class ModelsConfig(_Section):
    """Per-model facts that override ctxd's built-in table."""

    context_windows: dict[str, int] = {}
    """Model name (or prefix) to context window, e.g. ``{"llama3.2" = 8192}``."""
    output_limits: dict[str, int] = {}
    """Model name (or prefix) to its maximum output tokens."""


class ProviderBilling(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One provider's prompt cache and input price (``[billing.providers.NAME]``)."""

    cache: Literal["none", "automatic", "breakpoints"] = "none"
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] = 1024
    step: Annotated[int, msgspec.Meta(ge=1)] = 1
    read: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    write: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    ttl_seconds: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    max_breakpoints: Annotated[int, msgspec.Meta(ge=0)] = 0
    input_price: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class ModelBilling(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A model's exceptions to its provider's billing (``[billing.models."PREFIX"]``)."""

    provider: str | None = None
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    read: Annotated[float, msgspec.Meta(ge=0)] | None = None
    write: Annotated[float, msgspec.Meta(ge=0)] | None = None
    input_price: Annotated[float, msgspec.Meta(ge=0)] | None = None


def _default_providers() -> dict[str, ProviderBilling]:
    # Public list prices and cache rules (2025): Anthropic's prompt caching (5-minute entries,
    # writes 1.25x, reads 0.1x, 4 breakpoints, 1,024 tokens at least for Sonnet and Opus),
    # OpenAI's automatic prefix caching (from 1,024 tokens in steps of 128; the GPT-5 family
    # reads at 0.1x, older models in [billing.models]), DeepSeek's context caching (64-token
    # units, hits 0.1x, kept for hours); local servers bill nothing and cache nothing ctxd counts.
    return {
        "anthropic": ProviderBilling(cache="breakpoints", min_tokens=1024, read=0.1, write=1.25, ttl_seconds=300,
                                     max_breakpoints=4, input_price=3.0),
        "openai": ProviderBilling(cache="automatic", min_tokens=1024, step=128, read=0.1, ttl_seconds=300,
                                  input_price=1.25),
        "deepseek": ProviderBilling(cache="automatic", min_tokens=64, step=64, read=0.1, ttl_seconds=3600,
                                    input_price=0.28),
        "ollama": ProviderBilling(),
        "local": ProviderBilling(),
    }


def _default_models() -> dict[str, ModelBilling]:
    return {
        "gpt-4o": ModelBilling(read=0.5, input_price=2.5),
        "gpt-4.1": ModelBilling(read=0.25, input_price=2.0),
        "gpt-5-mini": ModelBilling(input_price=0.25),
        "o3": ModelBilling(read=0.25, input_price=2.0),
        "o4-mini": ModelBilling(read=0.25, input_price=1.1),
        "claude-opus-4-5": ModelBilling(min_tokens=4096, input_price=5.0),
        "claude-opus-4": ModelBilling(input_price=15.0),
        "claude-haiku-4-5": ModelBilling(min_tokens=4096, input_price=1.0),
        "claude-3-5-haiku": ModelBilling(min_tokens=2048, input_price=0.8),
        "claude-3-haiku": ModelBilling(min_tokens=2048, input_price=0.25),
        "deepseek": ModelBilling(provider="deepseek"),
    }


class BillingConfig(_Section):
    """What providers bill for a prompt and how they cache it: what ``context/stats``,
    ``ctxd-cli stats`` and the proxy's ``X-Ctxd-Bill*`` headers report, and what decides
    when compression pays (docs/decisions.md, "Compression that pays"). A session's rules
    are its model's entry on top of its provider's (a session without a provider is
    matched by its model's name); a provider not in the table caches nothing and has no
    price. Prices are USD per million uncached input tokens (0: unknown)."""

    providers: dict[str, ProviderBilling] = msgspec.field(default_factory=_default_providers)
    """Provider name (a session's ``provider``) to its cache rules and input price."""
    models: dict[str, ModelBilling] = msgspec.field(default_factory=_default_models)
    """Model name prefix to its exceptions (longest prefix wins)."""


class ProxyConfig(_Section):
    """``ctxd proxy``: an HTTP proxy on 127.0.0.1 for agents that speak the OpenAI, Anthropic
    or Ollama API (see docs/proxy.md). Client credentials are forwarded, never stored."""

    port: int = 8788
    """Port on 127.0.0.1 (``ctxd proxy --port``; 0: any free port, printed at startup)."""
    openai_base_url: str = "https://api.openai.com/v1"
    """Upstream of ``/v1/chat/completions`` and other OpenAI paths (``/v1`` included)."""
    anthropic_base_url: str = "https://api.anthropic.com"
    """Upstream of ``/v1/messages`` and requests carrying ``anthropic-version``."""
    ollama_base_url: str = "http://127.0.0.1:11434"
    """Upstream of ``/api/chat`` and the other ``/api/*`` paths."""
    context_window: Annotated[int, msgspec.Meta(ge=0)] | dict[str, Annotated[int, msgspec.Meta(ge=0)]] = 0
    """Window of the sessions the proxy creates: one number for every model, or a table by
    model, ``{"claude-sonnet-4*" = 48000, "gpt-5-mini" = 0}`` (a model name, or a pattern
    with ``*``/``?``; an exact name first, else the longest matching pattern; 0: the model's
    own window). With a table, a model with no entry is passed through unmanaged (no
    session) while its request fits the model's own window. 0: every model at its own
    window. The request's ``X-Ctxd-Context-Window`` or Ollama ``options.num_ctx`` come
    first; a model's own window is ctxd's rule (``[models]``, the model table, the default)."""
    reply_floor_tokens: Annotated[int, msgspec.Meta(ge=0)] = 4096
    """The least a reply keeps when the newest turn (the tool output the model must read
    now) cannot be sent whole beside the client's ``max_tokens``: the reserve lends it what
    makes it whole, down to this (at most an eighth of the session's window, at least
    1,024) or 1.5x the session's longest reply so far, whichever is more, and the request
    goes upstream with ``max_tokens`` lowered to what the window
    leaves (``X-Ctxd-Reply-Limit`` says so). 0: never lent."""
    connect_timeout_seconds: float = 10
    """Connecting to an upstream."""
    upstream_timeout_seconds: float = 600
    """Longest wait for the next bytes of an upstream answer; then the client gets a 504."""
    daemon_connections: int = 4
    """Connections to the ctxd daemon (sessions are spread over them; one session keeps one)."""
    in_process: bool = True
    """When no daemon answers on the socket, serve one inside the proxy's process (its
    socket too, for ctxd-cli, editors and ``ctxd mcp``; it stops with the proxy) instead
    of starting one apart: a turn then costs no socket round trip (``--separate-daemon``:
    false). A daemon already running is always used as it is."""
    allow_unchecked: bool = False
    """Where the kernel cannot tell which user a connection comes from (no sock_diag or
    ``/proc/net/tcp``: not Linux), serve anyway: then every local user can use the proxy,
    and through it the sessions' histories. Off: the proxy refuses to start there."""
    allowed_hosts: list[str] = []
    """Host names the proxy answers to besides the loopback ones (``localhost``, 127.0.0.0/8,
    ``[::1]``), e.g. a name of this machine in ``/etc/hosts``; ``"*"``: any. A request for
    another ``Host`` (a web page's, through DNS rebinding) gets a 403."""
    allowed_origins: list[str] = []
    """Web pages that may use the proxy from the owner's browser, as origins
    (``"http://localhost:3000"``); ``"*"``: any page. Empty: a request carrying an
    ``Origin`` gets a 403 and a CORS preflight is refused; a page on a loopback address is
    no exception (any local user can serve one)."""
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024 * 1024
    """Largest request body: a larger ``Content-Length`` gets a 413 before any of the body
    is read; a body without one is cut off with a 413 once it passes this."""
    client_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    """A client's request head must be whole within this long of the connection's
    opening (or of its previous answer), and a request body may pause no longer than
    this; then the connection is closed. Another user's connection gets this long for
    its 403."""


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    daemon: DaemonConfig = msgspec.field(default_factory=DaemonConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    budget: BudgetConfig = msgspec.field(default_factory=BudgetConfig)
    compression: CompressionConfig = msgspec.field(default_factory=CompressionConfig)
    summarizer: SummarizerConfig = msgspec.field(default_factory=SummarizerConfig)
    snapshots: SnapshotsConfig = msgspec.field(default_factory=SnapshotsConfig)
    sessions: SessionsConfig = msgspec.field(default_factory=SessionsConfig)
    models: ModelsConfig = msgspec.field(default_factory=ModelsConfig)
    billing: BillingConfig = msgspec.field(default_factory=BillingConfig)
    proxy: ProxyConfig = msgspec.field(default_factory=ProxyConfig)

    # --- resolved paths ------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return Path(self.daemon.data_dir or platformdirs.user_data_dir(APP)).expanduser()

    @property
    def database_path(self) -> Path:
        """The SQLite file (``storage.url`` when it is a path)."""
        url = self.storage.url
        if url and not url.startswith(("postgresql://", "postgres://")):
            return Path(url).expanduser()
        return self.data_dir / "ctxd.db"

    @property
    def database(self) -> str:
        """Where the data lives, as ``daemon/status`` reports it: the PostgreSQL URL (which
        never carries a password) or the SQLite file."""
        url = self.storage.url
        return url if url.startswith(("postgresql://", "postgres://")) else str(self.database_path)

    @property
    def socket_path(self) -> Path:
        return Path(self.daemon.socket).expanduser() if self.daemon.socket else default_socket_path()

    @property
    def token_path(self) -> Path:
        if self.daemon.token_file:
            return Path(self.daemon.token_file).expanduser()
        return state_dir() / "tcp-token"


class ConfigError(Exception):
    """A configuration value is wrong; the message names where it came from."""


def state_dir() -> Path:
    return Path(platformdirs.user_state_dir(APP))


def default_socket_path() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / APP / "ctxd.sock"
    return state_dir() / "ctxd.sock"


def default_config_file() -> Path:
    return Path(platformdirs.user_config_dir(APP)) / "config.toml"


def _sections() -> dict[str, type[_Section]]:
    return {name: tp for name, tp in get_type_hints(Config).items()}


def _merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _coerce(section: str, key: str, raw: str, source: str) -> Any:
    """Turn an environment/flag string into the key's type."""
    sections = _sections()
    if section not in sections:
        raise ConfigError(f"{source}: unknown section {section!r} (known: {', '.join(sections)})")
    hints = get_type_hints(sections[section])
    if key not in hints:
        raise ConfigError(f"{source}: unknown key {section}.{key}")
    tp = hints[key]
    origin = getattr(tp, "__origin__", None)
    if origin is Union and raw.lstrip().startswith(("{", "[")):
        origin = dict  # a union with a table (``proxy.context_window``), given as JSON
    try:
        if origin in (dict, list):
            return msgspec.json.decode(raw.encode(), type=tp)
        return msgspec.convert(raw, type=tp, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {section}.{key}={raw!r}: {exc}") from None


def env_overrides(environ: dict[str, str] | None = None) -> dict[str, Any]:
    environ = dict(os.environ if environ is None else environ)
    out: dict[str, dict[str, Any]] = {}
    for section, tp in _sections().items():
        for key in get_type_hints(tp):
            name = f"CTXD_{section}_{key}".upper()
            if name in environ:
                out.setdefault(section, {})[key] = _coerce(section, key, environ[name], name)
    return out


def parse_assignment(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` from a ``--set`` flag."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    path, raw = text.split("=", 1)
    section, key = path.strip().split(".", 1)
    return section, key, _coerce(section, key, raw, f"--set {path}")


def load_config(
    path: str | Path | None = None,
    *,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Build the effective configuration; raises ConfigError naming the culprit."""
    env = dict(os.environ if environ is None else environ)
    explicit = path or env.get("CTXD_CONFIG")
    file = Path(explicit).expanduser() if explicit else default_config_file()
    data: dict[str, Any] = {}
    try:
        exists = file.exists()
    except OSError as exc:  # a directory on the way we may not search
        raise ConfigError(f"{file}: {exc.strerror}") from None
    if exists:
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{file}: {exc.strerror}") from None
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{file}: {exc}") from None
    elif explicit:
        raise ConfigError(f"{file}: configuration file not found")
    data = _merge(data, env_overrides(env))
    if overrides:
        data = _merge(data, overrides)
    # The billing tables are merged onto their defaults entry by entry and key by key: a
    # file that changes one price keeps every other provider's rules.
    billing = data.get("billing")
    if isinstance(billing, dict):
        data["billing"] = _merge(msgspec.to_builtins(BillingConfig()), billing)
    try:
        return msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{file if file.exists() else 'configuration'}: {exc}") from None


def _markdown() -> str:
    """docs/configuration.md, generated from the Structs' fields and docstrings."""
    import ast
    import inspect
    import textwrap

    lines = [
        "# Configuration",
        "",
        "<!-- generated by `python -m ctxd.config --markdown`; a test fails when it drifts -->",
        "",
        "Precedence, lowest first: embedded defaults, the TOML file, `CTXD_*` environment",
        "variables, command-line flags. The file is `$XDG_CONFIG_HOME/ctxd/config.toml`",
        "(`~/.config/ctxd/config.toml`), or the path in `--config` / `CTXD_CONFIG`.",
        "Environment variables are `CTXD_<SECTION>_<KEY>` in capitals (dict values as JSON);",
        "flags are `--set section.key=value`, plus the shortcuts `ctxd --help` lists.",
        "",
    ]
    for section, tp in _sections().items():
        tree = ast.parse(textwrap.dedent(inspect.getsource(tp)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        docs: dict[str, str] = {}
        for node, nxt in zip(body, body[1:] + [None]):
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[node.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[union-attr]
        lines += [f"## [{section}]", "", inspect.getdoc(tp) or "", "",
                  "| key | default | environment | meaning |", "|---|---|---|---|"]
        default = tp()
        for key in get_type_hints(tp):
            value = getattr(default, key)
            shown = msgspec.json.encode(value).decode() if not isinstance(value, str) else f'"{value}"'
            env = f"CTXD_{section}_{key}".upper()
            lines.append(f"| `{key}` | `{shown}` | `{env}` | {docs.get(key, '')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(_markdown())
    else:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(load_config()), indent=2).decode() + "\n")
