-- Sessions and their full, append-only message history.
-- Totals are kept on the session row and updated in the same transaction as each push,
-- so listing and stats never scan messages.
CREATE TABLE sessions (
    id               TEXT PRIMARY KEY,
    created_at       TEXT NOT NULL,
    last_activity    TEXT NOT NULL,
    model            TEXT,
    provider         TEXT,
    context_window   INTEGER,            -- as the client set it; NULL: inferred from the model
    system_prompt    TEXT,
    system_tokens    INTEGER NOT NULL DEFAULT 0,
    title            TEXT,
    tags             TEXT NOT NULL DEFAULT '[]',
    metadata         TEXT NOT NULL DEFAULT '{}',
    encoding         TEXT NOT NULL,
    tokens_estimated INTEGER NOT NULL,
    message_count    INTEGER NOT NULL DEFAULT 0,
    token_count      INTEGER NOT NULL DEFAULT 0,
    context_tokens   INTEGER NOT NULL DEFAULT 0,
    last_seq         INTEGER NOT NULL DEFAULT 0,
    stats            TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX sessions_by_activity ON sessions(last_activity);

CREATE TABLE messages (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: search indexes by id
    session_id       TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq              INTEGER NOT NULL,
    role             TEXT NOT NULL,
    created_at       TEXT NOT NULL,
    tokens           INTEGER NOT NULL,
    tok_overhead     INTEGER NOT NULL,
    tok_text         INTEGER NOT NULL,
    tok_tool_call    INTEGER NOT NULL,
    tok_tool_result  INTEGER NOT NULL,
    tok_thinking     INTEGER NOT NULL,
    idempotency_key  TEXT,
    body             BLOB NOT NULL,      -- the Message as pushed, msgspec JSON
    UNIQUE (session_id, seq)
);
CREATE UNIQUE INDEX messages_by_idempotency_key
    ON messages(session_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
