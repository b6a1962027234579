"""``goal/set``, ``goal/update``, ``goal/get`` handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxd.protocol.common import SessionRef
from ctxd.protocol.goal import GoalResult, GoalSetParams, GoalUpdateParams
from ctxd.server.handlers import handles
from ctxd.service import goals

if TYPE_CHECKING:
    from ctxd.server.app import Request


@handles("goal/set")
async def set_goal(req: Request, params: GoalSetParams) -> GoalResult:
    return await goals.set_goal(req.service, params)


@handles("goal/update")
async def update_goal(req: Request, params: GoalUpdateParams) -> GoalResult:
    return await goals.update_goal(req.service, params)


@handles("goal/get")
async def get_goal(req: Request, params: SessionRef) -> GoalResult:
    return await goals.get_goal(req.service, params.session_id)
