-- Sessions removed by automatic retention (sessions.max_sessions, sessions.max_age_days),
-- one row each, written in the transaction that deleted the session: what
-- `ctxd-cli sessions list` counts under its table, so no session disappears unannounced.
-- Deleting on request (session/delete, cleanup, clear) is not recorded here.
CREATE TABLE retention_removals (
    at             TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    reason         TEXT NOT NULL,      -- max_sessions | max_age
    detail         TEXT,               -- the rule as configured and how the session stood
    title          TEXT,
    message_count  INTEGER NOT NULL,
    last_activity  TEXT
);
CREATE INDEX retention_removals_by_time ON retention_removals(at);
