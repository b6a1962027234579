"""Storage's failures as protocol errors: mapped here, once, for every caller of the
service (the daemon's handlers, the service port in process), so that what a client is
told does not depend on how it reached the service, and the transport knows nothing of
SQLite."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from ctxd.config import Config
from ctxd.protocol.errors import CtxdError, ErrorCode


def damaged_storage(config: Config, session_id: str | None, exc: BaseException) -> CtxdError:
    """Stored data ctxd cannot read: a StorageError that names the session and the way out."""
    where = f"session {session_id!r}" if isinstance(session_id, str) else "the database"
    return CtxdError(ErrorCode.StorageError,
                     f"stored data of {where} could not be read ({type(exc).__name__}: {exc}); the database "
                     f"file may be damaged: `ctxd-cli doctor` checks it and can recover what is readable "
                     f"into a new file", {"sessionId": session_id, "database": str(config.database_path)})


@contextmanager
def storage_errors(config: Config, params: Any) -> Iterator[None]:
    """Run one request's service call (its ``params`` already decoded and valid): what
    storage raises becomes the protocol error a client is answered with."""
    try:
        yield
    except sqlite3.OperationalError as exc:  # busy, locked, out of disk: not damage
        raise CtxdError(ErrorCode.StorageError, f"the database could not be used: {exc}",
                        {"database": str(config.database_path)}) from exc
    except (msgspec.DecodeError, UnicodeDecodeError, sqlite3.DatabaseError) as exc:
        # The params were valid (decoded before), and the service turns what it decodes
        # from clients into its own errors: what failed to decode is stored data.
        raise damaged_storage(config, getattr(params, "session_id", None), exc) from exc
    except OverflowError as exc:  # a number the Structs do not bound, too big for SQLite
        raise CtxdError(ErrorCode.InvalidParams, f"Invalid params: a number is too large to store ({exc})",
                        {"field": "params"}) from exc
