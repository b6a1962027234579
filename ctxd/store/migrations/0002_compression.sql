-- Compression state: what the active context is, beside the history it is a view of.
ALTER TABLE sessions ADD COLUMN context_state TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN goal TEXT;
ALTER TABLE sessions ADD COLUMN settings TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN model_info TEXT NOT NULL DEFAULT '{}';

-- Checkpoints in the active context (position set) and retired ones (merged away),
-- kept so checkpoint/expand works for every id a client was ever told about.
CREATE TABLE checkpoints (
    session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    id          TEXT NOT NULL,
    position    INTEGER,
    created_at  TEXT NOT NULL,
    body        BLOB NOT NULL,
    PRIMARY KEY (session_id, id)
);

-- Every compression pass, for the session's history (when, which layers, before/after).
CREATE TABLE compressions (
    session_id      TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    number          INTEGER NOT NULL,
    at              TEXT NOT NULL,
    trigger_kind    TEXT NOT NULL,
    last_seq        INTEGER NOT NULL,      -- history's newest message when the pass ran
    layers          TEXT NOT NULL,
    before_tokens   INTEGER NOT NULL,
    after_tokens    INTEGER NOT NULL,
    checkpoint_ids  TEXT NOT NULL,
    summarizer      TEXT,
    duration_ms     REAL NOT NULL,
    detail          TEXT,
    PRIMARY KEY (session_id, number)
);
