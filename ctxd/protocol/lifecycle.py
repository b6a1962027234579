"""Connection lifecycle: ``initialize``, ``shutdown`` and daemon control, LSP-shaped."""

from __future__ import annotations

from typing import Any

import msgspec


class ClientInfo(msgspec.Struct, rename="camel", omit_defaults=True):
    name: str
    version: str | None = None


class InitializationOptions(msgspec.Struct, rename="camel", omit_defaults=True):
    """ctxd-specific options of ``initialize``.

    ``token`` is required on TCP connections (read it from the daemon's token file).
    """

    token: str | None = None


class InitializeParams(msgspec.Struct, rename="camel", omit_defaults=True):
    """LSP ``InitializeParams``; ctxd reads ``processId``, ``clientInfo`` and its options.

    Other LSP fields (``capabilities``, ``rootUri``...) are accepted and ignored so an
    editor's stock LSP client can talk to ctxd unchanged.
    """

    process_id: int | None = None
    client_info: ClientInfo | None = None
    initialization_options: InitializationOptions | None = None
    capabilities: dict[str, Any] | None = None


class ServerInfo(msgspec.Struct):
    name: str
    version: str


class ServerCapabilities(msgspec.Struct, rename="camel"):
    """What this build supports: clients feature-detect with these lists."""

    methods: list[str]
    notifications: list[str]
    prompt_formats: list[str]
    protocol_version: str


class InitializeResult(msgspec.Struct, rename="camel"):
    server_info: ServerInfo
    capabilities: ServerCapabilities


class DaemonStatusResult(msgspec.Struct, rename="camel"):
    """``daemon/status``: enough for ``ctxd-cli daemon status`` and for health checks."""

    pid: int
    version: str
    started_at: str
    uptime_seconds: float
    data_dir: str
    database: str
    """The SQLite file, or the PostgreSQL URL (``storage.url``, which never carries a password)."""
    transports: list[str]
    connections: int
    sessions: int
    durability: str
    summarizer: str
