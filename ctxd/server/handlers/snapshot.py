"""``snapshot/*`` handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxd.protocol.common import SessionRef
from ctxd.protocol.snapshot import (
    SnapshotContent,
    SnapshotCreateParams,
    SnapshotDeleteResult,
    SnapshotInfo,
    SnapshotListResult,
    SnapshotRef,
    SnapshotRestoreResult,
)
from ctxd.server.handlers import handles
from ctxd.service import snapshots

if TYPE_CHECKING:
    from ctxd.server.app import Request


@handles("snapshot/create")
async def create(req: Request, params: SnapshotCreateParams) -> SnapshotInfo:
    return await snapshots.create(req.service, params)


@handles("snapshot/list")
async def list_(req: Request, params: SessionRef) -> SnapshotListResult:
    return await snapshots.list_snapshots(req.service, params.session_id)


@handles("snapshot/get")
async def get(req: Request, params: SnapshotRef) -> SnapshotContent:
    return await snapshots.get(req.service, params)


@handles("snapshot/restore")
async def restore(req: Request, params: SnapshotRef) -> SnapshotRestoreResult:
    return await snapshots.restore(req.service, params)


@handles("snapshot/delete")
async def delete(req: Request, params: SnapshotRef) -> SnapshotDeleteResult:
    return await snapshots.delete(req.service, params)
