"""``ctxd-cli doctor``: check a ctxd database file (``check.py``) and recover what can be
read of it into a new file (``recover.py``). Both work on the file directly (plain
``sqlite3``, no daemon, no asyncio), so they help exactly when the daemon cannot.

This package sits beside the daemon, not under it: it reads storage's schema
(``store/db.py``'s migrations, ``store/payloads.py``'s column types) and nothing of
the service or the server.
"""

from ctxd.doctor.check import DB_NAME, DoctorError, Problem, Report, check, iter_problems
from ctxd.doctor.recover import (
    MAX_ROWID,
    RecoveryResult,
    TableRecovery,
    damaged_name,
    recover,
    recovered_name,
    switch_steps,
)

__all__ = ["DB_NAME", "MAX_ROWID", "DoctorError", "Problem", "RecoveryResult", "Report", "TableRecovery", "check",
           "damaged_name", "iter_problems", "recover", "recovered_name", "switch_steps"]
