"""Layer 2: watermark filtering of tool blocks (stateful watermarking, as nisaba's proxy does).

A checkpoint tool call (``compress_to_checkpoint``, ``deactivate_augments``, or any
configured name, MCP prefixes included) or an explicit ``context/watermark`` request
sets the watermark. Before it, tool_use/tool_result blocks (and OpenAI tool calls and
tool messages) are not sent; conversational text is; messages left empty are dropped.
At and after it, everything is sent unchanged. The watermark only moves forward and
is stored with the session, so it survives restarts (the persistence that
design wished for).
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxd.engine.context import ActiveContext, Entry


@dataclass(frozen=True)
class WatermarkMove:
    seq: int
    tool_use_id: str | None
    blocks: int
    """Tool blocks that stop being sent."""


def is_checkpoint_tool(name: str, names: tuple[str, ...]) -> bool:
    """``deactivate_augments`` also matches ``mcp__nisaba__deactivate_augments``."""
    return any(name == n or name.endswith("__" + n) for n in names)


def find_checkpoint_call(entries: list[Entry], names: tuple[str, ...], after_seq: int) -> tuple[int, str] | None:
    """The newest checkpoint tool call after ``after_seq`` in ``entries``: (seq, id)."""
    found = None
    for entry in entries:
        if entry.seq <= after_seq or not entry.call_ids:
            continue
        for call_id, name in zip(entry.call_ids, entry.call_names):
            if is_checkpoint_tool(name, names):
                found = (entry.seq, call_id)
    return found


def _blocks_before(ctx: ActiveContext, old: int, new: int) -> int:
    return sum(len(e.call_ids) + len(e.result_ids) for e in ctx.recent if old <= e.seq < new)


def plan_watermark(ctx: ActiveContext, *, tool_use_id: str | None = None,
                   seq: int | None = None) -> WatermarkMove | str:
    """Where the watermark would go, or why it cannot (a string, nothing changes)."""
    current = ctx.state.watermark_seq
    if tool_use_id is not None:
        target = next((e for e in ctx.recent if tool_use_id in e.call_ids), None)
        if target is None:
            if any(tool_use_id in e.call_ids for e in ctx.kept):
                return f"tool call {tool_use_id!r} is already behind the compression boundary"
            return f"tool call {tool_use_id!r} was not found in the active context"
        new_seq = target.seq
    elif seq is not None:
        if not any(e.seq == seq for e in ctx.recent):
            return f"message {seq} is not in the active context"
        new_seq = seq
    else:
        return "give toolUseId or seq"
    if new_seq <= current:
        return f"the watermark is already at message {current}; it only moves forward"
    return WatermarkMove(new_seq, tool_use_id, _blocks_before(ctx, max(current, 0), new_seq))


def apply_watermark(ctx: ActiveContext, move: WatermarkMove) -> None:
    ctx.state.watermark_seq = move.seq
    ctx.state.watermark_tool_use_id = move.tool_use_id
