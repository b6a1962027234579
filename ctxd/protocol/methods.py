"""The method and notification tables: the single list the server dispatches from,
``initialize`` advertises, and ``python -m ctxd.protocol.generate`` documents.

A notification the daemon sends is named by its params Struct: the service emits
``SessionUpdated(...)``, and :func:`notification_method` finds ``session/updated`` here.
Each such Struct belongs to exactly one notification (checked as the table is built).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxd.protocol import common, compression, context, goal, history, lifecycle, notifications, session, snapshot


@dataclass(frozen=True)
class MethodSpec:
    name: str
    params: Any
    result: Any
    doc: str
    params_optional: bool = False


@dataclass(frozen=True)
class NotificationSpec:
    name: str
    params: Any
    doc: str
    direction: str = "server->client"


METHODS: dict[str, MethodSpec] = {}
NOTIFICATIONS: dict[str, NotificationSpec] = {}
NOTIFICATION_METHODS: dict[type, str] = {}
"""The params Struct of each notification the daemon sends -> its method."""


def method(name: str, params: Any, result: Any, doc: str, params_optional: bool = False) -> None:
    METHODS[name] = MethodSpec(name, params, result, doc, params_optional)


def notification(name: str, params: Any, doc: str, direction: str = "server->client") -> None:
    NOTIFICATIONS[name] = NotificationSpec(name, params, doc, direction)
    if direction == "server->client":
        other = NOTIFICATION_METHODS.setdefault(params, name)
        if other != name:
            raise TypeError(f"{params.__name__} is the params of both {other} and {name}: a notification the "
                            f"daemon sends is named by its Struct, so each needs a Struct of its own")


def notification_method(params: Any) -> str:
    """The method of the notification whose params ``params`` is (a Struct instance)."""
    try:
        return NOTIFICATION_METHODS[type(params)]
    except KeyError:
        raise TypeError(f"{type(params).__name__} is not the params of a notification in "
                        f"ctxd.protocol.methods") from None


# --- lifecycle ---------------------------------------------------------------------
method("initialize", lifecycle.InitializeParams, lifecycle.InitializeResult,
       "First request of every connection. TCP connections must send `initializationOptions.token`.",
       params_optional=True)
method("shutdown", common.Empty, None,
       "Stop accepting requests on this connection; answer `exit` next.", params_optional=True)
method("daemon/status", common.Empty, lifecycle.DaemonStatusResult,
       "Process, storage and connection facts about the running daemon.", params_optional=True)
method("daemon/stop", common.Empty, None,
       "Stop the whole daemon after answering (every connection closes).", params_optional=True)
notification("initialized", common.Empty, "Client acknowledges `initialize`.", "client->server")
notification("exit", common.Empty, "Close this connection (only this one).", "client->server")
notification("$/cancelRequest", common.Empty,
             "Cancel request `id` in flight; it ends with -32800 unless it already took effect.",
             "client->server")

# --- sessions ----------------------------------------------------------------------
method("session/create", session.SessionCreateParams, session.SessionInfo,
       "Create a session; the server generates `sessionId` when absent.", params_optional=True)
method("session/list", session.SessionListParams, session.SessionListResult,
       "Sessions, most recently active first.", params_optional=True)
method("session/get", common.SessionRef, session.SessionInfo, "One session with its totals.")
method("session/delete", common.SessionRef, session.SessionDeleteResult,
       "Delete a session with its history and everything it owns.")
method("session/push", session.SessionPushParams, session.PushResult,
       "Append messages atomically; acknowledged only once committed to disk.")
method("session/update", session.SessionUpdateParams, session.SessionInfo,
       "Change title, tags, metadata, settings, context window or system prompt.")
method("session/subscribe", session.SubscribeParams, session.SubscribeResult,
       "Send this session's notifications to this connection (`*` for all sessions).")
method("session/unsubscribe", session.SubscribeParams, session.SubscribeResult,
       "Stop sending this session's notifications to this connection.")
notification("session/updated", notifications.SessionUpdated,
             "History or active context of a subscribed session changed.")
notification("session/deleted", notifications.SessionDeleted, "A subscribed session was deleted.")

# --- context -----------------------------------------------------------------------
method("context/prompt", context.PromptParams, context.PromptResult,
       "The prompt to send next, in the provider's wire shape, with its tokens and budget.")
method("context/stats", context.ContextStatsParams, context.ContextStatsResult,
       "Counts and token totals by role and kind, and counted-vs-reported drift.")
method("context/compress", compression.CompressParams, compression.CompressResult,
       "Compress now (like /compact); `focus` steers the summary; reports `$/progress` for a `workDoneToken`.")
method("context/checkpoints", common.SessionRef, compression.CheckpointsResult,
       "The checkpoints in the active context, oldest first.")
method("checkpoint/expand", compression.CheckpointRef, compression.ExpandResult,
       "The original messages a checkpoint stands for, from history.")
method("context/watermark", compression.WatermarkParams, compression.WatermarkResult,
       "Move the watermark forward to a tool call or message; tool blocks before it stop being sent.")
method("message/pin", compression.PinParams, compression.PinResult,
       "Pin (or unpin) a message: pinned messages are always sent verbatim.")
notification("context/compressing", compression.CompressingNotification,
             "A compression stage started (identification 0%, preparation 15%, summarization 25%, "
             "checkpoint 70%, update 80%, validation 90%, aging 95%).")
notification("context/compressed", compression.CompressedNotification,
             "A compression pass (or a watermark move) changed the active context.")
notification("context/compressionSkipped", compression.CompressionSkippedNotification,
             "The trigger was passed but compression may not run (automatic compression off, or "
             "the loop guard); sent once per reason.")
notification("context/compressionFailed", compression.CompressionFailedNotification,
             "A summarizer or a whole pass failed, and what was done instead.")
notification("checkpoint/created", compression.CheckpointCreatedNotification, "A checkpoint was created.")
notification("checkpoint/aged", compression.CheckpointAgedNotification,
             "An older checkpoint was re-compressed one level down.")
notification("checkpoint/merged", compression.CheckpointMergedNotification,
             "The two oldest checkpoints were merged into one.")
notification("context/threshold", compression.ThresholdNotification,
             "The conversation passed the trigger (warning) or the prompt neared its limit (critical).")
notification("context/overflow", compression.OverflowNotification,
             "What is never compressed no longer fits; the overflow policy is applied.")
notification("context/reliability", compression.ReliabilityNotification,
             "The reliability level changed (with what to do about it).")
notification("$/progress", compression.ProgressParams,
             "LSP progress of a request that carried a `workDoneToken`.")

# --- goals -------------------------------------------------------------------------
method("goal/set", goal.GoalSetParams, goal.GoalResult,
       "Start the session's goal (replacing any previous one).")
method("goal/update", goal.GoalUpdateParams, goal.GoalResult,
       "Update the active goal: status, milestones, decisions (lock/unlock), artifacts, next steps.")
method("goal/get", common.SessionRef, goal.GoalResult, "The session's goal, with its tokens.")

# --- snapshots ---------------------------------------------------------------------
method("snapshot/create", snapshot.SnapshotCreateParams, snapshot.SnapshotInfo,
       "Snapshot the active context now (a manual snapshot: kept until deleted).")
method("snapshot/list", common.SessionRef, snapshot.SnapshotListResult, "The session's snapshots, newest first.")
method("snapshot/get", snapshot.SnapshotRef, snapshot.SnapshotContent,
       "A snapshot's content: every user message, the other context messages, checkpoints, goal, watermark.")
method("snapshot/restore", snapshot.SnapshotRef, snapshot.SnapshotRestoreResult,
       "Make the snapshot's context the active one (after snapshotting the current one); history keeps "
       "everything, marking later messages rolled back.")
method("snapshot/delete", snapshot.SnapshotRef, snapshot.SnapshotDeleteResult, "Delete one snapshot.")
notification("snapshot/created", snapshot.SnapshotCreated, "A snapshot was taken (automatic or requested).")
notification("snapshot/restored", snapshot.SnapshotRestored, "The active context was restored from a snapshot.")
notification("snapshot/deleted", snapshot.SnapshotDeleted, "Snapshots were deleted (request, rolling cleanup, age).")
notification("snapshot/error", snapshot.SnapshotError, "A snapshot could not be written or restored.")

# --- history, search, export/import, retention -------------------------------------
method("session/history", history.HistoryParams, history.HistoryResult,
       "Page through the whole history (every message as pushed, with where it stands now), "
       "plus compressions and events on the first page.")
method("session/search", history.SearchParams, history.SearchResult,
       "Full-text search across all sessions (or one), ranked, with snippets.")
method("history/search", history.HistorySearchParams, history.SearchResult,
       "Search one session and get the original messages: recall what was summarized away.")
method("session/export", history.ExportParams, history.ExportResult,
       "The session as a document: json (everything), markdown (to read) or jsonl (OpenAI chat lines).")
method("session/import", history.ImportParams, history.ImportResult,
       "Create session(s) from a ctxd export or a transcript (Claude Code JSONL, OpenAI chat, agent logs).")
method("session/cleanup", history.CleanupParams, history.DeletedSessions,
       "Keep the `keep` most recently active sessions, delete the rest.")
method("session/clear", history.ClearParams, history.DeletedSessions, "Delete every session (`all: true`).")
