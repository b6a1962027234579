-- Snapshots: the active context at a point in time. History is append-only, so a
-- snapshot holds the context's state and checkpoints and refers to history by seq;
-- restoring never copies messages, and a snapshot of a huge session stays small.
CREATE TABLE snapshots (
    session_id   TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    id           TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    trigger_kind TEXT NOT NULL,          -- auto | manual | restore
    label        TEXT,
    last_seq     INTEGER NOT NULL,
    info         BLOB NOT NULL,          -- SnapshotInfo as JSON (figures, counts, model...)
    state        BLOB NOT NULL,          -- StoredState as JSON
    checkpoints  BLOB NOT NULL,          -- the active checkpoints as JSON
    goal         TEXT,
    PRIMARY KEY (session_id, id)
);
CREATE INDEX snapshots_by_time ON snapshots(session_id, created_at);

-- Session events besides messages and compressions: restores, settings changes.
CREATE TABLE session_events (
    session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    at          TEXT NOT NULL,
    kind        TEXT NOT NULL,
    last_seq    INTEGER NOT NULL,
    detail      TEXT
);
CREATE INDEX session_events_by_session ON session_events(session_id, at);

-- Full-text search over every message's text (tool calls and results included), filled
-- by a background indexer in large batches (search waits for it to catch up first):
-- indexing inside each push would cost more than the rest of the push.
CREATE TABLE search_state (
    id               INTEGER PRIMARY KEY CHECK (id = 1),
    indexed_through  INTEGER NOT NULL
);
INSERT INTO search_state (id, indexed_through) VALUES (1, 0);

CREATE VIRTUAL TABLE messages_fts USING fts5(
    text,
    tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
END;
