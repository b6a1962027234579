"""``context/compress``, ``context/checkpoints``, ``checkpoint/expand``,
``context/watermark``, ``message/pin`` handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxd.protocol.common import SessionRef
from ctxd.protocol.compression import (
    CheckpointRef,
    CheckpointsResult,
    CompressParams,
    CompressResult,
    ExpandResult,
    PinParams,
    PinResult,
    WatermarkParams,
    WatermarkResult,
)
from ctxd.server.handlers import handles
from ctxd.server.progress import WorkDoneProgress
from ctxd.service import controls

if TYPE_CHECKING:
    from ctxd.server.app import Request


@handles("context/compress")
async def compress(req: Request, params: CompressParams) -> CompressResult:
    progress = WorkDoneProgress(req.conn, params.work_done_token) if params.work_done_token is not None else None
    return await controls.compress(req.service, params, progress)


@handles("context/checkpoints")
async def checkpoints(req: Request, params: SessionRef) -> CheckpointsResult:
    return await controls.checkpoints(req.service, params.session_id)


@handles("checkpoint/expand")
async def expand(req: Request, params: CheckpointRef) -> ExpandResult:
    return await controls.expand(req.service, params)


@handles("context/watermark")
async def watermark(req: Request, params: WatermarkParams) -> WatermarkResult:
    return await controls.watermark(req.service, params)


@handles("message/pin")
async def pin(req: Request, params: PinParams) -> PinResult:
    return await controls.pin(req.service, params)
