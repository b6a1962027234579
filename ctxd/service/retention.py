"""``session/cleanup`` and ``session/clear``: deleting sessions on request.

(Automatic retention, ``sessions.max_sessions`` and ``sessions.max_age_days``, off by
default, is applied by ``sessions.enforce_retention`` whenever a session is created or
imported, and at startup; each removal is announced.)
"""

from __future__ import annotations

from ctxd.protocol.errors import invalid_params
from ctxd.protocol.history import CleanupParams, ClearParams, DeletedSessions
from ctxd.service.core import Service
from ctxd.service.sessions import delete_beyond, delete_sessions
from ctxd.store import sessions as store


async def cleanup(svc: Service, params: CleanupParams) -> DeletedSessions:
    if params.keep < 0:
        raise invalid_params("keep must not be negative", "keep")
    if params.keep == 0:
        return await clear(svc, ClearParams(all=True))
    return DeletedSessions(deleted=await delete_beyond(svc, params.keep))


async def clear(svc: Service, params: ClearParams) -> DeletedSessions:
    if not params.all:
        raise invalid_params("all must be true to delete every session", "all")
    ids = [row.id for row in await svc.db.read(store.list_sessions, None, None)]
    return DeletedSessions(deleted=await delete_sessions(svc, ids))
