"""Error codes: JSON-RPC's own, LSP's lifecycle codes, and ctxd's application range.

ctxd's own codes live in -33000..-33099, outside the ranges JSON-RPC (-32768..-32000)
and LSP (-32899..-32800) reserve, so a client can tell "the protocol broke" from
"the request was understood and refused". Every error carries ``data`` with the
offending ``field`` (a JSON path into the params) where one applies.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ErrorCode(IntEnum):
    # JSON-RPC 2.0
    ParseError = -32700
    InvalidRequest = -32600
    MethodNotFound = -32601
    InvalidParams = -32602
    InternalError = -32603
    # LSP base protocol
    ServerNotInitialized = -32002
    UnknownErrorCode = -32001
    RequestCancelled = -32800
    # ctxd
    SessionNotFound = -33001
    SessionExists = -33002
    MessageTooLarge = -33003
    BatchTooLarge = -33004
    StorageError = -33005
    Unauthorized = -33006
    ContextOverflow = -33010
    CompressionFailed = -33011
    CompressionInProgress = -33012
    CheckpointNotFound = -33013
    MessageNotFound = -33014
    SnapshotNotFound = -33020
    SnapshotFailed = -33021
    ImportFailed = -33030
    BackendUnavailable = -33040


ERROR_DOCS: dict[ErrorCode, str] = {
    ErrorCode.ParseError: "The frame body is not valid JSON, or the frame header is malformed.",
    ErrorCode.InvalidRequest: "Not a JSON-RPC 2.0 request, a batch, or a request after `shutdown`.",
    ErrorCode.MethodNotFound: "No such method in this build (see `capabilities.methods`).",
    ErrorCode.InvalidParams: "Params do not match the method's schema; `data.field` names the path.",
    ErrorCode.InternalError: "A bug in ctxd; the daemon keeps serving.",
    ErrorCode.ServerNotInitialized: "A request other than `initialize` arrived before `initialize`.",
    ErrorCode.UnknownErrorCode: "Reserved by LSP; not sent by ctxd.",
    ErrorCode.RequestCancelled: "The request was cancelled with `$/cancelRequest` before it took effect.",
    ErrorCode.SessionNotFound: "No session with that id.",
    ErrorCode.SessionExists: "`session/create` with an id that already exists.",
    ErrorCode.MessageTooLarge: "One message of a push or an import is larger than `limits.max_message_bytes`; "
                               "`data` has the `size` and the `limit`.",
    ErrorCode.BatchTooLarge: "A push or an import carries more than `limits.max_batch_messages` messages; `data` "
                             "has the `count` and the `limit`.",
    ErrorCode.StorageError: "The database refused the write (nothing of the request was stored), or stored "
                            "data could not be read (`data.sessionId`; `ctxd-cli doctor` checks and recovers).",
    ErrorCode.Unauthorized: "TCP connection without the right `initializationOptions.token`.",
    ErrorCode.ContextOverflow: "The prompt cannot fit the window under the session's policy; `data` has the figures.",
    ErrorCode.CompressionFailed: "Every compression strategy failed; the active context is unchanged.",
    ErrorCode.CompressionInProgress: "A conflicting operation waits for a running compression.",
    ErrorCode.CheckpointNotFound: "No checkpoint with that id in the session.",
    ErrorCode.MessageNotFound: "No message with that sequence number in the session.",
    ErrorCode.SnapshotNotFound: "No snapshot with that id.",
    ErrorCode.SnapshotFailed: "The snapshot could not be written or restored; nothing changed.",
    ErrorCode.ImportFailed: "The document could not be imported; nothing was stored.",
    ErrorCode.BackendUnavailable: "The LLM backend could not be reached or answered badly.",
}


REQUEST_CANCELLED = "ctxd: request cancelled by its client"
"""What a request's task is cancelled with when its client cancels it or goes away
(``Task.cancel(msg=REQUEST_CANCELLED)``). A write of that request that already started
still commits and its result is returned, so the request is answered with what it did
(``store/db.py``). Any other cancellation (a background task being stopped, shutdown)
waits for a started write to commit and then propagates."""


class CtxdError(Exception):
    """An error a request ends with; the transport turns it into a JSON-RPC error."""

    def __init__(self, code: ErrorCode, message: str, data: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": int(self.code), "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out


class RpcError(Exception):
    """A request answered with an error, as its caller sees it: from the daemon over a
    socket (``ctxd.client``), or from the service in this process (``service/port.py``)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message
        self.data = data


def invalid_params(message: str, field: str | None = None, **extra: Any) -> CtxdError:
    data = {"field": field, **extra} if field is not None else (extra or None)
    return CtxdError(ErrorCode.InvalidParams, message, data)


def session_not_found(session_id: str) -> CtxdError:
    return CtxdError(
        ErrorCode.SessionNotFound,
        f"session {session_id!r} does not exist",
        {"field": "sessionId", "sessionId": session_id},
    )
