"""The MCP server's connection to the ctxd daemon, and which session a tool means.

One socket connection, opened on the first tool call (starting the daemon as
``ctxd-cli`` does when none answers) and reopened when the daemon went away. Every
daemon error becomes a :class:`ToolError` whose message the agent can act on.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError

from ctxd.client import Client, DaemonUnavailable, RpcError, connect_or_start
from ctxd.ids import LAST, match_ids

log = logging.getLogger("ctxd.mcp")

SESSION_ENV = "CTXD_SESSION"
"""The session a tool means when the agent does not name one (set by the agent's launcher)."""

CLIENT_NAME = "ctxd-mcp"
START_WAIT_SECONDS = 15.0

# Methods that change nothing: safe to send again after reconnecting.
_READS = frozenset({
    "session/list", "session/get", "session/history", "session/search", "history/search",
    "context/stats", "context/checkpoints", "checkpoint/expand", "goal/get", "snapshot/list",
    "snapshot/get", "daemon/status",
})

# ctxd's error codes (protocol/methods.md, "Errors").
SESSION_NOT_FOUND = -33001
CHECKPOINT_NOT_FOUND = -33013
MESSAGE_NOT_FOUND = -33014
SNAPSHOT_NOT_FOUND = -33020
INVALID_PARAMS = -32602


class NotFound(ToolError):
    """The session, message, checkpoint or snapshot named does not exist."""


@dataclass
class Resolved:
    """A session id and how it was chosen (said in every tool result)."""

    session_id: str
    how: str  # "given", "CTXD_SESSION", "most recently active"; with how a short form was read
    matched: bool = False
    """Whether ``session_id`` was found from what was given (a prefix, ``last``)."""

    def label(self) -> str:
        return f"session {self.session_id}" + ("" if self.how == "given" else f" ({self.how})")


class DaemonLink:
    def __init__(self, socket_path: Path, *, data_dir: str | None = None, config_file: str | None = None,
                 autostart: bool = True, default_session: str | None = None) -> None:
        self.socket_path = socket_path
        self.data_dir = data_dir
        self.config_file = config_file
        self.autostart = autostart
        self.default_session = default_session if default_session is not None else os.environ.get(SESSION_ENV)
        if self.default_session is not None and not self.default_session.strip():
            self.default_session = None
        self._client: Client | None = None
        self._lock = asyncio.Lock()

    # --- the connection -------------------------------------------------------------

    async def _connect(self) -> Client:
        async with self._lock:
            if self._client is not None:
                return self._client
            try:
                client = await Client.connect_unix(self.socket_path)
                await client.initialize(client_name=CLIENT_NAME, process_id=os.getpid())
            except DaemonUnavailable:
                if not self.autostart:
                    raise
                client = await self._start()
            except OSError as exc:
                raise DaemonUnavailable(f"cannot connect to {self.socket_path}: {exc.strerror or exc}") from None
            self._client = client
            return client

    async def _start(self) -> Client:
        try:
            return await connect_or_start(self.socket_path, data_dir=self.data_dir, config_file=self.config_file,
                                          client_name=CLIENT_NAME, wait_seconds=START_WAIT_SECONDS)
        except DaemonUnavailable as exc:
            # Two clients autostarting at once: the loser's daemon exits ("already
            # serving"); the winner is starting up, so wait for it.
            if "already serving" not in str(exc):
                raise
            loop = asyncio.get_running_loop()
            deadline = loop.time() + START_WAIT_SECONDS
            while loop.time() < deadline:
                await asyncio.sleep(0.1)
                try:
                    client = await Client.connect_unix(self.socket_path)
                except DaemonUnavailable:
                    continue
                await client.initialize(client_name=CLIENT_NAME, process_id=os.getpid())
                return client
            raise

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def raw_request(self, method: str, params: Any = None) -> Any:
        """The daemon's result; RpcError and DaemonUnavailable pass through."""
        for attempt in (1, 2):
            client = await self._connect()
            try:
                return await client.request(method, params)
            except DaemonUnavailable:
                # The daemon went away (stopped, restarted): reconnect next time. A read
                # is sent again at once; a change might have been applied, so it is not.
                if self._client is client:
                    self._client = None
                    await client.close(shutdown=False)
                if attempt == 2 or method not in _READS:
                    raise
        raise AssertionError("unreachable")

    async def request(self, method: str, params: Any = None, *, what: str | None = None) -> Any:
        """The daemon's result, or a ToolError the agent can read. ``what`` names the
        thing looked up (for not-found errors), e.g. "checkpoint ck-3 in session s1"."""
        try:
            return await self.raw_request(method, params)
        except RpcError as exc:
            raise tool_error(exc, what) from None
        except DaemonUnavailable as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: DaemonUnavailable) -> ToolError:
        then = ("the next call reconnects (starting it if needed)" if self.autostart else
                "the next call reconnects once it runs (ctxd mcp --no-autostart never starts one: "
                "`ctxd-cli daemon start` does)")
        return ToolError(f"the ctxd daemon is unreachable: {exc}. Check it with `ctxd-cli daemon status`; {then}.")

    # --- which session --------------------------------------------------------------

    async def session(self, session_id: str | None) -> Resolved:
        """The rule: the session named by the call; else ``$CTXD_SESSION`` (or ``ctxd mcp
        --session``); else the most recently active session."""
        if session_id is not None and session_id.strip():
            return Resolved(session_id.strip(), "given")
        if self.default_session is not None:
            return Resolved(self.default_session, SESSION_ENV)
        result = await self.request("session/list", {"limit": 1})
        sessions = result.get("sessions") or []
        if not sessions:
            raise NotFound("ctxd has no sessions yet: nothing to look at. (An agent's messages reach ctxd "
                           "through its client or proxy; `ctxd-cli sessions list` shows what is stored.)")
        return Resolved(sessions[0]["sessionId"], "most recently active")

    async def session_request(self, resolved: Resolved, method: str, params: dict[str, Any],
                              *, what: str | None = None) -> Any:
        """A request about one session; a missing session is named with how it was chosen.
        An id that names no session may be a short form of one, as ``ctxd-cli sessions
        list`` shows them (a unique prefix; ``last``): ``resolved`` then becomes that
        session, and the request is made for it."""
        try:
            return await self.raw_request(method, {"sessionId": resolved.session_id, **params})
        except RpcError as exc:
            if exc.code == SESSION_NOT_FOUND:
                if not resolved.matched and await self._match(resolved):
                    return await self.session_request(resolved, method, params, what=what)
                where = "" if resolved.how == "given" else f" (from {resolved.how})"
                raise NotFound(f"no session {resolved.session_id!r}{where}. The tool list_sessions "
                               "lists the sessions ctxd holds.") from None
            raise tool_error(exc, what) from None
        except DaemonUnavailable as exc:
            raise self._unreachable(exc) from None

    async def _match(self, resolved: Resolved) -> bool:
        """Make ``resolved`` the one session its id is a short form of (True), or leave it
        (False: none is); several are an error that names them."""
        given = resolved.session_id
        sessions = (await self.request("session/list")).get("sessions") or []
        resolved.matched = True
        if given == LAST:
            if not sessions:
                return False
            matches = [max(sessions, key=lambda x: x.get("lastActivity") or "")["sessionId"]]
            how = "most recently active"
        else:
            matches = match_ids(given, [x["sessionId"] for x in sessions])
            how = f"from {given!r}"
        if len(matches) > 1:
            shown = ", ".join(matches[:5]) + (f" and {len(matches) - 5} more" if len(matches) > 5 else "")
            raise ToolError(f"{given!r} is the start of {len(matches)} session ids ({shown}); give more of it")
        if not matches:
            return False
        resolved.session_id = matches[0]
        resolved.how = how if resolved.how == "given" else f"{resolved.how}, {how}"
        log.info("session %r is %s", given, matches[0])
        return True


def tool_error(exc: RpcError, what: str | None = None) -> ToolError:
    if exc.code in (SESSION_NOT_FOUND, CHECKPOINT_NOT_FOUND, MESSAGE_NOT_FOUND, SNAPSHOT_NOT_FOUND):
        return NotFound(f"not found: {what}" if what else exc.message)
    detail = exc.message
    if exc.code == INVALID_PARAMS and isinstance(exc.data, dict) and exc.data.get("field"):
        field = str(exc.data["field"])
        if field not in detail:
            detail += f" (field {field})"
    # The daemon speaks of its own methods; the agent knows the tools.
    detail = detail.replace("goal/set", "the tool set_goal")
    return ToolError(f"ctxd refused: {detail}")
