"""``context/*`` handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxd.protocol.context import ContextStatsParams, ContextStatsResult, PromptParams, PromptResult
from ctxd.server.handlers import handles
from ctxd.service import prompt as prompt_service
from ctxd.service import stats as stats_service

if TYPE_CHECKING:
    from ctxd.server.app import Request


@handles("context/prompt")
async def prompt(req: Request, params: PromptParams) -> PromptResult:
    return await prompt_service.prompt_for_wire(req.service, params)


@handles("context/stats")
async def stats(req: Request, params: ContextStatsParams) -> ContextStatsResult:
    return await stats_service.stats(req.service, params.session_id, params.format)
